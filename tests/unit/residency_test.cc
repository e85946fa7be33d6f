// Properties of the residency split (placement.h: which owned samples are in a node's
// arena when its share does not fit cache.capacity, and the arena layout of those), over
// generated shapes: awkward capacities (0, smaller than one sample, a fraction of the
// share, unlimited), zero-byte samples, one sample, more trainers than samples.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>

#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/rng.h"
#include "tests/unit/plan_support.h"

namespace shardmix {
namespace residency_test {

struct ResidencyCase {
  std::vector<std::uint64_t> sizes;
  JobShape job;
  std::uint64_t seed = 0;
  PlacementPolicy policy = PlacementPolicy::kBalanced;
  std::uint64_t capacity = kNoCapacityLimit;
};

std::ostream& operator<<(std::ostream& os, const ResidencyCase& c) {
  return os << "N=" << c.sizes.size() << " nodes=" << c.job.nodes << " tpn=" << c.job.trainers_per_node
            << " B=" << c.job.batch_size << " drop_last=" << c.job.drop_last << " seed=" << c.seed
            << " capacity=" << c.capacity << " policy=" << placement_policy_name(c.policy);
}

rc::Gen<ResidencyCase> gen_residency_case() {
  return rc::gen::exec([] {
    ResidencyCase c;
    const auto n = *rc::gen::oneOf(rc::gen::inRange<std::size_t>(0, 4), rc::gen::inRange<std::size_t>(0, 400));
    c.sizes = *rc::gen::container<std::vector<std::uint64_t>>(
        n, rc::gen::oneOf(rc::gen::just<std::uint64_t>(0), rc::gen::inRange<std::uint64_t>(1, 200), rc::gen::inRange<std::uint64_t>(1, 100000)));
    c.job.nodes = *rc::gen::inRange<std::uint32_t>(1, 6);
    c.job.trainers_per_node = *rc::gen::inRange<std::uint32_t>(1, 3);
    c.job.batch_size = *rc::gen::inRange<std::uint32_t>(1, 17);
    c.job.drop_last = *rc::gen::arbitrary<bool>();
    c.seed = *rc::gen::arbitrary<std::uint64_t>();
    c.policy = *test_support::gen_policy();
    const std::uint64_t total = std::accumulate(c.sizes.begin(), c.sizes.end(), std::uint64_t{0});
    const std::uint64_t per_node = total / c.job.nodes + 1;
    // 0, below one sample, a fraction of a node's share (1/5 .. 1), a little more, unlimited.
    c.capacity = *rc::gen::oneOf(rc::gen::just<std::uint64_t>(0), rc::gen::inRange<std::uint64_t>(1, 64),
                                 rc::gen::map(rc::gen::inRange(1, 6), [per_node](int k) -> std::uint64_t { return per_node / static_cast<std::uint64_t>(k); }),
                                 rc::gen::inRange<std::uint64_t>(0, 2 * per_node + 1),
                                 rc::gen::just<std::uint64_t>(std::uint64_t{kNoCapacityLimit}));
    return c;
  });
}

Placement place(const ResidencyCase& c, const PlanShape& shape) {
  return make_placement(c.sizes, shape, c.policy, c.seed, c.capacity);
}

RC_GTEST_PROP(Residency, FitsTheCapacityAndLaysOutOnlyResidentSamples, ()) {
  const ResidencyCase c = *gen_residency_case();
  const PlanShape shape = make_plan_shape(c.sizes.size(), c.job);
  const Placement p = place(c, shape);
  const Placement unlimited = make_placement(c.sizes, shape, c.policy, c.seed);
  // Ownership does not depend on the capacity (so neither does the epoch plan).
  RC_ASSERT(p.owner == unlimited.owner);
  RC_ASSERT(p.owned == unlimited.owned);
  for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
    RC_ASSERT(p.arena_bytes[k] <= c.capacity);  // resident bytes (aligned) fit
    RC_ASSERT(std::is_sorted(p.cached[k].begin(), p.cached[k].end()));
    RC_ASSERT(std::includes(p.owned[k].begin(), p.owned[k].end(), p.cached[k].begin(), p.cached[k].end()));
    RC_ASSERT(p.cached[k].size() + p.cold_samples[k] == p.owned[k].size());
    std::uint64_t end = 0, bytes = 0;
    for (SampleId id : p.cached[k]) {
      RC_ASSERT(p.is_resident(id));
      const std::uint64_t off = p.arena_offset[id];
      RC_ASSERT(off % kArenaAlignment == 0);
      RC_ASSERT(off >= end);  // ascending, never overlapping
      end = off + c.sizes[id];
      bytes += c.sizes[id];
    }
    RC_ASSERT(end <= p.arena_bytes[k]);
    RC_ASSERT(bytes == p.cached_bytes[k]);
    RC_ASSERT(p.cached_bytes[k] + p.cold_bytes[k] == p.sample_bytes[k]);
    // First fit: a cold sample did not fit when it was tried, and the room only shrank;
    // so nothing cold would still fit, and cold bytes are what the capacity predicts.
    for (SampleId id : p.owned[k]) {
      if (p.is_resident(id)) continue;
      RC_ASSERT(p.arena_offset[id] == kNotResident);
      RC_ASSERT(align_to_arena(c.sizes[id]) > c.capacity - p.arena_bytes[k]);
      RC_ASSERT(c.sizes[id] > 0);  // zero-byte samples always fit
    }
  }
  // Each sample is resident on its owner or cold; nothing else.
  for (SampleId id = 0; id < c.sizes.size(); ++id) {
    const auto& mine = p.cached[p.owner[id]];
    RC_ASSERT(p.is_resident(id) == std::binary_search(mine.begin(), mine.end(), id));
  }
  // Deterministic.
  const Placement again = place(c, shape);
  RC_ASSERT(again.cached == p.cached);
  RC_ASSERT(again.arena_offset == p.arena_offset);
  // Unlimited capacity: every owned sample resident.
  if (c.capacity == kNoCapacityLimit) RC_ASSERT(p.total_cold_samples() == 0u);
  if (c.capacity == 0) {
    for (std::uint32_t k = 0; k < c.job.nodes; ++k) RC_ASSERT(p.cached_bytes[k] == 0u);
  }
}

// cache.capacity is per node (a fraction of each node's own RAM by default), and the daemons
// allgather the byte counts: node k's resident set and offsets must follow node k's own
// capacity only, so that every daemon, given the same vector, lays out every node's arena the
// way that node itself does. The bug this guards against: each daemon used its own capacity
// for every node, so a peer read offset X believing it held sample S while the owner, with a
// different capacity, stored T there.
RC_GTEST_PROP(Residency, EachNodeFollowsItsOwnCapacity, ()) {
  ResidencyCase c = *gen_residency_case();
  const PlanShape shape = make_plan_shape(c.sizes.size(), c.job);
  const std::uint64_t total = std::accumulate(c.sizes.begin(), c.sizes.end(), std::uint64_t{0});
  const std::uint64_t per_node = total / c.job.nodes + 1;
  std::vector<std::uint64_t> capacities(c.job.nodes);
  for (auto& cap : capacities) {
    cap = *rc::gen::oneOf(rc::gen::just<std::uint64_t>(0), rc::gen::inRange<std::uint64_t>(0, 2 * per_node + 1),
                          rc::gen::just<std::uint64_t>(std::uint64_t{kNoCapacityLimit}));
  }
  const Placement p = make_placement(c.sizes, shape, c.policy, c.seed, capacities);
  const Placement unlimited = make_placement(c.sizes, shape, c.policy, c.seed);
  RC_ASSERT(p.owner == unlimited.owner);
  for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
    RC_ASSERT(p.arena_bytes[k] <= capacities[k]);  // each node within its own capacity
    // Node k's layout is exactly what a uniform placement with node k's capacity gives it:
    // it does not depend on any other node's capacity.
    const Placement as_if_uniform = make_placement(c.sizes, shape, c.policy, c.seed, capacities[k]);
    RC_ASSERT(p.cached[k] == as_if_uniform.cached[k]);
    RC_ASSERT(p.arena_bytes[k] == as_if_uniform.arena_bytes[k]);
    for (SampleId id : p.owned[k]) RC_ASSERT(p.arena_offset[id] == as_if_uniform.arena_offset[id]);
    RC_ASSERT(p.cached[k] == choose_resident(c.sizes, p.owned[k], capacities[k], c.seed, k));
  }
  // Every daemon given the same vector computes the same layouts.
  const Placement again = make_placement(c.sizes, shape, c.policy, c.seed, capacities);
  RC_ASSERT(again.cached == p.cached);
  RC_ASSERT(again.arena_offset == p.arena_offset);
  RC_ASSERT(again.arena_bytes == p.arena_bytes);
}

TEST(ResidencyDeathTest, NodeCapacitiesMustNameEveryNode) {
  const JobShape job{3, 1, 2, false};
  const PlanShape shape = make_plan_shape(6, job);
  const std::vector<std::uint64_t> sizes(6, 100);
  EXPECT_DEATH((void)make_placement(sizes, shape, PlacementPolicy::kBalanced, 1, std::vector<std::uint64_t>{1000, 1000}),
               "invariant failed: make_placement: 2 node capacities for 3 nodes");
}

// The epoch plan over a capacity-limited placement: every sample exactly once, equal batch
// counts (cold samples are still planned; only where their bytes come from differs).
RC_GTEST_PROP(Residency, EpochPlanStillDeliversEverySampleOnce, ()) {
  ResidencyCase c = *gen_residency_case();
  c.job.drop_last = false;
  const PlanShape shape = make_plan_shape(c.sizes.size(), c.job);
  const Placement p = place(c, shape);
  ShuffleConfig shuffle;
  shuffle.seed = c.seed;
  shuffle.exchange_fraction = *rc::gen::element(0.0, 0.3, 1.0);
  EpochPlanner planner(shape, p, shuffle);
  for (std::uint64_t epoch : {0u, 1u}) {
    const auto plans = planner.plan_all(epoch);
    RC_ASSERT(plans.size() == c.job.trainers());
    std::vector<int> seen(c.sizes.size(), 0);
    for (const TrainerPlan& plan : plans) {
      RC_ASSERT(plan.num_batches() == shape.batches_per_trainer);
      for (SampleId id : plan.order) ++seen[id];
    }
    RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
}

// Not class-sorted: ids are sorted by label, so a resident set that were a prefix of the
// owned ids would keep whole classes in RAM and others always on storage.
TEST(Residency, ResidentSetIsSeededRandomNotAnIdPrefix) {
  const std::vector<std::uint64_t> sizes(1000, 1000);  // equal sizes: 1024 aligned
  const PlanShape shape = make_plan_shape(sizes.size(), JobShape{1, 1, 10, false});
  const Placement a = make_placement(sizes, shape, PlacementPolicy::kSorted, 1, 500 * 1024);
  ASSERT_EQ(a.cached[0].size(), 500u);
  EXPECT_EQ(a.cold_samples[0], 500u);
  std::size_t low = 0;
  for (SampleId id : a.cached[0]) low += id < 500 ? 1 : 0;
  EXPECT_GT(low, 200u);  // about half from each half of the ids (not 500 / 0)
  EXPECT_LT(low, 300u);
  const Placement b = make_placement(sizes, shape, PlacementPolicy::kSorted, 2, 500 * 1024);
  EXPECT_NE(a.cached[0], b.cached[0]);  // the seed decides
}

TEST(Residency, AwkwardCapacities) {
  const std::vector<std::uint64_t> sizes = {0, 100, 5000, 0, 70};
  const PlanShape shape = make_plan_shape(sizes.size(), JobShape{1, 1, 2, false});
  // Capacity 0: only the zero-byte samples are resident, and take no room.
  Placement p = make_placement(sizes, shape, PlacementPolicy::kBalanced, 3, 0);
  EXPECT_EQ(p.cached[0], (std::vector<SampleId>{0, 3}));
  EXPECT_EQ(p.arena_bytes[0], 0u);
  EXPECT_EQ(p.cold_samples[0], 3u);
  EXPECT_EQ(p.cold_bytes[0], 5170u);
  // Smaller than any non-empty sample (aligned: 128, 5056, 128).
  p = make_placement(sizes, shape, PlacementPolicy::kBalanced, 3, 127);
  EXPECT_EQ(p.cold_samples[0], 3u);
  // Exactly the two small ones: whatever the random order, first fit takes both.
  p = make_placement(sizes, shape, PlacementPolicy::kBalanced, 3, 256);
  EXPECT_EQ(p.cached[0], (std::vector<SampleId>{0, 1, 3, 4}));
  EXPECT_EQ(p.arena_bytes[0], 256u);
  // One sample, and more trainers than samples.
  const std::vector<std::uint64_t> one = {4096};
  const PlanShape wide = make_plan_shape(1, JobShape{3, 2, 4, false});
  p = make_placement(one, wide, PlacementPolicy::kBalanced, 9, 4095);
  EXPECT_EQ(p.total_cold_samples(), 1u);
  p = make_placement(one, wide, PlacementPolicy::kBalanced, 9, 4096);
  EXPECT_EQ(p.total_cold_samples(), 0u);
}

}  // namespace residency_test
}  // namespace shardmix
