#include "common/distributed_catalog.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "proto/catalog_exchange.h"

namespace shardmix {
namespace {

// The catalog's canonical order (Catalog::from_entries, from_shard_entries): label first,
// then the path bytewise (whole-file formats) or the canonical shard and offset (shard
// formats, whose entries carry no path).
bool key_less(const CatalogEntry& a, const CatalogEntry& b) {
  if (a.label != b.label) return a.label < b.label;
  if (a.shard != b.shard) return a.shard < b.shard;
  if (a.offset != b.offset) return a.offset < b.offset;
  return a.path < b.path;
}
bool key_equal(const CatalogEntry& a, const CatalogEntry& b) { return !key_less(a, b) && !key_less(b, a); }

void add_entry(proto::EntryBatch& batch, const CatalogEntry& e, std::uint64_t index = 0) {
  batch.add(e.label, e.size, e.shard, e.offset, e.path, index);
}

std::vector<std::uint8_t> encode_u64s(std::span<const std::uint64_t> values) {
  std::vector<std::uint8_t> out(values.size() * sizeof(std::uint64_t));
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

Result<std::vector<std::uint64_t>> decode_u64s(const std::vector<std::uint8_t>& bytes, std::size_t count, int from,
                                               std::string_view what) {
  if (bytes.size() != count * sizeof(std::uint64_t)) {
    return make_error(StatusCode::kCorrupt, "{} from daemon rank {}: {} bytes, expected {}", what, from, bytes.size(),
                      count * sizeof(std::uint64_t));
  }
  std::vector<std::uint64_t> values(count);
  if (count > 0) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// Decodes what rank `from` sent; for shard formats also checks the shard indices.
Result<proto::EntryBatch> decode_batch(const std::vector<std::uint8_t>& bytes, int from, std::size_t shard_count) {
  proto::EntryBatch batch;
  const std::string error = proto::decode_entry_batch(bytes, fmt::format("daemon rank {}", from), batch);
  if (!error.empty()) return make_error(StatusCode::kCorrupt, "{}", error);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (shard_count > 0 && batch.shards[i] >= shard_count) {
      return make_error(StatusCode::kCorrupt, "catalog entries from daemon rank {}: entry {} names shard {} of {}", from,
                        i, batch.shards[i], shard_count);
    }
  }
  return batch;
}

void append_entries(const proto::EntryBatch& batch, std::vector<CatalogEntry>& out, std::vector<std::uint64_t>* index) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    CatalogEntry e;
    e.label = batch.labels[i];
    e.size = batch.sizes[i];
    e.shard = batch.shards[i];
    e.offset = batch.offsets[i];
    e.path.assign(batch.paths, at, batch.path_bytes[i]);
    at += batch.path_bytes[i];
    out.push_back(std::move(e));
    if (index != nullptr) index->push_back(batch.index[i]);
  }
}

// Shard formats: the canonical shard table, the shards that hold samples in bytewise order,
// the same on every rank; the entries' shard indices are remapped to it. A shard listed by
// two ranks (or twice) is the same error as in the global catalog.
Status share_shard_table(ScanResult& mine, Collectives& group, CatalogTables& tables) {
  std::vector<bool> used(mine.shards.size(), false);
  Status scanned;
  for (const CatalogEntry& e : mine.entries) {
    if (e.shard >= mine.shards.size()) {
      scanned = make_error(StatusCode::kInternal, "a scan names shard {} of {}", e.shard, mine.shards.size());
      break;
    }
    used[e.shard] = true;
  }
  SHARDMIX_RETURN_IF_ERROR(agree(group, scanned, "listing the shards"));
  proto::EntryBatch names;
  for (std::size_t i = 0; i < mine.shards.size(); ++i) {
    if (used[i]) names.add(0, 0, 0, 0, mine.shards[i]);
  }
  SHARDMIX_ASSIGN_OR_RETURN(RankBytes gathered, group.allgather(proto::encode_entry_batch(names)));
  std::vector<CatalogEntry> all;
  for (int r = 0; r < group.size(); ++r) {
    SHARDMIX_ASSIGN_OR_RETURN(proto::EntryBatch batch, decode_batch(gathered[static_cast<std::size_t>(r)], r, 0));
    append_entries(batch, all, nullptr);
  }
  tables.shards.reserve(all.size());
  for (CatalogEntry& e : all) tables.shards.push_back(std::move(e.path));
  std::sort(tables.shards.begin(), tables.shards.end());
  if (auto dup = std::adjacent_find(tables.shards.begin(), tables.shards.end()); dup != tables.shards.end()) {
    return make_error(StatusCode::kInvalidArgument, "duplicate shard '{}' in the dataset", *dup);
  }
  for (CatalogEntry& e : mine.entries) {
    const auto it = std::lower_bound(tables.shards.begin(), tables.shards.end(), mine.shards[e.shard]);
    e.shard = static_cast<std::uint32_t>(it - tables.shards.begin());
  }
  return Status::ok_status();
}

// Whole-file formats: every rank lists the classes itself; they must agree (as merge_scans
// checks), compared by a digest instead of allgathering every rank's list.
Status check_class_lists(const DatasetConfig& dataset, const ScanResult& mine, Collectives& group,
                         CatalogTables& tables) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (const std::string& name : mine.class_names) {
    const auto length = static_cast<std::uint64_t>(name.size());
    XXH64_update(state, &length, sizeof length);
    XXH64_update(state, name.data(), name.size());
  }
  const std::uint64_t mine_digest[2] = {XXH64_digest(state), mine.class_names.size()};
  XXH64_freeState(state);
  SHARDMIX_ASSIGN_OR_RETURN(RankBytes gathered, group.allgather(encode_u64s(mine_digest)));
  std::vector<std::vector<std::uint64_t>> digests;
  for (int r = 0; r < group.size(); ++r) {
    SHARDMIX_ASSIGN_OR_RETURN(auto d, decode_u64s(gathered[static_cast<std::size_t>(r)], 2, r, "class list digest"));
    digests.push_back(std::move(d));
  }
  for (int r = 1; r < group.size(); ++r) {
    if (digests[static_cast<std::size_t>(r)] != digests[0]) {
      return make_error(StatusCode::kInvalidArgument,
                        "ranks 0 and {} found different classes under dataset.path '{}' ({} vs {} classes); did the "
                        "dataset change during the scan?",
                        r, dataset.path, digests[0][1], digests[static_cast<std::size_t>(r)][1]);
    }
  }
  tables.class_names = mine.class_names;
  return Status::ok_status();
}

// P - 1 keys that cut the sorted union of every rank's regular sample into P equal parts.
Result<std::vector<CatalogEntry>> choose_splitters(const std::vector<CatalogEntry>& sorted, Collectives& group,
                                                   std::size_t shard_count) {
  proto::EntryBatch sample;
  const std::size_t n = sorted.size();
  const std::size_t k = std::min(n, kSplitterSamplesPerRank);
  for (std::size_t j = 0; j < k; ++j) add_entry(sample, sorted[(2 * j + 1) * n / (2 * k)]);
  SHARDMIX_ASSIGN_OR_RETURN(RankBytes gathered, group.allgather(proto::encode_entry_batch(sample)));
  std::vector<CatalogEntry> keys;
  for (int r = 0; r < group.size(); ++r) {
    SHARDMIX_ASSIGN_OR_RETURN(proto::EntryBatch batch,
                              decode_batch(gathered[static_cast<std::size_t>(r)], r, shard_count));
    append_entries(batch, keys, nullptr);
  }
  std::sort(keys.begin(), keys.end(), key_less);
  std::vector<CatalogEntry> splitters;
  if (keys.empty()) return splitters;
  const auto p = static_cast<std::size_t>(group.size());
  for (std::size_t j = 1; j < p; ++j) splitters.push_back(keys[j * keys.size() / p]);
  return splitters;
}

// The checks merge_scans makes, on one rank's sorted slice: equal keys (they meet on one
// rank) and dataset.max_sample_bytes.
Status check_slice(const DatasetConfig& dataset, const std::vector<CatalogEntry>& entries,
                   const std::vector<std::string>& shards) {
  const bool sharded = !shards.empty();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const CatalogEntry& e = entries[i];
    if (i > 0 && key_equal(entries[i - 1], e)) {
      if (sharded) {
        return make_error(StatusCode::kInvalidArgument, "two samples at offset {} of shard '{}'", e.offset,
                          shards[e.shard]);
      }
      return make_error(StatusCode::kInvalidArgument, "duplicate sample path '{}' in the dataset", e.path);
    }
    if (e.size > dataset.max_sample_bytes) {
      return sample_too_large_error(dataset, sharded ? shard_sample_location(shards[e.shard], e.offset) : e.path,
                                    e.size);
    }
  }
  return Status::ok_status();
}

}  // namespace

Result<CatalogSlice> sort_scans(const DatasetConfig& dataset, ScanResult mine, Collectives& group) {
  const bool sharded = is_shard_format(dataset.format);
  const auto ranks = static_cast<std::size_t>(group.size());
  CatalogSlice slice;
  CatalogTables& tables = slice.tables;
  // Every rank sees the same gathered bytes, so these fail on every rank alike.
  SHARDMIX_RETURN_IF_ERROR(sharded ? share_shard_table(mine, group, tables)
                                   : check_class_lists(dataset, mine, group, tables));
  std::vector<CatalogEntry>& local = mine.entries;
  std::sort(local.begin(), local.end(), key_less);
  SHARDMIX_ASSIGN_OR_RETURN(std::vector<CatalogEntry> splitters, choose_splitters(local, group, tables.shards.size()));

  // Each entry to the rank of its key range: entries equal to a splitter go below it, so
  // equal keys always meet on one rank.
  std::vector<proto::EntryBatch> buckets(ranks);
  for (const CatalogEntry& e : local) {
    const auto range = std::lower_bound(splitters.begin(), splitters.end(), e, key_less) - splitters.begin();
    add_entry(buckets[static_cast<std::size_t>(range)], e);
  }
  local = {};
  RankBytes outgoing(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    outgoing[r] = proto::encode_entry_batch(buckets[r]);
    buckets[r] = {};
  }
  SHARDMIX_ASSIGN_OR_RETURN(RankBytes incoming, group.alltoall(std::move(outgoing)));
  Status received;
  for (int r = 0; r < group.size() && received.ok(); ++r) {
    auto batch = decode_batch(incoming[static_cast<std::size_t>(r)], r, tables.shards.size());
    if (!batch.ok()) {
      received = batch.status();
    } else {
      append_entries(*batch, slice.entries, nullptr);
    }
    incoming[static_cast<std::size_t>(r)] = {};
  }
  if (received.ok()) {
    std::sort(slice.entries.begin(), slice.entries.end(), key_less);
    received = check_slice(dataset, slice.entries, tables.shards);
  }
  // A failure on one rank is every rank's, before anyone waits in the next collective.
  SHARDMIX_RETURN_IF_ERROR(agree(group, received, "sorting the catalog"));

  // Counts give each rank its first id; the labels held give shard formats their classes.
  const std::uint64_t mine_counts[3] = {slice.entries.size(), mine.invalid_samples, mine.invalid_shards};
  SHARDMIX_ASSIGN_OR_RETURN(RankBytes counts, group.allgather(encode_u64s(mine_counts)));
  for (int r = 0; r < group.size(); ++r) {
    SHARDMIX_ASSIGN_OR_RETURN(auto c, decode_u64s(counts[static_cast<std::size_t>(r)], 3, r, "catalog counts"));
    if (r < group.rank()) slice.first += c[0];
    tables.samples += c[0];
    tables.invalid_samples += c[1];
    tables.invalid_shards += c[2];
  }
  if (tables.samples == 0) return empty_dataset_error(dataset, tables.invalid_samples, tables.invalid_shards);
  if (tables.samples > std::numeric_limits<SampleId>::max()) {
    return make_error(StatusCode::kResourceExhausted, "{} samples do not fit 32-bit sample ids", tables.samples);
  }
  if (sharded) {
    // A slice is a key range, so it holds few distinct labels: O(P + classes) in all.
    std::vector<std::uint64_t> labels;
    for (const CatalogEntry& e : slice.entries) {
      if (labels.empty() || labels.back() != static_cast<std::uint64_t>(e.label)) labels.push_back(e.label);
    }
    SHARDMIX_ASSIGN_OR_RETURN(RankBytes gathered, group.allgather(encode_u64s(labels)));
    std::set<std::uint64_t> all;
    for (int r = 0; r < group.size(); ++r) {
      const auto& bytes = gathered[static_cast<std::size_t>(r)];
      SHARDMIX_ASSIGN_OR_RETURN(auto theirs, decode_u64s(bytes, bytes.size() / sizeof(std::uint64_t), r, "labels"));
      all.insert(theirs.begin(), theirs.end());
    }
    for (std::uint64_t label : all) tables.class_names.push_back(std::to_string(label));
  }
  return slice;
}

Result<std::vector<SampleId>> class_runs(const CatalogSlice& slice, Collectives& group) {
  // (id, label) of every label change in the slice, its first entry included: a run may
  // begin on one rank and go on over the next ones.
  std::vector<std::uint64_t> starts;
  for (std::size_t i = 0; i < slice.entries.size(); ++i) {
    if (i == 0 || slice.entries[i].label != slice.entries[i - 1].label) {
      starts.push_back(slice.first + i);
      starts.push_back(static_cast<std::uint64_t>(slice.entries[i].label));
    }
  }
  SHARDMIX_ASSIGN_OR_RETURN(RankBytes gathered, group.allgather(encode_u64s(starts)));
  std::vector<SampleId> runs;
  std::uint64_t last_label = 0;
  for (int r = 0; r < group.size(); ++r) {
    const auto& bytes = gathered[static_cast<std::size_t>(r)];
    const std::size_t count = bytes.size() / sizeof(std::uint64_t);
    if (count % 2 != 0) {
      return make_error(StatusCode::kCorrupt, "class runs from daemon rank {}: {} values, not (id, label) pairs", r,
                        count);
    }
    SHARDMIX_ASSIGN_OR_RETURN(auto theirs, decode_u64s(bytes, count, r, "class runs"));
    for (std::size_t k = 0; k < theirs.size(); k += 2) {
      if (!runs.empty() && theirs[k + 1] == last_label) continue;  // the previous rank's run goes on
      if ((!runs.empty() && theirs[k] <= runs.back()) || theirs[k] >= slice.tables.samples ||
          (!runs.empty() && theirs[k + 1] < last_label)) {
        return make_error(StatusCode::kInternal,
                          "class runs from daemon rank {}: a run of label {} at id {} out of the canonical order",
                          r, theirs[k + 1], theirs[k]);
      }
      runs.push_back(static_cast<SampleId>(theirs[k]));
      last_label = theirs[k + 1];
    }
  }
  return runs;
}

Result<OwnerEntries> route_to_owners(CatalogSlice slice, const Ownership& ownership, Collectives& group) {
  const auto ranks = static_cast<std::size_t>(group.size());
  if (!ownership.is_spread() || ownership.nodes() != ranks) {
    // The same arguments on every rank: all return here.
    return make_error(StatusCode::kInvalidArgument, "route_to_owners: needs spread ownership over {} nodes, got {} "
                      "ownership over {}", ranks, ownership.is_spread() ? "spread" : "listed", ownership.nodes());
  }
  // Ids outside the ownership's range would send Ownership::locate's cycle walk astray.
  std::uint64_t owned_total = 0;
  for (std::uint32_t k = 0; k < ranks; ++k) owned_total += ownership.owned_count(k);
  Status ranged;
  if (owned_total != slice.tables.samples || slice.first + slice.entries.size() > owned_total) {
    ranged = make_error(StatusCode::kInternal, "route_to_owners: ids [{}, {}) of {} samples, ownership over {}",
                        slice.first, slice.first + slice.entries.size(), slice.tables.samples, owned_total);
  }
  SHARDMIX_RETURN_IF_ERROR(agree(group, ranged, "routing the catalog to its owners"));
  std::vector<proto::EntryBatch> buckets(ranks);
  for (std::size_t i = 0; i < slice.entries.size(); ++i) {
    const Ownership::Share share = ownership.locate(static_cast<SampleId>(slice.first + i));
    add_entry(buckets[share.node], slice.entries[i], share.index);
  }
  slice.entries = {};
  RankBytes outgoing(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    outgoing[r] = proto::encode_entry_batch(buckets[r]);
    buckets[r] = {};
  }
  SHARDMIX_ASSIGN_OR_RETURN(RankBytes incoming, group.alltoall(std::move(outgoing)));

  const auto me = static_cast<std::uint32_t>(group.rank());
  const std::uint64_t owned = ownership.owned_count(me);
  OwnerEntries out;
  out.tables = std::move(slice.tables);
  out.entries.resize(owned);
  std::vector<bool> filled(owned, false);
  std::uint64_t received = 0;
  Status placed;
  for (int r = 0; r < group.size() && placed.ok(); ++r) {
    auto batch = decode_batch(incoming[static_cast<std::size_t>(r)], r, out.tables.shards.size());
    if (!batch.ok()) {
      placed = batch.status();
      break;
    }
    std::vector<CatalogEntry> entries;
    std::vector<std::uint64_t> index;
    append_entries(*batch, entries, &index);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      if (index[i] >= owned || filled[index[i]]) {
        placed = make_error(StatusCode::kInternal, "daemon rank {} sent sample index {} of this node's {} twice or "
                                                   "out of range", r, index[i], owned);
        break;
      }
      filled[index[i]] = true;
      out.entries[index[i]] = std::move(entries[i]);
      ++received;
    }
    incoming[static_cast<std::size_t>(r)] = {};
  }
  if (placed.ok() && received != owned) {
    placed = make_error(StatusCode::kInternal, "node {} received {} of the {} samples of its share", me, received, owned);
  }
  SHARDMIX_RETURN_IF_ERROR(agree(group, placed, "routing the catalog to its owners"));
  out.ids.reserve(owned);
  for (std::uint64_t i = 0; i < owned; ++i) out.ids.push_back(ownership.owned_at(me, i));
  return out;
}

}  // namespace shardmix
