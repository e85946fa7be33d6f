// The sample directory: what a trainer scheduler needs to know about each sample of its
// plan (its bytes, label, owner node and where it sits in the owner's arena, or that it is
// cold), behind one interface so that where that knowledge lives is the node's business.
// Two implementations (docs/decisions/0055):
//  - GlobalDirectory: the whole catalog and placement on every node (O(N) per node). The
//    daemon's today: its start-up allgathers the catalog and computes every node's layout.
//  - ShardedDirectory: owner-side metadata. A node holds the entries of its own share only
//    (an OwnerShard: N/P entries) plus O(P) tables (the spread ownership, every node's cold
//    count); the entries of a plan's samples owned elsewhere are asked of their owners once
//    per plan, through a DirectoryExchange. Needs dataset.placement = spread, so that
//    "whose share is sample s, and at which index" is a function of s. The simulator runs it
//    (its exchange calls the owners' shards in-process); the daemons' exchange is a request
//    and an answer per owner per plan over the control plane (control/directory_exchange.h,
//    docs/decisions/0062).
// A plan is resolved once, before its first batch is staged, into a PlanDirectory that the
// scheduler reads by plan position; the global form keeps no copy, the sharded one holds
// one SampleInfo per planned sample (24 bytes) while the plan is alive, plus the storage
// location of each planned cold sample (its storage reader has no catalog to ask).
// Thread-safety: directories and shards are immutable after construction and safe to share;
// resolve() is const and may run on any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/catalog.h"
#include "common/distributed_catalog.h"
#include "common/status.h"
#include "common/ownership.h"
#include "common/placement.h"

namespace shardmix {

// One sample as a reader sees it.
struct SampleInfo {
  std::uint64_t bytes = 0;
  std::uint64_t arena_offset = kNotResident;  // in the owner's arena; kNotResident = cold
  std::uint32_t owner = 0;                    // whose share it is (for a cold sample: no one caches it)
  std::int32_t label = 0;

  bool resident() const { return arena_offset != kNotResident; }
};

// The storage locations of samples (a plan's cold ones, or a whole share's for the catalog a
// trainer asks for), for a node that holds no catalog to look them up in (owner-side
// metadata), as parallel lists: sample k is at index[k] (a plan position, or
// an index in an owner's request), in shard[k] at offset[k] for shard formats (the shard an
// index into the job's shard table) or at path(k) for whole-file formats (0 and 0 then).
// About 28 bytes a sample and its path; sizes and labels travel in the SampleInfo.
struct StorageLocations {
  std::vector<std::uint64_t> index;
  std::vector<std::uint32_t> shard;
  std::vector<std::uint64_t> offset;
  std::vector<std::uint64_t> path_end;  // path k is paths[path_end[k - 1], path_end[k])
  std::string paths;

  std::size_t size() const { return index.size(); }
  void add(std::uint64_t at, std::uint32_t in_shard, std::uint64_t at_offset, std::string_view path) {
    index.push_back(at);
    shard.push_back(in_shard);
    offset.push_back(at_offset);
    paths.append(path);
    path_end.push_back(paths.size());
  }
  std::string_view path(std::size_t k) const {
    const std::uint64_t begin = k == 0 ? 0 : path_end[k - 1];
    return std::string_view(paths).substr(begin, path_end[k] - begin);
  }
  std::uint64_t memory_bytes() const;
};

// Where one plan's samples are.
class PlanDirectory {
 public:
  virtual ~PlanDirectory() = default;
  // The sample at plan position `position`, whose id is `id` (plan.order[position]).
  virtual SampleInfo at(std::uint64_t position, SampleId id) const = 0;
  // The storage location of the cold sample at `position` (its size, label and file, as the
  // scan found them), when this node holds no catalog to look it up in (the sharded form);
  // none in the global form, whose storage readers read by id from the catalog, and none
  // for a sample resident on its owner (its location is known only there).
  virtual std::optional<CatalogEntry> storage_location(std::uint64_t /*position*/) const { return std::nullopt; }
  // Bytes this object holds (part of the scheduler's metadata figure).
  virtual std::uint64_t memory_bytes() const = 0;
};

// What one node holds of the job's metadata besides its schedulers' plans.
struct DirectoryBytes {
  std::uint64_t catalog = 0;    // sample entries (global: all N; sharded: the node's share)
  std::uint64_t placement = 0;  // ownership, residency and arena layout
};

class SampleDirectory {
 public:
  virtual ~SampleDirectory() = default;
  // Where the samples of `order` (one trainer's plan of one epoch) are. Fails only when an
  // owner could not be asked (the sharded form over a transport), naming it.
  virtual Result<std::unique_ptr<const PlanDirectory>> resolve(std::span<const SampleId> order) const = 0;
  // True when some node's share does not fit its arena (there are cold samples anywhere).
  virtual bool has_cold_samples() const = 0;
  virtual DirectoryBytes memory_bytes() const = 0;
};

// Every sample's entry on every node: the catalog and placement the daemon builds.
class GlobalDirectory : public SampleDirectory {
 public:
  // Both must outlive the directory (they are referenced).
  GlobalDirectory(const Catalog& catalog, const Placement& placement) : catalog_(catalog), placement_(placement) {}
  Result<std::unique_ptr<const PlanDirectory>> resolve(std::span<const SampleId> order) const override;
  bool has_cold_samples() const override { return placement_.total_cold_samples() > 0; }
  DirectoryBytes memory_bytes() const override;

  SampleInfo info(SampleId id) const {
    return SampleInfo{catalog_.sample_bytes(id), placement_.arena_offset[id], placement_.owner[id],
                      catalog_.label(id)};
  }

 private:
  const Catalog& catalog_;
  const Placement& placement_;
};

// One node's share under spread ownership, as its owner holds it: per local index i (the
// share's order, Ownership::owned_at), the sample's bytes, label, storage location (shard
// index and byte offset for shard formats, the path for whole-file formats) and arena
// offset (kNotResident when cold). The
// resident subset and arena layout are those make_placement computes for the same node
// (choose_resident over the share in ascending ids, offsets in ascending ids), so a
// tabulated spread placement and the shards agree byte for byte.
class OwnerShard {
 public:
  // Node `node`'s shard of `dataset` (the storage it scans: in the simulator the synthetic
  // catalog) for an arena of `capacity` bytes; `seed` is the placement's (shuffle.seed).
  static OwnerShard build(const Catalog& dataset, const Ownership& ownership, std::uint32_t node,
                          std::uint64_t capacity, std::uint64_t seed);
  // The same shard from the entries routed to node `node` at start-up (route_to_owners,
  // common/distributed_catalog.h), with no global catalog: equal to build() over the
  // catalog those entries came from (property-tested).
  static OwnerShard from_entries(const OwnerEntries& share, std::uint32_t node, std::uint64_t capacity,
                                 std::uint64_t seed);

  std::uint64_t size() const { return bytes_.size(); }
  // Every sample's bytes, by local index.
  const std::vector<std::uint64_t>& sizes() const { return bytes_; }
  SampleInfo at(std::uint64_t local) const {
    return SampleInfo{bytes_[local], arena_offset_[local], node_, labels_[local]};
  }
  std::uint64_t cold_samples() const { return cold_samples_; }
  std::uint64_t cached_bytes() const { return cached_bytes_; }
  std::uint64_t cached_samples() const { return size() - cold_samples_; }
  // The owner's arena: the resident samples laid out as make_placement lays them out.
  std::uint64_t arena_bytes() const { return arena_bytes_; }
  // Shard formats: the sample's shard (an index into the job's shard table) and byte offset.
  std::uint32_t shard(std::uint64_t local) const { return shard_.empty() ? 0 : shard_[local]; }
  std::uint64_t offset(std::uint64_t local) const { return offset_.empty() ? 0 : offset_[local]; }
  // Whole-file formats: the sample's path relative to the dataset (empty without files).
  std::string_view path(std::uint64_t local) const {
    return path_offsets_.empty() ? std::string_view()
                                 : std::string_view(paths_).substr(path_offsets_[local],
                                                                   path_offsets_[local + 1] - path_offsets_[local]);
  }
  // Bytes the shard holds.
  std::uint64_t memory_bytes() const;

 private:
  std::uint32_t node_ = 0;
  std::vector<std::uint64_t> bytes_;
  std::vector<std::int32_t> labels_;
  std::vector<std::uint64_t> arena_offset_;
  std::vector<std::uint32_t> shard_;    // shard formats: the sample's shard (its path is in the shared file table)
  std::vector<std::uint64_t> offset_;   // shard formats: its byte offset there
  std::string paths_;                        // whole-file formats: the share's paths back to back
  std::vector<std::uint64_t> path_offsets_;  // size() + 1 entries, or none
  std::uint64_t cold_samples_ = 0;
  std::uint64_t cached_bytes_ = 0;
  std::uint64_t arena_bytes_ = 0;

  // One sample of the share as the builder takes it (`path` must outlive the build).
  struct ShareEntry {
    std::uint64_t local = 0;
    std::uint64_t size = 0;
    std::int32_t label = 0;
    std::uint32_t shard = 0;
    std::uint64_t offset = 0;
    std::string_view path;
  };
  template <typename EntryOf>
  static OwnerShard make(std::uint32_t node, std::uint64_t n, bool sharded, std::uint64_t capacity,
                         std::uint64_t seed, EntryOf&& entry_of);
};

// One owner's part of a plan: `local[i]` is an index in `owner`'s share; out[i] receives
// its entry (out.size() == local.size()), and `located`, when given, receives the storage
// location of every i whose sample is cold (of every i with every_location), with index i,
// in ascending i.
struct DescribeRequest {
  std::uint32_t owner = 0;
  std::span<const std::uint64_t> local;
  std::span<SampleInfo> out;
  StorageLocations* located = nullptr;
  bool every_location = false;
};

// How a node asks owners for the entries of samples they own. One call per plan, with one
// request per owner, so that a transport can ask every owner at once and wait once.
// Returns the first owner that could not answer (unreachable, dead, or an index outside its
// share), naming it; `out` is then unspecified.
class DirectoryExchange {
 public:
  virtual ~DirectoryExchange() = default;
  virtual Status describe(std::span<const DescribeRequest> requests) const = 0;
};

// An owner's answer from its shard: out[i] = shard.at(local[i]) and, with `located`, the
// locations of the cold ones (of all with `every_location`) appended with index i; or an
// error naming `asker` and the first index outside the share. Every exchange answers
// through it.
Status describe_from(const OwnerShard& shard, std::span<const std::uint64_t> local, std::span<SampleInfo> out,
                     std::string_view asker, StorageLocations* located = nullptr, bool every_location = false);

// The whole catalog, assembled on node `node` from every owner's share (its own from `own`,
// the others' through `exchange`, one request per owner for its whole share with every
// location): what a trainer that asks for sample paths gets under owner-side metadata
// (decision 0066). `files` is the node's file table (Catalog::of_share of the job's shard
// table and class names, no samples). Equal, byte for byte once serialized, to the global
// catalog of the same scan (property-tested). O(N) on this node while it runs; nothing is
// kept.
Result<Catalog> assemble_catalog(std::uint32_t node, const Ownership& ownership, const OwnerShard& own,
                                 const DirectoryExchange& exchange, const Catalog& files);

// An exchange inside one process: the owners' shards are at hand (the simulator's).
class InProcessExchange : public DirectoryExchange {
 public:
  explicit InProcessExchange(const std::vector<OwnerShard>& shards) : shards_(shards) {}
  Status describe(std::span<const DescribeRequest> requests) const override;

 private:
  const std::vector<OwnerShard>& shards_;
};

// Owner-side metadata for node `node`: its own shard, the spread ownership, the nodes' cold
// counts (O(P), an allgather in a daemon) and the shared file table's bytes (shard paths,
// O(files)); everything else comes through `exchange`, per plan.
class ShardedDirectory : public SampleDirectory {
 public:
  // All references must outlive the directory.
  ShardedDirectory(std::uint32_t node, const Ownership& ownership, const OwnerShard& own,
                   const DirectoryExchange& exchange, std::vector<std::uint64_t> cold_per_node,
                   std::uint64_t file_table_bytes);
  Result<std::unique_ptr<const PlanDirectory>> resolve(std::span<const SampleId> order) const override;
  bool has_cold_samples() const override { return any_cold_; }
  DirectoryBytes memory_bytes() const override;

 private:
  std::uint32_t node_;
  const Ownership& ownership_;
  const OwnerShard& own_;
  const DirectoryExchange& exchange_;
  std::vector<std::uint64_t> cold_per_node_;
  bool any_cold_ = false;
  std::uint64_t file_table_bytes_;
};

}  // namespace shardmix
