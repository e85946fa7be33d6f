#include "common/epoch_plan.h"

#include <algorithm>
#include <cmath>
#include <span>

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

std::uint64_t kept_count(std::uint64_t node_quota, double exchange_fraction) {
  const double keep = std::llround((1.0 - exchange_fraction) * static_cast<double>(node_quota));
  return std::min<std::uint64_t>(node_quota, static_cast<std::uint64_t>(std::max(0.0, keep)));
}

constexpr double kExchangeGrid[] = {0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0};

}  // namespace

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
    : shape_(shape), placement_(placement), shuffle_(shuffle) {
  if (shuffle_.min_entropy > 0) {
    candidates_ = exchange_candidates(shuffle_.exchange_fraction);
    if (labels.size() == shape_.num_samples) {
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
  } else {
    candidates_ = {shuffle_.exchange_fraction};
  }
}

std::vector<std::vector<SampleId>> EpochPlanner::node_streams(std::uint64_t epoch, std::int64_t only_node,
                                                              double q) const {
  const std::uint32_t nodes = shape_.job.nodes;
  std::vector<std::vector<SampleId>> streams(nodes);
  std::vector<SampleId> pool;
  pool.reserve(shape_.num_samples);
  std::vector<std::uint64_t> kept(nodes, 0);

  // 1. Each node keeps a seeded (1-Q) share of its quota; the rest goes to the pool.
  for (std::uint32_t k = 0; k < nodes; ++k) {
    const auto& owned = placement_.owned[k];
    kept[k] = kept_count(shape_.node_quota[k], q);
    if (kept[k] == 0) {
      pool.insert(pool.end(), owned.begin(), owned.end());
      continue;
    }
    std::vector<SampleId> mine(owned.begin(), owned.end());
    Rng rng = Rng::for_stream(shuffle_.seed, {epoch, kStreamKeep, k});
    // Partial Fisher-Yates: the first kept[k] positions become a uniform random subset.
    for (std::uint64_t i = 0; i < kept[k]; ++i) {
      std::swap(mine[i], mine[i + rng.below(mine.size() - i)]);
    }
    if (only_node < 0 || only_node == k) {
      streams[k].assign(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(kept[k]));
    }
    pool.insert(pool.end(), mine.begin() + static_cast<std::ptrdiff_t>(kept[k]), mine.end());
  }

  // 2. One global permutation of the pool, dealt to nodes in node order by their deficit.
  //    drop_last leftovers are whatever remains at the end of the pool.
  Rng pool_rng = Rng::for_stream(shuffle_.seed, {epoch, kStreamPool});
  shuffle(std::span<SampleId>(pool), pool_rng);
  std::uint64_t cursor = 0;
  for (std::uint32_t k = 0; k < nodes; ++k) {
    const std::uint64_t need = shape_.node_quota[k] - kept[k];
    if (only_node < 0 || only_node == k) {
      streams[k].insert(streams[k].end(), pool.begin() + static_cast<std::ptrdiff_t>(cursor),
                        pool.begin() + static_cast<std::ptrdiff_t>(cursor + need));
    }
    cursor += need;
  }
  return streams;
}

void EpochPlanner::shuffle_node(std::uint64_t epoch, std::uint32_t node, std::vector<SampleId>& samples) const {
  Rng rng = Rng::for_stream(shuffle_.seed, {epoch, kStreamNode, node});
  shuffle(std::span<SampleId>(samples), rng);
}

std::vector<TrainerPlan> EpochPlanner::deal_to_trainers(std::uint64_t epoch, std::uint32_t node,
                                                        std::vector<SampleId> samples) const {
  // 3. Mix kept and received samples, then give each local trainer a contiguous slice.
  shuffle_node(epoch, node, samples);
  const std::uint32_t per_node = shape_.job.trainers_per_node;
  std::vector<TrainerPlan> plans(per_node);
  std::uint64_t cursor = 0;
  for (std::uint32_t local = 0; local < per_node; ++local) {
    const std::uint32_t trainer = shape_.job.first_trainer_of_node(node) + local;
    TrainerPlan& plan = plans[local];
    const std::uint64_t quota = shape_.trainer_quota[trainer];
    plan.order.assign(samples.begin() + static_cast<std::ptrdiff_t>(cursor),
                      samples.begin() + static_cast<std::ptrdiff_t>(cursor + quota));
    cursor += quota;
    plan.batch_begin.reserve(shape_.batches_per_trainer + 1);
    std::uint64_t begin = 0;
    plan.batch_begin.push_back(0);
    for (std::uint64_t b = 0; b < shape_.batches_per_trainer; ++b) {
      begin += shape_.batch_length(trainer, b);
      plan.batch_begin.push_back(begin);
    }
  }
  return plans;
}

EpochChoice EpochPlanner::choose(std::uint64_t epoch) const {
  const bool have_labels = class_of_.size() == shape_.num_samples;
  EpochChoice out;
  out.entropy_aware = true;
  std::vector<std::uint32_t> class_count(num_classes_, 0);  // per batch, reset after use
  std::vector<std::uint32_t> touched;                       // classes present in the batch
  std::vector<std::uint64_t> counts;                        // their counts
  for (double q : candidates_) {
    // Plan every node at q exactly as plan_all does, then score each planned micro-batch
    // (the trainer slices of deal_to_trainers) without building TrainerPlans.
    LabelEntropySummary summary;
    if (have_labels) {
      BatchLabelEntropy scorer(num_classes_);
      auto streams = node_streams(epoch, -1, q);
      for (std::uint32_t k = 0; k < shape_.job.nodes; ++k) {
        std::vector<SampleId>& samples = streams[k];
        shuffle_node(epoch, k, samples);
        std::uint64_t cursor = 0;
        for (std::uint32_t local = 0; local < shape_.job.trainers_per_node; ++local) {
          const std::uint32_t trainer = shape_.job.first_trainer_of_node(k) + local;
          for (std::uint64_t b = 0; b < shape_.batches_per_trainer; ++b) {
            const std::uint64_t length = shape_.batch_length(trainer, b);
            if (length == 0) continue;  // an empty batch is not delivered, so not measured
            touched.clear();
            for (std::uint64_t i = cursor; i < cursor + length; ++i) {
              const std::uint32_t cls = class_of_[samples[i]];
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

std::vector<TrainerPlan> EpochPlanner::plan_node(std::uint64_t epoch, std::uint32_t node) const {
  auto streams = node_streams(epoch, node, choice(epoch).exchange_fraction);
  return deal_to_trainers(epoch, node, std::move(streams[node]));
}

std::vector<TrainerPlan> EpochPlanner::plan_all(std::uint64_t epoch) const {
  auto streams = node_streams(epoch, -1, choice(epoch).exchange_fraction);
  std::vector<TrainerPlan> all;
  all.reserve(shape_.job.trainers());
  for (std::uint32_t k = 0; k < shape_.job.nodes; ++k) {
    for (auto& plan : deal_to_trainers(epoch, k, std::move(streams[k]))) all.push_back(std::move(plan));
  }
  return all;
}

}  // namespace shardmix
