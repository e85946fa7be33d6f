// Reads resume.checkpoint_dir at start-up and re-deals the rest of the checkpointed epoch
// among this job's trainers (docs/decisions/0022-checkpoint-and-resume.md).
//
// Every daemon reads the same files and computes the same RedealtEpoch (pure functions of
// the blobs, the catalog and the config), so no messages are needed. Checks, each an
// error naming the file: every blob decodes; all come from one job (same epoch, job shape
// and plan digest, which must be what this job's catalog and shuffle config give for that
// shape); ranks 0..W-1 appear exactly once; no blob was itself taken in a re-dealt epoch.
// Thread-safety: a pure function apart from reading the directory.
#pragma once

#include <span>
#include <string>

#include "common/catalog.h"
#include "common/config.h"
#include "common/epoch_plan.h"
#include "common/resume_plan.h"
#include "common/status.h"

namespace shardmix {

// `job`: this job's shape; `new_plan_digest`: this job's plan_digest (the re-dealt epoch's
// digest derives from it).
Result<RedealtEpoch> load_redealt_epoch(const std::string& dir, const Config& config, const Catalog& catalog,
                                        const JobShape& job, std::uint64_t new_plan_digest);
// The same on a node without the catalog (owner-side metadata, dataset.placement = spread,
// decision 0067): the old job's plans from the spread ownership of `samples` ids and, with
// the entropy floor, the class runs; `dataset_digest` is what the plan digests were made
// from (the owner-side dataset digest). Equal to the catalog form for the same job
// (tested). Like it, it holds O(N) while it runs: the re-deal deals every remaining sample.
Result<RedealtEpoch> load_redealt_epoch(const std::string& dir, const Config& config, std::uint64_t dataset_digest,
                                        std::uint64_t samples, std::span<const SampleId> class_runs,
                                        const JobShape& job, std::uint64_t new_plan_digest);

}  // namespace shardmix
