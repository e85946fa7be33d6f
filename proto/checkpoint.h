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
// Checkpoint::fields() lists the fields between format and checksum once; the encoder,
// the decoder and the size walk it (proto/field_codec.h).
// Thread-safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "proto/field_codec.h"

namespace shardmix::proto {

inline constexpr std::uint32_t kCheckpointMagic = 0x4b584d53;  // "SMXK" little-endian
inline constexpr std::uint16_t kCheckpointFormat = 1;
inline constexpr std::uint16_t kCheckpointRedealt = 1;  // flags bit 0
// No list may be longer than this (a window larger than this is refused by the config).
inline constexpr std::uint32_t kMaxCheckpointExceptions = 1u << 20;
// Bound on an encoded blob: the fixed fields plus both lists at their limit (a unit test
// checks it against checkpoint_size()).
inline constexpr std::uint64_t kMaxCheckpointBytes = 120 + 2ull * 8 * kMaxCheckpointExceptions;

struct Checkpoint {
  std::uint16_t flags = 0;
  // The plan and job shape the position is in.
  std::uint64_t plan_digest = 0, num_samples = 0, seed = 0;
  std::uint32_t nodes = 0, trainers_per_node = 0, batch_size = 0;
  bool drop_last = false;
  std::uint32_t window = 0;
  std::uint32_t rank = 0, world_size = 0;
  // The position.
  std::uint64_t epoch = 0, batches_consumed = 0, samples_consumed = 0;
  std::vector<std::uint64_t> early;  // delivered, planned at or after samples_consumed
  std::vector<std::uint64_t> late;   // not delivered, planned before samples_consumed

  bool redealt() const { return (flags & kCheckpointRedealt) != 0; }
  bool operator==(const Checkpoint&) const = default;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("flags", m.flags), visit("plan_digest", m.plan_digest), visit("num_samples", m.num_samples);
    visit("seed", m.seed), visit("nodes", m.nodes), visit("trainers_per_node", m.trainers_per_node);
    visit("batch_size", m.batch_size), visit("drop_last", m.drop_last);
    visit("pad", ZeroPad<std::uint8_t>{}), visit("pad", ZeroPad<std::uint16_t>{}), visit("window", m.window);
    visit("rank", m.rank), visit("world_size", m.world_size), visit("epoch", m.epoch);
    visit("batches_consumed", m.batches_consumed), visit("samples_consumed", m.samples_consumed);
    visit("early", counted(kMaxCheckpointExceptions, m.early));
    visit("late", counted(kMaxCheckpointExceptions, m.late));
  }
};

std::vector<std::uint8_t> encode_checkpoint(const Checkpoint& c);
// What encode_checkpoint(c) writes: magic and format, the walked fields, the checksum.
std::size_t checkpoint_size(const Checkpoint& c);
// Empty string on success, else what is wrong and where ("checkpoint: field 'late' needs
// 16 bytes at offset 96, blob has 3"). Checks: magic, format, checksum, list lengths and
// order (strictly ascending), |early| == |late|, late < samples_consumed <= early,
// rank < world_size == nodes * trainers_per_node, batch_size > 0.
std::string decode_checkpoint(std::span<const std::uint8_t> bytes, Checkpoint& out);

// FNV-1a 64 (the blob's checksum; also used for plan digests).
std::uint64_t fnv1a64(std::span<const std::uint8_t> bytes, std::uint64_t hash = 0xcbf29ce484222325ull);

}  // namespace shardmix::proto
