#include "server/daemon.h"

#include <pthread.h>
#include <signal.h>
#include "server/resume_loader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <utility>  // boost 1.74 asio/awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>

#include <algorithm>
#include <numeric>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <fmt/ranges.h>

#include "common/atomic_file.h"
#include "common/catalog.h"
#include "common/distributed_catalog.h"
#include "common/epoch_plan.h"
#include "common/job_token.h"
#include "common/log.h"
#include "common/metadata_footprint.h"
#include "common/huge_pages.h"
#include "common/peer_monitor.h"
#include "common/placement.h"
#include "common/rotation.h"
#include "common/s3_client.h"
#include "common/sample_directory.h"
#include "common/slot_reuse.h"
#include "common/trace.h"
#include "control/directory_exchange.h"
#include "proto/checkpoint.h"
#include "fabric/fabric.h"
#include "server/cache_loader.h"
#include "server/checkpoint_replicator.h"
#include "server/client_service.h"
#include "server/netns.h"
#include "server/shard_file_cache.h"
#include "server/shared_region.h"
#include "server/startup_report.h"
#include "server/storage_reader.h"
#include "server/telemetry.h"

namespace shardmix {
namespace {

std::vector<std::uint8_t> to_bytes(std::string_view s) { return {s.begin(), s.end()}; }
std::string to_string(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

// Every rank learns every rank's outcome of a step; the first failure, named by rank,
// becomes everyone's error. Keeps ranks from hanging in the next collective.
Status agree(const MpiSession& mpi, const Status& mine, std::string_view step) {
  MpiCollectives group(mpi);
  return shardmix::agree(group, mine, step);
}

// Every rank's `mine` (trivially copyable), by rank; a contribution of the wrong size is an
// error naming the rank and `what`.
template <typename T>
Result<std::vector<T>> allgather_values(const MpiSession& mpi, const T& mine, std::string_view what) {
  static_assert(std::is_trivially_copyable_v<T>);
  auto gathered = mpi.allgather(std::span(reinterpret_cast<const std::uint8_t*>(&mine), sizeof(T)));
  if (!gathered.ok()) return gathered.status();
  std::vector<T> out(gathered->size());
  for (std::size_t r = 0; r < out.size(); ++r) {
    if ((*gathered)[r].size() != sizeof(T)) {
      return make_error(StatusCode::kInternal, "{} from rank {}: {} bytes, expected {}", what, r, (*gathered)[r].size(),
                        sizeof(T));
    }
    std::memcpy(&out[r], (*gathered)[r].data(), sizeof(T));
  }
  return out;
}

// The batch_size largest of `sizes`, largest first.
std::vector<std::uint64_t> largest(std::vector<std::uint64_t> sizes, std::uint32_t batch_size) {
  const std::size_t k = std::min<std::size_t>(batch_size, sizes.size());
  std::partial_sort(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(k), sizes.end(), std::greater<>());
  sizes.resize(k);
  return sizes;
}

// Upper bound on one batch's peer bytes: its batch.size largest samples (of `sizes`, every
// sample's, or under owner-side metadata every node's largest).
std::uint64_t largest_batch_bytes(std::vector<std::uint64_t> sizes, std::uint32_t batch_size) {
  std::uint64_t total = 0;
  for (std::uint64_t size : largest(std::move(sizes), batch_size)) total += align_to_arena(size);
  return total;
}

Status make_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return make_error(StatusCode::kIoError, "cannot create run directory {}: {}", dir, std::strerror(errno));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return make_error(StatusCode::kIoError, "run directory {} is not a directory", dir);
  }
  if (st.st_uid != geteuid()) {
    return make_error(StatusCode::kPermissionDenied, "run directory {} belongs to uid {}, not to us (uid {})", dir,
                      st.st_uid, geteuid());
  }
  if ((st.st_mode & 0077) != 0 && ::chmod(dir.c_str(), 0700) != 0) {
    return make_error(StatusCode::kPermissionDenied, "run directory {} is mode {:o} and cannot be made 0700", dir,
                      st.st_mode & 0777);
  }
  return Status::ok_status();
}

// Stop requests arrive on the io thread (signals); the main thread waits for them.
class StopLatch {
 public:
  void request() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return stopped_; });
  }
  // True if a stop was requested within `timeout`.
  bool wait_for(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [this] { return stopped_; });
  }
  bool requested() {
    std::lock_guard lock(mutex_);
    return stopped_;
  }

 private:
  std::mutex mutex_;  // guards stopped_
  std::condition_variable cv_;
  bool stopped_ = false;
};

// MPI tags of the telemetry messages to rank 0 (docs/decisions/0014).
constexpr int kTagTrainerEpoch = 41;  // one TrainerEpochRecord
constexpr int kTagTelemetryDone = 42; // this daemon sends no more records
constexpr int kTagLoadProgress = 43;  // a LoadProgressMessage, while loading
// MPI tags of the cache-rotation fence (docs/decisions/0033), both a RotationMessage.
constexpr int kTagRotationDone = 44;      // to node k: the sender reads nothing of k's generation any more
constexpr int kTagRotationReadable = 45;  // from node k: its arena now holds the generation
// kTagCheckpointReplica = 46 (server/checkpoint_replicator.h): checkpoint replication notices.

struct RotationMessage {
  std::uint32_t node = 0;
  std::uint32_t reserved = 0;
  std::uint64_t generation = 0;
};

struct LoadProgressMessage {
  std::uint64_t samples = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
};

// Load progress: every daemon's telemetry gauges; rank 0 shows the whole job's progress —
// a progress bar when its stderr is a terminal, else a log line every 2 s — with the rate,
// the ETA and the per-node skew (the other daemons send their figures every second; main
// thread only, like all MPI).
class LoadReporter {
 public:
  // `cached_bytes`: every node's resident bytes, by rank.
  LoadReporter(MpiSession& mpi, NodeTelemetry& telemetry, std::vector<std::uint64_t> cached_bytes)
      : mpi_(mpi), telemetry_(telemetry), bar_(mpi.rank() == 0 && ::isatty(STDERR_FILENO) == 1),
        nodes_(static_cast<std::size_t>(mpi.size())), log_(log::get("loader")) {
    for (std::uint64_t b : cached_bytes) total_bytes_ += b;
    node_total_ = std::move(cached_bytes);
    // A short load prints nothing but the final skew line.
    next_ = std::chrono::steady_clock::now() + (bar_ ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000));
    // The bar replaces this daemon's own progress lines (they would break it up).
    if (bar_) {
      loader_level_ = log_->level();
      log_->set_level(std::max(loader_level_, spdlog::level::warn));
    }
  }
  ~LoadReporter() {
    if (bar_) log_->set_level(loader_level_);
  }

  void operator()(const LoadStats& so_far, std::uint64_t total_samples, std::uint64_t total_bytes, bool done) {
    telemetry_.set_load(so_far.samples, so_far.bytes, total_samples, total_bytes, so_far.seconds, done);
    const auto now = std::chrono::steady_clock::now();
    if (!done && now < next_) return;
    const LoadProgressMessage mine{so_far.samples, so_far.bytes, so_far.seconds};
    if (mpi_.rank() != 0) {
      next_ = now + std::chrono::seconds(1);
      // Progress is advisory: a failed send costs rank 0 one figure, not the load. Say so
      // once rather than on every tick.
      if (Status s = mpi_.send(0, kTagLoadProgress, std::span(reinterpret_cast<const std::uint8_t*>(&mine), sizeof(mine)));
          !s.ok() && !send_failure_logged_) {
        send_failure_logged_ = true;
        log_->warn("load progress not sent to rank 0 (its progress figures will lag): {}", s.to_string());
      }
      return;
    }
    next_ = now + (bar_ ? std::chrono::milliseconds(250) : std::chrono::milliseconds(2000));
    nodes_[0] = mine;
    for (;;) {
      auto m = mpi_.try_receive(kTagLoadProgress);  // only its own: other tags are not for the loader
      if (!m.ok() || !m->has_value()) break;
      const MpiSession::Message& msg = **m;
      if (msg.tag == kTagLoadProgress && msg.bytes.size() == sizeof(LoadProgressMessage) && msg.source > 0 &&
          msg.source < mpi_.size()) {
        std::memcpy(&nodes_[static_cast<std::size_t>(msg.source)], msg.bytes.data(), sizeof(LoadProgressMessage));
      }
    }
    render(so_far.seconds, done);
  }

 private:
  void render(double seconds, bool done) {
    std::uint64_t bytes = 0;
    std::size_t slow = 0, fast = 0;
    auto fraction = [&](std::size_t r) {
      return node_total_[r] > 0 ? static_cast<double>(nodes_[r].bytes) / static_cast<double>(node_total_[r]) : 1.0;
    };
    for (std::size_t r = 0; r < nodes_.size(); ++r) {
      bytes += nodes_[r].bytes;
      if (fraction(r) < fraction(slow)) slow = r;
      if (fraction(r) > fraction(fast)) fast = r;
    }
    const double all = total_bytes_ > 0 ? static_cast<double>(bytes) / static_cast<double>(total_bytes_) : 1.0;
    const double rate = seconds > 0 ? static_cast<double>(bytes) / seconds : 0.0;
    const double eta = rate > 0 ? static_cast<double>(total_bytes_ - std::min(bytes, total_bytes_)) / rate : 0.0;
    const std::string skew = nodes_.size() > 1 ? fmt::format("; slowest node {} at {:.0f}%, fastest node {} at {:.0f}%",
                                                              slow, 100 * fraction(slow), fast, 100 * fraction(fast))
                                               : std::string();
    if (bar_) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(all * kWidth);
      std::fprintf(stderr, "\rloading [%s%s] %3.0f%%  %.2f/%.2f GB  %.0f MB/s  ETA %.0f s%s   ",
                   std::string(static_cast<std::size_t>(filled), '#').c_str(),
                   std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(), 100 * all, bytes / 1e9,
                   total_bytes_ / 1e9, rate / 1e6, eta, skew.c_str());
      if (done) std::fputc('\n', stderr);
      std::fflush(stderr);
      return;
    }
    if (done) return;  // the end is logged once every node has loaded
    log_->info("loading, all {} nodes: {:.0f}%, {:.2f}/{:.2f} GB, {:.0f} MB/s, ETA {:.0f} s{}", nodes_.size(), 100 * all,
               bytes / 1e9, total_bytes_ / 1e9, rate / 1e6, eta, skew);
  }

  MpiSession& mpi_;
  NodeTelemetry& telemetry_;
  bool bar_;
  std::vector<LoadProgressMessage> nodes_;
  std::vector<std::uint64_t> node_total_;
  std::uint64_t total_bytes_ = 0;
  std::chrono::steady_clock::time_point next_{};
  std::shared_ptr<spdlog::logger> log_;
  spdlog::level::level_enum loader_level_ = spdlog::level::info;
  bool send_failure_logged_ = false;
};

std::string replace_all(std::string text, std::string_view from, std::string_view to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// Sends finished trainer passes to rank 0 and, on rank 0, merges them into per-epoch lines
// of the stats file; rewrites the Prometheus textfile. Main thread only (the only thread
// that calls MPI).
class TelemetryPump {
 public:
  TelemetryPump(const Config& config, MpiSession& mpi, NodeTelemetry& telemetry, std::uint32_t trainers,
                std::uint64_t dataset_samples, std::uint64_t invalid_samples, const std::string& job,
                const JobRecord& job_record)
      : mpi_(mpi),
        telemetry_(telemetry),
        aggregator_(static_cast<std::uint32_t>(mpi.size()), trainers, dataset_samples, invalid_samples),
        interval_(std::chrono::duration_cast<std::chrono::milliseconds>(config.telemetry.interval)),
        log_(log::get("telemetry")) {
    const std::string rank = std::to_string(mpi.rank());
    if (!config.telemetry.prometheus_file.empty()) {
      prometheus_path_ = replace_all(replace_all(config.telemetry.prometheus_file, "{rank}", rank), "{job}", job);
    }
    if (mpi.rank() == 0 && !config.telemetry.stats_file.empty()) {
      stats_path_ = replace_all(config.telemetry.stats_file, "{job}", job);
      stats_ = std::fopen(stats_path_.c_str(), "a");
      if (stats_ == nullptr) {
        log_->error("cannot open telemetry.stats_file {}: {}; no stats file for this job", stats_path_,
                    std::strerror(errno));
      } else {
        log_->info("per-epoch statistics go to {}", stats_path_);
        // The job record first, so that a stats file describes the job it measured
        // (shardmix-whatif rebuilds the job from it; the epoch lines follow unchanged).
        const std::string line = job_record.to_json() + "\n";
        if (std::fputs(line.c_str(), stats_) < 0 || std::fflush(stats_) != 0) {
          log_->error("writing {} failed: {}", stats_path_, std::strerror(errno));
        }
      }
    }
    next_prometheus_ = std::chrono::steady_clock::now();
  }
  ~TelemetryPump() {
    if (stats_ != nullptr) std::fclose(stats_);
  }

  // Degraded mode: `rank` is dead. Rank 0 no longer waits for its last statistics; if it
  // is rank 0 itself, the others stop sending (a blocking MPI_Send to a dead rank may never
  // return) and keep their statistics local (Prometheus file, log).
  void peer_dead(int rank) {
    if (rank == 0) rank0_dead_ = true;
    ++dead_ranks_;
  }

  // While serving: forward or merge what finished since the last call.
  void pump() {
    bool changed = false;
    for (const TrainerEpochRecord& r : telemetry_.take_records()) {
      changed = true;
      if (mpi_.rank() == 0) {
        aggregator_.add(r);
      } else if (!rank0_dead_) {
        Status s = mpi_.send(0, kTagTrainerEpoch, std::span(reinterpret_cast<const std::uint8_t*>(&r), sizeof(r)));
        if (!s.ok()) log_->warn("sending epoch {} of trainer {} to rank 0: {}", r.stats.epoch, r.trainer_rank, s.to_string());
      }
    }
    if (mpi_.rank() == 0) {
      changed |= receive_waiting();
      for (const JobEpochStats& j : aggregator_.take_complete()) write(j);
    }
    const auto now = std::chrono::steady_clock::now();
    if (changed || now >= next_prometheus_) {
      write_prometheus();
      next_prometheus_ = now + interval_;
    }
  }

  // At shutdown, after the service stopped: every daemon's last records reach rank 0, which
  // then writes the epochs no trainer will finish (marked incomplete).
  void finish(std::chrono::seconds timeout) {
    pump();
    if (mpi_.rank() != 0) {
      if (rank0_dead_) {
        telemetry_.set_serving(false);
        write_prometheus();
        return;
      }
      Status s = mpi_.send(0, kTagTelemetryDone, {});
      if (!s.ok()) log_->warn("telling rank 0 that telemetry is done: {}", s.to_string());
    } else {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      // Dead ranks (degraded mode) send nothing more.
      const int expected = mpi_.size() - 1 - dead_ranks_;
      while (done_ranks_ < expected && std::chrono::steady_clock::now() < deadline) {
        if (!receive_waiting()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (done_ranks_ < expected) {
        log_->warn("{} of {} daemons did not send their last statistics within {} s", expected - done_ranks_,
                   expected, timeout.count());
      }
      for (const JobEpochStats& j : aggregator_.take_complete()) write(j);
      for (const JobEpochStats& j : aggregator_.flush()) write(j);
    }
    telemetry_.set_serving(false);
    write_prometheus();
  }

 private:
  // Rank 0: receives every waiting message; true if any record arrived.
  bool receive_waiting() {
    bool any = false;
    for (;;) {
      // Telemetry's own tags only: the cache-rotation fence's messages are the main loop's.
      auto m = mpi_.try_receive(kTagTrainerEpoch);
      if (m.ok() && !m->has_value()) m = mpi_.try_receive(kTagLoadProgress);
      if (m.ok() && !m->has_value()) m = mpi_.try_receive(kTagTelemetryDone);
      if (!m.ok()) {
        log_->warn("receiving statistics: {}", m.status().to_string());
        return any;
      }
      if (!m->has_value()) return any;
      const MpiSession::Message& msg = **m;
      if (msg.tag == kTagTelemetryDone) {
        ++done_ranks_;
      } else if (msg.tag == kTagLoadProgress) {
        // a late load report, after rank 0 itself finished loading
      } else if (msg.tag == kTagTrainerEpoch && msg.bytes.size() == sizeof(TrainerEpochRecord)) {
        TrainerEpochRecord r;
        std::memcpy(&r, msg.bytes.data(), sizeof(r));
        aggregator_.add(r);
        any = true;
      } else {
        log_->warn("ignoring a {}-byte message with tag {} from rank {}", msg.bytes.size(), msg.tag, msg.source);
      }
    }
  }

  void write(const JobEpochStats& j) {
    log_->info("{}", j.summary());
    if (j.complete) telemetry_.set_job_epoch(j);
    if (stats_ == nullptr) return;
    const std::string line = j.to_json() + "\n";
    if (std::fputs(line.c_str(), stats_) < 0 || std::fflush(stats_) != 0) {
      log_->error("writing {} failed: {}", stats_path_, std::strerror(errno));
    }
  }

  void write_prometheus() {
    if (prometheus_path_.empty()) return;
    Status s = write_file_atomically(prometheus_path_, telemetry_.prometheus_text());
    if (!s.ok() && !prometheus_failed_) {
      prometheus_failed_ = true;  // once, not every interval
      log_->error("telemetry.prometheus_file: {}", s.to_string());
    }
  }

  MpiSession& mpi_;
  NodeTelemetry& telemetry_;
  JobAggregator aggregator_;
  std::chrono::milliseconds interval_;
  std::shared_ptr<spdlog::logger> log_;
  std::string prometheus_path_;
  std::string stats_path_;
  std::FILE* stats_ = nullptr;
  std::chrono::steady_clock::time_point next_prometheus_;
  int done_ranks_ = 0;
  int dead_ranks_ = 0;        // degraded mode: peers declared dead
  bool rank0_dead_ = false;   // degraded mode: rank 0 is one of them
  bool prometheus_failed_ = false;
};

// The job's id for file names: the batch system's, else Open MPI's, else rank 0's pid.
std::string job_id(const std::string& rank0_pid) {
  for (const char* name : {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "OMPI_MCA_ess_base_jobid"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      std::string id = v;
      for (char& c : id) {
        if (c == '/' || c == ' ') c = '_';
      }
      return id;
    }
  }
  return "local-" + rank0_pid;
}

// Whether `pid` is a running process: exists and is not a zombie (a SIGKILLed daemon stays
// a zombie until its parent, e.g. an exiting mpirun, is reaped).
bool process_running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return ::kill(pid, 0) == 0 || errno == EPERM;
  const auto paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || (text[paren + 2] != 'Z' && text[paren + 2] != 'X');
}

// Rank 0 at start: a daemon job that was SIGKILLed leaves RUN_DIR/ready and RUN_DIR/token
// behind; trainers must not take them for this job's. They are stale when the rank 0 they
// name ran on this host and is gone. (Stale sockets are found per rank by ClientService::listen.)
void remove_stale_run_files(const std::string& run_dir, const std::string& my_host) {
  const std::string ready = run_dir + "/ready";
  std::ifstream in(ready);
  if (!in) return;
  std::string line, host, pid_text;
  while (std::getline(in, line)) {
    if (line.rfind("host.0=", 0) == 0) host = line.substr(7);
    if (line.rfind("pid.0=", 0) == 0) pid_text = line.substr(6);
  }
  const long pid = std::strtol(pid_text.c_str(), nullptr, 10);
  auto log = log::get("daemon");
  if (host != my_host || pid <= 0) {
    log->warn("{} exists and names no daemon of this host (host.0={}, pid.0={}); removing it", ready, host, pid_text);
  } else if (process_running(static_cast<pid_t>(pid))) {
    log->warn("{} names daemon pid {}, which is still running; another job may be using run dir {} (its sockets "
              "will be checked before we serve)", ready, pid, run_dir);
    return;
  } else {
    log->warn("removing stale {} and {} left by an earlier run whose daemon (pid {}) is gone", ready, kJobTokenFile, pid);
  }
  ::unlink(ready.c_str());
  ::unlink((run_dir + "/" + kJobTokenFile).c_str());
}

// The "startup:" and "memory:" lines (server/startup_report.h) bench/startup.sh and
// bench/cost.sh parse. Memory: the regions' sizes as allocated (the arena is filled by the
// load; staging pages become resident as batches are staged), the catalog as held in
// memory, the placement tables, and the process's resident set at this point, with its
// anonymous and shared parts.
void log_startup_report(spdlog::logger& log, int rank, const PhaseClock& phases, std::uint64_t samples,
                        std::uint64_t resident_samples, std::uint64_t cached_bytes, const SampleDirectory& directory,
                        std::uint64_t arena_bytes, std::uint64_t staging_bytes) {
  auto startup = format_report_line("startup", startup_fields(rank, phases));
  if (startup.ok()) log.info("{}", *startup);
  auto field = [](std::optional<std::uint64_t> v) { return v ? std::to_string(*v) : std::string("na"); };
  const NodeMetadataBytes metadata = node_metadata_bytes(directory, 0);
  auto memory = format_report_line(
      "memory", {{"rank", std::to_string(rank)},
                 {"samples", std::to_string(samples)},
                 {"resident_samples", std::to_string(resident_samples)},
                 {"cached_bytes", std::to_string(cached_bytes)},
                 {"arena_bytes", std::to_string(arena_bytes)},
                 {"staging_bytes", std::to_string(staging_bytes)},
                 {"catalog_bytes", std::to_string(metadata.catalog)},
                 {"placement_bytes", std::to_string(metadata.placement)},
                 // node_metadata_bytes before any trainer: catalog + placement (the simulator's
                 // figure adds the schedulers' state; the "metadata:" line at exit has both).
                 {"metadata_bytes", std::to_string(metadata.total())},
                 {"rss_bytes", field(self_status_bytes("VmRSS"))},
                 {"rss_anon_bytes", field(self_status_bytes("RssAnon"))},
                 {"rss_shmem_bytes", field(self_status_bytes("RssShmem"))},
                 {"rss_file_bytes", field(self_status_bytes("RssFile"))}});
  if (memory.ok()) log.info("{}", *memory);
}


// Runs a function when destroyed: a member that tears a part down at its place in the
// reverse order of the members (set when the part is created).
struct OnDestroy {
  std::function<void()> run;
  ~OnDestroy() {
    if (run) run();
  }
};

// shardmixd's parts, created in start-up order by start() and torn down in reverse by the
// destructor: members are declared in creation order, and C++ destroys them in reverse.
// Every start-up step that can fail on one rank is agreed by all ranks (agree()), so every
// daemon stops with the same message naming the failed rank instead of hanging in the next
// collective.
// Threads: the caller's (main) thread runs start() and serve() and is the only one that
// calls MPI; the service thread runs the Asio io_context (signals, sockets, schedulers);
// the fabric's progress thread and the storage readers belong to their parts.
class Daemon {
 public:
  Daemon(const Config& config, MpiSession& mpi)
      : config_(config),
        mpi_(mpi),
        rank_(mpi.rank()),
        nodes_(mpi.size()),
        owner_side_(config.dataset.metadata == "owner"),
        log_(log::get("daemon")) {}
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Start-up, in order: service thread and signals, run dir and job token, catalog,
  // placement and plan, shared regions, fabric, load, trainer service, ready file.
  // kCancelled: a stop signal arrived while loading (every daemon stops there; exit 0).
  Status start();
  // Serves until a stop signal, then drains; returns the process exit code.
  int serve();

 private:
  Status start_service_thread();
  Status make_run_dir_and_token();
  Status build_catalog();
  // dataset.metadata = "owner" (decision 0063): the scans sorted into slices of the
  // canonical order, without a global catalog; then each node's share routed to it.
  Status sort_catalog_owner_side(ScanResult scan);
  // Rank 0's summary of dataset_ (and the damage the scan skipped); `form` follows "catalog".
  void log_catalog(std::size_t class_names, std::size_t shards, std::string_view form) const;
  Status place_owner_side(const JobShape& job);
  // This node's residency split (when it has cold samples) and rank 0's storage-tier summary,
  // for either form of metadata. Exact figures: tests/e2e/check_storage.py checks them.
  struct Residency {
    std::uint64_t resident = 0, owned = 0, resident_bytes = 0, owned_bytes = 0, cold = 0, cold_bytes = 0;
  };
  void log_residency(const Residency& mine, std::uint64_t total_cold, std::uint64_t total_cold_bytes) const;
  Status make_unloaded_samples_cold(const LoadStats& loaded);
  // resume.checkpoint_dir: every daemon's re-deal agreed on, kept and logged (rank 0).
  Status adopt_redeal(Result<RedealtEpoch> loaded);
  Status place();
  Status create_regions();
  Status open_fabric();
  Status load();
  Status start_service();
  Status publish_ready();
  // telemetry.trace_dir: this daemon's trace recorder (written at shutdown).
  Status start_trace();
  void create_rotation();
  void pump_rotation();
  // Owner-side metadata: moves the directory exchange's asks and answers (main thread).
  void pump_exchange();
  void on_dead_peer(const PeerMonitor::Failure& dead);
  // Tells checkpoint replication and the checkpoint node that `rank` died (no-op without
  // checkpoint.dir): the replicas held for it are drained here.
  void checkpoints_peer_died(std::uint32_t rank);
  [[noreturn]] void stop_for_dead_peer(const PeerMonitor::Failure& dead);
  std::string host_of(std::uint32_t rank) const { return rank < hosts_.size() ? hosts_[rank] : std::string("?"); }
  void log_shutdown_figures();
  // At a stop: waits, within kCheckpointDrainAtExit, until every checkpoint name's newest
  // version is in checkpoint.dir (a job that ends right after its last save keeps it);
  // logs each one that is not, with the drain's error.
  void drain_checkpoints_before_exit();
  // A step that failed after the fabric opened waits here for every peer (they may still
  // be reading this arena) before returning `why`. The barrier's own failure is logged, not
  // returned: `why` is the error the job reports.
  void barrier_before_failing(const Status& why);

  const Config& config_;
  MpiSession& mpi_;
  const int rank_;
  const int nodes_;
  // dataset.metadata = "owner": the node holds its own share (own_) and O(P) tables, and
  // catalog_ and placement_ stay empty (decision 0063).
  const bool owner_side_;
  std::shared_ptr<spdlog::logger> log_;
  // Start-up phases, logged as one "startup:" line per rank once serving (bench/startup.sh).
  PhaseClock phases_;
  NodeTelemetry telemetry_;

  // The service thread. Signals come first, so SIGTERM during a long load still ends the
  // process cleanly; the thread is joined after every part declared below it is gone.
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ = boost::asio::make_work_guard(io_);
  StopLatch stop_;
  boost::asio::signal_set signals_{io_, SIGINT, SIGTERM};
  std::function<void(const boost::system::error_code&, int)> on_signal_;
  std::thread io_thread_;
  OnDestroy join_io_thread_;

  std::string run_dir_;
  std::uint32_t job_token_ = 0;

  Catalog catalog_;  // the global form's
  // What every daemon knows of the dataset, in either form.
  struct DatasetFigures {
    std::uint64_t samples = 0;
    std::uint64_t total_bytes = 0;
    std::uint64_t invalid_samples = 0;
    std::uint64_t invalid_shards = 0;
    std::uint64_t classes = 0;  // distinct labels (Catalog::num_classes)
    std::uint64_t digest = 0;   // catalog_digest's role in the plan digest
  } dataset_;
  // The owner-side form: this rank's slice of the canonical order until it is routed, then
  // the share's entries until they are loaded; the ownership function and the node's shard.
  std::optional<CatalogSlice> slice_;
  OwnerEntries share_;
  Ownership ownership_;
  OwnerShard own_;
  Catalog storage_files_;  // owner-side: the shard table the cold readers resolve locations in
  std::vector<SampleId> class_runs_;  // owner-side, shuffle.min_entropy > 0: where each class's ids start
  std::vector<std::uint64_t> cached_bytes_per_node_;  // resident bytes by rank (load progress)
  PlanShape shape_;
  std::uint64_t capacity_ = kNoCapacityLimit;  // this node's cache.capacity in bytes
  std::vector<std::uint64_t> node_capacities_;
  Placement placement_;
  std::unique_ptr<EpochPlanner> planner_;
  // Global (over catalog_ and placement_, decision 0055) or owner-side (over own_, asking
  // the owners through exchange_, moved by the main thread; decision 0062).
  std::unique_ptr<MpiDirectoryExchange> exchange_;
  std::unique_ptr<SampleDirectory> directory_;
  std::uint64_t digest_ = 0;  // the plan's identity in checkpoints (docs/decisions/0022)
  std::optional<RedealtEpoch> redealt_;
  GenerationClock generation_clock_;
  bool rotating_ = false;
  std::uint64_t arena_bytes_ = 0;

  std::unique_ptr<SharedRegion> arena_;
  std::unique_ptr<SharedRegion> staging_;

  std::string my_host_;
  std::vector<std::string> hosts_;
  // Heartbeat reads (common/peer_monitor.h) land here, one byte per peer; declared before
  // the fabric so it outlives every read.
  std::vector<std::uint8_t> heartbeat_bytes_;
  // Checkpoint replication (docs/decisions/0059), created with the checkpoint node. Declared
  // before the fabric for the same reason: its landing buffers outlive every read.
  std::unique_ptr<FabricCheckpointReplicator> replicator_;
  std::unique_ptr<fabric::Fabric> fabric_;
  fabric::LocalRegion staging_region_;
  fabric::LocalRegion heartbeat_region_;

  // Shard descriptors are shared by the loader, the rotation reloads and the cold readers
  // (docs/decisions/0037): declared before all of them so that it outlives them.
  std::unique_ptr<ShardFileCache> open_shards_;

  std::unique_ptr<PeerMonitor> monitor_;
  OnDestroy forget_failure_detector_figures_;  // as forget_checkpoint_stats_ below, for monitor_
  std::unique_ptr<FabricFetcher> fetcher_;
  bool degrade_ = false;  // fault.peer_death = degrade
  std::unique_ptr<StorageReaderPool> storage_readers_;
  std::unique_ptr<ResidencyTable> residency_;
  // Model checkpoints (checkpoint.dir); destroyed after the service (which posts its
  // completions) and before the io thread is joined (the drain's completions post to io_).
  std::unique_ptr<CheckpointNode> checkpoints_;
  // Before the node goes: the telemetry (which outlives it) stops reading its figures.
  OnDestroy forget_checkpoint_stats_;
  std::unique_ptr<ClientService> service_;
  // On every way out from here: the service dies on its own thread (it owns Asio objects),
  // then the progress thread stops, before `fetcher_` (used by read callbacks) goes away.
  OnDestroy tear_down_service_;

  std::string token_path_;
  std::string ready_path_;
  std::vector<std::string> pids_;
  std::unique_ptr<TelemetryPump> pump_;
  std::vector<std::uint32_t> degraded_;  // dead peers, in the order they were found

  // The cache-rotation fence (main thread: MPI). The reload runs on its own thread; its
  // future is declared after the arena, so it is joined before the arena goes.
  std::future<Result<LoadStats>> reload_;
  std::optional<LoadStats> last_reload_;
  std::unique_ptr<RotationCoordinator> rotation_;
};

Status Daemon::start() {
  for (auto step : {&Daemon::start_service_thread, &Daemon::make_run_dir_and_token, &Daemon::build_catalog,
                    &Daemon::place, &Daemon::create_regions, &Daemon::open_fabric, &Daemon::load,
                    &Daemon::start_service, &Daemon::publish_ready}) {
    if (Status s = (this->*step)(); !s.ok()) return s;
  }
  return Status::ok_status();
}

Status Daemon::start_service_thread() {
  // First signal: drain and exit cleanly. A second one: the operator insists (e.g. a peer
  // never reaches the shutdown barrier); exit at once.
  on_signal_ = [this](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    if (stop_.requested()) {
      log_->warn("received signal {} again, exiting without draining", signo);
      std::_Exit(128 + signo);
    }
    log_->info("received signal {}, shutting down", signo);
    stop_.request();
    signals_.async_wait(on_signal_);
  };
  signals_.async_wait(on_signal_);
  io_thread_ = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), "smx-service");  // per-thread profiles (perf, top -H)
    io_.run();
  });
  join_io_thread_.run = [this] {
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
  };
  return Status::ok_status();
}

Status Daemon::make_run_dir_and_token() {
  run_dir_ = resolve_run_dir(config_);
  if (Status s = agree(mpi_, make_private_dir(run_dir_), "creating the run directory"); !s.ok()) return s;
  if (rank_ == 0) remove_stale_run_files(run_dir_, mpi_.hostname());
  // The job token (docs/decisions/0024): rank 0's, from SHARDMIX_JOB_TOKEN or random.
  job_token_ = rank_ == 0 ? job_token_from_env().value_or(random_job_token()) : 0;
  auto tokens = mpi_.allgather(std::span(reinterpret_cast<const std::uint8_t*>(&job_token_), sizeof(job_token_)));
  if (!tokens.ok()) return tokens.status();
  std::memcpy(&job_token_, (*tokens)[0].data(), sizeof(job_token_));
  phases_.mark("setup");
  return Status::ok_status();
}

Status Daemon::build_catalog() {
  // Each rank scans its share, everyone merges the same catalog. As many scanning threads as
  // loading ones: both wait on storage, one request each.
  auto scan = scan_partition(config_.dataset, rank_, nodes_, config_.service.loader_threads);
  if (Status s = agree(mpi_, scan.status(), "scanning the dataset"); !s.ok()) return s;
  {
    // Damaged shard input this rank skipped (dataset.strict = false): each rank names its
    // own files and offsets; a long list is cut, the count is complete.
    constexpr std::size_t kMaxLogged = 20;
    const auto& problems = scan->problems;
    for (std::size_t i = 0; i < problems.size() && i < kMaxLogged; ++i) log_->warn("dataset: {}", problems[i]);
    if (problems.size() > kMaxLogged) {
      log_->warn("dataset: {} more problems in this rank's shards not shown", problems.size() - kMaxLogged);
    }
  }
  phases_.mark("scan");
  if (owner_side_) return sort_catalog_owner_side(std::move(*scan));
  auto gathered = mpi_.allgather(serialize_scan(*scan));
  if (!gathered.ok()) return gathered.status();
  std::vector<ScanResult> parts;
  for (const auto& bytes : *gathered) {
    auto part = deserialize_scan(bytes);
    if (!part.ok()) return part.status();
    parts.push_back(std::move(*part));
  }
  auto merged = merge_scans(config_.dataset, std::move(parts));
  if (!merged.ok()) return merged.status();
  catalog_ = std::move(*merged);
  dataset_ = DatasetFigures{catalog_.size(),          catalog_.total_bytes(),    catalog_.invalid_samples(),
                            catalog_.invalid_shards(), catalog_.num_classes(), catalog_digest(catalog_)};
  phases_.mark("catalog_exchange");
  log_catalog(catalog_.class_names().size(), catalog_.sharded() ? catalog_.file_count() : 0, "");
  return Status::ok_status();
}

void Daemon::log_residency(const Residency& mine, std::uint64_t total_cold, std::uint64_t total_cold_bytes) const {
  if (mine.cold > 0) {
    log_->info("cache: {} of {} owned samples resident ({} of {} bytes, arena {} bytes; cache.capacity {} = {} "
               "bytes); {} cold samples ({} bytes) are read from storage when a trainer needs them{}",
               mine.resident, mine.owned, mine.resident_bytes, mine.owned_bytes, arena_bytes_,
               config_.cache.capacity_text, config_.cache.capacity_bytes, mine.cold, mine.cold_bytes,
               owner_side_ ? " (by whichever daemon serves it: the owner's directory answer carries their locations)"
                           : "");
  }
  if (rank_ == 0 && total_cold > 0) {
    log_->info("storage tier: {} of {} samples ({:.1f}%, {:.1f} MB) fit in no node's cache.capacity and are read "
               "from storage every epoch; service.cold_readahead_batches {}, {} storage readers per node",
               total_cold, dataset_.samples,
               100.0 * static_cast<double>(total_cold) / static_cast<double>(dataset_.samples),
               total_cold_bytes / 1e6, config_.service.cold_readahead_batches, config_.service.loader_threads);
  }
}

void Daemon::log_catalog(std::size_t class_names, std::size_t shards, std::string_view form) const {
  if (rank_ != 0) return;
  log_->info("catalog{}: {} samples, {} classes, {:.1f} MB{}", form, dataset_.samples, class_names,
             dataset_.total_bytes / 1e6, shards > 0 ? fmt::format(" in {} shards", shards) : std::string());
  if (dataset_.invalid_samples + dataset_.invalid_shards > 0) {
    log_->warn("dataset: skipped {} invalid samples; {} shards could not be read to their end (the scanning "
               "ranks' warnings name each file and byte offset; every epoch delivers the {} valid samples; "
               "dataset.strict = true makes this a start-up error)",
               dataset_.invalid_samples, dataset_.invalid_shards, dataset_.samples);
  }
}

Status Daemon::sort_catalog_owner_side(ScanResult scan) {
  // No rank sees every entry: a sample sort gives each rank a contiguous slice of the ids
  // (decision 0061). sort_scans fails on every rank alike (it agrees before returning).
  MpiCollectives group(mpi_);
  auto slice = sort_scans(config_.dataset, std::move(scan), group);
  if (!slice.ok()) return slice.status();
  // The dataset's figures from O(P) exchanges: bytes, distinct labels (a slice is sorted by
  // label, so a label shared by neighbouring slices is counted once) and a digest of the
  // slices in rank order, which are the canonical order.
  struct SliceSummary {
    std::uint64_t bytes = 0;
    std::uint64_t distinct_labels = 0;
    std::int64_t first_label = -1;  // -1: empty slice
    std::int64_t last_label = -1;
    std::uint64_t digest = 0;
  } mine;
  // The dataset's digest must not depend on how the ids are sliced over the ranks (a job
  // re-dealt to another world size checks its checkpoints' plan digest with it): each
  // entry is hashed with its id, and the slices' sums add up to the same total for any P.
  std::uint64_t digest = 0;
  for (std::size_t i = 0; i < slice->entries.size(); ++i) {
    const CatalogEntry& e = slice->entries[i];
    mine.bytes += e.size;
    if (mine.last_label != e.label) ++mine.distinct_labels;
    if (mine.first_label < 0) mine.first_label = e.label;
    mine.last_label = e.label;
    const std::uint64_t fields[] = {slice->first + i, static_cast<std::uint64_t>(e.label), e.size, e.shard, e.offset,
                                    e.path.size()};
    std::uint64_t h = proto::fnv1a64(std::span(reinterpret_cast<const std::uint8_t*>(fields), sizeof fields));
    h = proto::fnv1a64(std::span(reinterpret_cast<const std::uint8_t*>(e.path.data()), e.path.size()), h);
    digest += h;
  }
  mine.digest = digest;
  auto summaries = allgather_values(mpi_, mine, "catalog slice summary");
  if (!summaries.ok()) return summaries.status();
  dataset_ = DatasetFigures{};
  dataset_.samples = slice->tables.samples;
  dataset_.invalid_samples = slice->tables.invalid_samples;
  dataset_.invalid_shards = slice->tables.invalid_shards;
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const std::string& t : slice->tables.shards) {
    h = proto::fnv1a64(std::span(reinterpret_cast<const std::uint8_t*>(t.data()), t.size()), h);
  }
  for (const std::string& t : slice->tables.class_names) {
    h = proto::fnv1a64(std::span(reinterpret_cast<const std::uint8_t*>(t.data()), t.size()), h);
  }
  std::int64_t previous_last = -1;
  std::uint64_t entries_digest = 0;
  for (const SliceSummary& r : *summaries) {
    dataset_.total_bytes += r.bytes;
    entries_digest += r.digest;
    if (r.first_label < 0) continue;
    dataset_.classes += r.distinct_labels - (r.first_label == previous_last ? 1 : 0);
    previous_last = r.last_label;
  }
  dataset_.digest = proto::fnv1a64(std::span(reinterpret_cast<const std::uint8_t*>(&entries_digest),
                                              sizeof entries_digest), h);
  slice_ = std::move(*slice);
  if (config_.shuffle.min_entropy > 0) {
    // The entropy floor scores planned batches by class, and ids follow the labels: where
    // each class's run of ids starts is all it needs of them (O(C), decision 0065).
    auto runs = class_runs(*slice_, group);
    if (!runs.ok()) return runs.status();
    class_runs_ = std::move(*runs);
  }
  phases_.mark("catalog_exchange");
  log_catalog(slice_->tables.class_names.size(), slice_->tables.shards.size(),
              " (owner-side, dataset.metadata = owner: no daemon holds it whole)");
  return Status::ok_status();
}

Status Daemon::adopt_redeal(Result<RedealtEpoch> loaded) {
  Status s = agree(mpi_, loaded.status(), "re-dealing the checkpointed epoch (resume.checkpoint_dir)");
  if (!s.ok()) return s;
  redealt_ = std::move(*loaded);
  if (rank_ == 0) {
    log_->info("resume: epoch {} re-dealt from {} checkpoints of {} trainers: {} samples left, {} batches per "
               "trainer{}",
               redealt_->epoch, redealt_->old_world_size, redealt_->old_world_size, redealt_->samples,
               redealt_->batches_per_trainer,
               redealt_->skipped > 0 ? fmt::format(", {} skipped (batch.drop_last)", redealt_->skipped) : "");
  }
  return Status::ok_status();
}

Status Daemon::place_owner_side(const JobShape& job) {
  // Each entry goes to the node whose share its id is (spread: a function of the id), and
  // the node lays out its own arena as make_placement would (decisions 0055, 0061).
  ownership_ = Ownership::spread(dataset_.samples, shape_.node_owned, config_.shuffle.seed);
  MpiCollectives group(mpi_);
  auto share = route_to_owners(std::move(*slice_), ownership_, group);
  slice_.reset();
  if (!share.ok()) return share.status();
  share_ = std::move(*share);
  own_ = OwnerShard::from_entries(share_, static_cast<std::uint32_t>(rank_), capacity_, config_.shuffle.seed);
  struct ShareSummary {
    std::uint64_t samples = 0;
    std::uint64_t cold = 0;
    std::uint64_t cached_bytes = 0;
    std::uint64_t cold_bytes = 0;
  };
  const std::uint64_t share_bytes = std::accumulate(own_.sizes().begin(), own_.sizes().end(), std::uint64_t{0});
  auto shares = allgather_values(
      mpi_, ShareSummary{own_.size(), own_.cold_samples(), own_.cached_bytes(), share_bytes - own_.cached_bytes()},
      "owner-side share summary");
  if (!shares.ok()) return shares.status();
  std::vector<std::uint64_t> cold;
  std::uint64_t total_cold = 0, total_cold_bytes = 0;
  for (int r = 0; r < nodes_; ++r) {
    const ShareSummary& k = (*shares)[static_cast<std::size_t>(r)];
    cold.push_back(k.cold);
    total_cold += k.cold;
    total_cold_bytes += k.cold_bytes;
    cached_bytes_per_node_.push_back(k.cached_bytes);
  }
  Status limits;
  // The job's largest batch from every node's batch.size largest samples (O(P x batch)).
  std::vector<std::uint64_t> mine = largest(own_.sizes(), config_.batch.size);
  auto gathered = mpi_.allgather(
      std::span(reinterpret_cast<const std::uint8_t*>(mine.data()), mine.size() * sizeof(std::uint64_t)));
  if (!gathered.ok()) return gathered.status();
  std::vector<std::uint64_t> candidates;
  for (const auto& bytes : *gathered) {
    for (std::size_t at = 0; at + sizeof(std::uint64_t) <= bytes.size(); at += sizeof(std::uint64_t)) {
      std::uint64_t v = 0;
      std::memcpy(&v, bytes.data() + at, sizeof v);
      candidates.push_back(v);
    }
  }
  const std::uint64_t batch_bound = largest_batch_bytes(std::move(candidates), config_.batch.size);
  if (limits.ok() && batch_bound > config_.service.staging_bytes_per_trainer) {
    limits = make_error(StatusCode::kInvalidArgument,
                        "service.staging_bytes_per_trainer ({}) is smaller than the largest possible batch ({} bytes: "
                        "the {} largest samples); raise it or lower batch.size",
                        config_.service.staging_bytes_per_trainer, batch_bound, config_.batch.size);
  }
  if (Status s = agree(mpi_, limits, "checking memory limits"); !s.ok()) return s;

  auto planner = EpochPlanner::with_class_runs(shape_, ownership_, config_.shuffle, class_runs_);
  if (!planner.ok()) return planner.status();
  planner_ = std::move(*planner);
  // A describe() waits this long for its owners: longer than the failure detector needs to
  // declare an owner dead, so a dead owner stops the job with the detector's message.
  exchange_ = std::make_unique<MpiDirectoryExchange>(
      mpi_, own_, std::chrono::duration_cast<std::chrono::milliseconds>(3 * config_.fault.peer_timeout));
  // The shard table and class names every node keeps (O(files)), as a catalog without
  // samples: the cold readers resolve a location's shard index in it (reads carry their
  // locations). The routed copy of the table goes with the routed entries after the load.
  storage_files_ = Catalog::of_share(share_.tables.shards, {}, share_.tables.class_names);
  storage_files_.set_invalid_counts(dataset_.invalid_samples, dataset_.invalid_shards);
  directory_ = std::make_unique<ShardedDirectory>(static_cast<std::uint32_t>(rank_), ownership_, own_, *exchange_,
                                                  std::move(cold), storage_files_.file_table_bytes());
  digest_ = plan_digest(dataset_.digest, dataset_.samples, job, config_.shuffle, config_.dataset.placement);
  if (!config_.resume.checkpoint_dir.empty()) {
    // The old job's plans come from the spread ownership and the class runs: no catalog
    // needed, but the re-deal itself holds O(N) while it runs (decision 0067).
    if (Status s = adopt_redeal(load_redealt_epoch(config_.resume.checkpoint_dir, config_, dataset_.digest,
                                                   dataset_.samples, class_runs_, job, digest_));
        !s.ok()) {
      return s;
    }
  }
  arena_bytes_ = own_.arena_bytes();
  log_residency(Residency{own_.cached_samples(), own_.size(), own_.cached_bytes(), share_bytes, own_.cold_samples(),
                          share_bytes - own_.cached_bytes()},
                total_cold, total_cold_bytes);
  phases_.mark("placement");
  return Status::ok_status();
}

Status Daemon::place() {
  // Plan shape and placement: pure functions, identical on every rank.
  const JobShape job{static_cast<std::uint32_t>(nodes_), config_.service.trainers_per_node, config_.batch.size,
                     config_.batch.drop_last};
  shape_ = make_plan_shape(dataset_.samples, job);
  // cache.capacity = 0 means no limit beyond RAM; otherwise each node keeps what fits
  // resident and the rest of its share is cold (placement.h).
  // The capacity is per node: the default "0.8" is a fraction of *this* node's RAM, so nodes
  // with different RAM (or a slightly different MemTotal) get different byte counts. Every
  // daemon computes every node's resident set and arena offsets, so each node's own figure
  // is gathered here and node k's layout is always computed from node k's capacity; computing
  // a peer's layout from one's own number would make fi_reads fetch another sample's bytes.
  // checkpoint.capacity comes out of cache.capacity (docs/configuration.md, memory budget;
  // load_config checked that something is left).
  const std::uint64_t checkpoint_ram = config_.checkpoint.dir.empty() ? 0 : config_.checkpoint.capacity_bytes;
  capacity_ = config_.cache.capacity_bytes == 0 ? kNoCapacityLimit : config_.cache.capacity_bytes - checkpoint_ram;
  {
    auto gathered_capacities = allgather_values(mpi_, capacity_, "cache.capacity");
    if (!gathered_capacities.ok()) return gathered_capacities.status();
    node_capacities_ = std::move(*gathered_capacities);
  }
  if (rank_ == 0 && std::adjacent_find(node_capacities_.begin(), node_capacities_.end(),
                                       std::not_equal_to<>()) != node_capacities_.end()) {
    std::string listed;
    for (int r = 0; r < nodes_; ++r) {
      const std::uint64_t c = node_capacities_[static_cast<std::size_t>(r)];
      listed += fmt::format("{}rank {}: {}", r == 0 ? "" : ", ", r,
                            c == kNoCapacityLimit ? std::string("unlimited") : std::to_string(c));
    }
    log_->info("cache.capacity differs between nodes (bytes): {}; each node's resident set uses its own", listed);
  }
  if (owner_side_) return place_owner_side(job);
  placement_ =
      make_placement(catalog_.sizes(), shape_, config_.dataset.placement, config_.shuffle.seed, node_capacities_);
  cached_bytes_per_node_ = placement_.cached_bytes;
  planner_ = std::make_unique<EpochPlanner>(shape_, placement_, config_.shuffle, catalog_.labels());
  directory_ = std::make_unique<GlobalDirectory>(catalog_, placement_);
  // Checkpoint/resume (docs/decisions/0022): the plan's identity, and an epoch re-dealt
  // from another world size's checkpoints.
  digest_ = plan_digest(dataset_.digest, dataset_.samples, job, config_.shuffle, config_.dataset.placement);
  if (!config_.resume.checkpoint_dir.empty()) {
    if (Status s = adopt_redeal(load_redealt_epoch(config_.resume.checkpoint_dir, config_, catalog_, job, digest_));
        !s.ok()) {
      return s;
    }
  }

  // Cache rotation (docs/decisions/0033) only when something is cold: with everything
  // resident every generation is the whole share, so the static path is kept bit-for-bit.
  // Not under fault.peer_death = degrade: a dead daemon never sends its Done (every node's
  // reload would wait for it forever) and a send to it may never complete.
  // Slot reuse within an epoch (cache.reuse_rounds, 0035) is the same fence with a
  // generation per round, so the same holds for it.
  generation_clock_ =
      GenerationClock::make(config_.cache.rotation_epochs, config_.cache.reuse_rounds, shape_.batches_per_trainer);
  const bool rotation_refused = generation_clock_.enabled() && config_.fault.peer_death == "degrade";
  if (rotation_refused && rank_ == 0) {
    log_->warn("{} = {} is ignored under fault.peer_death = degrade: the rotation fence needs every daemon alive "
               "(docs/decisions/0033); the resident set stays static",
               config_.cache.reuse_rounds > 0 ? "cache.reuse_rounds" : "cache.rotation_epochs",
               config_.cache.reuse_rounds > 0 ? config_.cache.reuse_rounds : config_.cache.rotation_epochs);
  }
  rotating_ = generation_clock_.enabled() && placement_.total_cold_samples() > 0 && !rotation_refused;
  const auto me = static_cast<std::size_t>(rank_);
  // A rotating arena is sized to the capacity, not to the first generation's packed set.
  arena_bytes_ = rotating_ ? rotating_arena_bytes(catalog_.sizes(), placement_, static_cast<std::uint32_t>(rank_),
                                                  capacity_)
                           : placement_.arena_bytes[me];
  std::uint64_t total_cold_bytes = 0;
  for (std::uint64_t b : placement_.cold_bytes) total_cold_bytes += b;
  log_residency(Residency{placement_.cached[me].size(), placement_.owned[me].size(), placement_.cached_bytes[me],
                          placement_.sample_bytes[me], placement_.cold_samples[me], placement_.cold_bytes[me]},
                placement_.total_cold_samples(), total_cold_bytes);
  // Staging holds every non-local sample of a staged batch (peer or cold): it must hold the
  // largest possible batch, or a trainer could never be served.
  Status limits;
  const std::uint64_t batch_bound = largest_batch_bytes(catalog_.sizes(), config_.batch.size);
  if (batch_bound > config_.service.staging_bytes_per_trainer) {
    limits = make_error(StatusCode::kInvalidArgument,
                        "service.staging_bytes_per_trainer ({}) is smaller than the largest possible batch ({} bytes: "
                        "the {} largest samples); raise it or lower batch.size",
                        config_.service.staging_bytes_per_trainer, batch_bound, config_.batch.size);
  }
  if (Status s = agree(mpi_, limits, "checking memory limits"); !s.ok()) return s;
  phases_.mark("placement");
  return Status::ok_status();
}

Status Daemon::create_regions() {
  // The arena every local trainer maps, and per-trainer staging.
  if (const std::string huge = shmem_huge_page_setting(); huge == "never" || huge == "deny") {
    // Not "memory:" or any other report tag (server/startup_report.h): scripts parse those.
    log_->info("huge pages: the kernel gives shared memory none (/sys/kernel/mm/transparent_hugepage/shmem_enabled "
               "= {}); \"advise\" lets the cache arena, the staging area and checkpoints use 2 MiB pages: faster peer "
               "reads and saves (docs/operations.md, \"Huge pages\")",
               huge);
  }
  auto arena = SharedRegion::create("shardmix-arena", arena_bytes_);
  auto staging = arena.ok() ? SharedRegion::create("shardmix-staging", std::uint64_t{config_.service.trainers_per_node} *
                                                                           config_.service.staging_bytes_per_trainer)
                            : Result<std::unique_ptr<SharedRegion>>(arena.status());
  if (Status s = agree(mpi_, staging.status(), "allocating the cache arena"); !s.ok()) return s;
  arena_ = std::move(*arena);
  staging_ = std::move(*staging);
  phases_.mark("regions");
  return Status::ok_status();
}

Status Daemon::open_fabric() {
  // Expose the arena once; exchange addresses and keys over MPI. An emulated node first
  // joins its network namespace (server/netns.h: this thread and the threads it starts from
  // here on, such as the fabric's progress thread).
  Status s = agree(mpi_, join_netns(config_.fabric.netns, rank_), "joining the network namespace (fabric.netns)");
  if (!s.ok()) return s;
  my_host_ = mpi_.hostname();
  auto hosts = mpi_.allgather(to_bytes(my_host_));
  if (!hosts.ok()) return hosts.status();
  for (const auto& h : *hosts) hosts_.push_back(to_string(h));
  const bool single_host = std::all_of(hosts_.begin(), hosts_.end(), [&](const auto& h) { return h == my_host_; });
  if (single_host && config_.fabric.interface.empty() && config_.fabric.netns.empty()) {
    ::setenv("FI_TCP_IFACE", "lo", 0);  // all daemons on one host: keep tcp on loopback
  }
  const fabric::FabricOptions fabric_options = fabric::fabric_options_from(config_.fabric);
  heartbeat_bytes_.assign(static_cast<std::size_t>(nodes_), 0);
  auto fabric_or = fabric::Fabric::create(fabric_options, rank_, nodes_);
  Status fabric_status = fabric_or.status();
  if (fabric_status.ok()) fabric_ = std::move(*fabric_or);
  // The whole region (at least a page): a node whose arena holds nothing (capacity 0)
  // still exposes a valid, non-empty memory region.
  if (fabric_status.ok()) fabric_status = fabric_->expose(arena_->data(), arena_->length());
  if (fabric_status.ok()) {
    auto local = fabric_->register_local(staging_->data(), staging_->length());
    fabric_status = local.status();
    if (local.ok()) staging_region_ = *local;
  }
  if (fabric_status.ok()) {
    auto local = fabric_->register_local(heartbeat_bytes_.data(), heartbeat_bytes_.size());
    fabric_status = local.status();
    if (local.ok()) heartbeat_region_ = *local;
  }
  if (fabric_status.ok() && !config_.fabric.netns.empty() && fabric_->domain_name() == "lo") {
    // Each namespace has its own loopback: peers would never answer (a hang at the first
    // read), e.g. with FI_TCP_IFACE=lo left in the environment.
    fabric_status = make_error(StatusCode::kInvalidArgument,
                               "fabric.netns = \"{}\" but the fabric picked the loopback interface 'lo', which "
                               "peers in other namespaces cannot reach; set fabric.interface to the namespace's "
                               "link (e.g. \"smxeth\") or unset FI_TCP_IFACE",
                               config_.fabric.netns);
  }
  if (s = agree(mpi_, fabric_status, "opening the fabric"); !s.ok()) return s;
  auto blobs = mpi_.allgather(fabric_->endpoint_blob());
  if (!blobs.ok()) return blobs.status();
  if (s = agree(mpi_, fabric_->connect_peers(*blobs), "connecting fabric peers"); !s.ok()) return s;
  fabric_->start_progress();
  if (rank_ == 0) log_->info("fabric: provider {}, domain {}", fabric_->provider_name(), fabric_->domain_name());
  phases_.mark("fabric");
  telemetry_.set_info(NodeInfo{static_cast<std::uint32_t>(rank_), static_cast<std::uint32_t>(nodes_),
                               config_.service.trainers_per_node, fabric_->provider_name(), my_host_, dataset_.samples,
                               dataset_.invalid_samples});
  return Status::ok_status();
}

void Daemon::barrier_before_failing(const Status& why) {
  if (Status s = mpi_.barrier(); !s.ok()) {
    log_->warn("while stopping for \"{}\", the barrier with the other daemons failed too: {}", why.message(),
               s.to_string());
  }
}

Status Daemon::load() {
  // After the fabric started, a failing step first waits for every peer (they may still be
  // reading this arena), with the fabric progressing, then stops the progress thread.
  auto fail_after_fabric = [this](Status why) {
    barrier_before_failing(why);
    fabric_->stop_progress();
    return why;
  };
  if (is_shard_format(config_.dataset.format) && config_.service.open_shard_files > 0) {
    Status s = agree(mpi_, reserve_shard_descriptors(config_.service.open_shard_files), "reserving shard descriptors");
    if (!s.ok()) return fail_after_fabric(s);
    open_shards_ = std::make_unique<ShardFileCache>(config_.service.open_shard_files);
  }
  LoadReporter load_reporter(mpi_, telemetry_, cached_bytes_per_node_);
  if (config_.inject.load_delay.count() > 0) {
    log_->warn("fault injection: every sample loaded costs {} us more (inject.load_delay)",
               config_.inject.load_delay.count());
  }
  Result<LoadStats> loaded = LoadStats{};
  if (owner_side_) {
    // The share as a catalog of its own (id = local index) for the loader, dropped with the
    // routed entries once loaded: afterwards the node holds only own_.
    const Catalog share = Catalog::of_share(share_.tables.shards, share_.entries, {});
    std::vector<std::pair<SampleId, std::uint64_t>> targets;
    targets.reserve(own_.cached_samples());
    for (std::uint64_t i = 0; i < own_.size(); ++i) {
      if (own_.at(i).resident()) targets.emplace_back(static_cast<SampleId>(i), own_.at(i).arena_offset);
    }
    loaded = load_samples(share, std::move(targets), static_cast<std::uint32_t>(rank_), config_.dataset,
                          config_.service.loader_threads, arena_->data(), std::ref(load_reporter),
                          [this] { return stop_.requested(); }, config_.inject.load_delay, open_shards_.get());
    share_ = {};
  } else {
    loaded = load_owned_samples(catalog_, placement_, static_cast<std::uint32_t>(rank_), config_.dataset,
                                config_.service.loader_threads, arena_->data(), std::ref(load_reporter),
                                [this] { return stop_.requested(); }, config_.inject.load_delay, open_shards_.get());
  }
  // SIGTERM during the load (one daemon is enough): every daemon stops here, exit 0.
  {
    const std::uint8_t stopping = stop_.requested() ? 1 : 0;
    Status s = agree(mpi_, loaded.ok() || stopping != 0 ? Status::ok_status() : loaded.status(), "loading samples");
    auto stops = s.ok() ? mpi_.allgather(std::span(&stopping, 1)) : Result<std::vector<std::vector<std::uint8_t>>>(s);
    if (!stops.ok()) return fail_after_fabric(stops.status());
    std::string stopped_ranks;
    for (int r = 0; r < nodes_; ++r) {
      if (!(*stops)[static_cast<std::size_t>(r)].empty() && (*stops)[static_cast<std::size_t>(r)][0] != 0) {
        stopped_ranks += (stopped_ranks.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (!stopped_ranks.empty()) {
      return fail_after_fabric(make_error(StatusCode::kCancelled, "stopped during loading ({}; signal on daemon rank(s) {})",
                                          loaded.ok() ? "load complete" : loaded.status().message(), stopped_ranks));
    }
  }
  log_->info("loaded {} samples, {:.1f} MB in {:.2f} s ({:.0f} MB/s)", loaded->samples, loaded->bytes / 1e6,
             loaded->seconds, loaded->seconds > 0 ? loaded->bytes / 1e6 / loaded->seconds : 0.0);
  if (is_s3_path(config_.dataset.path)) {
    if (Status s = make_unloaded_samples_cold(*loaded); !s.ok()) return fail_after_fabric(s);
  }
  {
    // The skew of the load across nodes: who held everyone up.
    const double mine = loaded->seconds;
    auto times = mpi_.allgather(std::span(reinterpret_cast<const std::uint8_t*>(&mine), sizeof(mine)));
    if (times.ok() && rank_ == 0) {
      std::vector<double> t(times->size());
      for (std::size_t r = 0; r < t.size(); ++r) std::memcpy(&t[r], (*times)[r].data(), sizeof(double));
      const auto slow = std::max_element(t.begin(), t.end()) - t.begin();
      const auto fast = std::min_element(t.begin(), t.end()) - t.begin();
      log_->info("all {} nodes loaded {:.1f} MB in {:.2f} s; slowest node {} ({:.2f} s), fastest node {} ({:.2f} s)",
                 nodes_, dataset_.total_bytes / 1e6, t[static_cast<std::size_t>(slow)], slow,
                 t[static_cast<std::size_t>(slow)], fast, t[static_cast<std::size_t>(fast)]);
    }
  }
  phases_.mark("load");
  return Status::ok_status();
}

// S3, dataset.strict = false: a resident sample whose object was deleted or changed between
// the listing and the load (LoadStats::unreadable) becomes cold on every daemon, so that
// whoever needs it reads it from storage and, while it stays unreadable, skips and counts it
// (decision 0039) instead of peers reading an arena slot that was never filled. Collective:
// every daemon learns every other's samples.
Status Daemon::make_unloaded_samples_cold(const LoadStats& loaded) {
  constexpr std::size_t kMaxLogged = 20;
  std::vector<std::uint64_t> mine;
  for (const auto& [id, why] : loaded.unreadable) {
    if (mine.size() < kMaxLogged) {
      log_->warn("dataset: {} (resident sample {} not loaded: read from storage when needed, skipped while "
                 "unreadable; dataset.strict = false)", why.message(), id);
    }
    mine.push_back(id);
  }
  if (mine.size() > kMaxLogged) log_->warn("dataset: {} more samples not loaded, not shown", mine.size() - kMaxLogged);
  auto gathered = mpi_.allgather(
      std::span(reinterpret_cast<const std::uint8_t*>(mine.data()), mine.size() * sizeof(std::uint64_t)));
  if (!gathered.ok()) return gathered.status();
  std::uint64_t total = 0;
  for (const auto& bytes : *gathered) {
    for (std::size_t at = 0; at + sizeof(std::uint64_t) <= bytes.size(); at += sizeof(std::uint64_t)) {
      std::uint64_t id = 0;
      std::memcpy(&id, bytes.data() + at, sizeof id);
      if (id >= catalog_.size()) {
        return make_error(StatusCode::kInternal, "a daemon reported unloaded sample {} of {}", id, catalog_.size());
      }
      make_cold(placement_, id, catalog_.sample_bytes(id));
      ++total;
    }
  }
  if (total == 0) return Status::ok_status();
  if (rotating_) {
    // Every later generation would choose the sample again and its reload would fail.
    return make_error(StatusCode::kNotFound,
                      "{} resident samples could not be loaded (their objects are gone or changed since the listing; "
                      "the daemons' warnings name each key) and cache rotation cannot leave them out; restore the "
                      "objects, or run without cache.rotation_epochs and cache.reuse_rounds",
                      total);
  }
  if (rank_ == 0) {
    log_->warn("dataset: {} resident samples could not be loaded (objects deleted or changed since the listing; the "
               "loading daemons' warnings name each key): they are cold now, read from storage when needed and "
               "skipped and counted while unreadable (dataset.strict = false)",
               total);
  }
  return Status::ok_status();
}

Status Daemon::start_service() {
  SlowPeer slow_peer{config_.inject.slow_peer_rank, config_.inject.slow_peer_delay};
  if (slow_peer.rank >= 0 && slow_peer.delay.count() > 0) {
    log_->warn("fault injection: fetches from rank {} complete {} us late (inject.slow_peer_*)", slow_peer.rank,
               slow_peer.delay.count());
  }
  // Peer failure detection while serving and draining (docs/decisions/0025, 0026).
  monitor_ = std::make_unique<PeerMonitor>(
      static_cast<std::uint32_t>(rank_), static_cast<std::uint32_t>(nodes_), config_.fault.peer_timeout,
      [fabric = fabric_.get(), region = heartbeat_region_](std::uint32_t peer, std::function<void(const Status&)> done) {
        fabric->heartbeat_read(static_cast<int>(peer), 0, 1, region, peer, std::move(done));
      });
  if (nodes_ > 1) {
    telemetry_.set_failure_detector_figures([monitor = monitor_.get()] { return monitor->figures(); });
    forget_failure_detector_figures_.run = [this] { telemetry_.set_failure_detector_figures({}); };
  }
  fetcher_ = std::make_unique<FabricFetcher>(io_, *fabric_, staging_region_, slow_peer);
  // The storage tier: cold samples are read by the daemon whose trainer needs them (the
  // dataset is on a file system every node sees), with completions on the io thread.
  // fault.peer_death = degrade needs it too: a dead peer's samples are read from storage.
  degrade_ = config_.fault.peer_death == "degrade";
  if (directory_->has_cold_samples() || degrade_) {
    storage_readers_ = std::make_unique<StorageReaderPool>(
        owner_side_ ? storage_files_ : catalog_, config_.dataset, staging_->data(), config_.service.loader_threads,
        [this](std::function<void()> f) { boost::asio::post(io_, std::move(f)); }, config_.inject.storage_delay,
        open_shards_.get());
    if (config_.inject.storage_delay.count() > 0) {
      log_->warn("fault injection: each cold read holds its storage reader {} us longer (inject.storage_delay)",
                 config_.inject.storage_delay.count());
    }
  }
  fetcher_->on_peer_error([this](std::uint32_t peer, const Status& status) { monitor_->report(peer, status); });
  if (rotating_) {
    std::vector<ArenaLayout> initial;
    for (int r = 0; r < nodes_; ++r) {
      const auto k = static_cast<std::uint32_t>(r);
      initial.push_back(initial_arena_layout(
          placement_, k, rotating_arena_bytes(catalog_.sizes(), placement_, k, node_capacities_[k])));
    }
    residency_ = std::make_unique<ResidencyTable>(std::move(initial), generation_clock_);
    if (rank_ == 0 && generation_clock_.rounds > 0) {
      log_->info("cache slot reuse: {} rounds per epoch of {} batches per trainer (cache.reuse_rounds {}); every "
                 "round each node's resident set is re-chosen from the plans (decision 0035), samples in slots being "
                 "reloaded are read from storage meanwhile",
                 generation_clock_.rounds, shape_.batches_per_trainer, config_.cache.reuse_rounds);
    } else if (rank_ == 0) {
      log_->info("cache rotation: a new resident set every {} epoch(s) (cache.rotation_epochs); samples in slots "
                 "being reloaded are read from storage meanwhile",
                 config_.cache.rotation_epochs);
    }
  }
  ServedJob served;
  served.catalog = owner_side_ ? nullptr : &catalog_;  // owner-side: no daemon holds it
  if (owner_side_) {
    served.assemble_catalog = [this] {
      return assemble_catalog(static_cast<std::uint32_t>(rank_), ownership_, own_, *exchange_, storage_files_);
    };
  }
  served.context = SchedulerContext{directory_.get(), planner_.get(), static_cast<std::uint32_t>(rank_),
                                    config_.service.prefetch, config_.shuffle.window, dataset_.classes,
                                    storage_readers_.get(), config_.service.cold_readahead_batches};
  served.context.redealt = redealt_ ? &*redealt_ : nullptr;
  served.context.degrade_dead_peers = degrade_;
  // Bad input found while serving (a file vanished or changed since the scan, an I/O
  // error that a retry did not cure): skip and count, as the scan does, unless strict.
  served.context.skip_unreadable_samples = !config_.dataset.strict;
  // One warning per skipped sample for the first kLoggedSkips, then one per 1,000: a
  // vanished directory must not flood the log; the statistics count every one. Runs on
  // the service thread only.
  served.context.on_skipped = [log = log_, skipped = std::make_shared<std::uint64_t>(0)](
                                  std::uint64_t epoch, SampleId id, const Status& error) {
    constexpr std::uint64_t kLoggedSkips = 100;
    const std::uint64_t n = ++*skipped;
    if (n <= kLoggedSkips || n % 1000 == 0) {
      log->warn("skipping sample {} in epoch {} (dataset.strict = false): {}{}", id, epoch, error.to_string(),
                n == kLoggedSkips ? fmt::format("; only every 1000th skip is logged from now on") : n > kLoggedSkips
                    ? fmt::format(" ({} samples skipped so far on this node)", n) : std::string());
    }
  };
  served.context.rerouted_samples = telemetry_.rerouted_samples();
  served.context.residency = residency_.get();
  served.plan_digest = digest_;
  served.seed = config_.shuffle.seed;
  served.shape = &shape_;
  served.nodes = static_cast<std::uint32_t>(nodes_);
  served.trainers_per_node = config_.service.trainers_per_node;
  served.arena = arena_.get();
  served.staging = staging_.get();
  served.staging_per_trainer = config_.service.staging_bytes_per_trainer;
  served.fetcher = fetcher_.get();
  served.telemetry = &telemetry_;
  served.job_token = job_token_;
  if (!config_.checkpoint.dir.empty()) {
    CheckpointNodeOptions options;
    // Every save is copied into one peer daemon's RAM before it returns (docs/decisions/
    // 0059), preferring a peer in another failure domain: another host, or with emulated
    // nodes (fabric.netns) another network namespace.
    options.rank = rank_;
    for (int r = 0; r < nodes_; ++r) {
      const std::string netns = expand_netns_name(config_.fabric.netns, r);
      options.domains.push_back(netns.empty() ? host_of(static_cast<std::uint32_t>(r))
                                              : host_of(static_cast<std::uint32_t>(r)) + "/" + netns);
    }
    options.dir = config_.checkpoint.dir;
    options.capacity_bytes = config_.checkpoint.capacity_bytes;
    options.retain = config_.checkpoint.retain;
    options.when_full = config_.checkpoint.when_full == "write_through" ? WhenFull::kWriteThrough : WhenFull::kWait;
    options.prefault_pool = config_.checkpoint.prefault;
    replicator_ = std::make_unique<FabricCheckpointReplicator>(*fabric_, mpi_);
    auto node = CheckpointNode::start(std::move(options), replicator_.get());
    SHARDMIX_RETURN_IF_ERROR(agree(mpi_, node.ok() ? Status::ok_status() : node.status(),
                                   "starting checkpoint absorption (checkpoint.dir " + config_.checkpoint.dir + ")"));
    checkpoints_ = std::move(*node);
    replicator_->attach(checkpoints_.get());
    telemetry_.set_checkpoint_stats([node = checkpoints_.get()] { return node->stats(); });
    forget_checkpoint_stats_.run = [this] { telemetry_.set_checkpoint_stats({}); };
    log_->info("checkpoints: absorbed in RAM (checkpoint.capacity {} bytes, retain {}, when_full {}) and drained to "
               "{}; the cache arena is limited to {}; {}",
               config_.checkpoint.capacity_bytes, config_.checkpoint.retain, config_.checkpoint.when_full,
               config_.checkpoint.dir,
               capacity_ == kNoCapacityLimit ? std::string("RAM (cache.capacity = 0)")
                                             : fmt::format("cache.capacity - checkpoint.capacity = {} bytes", capacity_),
               nodes_ > 1 ? "a save returns once a peer daemon holds a copy" : "no peer daemon to hold copies");
  }
  served.checkpoints = checkpoints_.get();
  const std::string socket_path = run_dir_ + "/d" + std::to_string(rank_) + ".sock";
  service_ = std::make_unique<ClientService>(io_, std::move(served), socket_path);
  tear_down_service_.run = [this] {
    if (service_) {
      std::promise<void> destroyed;
      boost::asio::post(io_, [&] {
        service_.reset();
        destroyed.set_value();
      });
      destroyed.get_future().wait();
    }
    fabric_->stop_progress();
    if (storage_readers_ != nullptr) storage_readers_->stop();  // no reader writes into staging after this
  };
  Status listen_status;
  {
    std::promise<Status> listened;
    boost::asio::post(io_, [&] { listened.set_value(service_->listen()); });
    listen_status = listened.get_future().get();
  }
  if (Status s = agree(mpi_, listen_status, "opening the trainer socket"); !s.ok()) {
    barrier_before_failing(s);
    return s;
  }
  return Status::ok_status();
}

Status Daemon::publish_ready() {
  // Every daemon serves; rank 0 publishes the layout for trainers and launchers. Every
  // daemon writes the job token into its run dir first (run dirs are often node-local; the
  // allgather below orders it before rank 0's ready file).
  token_path_ = run_dir_ + "/" + kJobTokenFile;
  if (Status s = write_job_token_file(token_path_, job_token_); !s.ok()) log_->error("{}", s.to_string());
  auto pids = mpi_.allgather(to_bytes(std::to_string(::getpid())));
  if (!pids.ok()) return pids.status();
  for (const auto& p : *pids) pids_.push_back(to_string(p));
  ready_path_ = run_dir_ + "/ready";
  if (Status s = start_trace(); !s.ok()) return s;
  if (rank_ == 0) {
    std::string text = "daemons=" + std::to_string(nodes_) + "\ntrainers_per_node=" +
                       std::to_string(config_.service.trainers_per_node) + "\n";
    for (int r = 0; r < nodes_; ++r) text += "host." + std::to_string(r) + "=" + hosts_[r] + "\n";
    for (int r = 0; r < nodes_; ++r) text += "pid." + std::to_string(r) + "=" + pids_[r] + "\n";
    text += trace::ready_lines(config_.telemetry.trace_dir, config_.telemetry.trace_sample_fraction,
                               config_.telemetry.trace_max_events);
    if (Status s = write_file_atomically(ready_path_, text, /*private_file=*/true); !s.ok()) {
      log_->error("{}", s.to_string());
    }
    log_->info("ready: {} daemons serving {} samples ({:.1f} MB), {} batches of {} per trainer per epoch; run dir {}",
               nodes_, dataset_.samples, dataset_.total_bytes / 1e6, shape_.batches_per_trainer, config_.batch.size,
               run_dir_);
  }
  phases_.mark("serve_setup");
  const auto me = static_cast<std::size_t>(rank_);
  log_startup_report(*log_, rank_, phases_, dataset_.samples,
                     owner_side_ ? own_.cached_samples() : placement_.cached[me].size(), cached_bytes_per_node_[me],
                     *directory_, arena_->length(), staging_->length());
  telemetry_.set_serving(true);
  JobRecord job_record;
  if (rank_ == 0 && !config_.telemetry.stats_file.empty()) {
    job_record.nodes = static_cast<std::uint32_t>(nodes_);
    job_record.trainers_per_node = config_.service.trainers_per_node;
    if (owner_side_) {
      // Rank 0's share stands for the dataset: under spread it is a uniform random sample.
      set_dataset_figures(job_record, own_.sizes());
    } else {
      set_dataset_figures(job_record, catalog_.sizes());
    }
    job_record.classes = dataset_.classes;
    job_record.provider = fabric_->provider_name();
    job_record.config = {
        {"batch.size", std::to_string(config_.batch.size)},
        {"batch.drop_last", config_.batch.drop_last ? "true" : "false"},
        {"cache.capacity", std::to_string(config_.cache.capacity_bytes)},
        {"shuffle.seed", std::to_string(config_.shuffle.seed)},
        {"shuffle.exchange_fraction", fmt::format("{}", config_.shuffle.exchange_fraction)},
        {"shuffle.window", std::to_string(config_.shuffle.window)},
        {"dataset.placement", placement_policy_name(config_.dataset.placement)},
        {"dataset.metadata", config_.dataset.metadata},
        {"service.prefetch", std::to_string(config_.service.prefetch)},
        {"service.staging_bytes_per_trainer", std::to_string(config_.service.staging_bytes_per_trainer)},
        {"service.cold_readahead_batches", std::to_string(config_.service.cold_readahead_batches)},
    };
  }
  pump_ = std::make_unique<TelemetryPump>(config_, mpi_, telemetry_,
                                          static_cast<std::uint32_t>(nodes_) * config_.service.trainers_per_node,
                                          dataset_.samples, dataset_.invalid_samples, job_id(pids_[0]), job_record);
  return Status::ok_status();
}

Status Daemon::start_trace() {
  const TelemetryConfig& t = config_.telemetry;
  if (t.trace_dir.empty()) return Status::ok_status();
  trace::Settings settings;
  settings.path = fmt::format("{}/daemon-{}.json", t.trace_dir, rank_);
  settings.process_name = fmt::format("daemon {} ({})", rank_, my_host_);
  settings.pid = trace::daemon_pid(static_cast<std::uint32_t>(rank_));
  settings.role = "daemon";
  settings.node = static_cast<std::uint32_t>(rank_);
  settings.sample_fraction = t.trace_sample_fraction;
  settings.max_events_per_thread = t.trace_max_events;
  settings.peers = static_cast<std::uint32_t>(nodes_);
  Status s = agree(mpi_, trace::enable(std::move(settings)), "starting the trace (telemetry.trace_dir)");
  if (s.ok()) log_->info("tracing every batch's journey into {}/daemon-{}.json (written at exit)", t.trace_dir, rank_);
  return s;
}

// fault.peer_death = stop: every trainer of this daemon gets the reason, the run files go,
// and the daemon exits 1 without MPI_Finalize (which would wait for the dead rank).
void Daemon::stop_for_dead_peer(const PeerMonitor::Failure& dead) {
  const Status why = make_error(StatusCode::kUnavailable,
                                "daemon rank {} (host {}) is dead or unreachable: {}; stopping the job "
                                "(fault.peer_death = stop)",
                                dead.rank, host_of(dead.rank), dead.reason);
  log_->error("{}", why.message());
  // A scheduler waiting for the dead owner's answer holds the service thread: release it.
  if (exchange_) exchange_->close(why);
  service_->stop(why);
  if (!service_->wait_all_closed(std::chrono::seconds(5))) {
    log_->warn("not every trainer took the error within 5 s; closing their connections");
  }
  // Its checkpoint replicas held here have no other copy: drain them before leaving (the
  // launcher may end this process first; docs/operations.md).
  checkpoints_peer_died(dead.rank);
  drain_checkpoints_before_exit();
  if (rank_ == 0) ::unlink(ready_path_.c_str());
  ::unlink(token_path_.c_str());
  log_->error("exiting with status 1: daemon rank {} failed", dead.rank);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  std::fflush(nullptr);
  std::_Exit(1);
}

// fault.peer_death = degrade: report each death once and keep serving (decisions 0026,
// 0032): the fabric stops reading the dead peer (tcp;ofi_rxm would answer -FI_EAGAIN to
// every read of it forever), every scheduler reads its samples from storage, and the
// detector goes on watching the others.
void Daemon::on_dead_peer(const PeerMonitor::Failure& dead) {
  if (!degrade_) stop_for_dead_peer(dead);
  log_->error("daemon rank {} (host {}) is dead or unreachable: {}; degraded mode: its samples are read from "
              "storage from now on and its trainers are gone (fault.peer_death = degrade)",
              dead.rank, host_of(dead.rank), dead.reason);
  degraded_.push_back(dead.rank);
  fabric_->fail_peer(static_cast<int>(dead.rank),
                     make_error(StatusCode::kUnavailable, "daemon rank {} was declared dead: {}", dead.rank,
                                dead.reason));
  checkpoints_peer_died(dead.rank);
  monitor_->forget(dead.rank);
  telemetry_.peer_degraded(dead.rank);
  pump_->peer_dead(static_cast<int>(dead.rank));
  service_->peer_dead(dead.rank);
}

void Daemon::checkpoints_peer_died(std::uint32_t rank) {
  if (!checkpoints_) return;
  // The replicator first: its offers to the dead rank fail, so the node's re-replication
  // of the versions that rank held does not wait for an answer that never comes.
  replicator_->peer_died(static_cast<std::int32_t>(rank));
  const std::size_t taken_over = checkpoints_->peer_died(static_cast<std::int32_t>(rank));
  if (taken_over > 0) {
    log_->warn("checkpoints: daemon rank {} died; the {} version(s) not yet durable whose replica this daemon holds "
               "are drained from here to {}",
               rank, taken_over, config_.checkpoint.dir);
  }
}

void Daemon::pump_exchange() {
  if (!exchange_) return;
  if (Status s = exchange_->pump(); !s.ok()) {
    log_->error("directory exchange: {}; plans that need another node's samples fail from now on", s.to_string());
  }
}

void Daemon::create_rotation() {
  // Non-blocking (MPI_Isend, completed by pump_rotation each tick): this thread also runs
  // the failure detector, which a blocking send to a slow rank would stall.
  auto send = [this](int to, int tag, std::uint32_t node, std::uint64_t generation) {
    const RotationMessage m{node, 0, generation};
    const auto* raw = reinterpret_cast<const std::uint8_t*>(&m);
    Status sent = mpi_.post_send(to, tag, std::vector<std::uint8_t>(raw, raw + sizeof(m)));
    if (!sent.ok()) {
      log_->error("cache rotation: {} for generation {} of node {} could not be sent to daemon rank {}: {}; node "
                  "{}'s reloads cannot complete, so its changing samples stay on storage",
                  tag == kTagRotationDone ? "Done" : "Readable", generation, node, to, sent.to_string(), node);
    }
  };
  RotationCoordinator::Hooks hooks;
  hooks.send_done = [send](std::uint32_t node, std::uint64_t g) {
    send(static_cast<int>(node), kTagRotationDone, node, g);
  };
  hooks.announce_readable = [send, rank = rank_, nodes = nodes_](std::uint64_t g) {
    for (int r = 0; r < nodes; ++r) {
      if (r != rank) send(r, kTagRotationReadable, static_cast<std::uint32_t>(rank), g);
    }
  };
  hooks.start_reload = [this](const ArenaLayout& layout) {
    log_->info("cache rotation: every daemon is done with generation {} of this node; loading the {} samples "
               "that enter generation {}",
               layout.generation - 1, layout.entering.size(), layout.generation);
    reload_ = std::async(std::launch::async, [this, entering = layout.entering] {
      return load_entering_samples(catalog_, config_.dataset, entering, config_.service.loader_threads,
                                   arena_->data(), [this] { return stop_.requested(); }, open_shards_.get());
    });
  };
  hooks.reload_finished = [this]() -> std::optional<Status> {
    if (!reload_.valid() || reload_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      return std::nullopt;
    }
    auto done = reload_.get();
    if (!done.ok()) return done.status();
    last_reload_ = *done;
    return Status::ok_status();
  };
  // Reuse rounds: the round in which each sample is consumed, per epoch, from every
  // trainer's plan (pure, the same on every daemon), computed once per epoch. 4 bytes
  // per sample per epoch kept: a generation needs its epoch, the one before and the two
  // after, and nodes' generations stay within about an epoch of each other, so epochs
  // more than two before the one asked for are dropped before the lookups.
  auto consumption = std::make_shared<std::map<std::uint64_t, std::vector<std::uint32_t>>>();
  auto rounds_of = [this, consumption](std::uint64_t epoch) -> const std::vector<std::uint32_t>& {
    auto it = consumption->find(epoch);
    if (it == consumption->end()) {
      it = consumption
               ->emplace(epoch, consumption_rounds(planner_->plan_all(epoch), catalog_.size(), generation_clock_))
               .first;
    }
    return it->second;
  };
  hooks.wanted = [this, rounds_of, consumption](std::uint32_t node, std::uint64_t g, const ArenaLayout& current) {
    if (generation_clock_.rounds == 0) {
      return choose_resident(catalog_.sizes(), placement_.owned[node], node_capacities_[node], config_.shuffle.seed,
                             node, g);
    }
    const std::uint64_t epoch = g / generation_clock_.rounds;
    if (epoch >= 3) consumption->erase(consumption->begin(), consumption->lower_bound(epoch - 2));
    const std::vector<std::uint32_t>* after_next = &rounds_of(epoch + 2);
    const std::vector<std::uint32_t>* next = &rounds_of(epoch + 1);
    const std::vector<std::uint32_t>* now = &rounds_of(epoch);
    const std::vector<std::uint32_t>* before = epoch > 0 ? &rounds_of(epoch - 1) : nullptr;
    return choose_by_next_use(catalog_.sizes(), placement_.owned[node], current.arena_bytes, current,
                              {before, now, next, after_next}, generation_clock_, g, config_.shuffle.seed);
  };
  rotation_ = std::make_unique<RotationCoordinator>(static_cast<std::uint32_t>(rank_), static_cast<std::uint32_t>(nodes_),
                                                    catalog_.sizes(), *residency_, std::move(hooks));
}

void Daemon::pump_rotation() {
  if (!rotation_) return;
  if (Status sends = mpi_.test_sends(); !sends.ok()) {
    log_->error("cache rotation: {}; that daemon's fence waits for a message that never came, so the samples "
                "changing there stay on storage",
                sends.to_string());
  }
  for (const int tag : {kTagRotationDone, kTagRotationReadable}) {
    for (;;) {
      auto m = mpi_.try_receive(tag);
      if (!m.ok()) {
        log_->error("cache rotation: receiving: {}", m.status().to_string());
        break;
      }
      if (!m->has_value()) break;
      const MpiSession::Message& msg = **m;
      RotationMessage r;
      if (msg.bytes.size() != sizeof(r) || msg.source < 0 || msg.source >= nodes_) {
        log_->warn("cache rotation: ignoring a {}-byte message from rank {}", msg.bytes.size(), msg.source);
        continue;
      }
      std::memcpy(&r, msg.bytes.data(), sizeof(r));
      if (tag == kTagRotationDone) {
        rotation_->on_done(static_cast<std::uint32_t>(msg.source), r.node, r.generation);
      } else {
        rotation_->on_readable(r.node, r.generation);
      }
    }
  }
  const std::uint64_t before = rotation_->generation(static_cast<std::uint32_t>(rank_));
  Status polled = rotation_->poll();
  if (!polled.ok()) {
    if (polled.code() == StatusCode::kCancelled && stop_.requested()) {
      // A normal shutdown stopped a reload (often the last rotation, triggered by the
      // read-ahead into an epoch no trainer asks for): nothing is wrong.
      log_->info("cache rotation: {} (shutting down)", polled.to_string());
    } else {
      log_->error("cache rotation: {}; this node's changing samples stay on storage", polled.to_string());
    }
  }
  const std::uint64_t now = rotation_->generation(static_cast<std::uint32_t>(rank_));
  if (now != before && last_reload_) {
    log_->info("cache rotation: generation {} readable: {} entering samples ({:.1f} MB) loaded in {:.2f} s", now,
               last_reload_->samples, last_reload_->bytes / 1e6, last_reload_->seconds);
  }
}

int Daemon::serve() {
  // The main thread is idle while serving: it carries the telemetry (MPI stays on it), the
  // failure detector and the cache-rotation fence.
  log_->info("watching {} peer daemons: a heartbeat every {} ms, dead after {:.1f} s without an answer "
             "(fault.peer_timeout), fault.peer_death = {}",
             nodes_ - 1, std::chrono::duration_cast<std::chrono::milliseconds>(monitor_->interval()).count(),
             std::chrono::duration<double>(monitor_->timeout()).count(), config_.fault.peer_death);
  if (rotating_) create_rotation();
  // With rotation the fence's round trips (retire, Done, reload, Readable) each wait for
  // this loop: a finer tick shortens the reload windows in which changing samples come
  // from storage. MPI_Iprobe every 10 ms costs nothing measurable.
  // Checkpoint replication's notices wait for it too: each tick is on a save's path.
  const bool replicating = replicator_ != nullptr && nodes_ > 1;
  // Owner-side metadata: a trainer's plan waits for its owners' answers, which this loop
  // moves (decision 0062); it wakes as soon as a local plan queues an ask, and polls the
  // other daemons' asks every tick.
  // And at least two polls a heartbeat interval: a longer gap between polls is taken as
  // this thread's own pause and not counted in full against the peers (PeerMonitor).
  const std::chrono::milliseconds tick = std::min(
      rotation_ || replicating || exchange_ ? std::chrono::milliseconds(10) : std::chrono::milliseconds(100),
      std::max(std::chrono::milliseconds(1),
               std::chrono::duration_cast<std::chrono::milliseconds>(monitor_->interval() / 2)));
  const auto wait = [&] {
    if (!exchange_) return stop_.wait_for(tick);
    exchange_->wait_for_asks(tick);
    return stop_.requested();
  };
  while (!wait()) {
    while (auto dead = monitor_->poll()) on_dead_peer(*dead);  // degrade: forget() clears it
    pump_exchange();
    pump_->pump();
    pump_rotation();
    if (replicator_) replicator_->pump();
  }
  // A stop signal may follow a peer's death (mpirun stops the job when a rank dies): then
  // the trainers are told which rank died, not only that we were stopped.
  while (auto dead = monitor_->poll()) on_dead_peer(*dead);
  // The shutdown work below (the checkpoints' drain may take minutes) holds this thread on
  // purpose: not a pause to warn about when the barrier's watch resumes.
  monitor_->pausing_on_purpose();

  // Drain: stop serving, then wait for every peer while still progressing the fabric, so
  // no peer's read of our arena is left hanging.
  service_->stop(make_error(StatusCode::kCancelled,
                            "the daemon of node {} is shutting down (it received a stop signal); no more batches",
                            rank_));
  {
    // stop() closes the connections on the io thread (which records passes that ended);
    // a task posted after it runs once that is done.
    std::promise<void> stopped;
    boost::asio::post(io_, [&] { stopped.set_value(); });
    stopped.get_future().wait();
  }
  drain_checkpoints_before_exit();
  if (rank_ == 0) ::unlink(ready_path_.c_str());
  ::unlink(token_path_.c_str());
  if (Status s = trace::write(); !s.ok()) log_->error("{}", s.to_string());
  pump_->finish(std::chrono::seconds(10));
  if (!degraded_.empty()) {
    // A dead rank never reaches the shutdown barrier, and MPI_Finalize would wait for it:
    // a degraded daemon leaves without either. A surviving peer still reading our arena
    // then sees its reads fail and reads those samples from storage (degraded mode).
    // Exit status 0: every trainer of ours was served; the death is reported above, in
    // telemetry (shardmix_degraded_peers) and by mpirun's own status for the dead rank.
    log_->error("exiting with status 0 in degraded mode: daemon rank{} {} died; {} samples were read from storage "
                "instead of a dead peer",
                degraded_.size() > 1 ? "s" : "", fmt::join(degraded_, ", "), telemetry_.rerouted_samples()->load());
    if (storage_readers_) storage_readers_->stop();
    spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
    std::fflush(nullptr);
    std::_Exit(0);
  }
  // A peer that dies now would never reach the barrier: keep watching while waiting. A
  // failure must persist for a second, so a peer that left the barrier first and closed
  // its endpoint is not mistaken for a dead one.
  std::optional<std::chrono::steady_clock::time_point> failing_since;
  Status drained = mpi_.barrier_unless([&]() -> Status {
    pump_exchange();  // a peer still serving may still ask where its plans' samples are
    auto dead = monitor_->poll();
    if (!dead) return Status::ok_status();
    const auto now = std::chrono::steady_clock::now();
    if (!failing_since) failing_since = now;
    if (now - *failing_since < std::chrono::seconds(1)) return Status::ok_status();
    if (degrade_) {
      // A peer that died after we stopped serving: no trainer of ours needs it any more.
      log_->error("daemon rank {} died during shutdown: {}; leaving without the barrier (fault.peer_death = "
                  "degrade), exit status 0",
                  dead->rank, dead->reason);
      spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
      std::fflush(nullptr);
      std::_Exit(0);
    }
    stop_for_dead_peer(*dead);
  });
  log_shutdown_figures();
  if (!drained.ok()) {
    log_->error("{}", drained.to_string());
    return 1;
  }
  return 0;
}

// Long enough for a few GiB on a slow file system; a daemon killed before (SIGKILL, the
// launcher's own timeout) loses what was not durable yet (docs/operations.md).
constexpr std::chrono::seconds kCheckpointDrainAtExit{120};

void Daemon::drain_checkpoints_before_exit() {
  if (!checkpoints_) return;
  // Only what this daemon drains: a replica held for a live peer is that peer's to drain.
  std::set<std::string> pending;
  for (std::string& name : checkpoints_->owned_names()) pending.insert(std::move(name));
  if (pending.empty()) return;
  log_->info("checkpoints: making the newest version of {} name(s) durable before exiting (at most {} s)",
             pending.size(), kCheckpointDrainAtExit.count());
  const auto deadline = std::chrono::steady_clock::now() + kCheckpointDrainAtExit;
  std::map<std::string, Status> last_error;
  while (!pending.empty() && std::chrono::steady_clock::now() < deadline) {
    for (auto it = pending.begin(); it != pending.end();) {
      // Shared: a completion may come after this wait gave up.
      auto outcome = std::make_shared<std::promise<Status>>();
      std::future<Status> done = outcome->get_future();
      checkpoints_->wait_durable(*it, [outcome](const Status& s) { outcome->set_value(s); });
      // The replicator keeps working meanwhile (on this thread, with MPI): the releases of
      // versions made durable here go out to their holders.
      while (done.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready &&
             std::chrono::steady_clock::now() < deadline) {
        if (replicator_) replicator_->pump();
      }
      if (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) break;
      Status s = done.get();
      if (s.ok()) {
        last_error.erase(*it);
        it = pending.erase(it);
      } else {
        last_error[*it] = std::move(s);  // the drain retries with the RAM copy kept
        ++it;
      }
    }
    if (!pending.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  for (const std::string& name : pending) {
    auto error = last_error.find(name);
    log_->error("checkpoint '{}': its newest version is not durable in {} and is lost with this daemon{}", name,
                config_.checkpoint.dir,
                error != last_error.end() ? ": " + error->second.message() : std::string(" (the drain did not finish)"));
  }
}

void Daemon::log_shutdown_figures() {
  if (nodes_ > 1) {
    const PeerMonitor::Figures f = monitor_->figures();
    log_->info("failure detector: slowest heartbeat answer {:.3f} s (daemon rank {}; dead at {:.1f} s), longest gap "
               "between its runs {:.3f} s, {} gaps longer than a heartbeat interval",
               std::chrono::duration<double>(f.slowest_answer).count(), f.slowest_rank,
               std::chrono::duration<double>(monitor_->timeout()).count(),
               std::chrono::duration<double>(f.longest_pause).count(), f.pauses);
  }
  // The node's metadata as the simulator counts it (common/metadata_footprint.h): catalog,
  // placement and the most scheduler state seen while serving.
  const NodeMetadataBytes metadata = node_metadata_bytes(*directory_, telemetry_.scheduler_metadata_bytes_max());
  auto line = format_report_line("metadata", {{"rank", std::to_string(rank_)},
                                              {"samples", std::to_string(dataset_.samples)},
                                              {"catalog_bytes", std::to_string(metadata.catalog)},
                                              {"placement_bytes", std::to_string(metadata.placement)},
                                              {"scheduler_bytes_max", std::to_string(metadata.schedulers)},
                                              {"metadata_bytes", std::to_string(metadata.total())}});
  if (line.ok()) log_->info("{}", *line);
  if (rotation_) {
    const RotationCoordinator::Stats rs = rotation_->stats();
    log_->info("cache rotation: {} generations loaded here, {} entering samples written, {} chosen samples found "
               "no hole (stayed cold); {} unexpected fence messages",
               rs.generations_loaded, rs.samples_loaded, rs.samples_unplaced, rs.unexpected_messages);
  }
  if (storage_readers_) {
    const StorageReaderStats ss = storage_readers_->stats();
    log_->info("storage: {} cold reads, {} bytes read from storage, {} failed", ss.reads_completed, ss.bytes_read,
               ss.reads_failed);
  }
  if (is_s3_path(config_.dataset.path)) {
    // Retries show a throttling or flaky store even when every read succeeded in the end.
    if (auto s3 = shared_s3_client(config_.dataset.s3); s3.ok()) {
      const S3ClientStats st = (*s3)->stats();
      log_->info("s3: {} requests ({} retried), {} bytes received, {} failed; {}", st.requests, st.retries, st.bytes,
                 st.failed, (*s3)->settings().describe());
    }
  }
  if (open_shards_) {
    const ShardFileCacheStats os = open_shards_->stats();
    log_->info("shard descriptors (service.open_shard_files {}): {} reads on a cached descriptor, {} opens ({} more "
               "reads waited for one), {} dropped because the shard changed, {} evicted",
               open_shards_->capacity(), os.hits, os.opens, os.joined, os.changed, os.evictions);
  }
  const fabric::FabricStats fs = fabric_->stats();
  log_->info("fabric {}: {} reads, {} bytes read from peers, {} failed; exiting", fabric_->provider_name(),
             fs.reads_completed, fs.bytes_read, fs.reads_failed);
}

}  // namespace

std::string resolve_run_dir(const Config& config) {
  if (!config.service.run_dir.empty()) return config.service.run_dir;
  if (const char* env = std::getenv("SHARDMIX_RUN_DIR"); env != nullptr && *env != '\0') return env;
  return "/tmp/shardmix-" + std::to_string(geteuid());
}

int run_daemon(const Config& config, MpiSession& mpi) {
  log::init(mpi.rank(), config.log.level, config.log.components);
  auto log = log::get("daemon");
  Daemon daemon(config, mpi);
  Status started = daemon.start();
  if (started.code() == StatusCode::kCancelled) {
    log->info("{}; exiting", started.message());
    return 0;
  }
  if (!started.ok()) {
    log->error("{}", started.to_string());
    return 1;
  }
  return daemon.serve();
}

}  // namespace shardmix
