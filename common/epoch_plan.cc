#include "common/epoch_plan.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "common/permutation.h"
#include "common/placement.h"
#include "common/rng.h"
#include "common/shuffle_metrics.h"

namespace shardmix {
namespace {

// Stream ids: each random choice of an epoch draws from its own seeded stream, so that
// changing one (e.g. Q) does not reshuffle the others.
constexpr std::uint64_t kStreamKeep = 1;
constexpr std::uint64_t kStreamPool = 2;
constexpr std::uint64_t kStreamNode = 3;
constexpr std::uint64_t kStreamEntropyNodes = 4;

constexpr double kExchangeGrid[] = {0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0};

}  // namespace

std::uint64_t kept_count(std::uint64_t node_quota, double exchange_fraction) {
  const double keep = std::llround((1.0 - exchange_fraction) * static_cast<double>(node_quota));
  return std::min<std::uint64_t>(node_quota, static_cast<std::uint64_t>(std::max(0.0, keep)));
}

std::vector<double> exchange_candidates(double ceiling) {
  ceiling = std::isnan(ceiling) ? 1.0 : std::clamp(ceiling, 0.0, 1.0);
  std::vector<double> out;
  for (double q : kExchangeGrid) {
    if (q < ceiling) out.push_back(q);
  }
  out.push_back(ceiling);
  return out;
}

PlanShape make_plan_shape(std::uint64_t n, const JobShape& job) {
  PlanShape shape;
  shape.job = job;
  shape.num_samples = n;
  const std::uint64_t trainers = job.trainers();
  const std::uint64_t step = trainers * job.batch_size;  // samples in one full global step
  shape.trainer_quota.assign(trainers, 0);
  if (job.drop_last) {
    shape.batches_per_trainer = n / step;
    for (auto& q : shape.trainer_quota) q = shape.batches_per_trainer * job.batch_size;
  } else {
    shape.batches_per_trainer = (n + step - 1) / step;
    if (shape.batches_per_trainer > 0) {
      const std::uint64_t full = (shape.batches_per_trainer - 1) * job.batch_size;
      const std::uint64_t last_step = n - full * trainers;  // R, 1..step
      for (std::uint64_t t = 0; t < trainers; ++t) {
        shape.trainer_quota[t] = full + last_step / trainers + (t < last_step % trainers ? 1 : 0);
      }
    }
  }
  shape.node_quota.assign(job.nodes, 0);
  for (std::uint64_t t = 0; t < trainers; ++t) {
    shape.node_quota[job.node_of_trainer(static_cast<std::uint32_t>(t))] += shape.trainer_quota[t];
  }
  for (auto q : shape.trainer_quota) shape.delivered_per_epoch += q;
  shape.dropped_per_epoch = n - shape.delivered_per_epoch;
  // Leftovers of drop_last are cached too (spread evenly): they are delivered in other epochs.
  shape.node_owned = shape.node_quota;
  for (std::uint32_t k = 0; k < job.nodes; ++k) {
    shape.node_owned[k] += shape.dropped_per_epoch / job.nodes +
                           (k < shape.dropped_per_epoch % job.nodes ? 1 : 0);
  }
  return shape;
}

std::uint64_t PlanShape::batch_length(std::uint32_t trainer, std::uint64_t batch) const {
  if (batch + 1 < batches_per_trainer) return job.batch_size;
  if (batch + 1 == batches_per_trainer) {
    return trainer_quota[trainer] - (batches_per_trainer - 1) * job.batch_size;
  }
  return 0;
}

EpochPlanner::EpochPlanner(const PlanShape& shape, const Placement& placement,
                           const ShuffleConfig& shuffle, std::span<const std::int32_t> labels)
    : EpochPlanner(shape, ownership_of(placement), shuffle, labels) {}

EpochPlanner::EpochPlanner(const PlanShape& shape, Ownership ownership, const ShuffleConfig& shuffle,
                           std::span<const std::int32_t> labels)
    : shape_(shape), ownership_(std::move(ownership)), shuffle_(shuffle) {
  if (shuffle_.min_entropy > 0) {
    candidates_ = exchange_candidates(shuffle_.exchange_fraction);
    if (labels.size() == shape_.num_samples) {
      have_labels_ = true;
      if (std::is_sorted(labels.begin(), labels.end())) {
        // Every catalog assigns ids in label order, so a class is a run of ids: keep where
        // each run starts (O(C)), not a class per sample (O(N)). Run r is dense class r.
        for (std::size_t i = 0; i < labels.size(); ++i) {
          if (i == 0 || labels[i] != labels[i - 1]) class_first_.push_back(static_cast<SampleId>(i));
        }
        num_classes_ = class_first_.size();
      } else {
        // Dense class indices 0..C-1 (label values are opaque), so scoring a batch counts
        // classes in a small array instead of sorting labels.
        std::vector<std::int32_t> distinct(labels.begin(), labels.end());
        std::sort(distinct.begin(), distinct.end());
        distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
        num_classes_ = distinct.size();
        class_of_.resize(labels.size());
        for (std::size_t i = 0; i < labels.size(); ++i) {
          class_of_[i] = static_cast<std::uint32_t>(std::lower_bound(distinct.begin(), distinct.end(), labels[i]) -
                                                    distinct.begin());
        }
      }
    }
  } else {
    candidates_ = {shuffle_.exchange_fraction};
  }
}

Result<std::unique_ptr<EpochPlanner>> EpochPlanner::with_class_runs(const PlanShape& shape, Ownership ownership,
                                                                    const ShuffleConfig& shuffle,
                                                                    std::vector<SampleId> runs) {
  for (std::size_t r = 0; r < runs.size(); ++r) {
    if ((r == 0 && runs[r] != 0) || (r > 0 && runs[r] <= runs[r - 1]) || runs[r] >= shape.num_samples) {
      return make_error(StatusCode::kInternal, "class run {} of {} starts at id {}: not an ascending list of run "
                        "starts from 0 below {} samples", r, runs.size(), runs[r], shape.num_samples);
    }
  }
  auto planner = std::make_unique<EpochPlanner>(shape, std::move(ownership), shuffle);
  if (shuffle.min_entropy > 0 && !runs.empty()) {
    planner->have_labels_ = true;
    planner->num_classes_ = runs.size();
    planner->class_first_ = std::move(runs);
  }
  return planner;
}

std::shared_ptr<const EpochPlanner::EpochTables> EpochPlanner::make_tables(std::uint64_t epoch, double q) const {
  const std::uint32_t nodes = shape_.job.nodes;
  auto t = std::make_shared<EpochTables>();
  t->exchange_fraction = q;
  t->kept.resize(nodes);
  t->pool_begin.resize(nodes + 1, 0);
  t->slot_begin.resize(nodes + 1, 0);
  t->keep.resize(nodes);
  for (std::uint32_t k = 0; k < nodes; ++k) {
    const std::uint64_t owned = ownership_.owned_count(k);
    t->kept[k] = kept_count(shape_.node_quota[k], q);
    // sigma_k: node k keeps the first kept[k] of its owned samples in this order and puts
    // the rest into the pool.
    t->keep[k] = Permutation::for_stream(owned, shuffle_.seed, {epoch, kStreamKeep, k});
    t->pool_begin[k + 1] = t->pool_begin[k] + (owned - t->kept[k]);
    t->slot_begin[k + 1] = t->slot_begin[k] + (shape_.node_quota[k] - t->kept[k]);
  }
  // pi: pool slot s holds pool index pi(s); slots past slot_begin[nodes] are the drop_last
  // leftovers of this epoch.
  t->pool = Permutation::for_stream(t->pool_begin[nodes], shuffle_.seed, {epoch, kStreamPool});
  return t;
}

std::shared_ptr<const EpochPlanner::EpochTables> EpochPlanner::tables(std::uint64_t epoch) const {
  const double q = choice(epoch).exchange_fraction;
  {
    std::lock_guard<std::mutex> lock(memo_mutex_);
    if (auto it = tables_memo_.find(epoch); it != tables_memo_.end()) return it->second;
  }
  // Built outside the lock, like a choice: O(P), and equal whoever builds it.
  std::shared_ptr<const EpochTables> built = make_tables(epoch, q);
  std::lock_guard<std::mutex> lock(memo_mutex_);
  tables_memo_.emplace(epoch, built);
  // The epoch just added may itself be the oldest and go at once: `built` stays valid.
  while (tables_memo_.size() > kMemoisedEpochs) tables_memo_.erase(tables_memo_.begin());
  return built;
}

void EpochPlanner::node_slice(const EpochTables& t, std::uint64_t epoch, std::uint32_t node, std::uint64_t begin,
                              std::uint64_t end, std::vector<SampleId>& out) const {
  // Node k's stream, before mixing: its kept samples (positions 0..kept-1), then the pool
  // slots it receives. tau_k mixes the stream; the trainers take contiguous slices of the
  // mixed order.
  const Permutation& keep = t.keep[node];
  const std::uint64_t kept = t.kept[node];
  const std::uint64_t first_slot = t.slot_begin[node];
  const Permutation tau = Permutation::for_stream(shape_.node_quota[node], shuffle_.seed, {epoch, kStreamNode, node});
  // Where stream position i of this node comes from: (source node, index in its share).
  const auto source_of = [&](std::uint64_t i) -> std::pair<std::uint32_t, std::uint64_t> {
    if (i < kept) return {node, keep(i)};
    const std::uint64_t pool_index = t.pool(first_slot + (i - kept));
    // The source node: the last whose exchanged samples start at or before pool_index
    // (nodes that exchange nothing have empty ranges and are skipped by upper_bound).
    const auto source = static_cast<std::uint32_t>(
        std::upper_bound(t.pool_begin.begin(), t.pool_begin.end(), pool_index) - t.pool_begin.begin() - 1);
    return {source, t.keep[source](t.kept[source] + (pool_index - t.pool_begin[source]))};
  };
  out.reserve(out.size() + (end - begin));
  if (ownership_.is_spread()) {
    // Spread ownership: the id is a function of (source, index), no memory is read.
    for (std::uint64_t p = begin; p < end; ++p) {
      const auto [source, index] = source_of(tau(p));
      out.push_back(ownership_.owned_at(source, index));
    }
    return;
  }
  // Listed ownership, in two passes per chunk: first where each sample id lives (pure
  // arithmetic), then the loads. Received samples sit in other nodes' owned lists, i.e.
  // anywhere in O(N) memory; issued back to back the cache misses overlap instead of
  // waiting on the bijections.
  constexpr std::uint64_t kChunk = 256;
  std::pair<std::uint32_t, std::uint64_t> where[kChunk];
  for (std::uint64_t chunk = begin; chunk < end; chunk += kChunk) {
    const std::uint64_t count = std::min(kChunk, end - chunk);
    for (std::uint64_t c = 0; c < count; ++c) where[c] = source_of(tau(chunk + c));
    for (std::uint64_t c = 0; c < count; ++c) out.push_back(ownership_.owned_at(where[c].first, where[c].second));
  }
}

TrainerPlan EpochPlanner::trainer_plan(const EpochTables& t, std::uint64_t epoch, std::uint32_t trainer) const {
  const std::uint32_t node = shape_.job.node_of_trainer(trainer);
  std::uint64_t begin = 0;
  for (std::uint32_t other = shape_.job.first_trainer_of_node(node); other < trainer; ++other) {
    begin += shape_.trainer_quota[other];
  }
  TrainerPlan plan;
  node_slice(t, epoch, node, begin, begin + shape_.trainer_quota[trainer], plan.order);
  plan.batch_begin.reserve(shape_.batches_per_trainer + 1);
  std::uint64_t batch_begin = 0;
  plan.batch_begin.push_back(0);
  for (std::uint64_t b = 0; b < shape_.batches_per_trainer; ++b) {
    batch_begin += shape_.batch_length(trainer, b);
    plan.batch_begin.push_back(batch_begin);
  }
  return plan;
}

std::vector<std::uint32_t> EpochPlanner::entropy_scored_nodes(std::uint64_t epoch) const {
  const std::uint32_t nodes = shape_.job.nodes;
  std::vector<std::uint32_t> out;
  if (nodes <= kEntropyScoredNodes) {
    for (std::uint32_t k = 0; k < nodes; ++k) out.push_back(k);
    return out;
  }
  const Permutation pick = Permutation::for_stream(nodes, shuffle_.seed, {epoch, kStreamEntropyNodes});
  for (std::uint32_t i = 0; i < kEntropyScoredNodes; ++i) out.push_back(static_cast<std::uint32_t>(pick(i)));
  std::sort(out.begin(), out.end());
  return out;
}

std::uint32_t EpochPlanner::class_index(SampleId id) const {
  if (class_first_.empty()) return class_of_[id];
  return static_cast<std::uint32_t>(std::upper_bound(class_first_.begin(), class_first_.end(), id) -
                                    class_first_.begin() - 1);
}

EpochChoice EpochPlanner::choose(std::uint64_t epoch) const {
  const bool have_labels = have_labels_;
  EpochChoice out;
  out.entropy_aware = true;
  const std::vector<std::uint32_t> scored = entropy_scored_nodes(epoch);
  std::vector<std::uint32_t> class_count(num_classes_, 0);  // per batch, reset after use
  std::vector<std::uint32_t> touched;                       // classes present in the batch
  std::vector<std::uint64_t> counts;                        // their counts
  std::vector<SampleId> samples;                            // one node's mixed stream
  for (double q : candidates_) {
    // Plan the scored nodes at q exactly as plan_node does, then score each planned
    // micro-batch (the trainer slices of the node's mixed stream) without building
    // TrainerPlans.
    LabelEntropySummary summary;
    if (have_labels) {
      BatchLabelEntropy scorer(num_classes_);
      const auto t = make_tables(epoch, q);
      for (std::uint32_t k : scored) {
        samples.clear();
        node_slice(*t, epoch, k, 0, shape_.node_quota[k], samples);
        std::uint64_t cursor = 0;
        for (std::uint32_t local = 0; local < shape_.job.trainers_per_node; ++local) {
          const std::uint32_t trainer = shape_.job.first_trainer_of_node(k) + local;
          for (std::uint64_t b = 0; b < shape_.batches_per_trainer; ++b) {
            const std::uint64_t length = shape_.batch_length(trainer, b);
            if (length == 0) continue;  // an empty batch is not delivered, so not measured
            touched.clear();
            for (std::uint64_t i = cursor; i < cursor + length; ++i) {
              const std::uint32_t cls = class_index(samples[i]);
              if (class_count[cls]++ == 0) touched.push_back(cls);
            }
            counts.clear();
            for (std::uint32_t cls : touched) {
              counts.push_back(class_count[cls]);
              class_count[cls] = 0;
            }
            scorer.add_counts(counts, length);
            cursor += length;
          }
        }
      }
      summary = scorer.summary();
    } else {
      summary.mean = summary.p5 = std::numeric_limits<double>::quiet_NaN();
    }
    ++out.candidates_evaluated;
    out.exchange_fraction = q;
    out.planned_label_entropy_mean = summary.mean;
    out.planned_label_entropy_p5 = summary.p5;
    // NaN (nothing to score) never reaches a floor.
    out.floor_reached = summary.mean >= shuffle_.min_entropy;
    if (out.floor_reached) break;
  }
  return out;
}

EpochChoice EpochPlanner::choice(std::uint64_t epoch) const {
  if (!(shuffle_.min_entropy > 0)) {
    EpochChoice fixed;
    fixed.exchange_fraction = shuffle_.exchange_fraction;
    return fixed;
  }
  {
    std::lock_guard<std::mutex> lock(memo_mutex_);
    if (auto it = memo_.find(epoch); it != memo_.end()) return it->second;
  }
  // Computed outside the lock: two threads asking for the same new epoch both compute it
  // (the results are equal), and lookups of other epochs are never blocked for that long.
  const EpochChoice chosen = choose(epoch);
  std::lock_guard<std::mutex> lock(memo_mutex_);
  memo_.emplace(epoch, chosen);
  while (memo_.size() > kMemoisedEpochs) memo_.erase(memo_.begin());  // forget the oldest epochs
  return chosen;
}

TrainerPlan EpochPlanner::plan_trainer(std::uint64_t epoch, std::uint32_t trainer) const {
  return trainer_plan(*tables(epoch), epoch, trainer);
}

std::vector<TrainerPlan> EpochPlanner::plan_node(std::uint64_t epoch, std::uint32_t node) const {
  const auto t = tables(epoch);
  std::vector<TrainerPlan> plans;
  plans.reserve(shape_.job.trainers_per_node);
  for (std::uint32_t local = 0; local < shape_.job.trainers_per_node; ++local) {
    plans.push_back(trainer_plan(*t, epoch, shape_.job.first_trainer_of_node(node) + local));
  }
  return plans;
}

std::vector<TrainerPlan> EpochPlanner::plan_all(std::uint64_t epoch) const {
  const auto t = tables(epoch);
  std::vector<TrainerPlan> all;
  all.reserve(shape_.job.trainers());
  for (std::uint32_t trainer = 0; trainer < shape_.job.trainers(); ++trainer) {
    all.push_back(trainer_plan(*t, epoch, trainer));
  }
  return all;
}

}  // namespace shardmix
