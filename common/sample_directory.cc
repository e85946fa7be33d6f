#include "common/sample_directory.h"

#include <algorithm>
#include <numeric>

#include "common/metadata_footprint.h"

namespace shardmix {
namespace {

// The global form looks every sample up in the catalog and placement: nothing to hold.
class GlobalPlanDirectory : public PlanDirectory {
 public:
  explicit GlobalPlanDirectory(const GlobalDirectory& directory) : directory_(directory) {}
  SampleInfo at(std::uint64_t /*position*/, SampleId id) const override { return directory_.info(id); }
  std::uint64_t memory_bytes() const override { return sizeof(*this); }

 private:
  const GlobalDirectory& directory_;
};

// The sharded form: one entry per plan position, filled from the owners once per plan, and
// the cold positions' storage locations in ascending position.
class ResolvedPlanDirectory : public PlanDirectory {
 public:
  ResolvedPlanDirectory(std::vector<SampleInfo> entries, StorageLocations cold)
      : entries_(std::move(entries)), cold_(std::move(cold)) {}
  SampleInfo at(std::uint64_t position, SampleId /*id*/) const override { return entries_[position]; }
  std::optional<CatalogEntry> storage_location(std::uint64_t position) const override {
    auto it = std::lower_bound(cold_.index.begin(), cold_.index.end(), position);
    if (it == cold_.index.end() || *it != position) return std::nullopt;
    const auto k = static_cast<std::size_t>(it - cold_.index.begin());
    const SampleInfo& e = entries_[position];
    return CatalogEntry{std::string(cold_.path(k)), e.bytes, e.label, cold_.shard[k], cold_.offset[k]};
  }
  std::uint64_t memory_bytes() const override {
    return sizeof(*this) + vector_bytes(entries_) + cold_.memory_bytes();
  }

 private:
  std::vector<SampleInfo> entries_;
  StorageLocations cold_;
};

}  // namespace

Result<std::unique_ptr<const PlanDirectory>> GlobalDirectory::resolve(std::span<const SampleId> /*order*/) const {
  return std::unique_ptr<const PlanDirectory>(std::make_unique<GlobalPlanDirectory>(*this));
}

DirectoryBytes GlobalDirectory::memory_bytes() const {
  return DirectoryBytes{catalog_.memory_bytes(), placement_memory_bytes(placement_)};
}

// The shard of node `node` (n samples) from its share's entries, which entry_of(j) gives in
// ascending id order, each with its local index: the residency choice and the arena layout
// go by ascending id (as make_placement's), the entries are kept in share order (local
// index), which is how peers address them. Both builders below go through here, so a
// shard made from the global catalog and one made from routed entries are the same; the
// ascending order also reads the global catalog's arrays front to back.
template <typename EntryOf>
OwnerShard OwnerShard::make(std::uint32_t node, std::uint64_t n, bool sharded, std::uint64_t capacity,
                            std::uint64_t seed, EntryOf&& entry_of) {
  OwnerShard shard;
  shard.node_ = node;
  shard.bytes_.resize(n);
  shard.labels_.resize(n);
  shard.arena_offset_.assign(n, kNotResident);
  if (sharded) {
    shard.shard_.resize(n);
    shard.offset_.resize(n);
  }
  std::vector<std::uint64_t> sizes(n);   // by ascending id
  std::vector<std::uint64_t> local_of(n);
  std::vector<std::string_view> paths(sharded ? 0 : n);  // by local index
  for (std::uint64_t j = 0; j < n; ++j) {
    const ShareEntry e = entry_of(j);
    sizes[j] = e.size;
    local_of[j] = e.local;
    shard.bytes_[e.local] = e.size;
    shard.labels_[e.local] = e.label;
    if (sharded) {
      shard.shard_[e.local] = e.shard;
      shard.offset_[e.local] = e.offset;
    } else {
      paths[e.local] = e.path;
    }
  }
  // Whole-file formats: the share's paths, for loading and for cold reads (the owner's
  // answer names the file; decision 0061). None for a catalog without files.
  if (std::any_of(paths.begin(), paths.end(), [](std::string_view p) { return !p.empty(); })) {
    shard.path_offsets_.reserve(n + 1);
    shard.path_offsets_.push_back(0);
    for (std::string_view p : paths) {
      shard.paths_.append(p);
      shard.path_offsets_.push_back(shard.paths_.size());
    }
  }
  const std::vector<std::uint64_t> resident = choose_resident_positions(sizes, capacity, seed, node);
  std::uint64_t arena = 0;
  for (std::uint64_t j : resident) {
    shard.arena_offset_[local_of[j]] = arena;
    arena = align_to_arena(arena + sizes[j]);
    shard.cached_bytes_ += sizes[j];
  }
  shard.cold_samples_ = n - resident.size();
  shard.arena_bytes_ = arena;
  return shard;
}

namespace {
// A share's (id, local index) pairs in ascending id order.
std::vector<std::pair<SampleId, std::uint64_t>> by_ascending_id(std::uint64_t n, auto&& id_of) {
  std::vector<std::pair<SampleId, std::uint64_t>> by_id(n);
  for (std::uint64_t i = 0; i < n; ++i) by_id[i] = {id_of(i), i};
  std::sort(by_id.begin(), by_id.end());
  return by_id;
}
}  // namespace

OwnerShard OwnerShard::build(const Catalog& dataset, const Ownership& ownership, std::uint32_t node,
                             std::uint64_t capacity, std::uint64_t seed) {
  const std::uint64_t n = ownership.owned_count(node);
  const auto by_id = by_ascending_id(n, [&](std::uint64_t i) { return ownership.owned_at(node, i); });
  return make(node, n, dataset.sharded(), capacity, seed, [&](std::uint64_t j) {
    const auto [id, local] = by_id[j];
    return ShareEntry{local, dataset.sample_bytes(id), dataset.label(id), dataset.shard(id), dataset.offset(id),
                      dataset.sharded() ? std::string_view() : dataset.path(id)};
  });
}

OwnerShard OwnerShard::from_entries(const OwnerEntries& share, std::uint32_t node, std::uint64_t capacity,
                                    std::uint64_t seed) {
  const std::uint64_t n = share.entries.size();
  const auto by_id = by_ascending_id(n, [&](std::uint64_t i) { return share.ids[i]; });
  return make(node, n, !share.tables.shards.empty(), capacity, seed, [&](std::uint64_t j) {
    const CatalogEntry& e = share.entries[by_id[j].second];
    return ShareEntry{by_id[j].second, e.size, e.label, e.shard, e.offset, e.path};
  });
}

std::uint64_t OwnerShard::memory_bytes() const {
  return sizeof(*this) + vector_bytes(bytes_) + vector_bytes(labels_) + vector_bytes(arena_offset_) +
         vector_bytes(shard_) + vector_bytes(offset_) + paths_.capacity() + vector_bytes(path_offsets_);
}

std::uint64_t StorageLocations::memory_bytes() const {
  return vector_bytes(index) + vector_bytes(shard) + vector_bytes(offset) + vector_bytes(path_end) + paths.capacity();
}

Status describe_from(const OwnerShard& shard, std::span<const std::uint64_t> local, std::span<SampleInfo> out,
                     std::string_view asker, StorageLocations* located, bool every_location) {
  if (out.size() != local.size()) {
    return make_error(StatusCode::kInternal, "{} asked for {} entries with room for {}", asker, local.size(),
                      out.size());
  }
  for (std::size_t i = 0; i < local.size(); ++i) {
    if (local[i] >= shard.size()) {
      return make_error(StatusCode::kInvalidArgument,
                        "{} asked for index {} (request entry {}) of a share of {} samples", asker, local[i], i,
                        shard.size());
    }
    out[i] = shard.at(local[i]);
    if (located != nullptr && (every_location || !out[i].resident())) {
      located->add(i, shard.shard(local[i]), shard.offset(local[i]), shard.path(local[i]));
    }
  }
  return Status::ok_status();
}

Status InProcessExchange::describe(std::span<const DescribeRequest> requests) const {
  for (const DescribeRequest& r : requests) {
    if (r.owner >= shards_.size()) {
      return make_error(StatusCode::kInternal, "no owner {} among {} nodes", r.owner, shards_.size());
    }
    Status s = describe_from(shards_[r.owner], r.local, r.out, "an in-process reader", r.located, r.every_location);
    if (!s.ok()) return s.with_context(fmt::format("owner node {}", r.owner));
  }
  return Status::ok_status();
}

ShardedDirectory::ShardedDirectory(std::uint32_t node, const Ownership& ownership, const OwnerShard& own,
                                   const DirectoryExchange& exchange, std::vector<std::uint64_t> cold_per_node,
                                   std::uint64_t file_table_bytes)
    : node_(node),
      ownership_(ownership),
      own_(own),
      exchange_(exchange),
      cold_per_node_(std::move(cold_per_node)),
      file_table_bytes_(file_table_bytes) {
  any_cold_ = std::any_of(cold_per_node_.begin(), cold_per_node_.end(), [](std::uint64_t c) { return c > 0; });
}

Result<std::unique_ptr<const PlanDirectory>> ShardedDirectory::resolve(std::span<const SampleId> order) const {
  std::vector<SampleInfo> entries(order.size());
  // Group the foreign samples by owner: one request per owner (a message in a daemon),
  // all asked at once; the node's own entries come straight from its shard.
  std::vector<Ownership::Share> where(order.size());
  for (std::size_t p = 0; p < order.size(); ++p) where[p] = ownership_.locate(order[p]);
  std::vector<std::uint32_t> by_owner(order.size());
  std::iota(by_owner.begin(), by_owner.end(), std::uint32_t{0});
  std::stable_sort(by_owner.begin(), by_owner.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return where[a].node < where[b].node; });
  // by_owner's order throughout: local[j] and answer[j] belong to plan position by_owner[j].
  std::vector<std::uint64_t> local(order.size());
  std::vector<SampleInfo> answer(order.size());
  for (std::size_t j = 0; j < by_owner.size(); ++j) local[j] = where[by_owner[j]].index;
  // Cold samples' locations come with their entries, one list per owner (indices in the
  // owner's request), only when some node has cold samples.
  std::vector<DescribeRequest> requests;
  std::vector<std::size_t> request_begin;  // requests[k] covers by_owner[request_begin[k]...]
  std::vector<StorageLocations> cold;
  StorageLocations own_cold;
  std::size_t own_begin = 0;
  for (std::size_t begin = 0; begin < by_owner.size();) {
    const std::uint32_t owner = where[by_owner[begin]].node;
    std::size_t end = begin;
    while (end < by_owner.size() && where[by_owner[end]].node == owner) ++end;
    const std::span<const std::uint64_t> asked(local.data() + begin, end - begin);
    const std::span<SampleInfo> out(answer.data() + begin, end - begin);
    if (owner == node_) {
      Status s = describe_from(own_, asked, out, "this node", any_cold_ ? &own_cold : nullptr);
      if (!s.ok()) return s;
      own_begin = begin;
    } else {
      requests.push_back(DescribeRequest{owner, asked, out});
      request_begin.push_back(begin);
    }
    begin = end;
  }
  if (any_cold_) {
    cold.resize(requests.size());
    for (std::size_t k = 0; k < requests.size(); ++k) requests[k].located = &cold[k];
  }
  if (!requests.empty()) {
    Status s = exchange_.describe(requests);
    if (!s.ok()) return s.with_context(fmt::format("resolving a plan of {} samples on node {}", order.size(), node_));
  }
  for (std::size_t j = 0; j < by_owner.size(); ++j) entries[by_owner[j]] = answer[j];
  // Each list's indices, from its request's numbering to plan positions, then all of them
  // in ascending position (the scheduler looks them up by position).
  std::vector<std::pair<std::uint64_t, std::pair<const StorageLocations*, std::size_t>>> by_position;
  auto take = [&](const StorageLocations& of_owner, std::size_t begin) {
    for (std::size_t k = 0; k < of_owner.size(); ++k) {
      by_position.push_back({by_owner[begin + of_owner.index[k]], {&of_owner, k}});
    }
  };
  for (std::size_t k = 0; k < cold.size(); ++k) take(cold[k], request_begin[k]);
  take(own_cold, own_begin);
  std::sort(by_position.begin(), by_position.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  StorageLocations located;
  located.index.reserve(by_position.size());
  located.shard.reserve(by_position.size());
  located.offset.reserve(by_position.size());
  located.path_end.reserve(by_position.size());
  std::size_t path_bytes = 0;
  for (const auto& list : cold) path_bytes += list.paths.size();
  located.paths.reserve(path_bytes + own_cold.paths.size());
  for (const auto& [position, from] : by_position) {
    const auto& [list, k] = from;
    located.add(position, list->shard[k], list->offset[k], list->path(k));
  }
  return std::unique_ptr<const PlanDirectory>(
      std::make_unique<ResolvedPlanDirectory>(std::move(entries), std::move(located)));
}

Result<Catalog> assemble_catalog(std::uint32_t node, const Ownership& ownership, const OwnerShard& own,
                                 const DirectoryExchange& exchange, const Catalog& files) {
  const std::uint32_t nodes = ownership.nodes();
  std::vector<std::vector<std::uint64_t>> local(nodes);
  std::vector<std::vector<SampleInfo>> info(nodes);
  std::vector<StorageLocations> where(nodes);
  std::vector<DescribeRequest> requests;
  for (std::uint32_t k = 0; k < nodes; ++k) {
    local[k].resize(ownership.owned_count(k));
    std::iota(local[k].begin(), local[k].end(), std::uint64_t{0});
    info[k].resize(local[k].size());
    if (k == node) {
      SHARDMIX_RETURN_IF_ERROR(describe_from(own, local[k], info[k], "this node", &where[k], true));
    } else if (!local[k].empty()) {
      requests.push_back(DescribeRequest{k, local[k], info[k], &where[k], true});
    }
  }
  if (!requests.empty()) {
    Status s = exchange.describe(requests);
    if (!s.ok()) return s.with_context(fmt::format("assembling the catalog on node {}", node));
  }
  std::uint64_t samples = 0;
  for (std::uint32_t k = 0; k < nodes; ++k) samples += info[k].size();
  std::vector<CatalogEntry> entries(samples);
  for (std::uint32_t k = 0; k < nodes; ++k) {
    if (where[k].size() != info[k].size()) {
      return make_error(StatusCode::kInternal, "owner node {} located {} of its {} samples", k, where[k].size(),
                        info[k].size());
    }
    for (std::size_t i = 0; i < info[k].size(); ++i) {
      const SampleId id = ownership.owned_at(k, i);
      entries[id] = CatalogEntry{std::string(where[k].path(i)), info[k][i].bytes, info[k][i].label, where[k].shard[i],
                                 where[k].offset[i]};
    }
    local[k] = {};
    info[k] = {};
    where[k] = {};
  }
  std::vector<std::string> shards;
  if (files.sharded()) {
    shards.reserve(files.file_count());
    for (std::size_t f = 0; f < files.file_count(); ++f) shards.emplace_back(files.file_path(f));
  }
  Catalog catalog = Catalog::of_share(shards, entries, files.class_names());
  catalog.set_invalid_counts(files.invalid_samples(), files.invalid_shards());
  return catalog;
}

DirectoryBytes ShardedDirectory::memory_bytes() const {
  return DirectoryBytes{own_.memory_bytes() + file_table_bytes_,
                        ownership_.memory_bytes() + vector_bytes(cold_per_node_)};
}

}  // namespace shardmix
