// Owner-side start-up (docs/decisions/0061): from each rank's scan of its part of the
// dataset to each node's own share of the catalog, without any rank holding, sending or
// receiving more than about N/P entries plus O(P + files + classes) tables. This replaces
// the global catalog's allgather (every rank receives all N entries) for
// dataset.placement = spread, whose owners are a function of the sample id
// (common/ownership.h).
//
//  1. sort_scans: a sample sort by the catalog's canonical key, (label, path) for whole-file
//     formats and (label, shard path, offset) for shard formats. Every rank sorts its
//     entries and allgathers a regular sample of its keys; the sorted samples give P - 1
//     splitters; an alltoall sends each entry to the rank of its key range; each rank sorts
//     what it received and learns its first id from every rank's count. A rank's slice is
//     then ids [first, first + n) of exactly the order merge_scans gives the global
//     catalog, for any split of the scan across ranks (property-tested against it).
//  2. route_to_owners: each entry goes, by one more alltoall, to the node whose share its id
//     is, at its index in that share (Ownership::locate).
// The checks of merge_scans hold on each slice: duplicates (equal keys meet on one rank),
// dataset.max_sample_bytes, an empty dataset; shard formats check duplicate shards in the
// shared shard table. Not checked here: a file list that gives one path two different labels
// (the two entries sort to different ranks), which the global catalog reports.
// Thread-safety: free functions; each rank calls them on its own thread with its own
// Collectives, every rank in the same order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/catalog.h"
#include "common/collectives.h"
#include "common/config.h"
#include "common/ownership.h"

namespace shardmix {

// Keys each rank contributes to the splitter sample (at most; fewer when it has fewer
// entries). More keys balance the ranges better and cost an allgather of P x this many keys.
inline constexpr std::size_t kSplitterSamplesPerRank = 64;

// What every rank knows of the whole catalog after step 1: O(files + classes), not O(N).
struct CatalogTables {
  std::uint64_t samples = 0;              // N
  std::vector<std::string> shards;        // shard formats: the canonical shard table (bytewise, used shards)
  std::vector<std::string> class_names;   // as merge_scans gives the catalog
  std::uint64_t invalid_samples = 0, invalid_shards = 0;
};

// One rank's slice of the canonical order: entries[i] is sample id first + i.
struct CatalogSlice {
  CatalogTables tables;
  std::uint64_t first = 0;
  std::vector<CatalogEntry> entries;  // shard formats: shard indexes tables.shards
};

// One node's share: entries[i] is the i-th sample of the node's share
// (ownership.owned_at(node, i)), ids[i] its id.
struct OwnerEntries {
  CatalogTables tables;
  std::vector<SampleId> ids;
  std::vector<CatalogEntry> entries;
};

Result<CatalogSlice> sort_scans(const DatasetConfig& dataset, ScanResult mine, Collectives& group);
// Where each class's run of ids starts (ascending, the first is 0): ids follow the labels,
// so class r is the ids [runs[r], runs[r + 1]). What the entropy-aware planner needs of the
// labels (EpochPlanner::with_class_runs), O(C + P): each rank allgathers the run starts in
// its slice. Every rank gets the same list. Call before route_to_owners (which takes the
// slice).
Result<std::vector<SampleId>> class_runs(const CatalogSlice& slice, Collectives& group);
// `ownership` must be over slice.tables.samples ids and group.size() nodes.
Result<OwnerEntries> route_to_owners(CatalogSlice slice, const Ownership& ownership, Collectives& group);

}  // namespace shardmix
