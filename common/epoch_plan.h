// The epoch plan: which trainer consumes which sample, in which order and micro-batch.
// A pure, deterministic function of (sample count, labels, placement, job shape, shuffle
// config, epoch). Every daemon computes it for its own trainers; no messages are exchanged.
//
// Guarantees (property-tested in tests/unit/epoch_plan_test.cc and entropy_policy_test.cc):
//  - every trainer gets the same number of batches, every batch has at most batch.size
//    samples and only the last batch of an epoch may be smaller;
//  - drop_last = false: every sample is delivered exactly once per epoch. Batches 0..nb-2
//    are full on every trainer; the R samples of the last step are split as evenly as
//    possible (a trainer may get an empty last batch when R < #trainers; counts stay equal);
//  - drop_last = true: floor(N / (T*B)) full batches per trainer; the N mod (T*B) leftover
//    samples are skipped this epoch (which ones changes every epoch); none repeats;
//  - exchange_fraction Q: node k keeps a seeded (1-Q) share of its node quota from the
//    samples it caches for its own trainers; all other samples are dealt by one global
//    permutation. Q = 0 means no sample crosses the network (placement gives each node
//    exactly as many samples as its trainers consume, see placement.h).
//
// Entropy-aware mode (shuffle.min_entropy > 0; docs/shuffle-quality.md, decisions/0010):
// the configured exchange_fraction becomes a ceiling, and each epoch e uses Q_e = the first
// candidate of exchange_candidates(ceiling) (ascending) whose plan has a mean per-trainer
// micro-batch label entropy (shuffle-quality.md §1, C = distinct labels in `labels`) of at
// least min_entropy; if none does, Q_e = ceiling and choice(e).floor_reached is false. The
// figure is computed on the planned batches with the same code as compute_epoch_metrics, so
// with shuffle.window = 0 it is exactly what the trainers' delivery will measure. Q_e is a
// pure function of the inputs above, hence identical on every daemon. With min_entropy = 0
// nothing is evaluated and plans are bit-identical to those of a plain exchange_fraction.
// Cost of a choice: one plan-and-score of the whole job per candidate tried, stopping at
// the first that reaches the floor; no TrainerPlan is built and a batch is scored by
// counting dense class indices. Measured on the development machine (AMD EPYC, one thread,
// RelWithDebInfo) for 1.28 M samples, 1000 classes, 16 nodes x 4 trainers, batch 32,
// class-sorted placement: about 35 ms CPU per candidate; 0.03 s when Q = 0 suffices,
// 0.32 s for floor 0.95 (Q = 0.3, 9 candidates), 0.46 s worst case (13 candidates, floor
// not reachable); wall time was about twice that with the 2 cores shared. Memory: 4 bytes
// per sample for the class indices, plus about 3 x 4 bytes per sample while choosing.
// A choice is memoised for the most recent kMemoisedEpochs epochs; the first plan_node of
// an epoch pays for it, so a daemon may call choice(e + 1) early from any thread.
//
// Thread-safety: EpochPlanner is immutable after construction except for that memo, which
// one internal mutex (memo_mutex_) guards; plan_*, choice and candidates are const and safe
// to call concurrently. Not copyable or movable.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "common/catalog.h"
#include "common/config.h"

namespace shardmix {

struct JobShape {
  std::uint32_t nodes = 1;
  std::uint32_t trainers_per_node = 1;
  std::uint32_t batch_size = 1;
  bool drop_last = false;

  std::uint32_t trainers() const { return nodes * trainers_per_node; }
  std::uint32_t node_of_trainer(std::uint32_t trainer) const { return trainer / trainers_per_node; }
  std::uint32_t first_trainer_of_node(std::uint32_t node) const { return node * trainers_per_node; }
};

// The batch structure shared by every epoch; depends only on N and the job shape.
struct PlanShape {
  std::uint64_t num_samples = 0;
  std::uint64_t batches_per_trainer = 0;
  std::uint64_t delivered_per_epoch = 0;
  std::uint64_t dropped_per_epoch = 0;
  std::vector<std::uint64_t> trainer_quota;  // samples per trainer per epoch
  std::vector<std::uint64_t> node_quota;     // samples a node's trainers consume per epoch
  std::vector<std::uint64_t> node_owned;     // samples placement gives each node
  JobShape job;

  // Samples in batch `batch` of `trainer`.
  std::uint64_t batch_length(std::uint32_t trainer, std::uint64_t batch) const;
};

PlanShape make_plan_shape(std::uint64_t num_samples, const JobShape& job);

// One trainer's epoch: `order` holds its samples in planned order; batch b is
// order[batch_begin[b] .. batch_begin[b+1]).
struct TrainerPlan {
  std::vector<SampleId> order;
  std::vector<std::uint64_t> batch_begin;  // batches_per_trainer + 1 entries

  std::uint64_t num_batches() const { return batch_begin.empty() ? 0 : batch_begin.size() - 1; }
};

struct Placement;

// The exchange fractions entropy-aware mode tries, in this order, for a ceiling Q:
// the fixed grid {0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1}
// below Q, then Q itself (so Q is always the last candidate). Fine near 0, where label
// entropy rises fastest on class-sorted placement (a few foreign samples per batch already
// add classes). `ceiling` is clamped to [0, 1].
std::vector<double> exchange_candidates(double ceiling);

// What the planner chose for one epoch, for the daemon to log and report.
struct EpochChoice {
  // The exchange fraction this epoch's plan uses.
  double exchange_fraction = 1.0;
  // Mean and 5th percentile of the per-trainer micro-batch label entropy of this epoch's
  // plan (shuffle-quality.md §1). NaN when not evaluated (min_entropy = 0) or when no
  // batch can be scored (batches of 1, a single class, no labels).
  double planned_label_entropy_mean = std::numeric_limits<double>::quiet_NaN();
  double planned_label_entropy_p5 = std::numeric_limits<double>::quiet_NaN();
  // False when no candidate reached shuffle.min_entropy (then exchange_fraction is the
  // ceiling): the daemon should warn. Always true when min_entropy = 0.
  bool floor_reached = true;
  // True when min_entropy > 0 (the figures above were computed).
  bool entropy_aware = false;
  // Candidates planned and scored to make this choice (0 when min_entropy = 0).
  std::uint32_t candidates_evaluated = 0;
};

class EpochPlanner {
 public:
  // Epoch choices kept in the memo (the scheduler asks for the current and the next epoch).
  static constexpr std::size_t kMemoisedEpochs = 8;

  // `labels`: the label of each sample id (Catalog::labels()), size shape.num_samples. Only
  // read when shuffle.min_entropy > 0 (then copied as dense class indices, 4 bytes per
  // sample); may be empty otherwise. With min_entropy > 0 and labels of the wrong size, no
  // batch can be scored: every epoch reports NaN figures, floor_reached = false and uses
  // the ceiling. `shape` and `placement` must outlive the planner (they are referenced).
  EpochPlanner(const PlanShape& shape, const Placement& placement, const ShuffleConfig& shuffle,
               std::span<const std::int32_t> labels = {});
  EpochPlanner(const EpochPlanner&) = delete;
  EpochPlanner& operator=(const EpochPlanner&) = delete;

  // Plans of the trainers of `node` (index = local trainer), for `epoch`, with
  // choice(epoch).exchange_fraction.
  std::vector<TrainerPlan> plan_node(std::uint64_t epoch, std::uint32_t node) const;
  // Plans of all trainers (index = global trainer rank). For tests and tools.
  std::vector<TrainerPlan> plan_all(std::uint64_t epoch) const;

  // The exchange fraction of `epoch` and why. With min_entropy = 0: the configured
  // exchange_fraction, nothing evaluated, O(1). Otherwise computed on first use (see the
  // cost above) and memoised.
  EpochChoice choice(std::uint64_t epoch) const;
  // exchange_candidates(shuffle.exchange_fraction).
  const std::vector<double>& candidates() const { return candidates_; }
  // C used for the label entropy: distinct values in `labels` (0 when min_entropy = 0).
  std::uint64_t num_classes() const { return num_classes_; }

  const PlanShape& shape() const { return shape_; }

 private:
  // Samples each node's trainers consume this epoch at exchange fraction q, before the
  // per-node shuffle.
  std::vector<std::vector<SampleId>> node_streams(std::uint64_t epoch, std::int64_t only_node, double q) const;
  // Mixes a node's kept and received samples (the per-node shuffle, in place).
  void shuffle_node(std::uint64_t epoch, std::uint32_t node, std::vector<SampleId>& samples) const;
  std::vector<TrainerPlan> deal_to_trainers(std::uint64_t epoch, std::uint32_t node,
                                            std::vector<SampleId> samples) const;
  // Evaluates candidates for `epoch` (no memo).
  EpochChoice choose(std::uint64_t epoch) const;

  const PlanShape& shape_;
  const Placement& placement_;
  ShuffleConfig shuffle_;
  std::vector<std::uint32_t> class_of_;  // sample -> dense class index; empty = no labels
  std::uint64_t num_classes_ = 0;
  std::vector<double> candidates_;

  mutable std::mutex memo_mutex_;
  mutable std::map<std::uint64_t, EpochChoice> memo_;  // epoch -> choice; guarded by memo_mutex_
};

}  // namespace shardmix
