// shardmix-bench-fabric-read: raw one-sided fi_read throughput through shardmix::fabric,
// the baseline the delivery benchmark is compared against (same sizes, same provider).
//
//   mpirun -np 4 ... shardmix-bench-fabric-read --provider tcp --interface lo --sizes-kib 4,112,1024
//   mpirun -np 4 ... shardmix-bench-fabric-read --provider shm --median-kib 112 --lognormal-sigma 1
//
// Every rank exposes `count` chunks (one fixed size per phase, or log-normal sizes drawn
// with a fixed seed, identical on every rank so nobody needs the others' layouts), then
// reads random chunks of random other ranks with `qd` reads in flight, for --seconds or
// --reads per rank. The next read is posted from the completion callback, so nothing
// but the fabric's own progress thread sits between two reads. Rank 0 prints a table and
// one "JSON {...}" line per phase.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/log.h"
#include "control/mpi_comm.h"
#include "fabric/fabric.h"

namespace {

using shardmix::MpiSession;
using shardmix::Status;
using shardmix::fabric::Fabric;
using shardmix::fabric::LocalRegion;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string provider = "auto";
  std::string interface;
  std::vector<double> sizes_kib{112};
  double median_kib = 0;         // > 0: one phase with log-normal sizes around this median
  double lognormal_sigma = 0.5;  // sigma of ln(size)
  std::uint64_t seed = 42;
  std::size_t count = 1024;
  std::uint32_t qd = 8;
  double seconds = 3;
  std::uint64_t reads = 0;  // > 0: this many reads per rank instead of --seconds
  bool include_self = false;
  // Like the daemon: exposed chunks and read targets in memfd shared memory (shmem pages)
  // rather than private anonymous memory.
  bool shared_memory = false;
  // Ask for transparent huge pages (MADV_HUGEPAGE) on the exposed and target memory, as
  // the daemon does for its arena and staging: the baseline on the same pages.
  bool huge_pages = false;
  // > 0: reads land anywhere in a target area this large (each slot moves on by qd chunks
  // per read), as the daemon's staging spreads them, instead of one hot chunk per slot.
  double staging_mib = 0;
};

// Log-normal sizes are clamped to this range: a 0-byte or multi-GiB chunk is not a sample.
constexpr std::size_t kMinChunkBytes = 1;
constexpr std::size_t kMaxChunkBytes = std::size_t{16} << 20;

struct Layout {
  std::string label;  // "fixed 112 KiB" or "lognormal median 112 KiB sigma 0.5"
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint32_t> lengths;
  std::uint64_t total_bytes = 0;
  std::size_t max_length = 0;
};

Layout fixed_layout(std::size_t chunk_bytes, std::size_t count) {
  Layout layout;
  layout.label = fmt::format("fixed {} B", chunk_bytes);
  for (std::size_t i = 0; i < count; ++i) {
    layout.offsets.push_back(layout.total_bytes);
    layout.lengths.push_back(static_cast<std::uint32_t>(chunk_bytes));
    layout.total_bytes += chunk_bytes;
  }
  layout.max_length = chunk_bytes;
  return layout;
}

// The same seed gives the same layout on every rank (same binary, same std library).
Layout lognormal_layout(double median_bytes, double sigma, std::uint64_t seed, std::size_t count) {
  Layout layout;
  layout.label = fmt::format("lognormal median {:.0f} B sigma {}", median_bytes, sigma);
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> size(std::log(median_bytes), sigma);
  for (std::size_t i = 0; i < count; ++i) {
    const auto bytes = static_cast<std::size_t>(
        std::clamp(std::llround(size(rng)), static_cast<long long>(kMinChunkBytes), static_cast<long long>(kMaxChunkBytes)));
    layout.offsets.push_back(layout.total_bytes);
    layout.lengths.push_back(static_cast<std::uint32_t>(bytes));
    layout.total_bytes += bytes;
    layout.max_length = std::max(layout.max_length, bytes);
  }
  return layout;
}

// One rank's figures for a phase; exchanged as raw bytes (all ranks run the same binary).
struct RankResult {
  std::uint64_t reads = 0;
  std::uint64_t bytes = 0;
  std::uint64_t failed = 0;
  std::uint64_t wrong_bytes = 0;  // reads whose first/last byte did not name the peer
  double seconds = 0;
  double p50_us = 0;
  double p99_us = 0;
};
static_assert(std::is_trivially_copyable_v<RankResult>, "RankResult is exchanged as raw bytes");

// Keeps `qd` reads in flight: each slot's completion callback (on the fabric's progress
// thread) posts the slot's next read until time or the read budget runs out.
class ReadDriver {
 public:
  ReadDriver(Fabric& fabric, const Layout& layout, const LocalRegion& staging, const Options& options, int rank,
             int nranks)
      : fabric_(fabric), layout_(layout), staging_(staging), options_(options), rank_(rank), nranks_(nranks) {
    for (std::uint32_t slot = 0; slot < options.qd; ++slot) {
      slots_.push_back(Slot{std::mt19937_64(options.seed * 1000003 + static_cast<std::uint64_t>(rank) * 1009 + slot),
                            0, 0, {}, slot});
    }
    latencies_us_.reserve(1 << 20);
  }

  // Issues the first read of every slot; returns when every slot has retired.
  RankResult run() {
    start_ = Clock::now();
    deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.seconds));
    {
      std::lock_guard lock(finish_mutex_);
      active_slots_ = slots_.size();
    }
    for (std::size_t slot = 0; slot < slots_.size(); ++slot) issue(slot);
    std::unique_lock lock(finish_mutex_);
    all_retired_.wait(lock, [&] { return active_slots_ == 0; });
    result_.seconds = std::chrono::duration<double>(finish_ - start_).count();
    if (!latencies_us_.empty()) {
      std::sort(latencies_us_.begin(), latencies_us_.end());
      result_.p50_us = latencies_us_[latencies_us_.size() / 2];
      result_.p99_us = latencies_us_[latencies_us_.size() * 99 / 100];
    }
    return result_;
  }

  const std::string& first_error() const { return first_error_; }

 private:
  struct Slot {
    std::mt19937_64 rng;
    int peer;
    std::size_t chunk;
    Clock::time_point posted;
    std::uint64_t lane = 0;  // which max_length-sized piece of staging the read lands in
  };

  bool more_wanted() const {
    if (failed_.load(std::memory_order_relaxed)) return false;
    if (options_.reads > 0) return issued_.load(std::memory_order_relaxed) < options_.reads;
    return Clock::now() < deadline_;
  }

  void issue(std::size_t slot_index) {
    Slot& slot = slots_[slot_index];
    if (!more_wanted()) {
      retire();
      return;
    }
    const int candidates = options_.include_self ? nranks_ : nranks_ - 1;
    const int pick = static_cast<int>(slot.rng() % static_cast<std::uint64_t>(candidates));
    slot.peer = options_.include_self || pick < rank_ ? pick : pick + 1;  // skip our own rank
    slot.chunk = static_cast<std::size_t>(slot.rng() % layout_.offsets.size());
    slot.posted = Clock::now();
    issued_.fetch_add(1, std::memory_order_relaxed);
    // Slot k only uses lanes k, k + qd, k + 2 qd, ... (a multiple of qd lanes in all), so
    // two reads in flight never share bytes.
    const std::uint64_t lanes = staging_.length / layout_.max_length / options_.qd * options_.qd;
    slot.lane = (slot.lane + options_.qd) % lanes;
    fabric_.read(slot.peer, layout_.offsets[slot.chunk], layout_.lengths[slot.chunk], staging_,
                 slot.lane * layout_.max_length, [this, slot_index](const Status& status) {
                   on_complete(slot_index, status);
                 });
  }

  void on_complete(std::size_t slot_index, const Status& status) {
    Slot& slot = slots_[slot_index];
    if (!status.ok()) {
      ++result_.failed;
      if (!failed_.exchange(true, std::memory_order_relaxed)) first_error_ = status.to_string();
    } else {
      const std::uint32_t length = layout_.lengths[slot.chunk];
      const auto* data = static_cast<const std::uint8_t*>(staging_.base) + slot.lane * layout_.max_length;
      const auto expected = static_cast<std::uint8_t>(slot.peer + 1);
      if (data[0] != expected || data[length - 1] != expected) ++result_.wrong_bytes;
      ++result_.reads;
      result_.bytes += length;
      latencies_us_.push_back(
          static_cast<float>(std::chrono::duration<double, std::micro>(Clock::now() - slot.posted).count()));
    }
    issue(slot_index);
  }

  void retire() {
    std::lock_guard lock(finish_mutex_);
    finish_ = Clock::now();
    if (--active_slots_ == 0) all_retired_.notify_all();
  }

  Fabric& fabric_;
  const Layout& layout_;
  const LocalRegion& staging_;
  const Options& options_;
  const int rank_;
  const int nranks_;

  // Slot k is touched by whoever issues its read: run() for the first one, then its
  // callbacks on the progress thread (the fabric's queue orders the hand-over). The
  // counters below are shared by all slots, and run() issues while early callbacks
  // already run, hence atomic.
  std::vector<Slot> slots_;
  std::atomic<std::uint64_t> issued_{0};
  std::atomic<bool> failed_{false};
  // Written only by callbacks; run() reads them after every slot retired (finish_mutex_ orders it).
  std::string first_error_;
  RankResult result_;
  std::vector<float> latencies_us_;
  Clock::time_point start_;
  Clock::time_point deadline_;

  std::mutex finish_mutex_;  // guards active_slots_ and finish_
  std::condition_variable all_retired_;
  std::size_t active_slots_ = 0;
  Clock::time_point finish_;
};

std::string rank_json(int rank, const RankResult& r) {
  return fmt::format(
      R"({{"rank":{},"reads":{},"bytes":{},"seconds":{:.4f},"gbps":{:.4f},"ops_per_s":{:.1f},"p50_us":{:.1f},"p99_us":{:.1f},"failed":{},"wrong_bytes":{}}})",
      rank, r.reads, r.bytes, r.seconds, r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0.0,
      r.seconds > 0 ? r.reads / r.seconds : 0.0, r.p50_us, r.p99_us, r.failed, r.wrong_bytes);
}

void report(const std::vector<RankResult>& results, const Layout& layout, const Options& options, const Fabric& fabric,
            int nranks) {
  std::uint64_t total_bytes = 0;
  std::uint64_t total_reads = 0;
  double longest = 0;
  std::string per_rank;
  std::printf("\n%s, %zu chunks per rank (mean %.1f KiB), qd %u, %d ranks, provider %s (%s)\n", layout.label.c_str(),
              layout.offsets.size(), static_cast<double>(layout.total_bytes) / layout.offsets.size() / 1024,
              options.qd, nranks, fabric.provider_name().c_str(), fabric.domain_name().c_str());
  std::printf("%5s %10s %12s %8s %9s %12s %9s %9s %6s\n", "rank", "reads", "MiB", "seconds", "GB/s", "ops/s", "p50 us",
              "p99 us", "errors");
  for (int rank = 0; rank < nranks; ++rank) {
    const RankResult& r = results[static_cast<std::size_t>(rank)];
    total_bytes += r.bytes;
    total_reads += r.reads;
    longest = std::max(longest, r.seconds);
    std::printf("%5d %10llu %12.1f %8.3f %9.3f %12.0f %9.1f %9.1f %6llu\n", rank,
                static_cast<unsigned long long>(r.reads), r.bytes / 1048576.0, r.seconds,
                r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0.0, r.seconds > 0 ? r.reads / r.seconds : 0.0, r.p50_us,
                r.p99_us, static_cast<unsigned long long>(r.failed + r.wrong_bytes));
    per_rank += (rank > 0 ? "," : "") + rank_json(rank, r);
  }
  // Aggregate: everything moved, over the time the slowest rank took.
  const double total_gbps = longest > 0 ? total_bytes / longest / 1e9 : 0.0;
  const double total_ops = longest > 0 ? total_reads / longest : 0.0;
  std::printf("%5s %10llu %12.1f %8.3f %9.3f %12.0f\n", "total", static_cast<unsigned long long>(total_reads),
              total_bytes / 1048576.0, longest, total_gbps, total_ops);
  const bool lognormal = options.median_kib > 0;
  std::printf(
      "JSON {\"bench\":\"fabric_read\",\"provider\":\"%s\",\"domain\":\"%s\",\"ranks\":%d,\"qd\":%u,"
      "\"size_mode\":\"%s\",\"size_bytes\":%zu,\"median_bytes\":%.0f,\"sigma\":%g,\"seed\":%llu,"
      "\"count\":%zu,\"mean_size_bytes\":%.1f,\"include_self\":%s,\"seconds\":%.4f,\"total_bytes\":%llu,"
      "\"total_reads\":%llu,\"total_gbps\":%.4f,\"total_ops_per_s\":%.1f,\"per_rank\":[%s]}\n",
      fabric.provider_name().c_str(), fabric.domain_name().c_str(), nranks, options.qd,
      lognormal ? "lognormal" : "fixed", lognormal ? std::size_t{0} : layout.max_length,
      lognormal ? options.median_kib * 1024 : 0.0, lognormal ? options.lognormal_sigma : 0.0,
      static_cast<unsigned long long>(options.seed), layout.offsets.size(),
      static_cast<double>(layout.total_bytes) / layout.offsets.size(), options.include_self ? "true" : "false",
      longest, static_cast<unsigned long long>(total_bytes), static_cast<unsigned long long>(total_reads), total_gbps,
      total_ops, per_rank.c_str());
  std::fflush(stdout);
}

// Aborts the whole job: a bench rank that gives up alone would leave the others hanging
// in the next collective.
[[noreturn]] void die(const Status& status, int rank) {
  std::fprintf(stderr, "[rank %d] shardmix-bench-fabric-read: %s\n", rank, status.to_string().c_str());
  std::fflush(stderr);
  std::exit(EXIT_FAILURE);
}

template <typename T>
T value_or_die(shardmix::Result<T> result, int rank) {
  if (!result.ok()) die(result.status(), rank);
  return std::move(result).value();
}

}  // namespace

// A benchmark buffer: private anonymous memory, or (--shared-memory) a memfd mapped
// MAP_SHARED like the daemon's arena and staging, whose shmem pages the kernel's
// process_vm_readv pins and walks differently from anonymous ones.
class BenchMemory {
 public:
  BenchMemory(std::size_t bytes, bool shared, bool huge, const char* what, int rank)
      : bytes_(std::max<std::size_t>(bytes, 1)) {
    int fd = -1;
    if (shared) {
      fd = memfd_create(what, MFD_CLOEXEC);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
        die(shardmix::make_error(shardmix::StatusCode::kResourceExhausted, "memfd for {} ({} bytes): {}", what, bytes_,
                                 std::strerror(errno)),
            rank);
      }
    }
    void* data = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, shared ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS, fd, 0);
    if (fd >= 0) ::close(fd);  // the mapping keeps the memfd alive
    if (data == MAP_FAILED) {
      die(shardmix::make_error(shardmix::StatusCode::kResourceExhausted, "mapping {} ({} bytes): {}", what, bytes_,
                               std::strerror(errno)),
          rank);
    }
    data_ = static_cast<std::uint8_t*>(data);
    if (huge) (void)madvise(data_, bytes_, MADV_HUGEPAGE);  // before the pages are first written
  }
  ~BenchMemory() { munmap(data_, bytes_); }
  BenchMemory(const BenchMemory&) = delete;
  BenchMemory& operator=(const BenchMemory&) = delete;
  std::uint8_t* data() { return data_; }
  std::size_t size() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::uint8_t* data_ = nullptr;
};

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  const int rank = mpi.rank();
  const int nranks = mpi.size();
  const char* log_level = std::getenv("SHARDMIX_LOG_LEVEL");
  shardmix::log::init(rank, log_level != nullptr ? log_level : "warn");

  Options options;
  CLI::App app{"Raw fi_read throughput between shardmix ranks (run under mpirun)"};
  app.add_option("--provider", options.provider, "auto, tcp, shm, verbs or a libfabric provider name");
  app.add_option("--interface", options.interface, "libfabric domain/fabric name, e.g. lo (single host, tcp)");
  app.add_option("--sizes-kib", options.sizes_kib, "chunk sizes in KiB, one phase each")->delimiter(',');
  app.add_option("--median-kib", options.median_kib, "log-normal chunk sizes around this median (one phase)");
  app.add_option("--lognormal-sigma", options.lognormal_sigma, "sigma of ln(size) for --median-kib");
  app.add_option("--seed", options.seed, "seed for sizes and read choices");
  app.add_option("--count", options.count, "chunks each rank exposes")->check(CLI::PositiveNumber);
  app.add_option("--qd", options.qd, "reads in flight per rank")->check(CLI::PositiveNumber);
  auto* seconds = app.add_option("--seconds", options.seconds, "seconds of reading per phase");
  app.add_option("--reads", options.reads, "reads per rank per phase instead of --seconds")->excludes(seconds);
  app.add_flag("--include-self", options.include_self, "also read this rank's own region");
  app.add_flag("--shared-memory", options.shared_memory,
               "expose and read into memfd shared memory, as the daemon does (default: private memory)");
  app.add_flag("--huge-pages", options.huge_pages,
               "ask for transparent huge pages on exposed and target memory, as the daemon does (the kernel "
               "decides: transparent_hugepage/enabled for private memory, shmem_enabled for --shared-memory)");
  app.add_option("--staging-mib", options.staging_mib,
                 "spread reads over a target area this large (default: one chunk per slot)")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = rank == 0 ? app.exit(e) : (e.get_exit_code() != 0 ? 1 : 0);
    return code;
  }
  if (nranks == 1) options.include_self = true;  // nobody else to read from

  std::vector<Layout> layouts;
  if (options.median_kib > 0) {
    layouts.push_back(lognormal_layout(options.median_kib * 1024, options.lognormal_sigma, options.seed, options.count));
  } else {
    for (double kib : options.sizes_kib) {
      const auto bytes = static_cast<std::size_t>(std::llround(kib * 1024));
      if (bytes == 0) die(shardmix::make_error(shardmix::StatusCode::kInvalidArgument, "--sizes-kib {} is 0 bytes", kib), rank);
      layouts.push_back(fixed_layout(bytes, options.count));
    }
  }
  std::uint64_t exposed_bytes = 0;
  std::size_t staging_bytes = 0;
  for (const Layout& layout : layouts) {
    exposed_bytes = std::max(exposed_bytes, layout.total_bytes);
    staging_bytes = std::max(staging_bytes, layout.max_length * options.qd);
    staging_bytes = std::max(staging_bytes, static_cast<std::size_t>(options.staging_mib * 1048576) /
                                                layout.max_length * layout.max_length);
  }

  shardmix::fabric::FabricOptions fabric_options;
  fabric_options.provider = options.provider;
  fabric_options.interface = options.interface;
  fabric_options.max_outstanding_reads = options.qd;
  std::unique_ptr<Fabric> fabric = value_or_die(Fabric::create(fabric_options, rank, nranks), rank);

  // Every byte of rank r's region is r+1, so a read can be checked by its first and last
  // byte; writing it also faults the pages in before anyone reads them.
  BenchMemory exposed(exposed_bytes, options.shared_memory, options.huge_pages, "exposed", rank);
  BenchMemory staging(staging_bytes, options.shared_memory, options.huge_pages, "staging", rank);
  std::memset(exposed.data(), rank + 1, exposed.size());
  std::memset(staging.data(), 0, staging.size());
  if (Status s = fabric->expose(exposed.data(), exposed.size()); !s.ok()) die(s, rank);
  const LocalRegion local = value_or_die(fabric->register_local(staging.data(), staging.size()), rank);
  const auto blobs = value_or_die(mpi.allgather(fabric->endpoint_blob()), rank);
  if (Status s = fabric->connect_peers(blobs); !s.ok()) die(s, rank);
  fabric->start_progress();

  if (rank == 0) {
    std::printf("shardmix-bench-fabric-read: %d ranks, provider %s, domain %s, %.1f MiB exposed per rank\n", nranks,
                fabric->provider_name().c_str(), fabric->domain_name().c_str(), exposed_bytes / 1048576.0);
  }

  int exit_code = EXIT_SUCCESS;
  for (const Layout& layout : layouts) {
    // Warm-up: a few reads per peer so connection setup (rxm connects lazily) is not timed.
    {
      Options warmup = options;
      warmup.reads = static_cast<std::uint64_t>(nranks) * options.qd * 4;
      ReadDriver driver(*fabric, layout, local, warmup, rank, nranks);
      driver.run();
    }
    if (Status s = mpi.barrier(); !s.ok()) die(s, rank);
    ReadDriver driver(*fabric, layout, local, options, rank, nranks);
    const RankResult mine = driver.run();
    if (!driver.first_error().empty()) {
      std::fprintf(stderr, "[rank %d] first read error: %s\n", rank, driver.first_error().c_str());
    }
    // Ranks that finished keep serving the others while they wait here.
    if (Status s = mpi.barrier(); !s.ok()) die(s, rank);
    std::vector<std::uint8_t> bytes(sizeof(RankResult));
    std::memcpy(bytes.data(), &mine, sizeof(RankResult));
    const auto gathered = value_or_die(mpi.allgather(bytes), rank);
    std::vector<RankResult> results(gathered.size());
    for (std::size_t r = 0; r < gathered.size(); ++r) std::memcpy(&results[r], gathered[r].data(), sizeof(RankResult));
    for (const RankResult& r : results) {
      if (r.failed > 0 || r.wrong_bytes > 0) exit_code = EXIT_FAILURE;
    }
    if (rank == 0) report(results, layout, options, *fabric, nranks);
  }

  if (Status s = mpi.barrier(); !s.ok()) die(s, rank);
  fabric->stop_progress();
  return exit_code;
}
