#include "common/resume_plan.h"

#include <algorithm>
#include <cstring>

#include "common/rng.h"
#include "proto/checkpoint.h"

namespace shardmix {
namespace {

constexpr std::uint64_t kStreamRedeal = 4;  // after epoch_plan.cc's kStreamKeep/Pool/Node

template <typename T>
std::uint64_t mix(std::uint64_t hash, T value) {
  std::uint8_t bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  return proto::fnv1a64(bytes, hash);
}

}  // namespace

Result<ResumedTrainerPlan> resume_trainer_plan(const TrainerPlan& plan, const ResumePoint& point,
                                               std::uint64_t max_exceptions) {
  const std::uint64_t batches = plan.num_batches();
  const std::uint64_t size = plan.order.size();
  if (point.batches_consumed > batches) {
    return make_error(StatusCode::kInvalidArgument, "checkpoint says {} batches consumed, the epoch has {}",
                      point.batches_consumed, batches);
  }
  if (plan.batch_begin[point.batches_consumed] != point.samples_consumed) {
    return make_error(StatusCode::kInvalidArgument,
                      "checkpoint says {} samples in its first {} batches, the plan has {}", point.samples_consumed,
                      point.batches_consumed, plan.batch_begin[point.batches_consumed]);
  }
  if (point.early.size() != point.late.size() || point.early.size() > max_exceptions) {
    return make_error(StatusCode::kInvalidArgument,
                      "checkpoint lists {} early and {} late samples; they must pair up and be at most "
                      "shuffle.window = {}",
                      point.early.size(), point.late.size(), max_exceptions);
  }
  for (std::size_t i = 0; i < point.early.size(); ++i) {
    if ((i > 0 && (point.early[i] <= point.early[i - 1] || point.late[i] <= point.late[i - 1])) ||
        point.early[i] < point.samples_consumed || point.early[i] >= size ||
        point.late[i] >= point.samples_consumed) {
      return make_error(StatusCode::kInvalidArgument,
                        "checkpoint exception {} (early position {}, late position {}) does not fit the plan "
                        "({} samples, {} consumed)",
                        i, point.early[i], point.late[i], size, point.samples_consumed);
    }
  }
  ResumedTrainerPlan out;
  out.first_batch = point.batches_consumed;
  const std::uint64_t left = size - point.samples_consumed;
  out.plan.order.reserve(left);
  out.planned_position.reserve(left);
  for (std::uint64_t p : point.late) {
    out.plan.order.push_back(plan.order[p]);
    out.planned_position.push_back(p);
  }
  std::size_t e = 0;
  for (std::uint64_t p = point.samples_consumed; p < size; ++p) {
    if (e < point.early.size() && point.early[e] == p) {
      ++e;
      continue;
    }
    out.plan.order.push_back(plan.order[p]);
    out.planned_position.push_back(p);
  }
  for (std::uint64_t b = point.batches_consumed; b <= batches; ++b) {
    out.plan.batch_begin.push_back(plan.batch_begin[b] - point.samples_consumed);
  }
  return out;
}

std::vector<SampleId> delivered_samples(const TrainerPlan& plan, const ResumePoint& point) {
  std::vector<SampleId> out;
  out.reserve(point.samples_consumed);
  std::size_t l = 0;
  for (std::uint64_t p = 0; p < point.samples_consumed; ++p) {
    if (l < point.late.size() && point.late[l] == p) {
      ++l;
      continue;
    }
    out.push_back(plan.order[p]);
  }
  for (std::uint64_t p : point.early) out.push_back(plan.order[p]);
  return out;
}

std::vector<TrainerPlan> redeal_epoch(std::vector<SampleId> remaining, const JobShape& job, std::uint64_t seed,
                                      std::uint64_t epoch) {
  std::sort(remaining.begin(), remaining.end());  // independent of the order it came in
  Rng rng = Rng::for_stream(seed, {epoch, kStreamRedeal});
  shuffle(std::span<SampleId>(remaining), rng);
  const PlanShape shape = make_plan_shape(remaining.size(), job);
  std::vector<TrainerPlan> plans(job.trainers());
  std::uint64_t cursor = 0;
  for (std::uint32_t t = 0; t < job.trainers(); ++t) {
    TrainerPlan& plan = plans[t];
    const std::uint64_t quota = shape.trainer_quota[t];
    plan.order.assign(remaining.begin() + static_cast<std::ptrdiff_t>(cursor),
                      remaining.begin() + static_cast<std::ptrdiff_t>(cursor + quota));
    cursor += quota;
    plan.batch_begin.push_back(0);
    std::uint64_t begin = 0;
    for (std::uint64_t b = 0; b < shape.batches_per_trainer; ++b) {
      begin += shape.batch_length(t, b);
      plan.batch_begin.push_back(begin);
    }
  }
  return plans;
}

std::uint64_t catalog_digest(const Catalog& catalog) {
  const std::vector<std::uint8_t> bytes = catalog.serialize();
  return proto::fnv1a64(bytes);
}

std::uint64_t plan_digest(std::uint64_t catalog_digest, std::uint64_t num_samples, const JobShape& job,
                          const ShuffleConfig& shuffle, PlacementPolicy placement) {
  std::uint64_t h = mix(0xcbf29ce484222325ull, catalog_digest);
  h = mix(h, num_samples);
  h = mix(h, job.nodes);
  h = mix(h, job.trainers_per_node);
  h = mix(h, job.batch_size);
  h = mix(h, static_cast<std::uint8_t>(job.drop_last));
  h = mix(h, shuffle.seed);
  h = mix(h, shuffle.exchange_fraction);
  h = mix(h, shuffle.min_entropy);
  h = mix(h, static_cast<std::uint32_t>(placement));
  h = mix(h, kPlanAlgorithm);
  return h;
}

std::uint64_t redeal_digest(std::uint64_t new_plan_digest, std::uint64_t epoch, std::span<const SampleId> remaining) {
  std::vector<SampleId> sorted(remaining.begin(), remaining.end());
  std::sort(sorted.begin(), sorted.end());
  std::uint64_t h = mix(new_plan_digest, std::uint64_t{0x72656465616c});  // "redeal"
  h = mix(h, epoch);
  return proto::fnv1a64(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(sorted.data()),
                                                      sorted.size() * sizeof(SampleId)),
                        h);
}

}  // namespace shardmix
