#include "proto/checkpoint.h"

#include <cstring>
#include <type_traits>

namespace shardmix::proto {
namespace {

template <typename T>
void put(std::vector<std::uint8_t>& out, T value) {
  static_assert(std::is_trivially_copyable_v<T>);
  const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  template <typename T>
  bool get(T& value, const char* field) {
    if (!error_.empty()) return false;
    if (bytes_.size() - pos_ < sizeof(T)) {
      error_ = "checkpoint: field '" + std::string(field) + "' needs " + std::to_string(sizeof(T)) +
               " bytes at offset " + std::to_string(pos_) + ", blob has " + std::to_string(bytes_.size() - pos_);
      return false;
    }
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_list(std::vector<std::uint64_t>& list, const char* field) {
    std::uint32_t count = 0;
    if (!get(count, field)) return false;
    if (count > kMaxCheckpointExceptions) {
      error_ = "checkpoint: list '" + std::string(field) + "' of " + std::to_string(count) +
               " positions exceeds the limit of " + std::to_string(kMaxCheckpointExceptions);
      return false;
    }
    if ((bytes_.size() - pos_) / 8 < count) {
      error_ = "checkpoint: list '" + std::string(field) + "' of " + std::to_string(count) + " positions needs " +
               std::to_string(8ull * count) + " bytes at offset " + std::to_string(pos_) + ", blob has " +
               std::to_string(bytes_.size() - pos_);
      return false;
    }
    list.resize(count);
    if (count > 0) std::memcpy(list.data(), bytes_.data() + pos_, 8ull * count);
    pos_ += 8ull * count;
    for (std::uint32_t i = 1; i < count; ++i) {
      if (list[i] <= list[i - 1]) {
        error_ = "checkpoint: list '" + std::string(field) + "' is not strictly ascending at entry " + std::to_string(i);
        return false;
      }
    }
    return true;
  }
  std::size_t pos() const { return pos_; }
  std::string& error() { return error_; }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
  std::string error_;
};

}  // namespace

std::uint64_t fnv1a64(std::span<const std::uint8_t> bytes, std::uint64_t hash) {
  for (std::uint8_t b : bytes) {
    hash ^= b;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::vector<std::uint8_t> encode_checkpoint(const Checkpoint& c) {
  std::vector<std::uint8_t> out;
  out.reserve(120 + 8 * (c.early.size() + c.late.size()));
  put(out, kCheckpointMagic);
  put(out, kCheckpointFormat);
  put(out, c.flags);
  put(out, c.plan_digest);
  put(out, c.num_samples);
  put(out, c.seed);
  put(out, c.nodes);
  put(out, c.trainers_per_node);
  put(out, c.batch_size);
  put(out, static_cast<std::uint8_t>(c.drop_last ? 1 : 0));
  put(out, std::uint8_t{0});
  put(out, std::uint16_t{0});
  put(out, c.window);
  put(out, c.rank);
  put(out, c.world_size);
  put(out, c.epoch);
  put(out, c.batches_consumed);
  put(out, c.samples_consumed);
  put(out, static_cast<std::uint32_t>(c.early.size()));
  for (auto p : c.early) put(out, p);
  put(out, static_cast<std::uint32_t>(c.late.size()));
  for (auto p : c.late) put(out, p);
  put(out, fnv1a64(out));
  return out;
}

std::string decode_checkpoint(std::span<const std::uint8_t> bytes, Checkpoint& out) {
  if (bytes.size() < 8) return "checkpoint: " + std::to_string(bytes.size()) + " bytes is too short to be one";
  if (bytes.size() > kMaxCheckpointBytes) {
    return "checkpoint: " + std::to_string(bytes.size()) + " bytes exceeds the limit of " +
           std::to_string(kMaxCheckpointBytes);
  }
  Reader r(bytes.first(bytes.size() - 8));
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
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  if (stored != fnv1a64(bytes.first(bytes.size() - 8))) return "checkpoint: checksum mismatch (truncated or corrupted)";
  std::uint8_t drop_last = 0, pad8 = 0;
  std::uint16_t pad16 = 0;
  r.get(out.flags, "flags");
  r.get(out.plan_digest, "plan_digest");
  r.get(out.num_samples, "num_samples");
  r.get(out.seed, "seed");
  r.get(out.nodes, "nodes");
  r.get(out.trainers_per_node, "trainers_per_node");
  r.get(out.batch_size, "batch_size");
  r.get(drop_last, "drop_last");
  r.get(pad8, "pad");
  r.get(pad16, "pad");
  r.get(out.window, "window");
  r.get(out.rank, "rank");
  r.get(out.world_size, "world_size");
  r.get(out.epoch, "epoch");
  r.get(out.batches_consumed, "batches_consumed");
  r.get(out.samples_consumed, "samples_consumed");
  r.get_list(out.early, "early");
  r.get_list(out.late, "late");
  if (!r.error().empty()) return r.error();
  if (r.pos() != bytes.size() - 8) {
    return "checkpoint: " + std::to_string(bytes.size() - 8 - r.pos()) + " unexpected bytes at offset " +
           std::to_string(r.pos());
  }
  if (out.flags > kCheckpointRedealt || drop_last > 1 || pad8 != 0 || pad16 != 0) {
    return "checkpoint: unknown flags or non-zero padding";
  }
  out.drop_last = drop_last != 0;
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
