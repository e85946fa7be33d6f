#include "proto/wire.h"

#include "proto/checkpoint.h"

#include <bit>
#include <cstddef>
#include <string>

namespace shardmix::proto {
namespace {

// Appends little-endian scalars (x86-64 and aarch64 are little-endian; checked below).
static_assert(std::endian::native == std::endian::little, "wire format assumes little-endian hosts");

class Writer {
 public:
  explicit Writer(std::vector<std::uint8_t>& out, FrameType type) : out_(out), start_(out.size()) {
    FrameHeader h{kMagic, kProtocolVersion, static_cast<std::uint16_t>(type), 0, 0};
    put_raw(&h, sizeof(h));
  }
  ~Writer() {
    const auto payload = static_cast<std::uint32_t>(out_.size() - start_ - sizeof(FrameHeader));
    std::memcpy(out_.data() + start_ + offsetof(FrameHeader, payload_bytes), &payload, sizeof(payload));
  }
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    put_raw(&value, sizeof(value));
  }
  void put_raw(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }
  void put_string(std::string_view s) {
    put(static_cast<std::uint32_t>(s.size()));
    put_raw(s.data(), s.size());
  }

 private:
  std::vector<std::uint8_t>& out_;
  std::size_t start_;
};

// Bounds-checked reads; the first failure sticks and records what and where.
class Reader {
 public:
  Reader(std::span<const std::uint8_t> bytes, std::string_view what) : bytes_(bytes), what_(what) {}
  template <typename T>
  bool get(T& value, std::string_view field) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!need(sizeof(T), field)) return false;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_raw(void* out, std::size_t n, std::string_view field) {
    if (!need(n, field)) return false;
    if (n > 0) std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool get_string(std::string& s, std::string_view field) {
    std::uint32_t n = 0;
    if (!get(n, field)) return false;
    if (!need(n, field)) return false;
    s.assign(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  // Rejects trailing garbage: a frame must be exactly its fields.
  std::string finish() {
    if (error_.empty() && pos_ != bytes_.size()) {
      error_ = std::string(what_) + ": " + std::to_string(bytes_.size() - pos_) +
               " unexpected trailing bytes at offset " + std::to_string(pos_);
    }
    return error_;
  }
  void fail(std::string message) {
    if (error_.empty()) error_ = std::string(what_) + ": " + message;
  }
  std::size_t remaining() const { return bytes_.size() - pos_; }

 private:
  bool need(std::size_t n, std::string_view field) {
    if (!error_.empty()) return false;
    if (bytes_.size() - pos_ < n) {
      error_ = std::string(what_) + ": field '" + std::string(field) + "' needs " + std::to_string(n) +
               " bytes at offset " + std::to_string(pos_) + ", payload has " +
               std::to_string(bytes_.size() - pos_);
      return false;
    }
    return true;
  }
  std::span<const std::uint8_t> bytes_;
  std::string_view what_;
  std::size_t pos_ = 0;
  std::string error_;
};

}  // namespace

std::string_view tier_name(Tier tier) {
  switch (tier) {
    case Tier::kLocal: return "local";
    case Tier::kPeer: return "peer";
    case Tier::kStorage: return "storage";
  }
  return "unknown";
}

void encode(std::vector<std::uint8_t>& out, const Hello& m) {
  Writer w(out, FrameType::kHello);
  w.put(m.trainer_rank);
  w.put(m.world_size);
  w.put(m.pid);
}

void encode(std::vector<std::uint8_t>& out, const Welcome& m) {
  Writer w(out, FrameType::kWelcome);
  w.put(m.node);
  w.put(m.nodes);
  w.put(m.trainers_per_node);
  w.put(m.prefetch);
  w.put(m.num_samples);
  w.put(m.batches_per_epoch);
  w.put(m.samples_this_trainer);
  w.put(m.arena_bytes);
  w.put(m.staging_bytes);
  w.put(m.plan_digest);
  w.put(m.seed);
  w.put(m.batch_size);
  w.put(m.drop_last);
  w.put(m.window);
  w.put(m.resumed_epoch);
  w.put(m.resumed_digest);
  w.put(m.resumed_batches);
}

void encode(std::vector<std::uint8_t>& out, const ErrorFrame& m) {
  Writer w(out, FrameType::kError);
  w.put(m.code);
  w.put_string(m.message);
}

void encode(std::vector<std::uint8_t>& out, const StartEpoch& m) {
  Writer w(out, FrameType::kStartEpoch);
  w.put(m.epoch);
  w.put(m.stream);
  w.put(static_cast<std::uint32_t>(m.resume.size()));
  w.put_raw(m.resume.data(), m.resume.size());
}

void encode(std::vector<std::uint8_t>& out, const BatchFrame& m) {
  Writer w(out, FrameType::kBatch);
  w.put(m.epoch);
  w.put(m.stream);
  w.put(m.batch);
  w.put(static_cast<std::uint32_t>(m.samples.size()));
  w.put_raw(m.samples.data(), m.samples.size() * sizeof(SampleDescriptor));
  // One position per sample (a frame built without them carries zeros).
  for (std::size_t i = 0; i < m.samples.size(); ++i) w.put(i < m.positions.size() ? m.positions[i] : std::uint64_t{0});
}

void encode(std::vector<std::uint8_t>& out, const Release& m) {
  Writer w(out, FrameType::kRelease);
  w.put(m.epoch);
  w.put(m.stream);
  w.put(m.batch);
  w.put(m.wait_us);
}

void encode(std::vector<std::uint8_t>& out, const EpochStats& m) {
  Writer w(out, FrameType::kEpochEnd);
  w.put(m.epoch);
  w.put(m.stream);
  w.put(m.batches);
  w.put(m.samples);
  w.put(m.bytes);
  w.put(m.local_samples);
  w.put(m.peer_samples);
  w.put(m.storage_samples);
  w.put(m.peer_bytes);
  w.put(m.fetch_wait_us);
  w.put(m.substituted_samples);
  w.put(m.unreadable_samples);
  w.put(m.exchange_fraction);
  w.put(m.window);
  w.put(m.batches_scored);
  w.put(m.label_entropy_mean);
  w.put(m.label_entropy_p5);
  w.put(m.affinity);
}

void encode_get_catalog(std::vector<std::uint8_t>& out) { Writer w(out, FrameType::kGetCatalog); }

void encode_catalog(std::vector<std::uint8_t>& out, std::span<const std::uint8_t> catalog) {
  Writer w(out, FrameType::kCatalog);
  w.put_raw(catalog.data(), catalog.size());
}

void finish_catalog_frame(std::vector<std::uint8_t>& frame) {
  const FrameHeader h{kMagic, kProtocolVersion, static_cast<std::uint16_t>(FrameType::kCatalog),
                      static_cast<std::uint32_t>(frame.size() - sizeof(FrameHeader)), 0};
  std::memcpy(frame.data(), &h, sizeof(h));
}

void encode_get_stats(std::vector<std::uint8_t>& out) { Writer w(out, FrameType::kGetStats); }

void encode_keepalive(std::vector<std::uint8_t>& out) { Writer w(out, FrameType::kKeepalive); }

void encode_stats(std::vector<std::uint8_t>& out, std::string_view text) {
  Writer w(out, FrameType::kStats);
  w.put_raw(text.data(), text.size());
}

void set_hello_job_token(std::vector<std::uint8_t>& frame, std::uint32_t token) {
  if (frame.size() < sizeof(FrameHeader)) return;
  std::memcpy(frame.data() + offsetof(FrameHeader, reserved), &token, sizeof(token));
}

std::int64_t request_payload_bytes(FrameType type) {
  switch (type) {
    case FrameType::kHello: return 3 * sizeof(std::uint32_t);
    case FrameType::kStartEpoch: return 2 * sizeof(std::uint64_t) + sizeof(std::uint32_t);
    case FrameType::kRelease: return 4 * sizeof(std::uint64_t);
    case FrameType::kGetCatalog: return 0;
    case FrameType::kGetStats: return 0;
    default: return -1;
  }
}

std::int64_t request_payload_max_bytes(FrameType type) {
  if (type == FrameType::kStartEpoch) {
    return request_payload_bytes(type) + static_cast<std::int64_t>(kMaxCheckpointBytes);
  }
  return request_payload_bytes(type);
}

std::string decode_header(std::span<const std::uint8_t> bytes, FrameHeader& out) {
  Reader r(bytes, "frame header");
  r.get(out.magic, "magic");
  r.get(out.version, "version");
  r.get(out.type, "type");
  r.get(out.payload_bytes, "payload_bytes");
  r.get(out.reserved, "reserved");
  std::string err = r.finish();
  if (!err.empty()) return err;
  if (out.magic != kMagic) return "frame header: bad magic (not a ShardMix peer?)";
  if (out.version != kProtocolVersion) {
    return "frame header: protocol version " + std::to_string(out.version) + ", this side speaks " +
           std::to_string(kProtocolVersion);
  }
  if (out.type < static_cast<std::uint16_t>(FrameType::kHello) ||
      out.type > static_cast<std::uint16_t>(FrameType::kKeepalive)) {
    return "frame header: unknown frame type " + std::to_string(out.type);
  }
  if (out.payload_bytes > kMaxPayloadBytes) {
    return "frame header: payload of " + std::to_string(out.payload_bytes) + " bytes exceeds the limit of " +
           std::to_string(kMaxPayloadBytes);
  }
  return {};
}

std::string decode(std::span<const std::uint8_t> payload, Hello& out) {
  Reader r(payload, "hello frame");
  r.get(out.trainer_rank, "trainer_rank");
  r.get(out.world_size, "world_size");
  r.get(out.pid, "pid");
  std::string err = r.finish();
  if (err.empty() && out.trainer_rank >= out.world_size) {
    err = "hello frame: trainer rank " + std::to_string(out.trainer_rank) + " is not below world size " +
          std::to_string(out.world_size);
  }
  return err;
}

std::string decode(std::span<const std::uint8_t> payload, Welcome& out) {
  Reader r(payload, "welcome frame");
  r.get(out.node, "node");
  r.get(out.nodes, "nodes");
  r.get(out.trainers_per_node, "trainers_per_node");
  r.get(out.prefetch, "prefetch");
  r.get(out.num_samples, "num_samples");
  r.get(out.batches_per_epoch, "batches_per_epoch");
  r.get(out.samples_this_trainer, "samples_this_trainer");
  r.get(out.arena_bytes, "arena_bytes");
  r.get(out.staging_bytes, "staging_bytes");
  r.get(out.plan_digest, "plan_digest");
  r.get(out.seed, "seed");
  r.get(out.batch_size, "batch_size");
  r.get(out.drop_last, "drop_last");
  r.get(out.window, "window");
  r.get(out.resumed_epoch, "resumed_epoch");
  r.get(out.resumed_digest, "resumed_digest");
  r.get(out.resumed_batches, "resumed_batches");
  std::string err = r.finish();
  if (err.empty() && out.drop_last > 1) err = "welcome frame: drop_last " + std::to_string(out.drop_last) + " is not 0 or 1";
  return err;
}

std::string decode(std::span<const std::uint8_t> payload, ErrorFrame& out) {
  Reader r(payload, "error frame");
  r.get(out.code, "code");
  r.get_string(out.message, "message");
  return r.finish();
}

std::string decode(std::span<const std::uint8_t> payload, StartEpoch& out) {
  Reader r(payload, "start-epoch frame");
  std::uint32_t resume_bytes = 0;
  r.get(out.epoch, "epoch");
  r.get(out.stream, "stream");
  if (!r.get(resume_bytes, "resume_bytes")) return r.finish();
  if (resume_bytes > kMaxCheckpointBytes) {
    r.fail("resume blob of " + std::to_string(resume_bytes) + " bytes exceeds the limit of " +
           std::to_string(kMaxCheckpointBytes));
    return r.finish();
  }
  if (resume_bytes != r.remaining()) {
    r.fail("resume blob of " + std::to_string(resume_bytes) + " bytes, payload has " + std::to_string(r.remaining()) +
           " after offset 20");
    return r.finish();
  }
  out.resume.resize(resume_bytes);
  r.get_raw(out.resume.data(), resume_bytes, "resume");
  return r.finish();
}

std::string decode(std::span<const std::uint8_t> payload, BatchFrame& out) {
  Reader r(payload, "batch frame");
  std::uint32_t count = 0;
  r.get(out.epoch, "epoch");
  r.get(out.stream, "stream");
  r.get(out.batch, "batch");
  if (!r.get(count, "count")) return r.finish();
  if (count > kMaxBatchSamples) {
    r.fail("sample count " + std::to_string(count) + " exceeds the limit of " + std::to_string(kMaxBatchSamples));
    return r.finish();
  }
  constexpr std::uint64_t kPerSample = sizeof(SampleDescriptor) + sizeof(std::uint64_t);
  if (static_cast<std::uint64_t>(count) * kPerSample != r.remaining()) {
    r.fail("sample count " + std::to_string(count) + " needs " + std::to_string(std::uint64_t{count} * kPerSample) +
           " bytes, payload has " + std::to_string(r.remaining()) + " after offset 28");
    return r.finish();
  }
  out.samples.resize(count);
  out.positions.resize(count);
  r.get_raw(out.samples.data(), count * sizeof(SampleDescriptor), "samples");
  r.get_raw(out.positions.data(), count * sizeof(std::uint64_t), "positions");
  std::string err = r.finish();
  if (!err.empty()) return err;
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto& s = out.samples[i];
    if (s.region > static_cast<std::uint8_t>(Region::kStaging) || s.tier > static_cast<std::uint8_t>(Tier::kStorage) ||
        s.offset + s.length < s.offset || (s.flags & ~kSampleSkipped) != 0 ||
        ((s.flags & kSampleSkipped) != 0 && s.length != 0)) {
      return "batch frame: sample descriptor " + std::to_string(i) + " is malformed (region " +
             std::to_string(s.region) + ", tier " + std::to_string(s.tier) + ", flags " + std::to_string(s.flags) +
             ", length " + std::to_string(s.length) + ")";
    }
  }
  return {};
}

std::string decode(std::span<const std::uint8_t> payload, Release& out) {
  Reader r(payload, "release frame");
  r.get(out.epoch, "epoch");
  r.get(out.stream, "stream");
  r.get(out.batch, "batch");
  r.get(out.wait_us, "wait_us");
  return r.finish();
}

std::string decode(std::span<const std::uint8_t> payload, EpochStats& out) {
  Reader r(payload, "epoch-end frame");
  r.get(out.epoch, "epoch");
  r.get(out.stream, "stream");
  r.get(out.batches, "batches");
  r.get(out.samples, "samples");
  r.get(out.bytes, "bytes");
  r.get(out.local_samples, "local_samples");
  r.get(out.peer_samples, "peer_samples");
  r.get(out.storage_samples, "storage_samples");
  r.get(out.peer_bytes, "peer_bytes");
  r.get(out.fetch_wait_us, "fetch_wait_us");
  r.get(out.substituted_samples, "substituted_samples");
  r.get(out.unreadable_samples, "unreadable_samples");
  r.get(out.exchange_fraction, "exchange_fraction");
  r.get(out.window, "window");
  r.get(out.batches_scored, "batches_scored");
  r.get(out.label_entropy_mean, "label_entropy_mean");
  r.get(out.label_entropy_p5, "label_entropy_p5");
  r.get(out.affinity, "affinity");
  return r.finish();
}

std::string decode_stats(std::span<const std::uint8_t> payload, std::string& out) {
  for (std::size_t i = 0; i < payload.size(); ++i) {
    if (payload[i] == 0) return "stats frame: NUL byte at offset " + std::to_string(i);
  }
  out.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
  return {};
}

}  // namespace shardmix::proto
