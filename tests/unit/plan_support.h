// Shared helpers of the planner tests (epoch_plan_test, entropy_policy_test,
// plan_slices_test, and the sizes and capacities of rotation_test and slot_reuse_test): a
// generated case, the generators and checks they share, and the plan shape and placement
// a case's planner references.
// Thread-safety: stateless.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <ostream>
#include <set>
#include <vector>

#include "common/arena_layout.h"
#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/rng.h"

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

// n sample sizes of 1..700 bytes drawn from `seed`.
inline std::vector<std::uint64_t> random_sizes(std::uint64_t seed, std::size_t n) {
  Rng rng(seed);
  std::vector<std::uint64_t> sizes(n);
  for (auto& s : sizes) s = 1 + rng.below(700);
  return sizes;
}

// Per-node cache bytes that hold `share` of the dataset, as the arena lays samples out.
inline std::uint64_t capacity_for_share(const std::vector<std::uint64_t>& sizes, std::uint32_t nodes, double share) {
  std::uint64_t total = 0;
  for (auto s : sizes) total += align_to_arena(s);
  return static_cast<std::uint64_t>(share * static_cast<double>(total) / nodes);
}

// A trainer plan's batches: every one holds batch_size samples but the last, which may be
// short unless drop_last. (RapidCheck assertions: for properties.)
inline void check_batch_lengths(const TrainerPlan& p, const JobShape& job) {
  RC_ASSERT(p.batch_begin.back() == p.order.size());
  for (std::uint64_t k = 0; k < p.num_batches(); ++k) {
    const std::uint64_t len = p.batch_begin[k + 1] - p.batch_begin[k];
    RC_ASSERT(len <= job.batch_size);
    if (k + 1 < p.num_batches() || job.drop_last) RC_ASSERT(len == job.batch_size);
  }
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
            << " policy=" << placement_policy_name(c.policy);
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
  return rc::gen::element(PlacementPolicy::kBalanced, PlacementPolicy::kSorted, PlacementPolicy::kSpread);
}

}  // namespace shardmix::test_support
