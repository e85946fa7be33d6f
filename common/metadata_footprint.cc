#include "common/metadata_footprint.h"

#include <vector>

#include "common/sample_directory.h"

namespace shardmix {
namespace {

template <class T>
std::uint64_t nested_bytes(const std::vector<std::vector<T>>& v) {
  std::uint64_t bytes = vector_bytes(v);
  for (const auto& inner : v) bytes += vector_bytes(inner);
  return bytes;
}

}  // namespace

std::uint64_t placement_memory_bytes(const Placement& p) {
  return sizeof(Placement) + vector_bytes(p.owner) + vector_bytes(p.arena_offset) + nested_bytes(p.owned) +
         vector_bytes(p.arena_bytes) + vector_bytes(p.sample_bytes) + vector_bytes(p.resident) +
         nested_bytes(p.cached) + vector_bytes(p.cached_bytes) + vector_bytes(p.cold_samples) +
         vector_bytes(p.cold_bytes);
}

std::uint64_t plan_memory_bytes(const TrainerPlan& plan) {
  return sizeof(TrainerPlan) + vector_bytes(plan.order) + vector_bytes(plan.batch_begin);
}

NodeMetadataBytes node_metadata_bytes(const Catalog& catalog, const Placement& placement,
                                      std::uint64_t scheduler_bytes) {
  NodeMetadataBytes out;
  out.catalog = catalog.memory_bytes();
  out.placement = placement_memory_bytes(placement);
  out.schedulers = scheduler_bytes;
  return out;
}

NodeMetadataBytes node_metadata_bytes(const SampleDirectory& directory, std::uint64_t scheduler_bytes) {
  const DirectoryBytes held = directory.memory_bytes();
  return NodeMetadataBytes{held.catalog, held.placement, scheduler_bytes};
}

}  // namespace shardmix
