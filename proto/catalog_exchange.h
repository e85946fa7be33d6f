// Scanned catalog entries as the daemons exchange them at start-up under owner-side
// metadata (common/distributed_catalog.h, docs/decisions/0061): a key sample for the sort's
// splitters, the entries of one key range, and the entries of one owner's share.
//
// Layout (little-endian, the field codec of proto/field_codec.h), version 1:
//   magic u32 "SMXE" | version u16 | pad u16
//   entries: count u32, then count x each of label i32, size u64, shard u32, offset u64,
//            path_bytes u32, index u64 (parallel lists)
//   paths:   count u32, then that many bytes: every entry's path back to back
// `shard` indexes the job's canonical shard table (shard formats; 0 otherwise), `path` is
// the whole-file formats' relative path (empty for shard formats), `index` is what the
// receiver needs besides the entry (the sample's index in the owner's share when routing
// to owners; 0 otherwise).
// Thread-safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/field_codec.h"

namespace shardmix::proto {

inline constexpr std::uint32_t kEntryBatchMagic = 0x45584d53;  // "SMXE" little-endian
inline constexpr std::uint16_t kEntryBatchVersion = 1;
// Bounds a decoder accepts: ids are 32 bits, and a batch's paths fit the control plane's
// 2 GiB message limit.
inline constexpr std::uint64_t kMaxBatchEntries = 0xffffffffull;
inline constexpr std::uint64_t kMaxBatchPathBytes = 0x7fffffffull;

struct EntryBatch {
  std::vector<std::int32_t> labels;
  std::vector<std::uint64_t> sizes;
  std::vector<std::uint32_t> shards;
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint32_t> path_bytes;
  std::vector<std::uint64_t> index;
  std::string paths;

  std::size_t size() const { return labels.size(); }
  void add(std::int32_t label, std::uint64_t size, std::uint32_t shard, std::uint64_t offset, std::string_view path,
           std::uint64_t at = 0) {
    labels.push_back(label), sizes.push_back(size), shards.push_back(shard), offsets.push_back(offset);
    path_bytes.push_back(static_cast<std::uint32_t>(path.size())), index.push_back(at);
    paths.append(path);
  }

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("pad", ZeroPad<std::uint16_t>{});
    visit("entries", counted(kMaxBatchEntries, m.labels, m.sizes, m.shards, m.offsets, m.path_bytes, m.index));
    visit("paths", counted(kMaxBatchPathBytes, m.paths));
  }
};

std::vector<std::uint8_t> encode_entry_batch(const EntryBatch& batch);
// Empty string on success, else what is wrong and where, naming `from` (e.g. "daemon rank
// 3"). Checks: magic, version, field bounds, that the path lengths add up to the paths'
// bytes, and that no label is negative.
std::string decode_entry_batch(std::span<const std::uint8_t> bytes, std::string_view from, EntryBatch& out);

}  // namespace shardmix::proto
