// The sample-journey trace (telemetry.trace_dir, docs/telemetry.md, decision 0052): every
// daemon and every trainer process records what each batch went through (a trainer's wait
// and hold, a daemon's planning, peer reads, storage reads, staging waits, epoch
// boundaries, two counters; model checkpoints' saves and drains) and writes one Chrome trace-event JSON file at exit, which
// Perfetto and chrome://tracing open; `shardmix-trace merge` joins the files of a job.
//
// Recording is cheap by construction: each thread appends fixed-size POD events to its
// own buffer (chunks of kChunkEvents, never moved, so the writer may read them while the
// thread records; the only allocation is a new chunk every kChunkEvents events). No lock,
// no formatting, no string on the hot path; JSON is made at write time. Timestamps are
// CLOCK_REALTIME nanoseconds, one clock for every process on a node (and NTP-aligned
// across nodes), written relative to a whole second the file records, so the merge aligns
// files exactly, by integer arithmetic.
//
// Bounded memory: Settings::sample_fraction keeps a deterministic subset of batches, decided
// by a hash of (epoch, trainer rank, batch index) alone, so the daemon's and the trainer's
// sides of a batch are kept or dropped together; Settings::max_events_per_thread caps each
// thread's buffer, and the first event over the cap prints one warning and is counted in
// the file's "dropped_events".
//
// Trace points call the free functions below (one line each); when tracing is off they
// cost one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string_view>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace shardmix::trace {

enum class What : std::uint16_t {
  kWaitBatch,      // trainer: from asking for the next batch until it arrived
  kHoldBatch,      // trainer: from receiving a batch until releasing it (followed by kIds)
  kIds,            // continuation of the event before it: up to kArgs sample ids
  kPlanEpoch,      // daemon, per trainer slot: computing a trainer's plan of an epoch
  kEpochStart,     // daemon, per trainer slot: a pass over an epoch began (instant)
  kEpochEnd,       // daemon, per trainer slot: the pass's last batch went out (instant)
  kStagingWait,    // daemon, per trainer slot: a planned batch waited for staging bytes
  kPeerRead,       // daemon: one vectored read of a peer's arena, post to completion
  kStorageRead,    // daemon: one cold sample read from storage by a storage reader
  kStagedBytes,    // daemon counter, per trainer slot: staging bytes in use
  kReadsInFlight,  // daemon counter, per peer: reads posted and not yet completed
  kCheckpointSave,   // trainer: one model checkpoint save, from the call to the daemon's reply
  kCheckpointDrain,  // daemon: one checkpoint version written to checkpoint.dir (drain or write-through)
};

// Which batch an event belongs to: the sampling key, the same on both sides.
struct Key {
  std::uint64_t epoch = 0;
  std::uint64_t trainer = 0;  // global trainer rank
  std::uint64_t batch = 0;    // batch index within the epoch (as frames number it)
  bool always = false;        // not a per-batch event (planning, epoch boundaries): never sampled out
};
inline constexpr Key kAlways{0, 0, 0, true};

inline constexpr std::size_t kArgs = 5;
// The largest per-thread cap (telemetry.trace_max_events' limit): its chunk table stays 2 MiB.
inline constexpr std::uint64_t kMaxEventsPerThread = std::uint64_t{1} << 30;
struct Event {
  std::int64_t begin_ns = 0;  // CLOCK_REALTIME
  std::int64_t end_ns = 0;    // == begin_ns for instants and counters
  What what = What::kIds;
  std::uint16_t count = 0;    // kIds: how many of args are ids
  std::uint32_t track = 0;    // trainer slot, peer rank, ... (per What)
  std::uint64_t args[kArgs] = {};
};
static_assert(sizeof(Event) == 64);

struct Settings {
  std::string path;                  // the JSON file to write
  std::string process_name;          // "daemon 3", "trainer 12 (node 3)"
  std::uint32_t pid = 0;             // the file's Chrome pid: unique within a job (daemon_pid, trainer_pid)
  std::string role;                  // "daemon" or "trainer"
  std::uint32_t node = 0;
  double sample_fraction = 1.0;      // telemetry.trace_sample_fraction
  std::uint64_t max_events_per_thread = 1 << 20;  // telemetry.trace_max_events
  std::uint32_t peers = 0;           // daemons in the job (reads-in-flight counters)
  // CLOCK_REALTIME nanoseconds that the file's timestamps count from (a whole second;
  // written as otherData.clock_origin_ns). 0: the current second. Small timestamps keep
  // their nanosecond digits in a JSON reader's doubles, which absolute ones (1.7e15 us)
  // would round to a quarter microsecond.
  std::int64_t origin_ns = 0;
};
// The Chrome pids of a job's processes: daemons first, then trainers, never equal.
inline std::uint32_t daemon_pid(std::uint32_t node) { return 1 + node; }
inline std::uint32_t trainer_pid(std::uint32_t rank) { return 1'000'000 + rank; }

// Whether `key`'s batch is kept under `fraction` (a pure function of the key).
bool keep(const Key& key, double fraction);

class Recorder {
 public:
  static constexpr std::size_t kChunkEvents = 4096;
  explicit Recorder(Settings settings);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  ~Recorder();

  const Settings& settings() const { return settings_; }
  bool keeps(const Key& key) const { return key.always || keep(key, settings_.sample_fraction); }
  // Appends `first` and `rest` to the calling thread's buffer, all or none (a hold and its
  // ids stay together). False when the thread's cap is reached.
  bool record(const Event& first, const Event* rest = nullptr, std::size_t rest_count = 0);
  // Adds `delta` to counter `track` of kReadsInFlight and returns the new value.
  std::int64_t add_in_flight(std::uint32_t peer, std::int64_t delta);
  std::uint64_t dropped_events() const { return dropped_.load(std::memory_order_relaxed); }
  std::uint64_t recorded_events() const;
  // The Chrome trace-event JSON of everything recorded so far (any thread may still record).
  std::string to_json() const;
  // Writes to_json() to settings().path atomically (temp file + rename), unless nothing
  // was recorded since the last write. Not to be called from two threads at once.
  Status write() const;

 private:
  struct ThreadBuffer;
  ThreadBuffer* buffer_of_this_thread();

  Settings settings_;
  std::uint64_t serial_;  // tells a thread's cached buffer of another recorder from ours
  mutable std::mutex registry_mutex_;  // guards buffers_ (taken once per thread, and to write)
  std::vector<std::unique_ptr<ThreadBuffer>> buffers_;
  std::unique_ptr<std::atomic<std::int64_t>[]> in_flight_;
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<bool> warned_{false};
  mutable std::optional<std::uint64_t> written_;  // events + drops at the last write (write() is not concurrent)
};

// ---- the process's recorder, used by the trace points ----

namespace detail {
extern std::atomic<Recorder*> g_recorder;
}
// Starts recording for this process (once; a second call with the same path is a no-op,
// with another path an error). The recorder lives until exit, which writes it too.
Status enable(Settings settings);
inline Recorder* recorder() { return detail::g_recorder.load(std::memory_order_relaxed); }
inline bool on() { return recorder() != nullptr; }
// Writes the process's trace now (e.g. at shutdown); ok when tracing is off.
Status write();

std::int64_t now_ns();
// The trace keys the daemons publish in RUN_DIR/ready (how trainers learn them), and
// their reading back: nullopt when tracing is off; an error names the bad line.
std::string ready_lines(std::string_view dir, double sample_fraction, std::uint64_t max_events);
struct ReadyTrace {
  std::string dir;
  double sample_fraction = 1.0;
  std::uint64_t max_events = 0;
};
Result<std::optional<ReadyTrace>> parse_ready(const std::map<std::string, std::string>& ready);

// A start time for a span: now when tracing, else 0 (no clock read).
inline std::int64_t start() { return on() ? now_ns() : 0; }

// The batch whose reads the calling thread posts now (set by the scheduler around its
// posts; read by the fetchers, which run on the same thread).
Key current_key();
class KeyScope {
 public:
  explicit KeyScope(const Key& key);
  ~KeyScope();
  KeyScope(const KeyScope&) = delete;
  KeyScope& operator=(const KeyScope&) = delete;

 private:
  Key saved_;
};

// [begin_ns, now] on `track`.
void span(What what, std::uint32_t track, std::int64_t begin_ns, const Key& key,
          std::initializer_list<std::uint64_t> args);
void instant(What what, std::uint32_t track, const Key& key, std::initializer_list<std::uint64_t> args);
void counter(What what, std::uint32_t track, std::int64_t value, const Key& key);

// A trainer's hold of a batch, with the ids of its samples (id(i) for i < n).
template <typename IdOf>
void hold(std::int64_t begin_ns, const Key& key, std::size_t n, IdOf id_of) {
  Recorder* r = recorder();
  if (r == nullptr || begin_ns == 0 || !r->keeps(key)) return;
  constexpr std::size_t kMaxIdEvents = 64;  // ids of up to 320 samples a batch, the rest cut
  Event first{begin_ns, now_ns(), What::kHoldBatch, 0, 0, {key.epoch, key.batch, n, 0, 0}};
  Event ids[kMaxIdEvents];
  std::size_t events = 0;
  for (std::size_t i = 0; i < n && events < kMaxIdEvents; ++events) {
    Event& e = ids[events];
    e = Event{first.begin_ns, first.begin_ns, What::kIds, 0, 0, {}};
    for (; i < n && e.count < kArgs; ++i) e.args[e.count++] = id_of(i);
  }
  r->record(first, ids, events);
}

// A read posted now and completed later, on another thread: the post's time and key, and
// one more read in flight for `peer`.
struct PendingRead {
  std::int64_t begin_ns = 0;
  Key key;
};
PendingRead begin_read(std::uint32_t peer);
void end_read(const PendingRead& pending, std::uint32_t peer, std::uint64_t bytes, std::uint64_t samples);

// An interval opened on one call and closed on a later one (a wait for staging bytes).
class Interval {
 public:
  void open() {
    if (begin_ns_ == 0) begin_ns_ = start();
  }
  void close(What what, std::uint32_t track, const Key& key, std::initializer_list<std::uint64_t> args) {
    if (begin_ns_ == 0) return;
    span(what, track, begin_ns_, key, args);
    begin_ns_ = 0;
  }

 private:
  std::int64_t begin_ns_ = 0;
};

}  // namespace shardmix::trace
