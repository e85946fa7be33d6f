// The epoch plan: which trainer consumes which sample, in which order and micro-batch.
// A pure, deterministic function of (sample count, labels, placement, job shape, shuffle
// config, epoch). Every daemon computes it for its own trainers; no messages are exchanged.
//
// Guarantees (property-tested in tests/unit/epoch_plan_test.cc, plan_slices_test.cc and
// entropy_policy_test.cc):
//  - every trainer gets the same number of batches, every batch has at most batch.size
//    samples and only the last batch of an epoch may be smaller;
//  - drop_last = false: every sample is delivered exactly once per epoch. Batches 0..nb-2
//    are full on every trainer; the R samples of the last step are split as evenly as
//    possible (a trainer may get an empty last batch when R < #trainers; counts stay equal);
//  - drop_last = true: floor(N / (T*B)) full batches per trainer; the N mod (T*B) leftover
//    samples are skipped this epoch (which ones changes every epoch); none repeats;
//  - exchange_fraction Q: node k keeps a seeded uniformly random subset of
//    kept_count(node_quota[k], Q) (the (1-Q) share) of its owned samples; all its other
//    owned samples form the pool, which one uniformly random global permutation deals to
//    the nodes in node order, each taking its deficit node_quota[k] - kept; the drop_last
//    leftovers are what remains at the pool's end. Then each node's kept and received
//    samples are mixed by a per-node random permutation and dealt to its trainers as
//    contiguous slices. Q = 0 means no sample crosses the network (placement gives each
//    node exactly as many samples as its trainers consume, see placement.h).
//
// How (docs/decisions/0040): no step materialises or permutes all N samples. Each random
// order above is a seeded bijection (a keyed pseudo-random permutation, permutation.h;
// "uniformly random" above means as uniform as that family) evaluated only at the positions a
// node needs: sigma_k over node k's owned list (stream {epoch, keep, k}; the kept samples
// are its first kept[k] positions), pi over the pool (stream {epoch, pool}; the pool is
// the nodes' exchanged positions concatenated in node order, and node k receives pool
// slots [slot_begin[k], slot_begin[k+1])), tau_k over node k's stream (stream
// {epoch, node, k}). A received slot is traced to its source node by binary search in an
// O(P) prefix-sum table. Cost of plan_trainer: O(P) to build the epoch's tables (once per
// epoch, memoised) plus O(quota x log P) bijection evaluations; plan_node: O(N/P x log P)
// plus the tables; memory O(P) for the tables plus the plans themselves. plan_all is
// O(N log P) and for tests and tools only. Measured (bench/README.md, shardmix-bench-
// plan-scaling, one thread, 8 trainers per node, Q = 1): 16 ms CPU per node per epoch at
// 16 nodes x 100,000 samples, 28 ms at 1,024 nodes x 100,000; the old planner took 0.06 s
// and 10 s per trainer (so 8 times that per node).
//
// Entropy-aware mode (shuffle.min_entropy > 0; docs/shuffle-quality.md, decisions/0010):
// the configured exchange_fraction becomes a ceiling, and each epoch e uses Q_e = the first
// candidate of exchange_candidates(ceiling) (ascending) whose plan has a mean per-trainer
// micro-batch label entropy (shuffle-quality.md §1, C = distinct labels in `labels`) of at
// least min_entropy; if none does, Q_e = ceiling and choice(e).floor_reached is false.
// With at most kEntropyScoredNodes nodes every node's micro-batches are scored: the figure
// is computed on the planned batches with the same code as compute_epoch_metrics, so with
// shuffle.window = 0 it is exactly what the trainers' delivery will measure. With more
// nodes only the micro-batches of kEntropyScoredNodes nodes are scored
// (entropy_scored_nodes(e): a seeded subset, stream {epoch, entropy-nodes}, a new one every
// epoch), so mean and p5 are estimates of the whole job's figures from that subset's
// batches (p5 is the 5th percentile of the same scored batches the mean averages). Q_e is
// a pure function of the inputs above, hence identical on every daemon. With
// min_entropy = 0 nothing is evaluated and plans are bit-identical to those of a plain
// exchange_fraction.
// Cost of a choice: per candidate tried (stopping at the first that reaches the floor),
// O(P) for the tables and the plan of at most kEntropyScoredNodes nodes, i.e.
// O(min(P, 16) x N/P); no TrainerPlan is built and a batch is scored by counting dense
// class indices. Memory: the first id of each class (labels in id order, as every catalog
// assigns them: a class is a run of ids, so a sample's class is a binary search over C
// entries), or, for labels in any other order, a class per sample (4 bytes each); plus one
// node's stream while choosing.
// A choice and its epoch's tables are memoised for the most recent kMemoisedEpochs epochs;
// the first plan of an epoch pays for them, so a daemon may call choice(e + 1) early from
// any thread.
//
// Thread-safety: EpochPlanner is immutable after construction except for those memos, which
// one internal mutex (memo_mutex_) guards; plan_*, choice and candidates are const and safe
// to call concurrently. Not copyable or movable.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/catalog.h"
#include "common/config.h"
#include "common/ownership.h"
#include "common/permutation.h"

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

// Samples node k keeps from its own share at exchange fraction q when its trainers consume
// node_quota per epoch: round((1 - q) * node_quota), clamped to [0, node_quota].
std::uint64_t kept_count(std::uint64_t node_quota, double exchange_fraction);

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
  // plan (shuffle-quality.md §1), over the batches of EpochPlanner::entropy_scored_nodes
  // (every node's when there are at most 16, else an estimate). NaN when not evaluated (min_entropy = 0) or when no
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
  // Nodes whose micro-batches entropy-aware mode scores per candidate (all when fewer).
  static constexpr std::uint32_t kEntropyScoredNodes = 16;

  // `labels`: the label of each sample id (Catalog::labels()), size shape.num_samples. Only
  // read when shuffle.min_entropy > 0 (then kept as class runs, O(C), when in id order as
  // a catalog's are; else as dense class indices, 4 bytes per sample); may be empty otherwise. With min_entropy > 0 and labels of the wrong size, no
  // batch can be scored: every epoch reports NaN figures, floor_reached = false and uses
  // the ceiling. `shape` and `placement` must outlive the planner (they are referenced).
  EpochPlanner(const PlanShape& shape, const Placement& placement, const ShuffleConfig& shuffle,
               std::span<const std::int32_t> labels = {});
  // The same from an ownership alone (ownership_of(placement) gives the one above): what a
  // node with owner-side metadata has (decision 0055). A listed ownership's lists must
  // outlive the planner.
  EpochPlanner(const PlanShape& shape, Ownership ownership, const ShuffleConfig& shuffle,
               std::span<const std::int32_t> labels = {});
  // The same with the labels given as their class runs: where each class's ids start,
  // ascending from 0 (class_runs() in common/distributed_catalog.h), all that a node with
  // owner-side metadata knows of the labels, O(C). Equal, choice for choice, to the
  // constructor given the labels the runs come from (property-tested). An error naming the
  // run when the list is not such a list of starts below shape.num_samples.
  static Result<std::unique_ptr<EpochPlanner>> with_class_runs(const PlanShape& shape, Ownership ownership,
                                                               const ShuffleConfig& shuffle,
                                                               std::vector<SampleId> runs);
  EpochPlanner(const EpochPlanner&) = delete;
  EpochPlanner& operator=(const EpochPlanner&) = delete;

  // The plan of global trainer rank `trainer` for `epoch`, with
  // choice(epoch).exchange_fraction: O(its quota x log P) plus the epoch's O(P) tables.
  TrainerPlan plan_trainer(std::uint64_t epoch, std::uint32_t trainer) const;
  // Plans of the trainers of `node` (index = local trainer): plan_trainer of each.
  std::vector<TrainerPlan> plan_node(std::uint64_t epoch, std::uint32_t node) const;
  // Plans of all trainers (index = global trainer rank). For tests and tools.
  std::vector<TrainerPlan> plan_all(std::uint64_t epoch) const;

  // The exchange fraction of `epoch` and why. With min_entropy = 0: the configured
  // exchange_fraction, nothing evaluated, O(1). Otherwise computed on first use (see the
  // cost above) and memoised.
  EpochChoice choice(std::uint64_t epoch) const;
  // exchange_candidates(shuffle.exchange_fraction).
  const std::vector<double>& candidates() const { return candidates_; }
  // The nodes whose micro-batches choice(epoch) scores, ascending: all nodes when there are
  // at most kEntropyScoredNodes, else a seeded subset of that many.
  std::vector<std::uint32_t> entropy_scored_nodes(std::uint64_t epoch) const;
  // C used for the label entropy: distinct values in `labels` (0 when min_entropy = 0).
  std::uint64_t num_classes() const { return num_classes_; }

  const PlanShape& shape() const { return shape_; }

 private:
  // The O(P) tables of one epoch at one exchange fraction.
  struct EpochTables {
    double exchange_fraction = 1.0;
    std::vector<std::uint64_t> kept;        // node -> samples it keeps
    std::vector<std::uint64_t> pool_begin;  // node -> first pool index of its exchanged samples; P + 1 entries
    std::vector<std::uint64_t> slot_begin;  // node -> first pool slot it receives; P + 1 entries
    std::vector<Permutation> keep;          // node -> sigma_k over its owned list
    Permutation pool;                       // pi: pool slot -> pool index
  };
  std::shared_ptr<const EpochTables> make_tables(std::uint64_t epoch, double q) const;
  // The tables of `epoch` at choice(epoch).exchange_fraction, memoised.
  std::shared_ptr<const EpochTables> tables(std::uint64_t epoch) const;
  // Appends positions [begin, end) of node's mixed stream to `out`.
  void node_slice(const EpochTables& t, std::uint64_t epoch, std::uint32_t node, std::uint64_t begin,
                  std::uint64_t end, std::vector<SampleId>& out) const;
  TrainerPlan trainer_plan(const EpochTables& t, std::uint64_t epoch, std::uint32_t trainer) const;
  // Evaluates candidates for `epoch` (no memo).
  EpochChoice choose(std::uint64_t epoch) const;

  const PlanShape& shape_;
  Ownership ownership_;
  ShuffleConfig shuffle_;
  // The dense class index of a sample (labels given; min_entropy > 0).
  std::uint32_t class_index(SampleId id) const;

  bool have_labels_ = false;
  // Labels in id order (every catalog's): the first id of each class, O(C); class r is the
  // r-th run. Otherwise (tests with arbitrary labels) class_of_: sample -> dense class, O(N).
  std::vector<SampleId> class_first_;
  std::vector<std::uint32_t> class_of_;
  std::uint64_t num_classes_ = 0;
  std::vector<double> candidates_;

  mutable std::mutex memo_mutex_;
  mutable std::map<std::uint64_t, EpochChoice> memo_;  // epoch -> choice; guarded by memo_mutex_
  mutable std::map<std::uint64_t, std::shared_ptr<const EpochTables>> tables_memo_;  // guarded by memo_mutex_
};

}  // namespace shardmix
