// Properties of the plan shape, placement and epoch plan, over generated job shapes:
// any dataset size (0 and 1 included), node and trainer counts (more trainers than
// samples included), batch size, drop_last, exchange fraction and placement policy.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "common/epoch_plan.h"
#include "common/placement.h"
#include "tests/unit/plan_support.h"
#include "common/rng.h"
#include "common/shuffle_metrics.h"

namespace shardmix {
namespace epoch_plan_test {

using Case = test_support::PlanCase;

rc::Gen<Case> gen_case() {
  return rc::gen::exec([] {
    Case c;
    // Dataset sizes skewed small so awkward shapes (N < trainers, N = 0, 1) are common.
    const auto n = *rc::gen::oneOf(rc::gen::inRange<std::size_t>(0, 4),
                                   rc::gen::inRange<std::size_t>(0, 60),
                                   rc::gen::inRange<std::size_t>(0, 700));
    c.sizes = *rc::gen::container<std::vector<std::uint64_t>>(
        n, rc::gen::oneOf(rc::gen::just<std::uint64_t>(0), rc::gen::inRange<std::uint64_t>(1, 300000)));
    c.job.nodes = *rc::gen::inRange<std::uint32_t>(1, 7);
    c.job.trainers_per_node = *rc::gen::inRange<std::uint32_t>(1, 4);
    c.job.batch_size = *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(1, 9),
                                       rc::gen::inRange<std::uint32_t>(1, 300));
    c.job.drop_last = *rc::gen::arbitrary<bool>();
    c.shuffle.exchange_fraction = *test_support::gen_exchange_fraction();
    c.shuffle.seed = *rc::gen::arbitrary<std::uint64_t>();
    c.policy = *test_support::gen_policy();
    return c;
  });
}

using Built = test_support::BuiltPlan;
using test_support::build_plan;

// Exactly once, equal batch counts, batch sizes, drop_last accounting.
void check_epoch(const Case& c, const Built& b, const std::vector<TrainerPlan>& plans) {
  const std::uint64_t n = c.sizes.size();
  const std::uint32_t trainers = c.job.trainers();
  RC_ASSERT(plans.size() == trainers);
  std::vector<int> seen(n, 0);
  std::uint64_t delivered = 0;
  const std::uint64_t nb = plans.empty() ? 0 : plans[0].num_batches();
  for (std::uint32_t t = 0; t < trainers; ++t) {
    const TrainerPlan& p = plans[t];
    RC_ASSERT(p.num_batches() == nb);                      // equal batch counts
    RC_ASSERT(p.batch_begin.front() == 0u);
    test_support::check_batch_lengths(p, c.job);  // only the last may be short
    for (SampleId id : p.order) {
      RC_ASSERT(id < n);
      ++seen[id];
      ++delivered;
    }
  }
  RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int s) { return s <= 1; }));  // none repeats
  if (c.job.drop_last) {
    const std::uint64_t step = static_cast<std::uint64_t>(trainers) * c.job.batch_size;
    RC_ASSERT(delivered == n / step * step);
    RC_ASSERT(nb == n / step);
  } else {
    RC_ASSERT(delivered == n);                               // none missed
    const std::uint64_t step = static_cast<std::uint64_t>(trainers) * c.job.batch_size;
    RC_ASSERT(nb == (n + step - 1) / step);
  }
  RC_ASSERT(delivered == b.shape.delivered_per_epoch);
}

RC_GTEST_PROP(EpochPlan, DeliversEverySampleExactlyOnceWithEqualBatchCounts, ()) {
  const Case c = *gen_case();
  RC_TAG(c.job.drop_last ? "drop_last" : "keep_last");
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);
  for (std::uint64_t epoch : {0ull, 1ull, 7ull}) check_epoch(c, b, planner.plan_all(epoch));
}

RC_GTEST_PROP(EpochPlan, NodePlansAgreeWithTheGlobalPlan, ()) {
  const Case c = *gen_case();
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);
  const auto all = planner.plan_all(3);
  for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
    const auto mine = planner.plan_node(3, k);
    for (std::uint32_t local = 0; local < c.job.trainers_per_node; ++local) {
      const auto& global = all[k * c.job.trainers_per_node + local];
      RC_ASSERT(mine[local].order == global.order);
      RC_ASSERT(mine[local].batch_begin == global.batch_begin);
    }
  }
}

RC_GTEST_PROP(EpochPlan, SameInputsGiveTheSamePlan, ()) {
  const Case c = *gen_case();
  const Built b1 = build_plan(c);
  const Built b2 = build_plan(c);
  RC_ASSERT(b1.placement.owner == b2.placement.owner);
  EpochPlanner p1(b1.shape, b1.placement, c.shuffle);
  EpochPlanner p2(b2.shape, b2.placement, c.shuffle);
  const auto a = p1.plan_all(5);
  const auto z = p2.plan_all(5);
  for (std::size_t t = 0; t < a.size(); ++t) RC_ASSERT(a[t].order == z[t].order);
}

RC_GTEST_PROP(EpochPlan, ZeroExchangeKeepsEverySampleOnItsNode, ()) {
  Case c = *gen_case();
  c.shuffle.exchange_fraction = 0.0;
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);
  const auto plans = planner.plan_all(2);
  for (std::uint32_t t = 0; t < plans.size(); ++t) {
    for (SampleId id : plans[t].order) RC_ASSERT(b.placement.owner[id] == c.job.node_of_trainer(t));
  }
}

RC_GTEST_PROP(Placement, GivesEachNodeItsQuotaAndValidOffsets, ()) {
  const Case c = *gen_case();
  const Built b = build_plan(c);
  RC_ASSERT(b.placement.owner.size() == c.sizes.size());
  for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
    RC_ASSERT(b.placement.owned[k].size() == b.shape.node_owned[k]);
    RC_ASSERT(std::is_sorted(b.placement.owned[k].begin(), b.placement.owned[k].end()));
    // Samples lie inside the arena, aligned, without overlapping.
    std::uint64_t end = 0;
    for (SampleId id : b.placement.owned[k]) {
      const std::uint64_t off = b.placement.arena_offset[id];
      RC_ASSERT(off % kArenaAlignment == 0);
      RC_ASSERT(off >= end);
      end = off + c.sizes[id];
    }
    RC_ASSERT(end <= b.placement.arena_bytes[k]);
  }
}

// Fixed examples that the properties above cover only by chance.

Case fixed_case(std::size_t n, std::uint32_t nodes, std::uint32_t tpn, std::uint32_t batch, bool drop_last,
                double q) {
  Case c;
  Rng rng(42);
  for (std::size_t i = 0; i < n; ++i) c.sizes.push_back(1000 + rng.below(200000));
  c.job = JobShape{nodes, tpn, batch, drop_last};
  c.shuffle.seed = 11;
  c.shuffle.exchange_fraction = q;
  return c;
}

TEST(EpochPlan, NewEpochOrNewSeedChangesTheOrder) {
  Case c = fixed_case(1000, 4, 1, 16, false, 1.0);
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);
  const auto e0 = planner.plan_all(0);
  const auto e1 = planner.plan_all(1);
  EXPECT_NE(e0[0].order, e1[0].order);
  ShuffleConfig other = c.shuffle;
  other.seed = 12;
  EpochPlanner reseeded(b.shape, b.placement, other);
  EXPECT_NE(e0[0].order, reseeded.plan_all(0)[0].order);
}

// The share of epoch 0's samples that trainers get from another node's cache.
double remote_share(const Case& c) {
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);
  const auto plans = planner.plan_all(0);
  std::uint64_t remote = 0;
  for (std::uint32_t t = 0; t < plans.size(); ++t) {
    for (SampleId id : plans[t].order) remote += b.placement.owner[id] != c.job.node_of_trainer(t);
  }
  return static_cast<double>(remote) / static_cast<double>(c.sizes.size());
}

TEST(EpochPlan, FullExchangeServesMostSamplesFromPeers) {
  // With Q = 1 a trainer's samples are a uniform draw: (N-1)/N of them live elsewhere.
  EXPECT_NEAR(remote_share(fixed_case(4000, 4, 1, 8, false, 1.0)), 0.75, 0.03);
}

TEST(EpochPlan, ExchangeFractionSetsTheRemoteShare) {
  // Q of the samples enter the global pool; 3/4 of those land on another node.
  EXPECT_NEAR(remote_share(fixed_case(8000, 4, 2, 10, false, 0.25)), 0.25 * 0.75, 0.02);
}

// The knob's promise on the worst case for local shuffles: with class-sorted placement
// (each node holds a few classes), less exchange means less mixed micro-batches. Mean
// per-trainer batch label entropy (shuffle-quality.md §1) for Q = 1, 0.5, 0.25, 0.1, 0,
// for several seeds and epochs: it falls at every step.
TEST(EpochPlan, LabelEntropyFallsAsExchangeFractionFallsOnClassSortedPlacement) {
  constexpr std::uint32_t kClasses = 16;
  for (const std::uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    Case c = fixed_case(3200, 8, 1, 16, false, 1.0);
    c.shuffle.seed = seed;
    c.policy = PlacementPolicy::kSorted;
    std::vector<std::int32_t> labels(c.sizes.size());
    for (std::size_t i = 0; i < labels.size(); ++i) {
      labels[i] = static_cast<std::int32_t>(i * kClasses / labels.size());  // ids are class-sorted
    }
    const Built b = build_plan(c);
    for (const std::uint64_t epoch : {0u, 3u}) {
      double previous = 2.0;
      for (const double q : {1.0, 0.5, 0.25, 0.1, 0.0}) {
        ShuffleConfig shuffle = c.shuffle;
        shuffle.exchange_fraction = q;
        EpochPlanner planner(b.shape, b.placement, shuffle);
        BatchLabelEntropy entropy(kClasses);
        for (const TrainerPlan& plan : planner.plan_all(epoch)) {
          for (std::uint64_t j = 0; j < plan.num_batches(); ++j) {
            std::vector<std::int32_t> batch;
            for (std::uint64_t i = plan.batch_begin[j]; i < plan.batch_begin[j + 1]; ++i) {
              batch.push_back(labels[plan.order[i]]);
            }
            entropy.add_batch(batch);
          }
        }
        const double mean = entropy.summary().mean;
        EXPECT_LT(mean, previous) << "seed " << seed << " epoch " << epoch << " Q " << q;
        previous = mean;
      }
      EXPECT_LT(previous, 0.35) << "Q = 0 on 2 classes per node must stay poorly mixed (seed " << seed << ")";
    }
  }
}

TEST(EpochPlan, KeptShareChangesEveryEpoch) {
  Case c = fixed_case(2000, 2, 1, 10, false, 0.5);
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);
  auto as_set = [](const TrainerPlan& p) { return std::set<SampleId>(p.order.begin(), p.order.end()); };
  EXPECT_NE(as_set(planner.plan_all(0)[0]), as_set(planner.plan_all(1)[0]));
}

TEST(EpochPlan, LastStepIsSplitEvenly) {
  // N=9, 2 trainers, B=4: two steps; the last step's 1 sample goes to trainer 0 and
  // trainer 1 gets an empty last batch (counts stay equal; nothing is padded or repeated).
  const PlanShape s = make_plan_shape(9, JobShape{2, 1, 4, false});
  EXPECT_EQ(s.batches_per_trainer, 2u);
  EXPECT_EQ(s.trainer_quota, (std::vector<std::uint64_t>{5, 4}));
  EXPECT_EQ(s.batch_length(0, 1), 1u);
  EXPECT_EQ(s.batch_length(1, 1), 0u);
  const PlanShape d = make_plan_shape(9, JobShape{2, 1, 4, true});
  EXPECT_EQ(d.batches_per_trainer, 1u);
  EXPECT_EQ(d.dropped_per_epoch, 1u);
}

TEST(EpochPlan, MoreTrainersThanSamples) {
  const PlanShape s = make_plan_shape(3, JobShape{4, 2, 5, false});
  EXPECT_EQ(s.batches_per_trainer, 1u);
  EXPECT_EQ(s.trainer_quota, (std::vector<std::uint64_t>{1, 1, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(s.node_owned, (std::vector<std::uint64_t>{2, 1, 0, 0}));
  const PlanShape empty = make_plan_shape(0, JobShape{4, 2, 5, false});
  EXPECT_EQ(empty.batches_per_trainer, 0u);
}

TEST(Placement, BalancedPlacementEvensOutBytes) {
  Case c = fixed_case(16384, 4, 1, 32, false, 1.0);
  const Built b = build_plan(c);
  const auto [lo, hi] = std::minmax_element(b.placement.sample_bytes.begin(), b.placement.sample_bytes.end());
  const std::uint64_t biggest = *std::max_element(c.sizes.begin(), c.sizes.end());
  EXPECT_LE(*hi - *lo, biggest);
}

TEST(Placement, SortedPlacementIsContiguous) {
  Case c = fixed_case(100, 4, 1, 8, false, 1.0);
  c.policy = PlacementPolicy::kSorted;
  const Built b = build_plan(c);
  EXPECT_TRUE(std::is_sorted(b.placement.owner.begin(), b.placement.owner.end()));
  EXPECT_EQ(b.placement.owned[0].front(), 0u);
  EXPECT_EQ(b.placement.owned[3].back(), 99u);
}

}  // namespace epoch_plan_test
}  // namespace shardmix
