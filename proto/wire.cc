#include "proto/wire.h"

#include <unistd.h>

#include "proto/checkpoint.h"

#include <cstddef>
#include <string>

namespace shardmix::proto {
namespace {

void put_header(std::vector<std::uint8_t>& out, FrameType type, std::size_t payload_bytes) {
  const FrameHeader h{kMagic, kProtocolVersion, static_cast<std::uint16_t>(type),
                      static_cast<std::uint32_t>(payload_bytes), 0};
  FieldWriter w(out);
  FrameHeader::fields(h, w);
}

// A whole frame: the header carries the walked size of the fields that follow it.
template <typename Message>
void encode_frame(std::vector<std::uint8_t>& out, FrameType type, const Message& m) {
  put_header(out, type, encoded_size(m));
  FieldWriter w(out);
  Message::fields(m, w);
}

void encode_raw_frame(std::vector<std::uint8_t>& out, FrameType type, std::span<const std::uint8_t> payload) {
  put_header(out, type, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
}

// Walks the message's fields over exactly `payload`; `what` names the frame in errors.
template <typename Message>
std::string decode_fields(std::span<const std::uint8_t> payload, std::string_view what, Message& out) {
  FieldReader r(payload, what);
  Message::fields(out, r);
  return r.finish();
}

}  // namespace

std::string_view tier_name(Tier tier) {
  switch (tier) {
    case Tier::kLocal: return "local";
    case Tier::kPeer: return "peer";
    case Tier::kStorage: return "storage";
  }
  return "unknown";
}

void encode(std::vector<std::uint8_t>& out, const Hello& m) { encode_frame(out, FrameType::kHello, m); }
void encode(std::vector<std::uint8_t>& out, const Welcome& m) { encode_frame(out, FrameType::kWelcome, m); }
void encode(std::vector<std::uint8_t>& out, const ErrorFrame& m) { encode_frame(out, FrameType::kError, m); }
void encode(std::vector<std::uint8_t>& out, const StartEpoch& m) { encode_frame(out, FrameType::kStartEpoch, m); }
void encode(std::vector<std::uint8_t>& out, const BatchFrame& m) { encode_frame(out, FrameType::kBatch, m); }
void encode(std::vector<std::uint8_t>& out, const Release& m) { encode_frame(out, FrameType::kRelease, m); }
void encode(std::vector<std::uint8_t>& out, const EpochStats& m) { encode_frame(out, FrameType::kEpochEnd, m); }

void encode_get_catalog(std::vector<std::uint8_t>& out) { encode_raw_frame(out, FrameType::kGetCatalog, {}); }

void encode_catalog(std::vector<std::uint8_t>& out, std::span<const std::uint8_t> catalog) {
  encode_raw_frame(out, FrameType::kCatalog, catalog);
}

void finish_catalog_frame(std::vector<std::uint8_t>& frame) {
  std::vector<std::uint8_t> header;
  put_header(header, FrameType::kCatalog, frame.size() - sizeof(FrameHeader));
  std::memcpy(frame.data(), header.data(), sizeof(FrameHeader));
}

void encode_get_stats(std::vector<std::uint8_t>& out) { encode_raw_frame(out, FrameType::kGetStats, {}); }

void encode_keepalive(std::vector<std::uint8_t>& out) { encode_raw_frame(out, FrameType::kKeepalive, {}); }

void encode_stats(std::vector<std::uint8_t>& out, std::string_view text) {
  encode_raw_frame(out, FrameType::kStats,
                   std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

void encode_checkpoint_hello(std::vector<std::uint8_t>& out, const Hello& m) {
  encode_frame(out, FrameType::kCheckpointHello, m);
}
void encode(std::vector<std::uint8_t>& out, const CheckpointWelcome& m) {
  encode_frame(out, FrameType::kCheckpointWelcome, m);
}
void encode(std::vector<std::uint8_t>& out, const CheckpointSave& m) { encode_frame(out, FrameType::kCheckpointSave, m); }
void encode(std::vector<std::uint8_t>& out, FrameType type, const CheckpointRequest& m) { encode_frame(out, type, m); }
void encode(std::vector<std::uint8_t>& out, const CheckpointReply& m) { encode_frame(out, FrameType::kCheckpointReply, m); }
void encode_checkpoint_lease(std::vector<std::uint8_t>& out, const CheckpointSave& m) {
  encode_frame(out, FrameType::kCheckpointLease, m);
}
void encode(std::vector<std::uint8_t>& out, const CheckpointLeaseGrant& m) {
  encode_frame(out, FrameType::kCheckpointLeaseGrant, m);
}
void encode(std::vector<std::uint8_t>& out, FrameType type, const CheckpointCommit& m) { encode_frame(out, type, m); }
void encode(std::vector<std::uint8_t>& out, const CheckpointListing& m) {
  encode_frame(out, FrameType::kCheckpointListing, m);
}

void set_hello_job_token(std::vector<std::uint8_t>& frame, std::uint32_t token) {
  if (frame.size() < sizeof(FrameHeader)) return;
  std::memcpy(frame.data() + offsetof(FrameHeader, reserved), &token, sizeof(token));
}

std::int64_t request_payload_bytes(FrameType type) {
  switch (type) {
    case FrameType::kHello: return static_cast<std::int64_t>(encoded_size(Hello{}));
    case FrameType::kStartEpoch: return static_cast<std::int64_t>(encoded_size(StartEpoch{}));  // no resume blob
    case FrameType::kRelease: return static_cast<std::int64_t>(encoded_size(Release{}));
    case FrameType::kGetCatalog: return 0;
    case FrameType::kGetStats: return 0;
    case FrameType::kCheckpointHello: return static_cast<std::int64_t>(encoded_size(Hello{}));
    case FrameType::kCheckpointSave:
    case FrameType::kCheckpointLease: return static_cast<std::int64_t>(encoded_size(CheckpointSave{}));  // no name
    case FrameType::kCheckpointCommit:
    case FrameType::kCheckpointAbandon: return static_cast<std::int64_t>(encoded_size(CheckpointCommit{}));
    case FrameType::kCheckpointWaitDurable:
    case FrameType::kCheckpointLoad:
    case FrameType::kCheckpointList: return static_cast<std::int64_t>(encoded_size(CheckpointRequest{}));
    default: return -1;
  }
}

std::int64_t request_payload_max_bytes(FrameType type) {
  if (type == FrameType::kStartEpoch) {
    return request_payload_bytes(type) + static_cast<std::int64_t>(kMaxCheckpointBytes);
  }
  if (type == FrameType::kCheckpointSave || type == FrameType::kCheckpointLease || type == FrameType::kCheckpointWaitDurable ||
      type == FrameType::kCheckpointLoad || type == FrameType::kCheckpointList) {
    return request_payload_bytes(type) + static_cast<std::int64_t>(kMaxCheckpointNameBytes);
  }
  return request_payload_bytes(type);
}

std::string decode_header(std::span<const std::uint8_t> bytes, FrameHeader& out) {
  std::string err = decode_fields(bytes, "frame header", out);
  if (!err.empty()) return err;
  if (out.magic != kMagic) return "frame header: bad magic (not a ShardMix peer?)";
  if (out.version != kProtocolVersion) {
    return "frame header: protocol version " + std::to_string(out.version) + ", this side speaks " +
           std::to_string(kProtocolVersion);
  }
  if (out.type < static_cast<std::uint16_t>(FrameType::kHello) ||
      out.type > static_cast<std::uint16_t>(kLastFrameType)) {
    return "frame header: unknown frame type " + std::to_string(out.type);
  }
  if (out.payload_bytes > kMaxPayloadBytes) {
    return "frame header: payload of " + std::to_string(out.payload_bytes) + " bytes exceeds the limit of " +
           std::to_string(kMaxPayloadBytes);
  }
  return {};
}

std::string decode(std::span<const std::uint8_t> payload, Hello& out) {
  std::string err = decode_fields(payload, "hello frame", out);
  if (err.empty() && out.trainer_rank >= out.world_size) {
    err = "hello frame: trainer rank " + std::to_string(out.trainer_rank) + " is not below world size " +
          std::to_string(out.world_size);
  }
  return err;
}

std::string decode(std::span<const std::uint8_t> payload, Welcome& out) {
  std::string err = decode_fields(payload, "welcome frame", out);
  if (err.empty() && out.drop_last > 1) err = "welcome frame: drop_last " + std::to_string(out.drop_last) + " is not 0 or 1";
  return err;
}

std::string decode(std::span<const std::uint8_t> payload, ErrorFrame& out) {
  return decode_fields(payload, "error frame", out);
}

std::string decode(std::span<const std::uint8_t> payload, StartEpoch& out) {
  return decode_fields(payload, "start-epoch frame", out);
}

std::string decode(std::span<const std::uint8_t> payload, BatchFrame& out) {
  std::string err = decode_fields(payload, "batch frame", out);
  if (!err.empty()) return err;
  for (std::size_t i = 0; i < out.samples.size(); ++i) {
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
  return decode_fields(payload, "release frame", out);
}

std::string decode(std::span<const std::uint8_t> payload, EpochStats& out) {
  return decode_fields(payload, "epoch-end frame", out);
}

// The checkpoint frames have no checks of meaning beyond their fields (the daemon's
// CheckpointNode validates names), except the listing below.
using Payload = std::span<const std::uint8_t>;
std::string decode(Payload payload, CheckpointWelcome& out) { return decode_fields(payload, "checkpoint-welcome frame", out); }
std::string decode(Payload payload, CheckpointSave& out) { return decode_fields(payload, "checkpoint-save frame", out); }
std::string decode(Payload payload, CheckpointRequest& out) { return decode_fields(payload, "checkpoint request frame", out); }
std::string decode(Payload payload, CheckpointReply& out) { return decode_fields(payload, "checkpoint-reply frame", out); }
std::string decode(Payload payload, CheckpointCommit& out) { return decode_fields(payload, "checkpoint-commit frame", out); }

std::string decode(Payload payload, CheckpointLeaseGrant& out) {
  std::string err = decode_fields(payload, "checkpoint-lease-grant frame", out);
  if (!err.empty()) return err;
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < out.run_lengths.size(); ++i) {
    if (out.run_lengths[i] == 0 || out.run_lengths[i] % page != 0 || out.run_offsets[i] % page != 0) {
      return "checkpoint-lease-grant frame: run " + std::to_string(i) + " (" + std::to_string(out.run_lengths[i]) +
             " bytes at offset " + std::to_string(out.run_offsets[i]) + ") is not whole pages";
    }
    if (out.run_lengths[i] > ~std::uint64_t{0} - total) return "checkpoint-lease-grant frame: its runs' lengths overflow";
    total += out.run_lengths[i];
  }
  if (out.code == 0 && total < out.size) {
    return "checkpoint-lease-grant frame: its runs hold " + std::to_string(total) + " bytes, the lease " +
           std::to_string(out.size);
  }
  return {};
}

std::string decode(std::span<const std::uint8_t> payload, CheckpointListing& out) {
  std::string err = decode_fields(payload, "checkpoint-listing frame", out);
  if (!err.empty()) return err;
  std::uint64_t total = 0;
  for (const std::uint32_t n : out.name_bytes) {
    if (n == 0 || n > kMaxCheckpointNameBytes) {
      return "checkpoint-listing frame: a name of " + std::to_string(n) + " bytes (1 to " +
             std::to_string(kMaxCheckpointNameBytes) + " allowed)";
    }
    total += n;
  }
  if (total != out.names.size()) {
    return "checkpoint-listing frame: the name lengths add up to " + std::to_string(total) + " bytes, the names hold " +
           std::to_string(out.names.size());
  }
  return {};
}

std::string decode_stats(std::span<const std::uint8_t> payload, std::string& out) {
  for (std::size_t i = 0; i < payload.size(); ++i) {
    if (payload[i] == 0) return "stats frame: NUL byte at offset " + std::to_string(i);
  }
  out.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
  return {};
}

}  // namespace shardmix::proto
