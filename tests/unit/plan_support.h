// Shared helpers of the planner tests (epoch_plan_test, entropy_policy_test,
// plan_slices_test): a generated case, the generators they share, and the plan shape and
// placement a case's planner references.
// Thread-safety: stateless.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <ostream>
#include <set>
#include <vector>

#include "common/epoch_plan.h"
#include "common/placement.h"

namespace shardmix::test_support {

// EpochPlanner holds references to both, so they live together and outlive it.
struct BuiltPlan {
  PlanShape shape;
  Placement placement;
};

inline BuiltPlan build_plan(const std::vector<std::uint64_t>& sizes, const JobShape& job, PlacementPolicy policy,
                            std::uint64_t seed, std::uint64_t capacity = kNoCapacityLimit) {
  BuiltPlan b{make_plan_shape(sizes.size(), job), {}};
  b.placement = make_placement(sizes, b.shape, policy, seed, capacity);
  return b;
}

// One planner case: a dataset (sample sizes; labels, non-decreasing in id as the catalog
// assigns ids, where the test scores classes), a job shape, the shuffle settings, the
// placement policy and the per-node cache capacity.
struct PlanCase {
  std::vector<std::uint64_t> sizes;
  std::vector<std::int32_t> labels;
  JobShape job;
  ShuffleConfig shuffle;
  PlacementPolicy policy = PlacementPolicy::kBalanced;
  std::uint64_t capacity = kNoCapacityLimit;
};

// What RapidCheck prints for a failing case.
inline std::ostream& operator<<(std::ostream& os, const PlanCase& c) {
  const std::set<std::int32_t> classes(c.labels.begin(), c.labels.end());
  return os << "N=" << c.sizes.size() << " C=" << classes.size() << " nodes=" << c.job.nodes
            << " tpn=" << c.job.trainers_per_node << " B=" << c.job.batch_size << " drop_last=" << c.job.drop_last
            << " Q=" << c.shuffle.exchange_fraction << " floor=" << c.shuffle.min_entropy
            << " seed=" << c.shuffle.seed << " capacity=" << c.capacity
            << " policy=" << (c.policy == PlacementPolicy::kSorted ? "sorted" : "balanced");
}

inline BuiltPlan build_plan(const PlanCase& c) {
  return build_plan(c.sizes, c.job, c.policy, c.shuffle.seed, c.capacity);
}

// The exchange fraction Q: the edges and the usual values often, otherwise any in [0, 1]
// in steps of 0.001.
inline rc::Gen<double> gen_exchange_fraction() {
  return rc::gen::oneOf(rc::gen::element(0.0, 0.01, 0.1, 0.5, 1.0),
                        rc::gen::map(rc::gen::inRange(0, 1001), [](int x) { return x / 1000.0; }));
}

inline rc::Gen<PlacementPolicy> gen_policy() {
  return rc::gen::element(PlacementPolicy::kBalanced, PlacementPolicy::kSorted);
}

}  // namespace shardmix::test_support
