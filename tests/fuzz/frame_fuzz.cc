// Fuzz target: proto/wire, the bytes of the trainer <-> daemon socket.
//
// The input is read as a stream of frames, as either end of a connection reads it: a
// 16-byte header, then payload_bytes of payload, then the next frame. A header that does
// not decode ends the stream (the real peer closes the connection). Every payload (or,
// after a bad header, the rest of the input) goes through EVERY payload decoder, the
// daemon's (Hello, StartEpoch and the checkpoint blob it may carry, Release) and the client's (Welcome, Error, Batch,
// EpochEnd, Stats), so each decoder sees arbitrary bytes, not only those of its own type.
// The catalog payload is Catalog::deserialize's, fuzzed by catalog_fuzz.cc.
//
// Checks beyond "no crash, no UB": a decoded header holds only accepted values and its
// bytes are exactly the decoded fields; a decoded payload re-encodes to a frame whose
// header names its type and size and whose payload is byte-for-byte the input (every
// layout has exactly one encoding per value: encode(decode(x)) == x), and that decodes
// again; Hello and Batch values satisfy the invariants their decoders promise; the
// daemon's fixed request sizes match what the encoders write.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "proto/checkpoint.h"
#include "proto/wire.h"
#include "tests/fuzz/fuzz.h"
#include "tests/support/sample_checkpoint.h"

namespace {

using namespace shardmix::proto;
using shardmix::fuzz::Bytes;
using Span = std::span<const std::uint8_t>;

constexpr std::size_t kHeaderBytes = sizeof(FrameHeader);
// Every frame type decode_header accepts; run_every_decoder() runs each one's decoder.
constexpr FrameType kKnownTypes[] = {
    FrameType::kHello,   FrameType::kWelcome,  FrameType::kError,      FrameType::kStartEpoch,
    FrameType::kBatch,   FrameType::kRelease,  FrameType::kEpochEnd,   FrameType::kGetCatalog,
    FrameType::kCatalog, FrameType::kGetStats, FrameType::kStats,      FrameType::kKeepalive,
    FrameType::kCheckpointHello, FrameType::kCheckpointWelcome, FrameType::kCheckpointSave,
    FrameType::kCheckpointWaitDurable, FrameType::kCheckpointLoad, FrameType::kCheckpointList,
    FrameType::kCheckpointReply, FrameType::kCheckpointListing, FrameType::kCheckpointLease,
    FrameType::kCheckpointLeaseGrant, FrameType::kCheckpointCommit, FrameType::kCheckpointAbandon};

std::string frame_name(FrameType type) { return "frame type " + std::to_string(static_cast<int>(type)); }

void check_header(Span bytes, const std::string& err, const FrameHeader& h) {
  if (bytes.size() != kHeaderBytes) {
    FUZZ_CHECK(!err.empty(), "a " + std::to_string(bytes.size()) + "-byte header decoded");
    return;
  }
  if (!err.empty()) return;
  FUZZ_CHECK(h.magic == kMagic, "bad magic accepted");
  FUZZ_CHECK(h.version == kProtocolVersion, "version " + std::to_string(h.version) + " accepted");
  FUZZ_CHECK(std::find(std::begin(kKnownTypes), std::end(kKnownTypes), static_cast<FrameType>(h.type)) !=
                 std::end(kKnownTypes),
             "decode_header accepts frame type " + std::to_string(h.type) +
                 ", unknown to this target: add it to kKnownTypes and its decoder to run_every_decoder()");
  FUZZ_CHECK(h.payload_bytes <= kMaxPayloadBytes, "oversized payload accepted");
  FUZZ_CHECK(std::memcmp(&h, bytes.data(), kHeaderBytes) == 0, "decoded header differs from its bytes");
}

// The checkpoint requests share one layout; the round trip encodes it as a load.
void encode(Bytes& frame, const CheckpointRequest& m) { shardmix::proto::encode(frame, FrameType::kCheckpointLoad, m); }
// So do commit and abandon (a lease's CheckpointSave payload is the save's, checked above).
void encode(Bytes& frame, const CheckpointCommit& m) { shardmix::proto::encode(frame, FrameType::kCheckpointCommit, m); }

// encode(decode(payload)) must be a well-formed frame of `type` carrying exactly `payload`.
template <typename Message>
void check_round_trip(Span payload, const Message& m, FrameType type) {
  Bytes frame;
  encode(frame, m);
  const std::string what = frame_name(type);
  FUZZ_CHECK(frame.size() >= kHeaderBytes, what + ": encoder wrote no header");
  FrameHeader h{};
  const std::string err = decode_header(Span(frame).first(kHeaderBytes), h);
  FUZZ_CHECK(err.empty(), what + ": re-encoded header does not decode: " + err);
  FUZZ_CHECK(h.type == static_cast<std::uint16_t>(type), what + ": re-encoded as type " + std::to_string(h.type));
  FUZZ_CHECK(h.payload_bytes == frame.size() - kHeaderBytes, what + ": header size disagrees with the payload");
  const Span again_bytes = Span(frame).subspan(kHeaderBytes);
  FUZZ_CHECK(std::equal(again_bytes.begin(), again_bytes.end(), payload.begin(), payload.end()),
             what + ": encode(decode(x)) != x; x = " + shardmix::fuzz::hex_prefix(payload.data(), payload.size()) +
                 ", re-encoded = " + shardmix::fuzz::hex_prefix(again_bytes.data(), again_bytes.size()));
  Message again;
  const std::string err2 = decode(again_bytes, again);
  FUZZ_CHECK(err2.empty(), what + ": re-encoded payload does not decode: " + err2);
  Bytes frame2;
  encode(frame2, again);
  FUZZ_CHECK(frame2 == frame, what + ": decode(encode(v)) != v");
}

template <typename Message>
bool try_decode(Span payload, FrameType type, Message& m) {
  const std::string err = decode(payload, m);
  if (!err.empty()) return false;
  check_round_trip(payload, m, type);
  return true;
}

// The checkpoint blob (Client::checkpoint(), StartEpoch's resume, files in
// resume.checkpoint_dir) is outside bytes too: same rules, one encoding per value.
void check_checkpoint(Span bytes) {
  Checkpoint c;
  if (!decode_checkpoint(bytes, c).empty()) return;
  FUZZ_CHECK(c.early.size() == c.late.size(), "checkpoint with unpaired exceptions accepted");
  FUZZ_CHECK(c.rank < c.world_size, "checkpoint with rank >= world size accepted");
  FUZZ_CHECK(c.late.empty() || c.late.back() < c.samples_consumed, "checkpoint with a late position too high accepted");
  const Bytes again = encode_checkpoint(c);
  FUZZ_CHECK(std::equal(again.begin(), again.end(), bytes.begin(), bytes.end()), "checkpoint: encode(decode(x)) != x");
}

void run_every_decoder(Span payload) {
  if (Hello m; try_decode(payload, FrameType::kHello, m)) {
    FUZZ_CHECK(m.trainer_rank < m.world_size, "hello with rank >= world size accepted");
  }
  if (Welcome m; try_decode(payload, FrameType::kWelcome, m)) {
  }
  if (ErrorFrame m; try_decode(payload, FrameType::kError, m)) {
    FUZZ_CHECK(m.message.size() + 6 == payload.size(), "error frame message length wrong");
  }
  if (StartEpoch m; try_decode(payload, FrameType::kStartEpoch, m)) {
    FUZZ_CHECK(m.resume.size() <= kMaxCheckpointBytes, "start-epoch resume blob over the limit accepted");
    check_checkpoint(m.resume);
  }
  check_checkpoint(payload);
  if (Release m; try_decode(payload, FrameType::kRelease, m)) {
  }
  if (EpochStats m; try_decode(payload, FrameType::kEpochEnd, m)) {
  }
  if (std::string text; decode_stats(payload, text).empty()) {
    FUZZ_CHECK(text.size() == payload.size() && text.find('\0') == std::string::npos, "stats text mangled");
    Bytes frame;
    encode_stats(frame, text);
    FUZZ_CHECK(frame.size() == kHeaderBytes + payload.size() &&
                   std::equal(payload.begin(), payload.end(), frame.begin() + kHeaderBytes),
               "stats frame: encode(decode(x)) != x");
  }
  if (CheckpointWelcome m; try_decode(payload, FrameType::kCheckpointWelcome, m)) {
  }
  if (CheckpointSave m; try_decode(payload, FrameType::kCheckpointSave, m)) {
    FUZZ_CHECK(m.name.size() <= kMaxCheckpointNameBytes, "checkpoint-save name over the limit accepted");
  }
  if (CheckpointRequest m; try_decode(payload, FrameType::kCheckpointLoad, m)) {
    FUZZ_CHECK(m.name.size() <= kMaxCheckpointNameBytes, "checkpoint request name over the limit accepted");
  }
  if (CheckpointReply m; try_decode(payload, FrameType::kCheckpointReply, m)) {
  }
  if (CheckpointLeaseGrant m; try_decode(payload, FrameType::kCheckpointLeaseGrant, m)) {
    // The trainer writes `size` bytes into the runs it maps: they must hold them.
    const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < m.run_lengths.size(); ++i) {
      FUZZ_CHECK(m.run_lengths[i] > 0 && m.run_lengths[i] % page == 0 && m.run_offsets[i] % page == 0,
                 "lease grant with a run that is not whole pages accepted");
      FUZZ_CHECK(m.run_lengths[i] <= ~std::uint64_t{0} - total, "lease grant whose runs overflow accepted");
      total += m.run_lengths[i];
    }
    FUZZ_CHECK(m.code != 0 || total >= m.size, "lease grant whose runs are shorter than the lease accepted");
  }
  if (CheckpointCommit m; try_decode(payload, FrameType::kCheckpointCommit, m)) {
  }
  if (CheckpointListing m; try_decode(payload, FrameType::kCheckpointListing, m)) {
    std::size_t total = 0;
    for (const std::uint32_t n : m.name_bytes) total += n;
    FUZZ_CHECK(total == m.names.size(), "checkpoint listing whose name lengths do not add up accepted");
  }
  if (BatchFrame m; try_decode(payload, FrameType::kBatch, m)) {
    FUZZ_CHECK(m.samples.size() <= kMaxBatchSamples, "batch over the sample limit accepted");
    FUZZ_CHECK(m.positions.size() == m.samples.size(), "batch without one plan position per sample accepted");
    for (const SampleDescriptor& s : m.samples) {
      FUZZ_CHECK(s.region <= static_cast<std::uint8_t>(Region::kStaging), "unknown region accepted");
      FUZZ_CHECK(s.tier <= static_cast<std::uint8_t>(Tier::kStorage), "unknown tier accepted");
      FUZZ_CHECK(s.offset + s.length >= s.offset, "descriptor whose end overflows accepted");
      FUZZ_CHECK((s.flags & ~kSampleSkipped) == 0, "unknown descriptor flag accepted");
      FUZZ_CHECK((s.flags & kSampleSkipped) == 0 || s.length == 0, "skipped sample with bytes accepted");
    }
  }
}

// The daemon reads exactly request_payload_bytes(type) after a request header; that must
// be what the client's encoders write, or real clients would be refused.
void check_request_sizes() {
  static bool done = false;
  if (done) return;
  done = true;
  auto payload_size = [](auto encode_one) {
    Bytes frame;
    encode_one(frame);
    return static_cast<std::int64_t>(frame.size() - kHeaderBytes);
  };
  FUZZ_CHECK(request_payload_bytes(FrameType::kHello) == payload_size([](Bytes& f) { encode(f, Hello{0, 1, 2}); }),
             "hello size");
  FUZZ_CHECK(request_payload_bytes(FrameType::kStartEpoch) ==
                 payload_size([](Bytes& f) { encode(f, StartEpoch{}); }),
             "start-epoch size");
  FUZZ_CHECK(request_payload_bytes(FrameType::kRelease) == payload_size([](Bytes& f) { encode(f, Release{}); }),
             "release size");
  FUZZ_CHECK(request_payload_bytes(FrameType::kGetCatalog) ==
                 payload_size([](Bytes& f) { encode_get_catalog(f); }),
             "get-catalog size");
  FUZZ_CHECK(request_payload_bytes(FrameType::kGetStats) == payload_size([](Bytes& f) { encode_get_stats(f); }),
             "get-stats size");
  FUZZ_CHECK(request_payload_bytes(FrameType::kCheckpointHello) ==
                 payload_size([](Bytes& f) { encode_checkpoint_hello(f, Hello{0, 1, 2}); }),
             "checkpoint-hello size");
  FUZZ_CHECK(request_payload_bytes(FrameType::kCheckpointSave) ==
                 payload_size([](Bytes& f) { encode(f, CheckpointSave{}); }),
             "checkpoint-save size without a name");
  FUZZ_CHECK(request_payload_bytes(FrameType::kCheckpointLease) ==
                 payload_size([](Bytes& f) { encode_checkpoint_lease(f, CheckpointSave{}); }),
             "checkpoint-lease size without a name");
  for (auto type : {FrameType::kCheckpointCommit, FrameType::kCheckpointAbandon}) {
    FUZZ_CHECK(request_payload_bytes(type) ==
                   payload_size([type](Bytes& f) { shardmix::proto::encode(f, type, CheckpointCommit{}); }),
               frame_name(type) + " size");
  }
  for (auto type : {FrameType::kCheckpointWaitDurable, FrameType::kCheckpointLoad, FrameType::kCheckpointList}) {
    FUZZ_CHECK(request_payload_bytes(type) ==
                   payload_size([type](Bytes& f) { shardmix::proto::encode(f, type, CheckpointRequest{}); }),
               frame_name(type) + " size without a name");
  }
  for (auto type : {FrameType::kWelcome, FrameType::kError, FrameType::kBatch, FrameType::kEpochEnd,
                    FrameType::kCatalog, FrameType::kStats, FrameType::kKeepalive, FrameType::kCheckpointWelcome,
                    FrameType::kCheckpointReply, FrameType::kCheckpointListing, FrameType::kCheckpointLeaseGrant}) {
    FUZZ_CHECK(request_payload_bytes(type) < 0, frame_name(type) + " is a reply, not a request");
  }
  // A keepalive is a bare header: the client rejects one with a payload.
  FUZZ_CHECK(payload_size([](Bytes& f) { encode_keepalive(f); }) == 0, "keepalive with a payload");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  check_request_sizes();
  const Span input(data, size);
  std::size_t pos = 0;
  for (int frames = 0; frames < 64; ++frames) {
    const Span rest = input.subspan(pos);
    const Span header_bytes = rest.first(std::min(kHeaderBytes, rest.size()));
    FrameHeader h{};
    const std::string err = decode_header(header_bytes, h);
    check_header(header_bytes, err, h);
    if (rest.size() > kHeaderBytes) {
      FrameHeader ignored{};
      FUZZ_CHECK(!decode_header(rest.first(kHeaderBytes + 1), ignored).empty(), "a 17-byte header decoded");
    }
    Span payload = rest.subspan(header_bytes.size());
    if (err.empty()) payload = payload.first(std::min<std::size_t>(h.payload_bytes, payload.size()));
    run_every_decoder(payload);
    if (!err.empty() || h.payload_bytes >= rest.size() - kHeaderBytes) break;  // bad frame, or the last one
    pos += kHeaderBytes + h.payload_bytes;
  }
  return 0;
}

namespace shardmix::fuzz {

Seeds seeds() {
  Seeds out;
  auto add = [&](std::string name, auto encode_into) {
    Bytes frame;
    encode_into(frame);
    out.emplace_back(std::move(name), std::move(frame));
  };
  add("hello", [](Bytes& f) { encode(f, Hello{3, 8, 4242}); });
  add("welcome", [](Bytes& f) { encode(f, Welcome{1, 4, 2, 4, 1000, 16, 125, 1 << 20, 1 << 16}); });
  add("error", [](Bytes& f) { encode(f, ErrorFrame{6, "trainer world size 3 does not match"}); });
  add("start-epoch", [](Bytes& f) { encode(f, StartEpoch{2, 5, {}}); });
  add("start-epoch-resume", [](Bytes& f) {
    encode(f, StartEpoch{2, 5, encode_checkpoint(shardmix::test_support::sample_checkpoint())});
  });
  add("release", [](Bytes& f) { encode(f, Release{2, 5, 7}); });
  add("get-catalog", [](Bytes& f) { encode_get_catalog(f); });
  add("get-stats", [](Bytes& f) { encode_get_stats(f); });
  add("keepalive", [](Bytes& f) { encode_keepalive(f); });
  add("checkpoint-requests", [](Bytes& f) {
    encode_checkpoint_hello(f, Hello{0, 2, 1});
    encode(f, CheckpointSave{1, 4096, "rank0"});
    shardmix::proto::encode(f, FrameType::kCheckpointWaitDurable, CheckpointRequest{2, "rank0"});
    shardmix::proto::encode(f, FrameType::kCheckpointList, CheckpointRequest{3, {}});
  });
  add("checkpoint-replies", [](Bytes& f) {
    encode(f, CheckpointWelcome{0, 2, 1 << 30, 0});
    encode(f, CheckpointReply{1, 0, 1, 4096, {}});
    encode(f, CheckpointReply{2, 3, 0, 0, "writing checkpoint rank0@1 to /ckpt: No space left on device"});
    encode(f, CheckpointListing{3, {2, 1}, {5, 5}, "rank0rank1"});
  });
  add("stats", [](Bytes& f) { encode_stats(f, "# TYPE shardmix_samples_total counter\nshardmix_samples_total 42\n"); });
  add("catalog", [](Bytes& f) {
    const std::uint8_t bytes[] = {'S', 'M', 'X', 'C', 'A', 'T', 0, 1, 0, 0, 0, 0};
    encode_catalog(f, bytes);
  });
  add("epoch-end", [](Bytes& f) {
    encode(f, EpochStats{.epoch = 1, .stream = 2, .batches = 3, .samples = 24, .bytes = 1 << 20, .local_samples = 10,
                         .peer_samples = 14, .peer_bytes = 600000, .fetch_wait_us = 1234, .unreadable_samples = 2});
  });
  add("batch", [](Bytes& f) {
    BatchFrame b{.epoch = 1, .stream = 2, .batch = 3};
    b.samples.push_back(SampleDescriptor{17, 4, 0, 0, 0, 0, 4096, 112 * 1024});
    b.samples.push_back(SampleDescriptor{99, 0, 1, 1, 1, 0, 0, 1});
    b.samples.push_back(SampleDescriptor{5, 7, 2, 1, 2, 0, 1 << 20, 0});
    b.samples.push_back(SampleDescriptor{8, 3, 1, 1, 2, kSampleSkipped, 0, 0});
    b.positions = {24, 31, 27, 30};
    encode(f, b);
  });
  add("empty-batch", [](Bytes& f) { encode(f, BatchFrame{4, 2, 9, {}, {}}); });
  // One connection's requests back to back, and a reply sequence.
  add("request-stream", [](Bytes& f) {
    encode(f, Hello{0, 2, 1});
    encode_get_catalog(f);
    encode(f, StartEpoch{0, 1, {}});
    encode(f, Release{0, 1, 0});
  });
  add("reply-stream", [](Bytes& f) {
    encode(f, Welcome{0, 2, 1, 4, 10, 2, 5, 4096, 4096});
    encode(f, BatchFrame{0, 1, 0, {SampleDescriptor{1, 1, 0, 0, 0, 0, 0, 64}}, {0}});
    encode(f, EpochStats{});
  });
  return out;
}

}  // namespace shardmix::fuzz
