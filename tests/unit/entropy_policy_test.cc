// Entropy-aware mode of the epoch planner (shuffle.min_entropy): for generated datasets
// (class-sorted ids as the catalog makes them, balanced and sorted placements, 0 and 1
// samples, more trainers than samples), job shapes, ceilings and floors, the plans stay
// exactly-once with equal batch counts, the chosen exchange fraction is the most local
// candidate whose plan reaches the floor, and the label entropy measured independently
// (compute_epoch_metrics over the plan turned into per-trainer streams) agrees.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "common/epoch_plan.h"
#include "common/placement.h"
#include "tests/unit/plan_support.h"
#include "common/rng.h"
#include "common/shuffle_metrics.h"

namespace shardmix {
namespace entropy_policy_test {

using Case = test_support::PlanCase;  // Q is the ceiling, min_entropy the floor

rc::Gen<Case> gen_case() {
  // Full size from the first test: RapidCheck's inRange favours the low end while its size
  // parameter is small, which would make most early datasets tiny or single-class (tiny
  // and single-class ones still come from the explicit alternatives below).
  return rc::gen::resize(100, rc::gen::exec([] {
    Case c;
    const auto n = *rc::gen::weightedOneOf<std::size_t>({{1, rc::gen::inRange<std::size_t>(0, 4)},
                                                         {3, rc::gen::inRange<std::size_t>(0, 900)},
                                                         {2, rc::gen::element<std::size_t>(5, 17, 64, 255, 899)}});
    c.sizes = *rc::gen::container<std::vector<std::uint64_t>>(n, rc::gen::inRange<std::uint64_t>(1, 300000));
    // Labels from a seeded Rng, then sorted: the catalog numbers samples by (label, path).
    const auto classes = *rc::gen::element<std::uint64_t>(1, 2, 3, 5, 10, 40);
    const auto first_label = *rc::gen::element<std::int32_t>(-3, 0, 7);
    Rng label_rng(*rc::gen::arbitrary<std::uint64_t>());
    for (std::size_t i = 0; i < n; ++i) {
      c.labels.push_back(first_label + static_cast<std::int32_t>(label_rng.below(classes)));
    }
    std::sort(c.labels.begin(), c.labels.end());
    c.job.nodes = *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(1, 7), rc::gen::element<std::uint32_t>(2, 3, 4, 6));
    c.job.trainers_per_node = *rc::gen::inRange<std::uint32_t>(1, 4);
    c.job.batch_size = *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(1, 9), rc::gen::inRange<std::uint32_t>(1, 40),
                                       rc::gen::element<std::uint32_t>(4, 8, 16, 32));
    c.job.drop_last = *rc::gen::arbitrary<bool>();
    c.shuffle.exchange_fraction = *test_support::gen_exchange_fraction();
    c.shuffle.min_entropy = *rc::gen::oneOf(rc::gen::element(0.05, 0.3, 0.5, 0.7, 0.9, 1.0),
                                            rc::gen::map(rc::gen::inRange(1, 1001), [](int x) { return x / 1000.0; }));
    c.shuffle.seed = *rc::gen::arbitrary<std::uint64_t>();
    c.policy = *test_support::gen_policy();
    return c;
  }));
}

using Built = test_support::BuiltPlan;
using test_support::build_plan;

std::uint64_t distinct_labels(const std::vector<std::int32_t>& labels) {
  return std::set<std::int32_t>(labels.begin(), labels.end()).size();
}

// The label entropy a trainer would measure if it received exactly `plans`.
EpochMetrics measure(const Case& c, const std::vector<TrainerPlan>& plans, std::uint64_t epoch) {
  EpochDelivery delivery(plans.size());
  for (std::size_t t = 0; t < plans.size(); ++t) {
    for (std::uint64_t b = 0; b < plans[t].num_batches(); ++b) {
      for (std::uint64_t i = plans[t].batch_begin[b]; i < plans[t].batch_begin[b + 1]; ++i) {
        const SampleId id = plans[t].order[i];
        delivery[t].push_back(DeliveredSample{b, id, c.labels[id], c.sizes[id], DeliveryTier::kUnknown});
      }
    }
  }
  MetricsContext ctx;
  ctx.num_classes = distinct_labels(c.labels);  // C of the dataset, as the planner uses
  ctx.dataset_size = c.sizes.size();
  ctx.epoch = epoch;
  auto m = compute_epoch_metrics(delivery, ctx);
  RC_ASSERT(m.ok());
  return *m;
}

// The plan of `c` at a fixed exchange fraction q, entropy-aware mode off.
std::vector<TrainerPlan> plan_at(const Case& c, const Built& b, double q, std::uint64_t epoch) {
  ShuffleConfig fixed = c.shuffle;
  fixed.exchange_fraction = q;
  fixed.min_entropy = 0.0;
  EpochPlanner planner(b.shape, b.placement, fixed);
  return planner.plan_all(epoch);
}

bool same_figure(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

bool same_choice(const EpochChoice& a, const EpochChoice& b) {
  return a.exchange_fraction == b.exchange_fraction &&
         same_figure(a.planned_label_entropy_mean, b.planned_label_entropy_mean) &&
         same_figure(a.planned_label_entropy_p5, b.planned_label_entropy_p5) && a.floor_reached == b.floor_reached &&
         a.entropy_aware == b.entropy_aware && a.candidates_evaluated == b.candidates_evaluated;
}

// Exactly once (drop_last: none repeats, the right count), equal batch counts, batch sizes.
void check_exactly_once(const Case& c, const Built& b, const std::vector<TrainerPlan>& plans) {
  RC_ASSERT(plans.size() == c.job.trainers());
  std::vector<int> seen(c.sizes.size(), 0);
  std::uint64_t delivered = 0;
  for (const TrainerPlan& p : plans) {
    RC_ASSERT(p.num_batches() == b.shape.batches_per_trainer);
    test_support::check_batch_lengths(p, c.job);
    for (SampleId id : p.order) {
      RC_ASSERT(id < c.sizes.size());
      ++seen[id];
      ++delivered;
    }
  }
  RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int s) { return s <= 1; }));
  RC_ASSERT(delivered == b.shape.delivered_per_epoch);
  if (!c.job.drop_last) RC_ASSERT(delivered == c.sizes.size());
}

// Labels in id order (every catalog's) are kept as class runs (O(C)); labels in any other
// order as a class per sample. Negating the labels reverses their order (the per-sample
// path) and renames the classes, which no entropy figure depends on: every choice is equal.
RC_GTEST_PROP(EntropyAware, ClassRunsChooseAsAClassPerSampleDoes, ()) {
  const Case c = *gen_case();
  const Built b = build_plan(c);
  std::vector<std::int32_t> negated(c.labels.size());
  for (std::size_t i = 0; i < negated.size(); ++i) negated[i] = -c.labels[i];
  const EpochPlanner runs(b.shape, b.placement, c.shuffle, c.labels);
  const EpochPlanner per_sample(b.shape, b.placement, c.shuffle, negated);
  RC_ASSERT(runs.num_classes() == per_sample.num_classes());
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) RC_ASSERT(same_choice(runs.choice(epoch), per_sample.choice(epoch)));
}

// Owner-side metadata (decision 0065): a node knows the labels only as their class runs
// (where each class's ids start), and a planner given those runs chooses and plans exactly
// as one given every label. Runs that are no list of starts are an error, not a planner.
RC_GTEST_PROP(EntropyAware, APlannerGivenTheClassRunsChoosesAndPlansAsOneGivenTheLabels, ()) {
  const Case c = *gen_case();
  const Built b = build_plan(c);
  std::vector<SampleId> runs;
  for (std::size_t i = 0; i < c.labels.size(); ++i) {
    if (i == 0 || c.labels[i] != c.labels[i - 1]) runs.push_back(static_cast<SampleId>(i));
  }
  const Ownership ownership = ownership_of(b.placement);
  const EpochPlanner labelled(b.shape, ownership, c.shuffle, c.labels);
  auto from_runs = EpochPlanner::with_class_runs(b.shape, ownership, c.shuffle, runs);
  RC_ASSERT(from_runs.ok());
  RC_ASSERT((*from_runs)->num_classes() == labelled.num_classes());
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    RC_ASSERT(same_choice((*from_runs)->choice(epoch), labelled.choice(epoch)));
    const std::vector<TrainerPlan> a = (*from_runs)->plan_all(epoch), want = labelled.plan_all(epoch);
    for (std::size_t t = 0; t < a.size(); ++t) RC_ASSERT(a[t].order == want[t].order);
  }
  if (runs.size() >= 2) {
    std::vector<SampleId> unordered = runs;
    std::swap(unordered[0], unordered[1]);
    RC_ASSERT(!EpochPlanner::with_class_runs(b.shape, ownership, c.shuffle, unordered).ok());
  }
  if (!c.sizes.empty()) {
    RC_ASSERT(!EpochPlanner::with_class_runs(b.shape, ownership, c.shuffle, {0, static_cast<SampleId>(c.sizes.size())})
                   .ok());
  }
}

RC_GTEST_PROP(EntropyAware, PlansDeliverEverySampleExactlyOnceWithEqualBatchCounts, ()) {
  const Case c = *gen_case();
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle, c.labels);
  for (std::uint64_t epoch : {0ull, 3ull}) {
    const auto all = planner.plan_all(epoch);
    check_exactly_once(c, b, all);
    // A node's own plan is its slice of the global plan.
    for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
      const auto mine = planner.plan_node(epoch, k);
      for (std::uint32_t local = 0; local < c.job.trainers_per_node; ++local) {
        RC_ASSERT(mine[local].order == all[k * c.job.trainers_per_node + local].order);
      }
    }
  }
}

RC_GTEST_PROP(EntropyAware, ChoosesTheMostLocalCandidateThatReachesTheFloor, ()) {
  Case c = *gen_case();
  const Built b = build_plan(c);
  const std::uint64_t epoch = *rc::gen::inRange<std::uint64_t>(0, 5);
  if (*rc::gen::inRange(0, 3) != 0) {
    // Mostly aim the floor between the figures at Q = 0 and at the ceiling, where the
    // choice is not trivially the first or the last candidate.
    const double lo = measure(c, plan_at(c, b, 0.0, epoch), epoch).batch_label_entropy_mean;
    const double hi = measure(c, plan_at(c, b, c.shuffle.exchange_fraction, epoch), epoch).batch_label_entropy_mean;
    if (std::isfinite(lo) && std::isfinite(hi) && hi > lo) {
      c.shuffle.min_entropy = lo + (hi - lo) * *rc::gen::inRange(1, 1001) / 1000.0;
    }
  }
  EpochPlanner planner(b.shape, b.placement, c.shuffle, c.labels);
  const EpochChoice chosen = planner.choice(epoch);
  const double ceiling = c.shuffle.exchange_fraction;

  // The candidates: ascending, the fixed grid below the ceiling, then the ceiling.
  const std::vector<double>& candidates = planner.candidates();
  const std::vector<double> grid = {0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0};
  RC_ASSERT(!candidates.empty());
  RC_ASSERT(candidates.back() == ceiling);
  RC_ASSERT(std::is_sorted(candidates.begin(), candidates.end()));
  for (std::size_t i = 0; i + 1 < candidates.size(); ++i) {
    RC_ASSERT(candidates[i] < ceiling);
    RC_ASSERT(std::find(grid.begin(), grid.end(), candidates[i]) != grid.end());
  }
  RC_ASSERT(std::count_if(grid.begin(), grid.end(), [&](double q) { return q < ceiling; }) + 1 ==
            static_cast<std::ptrdiff_t>(candidates.size()));

  // The chosen fraction is a candidate, at most the ceiling, found after trying those below it.
  const auto at = std::find(candidates.begin(), candidates.end(), chosen.exchange_fraction);
  RC_ASSERT(at != candidates.end());
  RC_ASSERT(chosen.exchange_fraction <= ceiling);
  RC_ASSERT(chosen.entropy_aware);
  RC_ASSERT(chosen.candidates_evaluated == static_cast<std::uint32_t>(at - candidates.begin()) + 1);

  // The measured figure of the plan actually produced: equal to the planned one, bit for bit.
  const auto plans = planner.plan_all(epoch);
  const EpochMetrics measured = measure(c, plans, epoch);
  RC_ASSERT(same_figure(measured.batch_label_entropy_mean, chosen.planned_label_entropy_mean));
  RC_ASSERT(same_figure(measured.batch_label_entropy_p5, chosen.planned_label_entropy_p5));
  if (chosen.floor_reached) {
    RC_TAG(chosen.exchange_fraction == 0.0       ? "reached at 0"
           : chosen.exchange_fraction == ceiling ? "reached at the ceiling"
                                                 : "reached in between");
    RC_ASSERT(measured.batch_label_entropy_mean >= c.shuffle.min_entropy);
  } else {
    RC_TAG(std::isnan(chosen.planned_label_entropy_mean) ? "not reachable: nothing to score" : "not reachable");
    RC_ASSERT(chosen.exchange_fraction == ceiling);
    RC_ASSERT(chosen.candidates_evaluated == candidates.size());
    RC_ASSERT(!(measured.batch_label_entropy_mean >= c.shuffle.min_entropy));
  }

  // Most local: no smaller candidate's plan (planned at that fixed fraction, measured
  // independently) reaches the floor.
  for (auto it = candidates.begin(); it != at; ++it) {
    const EpochMetrics smaller = measure(c, plan_at(c, b, *it, epoch), epoch);
    RC_ASSERT(!(smaller.batch_label_entropy_mean >= c.shuffle.min_entropy));
  }

  // The entropy-aware plan is the plan at the chosen fraction.
  const auto fixed = plan_at(c, b, chosen.exchange_fraction, epoch);
  for (std::size_t t = 0; t < plans.size(); ++t) {
    RC_ASSERT(plans[t].order == fixed[t].order);
    RC_ASSERT(plans[t].batch_begin == fixed[t].batch_begin);
  }
}

RC_GTEST_PROP(EntropyAware, ZeroFloorIgnoresLabelsAndEvaluatesNothing, ()) {
  Case c = *gen_case();
  c.shuffle.min_entropy = 0.0;
  const Built b = build_plan(c);
  EpochPlanner with_labels(b.shape, b.placement, c.shuffle, c.labels);
  EpochPlanner without_labels(b.shape, b.placement, c.shuffle);
  const EpochChoice chosen = with_labels.choice(2);
  RC_ASSERT(chosen.exchange_fraction == c.shuffle.exchange_fraction);
  RC_ASSERT(!chosen.entropy_aware);
  RC_ASSERT(chosen.floor_reached);
  RC_ASSERT(chosen.candidates_evaluated == 0u);
  RC_ASSERT(std::isnan(chosen.planned_label_entropy_mean));
  RC_ASSERT(with_labels.num_classes() == 0u);
  const auto a = with_labels.plan_all(2);
  const auto z = without_labels.plan_all(2);
  for (std::size_t t = 0; t < a.size(); ++t) RC_ASSERT(a[t].order == z[t].order);
}

RC_GTEST_PROP(EntropyAware, IndependentPlannersMakeTheSameChoice, ()) {
  // Two daemons: separately built placement, labels copied, epochs asked in another order.
  const Case c = *gen_case();
  const Built b1 = build_plan(c);
  const Built b2 = build_plan(c);
  const std::vector<std::int32_t> labels2 = c.labels;
  EpochPlanner p1(b1.shape, b1.placement, c.shuffle, c.labels);
  EpochPlanner p2(b2.shape, b2.placement, c.shuffle, labels2);
  const std::vector<std::uint64_t> epochs = {0, 1, 9};
  for (auto it = epochs.rbegin(); it != epochs.rend(); ++it) (void)p2.choice(*it);
  for (std::uint64_t e : epochs) {
    RC_ASSERT(same_choice(p1.choice(e), p2.choice(e)));
    const auto a = p1.plan_node(e, 0);
    const auto z = p2.plan_node(e, 0);
    for (std::size_t t = 0; t < a.size(); ++t) RC_ASSERT(a[t].order == z[t].order);
  }
}

// ---- Examples ----

// The layout of the table in docs/shuffle-quality.md: 10 classes of 800 samples, class-sorted
// ids placed by contiguous ranges on 4 nodes, 2 trainers per node, batches of 16.
Case class_sorted_case(double ceiling, double floor) {
  Case c;
  for (std::int32_t i = 0; i < 8000; ++i) {
    c.sizes.push_back(1000);
    c.labels.push_back(i / 800);
  }
  c.job = JobShape{4, 2, 16, false};
  c.shuffle.seed = 7;
  c.shuffle.exchange_fraction = ceiling;
  c.shuffle.min_entropy = floor;
  c.policy = PlacementPolicy::kSorted;
  return c;
}

TEST(EntropyAware, ClassSortedFloorOfHalfPicksAnIntermediateFraction) {
  const Case c = class_sorted_case(1.0, 0.5);
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle, c.labels);
  EXPECT_EQ(planner.num_classes(), 10u);
  for (std::uint64_t epoch : {0ull, 1ull}) {
    const EpochChoice chosen = planner.choice(epoch);
    EXPECT_TRUE(chosen.floor_reached);
    EXPECT_GT(chosen.exchange_fraction, 0.0);
    EXPECT_LT(chosen.exchange_fraction, 1.0);
    EXPECT_GE(chosen.planned_label_entropy_mean, 0.5);
    EXPECT_LE(chosen.planned_label_entropy_p5, chosen.planned_label_entropy_mean);
    // Q = 0 does not reach it (about 0.43 on this layout), Q = 1 would (about 0.86).
    const auto local = measure(c, plan_at(c, b, 0.0, epoch), epoch);
    const auto global = measure(c, plan_at(c, b, 1.0, epoch), epoch);
    EXPECT_LT(local.batch_label_entropy_mean, 0.5);
    EXPECT_GT(global.batch_label_entropy_mean, 0.8);
  }
}

std::uint64_t fnv1a(const std::vector<TrainerPlan>& plans) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const TrainerPlan& p : plans) {
    mix(p.order.size());
    for (SampleId id : p.order) mix(id);
    for (std::uint64_t b : p.batch_begin) mix(b);
  }
  return h;
}

TEST(EntropyAware, ZeroFloorPlansAreThePlainPlannersWithOrWithoutLabels) {
  // With the mode off (and labels given or not), every plan must stay bit-identical to the
  // plain planner's. Pinned first with the planner as it was before shuffle.min_entropy
  // existed; re-pinned when the planner moved to seeded bijections (decision 0040), which
  // changes every plan on purpose (plan_digest's kPlanAlgorithm refuses old checkpoints).
  struct Pinned {
    std::size_t n;
    JobShape job;
    double q;
    std::uint64_t seed;
    PlacementPolicy policy;
    std::uint64_t epoch0, epoch3;
  };
  const Pinned pinned[] = {
      {1000, {4, 2, 16, false}, 0.3, 11, PlacementPolicy::kSorted, 0x628c03426a89beb3ull, 0xdcf1936e997421afull},
      {777, {3, 3, 10, true}, 0.07, 99, PlacementPolicy::kBalanced, 0x66a024f8588730afull, 0x0c2c0755ba3430c9ull},
      {5, {2, 4, 3, false}, 1.0, 5, PlacementPolicy::kBalanced, 0x9e40753ec57fcd07ull, 0xdc16996b4f1cf147ull},
  };
  for (const Pinned& p : pinned) {
    Rng rng(42);
    std::vector<std::uint64_t> sizes;
    std::vector<std::int32_t> labels;
    for (std::size_t i = 0; i < p.n; ++i) {
      sizes.push_back(1000 + rng.below(200000));
      labels.push_back(static_cast<std::int32_t>(i / 100));
    }
    const PlanShape shape = make_plan_shape(p.n, p.job);
    const Placement placement = make_placement(sizes, shape, p.policy, p.seed);
    ShuffleConfig shuffle;
    shuffle.seed = p.seed;
    shuffle.exchange_fraction = p.q;
    const EpochPlanner without_labels(shape, placement, shuffle);
    const EpochPlanner with_labels(shape, placement, shuffle, labels);
    for (const EpochPlanner* planner : {&without_labels, &with_labels}) {
      EXPECT_EQ(fnv1a(planner->plan_all(0)), p.epoch0) << "N=" << p.n;
      EXPECT_EQ(fnv1a(planner->plan_all(3)), p.epoch3) << "N=" << p.n;
    }
  }
}

TEST(EntropyAware, ZeroFloorUsesTheConfiguredFraction) {
  const Case c = class_sorted_case(0.3, 0.0);
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle, c.labels);
  const EpochChoice chosen = planner.choice(0);
  EXPECT_EQ(chosen.exchange_fraction, 0.3);
  EXPECT_TRUE(chosen.floor_reached);
  EXPECT_FALSE(chosen.entropy_aware);
  EXPECT_EQ(chosen.candidates_evaluated, 0u);
}

TEST(EntropyAware, ClassMixedShardsNeedNoExchange) {
  // Balanced placement spreads every class over all nodes: Q = 0 already mixes batches.
  Case c = class_sorted_case(1.0, 0.5);
  c.policy = PlacementPolicy::kBalanced;
  Rng rng(3);
  for (auto& s : c.sizes) s = 1000 + rng.below(100000);
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle, c.labels);
  const EpochChoice chosen = planner.choice(0);
  EXPECT_EQ(chosen.exchange_fraction, 0.0);
  EXPECT_TRUE(chosen.floor_reached);
  EXPECT_EQ(chosen.candidates_evaluated, 1u);
}

TEST(EntropyAware, UnreachableFloorUsesTheCeilingAndSaysSo) {
  // Ceiling 0.05: each node keeps 95% of its class-sorted share; 0.9 is out of reach.
  const Case c = class_sorted_case(0.05, 0.9);
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle, c.labels);
  EXPECT_EQ(planner.candidates(), (std::vector<double>{0.0, 0.005, 0.01, 0.02, 0.05}));
  const EpochChoice chosen = planner.choice(4);
  EXPECT_FALSE(chosen.floor_reached);
  EXPECT_EQ(chosen.exchange_fraction, 0.05);
  EXPECT_EQ(chosen.candidates_evaluated, 5u);
  EXPECT_LT(chosen.planned_label_entropy_mean, 0.9);
  EXPECT_FALSE(std::isnan(chosen.planned_label_entropy_mean));
}

TEST(EntropyAware, WithoutLabelsNothingCanBeScored) {
  const Case c = class_sorted_case(0.5, 0.2);
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);  // labels forgotten
  const EpochChoice chosen = planner.choice(0);
  EXPECT_FALSE(chosen.floor_reached);
  EXPECT_EQ(chosen.exchange_fraction, 0.5);
  EXPECT_TRUE(std::isnan(chosen.planned_label_entropy_mean));
}

TEST(EntropyAware, CandidatesAreTheGridBelowTheCeilingThenTheCeiling) {
  EXPECT_EQ(exchange_candidates(0.0), (std::vector<double>{0.0}));
  EXPECT_EQ(exchange_candidates(0.012), (std::vector<double>{0.0, 0.005, 0.01, 0.012}));
  EXPECT_EQ(exchange_candidates(0.1), (std::vector<double>{0.0, 0.005, 0.01, 0.02, 0.05, 0.1}));
  EXPECT_EQ(exchange_candidates(1.0),
            (std::vector<double>{0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0}));
  EXPECT_EQ(exchange_candidates(7.0).back(), 1.0);
}

TEST(EntropyAware, ChoiceSurvivesMemoEvictionAndConcurrentCallers) {
  const Case c = class_sorted_case(1.0, 0.6);
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle, c.labels);
  const EpochChoice first = planner.choice(0);
  // Several threads plan different epochs at once (more than the memo holds, so epoch 0 is
  // evicted and recomputed); every answer equals the one a fresh planner gives.
  constexpr int kThreads = 4;
  constexpr std::uint64_t kEpochs = EpochPlanner::kMemoisedEpochs + 4;
  std::vector<std::vector<EpochChoice>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (std::uint64_t e = 0; e < kEpochs; ++e) {
        const std::uint64_t epoch = (e + static_cast<std::uint64_t>(i) * 3) % kEpochs;
        (void)planner.plan_node(epoch, static_cast<std::uint32_t>(i % 4));
        seen[i].push_back(planner.choice(epoch));
      }
    });
  }
  for (auto& t : threads) t.join();
  EpochPlanner fresh(b.shape, b.placement, c.shuffle, c.labels);
  for (int i = 0; i < kThreads; ++i) {
    for (std::uint64_t e = 0; e < kEpochs; ++e) {
      const std::uint64_t epoch = (e + static_cast<std::uint64_t>(i) * 3) % kEpochs;
      EXPECT_TRUE(same_choice(seen[i][e], fresh.choice(epoch))) << "thread " << i << " epoch " << epoch;
    }
  }
  EXPECT_TRUE(same_choice(planner.choice(0), first));
}

TEST(BatchLabelEntropy, MatchesComputeEpochMetricsWhateverTheOrderOfBatches) {
  // Four batches of one trainer (one too small to score), added in two orders; the figures
  // equal the metric's. Reference points of shuffle-quality.md §1 with C = 2.
  const std::vector<std::vector<std::int32_t>> batches = {{0, 0, 1, 1}, {0, 0, 0, 1}, {1}, {0, 0, 0, 0}};
  EpochDelivery delivery(1);
  for (std::uint64_t b = 0; b < batches.size(); ++b) {
    for (std::int32_t label : batches[b]) delivery[0].push_back(DeliveredSample{b, 0, label, 0, DeliveryTier::kLocal});
  }
  MetricsContext ctx;
  ctx.num_classes = 2;
  const auto m = compute_epoch_metrics(delivery, ctx);
  ASSERT_TRUE(m.ok());
  BatchLabelEntropy forward(2), backward(2);
  for (const auto& batch : batches) forward.add_batch(batch);
  for (auto it = batches.rbegin(); it != batches.rend(); ++it) backward.add_batch(*it);
  const LabelEntropySummary f = forward.summary();
  const LabelEntropySummary r = backward.summary();
  EXPECT_EQ(f.mean, m->batch_label_entropy_mean);
  EXPECT_EQ(f.p5, m->batch_label_entropy_p5);
  EXPECT_EQ(f.scored, 3u);
  EXPECT_EQ(f.skipped, 1u);
  EXPECT_EQ(m->batches_skipped, 1u);
  EXPECT_EQ(r.mean, f.mean);
  EXPECT_EQ(r.p5, f.p5);
  EXPECT_NEAR(f.mean, (1.0 + 0.8112781245 + 0.0) / 3, 1e-9);
}

RC_GTEST_PROP(BatchLabelEntropyProperty, AgreesWithTheFormulaForBatchesOfMixedSizes, ()) {
  // Batches of varying sizes (the per-size cache of p ln p must follow), counts given in any
  // order and labels in any order: mean and p5 equal the textbook §1 formula.
  const auto num_classes = *rc::gen::inRange<std::uint64_t>(1, 12);
  const auto batches = *rc::gen::container<std::vector<std::vector<std::int32_t>>>(
      rc::gen::container<std::vector<std::int32_t>>(rc::gen::inRange<std::int32_t>(0, static_cast<int>(num_classes))));
  BatchLabelEntropy by_labels(num_classes), by_counts(num_classes);
  std::vector<double> expected;
  for (const auto& batch : batches) {
    by_labels.add_batch(batch);
    std::vector<std::uint64_t> counts(num_classes, 0);  // with zeros, in label order reversed
    for (std::int32_t label : batch) ++counts[num_classes - 1 - static_cast<std::uint64_t>(label)];
    by_counts.add_counts(counts, batch.size());
    const std::uint64_t k = std::min<std::uint64_t>(batch.size(), num_classes);
    if (batch.size() < 2 || k < 2) continue;
    double h = 0;
    for (std::uint64_t c : counts) {
      if (c == 0) continue;
      const double p = static_cast<double>(c) / static_cast<double>(batch.size());
      h -= p * std::log(p);
    }
    expected.push_back(std::clamp(h / std::log(static_cast<double>(k)), 0.0, 1.0));
  }
  const LabelEntropySummary a = by_labels.summary();
  const LabelEntropySummary b = by_counts.summary();
  RC_ASSERT(a.scored == expected.size());
  RC_ASSERT(a.scored + a.skipped == batches.size());
  RC_ASSERT(same_figure(a.mean, b.mean));
  RC_ASSERT(same_figure(a.p5, b.p5));
  if (expected.empty()) {
    RC_ASSERT(std::isnan(a.mean));
    return;
  }
  std::sort(expected.begin(), expected.end());
  double sum = 0;
  for (double h : expected) sum += h;
  RC_ASSERT(std::abs(a.mean - sum / expected.size()) < 1e-12);
  const double p5 = expected[std::max<std::size_t>(1, (5 * expected.size() + 99) / 100) - 1];
  RC_ASSERT(std::abs(a.p5 - p5) < 1e-12);
}

}  // namespace entropy_policy_test
}  // namespace shardmix
