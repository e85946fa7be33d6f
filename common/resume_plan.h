// Resuming an epoch from checkpoints: pure functions over epoch plans
// (docs/decisions/0022-checkpoint-and-resume.md).
//
//  - A position (ResumePoint) in one trainer's plan: batches_consumed batches, i.e. the
//    planned positions [0, samples_consumed), minus `late` (overtaken under
//    shuffle.window, not delivered yet), plus `early` (delivered ahead of their batch).
//  - resume_trainer_plan: the same world size. The rest of that trainer's epoch as a plan
//    of its own: the late samples first, then the planned order from samples_consumed on
//    without the early ones; batches batches_consumed.. of the original plan, with their
//    planned sizes. So the resumed pass delivers exactly the samples not yet delivered,
//    and every trainer still has the same number of batches in the epoch.
//  - redeal_epoch: a different world size. The samples the old plan dealt that no old
//    trainer was given are shuffled (seeded by seed and epoch) and dealt to the new
//    trainers with the batch rule of make_plan_shape (equal batch counts; drop_last skips
//    the remainder of a full global step, as in any epoch). Locality (exchange_fraction)
//    is not kept for this one epoch; later epochs use the normal plan.
//  - plan_digest: the identity of a plan, written into checkpoints and compared on restore.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/catalog.h"
#include "common/config.h"
#include "common/epoch_plan.h"
#include "common/status.h"

namespace shardmix {

struct ResumePoint {
  std::uint64_t batches_consumed = 0;
  std::uint64_t samples_consumed = 0;
  std::vector<std::uint64_t> early;  // ascending, >= samples_consumed
  std::vector<std::uint64_t> late;   // ascending, < samples_consumed
};

struct ResumedTrainerPlan {
  TrainerPlan plan;                           // what is left, batch 0 = original batch first_batch
  std::uint64_t first_batch = 0;              // = batches_consumed
  std::vector<std::uint64_t> planned_position;  // plan position -> position in the original plan
};

// Checks `point` against `plan` (batch boundary, positions inside the plan, at most
// `max_exceptions` of each kind) and builds the rest of the epoch. Errors name the field.
Result<ResumedTrainerPlan> resume_trainer_plan(const TrainerPlan& plan, const ResumePoint& point,
                                               std::uint64_t max_exceptions);

// The samples of `plan` delivered at `point` (in no particular order). `point` must be
// valid for `plan` (resume_trainer_plan accepts it).
std::vector<SampleId> delivered_samples(const TrainerPlan& plan, const ResumePoint& point);

// Deals `remaining` (distinct sample ids) to job.trainers() trainers: index = trainer rank.
std::vector<TrainerPlan> redeal_epoch(std::vector<SampleId> remaining, const JobShape& job, std::uint64_t seed,
                                      std::uint64_t epoch);

// Identity of the plans of (catalog, shuffle config except window, placement policy, job
// shape) and of the planning algorithm (kPlanAlgorithm): equal digests mean equal plans for
// every epoch. `catalog_digest` is catalog_digest(catalog).
// The planning algorithm's version, part of plan_digest: a checkpoint taken by a build whose
// planner dealt differently (version 1: before decision 0040) is refused, not resumed
// against the wrong plan. Bump it whenever the same inputs give other plans.
inline constexpr std::uint64_t kPlanAlgorithm = 2;
std::uint64_t plan_digest(std::uint64_t catalog_digest, std::uint64_t num_samples, const JobShape& job,
                          const ShuffleConfig& shuffle, PlacementPolicy placement);
std::uint64_t catalog_digest(const Catalog& catalog);
// The digest of a re-dealt epoch: the new job's plan digest combined with what was
// re-dealt (the sorted remaining samples).
std::uint64_t redeal_digest(std::uint64_t new_plan_digest, std::uint64_t epoch, std::span<const SampleId> remaining);

}  // namespace shardmix

namespace shardmix {

// An epoch the daemons re-deal at start-up from resume.checkpoint_dir: every trainer's
// plan for it (index = trainer rank) replaces the normal plan of that epoch.
struct RedealtEpoch {
  std::uint64_t epoch = 0;
  std::uint64_t digest = 0;           // redeal_digest(...)
  std::uint64_t batches_per_trainer = 0;
  std::uint64_t old_world_size = 0;
  std::uint64_t samples = 0;          // re-dealt (delivered in this epoch's rest)
  std::uint64_t skipped = 0;          // drop_last remainder, not delivered
  std::vector<TrainerPlan> plans;
};

}  // namespace shardmix
