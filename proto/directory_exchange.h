// The per-plan directory exchange between daemons under owner-side metadata
// (common/sample_directory.h, docs/decisions/0062): a reader asks an owner for the entries of
// the samples of one plan that the owner holds, and the owner answers from its OwnerShard.
// One ask and one answer per (plan, owner), over the control plane
// (control/directory_exchange.h), never on the per-sample path.
//
// Layouts (little-endian, the field codec of proto/field_codec.h), version 1, each after
// the envelope magic u32 | version u16:
//   ask     "SMXA": request u64 | indices: count u32, then count x u64 (indices in the owner's share)
//   answer  "SMXR": request u64 | entries: count u32, then count x each of bytes u64,
//                   arena_offset u64, label i32 (parallel lists) | error: count u32, then
//                   that many bytes (empty when the owner answered)
// `request` is the asker's number for the ask, echoed so it can match answers to asks. An
// answer with an error carries no entries.
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
inline constexpr std::uint16_t kDirectoryExchangeVersion = 1;
// A plan's share on one owner fits a message under the control plane's 2 GiB limit.
inline constexpr std::uint64_t kMaxDirectoryEntries = 0x7fffffffull / 20;
inline constexpr std::uint64_t kMaxDirectoryErrorBytes = 4096;

struct DirectoryAsk {
  std::uint64_t request = 0;
  std::vector<std::uint64_t> indices;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request);
    visit("indices", counted(kMaxDirectoryEntries, m.indices));
  }
};

struct DirectoryAnswer {
  std::uint64_t request = 0;
  std::vector<std::uint64_t> bytes;
  std::vector<std::uint64_t> arena_offset;
  std::vector<std::int32_t> labels;
  std::string error;

  std::size_t size() const { return bytes.size(); }
  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request);
    visit("entries", counted(kMaxDirectoryEntries, m.bytes, m.arena_offset, m.labels));
    visit("error", counted(kMaxDirectoryErrorBytes, m.error));
  }
};

std::vector<std::uint8_t> encode_directory_ask(const DirectoryAsk& ask);
std::vector<std::uint8_t> encode_directory_answer(const DirectoryAnswer& answer);
// Empty string on success, else what is wrong and where, naming `from` (e.g. "daemon rank
// 3"). Checks: magic, version, field bounds, trailing bytes; for an answer also that no
// label is negative and that an answer with an error has no entries.
std::string decode_directory_ask(std::span<const std::uint8_t> bytes, std::string_view from, DirectoryAsk& out);
std::string decode_directory_answer(std::span<const std::uint8_t> bytes, std::string_view from, DirectoryAnswer& out);

}  // namespace shardmix::proto
