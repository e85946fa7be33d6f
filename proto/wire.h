// Every byte layout that crosses the trainer <-> daemon boundary (Unix socket).
//
// A frame is a fixed 16-byte header followed by `payload_bytes` of payload:
//   magic u32 "SMX1" | version u16 | type u16 | payload_bytes u32 | reserved u32
// `reserved` is 0, except in a Hello, where it carries the job token (set_hello_job_token).
// Integers are little-endian (both ends run on the same host, but the layout is pinned
// anyway so a fuzzer and a reader of a capture agree). Each payload's fields are listed
// once, in its struct's fields() (proto/field_codec.h): the encoder, the bounds-checking
// decoder and the size all walk that list, so a malformed frame is a Status, never UB.
// Version policy: any change to a layout bumps kProtocolVersion; the daemon refuses other
// versions in the Hello with an Error frame naming both versions.
//
// Batch payloads carry offsets into shared regions, never pointers: region 0 is the
// node's cache arena (memfd, mapped read-only by the client), region 1 the trainer's
// staging area (memfd). Both fds are passed once with SCM_RIGHTS alongside the Welcome.
// Thread-safety: pure functions and value types.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "proto/checkpoint.h"
#include "proto/field_codec.h"

namespace shardmix::proto {

inline constexpr std::uint32_t kMagic = 0x31584d53;  // "SMX1" little-endian
inline constexpr std::uint16_t kProtocolVersion = 9;  // 2: stream ids on epoch frames; 3: quality figures;
                                                      // 4: trainer wait in Release, GetStats/Stats;
                                                      // 5: checkpoint/resume (plan identity in Welcome,
                                                      //    resume blob in StartEpoch, plan positions in Batch)
                                                      // 6: Keepalive
                                                      // 7: unreadable samples skipped (descriptor flag, EpochStats)
                                                      // 8: model checkpoint connections (kCheckpointHello ..)
                                                      // 9: checkpoint leases (kCheckpointLease ..)
// A daemon sends a Keepalive to a trainer it has sent nothing else for this long, so that a
// trainer can tell a daemon with nothing ready yet (slow storage, a peer's reads) from a
// stopped or hung one (decision 0036) with a short receive timeout.
inline constexpr std::chrono::milliseconds kKeepaliveInterval{1000};
// Upper bound on any payload we accept; the catalog frame is the largest.
inline constexpr std::uint32_t kMaxPayloadBytes = 1u << 30;
inline constexpr std::uint32_t kMaxBatchSamples = 1u << 20;

enum class FrameType : std::uint16_t {
  kHello = 1,        // client -> daemon: who I am
  kWelcome = 2,      // daemon -> client: job shape, region sizes (+ 2 fds)
  kError = 3,        // daemon -> client: a Status; the daemon then closes the connection
  kStartEpoch = 4,   // client -> daemon: begin streaming batches of an epoch
  kBatch = 5,        // daemon -> client: one ready batch
  kRelease = 6,      // client -> daemon: a batch's slots may be reused
  kEpochEnd = 7,     // daemon -> client: no more batches this epoch, with statistics
  kGetCatalog = 8,   // client -> daemon
  kCatalog = 9,      // daemon -> client: serialised catalog
  kGetStats = 10,    // client -> daemon: the daemon's counters (allowed before a Hello)
  kStats = 11,       // daemon -> client: Prometheus text exposition of those counters
  kKeepalive = 12,   // daemon -> client: no payload; "still here" after kKeepaliveInterval of silence
  // Model checkpoints (docs/decisions/0056): only on a connection whose first frame is a
  // CheckpointHello, never on a trainer's batch connection, so the batch stream and its
  // exactly-once bookkeeping never see them.
  kCheckpointHello = 13,        // client -> daemon: a Hello payload (job token in `reserved`)
  kCheckpointWelcome = 14,      // daemon -> client: the node's checkpoint settings
  kCheckpointSave = 15,         // client -> daemon: CheckpointSave + one sealed memfd (SCM_RIGHTS)
  kCheckpointWaitDurable = 16,  // client -> daemon: CheckpointRequest
  kCheckpointLoad = 17,         // client -> daemon: CheckpointRequest
  kCheckpointList = 18,         // client -> daemon: CheckpointRequest (empty name)
  kCheckpointReply = 19,        // daemon -> client: a request's outcome (+ a sealed memfd for a load)
  kCheckpointListing = 20,      // daemon -> client: the reply to a CheckpointList
  // A lease (docs/decisions/0069): the trainer writes a checkpoint straight into memory of
  // the daemon's checkpoint pool, then commits it, and the daemon saves it without a copy.
  kCheckpointLease = 21,       // client -> daemon: CheckpointSave (no memfd; length: the bytes to lease)
  kCheckpointLeaseGrant = 22,  // daemon -> client: CheckpointLeaseGrant (+ the memfd to map, when granted)
  kCheckpointCommit = 23,      // client -> daemon: CheckpointCommit; a CheckpointReply as for a save
  kCheckpointAbandon = 24,     // client -> daemon: CheckpointCommit (length 0); a CheckpointReply
};
inline constexpr FrameType kLastFrameType = FrameType::kCheckpointAbandon;

struct FrameHeader {
  std::uint32_t magic;
  std::uint16_t version, type;
  std::uint32_t payload_bytes, reserved;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("magic", m.magic), visit("version", m.version), visit("type", m.type);
    visit("payload_bytes", m.payload_bytes), visit("reserved", m.reserved);
  }
};
static_assert(sizeof(FrameHeader) == 16 && std::is_trivially_copyable_v<FrameHeader>);

enum class Region : std::uint8_t { kArena = 0, kStaging = 1 };
enum class Tier : std::uint8_t { kLocal = 0, kPeer = 1, kStorage = 2 };
std::string_view tier_name(Tier tier);

// One sample of a batch: where its bytes are in the shared regions.
struct SampleDescriptor {
  std::uint32_t sample_id;
  std::int32_t label;
  std::uint32_t owner;      // node whose cache served it
  std::uint8_t region;      // Region
  std::uint8_t tier;        // Tier
  std::uint16_t flags;      // kSampleSkipped, or 0
  std::uint64_t offset;     // into the region
  std::uint64_t length;
};
// The sample's bytes could not be read (dataset.strict = false): it holds its planned
// position in the batch so the client's bookkeeping stays exact, but has no bytes
// (offset and length 0) and is not handed to the trainer as a sample.
inline constexpr std::uint16_t kSampleSkipped = 1;
static_assert(sizeof(SampleDescriptor) == 32 && std::is_trivially_copyable_v<SampleDescriptor>);

struct Hello {
  std::uint32_t trainer_rank = 0, world_size = 0, pid = 0;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("trainer_rank", m.trainer_rank), visit("world_size", m.world_size), visit("pid", m.pid);
  }
};

struct Welcome {
  std::uint32_t node = 0, nodes = 0, trainers_per_node = 0, prefetch = 0;
  std::uint64_t num_samples = 0;
  std::uint64_t batches_per_epoch = 0;     // per trainer, every epoch
  std::uint64_t samples_this_trainer = 0;  // per epoch
  std::uint64_t arena_bytes = 0, staging_bytes = 0;
  // Plan identity, copied into checkpoints (proto/checkpoint.h).
  std::uint64_t plan_digest = 0, seed = 0;
  std::uint32_t batch_size = 0;
  std::uint32_t drop_last = 0;  // 0 or 1
  std::uint32_t window = 0;
  // The epoch the daemons re-dealt from resume.checkpoint_dir (kNoResumedEpoch: none),
  // its plan digest and this trainer's batch count in it.
  std::uint64_t resumed_epoch = 0, resumed_digest = 0, resumed_batches = 0;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("node", m.node), visit("nodes", m.nodes), visit("trainers_per_node", m.trainers_per_node);
    visit("prefetch", m.prefetch), visit("num_samples", m.num_samples);
    visit("batches_per_epoch", m.batches_per_epoch), visit("samples_this_trainer", m.samples_this_trainer);
    visit("arena_bytes", m.arena_bytes), visit("staging_bytes", m.staging_bytes);
    visit("plan_digest", m.plan_digest), visit("seed", m.seed), visit("batch_size", m.batch_size);
    visit("drop_last", m.drop_last), visit("window", m.window);
    visit("resumed_epoch", m.resumed_epoch), visit("resumed_digest", m.resumed_digest);
    visit("resumed_batches", m.resumed_batches);
  }
};
inline constexpr std::uint64_t kNoResumedEpoch = ~std::uint64_t{0};

struct ErrorFrame {
  std::uint16_t code = 0;  // StatusCode
  std::string message;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("code", m.code), visit("message", counted(~std::uint32_t{0}, m.message));
  }
};

// Every StartEpoch carries a stream id chosen by the client (increasing per connection).
// Batches, releases and the epoch end carry it back, so frames of an abandoned pass over
// an epoch are never taken for a new pass over the same epoch.
// `resume`: empty, or a checkpoint blob (proto/checkpoint.h, at most kMaxCheckpointBytes)
// to continue the pass from: the daemon delivers exactly the samples it says were not
// delivered yet.
struct StartEpoch {
  std::uint64_t epoch = 0, stream = 0;
  std::vector<std::uint8_t> resume;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("epoch", m.epoch), visit("stream", m.stream);
    visit("resume", counted(kMaxCheckpointBytes, m.resume));
  }
};

struct BatchFrame {
  std::uint64_t epoch = 0;
  std::uint64_t stream = 0;
  std::uint64_t batch = 0;   // index within the epoch
  std::vector<SampleDescriptor> samples;
  // Planned position of each sample in this trainer's order for the epoch (same length
  // as samples): lets the client checkpoint exactly under shuffle.window > 0.
  std::vector<std::uint64_t> positions;

  // One count for both lists: a frame built without positions carries zeros.
  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("epoch", m.epoch), visit("stream", m.stream), visit("batch", m.batch);
    visit("samples", counted(kMaxBatchSamples, m.samples, m.positions));
  }
};

struct Release {
  std::uint64_t epoch = 0;
  std::uint64_t stream = 0;
  std::uint64_t batch = 0;
  // How long the trainer waited for this batch (microseconds): from asking for it (the
  // epoch's start, or releasing the previous batch) until it was in hand. The daemon sums
  // it into the trainer stall time of its telemetry.
  std::uint64_t wait_us = 0;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("epoch", m.epoch), visit("stream", m.stream), visit("batch", m.batch), visit("wait_us", m.wait_us);
  }
};

struct EpochStats {
  std::uint64_t epoch = 0, stream = 0;
  std::uint64_t batches = 0, samples = 0, bytes = 0;
  // Where the samples came from (tier), and the bytes read from peers.
  std::uint64_t local_samples = 0, peer_samples = 0, storage_samples = 0, peer_bytes = 0;
  std::uint64_t fetch_wait_us = 0;   // sum over fetches (per batch; per batch and owner with a window) of post-to-landing time
  // shuffle.window at work: samples delivered in another batch than planned.
  std::uint64_t substituted_samples = 0;
  // Samples skipped because their bytes could not be read (dataset.strict = false); not in
  // `samples`. samples + unreadable_samples = the planned samples of the pass.
  std::uint64_t unreadable_samples = 0;
  // The trade-off actually made this epoch (shuffle.min_entropy may lower Q per epoch).
  double exchange_fraction = 0;
  std::uint32_t window = 0;
  // Shuffle quality of what this trainer received (docs/shuffle-quality.md); NaN when
  // there is nothing to score.
  std::uint64_t batches_scored = 0;  // batches with >= 2 samples and >= 2 possible classes
  double label_entropy_mean = 0;
  double label_entropy_p5 = 0;
  double affinity = 0;               // share of this epoch's samples also received last epoch

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("epoch", m.epoch), visit("stream", m.stream), visit("batches", m.batches), visit("samples", m.samples);
    visit("bytes", m.bytes), visit("local_samples", m.local_samples), visit("peer_samples", m.peer_samples);
    visit("storage_samples", m.storage_samples), visit("peer_bytes", m.peer_bytes);
    visit("fetch_wait_us", m.fetch_wait_us), visit("substituted_samples", m.substituted_samples);
    visit("unreadable_samples", m.unreadable_samples), visit("exchange_fraction", m.exchange_fraction);
    visit("window", m.window), visit("batches_scored", m.batches_scored);
    visit("label_entropy_mean", m.label_entropy_mean), visit("label_entropy_p5", m.label_entropy_p5);
    visit("affinity", m.affinity);
  }
};

// Longest checkpoint name a frame carries (common/checkpoint_file.h validates names).
inline constexpr std::uint32_t kMaxCheckpointNameBytes = 200;
// Most versions a listing carries.
inline constexpr std::uint32_t kMaxCheckpointListing = 1u << 20;

struct CheckpointWelcome {
  std::uint32_t node = 0;
  std::uint32_t retain = 0;              // checkpoint.retain
  std::uint64_t capacity_bytes = 0;      // checkpoint.capacity
  std::uint32_t replication = 0;         // 1: a save returns once a peer holds a copy; 0: once in this node's RAM

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("node", m.node), visit("retain", m.retain), visit("capacity_bytes", m.capacity_bytes);
    visit("replication", m.replication);
  }
};

// `request` is chosen by the client and comes back in the reply. The save's bytes are the
// memfd sent with this frame's payload; `length` is what the trainer wrote (the daemon
// checks the memfd against it).
struct CheckpointSave {
  std::uint64_t request = 0, length = 0;
  std::string name;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request), visit("length", m.length), visit("name", counted(kMaxCheckpointNameBytes, m.name));
  }
};

struct CheckpointRequest {
  std::uint64_t request = 0;
  std::string name;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request), visit("name", counted(kMaxCheckpointNameBytes, m.name));
  }
};

// code 0: done (version and length of what was saved, made durable or loaded); else a
// StatusCode and the daemon's message naming the checkpoint (and checkpoint.dir).
struct CheckpointReply {
  std::uint64_t request = 0;
  std::uint16_t code = 0;
  std::uint64_t version = 0, length = 0;
  std::string message;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request), visit("code", m.code), visit("version", m.version), visit("length", m.length);
    visit("message", counted(~std::uint32_t{0}, m.message));
  }
};

// Most runs a lease's memory comes in (a pool's chunks, consecutive ones merged).
inline constexpr std::uint32_t kMaxCheckpointLeaseRuns = 1u << 20;

// code 0: lease `lease` of `size` bytes, which are the runs (run_offsets[i], run_lengths[i]
// bytes, whole pages) of the memfd sent with this frame, placed side by side; the trainer
// maps them, closes the memfd and writes. Else a StatusCode and the daemon's message.
struct CheckpointLeaseGrant {
  std::uint64_t request = 0;
  std::uint16_t code = 0;
  std::uint64_t lease = 0, size = 0;
  std::vector<std::uint64_t> run_offsets, run_lengths;
  std::string message;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request), visit("code", m.code), visit("lease", m.lease), visit("size", m.size);
    visit("runs", counted(kMaxCheckpointLeaseRuns, m.run_offsets, m.run_lengths));
    visit("message", counted(~std::uint32_t{0}, m.message));
  }
};

// Commit: the first `length` bytes of lease `lease` are the next version of the name it
// was granted for (the trainer has unmapped them). Abandon: the lease goes back unsaved.
struct CheckpointCommit {
  std::uint64_t request = 0, lease = 0, length = 0;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request), visit("lease", m.lease), visit("length", m.length);
  }
};

// Every listed version: names[i] is the next name_bytes[i] bytes of `names`.
struct CheckpointListing {
  std::uint64_t request = 0;
  std::vector<std::uint64_t> versions;
  std::vector<std::uint32_t> name_bytes;
  std::string names;

  template <typename Self, typename Visit>
  static void fields(Self& m, Visit&& visit) {
    visit("request", m.request), visit("versions", counted(kMaxCheckpointListing, m.versions, m.name_bytes));
    visit("names", counted(kMaxCheckpointListing * kMaxCheckpointNameBytes, m.names));
  }
};

// Exact payload size of a request frame type (the walked size of its fields), checked
// before its payload is read, so a header cannot make the daemon allocate more than a
// request needs. -1 for types that
// are never requests (daemon -> client only). StartEpoch is the one request of variable
// size: this is its size without a resume blob, request_payload_max_bytes its largest.
std::int64_t request_payload_bytes(FrameType type);
std::int64_t request_payload_max_bytes(FrameType type);

// Encoding: appends a whole frame (header + payload) to `out`.
void encode(std::vector<std::uint8_t>& out, const Hello& m);
void encode(std::vector<std::uint8_t>& out, const Welcome& m);
void encode(std::vector<std::uint8_t>& out, const ErrorFrame& m);
void encode(std::vector<std::uint8_t>& out, const StartEpoch& m);
void encode(std::vector<std::uint8_t>& out, const BatchFrame& m);
void encode(std::vector<std::uint8_t>& out, const Release& m);
void encode(std::vector<std::uint8_t>& out, const EpochStats& m);
void encode_get_catalog(std::vector<std::uint8_t>& out);
void encode_catalog(std::vector<std::uint8_t>& out, std::span<const std::uint8_t> catalog);
// The same without a copy: `frame` holds sizeof(FrameHeader) bytes of room, then the
// serialized catalog (Catalog::serialize(sizeof(FrameHeader))); this writes the header.
void finish_catalog_frame(std::vector<std::uint8_t>& frame);
void encode_get_stats(std::vector<std::uint8_t>& out);
void encode_keepalive(std::vector<std::uint8_t>& out);
void encode_stats(std::vector<std::uint8_t>& out, std::string_view text);
void encode_checkpoint_hello(std::vector<std::uint8_t>& out, const Hello& m);
void encode(std::vector<std::uint8_t>& out, const CheckpointWelcome& m);
void encode(std::vector<std::uint8_t>& out, const CheckpointSave& m);
// `type`: kCheckpointWaitDurable, kCheckpointLoad or kCheckpointList.
void encode(std::vector<std::uint8_t>& out, FrameType type, const CheckpointRequest& m);
void encode(std::vector<std::uint8_t>& out, const CheckpointReply& m);
void encode(std::vector<std::uint8_t>& out, const CheckpointListing& m);
// kCheckpointLease carries a CheckpointSave payload.
void encode_checkpoint_lease(std::vector<std::uint8_t>& out, const CheckpointSave& m);
void encode(std::vector<std::uint8_t>& out, const CheckpointLeaseGrant& m);
// `type`: kCheckpointCommit or kCheckpointAbandon.
void encode(std::vector<std::uint8_t>& out, FrameType type, const CheckpointCommit& m);
// The job token (common/job_token.h, docs/decisions/0024) travels in the Hello frame's
// header `reserved` field, so the Hello payload layout is unchanged (0 = no token).
// Sets it in an encoded frame that starts at `frame[0]` (a Hello from encode()).
void set_hello_job_token(std::vector<std::uint8_t>& frame, std::uint32_t token);

// Decoding. Each returns an empty string on success, else what was wrong, with the byte
// offset ("batch frame: field 'samples' needs 360 bytes at offset 28, payload has 100").
std::string decode_header(std::span<const std::uint8_t> bytes, FrameHeader& out);
std::string decode(std::span<const std::uint8_t> payload, Hello& out);
std::string decode(std::span<const std::uint8_t> payload, Welcome& out);
std::string decode(std::span<const std::uint8_t> payload, ErrorFrame& out);
std::string decode(std::span<const std::uint8_t> payload, StartEpoch& out);
std::string decode(std::span<const std::uint8_t> payload, BatchFrame& out);
std::string decode(std::span<const std::uint8_t> payload, Release& out);
std::string decode(std::span<const std::uint8_t> payload, EpochStats& out);
std::string decode(std::span<const std::uint8_t> payload, CheckpointWelcome& out);
std::string decode(std::span<const std::uint8_t> payload, CheckpointSave& out);
std::string decode(std::span<const std::uint8_t> payload, CheckpointRequest& out);
std::string decode(std::span<const std::uint8_t> payload, CheckpointReply& out);
// Also checks that every run is a whole number of pages and that they add up to at least `size`.
std::string decode(std::span<const std::uint8_t> payload, CheckpointLeaseGrant& out);
std::string decode(std::span<const std::uint8_t> payload, CheckpointCommit& out);
// Also checks that the name lengths add up to the names' bytes.
std::string decode(std::span<const std::uint8_t> payload, CheckpointListing& out);
// kStats: the payload is UTF-8 text; checks only that it holds no NUL byte.
std::string decode_stats(std::span<const std::uint8_t> payload, std::string& out);

}  // namespace shardmix::proto
