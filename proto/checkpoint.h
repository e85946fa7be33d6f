// The checkpoint blob: a trainer's position in an epoch, as Client::checkpoint() writes
// it and the daemon reads it back (docs/decisions/0022-checkpoint-and-resume.md).
//
// Layout (little-endian, like proto/wire.h), version 1:
//   magic u32 "SMXK" | format u16 | flags u16 (bit 0: taken in a re-dealt epoch)
//   plan_digest u64 | num_samples u64 | seed u64
//   nodes u32 | trainers_per_node u32 | batch_size u32 | drop_last u8 | pad u8[3] | window u32
//   rank u32 | world_size u32
//   epoch u64 | batches_consumed u64 | samples_consumed u64
//   early_count u32 | early u64[early_count] | late_count u32 | late u64[late_count]
//   checksum u64 (FNV-1a 64 of every byte before it)
// Positions are indices into the trainer's planned order for the epoch. The samples
// delivered are planned positions [0, samples_consumed) minus `late`, plus `early`
// (shuffle.window lets a later sample overtake a slow one; both lists hold at most W
// positions, sorted ascending, and |early| == |late|).
// plan_digest identifies everything the plan depends on (catalog, seed, exchange
// fraction, min_entropy, placement policy, job shape; for a re-dealt epoch also the
// checkpoints it was re-dealt from): the daemon computes it and sends it in the Welcome;
// a blob whose digest differs from the daemon's is refused with an error that names the
// fields that differ. The readable fields are there for that message and for re-dealing.
// Thread-safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace shardmix::proto {

inline constexpr std::uint32_t kCheckpointMagic = 0x4b584d53;  // "SMXK" little-endian
inline constexpr std::uint16_t kCheckpointFormat = 1;
inline constexpr std::uint16_t kCheckpointRedealt = 1;  // flags bit 0
// No list may be longer than this (a window larger than this is refused by the config).
inline constexpr std::uint32_t kMaxCheckpointExceptions = 1u << 20;
// Largest encoded blob: the fixed fields plus both lists at their limit.
inline constexpr std::uint64_t kMaxCheckpointBytes = 120 + 2ull * 8 * kMaxCheckpointExceptions;

struct Checkpoint {
  std::uint16_t flags = 0;
  std::uint64_t plan_digest = 0;
  std::uint64_t num_samples = 0;
  std::uint64_t seed = 0;
  std::uint32_t nodes = 0;
  std::uint32_t trainers_per_node = 0;
  std::uint32_t batch_size = 0;
  bool drop_last = false;
  std::uint32_t window = 0;
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
  std::uint64_t epoch = 0;
  std::uint64_t batches_consumed = 0;
  std::uint64_t samples_consumed = 0;
  std::vector<std::uint64_t> early;  // delivered, planned at or after samples_consumed
  std::vector<std::uint64_t> late;   // not delivered, planned before samples_consumed

  bool redealt() const { return (flags & kCheckpointRedealt) != 0; }
  bool operator==(const Checkpoint&) const = default;
};

std::vector<std::uint8_t> encode_checkpoint(const Checkpoint& c);
// Empty string on success, else what is wrong and where ("checkpoint: field 'late' needs
// 8 bytes at offset 96, blob has 3"). Checks: magic, format, checksum, list lengths and
// order (strictly ascending), |early| == |late|, late < samples_consumed <= early,
// rank < world_size == nodes * trainers_per_node, batch_size > 0.
std::string decode_checkpoint(std::span<const std::uint8_t> bytes, Checkpoint& out);

// FNV-1a 64 (the blob's checksum; also used for plan digests).
std::uint64_t fnv1a64(std::span<const std::uint8_t> bytes, std::uint64_t hash = 0xcbf29ce484222325ull);

}  // namespace shardmix::proto
