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

// The sharded form: one entry per plan position, filled from the owners once per plan.
class ResolvedPlanDirectory : public PlanDirectory {
 public:
  explicit ResolvedPlanDirectory(std::vector<SampleInfo> entries) : entries_(std::move(entries)) {}
  SampleInfo at(std::uint64_t position, SampleId /*id*/) const override { return entries_[position]; }
  std::uint64_t memory_bytes() const override { return sizeof(*this) + vector_bytes(entries_); }

 private:
  std::vector<SampleInfo> entries_;
};

}  // namespace

std::unique_ptr<const PlanDirectory> GlobalDirectory::resolve(std::span<const SampleId> /*order*/) const {
  return std::make_unique<GlobalPlanDirectory>(*this);
}

DirectoryBytes GlobalDirectory::memory_bytes() const {
  return DirectoryBytes{catalog_.memory_bytes(), placement_memory_bytes(placement_)};
}

// The shard of node `node` from its share's entries in share order: entry_of(local)
// gives (id, CatalogEntry) of local index `local`. Both builders below go through here, so
// a shard made from the global catalog and one made from routed entries are the same.
template <typename EntryOf>
OwnerShard OwnerShard::make(std::uint32_t node, std::uint64_t n, bool sharded, std::uint64_t capacity,
                            std::uint64_t seed, EntryOf&& entry_of) {
  OwnerShard shard;
  shard.node_ = node;
  // The residency choice and the arena layout go by ascending id (as make_placement's);
  // the entries are kept in share order (local index), which is how peers address them.
  std::vector<std::pair<SampleId, std::uint64_t>> by_id(n);  // (id, local index)
  shard.bytes_.resize(n);
  shard.labels_.resize(n);
  shard.arena_offset_.assign(n, kNotResident);
  if (sharded) {
    shard.shard_.resize(n);
    shard.offset_.resize(n);
  }
  // Whole-file formats: the share's paths, for loading and for cold reads (the owner's
  // answer names the file; decision 0061). None for a catalog without files.
  if (!sharded) {
    shard.path_offsets_.reserve(n + 1);
    shard.path_offsets_.push_back(0);
  }
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto [id, entry] = entry_of(i);
    by_id[i] = {id, i};
    shard.bytes_[i] = entry.size;
    shard.labels_[i] = entry.label;
    if (sharded) {
      shard.shard_[i] = entry.shard;
      shard.offset_[i] = entry.offset;
    } else {
      shard.paths_.append(entry.path);
      shard.path_offsets_.push_back(shard.paths_.size());
    }
  }
  if (shard.paths_.empty()) std::vector<std::uint64_t>().swap(shard.path_offsets_);  // a synthetic catalog: no files
  std::sort(by_id.begin(), by_id.end());
  std::vector<std::uint64_t> sizes(n);
  for (std::uint64_t j = 0; j < n; ++j) sizes[j] = shard.bytes_[by_id[j].second];
  const std::vector<std::uint64_t> resident = choose_resident_positions(sizes, capacity, seed, node);
  std::uint64_t arena = 0;
  for (std::uint64_t j : resident) {
    const std::uint64_t local = by_id[j].second;
    shard.arena_offset_[local] = arena;
    arena = align_to_arena(arena + sizes[j]);
    shard.cached_bytes_ += sizes[j];
  }
  shard.cold_samples_ = n - resident.size();
  return shard;
}

OwnerShard OwnerShard::build(const Catalog& dataset, const Ownership& ownership, std::uint32_t node,
                             std::uint64_t capacity, std::uint64_t seed) {
  CatalogEntry entry;
  return make(node, ownership.owned_count(node), dataset.sharded(), capacity, seed, [&](std::uint64_t local) {
    const SampleId id = ownership.owned_at(node, local);
    entry.size = dataset.sample_bytes(id);
    entry.label = dataset.label(id);
    entry.shard = dataset.shard(id);
    entry.offset = dataset.offset(id);
    entry.path.assign(dataset.sharded() ? std::string_view() : dataset.path(id));
    return std::pair<SampleId, const CatalogEntry&>(id, entry);
  });
}

OwnerShard OwnerShard::from_entries(const OwnerEntries& share, std::uint32_t node, std::uint64_t capacity,
                                    std::uint64_t seed) {
  return make(node, share.entries.size(), !share.tables.shards.empty(), capacity, seed, [&](std::uint64_t local) {
    return std::pair<SampleId, const CatalogEntry&>(share.ids[local], share.entries[local]);
  });
}

std::uint64_t OwnerShard::memory_bytes() const {
  return sizeof(*this) + vector_bytes(bytes_) + vector_bytes(labels_) + vector_bytes(arena_offset_) +
         vector_bytes(shard_) + vector_bytes(offset_) + paths_.capacity() + vector_bytes(path_offsets_);
}

void InProcessExchange::describe(std::uint32_t owner, std::span<const std::uint64_t> local,
                                 std::span<SampleInfo> out) const {
  const OwnerShard& shard = shards_[owner];
  for (std::size_t i = 0; i < local.size(); ++i) out[i] = shard.at(local[i]);
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

std::unique_ptr<const PlanDirectory> ShardedDirectory::resolve(std::span<const SampleId> order) const {
  std::vector<SampleInfo> entries(order.size());
  // Group the foreign samples by owner: one request per owner (a message or a read in a
  // daemon), the node's own straight from its shard.
  std::vector<Ownership::Share> where(order.size());
  for (std::size_t p = 0; p < order.size(); ++p) where[p] = ownership_.locate(order[p]);
  std::vector<std::uint32_t> by_owner(order.size());
  std::iota(by_owner.begin(), by_owner.end(), std::uint32_t{0});
  std::stable_sort(by_owner.begin(), by_owner.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return where[a].node < where[b].node; });
  std::vector<std::uint64_t> local;
  std::vector<SampleInfo> answer;
  for (std::size_t begin = 0; begin < by_owner.size();) {
    const std::uint32_t owner = where[by_owner[begin]].node;
    std::size_t end = begin;
    while (end < by_owner.size() && where[by_owner[end]].node == owner) ++end;
    if (owner == node_) {
      for (std::size_t i = begin; i < end; ++i) entries[by_owner[i]] = own_.at(where[by_owner[i]].index);
    } else {
      local.resize(end - begin);
      answer.resize(end - begin);
      for (std::size_t i = begin; i < end; ++i) local[i - begin] = where[by_owner[i]].index;
      exchange_.describe(owner, local, answer);
      for (std::size_t i = begin; i < end; ++i) entries[by_owner[i]] = answer[i - begin];
    }
    begin = end;
  }
  return std::make_unique<ResolvedPlanDirectory>(std::move(entries));
}

DirectoryBytes ShardedDirectory::memory_bytes() const {
  return DirectoryBytes{own_.memory_bytes() + file_table_bytes_,
                        ownership_.memory_bytes() + vector_bytes(cold_per_node_)};
}

}  // namespace shardmix
