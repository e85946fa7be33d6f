#include "proto/checkpoint.h"

#include <cstring>

namespace shardmix::proto {

std::uint64_t fnv1a64(std::span<const std::uint8_t> bytes, std::uint64_t hash) {
  for (std::uint8_t b : bytes) {
    hash ^= b;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// The envelope (magic, format, checksum) wraps the walked fields, as a frame header wraps
// a wire payload: the decoder checks it before reading any field.
constexpr std::size_t kEnvelopeHeadBytes = sizeof(kCheckpointMagic) + sizeof(kCheckpointFormat);
constexpr std::size_t kChecksumBytes = sizeof(std::uint64_t);

std::size_t checkpoint_size(const Checkpoint& c) { return kEnvelopeHeadBytes + encoded_size(c) + kChecksumBytes; }

std::vector<std::uint8_t> encode_checkpoint(const Checkpoint& c) {
  std::vector<std::uint8_t> out;
  out.reserve(checkpoint_size(c));
  FieldWriter w(out);
  w.put(kCheckpointMagic);
  w.put(kCheckpointFormat);
  Checkpoint::fields(c, w);
  w.put(fnv1a64(out));
  return out;
}

std::string decode_checkpoint(std::span<const std::uint8_t> bytes, Checkpoint& out) {
  if (bytes.size() < kChecksumBytes) {
    return "checkpoint: " + std::to_string(bytes.size()) + " bytes is too short to be one";
  }
  if (bytes.size() > kMaxCheckpointBytes) {
    return "checkpoint: " + std::to_string(bytes.size()) + " bytes exceeds the limit of " +
           std::to_string(kMaxCheckpointBytes);
  }
  FieldReader r(bytes.first(bytes.size() - kChecksumBytes), "checkpoint", "blob");
  std::uint32_t magic = 0;
  std::uint16_t format = 0;
  if (!r.get(magic, "magic")) return r.error();
  if (magic != kCheckpointMagic) return "checkpoint: bad magic (not a ShardMix checkpoint)";
  if (!r.get(format, "format")) return r.error();
  if (format != kCheckpointFormat) {
    return "checkpoint: format version " + std::to_string(format) + ", this library reads version " +
           std::to_string(kCheckpointFormat);
  }
  std::uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - kChecksumBytes, kChecksumBytes);
  if (stored != fnv1a64(bytes.first(bytes.size() - kChecksumBytes))) {
    return "checkpoint: checksum mismatch (truncated or corrupted)";
  }
  Checkpoint::fields(out, r);
  std::string err = r.finish();
  if (!err.empty()) return err;
  if (out.flags > kCheckpointRedealt) return "checkpoint: unknown flags " + std::to_string(out.flags);
  for (const auto& [name, list] : {std::pair{"early", &out.early}, std::pair{"late", &out.late}}) {
    for (std::size_t i = 1; i < list->size(); ++i) {
      if ((*list)[i] <= (*list)[i - 1]) {
        return "checkpoint: list '" + std::string(name) + "' is not strictly ascending at entry " + std::to_string(i);
      }
    }
  }
  const std::uint64_t world = std::uint64_t{out.nodes} * out.trainers_per_node;
  if (out.batch_size == 0 || world == 0 || world != out.world_size || out.rank >= out.world_size) {
    return "checkpoint: job shape is inconsistent (rank " + std::to_string(out.rank) + " of " +
           std::to_string(out.world_size) + " trainers, " + std::to_string(out.nodes) + " nodes x " +
           std::to_string(out.trainers_per_node) + ", batch size " + std::to_string(out.batch_size) + ")";
  }
  if (out.early.size() != out.late.size()) {
    return "checkpoint: " + std::to_string(out.early.size()) + " early positions but " +
           std::to_string(out.late.size()) + " late ones (they must pair up)";
  }
  if (!out.late.empty() && out.late.back() >= out.samples_consumed) {
    return "checkpoint: late position " + std::to_string(out.late.back()) + " is not below samples_consumed " +
           std::to_string(out.samples_consumed);
  }
  if (!out.early.empty() && out.early.front() < out.samples_consumed) {
    return "checkpoint: early position " + std::to_string(out.early.front()) + " is below samples_consumed " +
           std::to_string(out.samples_consumed);
  }
  return {};
}

}  // namespace shardmix::proto
