#include "server/resume_loader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>

#include "common/placement.h"
#include "proto/checkpoint.h"

namespace shardmix {
namespace fs = std::filesystem;

namespace {

// The old job's plans of an epoch, for its shape (all trainers, index = trainer rank).
using OldPlans = std::function<Result<std::vector<TrainerPlan>>(const PlanShape& shape, std::uint64_t epoch)>;

// Both forms: the checkpoints are checked against `dataset_digest` over `samples` ids, and
// `old_plans` gives what the old job planned.
Result<RedealtEpoch> redeal_from(const std::string& dir, const Config& config, std::uint64_t dataset_digest,
                                 std::uint64_t samples, const OldPlans& old_plans_of, const JobShape& job,
                                 std::uint64_t new_plan_digest) {
  const std::string key = "resume.checkpoint_dir";
  std::error_code ec;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".ckpt") files.push_back(it->path());
  }
  if (ec) return make_error(StatusCode::kNotFound, "{} = {}: cannot list it: {}", key, dir, ec.message());
  if (files.empty()) return make_error(StatusCode::kNotFound, "{} = {} holds no *.ckpt files", key, dir);
  std::sort(files.begin(), files.end());

  std::map<std::uint32_t, std::pair<fs::path, proto::Checkpoint>> by_rank;
  const proto::Checkpoint* first = nullptr;
  fs::path first_file;
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) return make_error(StatusCode::kIoError, "{}: cannot read {}", key, file.string());
    proto::Checkpoint c;
    if (auto err = proto::decode_checkpoint(bytes, c); !err.empty()) {
      return make_error(StatusCode::kCorrupt, "{}: {}: {}", key, file.string(), err);
    }
    if (c.redealt()) {
      return make_error(StatusCode::kInvalidArgument,
                        "{}: {} was taken in an epoch that was itself re-dealt from checkpoints; re-dealing it again "
                        "is not supported (restore it with the same world size, or start from the next epoch)",
                        key, file.string());
    }
    if (first != nullptr && (c.epoch != first->epoch || c.nodes != first->nodes ||
                             c.trainers_per_node != first->trainers_per_node || c.plan_digest != first->plan_digest)) {
      return make_error(StatusCode::kInvalidArgument,
                        "{}: {} (epoch {}, {} x {} trainers) and {} (epoch {}, {} x {} trainers) are not from the same "
                        "job and epoch",
                        key, first_file.string(), first->epoch, first->nodes, first->trainers_per_node, file.string(),
                        c.epoch, c.nodes, c.trainers_per_node);
    }
    auto [it, fresh] = by_rank.emplace(c.rank, std::make_pair(file, c));
    if (!fresh) {
      return make_error(StatusCode::kInvalidArgument, "{}: {} and {} are both rank {}", key, it->second.first.string(),
                        file.string(), c.rank);
    }
    if (first == nullptr) {
      first = &it->second.second;
      first_file = file;
    }
  }
  const proto::Checkpoint& any = *first;
  if (by_rank.size() != any.world_size) {
    std::uint32_t missing = 0;
    while (by_rank.count(missing) > 0) ++missing;
    return make_error(StatusCode::kNotFound, "{} = {}: the old job had {} trainers but {} checkpoints are there (rank {} "
                      "is missing); every old rank's checkpoint is needed",
                      key, dir, any.world_size, by_rank.size(), missing);
  }
  const JobShape old_job{any.nodes, any.trainers_per_node, any.batch_size, any.drop_last};
  const std::uint64_t expected =
      plan_digest(dataset_digest, samples, old_job, config.shuffle, config.dataset.placement);
  if (any.plan_digest != expected) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: {} was taken with another plan: the dataset (catalog), shuffle.seed ({} then, {} now), "
                      "shuffle.exchange_fraction, shuffle.min_entropy or dataset.placement differ",
                      key, first_file.string(), any.seed, config.shuffle.seed);
  }

  // The old job's plan of that epoch, and what each old trainer was given.
  const PlanShape old_shape = make_plan_shape(samples, old_job);
  SHARDMIX_ASSIGN_OR_RETURN(const std::vector<TrainerPlan> old_plans, old_plans_of(old_shape, any.epoch));
  std::vector<std::uint8_t> state(samples, 0);  // 1 dealt, 2 delivered
  for (const TrainerPlan& plan : old_plans) {
    for (SampleId id : plan.order) state[id] = 1;
  }
  for (const auto& [rank, entry] : by_rank) {
    const proto::Checkpoint& c = entry.second;
    ResumePoint point{c.batches_consumed, c.samples_consumed, c.early, c.late};
    if (auto ok = resume_trainer_plan(old_plans[rank], point, c.window); !ok.ok()) {
      return ok.status().with_context(fmt::format("{}: {}", key, entry.first.string()));
    }
    for (SampleId id : delivered_samples(old_plans[rank], point)) state[id] = 2;
  }
  std::vector<SampleId> remaining;
  for (SampleId id = 0; id < state.size(); ++id) {
    if (state[id] == 1) remaining.push_back(id);
  }
  RedealtEpoch out;
  out.epoch = any.epoch;
  out.old_world_size = any.world_size;
  out.digest = redeal_digest(new_plan_digest, any.epoch, remaining);
  const PlanShape new_shape = make_plan_shape(remaining.size(), job);
  out.batches_per_trainer = new_shape.batches_per_trainer;
  out.samples = new_shape.delivered_per_epoch;
  out.skipped = new_shape.dropped_per_epoch;
  out.plans = redeal_epoch(std::move(remaining), job, config.shuffle.seed, any.epoch);
  return out;
}

}  // namespace

Result<RedealtEpoch> load_redealt_epoch(const std::string& dir, const Config& config, const Catalog& catalog,
                                        const JobShape& job, std::uint64_t new_plan_digest) {
  const OldPlans old_plans = [&](const PlanShape& shape, std::uint64_t epoch) -> Result<std::vector<TrainerPlan>> {
    const Placement placement = make_placement(catalog.sizes(), shape, config.dataset.placement, config.shuffle.seed);
    return EpochPlanner(shape, placement, config.shuffle, catalog.labels()).plan_all(epoch);
  };
  return redeal_from(dir, config, catalog_digest(catalog), catalog.size(), old_plans, job, new_plan_digest);
}

Result<RedealtEpoch> load_redealt_epoch(const std::string& dir, const Config& config, std::uint64_t dataset_digest,
                                        std::uint64_t samples, std::span<const SampleId> class_runs,
                                        const JobShape& job, std::uint64_t new_plan_digest) {
  if (config.dataset.placement != PlacementPolicy::kSpread) {
    return make_error(StatusCode::kInvalidArgument, "re-dealing without the catalog needs dataset.placement = spread");
  }
  const OldPlans old_plans = [&](const PlanShape& shape, std::uint64_t epoch) -> Result<std::vector<TrainerPlan>> {
    SHARDMIX_ASSIGN_OR_RETURN(
        auto planner,
        EpochPlanner::with_class_runs(shape, Ownership::spread(samples, shape.node_owned, config.shuffle.seed),
                                      config.shuffle, std::vector<SampleId>(class_runs.begin(), class_runs.end())));
    return planner->plan_all(epoch);
  };
  return redeal_from(dir, config, dataset_digest, samples, old_plans, job, new_plan_digest);
}

}  // namespace shardmix
