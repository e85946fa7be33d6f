// Loads a node's resident samples (Placement::cached) from storage into its cache arena with a bounded pool of
// reader threads, logging progress. Shard samples are read in storage order (shard, offset),
// so that each shard is opened about once (service.open_shard_files). A file that vanished, shrank or grew since the scan
// is an error naming the file and the offset (the catalog would otherwise lie).
// Thread-safety: load() is a blocking call for the main thread; it owns its workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "common/catalog.h"
#include "common/config.h"
#include "common/placement.h"
#include "common/status.h"
#include "server/shard_file_cache.h"

namespace shardmix {

struct LoadStats {
  std::uint64_t samples = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  // S3 datasets with dataset.strict = false: resident samples whose object was deleted or
  // changed since the listing (kNotFound, kCorrupt), each with its error naming the key;
  // the load goes on without them (the daemon makes them cold, docs/s3.md). Other errors,
  // and any error under strict, stop the load.
  std::vector<std::pair<SampleId, Status>> unreadable;
};

// Called on the calling thread about every 50 ms while loading, and once at the end.
// `cancelled`, when given, is asked as often: true stops the load (kCancelled; the readers
// finish the sample in hand), e.g. on SIGTERM during a long load. `per_sample_delay` is
// fault injection (inject.load_delay): each reader sleeps that long after every sample.
// `open_shards` (null = open per read) supplies shard descriptors (service.open_shard_files).
using LoadProgress = std::function<void(const LoadStats& so_far, std::uint64_t total_samples,
                                        std::uint64_t total_bytes, bool done)>;

Result<LoadStats> load_owned_samples(const Catalog& catalog, const Placement& placement, std::uint32_t node,
                                     const DatasetConfig& dataset, std::uint32_t threads, std::uint8_t* arena,
                                     const LoadProgress& progress = {},
                                     const std::function<bool()>& cancelled = {},
                                     std::chrono::microseconds per_sample_delay = {},
                                     ShardFileCache* open_shards = nullptr);

// The same for any (sample, arena offset) list, e.g. an owner-side node's resident share
// (decision 0063), where `catalog` holds the share and ids are its local indices. `node`
// names the node in messages.
Result<LoadStats> load_samples(const Catalog& catalog, std::vector<std::pair<SampleId, std::uint64_t>> targets,
                               std::uint32_t node, const DatasetConfig& dataset, std::uint32_t threads,
                               std::uint8_t* arena, const LoadProgress& progress = {},
                               const std::function<bool()>& cancelled = {},
                               std::chrono::microseconds per_sample_delay = {}, ShardFileCache* open_shards = nullptr);

// Cache rotation's reload (docs/decisions/0033): writes each (sample, offset) of `entering`
// into `arena` with `threads` readers; the first error (naming file and offset) stops it.
// `cancelled` is polled between samples (e.g. the daemon is stopping). No progress output:
// it runs on its own thread while the daemon serves.
Result<LoadStats> load_entering_samples(const Catalog& catalog, const DatasetConfig& dataset,
                                        std::vector<std::pair<SampleId, std::uint64_t>> entering,
                                        std::uint32_t threads, std::uint8_t* arena,
                                        const std::function<bool()>& cancelled = {},
                                        ShardFileCache* open_shards = nullptr);

}  // namespace shardmix
