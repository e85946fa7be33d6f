// The per-plan directory exchange between daemons under owner-side metadata
// (common/sample_directory.h, docs/decisions/0062): a reader asks an owner for the entries of
// the samples of one plan that the owner holds, and the owner answers from its OwnerShard.
// One ask and one answer per (plan, owner), over the control plane
// (control/directory_exchange.h), never on the per-sample path.
//
// Layouts (little-endian, the field codec of proto/field_codec.h), version 2, each after
// the envelope magic u32 | version u16:
//   ask     "SMXA": request u64 | flags u32 | indices: count u32, then count x u64 (indices
//                   in the owner's share)
//   answer  "SMXR": request u64 | entries: count u32, then count x each of bytes u64,
//                   arena_offset u64, label i32 (parallel lists) | every_entry bool |
//                   located: count u32, then count x each of entry u32, shard u32, offset
//                   u64, path_end u64 | located_paths: count u32, then that many bytes |
//                   error: count u32, then that many bytes (empty when the owner answered)
// `request` is the asker's number for the ask, echoed so it can match answers to asks. An
// answer with an error carries no entries. `located` is the storage location of entries in
// ascending entry order: of every cold one (arena_offset = kNotResident), since a reader of
// a cold sample under owner-side metadata has no catalog to look it up in; or, when the ask
// set kAskEveryLocation (every_entry), of every entry, for assembling the catalog a trainer
// asks for. Shard formats give the shard (an index into the job's shard table, which every
// node holds) and the byte offset; whole-file formats give the path,
// located_paths[previous path_end, path_end), and zeros for shard and offset. Version 2
// added flags, every_entry and the locations (decisions 0064, 0066).
// Thread-safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/field_codec.h"

namespace shardmix::proto {

inline constexpr std::uint32_t kDirectoryAskMagic = 0x41584d53;     // "SMXA" little-endian
inline constexpr std::uint32_t kDirectoryAnswerMagic = 0x52584d53;  // "SMXR" little-endian
inline constexpr std::uint16_t kDirectoryExchangeVersion = 2;
// A plan's share on one owner fits a message under the control plane's 2 GiB limit.
inline constexpr std::uint64_t kMaxDirectoryEntries = 0x7fffffffull / 20;
inline constexpr std::uint64_t kMaxDirectoryErrorBytes = 4096;
// The located entries' paths of one answer (whole-file formats), under the same 2 GiB limit.
inline constexpr std::uint64_t kMaxDirectoryPathBytes = 0x3fffffffull;
// The layout's magic value for a resident entry's arena_offset (kNotResident in
// common/placement.h, which proto/ does not include).
inline constexpr std::uint64_t kDirectoryNotResident = ~std::uint64_t{0};

// DirectoryAsk::flags: answer with every entry's storage location, not only the cold ones'.
inline constexpr std::uint32_t kAskEveryLocation = 1;

struct DirectoryAsk {
  std::uint64_t request = 0;
  std::uint32_t flags = 0;
  std::vector<std::uint64_t> indices;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request);
    visit("flags", m.flags);
    visit("indices", counted(kMaxDirectoryEntries, m.indices));
  }
};

struct DirectoryAnswer {
  std::uint64_t request = 0;
  std::vector<std::uint64_t> bytes;
  std::vector<std::uint64_t> arena_offset;
  std::vector<std::int32_t> labels;
  bool every_entry = false;                  // located holds every entry, not only the cold ones
  std::vector<std::uint32_t> located_entry;  // ascending indices into the entries above
  std::vector<std::uint32_t> located_shard;
  std::vector<std::uint64_t> located_offset;
  std::vector<std::uint64_t> located_path_end;
  std::string located_paths;
  std::string error;

  std::size_t size() const { return bytes.size(); }
  // Located entry k's path (whole-file formats; empty for shard formats).
  std::string_view located_path(std::size_t k) const {
    const std::uint64_t begin = k == 0 ? 0 : located_path_end[k - 1];
    return std::string_view(located_paths).substr(begin, located_path_end[k] - begin);
  }
  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request);
    visit("entries", counted(kMaxDirectoryEntries, m.bytes, m.arena_offset, m.labels));
    visit("every_entry", m.every_entry);
    visit("located", counted(kMaxDirectoryEntries, m.located_entry, m.located_shard, m.located_offset, m.located_path_end));
    visit("located_paths", counted(kMaxDirectoryPathBytes, m.located_paths));
    visit("error", counted(kMaxDirectoryErrorBytes, m.error));
  }
};

std::vector<std::uint8_t> encode_directory_ask(const DirectoryAsk& ask);
std::vector<std::uint8_t> encode_directory_answer(const DirectoryAnswer& answer);
// Empty string on success, else what is wrong and where, naming `from` (e.g. "daemon rank
// 3"). Checks: magic, version, field bounds, trailing bytes; for an ask that no unknown
// flag is set; for an answer also that no label is negative, that an answer with an error
// has no entries, and that the located list names exactly the cold entries (every entry
// with every_entry), in ascending order, with path ends ascending within located_paths.
std::string decode_directory_ask(std::span<const std::uint8_t> bytes, std::string_view from, DirectoryAsk& out);
std::string decode_directory_answer(std::span<const std::uint8_t> bytes, std::string_view from, DirectoryAnswer& out);

}  // namespace shardmix::proto
