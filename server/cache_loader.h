// Loads a node's resident samples (Placement::cached) from storage into its cache arena with a bounded pool of
// reader threads, logging progress. A file that vanished, shrank or grew since the scan
// is an error naming the file and the offset (the catalog would otherwise lie).
// Thread-safety: load() is a blocking call for the main thread; it owns its workers.
#pragma once

#include <cstdint>
#include <functional>

#include "common/catalog.h"
#include "common/config.h"
#include "common/placement.h"
#include "common/status.h"

namespace shardmix {

struct LoadStats {
  std::uint64_t samples = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
};

// Called on the calling thread about every 50 ms while loading, and once at the end.
using LoadProgress = std::function<void(const LoadStats& so_far, std::uint64_t total_samples,
                                        std::uint64_t total_bytes, bool done)>;

Result<LoadStats> load_owned_samples(const Catalog& catalog, const Placement& placement, std::uint32_t node,
                                     const DatasetConfig& dataset, std::uint32_t threads, std::uint8_t* arena,
                                     const LoadProgress& progress = {});

}  // namespace shardmix
