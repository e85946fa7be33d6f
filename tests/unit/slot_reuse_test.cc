// Slot reuse within an epoch (cache.reuse_rounds, docs/decisions/0035): the generation
// clock and the next-use policy. The fence that makes rewriting slots safe is tested with
// rounds in rotation_test.cc (SlotReuseFenceTest).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/arena_layout.h"
#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/rng.h"
#include "common/slot_reuse.h"
#include "tests/unit/plan_support.h"

namespace shardmix {
namespace slot_reuse_test {

using test_support::random_sizes;

TEST(GenerationClockTest, RotationByEpochsIgnoresBatches) {
  const GenerationClock clock = GenerationClock::make(2, 0, 10);
  EXPECT_TRUE(clock.enabled());
  EXPECT_EQ(clock.generation(0, 9), 0u);
  EXPECT_EQ(clock.generation(1, 0), 0u);
  EXPECT_EQ(clock.generation(2, 0), 1u);
  EXPECT_EQ(clock.generation(5, 7), 2u);
  EXPECT_FALSE(GenerationClock::make(0, 0, 10).enabled());
}

RC_GTEST_PROP(GenerationClockTest, RoundsCoverEveryEpochInOrderWithoutGaps, ()) {
  const auto batches = *rc::gen::inRange<std::uint64_t>(1, 200);
  const auto asked = *rc::gen::inRange<std::uint32_t>(1, 300);
  const GenerationClock clock = GenerationClock::make(0, asked, batches);
  RC_ASSERT(clock.rounds == std::min<std::uint64_t>(asked, batches));  // no round without a batch
  std::uint64_t previous = 0;
  for (std::uint64_t e = 0; e < 3; ++e) {
    for (std::uint64_t b = 0; b < batches; ++b) {
      const std::uint64_t g = clock.generation(e, b);
      RC_ASSERT(g / clock.rounds == e);
      // Generations never go back and never skip one: the fence steps one at a time.
      if (e > 0 || b > 0) RC_ASSERT(g == previous || g == previous + 1);
      previous = g;
    }
  }
  RC_ASSERT(previous == 3 * clock.rounds - 1);
}

struct World {
  std::vector<std::uint64_t> sizes;
  PlanShape shape;
  Placement placement;
  std::unique_ptr<EpochPlanner> planner;
  GenerationClock clock;
  std::uint64_t capacity = 0;

  World(std::uint32_t nodes, std::size_t n, std::uint32_t batch, double share, std::uint32_t rounds, std::uint64_t seed)
      : sizes(random_sizes(seed, n)) {
    shape = make_plan_shape(n, JobShape{nodes, 1, batch, false});
    capacity = test_support::capacity_for_share(sizes, nodes, share);
    placement = make_placement(sizes, shape, PlacementPolicy::kBalanced, seed, capacity);
    ShuffleConfig shuffle;
    shuffle.seed = seed;
    planner = std::make_unique<EpochPlanner>(shape, placement, shuffle);
    clock = GenerationClock::make(0, rounds, shape.batches_per_trainer);
  }
  ArenaLayout initial(std::uint32_t k) const {
    return initial_arena_layout(placement, k, rotating_arena_bytes(sizes, placement, k, capacity));
  }
  std::vector<std::uint32_t> rounds(std::uint64_t epoch) const {
    return consumption_rounds(planner->plan_all(epoch), sizes.size(), clock);
  }
};

RC_GTEST_PROP(SlotReusePolicyTest, ChoiceFitsTheArenaAndLoadsOnlySamplesNeededSoon, ()) {
  const auto nodes = *rc::gen::inRange<std::uint32_t>(1, 5);
  const auto batch = *rc::gen::inRange<std::uint32_t>(1, 8);
  const auto n = *rc::gen::inRange<std::size_t>(nodes * batch, 400);
  const auto rounds = *rc::gen::inRange<std::uint32_t>(1, 9);
  const double share = *rc::gen::element(0.2, 0.5, 0.8);
  const World w(nodes, n, batch, share, rounds, *rc::gen::arbitrary<std::uint64_t>());
  const auto k = *rc::gen::inRange<std::uint32_t>(0, nodes);
  ArenaLayout layout = w.initial(k);
  std::vector<std::vector<std::uint32_t>> by_epoch;
  for (std::uint64_t e = 0; e < 4; ++e) by_epoch.push_back(w.rounds(e));
  const std::set<SampleId> owned(w.placement.owned[k].begin(), w.placement.owned[k].end());
  for (std::uint64_t g = 1; g < 2 * w.clock.rounds; ++g) {
    const std::uint64_t e = g / w.clock.rounds;
    const KnownRounds upcoming{e > 0 ? &by_epoch[e - 1] : nullptr, &by_epoch[e], &by_epoch[e + 1], &by_epoch[e + 2]};
    const auto wanted = choose_by_next_use(w.sizes, w.placement.owned[k], layout.arena_bytes, layout, upcoming,
                                           w.clock, g, 9);
    RC_ASSERT(std::is_sorted(wanted.begin(), wanted.end()));
    std::uint64_t bytes = 0;
    for (SampleId id : wanted) {
      RC_ASSERT(owned.count(id) == 1u);
      bytes += align_to_arena(w.sizes[id]);
      if (layout.offset_of(id)) continue;
      // A sample is loaded only for a use in the next kReuseLookaheadRounds rounds (never
      // the round that has begun: it would be read twice).
      bool soon = false;
      for (std::uint64_t j = 0; j < 3; ++j) {
        const std::uint32_t r = by_epoch[e + j][id];
        const std::uint64_t at = (e + j) * w.clock.rounds + r;
        if (r != kNotConsumed && at > g && at <= g + kReuseLookaheadRounds) soon = true;
      }
      RC_ASSERT(soon);
    }
    RC_ASSERT(bytes <= layout.arena_bytes);
    // Deterministic: every daemon computes the same choice.
    RC_ASSERT(wanted == choose_by_next_use(w.sizes, w.placement.owned[k], layout.arena_bytes, layout, upcoming,
                                           w.clock, g, 9));
    layout = next_arena_layout(layout, w.sizes, wanted);
  }
}

// What the policy buys with an ideal fence (every round's reload done before the round's
// successor starts): samples read from storage per epoch, counting both the trainers'
// reads of samples not in RAM and the reloads, against the static resident set. No timing
// involved. It cannot read *less* than the static set: every sample is used once an epoch,
// so a use is served from RAM without a read only if the sample sat in RAM across the
// epoch boundary, and at that moment the arena holds at most cache.capacity bytes — what
// the static set already holds (decision 0035). What rounds buy is *where* the reads
// happen: most move from the trainers' path into the owners' reloads, rounds ahead.
TEST(SlotReusePolicyTest, IdealRoundsMoveMostStorageReadsOffTheTrainersPathWithoutReadingMore) {
  const std::uint32_t nodes = 4;
  const std::uint32_t rounds = 16;
  const World w(nodes, 4000, 8, 0.5, rounds, 21);
  const std::uint32_t epochs = 4;
  std::vector<std::vector<std::uint32_t>> consumed;
  for (std::uint32_t e = 0; e <= epochs + 1; ++e) consumed.push_back(w.rounds(e));
  std::vector<ArenaLayout> layout;
  for (std::uint32_t k = 0; k < nodes; ++k) layout.push_back(w.initial(k));
  for (std::uint32_t e = 0; e < epochs; ++e) {
    std::uint64_t static_reads = 0, reuse_misses = 0, reuse_loads = 0, delivered = 0;
    for (std::uint32_t r = 0; r < rounds; ++r) {
      const std::uint64_t g = std::uint64_t{e} * rounds + r;
      for (std::uint32_t k = 0; k < nodes; ++k) {
        ArenaLayout next = layout[k];
        if (g > 0) {
          next = next_arena_layout(layout[k], w.sizes,
                                   choose_by_next_use(w.sizes, w.placement.owned[k], layout[k].arena_bytes, layout[k],
                                                      {e > 0 ? &consumed[e - 1] : nullptr, &consumed[e],
                                                       &consumed[e + 1], &consumed[e + 2]},
                                                      w.clock, g, 3));
          reuse_loads += next.entering.size();
        }
        for (SampleId id : w.placement.owned[k]) {
          if (consumed[e][id] != r) continue;
          ++delivered;
          if (!w.placement.is_resident(id)) ++static_reads;
          // During the round's transition only samples at the same offset in both layouts
          // are readable; entering ones are never needed this round (checked above).
          const auto before = layout[k].offset_of(id);
          if (!before || before != next.offset_of(id)) ++reuse_misses;
        }
        layout[k] = std::move(next);
      }
    }
    ASSERT_EQ(delivered, 4000u);
    const std::uint64_t reuse_reads = reuse_misses + reuse_loads;
    RecordProperty(fmt::format("epoch{}", e), fmt::format("static {} reuse {} (misses {} loads {})", static_reads,
                                                          reuse_reads, reuse_misses, reuse_loads));
    std::printf("epoch %u: samples read from storage: static %lu, reuse rounds %lu (%lu by trainers, %lu by reloads)\n",
                e, static_cast<unsigned long>(static_reads), static_cast<unsigned long>(reuse_reads),
                static_cast<unsigned long>(reuse_misses), static_cast<unsigned long>(reuse_loads));
    // Fragmentation (unequal sizes, holes that do not fit) costs a little: within 5%.
    EXPECT_LE(reuse_reads * 100, static_reads * 105) << "epoch " << e;
    if (e >= 1) {  // epoch 0 starts from the static set
      // Trainers read less than half as much from storage: the rest was loaded ahead.
      EXPECT_LT(reuse_misses * 2, static_reads) << "epoch " << e;
    }
  }
}

}  // namespace slot_reuse_test
}  // namespace shardmix
