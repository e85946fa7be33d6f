// Shared helper of the planner tests (epoch_plan_test, entropy_policy_test,
// plan_slices_test): the plan shape and the placement a case's planner references.
// Thread-safety: stateless.
#pragma once

#include <cstdint>
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

}  // namespace shardmix::test_support
