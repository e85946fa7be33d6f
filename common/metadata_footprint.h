// What one node holds of the job's metadata, in bytes: the catalog, the placement and the
// scheduler state of its trainers (plans being served and staged ahead, per-trainer
// indexes). One function so that the daemon and the simulator report the same figure
// (docs/simulator.md: metadata_bytes_per_node_max).
//
// With the global catalog and placement (the daemon's today) every node holds all N
// samples' entries, so this figure is O(N) whatever P is; with owner-side metadata
// (dataset.placement = spread in the simulator, decision 0055) it is O(N/P + P).
// Counted: each container's capacity times its element size (what the allocator handed
// out, not what is in use), plus the object itself; not allocator overhead.
// Thread-safety: pure functions of immutable values; safe to call from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/catalog.h"
#include "common/epoch_plan.h"
#include "common/placement.h"

namespace shardmix {
class SampleDirectory;
}

namespace shardmix {

// Bytes a vector's allocation holds (capacity, not size): how every figure here counts.
template <class T>
std::uint64_t vector_bytes(const std::vector<T>& v) {
  return static_cast<std::uint64_t>(v.capacity()) * sizeof(T);
}

struct NodeMetadataBytes {
  std::uint64_t catalog = 0;
  std::uint64_t placement = 0;
  std::uint64_t schedulers = 0;  // as passed in: the node's trainers' scheduler state

  std::uint64_t total() const { return catalog + placement + schedulers; }
};

// Bytes held by a placement (every per-sample and per-node vector).
std::uint64_t placement_memory_bytes(const Placement& placement);
// Bytes held by one trainer plan.
std::uint64_t plan_memory_bytes(const TrainerPlan& plan);

// `scheduler_bytes`: the sum of TrainerScheduler::metadata_bytes() over the node's trainers
// (the scheduler lives above this layer, so its figure is passed in).
NodeMetadataBytes node_metadata_bytes(const Catalog& catalog, const Placement& placement,
                                      std::uint64_t scheduler_bytes);
// The same for a node whose metadata is `directory` (global or owner-side, sample_directory.h).
NodeMetadataBytes node_metadata_bytes(const SampleDirectory& directory, std::uint64_t scheduler_bytes);

}  // namespace shardmix
