// The epoch plan computed slice by slice (decision 0040): over generated datasets, job
// shapes (more nodes than the entropy subset included), batch sizes, drop_last, exchange
// fractions in [0, 1] and cache capacities, each trainer's plan_trainer is its slice of
// plan_all, every sample is delivered exactly once (drop_last = false), batch counts are
// equal, drop_last leftovers never repeat and change across epochs, plans are a function
// of the seed and change with the epoch, Q = 0 keeps every sample on its node, and no node
// receives more foreign samples than its deficit. Entropy-aware mode on many nodes scores
// a seeded subset of nodes and agrees with those nodes' plans.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "common/epoch_plan.h"
#include "common/placement.h"
#include "tests/unit/plan_support.h"
#include "common/rng.h"
#include "common/shuffle_metrics.h"

namespace shardmix {
namespace plan_slices_test {

using Case = test_support::PlanCase;

rc::Gen<Case> gen_case() {
  return rc::gen::resize(100, rc::gen::exec([] {
    Case c;
    const auto n = *rc::gen::weightedOneOf<std::size_t>({{1, rc::gen::inRange<std::size_t>(0, 5)},
                                                         {3, rc::gen::inRange<std::size_t>(0, 400)},
                                                         {2, rc::gen::inRange<std::size_t>(0, 3000)}});
    c.sizes = *rc::gen::container<std::vector<std::uint64_t>>(n, rc::gen::inRange<std::uint64_t>(0, 5000));
    c.job.nodes = *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(1, 8), rc::gen::inRange<std::uint32_t>(1, 40));
    c.job.trainers_per_node = *rc::gen::inRange<std::uint32_t>(1, 5);
    c.job.batch_size = *rc::gen::oneOf(rc::gen::inRange<std::uint32_t>(1, 9), rc::gen::inRange<std::uint32_t>(1, 65));
    c.job.drop_last = *rc::gen::arbitrary<bool>();
    c.shuffle.exchange_fraction =
        *rc::gen::oneOf(rc::gen::element(0.0, 0.01, 0.5, 1.0),
                        rc::gen::map(rc::gen::inRange(0, 1001), [](int x) { return x / 1000.0; }));
    c.shuffle.seed = *rc::gen::arbitrary<std::uint64_t>();
    c.policy = *test_support::gen_policy();
    // Residency must not change the plan (placement.h): capacities from none to unlimited.
    c.capacity = *rc::gen::element(std::uint64_t{kNoCapacityLimit}, std::uint64_t{0}, std::uint64_t{4096}, std::uint64_t{100000});
    return c;
  }));
}

using Built = test_support::BuiltPlan;
using test_support::build_plan;

// Samples of the epoch that no trainer gets (the drop_last leftovers), ascending.
std::vector<SampleId> leftovers(std::uint64_t n, const std::vector<TrainerPlan>& plans) {
  std::vector<bool> dealt(n, false);
  for (const TrainerPlan& p : plans) {
    for (SampleId id : p.order) dealt[id] = true;
  }
  std::vector<SampleId> out;
  for (SampleId id = 0; id < n; ++id) {
    if (!dealt[id]) out.push_back(id);
  }
  return out;
}

RC_GTEST_PROP(PlanSlices, EverySampleOnceEqualBatchCountsAndTrainerSlicesAgree, ()) {
  const Case c = *gen_case();
  RC_TAG(c.job.drop_last ? "drop_last" : "keep_last");
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);
  const std::uint64_t n = c.sizes.size();
  for (std::uint64_t epoch : {0ull, 5ull}) {
    const auto all = planner.plan_all(epoch);
    RC_ASSERT(all.size() == c.job.trainers());
    std::vector<int> seen(n, 0);
    std::uint64_t delivered = 0;
    for (std::uint32_t t = 0; t < all.size(); ++t) {
      const TrainerPlan& p = all[t];
      RC_ASSERT(p.num_batches() == b.shape.batches_per_trainer);  // equal batch counts
      RC_ASSERT(p.order.size() == b.shape.trainer_quota[t]);
      test_support::check_batch_lengths(p, c.job);
      for (SampleId id : p.order) {
        RC_ASSERT(id < n);
        ++seen[id];
        ++delivered;
      }
      // One trainer's plan, computed alone, is its slice of the whole plan.
      const TrainerPlan alone = planner.plan_trainer(epoch, t);
      RC_ASSERT(alone.order == p.order);
      RC_ASSERT(alone.batch_begin == p.batch_begin);
    }
    RC_ASSERT(std::all_of(seen.begin(), seen.end(), [](int s) { return s <= 1; }));  // none repeats
    RC_ASSERT(delivered == b.shape.delivered_per_epoch);
    if (!c.job.drop_last) RC_ASSERT(delivered == n);  // none missed
  }
  // plan_node agrees too, on a node picked by the generator.
  const auto node = *rc::gen::inRange<std::uint32_t>(0, c.job.nodes);
  const auto all = planner.plan_all(5);
  const auto mine = planner.plan_node(5, node);
  for (std::uint32_t local = 0; local < c.job.trainers_per_node; ++local) {
    RC_ASSERT(mine[local].order == all[c.job.first_trainer_of_node(node) + local].order);
  }
}

RC_GTEST_PROP(PlanSlices, DropLastLeftoversChangeAcrossEpochs, ()) {
  Case c = *gen_case();
  c.job.drop_last = true;
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);
  const std::uint64_t n = c.sizes.size();
  std::set<std::vector<SampleId>> distinct;
  for (std::uint64_t epoch = 0; epoch < 40; ++epoch) {
    const auto left = leftovers(n, planner.plan_all(epoch));
    RC_ASSERT(left.size() == b.shape.dropped_per_epoch);  // the rest was each dealt once (and none twice: size)
    distinct.insert(left);
  }
  // A proper, non-empty subset is skipped: it is drawn again every epoch, so 40 epochs give
  // the same one only with probability below 2^-39.
  if (b.shape.dropped_per_epoch > 0 && b.shape.delivered_per_epoch > 0) {
    RC_ASSERT(distinct.size() > 1u);
  }
}

RC_GTEST_PROP(PlanSlices, SameSeedSamePlanOtherEpochOtherPlan, ()) {
  const Case c = *gen_case();
  const Built b1 = build_plan(c);
  const Built b2 = build_plan(c);
  EpochPlanner p1(b1.shape, b1.placement, c.shuffle);
  EpochPlanner p2(b2.shape, b2.placement, c.shuffle);
  const auto a = p1.plan_all(3);
  for (std::uint32_t t = 0; t < a.size(); ++t) RC_ASSERT(p2.plan_trainer(3, t).order == a[t].order);
  // A node whose trainers consume 12 or more samples mixes them with a fresh permutation
  // each epoch: the same plan twice has probability below 1/12!.
  const std::uint64_t largest = *std::max_element(b1.shape.node_quota.begin(), b1.shape.node_quota.end());
  if (largest >= 12) {
    const auto z = p1.plan_all(4);
    bool differ = false;
    for (std::uint32_t t = 0; t < a.size(); ++t) differ = differ || a[t].order != z[t].order;
    RC_ASSERT(differ);
  }
}

RC_GTEST_PROP(PlanSlices, ForeignSamplesNeverExceedTheDeficit, ()) {
  Case c = *gen_case();
  if (*rc::gen::arbitrary<bool>()) c.shuffle.exchange_fraction = 0.0;
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle);
  const double q = c.shuffle.exchange_fraction;
  for (std::uint32_t k = 0; k < c.job.nodes; ++k) {
    std::uint64_t local = 0;
    std::uint64_t foreign = 0;
    for (const TrainerPlan& p : planner.plan_node(1, k)) {
      for (SampleId id : p.order) (b.placement.owner[id] == k ? local : foreign) += 1;
    }
    const std::uint64_t kept = kept_count(b.shape.node_quota[k], q);
    // The kept share is local; received pool samples may come from anywhere, this node
    // included, so at most the deficit is foreign.
    RC_ASSERT(local >= kept);
    RC_ASSERT(foreign <= b.shape.node_quota[k] - kept);
    if (q == 0.0) RC_ASSERT(foreign == 0u);  // Q = 0: nothing crosses the network
  }
}

// A dataset with labels in class-sorted id order, as the catalog numbers samples.
std::vector<std::int32_t> sorted_labels(std::size_t n, std::uint64_t classes) {
  std::vector<std::int32_t> labels(n);
  for (std::size_t i = 0; i < n; ++i) labels[i] = static_cast<std::int32_t>(i * classes / std::max<std::size_t>(n, 1));
  return labels;
}

RC_GTEST_PROP(PlanSlices, EntropyChoiceOnManyNodesScoresASeededSubsetOfNodes, ()) {
  Case c;
  c.job.nodes = *rc::gen::inRange<std::uint32_t>(17, 60);
  c.job.trainers_per_node = *rc::gen::inRange<std::uint32_t>(1, 3);
  c.job.batch_size = *rc::gen::inRange<std::uint32_t>(2, 17);
  c.job.drop_last = *rc::gen::arbitrary<bool>();
  const auto n = *rc::gen::inRange<std::size_t>(0, 4000);
  c.sizes.assign(n, 1000);
  c.policy = PlacementPolicy::kSorted;
  c.shuffle.seed = *rc::gen::arbitrary<std::uint64_t>();
  c.shuffle.exchange_fraction = 1.0;
  c.shuffle.min_entropy = *rc::gen::element(0.2, 0.5, 0.9, 5.0);
  const auto labels = sorted_labels(n, *rc::gen::element<std::uint64_t>(2, 10, 50));
  const Built b = build_plan(c);
  EpochPlanner planner(b.shape, b.placement, c.shuffle, labels);
  EpochPlanner twin(b.shape, b.placement, c.shuffle, labels);
  const std::uint64_t epoch = *rc::gen::inRange<std::uint64_t>(0, 100);

  const auto scored = planner.entropy_scored_nodes(epoch);
  RC_ASSERT(scored.size() == EpochPlanner::kEntropyScoredNodes);
  RC_ASSERT(std::is_sorted(scored.begin(), scored.end()));
  RC_ASSERT(std::adjacent_find(scored.begin(), scored.end()) == scored.end());
  RC_ASSERT(scored.back() < c.job.nodes);

  // Identical on every daemon: a pure function of the inputs.
  const EpochChoice choice = planner.choice(epoch);
  const EpochChoice other = twin.choice(epoch);
  RC_ASSERT(choice.exchange_fraction == other.exchange_fraction);
  RC_ASSERT(choice.candidates_evaluated == other.candidates_evaluated);
  RC_ASSERT(choice.floor_reached == other.floor_reached);

  // The figures are those of the scored nodes' planned micro-batches.
  BatchLabelEntropy entropy(planner.num_classes());
  for (std::uint32_t k : scored) {
    for (const TrainerPlan& p : planner.plan_node(epoch, k)) {
      for (std::uint64_t j = 0; j < p.num_batches(); ++j) {
        if (p.batch_begin[j + 1] == p.batch_begin[j]) continue;
        std::vector<std::int32_t> batch;
        for (std::uint64_t i = p.batch_begin[j]; i < p.batch_begin[j + 1]; ++i) batch.push_back(labels[p.order[i]]);
        entropy.add_batch(batch);
      }
    }
  }
  const LabelEntropySummary summary = entropy.summary();
  if (std::isnan(summary.mean)) {
    RC_ASSERT(std::isnan(choice.planned_label_entropy_mean));
  } else {
    RC_ASSERT(std::abs(summary.mean - choice.planned_label_entropy_mean) < 1e-9);
    RC_ASSERT(std::abs(summary.p5 - choice.planned_label_entropy_p5) < 1e-9);
  }
}

TEST(PlanSlices, EntropySubsetIsEveryNodeUpToSixteenAndChangesWithTheEpoch) {
  for (const std::uint32_t nodes : {1u, 7u, 16u, 17u, 1024u}) {
    const PlanShape shape = make_plan_shape(nodes * 10, JobShape{nodes, 1, 4, false});
    Placement placement;
    placement.owned.resize(nodes);
    for (std::uint32_t k = 0; k < nodes; ++k) {
      for (SampleId i = 0; i < 10; ++i) placement.owned[k].push_back(k * 10 + i);
    }
    ShuffleConfig shuffle;
    shuffle.min_entropy = 0.5;
    const EpochPlanner planner(shape, placement, shuffle);
    const auto e0 = planner.entropy_scored_nodes(0);
    if (nodes <= EpochPlanner::kEntropyScoredNodes) {
      EXPECT_EQ(e0.size(), nodes);
      for (std::uint32_t k = 0; k < nodes; ++k) EXPECT_EQ(e0[k], k);
      EXPECT_EQ(planner.entropy_scored_nodes(1), e0);
    } else {
      EXPECT_EQ(e0.size(), EpochPlanner::kEntropyScoredNodes);
      if (nodes > 100) {
        EXPECT_NE(planner.entropy_scored_nodes(1), e0);  // 1024 choose 16: never equal
      }
    }
  }
}

}  // namespace plan_slices_test
}  // namespace shardmix
