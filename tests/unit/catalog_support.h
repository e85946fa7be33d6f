// Shared helper of the catalog tests (catalog_test, shard_formats_test).
// Thread-safety: stateless.
#pragma once

#include <utility>
#include <vector>

#include "common/catalog.h"
#include "common/status.h"

namespace shardmix::test_support {

// Scans with `nranks` ranks, passes every part through the allgather encoding, merges:
// what the daemons do, in one process.
inline Result<Catalog> scan_all(const DatasetConfig& dataset, int nranks) {
  std::vector<ScanResult> parts;
  for (int rank = 0; rank < nranks; ++rank) {
    SHARDMIX_ASSIGN_OR_RETURN(ScanResult part, scan_partition(dataset, rank, nranks));
    SHARDMIX_ASSIGN_OR_RETURN(ScanResult decoded, deserialize_scan(serialize_scan(part)));
    parts.push_back(std::move(decoded));
  }
  return merge_scans(dataset, std::move(parts));
}

}  // namespace shardmix::test_support
