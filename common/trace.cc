#include "common/trace.h"

#include "common/atomic_file.h"
#include "common/json_text.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

namespace shardmix::trace {
namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::atomic<std::uint64_t> g_next_serial{1};

// The calling thread's buffer of one recorder (by serial, so a buffer of a destroyed
// recorder at the same address is never reused).
struct ThreadCache {
  std::uint64_t serial = 0;
  void* buffer = nullptr;
};
thread_local ThreadCache t_cache;
thread_local Key t_key{0, 0, 0, true};

// Microseconds with nanosecond digits, as Chrome's "ts" and "dur" want them.
void append(fmt::memory_buffer& out, std::string_view text) { out.append(text.data(), text.data() + text.size()); }

void append_us(fmt::memory_buffer& out, std::int64_t ns) {
  const char* sign = ns < 0 ? "-" : "";
  const std::uint64_t a = static_cast<std::uint64_t>(ns < 0 ? -ns : ns);
  fmt::format_to(std::back_inserter(out), "{}{}.{:03}", sign, a / 1000, a % 1000);
}

// Chrome thread ids of the logical tracks (tid 0 stays unused: some viewers hide it).
constexpr std::uint32_t kTidTrainerBatches = 1;
constexpr std::uint32_t kTidPeerReads = 2;  // the async peer-read tracks hang off it
constexpr std::uint32_t kTidCheckpoints = 3;  // a trainer's saves; a daemon's drain
std::uint32_t tid_plan(std::uint32_t slot) { return 100 + 2 * slot; }
std::uint32_t tid_staging(std::uint32_t slot) { return 101 + 2 * slot; }
std::uint32_t tid_storage(std::size_t reader) { return 10000 + static_cast<std::uint32_t>(reader); }

Settings with_origin(Settings s) {
  if (s.origin_ns == 0) s.origin_ns = now_ns() / 1'000'000'000 * 1'000'000'000;
  return s;
}

}  // namespace

bool keep(const Key& key, double fraction) {
  if (key.always || fraction >= 1.0) return true;
  if (!(fraction > 0.0)) return false;
  const std::uint64_t h = mix(mix(mix(key.epoch) ^ key.trainer) ^ key.batch);
  // Compare the top 53 bits with the fraction: exact for every double in [0, 1).
  return static_cast<double>(h >> 11) < fraction * 9007199254740992.0;
}

// A thread's events: chunks that never move once allocated (the writer reads them
// while the thread appends); `published` counts the events complete for readers.
struct Recorder::ThreadBuffer {
  explicit ThreadBuffer(std::uint64_t cap, std::size_t index)
      : cap(std::min(cap, kMaxEventsPerThread)), index(index), chunks((this->cap + kChunkEvents - 1) / kChunkEvents) {}
  const std::uint64_t cap;
  const std::size_t index;  // registration order: the storage readers' track numbers
  std::vector<std::unique_ptr<Event[]>> chunks;  // sized once, filled as needed
  std::atomic<std::uint64_t> published{0};

  Event& at(std::uint64_t i) const { return chunks[i / kChunkEvents][i % kChunkEvents]; }
};

Recorder::Recorder(Settings settings)
    : settings_(with_origin(std::move(settings))),
      serial_(g_next_serial.fetch_add(1)),
      in_flight_(new std::atomic<std::int64_t>[std::max<std::uint32_t>(settings_.peers, 1)]) {
  for (std::uint32_t p = 0; p < std::max<std::uint32_t>(settings_.peers, 1); ++p) in_flight_[p] = 0;
}

Recorder::~Recorder() = default;

Recorder::ThreadBuffer* Recorder::buffer_of_this_thread() {
  if (t_cache.serial == serial_) return static_cast<ThreadBuffer*>(t_cache.buffer);
  std::lock_guard lock(registry_mutex_);  // once per thread
  buffers_.push_back(std::make_unique<ThreadBuffer>(settings_.max_events_per_thread, buffers_.size()));
  t_cache = {serial_, buffers_.back().get()};
  return buffers_.back().get();
}

bool Recorder::record(const Event& first, const Event* rest, std::size_t rest_count) {
  ThreadBuffer* b = buffer_of_this_thread();
  const std::uint64_t n = b->published.load(std::memory_order_relaxed);  // only this thread writes it
  if (n + 1 + rest_count > b->cap) {
    dropped_.fetch_add(1 + rest_count, std::memory_order_relaxed);
    if (!warned_.exchange(true)) {
      std::fprintf(stderr,
                   "shardmix trace: %s: a thread reached telemetry.trace_max_events (%llu events); its later events "
                   "are dropped (the file's dropped_events counts them): lower telemetry.trace_sample_fraction or "
                   "raise telemetry.trace_max_events\n",
                   settings_.process_name.c_str(), static_cast<unsigned long long>(b->cap));
    }
    return false;
  }
  for (std::uint64_t i = n; i < n + 1 + rest_count; ++i) {
    auto& chunk = b->chunks[i / kChunkEvents];
    if (!chunk) chunk.reset(new Event[kChunkEvents]);  // amortised: once per kChunkEvents events
    b->at(i) = i == n ? first : rest[i - n - 1];
  }
  b->published.store(n + 1 + rest_count, std::memory_order_release);
  return true;
}

std::int64_t Recorder::add_in_flight(std::uint32_t peer, std::int64_t delta) {
  if (peer >= std::max<std::uint32_t>(settings_.peers, 1)) return 0;
  return in_flight_[peer].fetch_add(delta, std::memory_order_relaxed) + delta;
}

std::uint64_t Recorder::recorded_events() const {
  std::lock_guard lock(registry_mutex_);
  std::uint64_t n = 0;
  for (const auto& b : buffers_) n += b->published.load(std::memory_order_acquire);
  return n;
}

std::string Recorder::to_json() const {
  const std::uint32_t pid = settings_.pid;
  // fmt's own buffer: formatting into a std::string through back_inserter took most of the
  // write's time (2.8 us an event); the write happens at exit, under launchers' kill timeouts.
  fmt::memory_buffer out;
  std::map<std::uint32_t, std::string> thread_names;
  std::uint64_t async_id = (static_cast<std::uint64_t>(pid) << 32);
  auto head = [&](const char* ph, std::string_view name, const char* cat, std::uint32_t tid, std::int64_t ts) {
    fmt::format_to(std::back_inserter(out), ",\n{{\"ph\":\"{}\",\"name\":{},\"cat\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":",
                   ph, json_quote(name), cat, pid, tid);
    append_us(out, ts - settings_.origin_ns);
  };
  auto complete = [&](std::string_view name, const char* cat, std::uint32_t tid, const Event& e) {
    head("X", name, cat, tid, e.begin_ns);
    append(out, ",\"dur\":");
    append_us(out, std::max<std::int64_t>(e.end_ns - e.begin_ns, 0));
  };
  auto name_track = [&](std::uint32_t tid, auto make_name) {  // formats a track's name once
    if (thread_names.count(tid) == 0) thread_names.emplace(tid, make_name());
  };
  std::lock_guard lock(registry_mutex_);
  for (const auto& b : buffers_) {
    const std::uint64_t n = b->published.load(std::memory_order_acquire);
    for (std::uint64_t i = 0; i < n; ++i) {
      const Event& e = b->at(i);
      const auto* a = e.args;
      switch (e.what) {
        case What::kIds:
          break;  // read with the event before it
        case What::kWaitBatch:
          name_track(kTidTrainerBatches, [] { return std::string("batches"); });
          complete("wait for batch", "trainer", kTidTrainerBatches, e);
          fmt::format_to(std::back_inserter(out), ",\"args\":{{\"epoch\":{},\"batch\":{}}}}}", a[0], a[1]);
          break;
        case What::kHoldBatch: {
          name_track(kTidTrainerBatches, [] { return std::string("batches"); });
          complete("hold batch", "trainer", kTidTrainerBatches, e);
          fmt::format_to(std::back_inserter(out), ",\"args\":{{\"epoch\":{},\"batch\":{},\"size\":{},\"samples\":[",
                         a[0], a[1], a[2]);
          bool first = true;
          for (std::uint64_t j = i + 1; j < n && b->at(j).what == What::kIds; ++j) {
            const Event& ids = b->at(j);
            for (std::uint16_t k = 0; k < ids.count; ++k) {
              fmt::format_to(std::back_inserter(out), "{}{}", first ? "" : ",", ids.args[k]);
              first = false;
            }
          }
          append(out, "]}}");
          break;
        }
        case What::kPlanEpoch:
          name_track(tid_plan(e.track), [&] { return fmt::format("trainer slot {}: planning, epochs", e.track); });
          complete("plan epoch", "daemon", tid_plan(e.track), e);
          fmt::format_to(std::back_inserter(out), ",\"args\":{{\"epoch\":{},\"trainer\":{}}}}}", a[0], a[1]);
          break;
        case What::kEpochStart:
        case What::kEpochEnd:
          name_track(tid_plan(e.track), [&] { return fmt::format("trainer slot {}: planning, epochs", e.track); });
          head("i", e.what == What::kEpochStart ? "epoch start" : "epoch end", "daemon", tid_plan(e.track),
               e.begin_ns);
          fmt::format_to(std::back_inserter(out), ",\"s\":\"t\",\"args\":{{\"epoch\":{},\"trainer\":{}}}}}", a[0],
                         a[1]);
          break;
        case What::kStagingWait:
          name_track(tid_staging(e.track), [&] { return fmt::format("trainer slot {}: staging waits", e.track); });
          complete("wait for staging space", "daemon", tid_staging(e.track), e);
          fmt::format_to(std::back_inserter(out), ",\"args\":{{\"epoch\":{},\"trainer\":{},\"batch\":{},\"bytes\":{}}}}}",
                         a[0], a[1], a[2], a[3]);
          break;
        case What::kPeerRead: {
          // Reads overlap: async begin/end pairs, one track per peer in the viewer.
          name_track(kTidPeerReads, [] { return std::string("peer reads"); });
          const std::string name = fmt::format("read peer {}", e.track);
          ++async_id;
          head("b", name, "peer_read", kTidPeerReads, e.begin_ns);
          fmt::format_to(std::back_inserter(out),
                         ",\"id\":\"0x{:x}\",\"args\":{{\"peer\":{},\"bytes\":{},\"samples\":{},\"epoch\":{},"
                         "\"trainer\":{},\"batch\":{}}}}}",
                         async_id, e.track, a[0], a[1], a[2], a[3], a[4]);
          head("e", name, "peer_read", kTidPeerReads, e.end_ns);
          fmt::format_to(std::back_inserter(out), ",\"id\":\"0x{:x}\"}}", async_id);
          break;
        }
        case What::kStorageRead:
          name_track(tid_storage(b->index), [&] { return fmt::format("storage reader (thread {})", b->index); });
          complete("storage read", "daemon", tid_storage(b->index), e);
          fmt::format_to(std::back_inserter(out),
                         ",\"args\":{{\"sample\":{},\"bytes\":{},\"epoch\":{},\"trainer\":{},\"batch\":{}}}}}", a[0],
                         a[1], a[2], a[3], a[4]);
          break;
        case What::kCheckpointSave:
          name_track(kTidCheckpoints, [] { return std::string("checkpoints"); });
          complete("save checkpoint", "trainer", kTidCheckpoints, e);
          fmt::format_to(std::back_inserter(out), ",\"args\":{{\"version\":{},\"bytes\":{}}}}}", a[0], a[1]);
          break;
        case What::kCheckpointDrain:
          name_track(kTidCheckpoints, [] { return std::string("checkpoint drain"); });
          complete(a[3] != 0 ? "write checkpoint through" : "drain checkpoint", "daemon", kTidCheckpoints, e);
          fmt::format_to(std::back_inserter(out), ",\"args\":{{\"version\":{},\"bytes\":{},\"ok\":{}}}}}", a[0],
                         a[1], a[2] != 0);
          break;
        case What::kStagedBytes:
          head("C", fmt::format("staged bytes, trainer slot {}", e.track), "daemon", 0, e.begin_ns);
          fmt::format_to(std::back_inserter(out), ",\"args\":{{\"bytes\":{}}}}}", static_cast<std::int64_t>(a[0]));
          break;
        case What::kReadsInFlight:
          head("C", fmt::format("reads in flight, peer {}", e.track), "daemon", 0, e.begin_ns);
          fmt::format_to(std::back_inserter(out), ",\"args\":{{\"reads\":{}}}}}", static_cast<std::int64_t>(a[0]));
          break;
      }
    }
  }
  std::string meta = fmt::format(
      "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{\"format\":\"shardmix-trace 1\",\"clock\":\"CLOCK_REALTIME\","
      "\"clock_origin_ns\":{},\"role\":{},\"node\":{},\"process\":{},\"sample_fraction\":{},\"max_events_per_thread\":{},"
      "\"dropped_events\":{}}},\n\"traceEvents\":[\n"
      "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":{}}}}}",
      settings_.origin_ns, json_quote(settings_.role), settings_.node, json_quote(settings_.process_name), settings_.sample_fraction,
      settings_.max_events_per_thread, dropped_events(), pid, json_quote(settings_.process_name));
  fmt::format_to(std::back_inserter(meta), ",\n{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{},\"tid\":0,"
                 "\"args\":{{\"sort_index\":{}}}}}", pid, pid);
  for (const auto& [tid, name] : thread_names) {
    fmt::format_to(std::back_inserter(meta),
                   ",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}", pid,
                   tid, json_quote(name));
  }
  meta.append(out.data(), out.size());
  return meta + "\n]}\n";
}

Status Recorder::write() const {
  // A trainer writes when its Client goes and again at exit: the second time only if
  // something was recorded in between.
  const std::uint64_t seen = recorded_events() + dropped_events();
  if (written_ && *written_ == seen) return Status::ok_status();
  if (Status s = write_file_atomically(settings_.path, to_json()); !s.ok()) {
    return s.with_context("the trace file (telemetry.trace_dir)");
  }
  written_ = seen;
  return Status::ok_status();
}

// ---- the process's recorder ----

namespace detail {
std::atomic<Recorder*> g_recorder{nullptr};
}

namespace {
std::mutex g_enable_mutex;
void write_at_exit() {
  if (Recorder* r = recorder()) {
    if (Status s = r->write(); !s.ok()) std::fprintf(stderr, "shardmix trace: %s\n", s.to_string().c_str());
  }
}
}  // namespace

Status enable(Settings settings) {
  std::lock_guard lock(g_enable_mutex);
  if (Recorder* r = recorder()) {
    if (r->settings().path == settings.path) return Status::ok_status();
    return make_error(StatusCode::kInvalidArgument, "this process already writes its trace to {}, not {}",
                      r->settings().path, settings.path);
  }
  if (!(settings.sample_fraction >= 0.0 && settings.sample_fraction <= 1.0)) {
    return make_error(StatusCode::kInvalidArgument, "telemetry.trace_sample_fraction must be in [0, 1], got {}",
                      settings.sample_fraction);
  }
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(settings.path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) {
    return make_error(StatusCode::kIoError, "cannot create the trace directory {} (telemetry.trace_dir): {}",
                      dir.string(), ec.message());
  }
  // Never deleted: trace points on any thread may use it until the process ends.
  detail::g_recorder.store(new Recorder(std::move(settings)), std::memory_order_release);
  std::atexit(write_at_exit);
  return Status::ok_status();
}

Status write() {
  Recorder* r = recorder();
  return r != nullptr ? r->write() : Status::ok_status();
}

std::string ready_lines(std::string_view dir, double sample_fraction, std::uint64_t max_events) {
  if (dir.empty()) return {};
  return fmt::format("trace_dir={}\ntrace_sample_fraction={}\ntrace_max_events={}\n", dir, sample_fraction,
                     max_events);
}

Result<std::optional<ReadyTrace>> parse_ready(const std::map<std::string, std::string>& ready) {
  auto dir = ready.find("trace_dir");
  if (dir == ready.end() || dir->second.empty()) return std::optional<ReadyTrace>();
  ReadyTrace t;
  t.dir = dir->second;
  auto text = [&](const char* key) {
    auto it = ready.find(key);
    return it == ready.end() ? std::string() : it->second;
  };
  char* end = nullptr;
  const std::string fraction = text("trace_sample_fraction");
  t.sample_fraction = std::strtod(fraction.c_str(), &end);
  if (fraction.empty() || *end != '\0' || !(t.sample_fraction >= 0 && t.sample_fraction <= 1)) {
    return make_error(StatusCode::kCorrupt, "the ready file's trace_sample_fraction '{}' is not a number in [0, 1]",
                      fraction);
  }
  const std::string max = text("trace_max_events");
  t.max_events = std::strtoull(max.c_str(), &end, 10);
  if (max.empty() || *end != '\0' || t.max_events == 0 || t.max_events > kMaxEventsPerThread) {
    return make_error(StatusCode::kCorrupt, "the ready file's trace_max_events '{}' is not an integer in 1..{}", max,
                      kMaxEventsPerThread);
  }
  return std::optional<ReadyTrace>(std::move(t));
}

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

Key current_key() { return t_key; }
KeyScope::KeyScope(const Key& key) : saved_(t_key) { t_key = key; }
KeyScope::~KeyScope() { t_key = saved_; }

namespace {
Event make_event(What what, std::uint32_t track, std::int64_t begin_ns, std::int64_t end_ns,
                 std::initializer_list<std::uint64_t> args) {
  Event e{begin_ns, end_ns, what, 0, track, {}};
  std::size_t i = 0;
  for (std::uint64_t a : args) {
    if (i < kArgs) e.args[i++] = a;
  }
  return e;
}
}  // namespace

void span(What what, std::uint32_t track, std::int64_t begin_ns, const Key& key,
          std::initializer_list<std::uint64_t> args) {
  Recorder* r = recorder();
  if (r == nullptr || begin_ns == 0 || !r->keeps(key)) return;
  r->record(make_event(what, track, begin_ns, now_ns(), args));
}

void instant(What what, std::uint32_t track, const Key& key, std::initializer_list<std::uint64_t> args) {
  Recorder* r = recorder();
  if (r == nullptr || !r->keeps(key)) return;
  const std::int64_t t = now_ns();
  r->record(make_event(what, track, t, t, args));
}

void counter(What what, std::uint32_t track, std::int64_t value, const Key& key) {
  Recorder* r = recorder();
  if (r == nullptr || !r->keeps(key)) return;
  const std::int64_t t = now_ns();
  r->record(make_event(what, track, t, t, {static_cast<std::uint64_t>(value)}));
}

PendingRead begin_read(std::uint32_t peer) {
  Recorder* r = recorder();
  if (r == nullptr) return {};
  const PendingRead pending{now_ns(), t_key};
  const std::int64_t in_flight = r->add_in_flight(peer, +1);
  if (r->keeps(pending.key)) {
    r->record(make_event(What::kReadsInFlight, peer, pending.begin_ns, pending.begin_ns,
                         {static_cast<std::uint64_t>(in_flight)}));
  }
  return pending;
}

void end_read(const PendingRead& pending, std::uint32_t peer, std::uint64_t bytes, std::uint64_t samples) {
  Recorder* r = recorder();
  if (r == nullptr || pending.begin_ns == 0) return;
  const std::int64_t in_flight = r->add_in_flight(peer, -1);
  if (!r->keeps(pending.key)) return;
  const std::int64_t t = now_ns();
  const Key& k = pending.key;
  r->record(make_event(What::kPeerRead, peer, pending.begin_ns, t, {bytes, samples, k.epoch, k.trainer, k.batch}));
  r->record(make_event(What::kReadsInFlight, peer, t, t, {static_cast<std::uint64_t>(in_flight)}));
}

}  // namespace shardmix::trace
