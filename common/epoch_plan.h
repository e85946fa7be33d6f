// The epoch plan: which trainer consumes which sample, in which order and micro-batch.
// A pure, deterministic function of (sample count, placement, job shape, shuffle config,
// epoch). Every daemon computes it for its own trainers; no messages are exchanged.
//
// Guarantees (property-tested in tests/unit/epoch_plan_test.cc):
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
// Thread-safety: EpochPlanner is immutable after construction; plan_* are const and safe
// to call concurrently.
#pragma once

#include <cstdint>
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

class EpochPlanner {
 public:
  EpochPlanner(const PlanShape& shape, const Placement& placement, const ShuffleConfig& shuffle);

  // Plans of the trainers of `node` (index = local trainer), for `epoch`.
  std::vector<TrainerPlan> plan_node(std::uint64_t epoch, std::uint32_t node) const;
  // Plans of all trainers (index = global trainer rank). For tests and tools.
  std::vector<TrainerPlan> plan_all(std::uint64_t epoch) const;

  const PlanShape& shape() const { return shape_; }

 private:
  // Samples each node's trainers consume this epoch, before the per-node shuffle.
  std::vector<std::vector<SampleId>> node_streams(std::uint64_t epoch, std::int64_t only_node) const;
  std::vector<TrainerPlan> deal_to_trainers(std::uint64_t epoch, std::uint32_t node,
                                            std::vector<SampleId> samples) const;

  const PlanShape& shape_;
  const Placement& placement_;
  ShuffleConfig shuffle_;
};

}  // namespace shardmix
