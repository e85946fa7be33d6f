// Multi-rank fabric test, started by ctest through mpirun (see CMakeLists.txt here):
//   fabric_read_mpitest PROVIDER [INTERFACE]
// Every rank exposes a buffer with a rank-dependent pattern, the ranks exchange endpoint
// blobs with MpiSession::allgather, and every rank reads ranges of every rank's region
// (its own included) from two threads at once, then checks the bytes, the guard bytes
// between targets, errors for bad reads (which must name the peer), and the stats.
// Before that, the MpiSession collectives are checked; afterwards a rank that exposes
// nothing; vectored reads (read_many) in between. Seeds are fixed: every run issues the same reads. Prints PASS/FAIL on rank 0;
// exits non-zero on every rank on failure.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/log.h"
#include "control/mpi_comm.h"
#include "fabric/fabric.h"

namespace {

using shardmix::MpiSession;
using shardmix::Result;
using shardmix::Status;
using shardmix::StatusCode;
using shardmix::fabric::Fabric;
using shardmix::fabric::FabricOptions;
using shardmix::fabric::LocalRegion;

constexpr auto kCompletionTimeout = std::chrono::seconds(60);
// Odd on purpose: the last byte of the region is not word- or page-aligned.
constexpr std::size_t kExposedLength = (6u << 20) + 123;
constexpr std::size_t kGuardBytes = 64;
constexpr std::uint8_t kGuardByte = 0xEE;
constexpr std::uint64_t kSeed = 20240611;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The byte at `offset` of `rank`'s exposed region: differs between ranks and offsets.
std::uint8_t pattern_byte(int rank, std::uint64_t offset) {
  const std::uint64_t word = splitmix64((static_cast<std::uint64_t>(rank) << 48) ^ (offset / 8));
  return static_cast<std::uint8_t>(word >> (8 * (offset % 8)));
}

class Failures {
 public:
  explicit Failures(int rank) : rank_(rank) {}
  void fail(const std::string& what) {
    std::fprintf(stderr, "[rank %d] FAIL: %s\n", rank_, what.c_str());
    ++count_;
  }
  void check(bool ok, const std::string& what) {
    if (!ok) fail(what);
  }
  int count() const { return count_; }

 private:
  int rank_;
  int count_ = 0;
};

// Collects the outcome of a batch of reads; callbacks run on the progress thread.
class Completions {
 public:
  explicit Completions(std::size_t count) : statuses_(count), remaining_(count) {}

  shardmix::fabric::ReadCallback callback_for(std::size_t index) {
    return [this, index](const Status& status) {
      std::lock_guard lock(mutex_);
      statuses_[index] = status;
      if (--remaining_ == 0) all_done_.notify_all();
    };
  }

  // False on timeout (the reads are then still owned by the fabric: do not free buffers).
  bool wait() {
    std::unique_lock lock(mutex_);
    return all_done_.wait_for(lock, kCompletionTimeout, [&] { return remaining_ == 0; });
  }

  std::size_t remaining() {
    std::lock_guard lock(mutex_);
    return remaining_;
  }
  const Status& status(std::size_t index) const { return statuses_[index]; }

 private:
  std::mutex mutex_;  // guards statuses_ and remaining_
  std::condition_variable all_done_;
  std::vector<Status> statuses_;
  std::size_t remaining_;
};

struct PlannedRead {
  int peer;
  std::uint64_t remote_offset;
  std::size_t length;
  std::size_t local_offset;  // kGuardBytes of guard precede and follow every target
};

std::vector<PlannedRead> plan_reads(int rank, int nranks, std::size_t& local_bytes) {
  std::mt19937_64 rng(kSeed + static_cast<std::uint64_t>(rank));
  std::vector<PlannedRead> reads;
  local_bytes = kGuardBytes;
  auto add = [&](int peer, std::uint64_t offset, std::size_t length) {
    reads.push_back({peer, offset, length, local_bytes});
    local_bytes += length + kGuardBytes;
  };
  const std::size_t fixed_sizes[] = {1, 2, 7, 8, 4096, 4097, 112 * 1024, 1 << 20, (1 << 20) + 1};
  for (int peer = 0; peer < nranks; ++peer) {  // including this rank's own region
    add(peer, 0, 1);                           // first byte
    add(peer, kExposedLength - 1, 1);          // last byte
    add(peer, kExposedLength - 4096, 4096);    // the tail
    for (std::size_t size : fixed_sizes) {
      std::uniform_int_distribution<std::uint64_t> offset(0, kExposedLength - size);
      add(peer, offset(rng), size);
    }
    std::uniform_int_distribution<std::size_t> random_size(1, 256 * 1024);
    for (int i = 0; i < 8; ++i) {
      const std::size_t size = random_size(rng);
      std::uniform_int_distribution<std::uint64_t> offset(0, kExposedLength - size);
      add(peer, offset(rng), size);
    }
  }
  add((rank + 1) % nranks, 0, kExposedLength);  // one whole region
  std::shuffle(reads.begin(), reads.end(), rng);  // interleave peers and sizes in the queue
  return reads;
}

// Registers `target` as this rank's landing area, swaps endpoints with every rank and
// starts progress: after this, reads can be posted.
Result<LocalRegion> register_and_connect(const MpiSession& mpi, Fabric& fabric, std::vector<std::uint8_t>& target) {
  SHARDMIX_ASSIGN_OR_RETURN(LocalRegion local, fabric.register_local(target.data(), target.size()));
  SHARDMIX_ASSIGN_OR_RETURN(auto blobs, mpi.allgather(fabric.endpoint_blob()));
  SHARDMIX_RETURN_IF_ERROR(fabric.connect_peers(blobs));
  fabric.start_progress();
  return local;
}

// The MpiSession collectives the fabric bootstrap relies on: allgather of unequal (and
// empty) contributions, broadcast from a non-zero root, allreduce_sum.
Status run_collectives_phase(const MpiSession& mpi, const FabricOptions&, Failures& failures) {
  const int rank = mpi.rank();
  const int nranks = mpi.size();
  auto contribution = [](int r) {  // rank 0 contributes nothing
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(r) * 1000);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern_byte(r, i);
    return bytes;
  };
  SHARDMIX_ASSIGN_OR_RETURN(auto gathered, mpi.allgather(contribution(rank)));
  failures.check(gathered.size() == static_cast<std::size_t>(nranks), "allgather returned the wrong number of ranks");
  for (int r = 0; r < nranks && r < static_cast<int>(gathered.size()); ++r) {
    failures.check(gathered[static_cast<std::size_t>(r)] == contribution(r),
                   fmt::format("allgather: rank {}'s bytes arrived wrong", r));
  }
  const int root = nranks - 1;
  const std::vector<std::uint8_t> root_bytes = contribution(root);
  SHARDMIX_ASSIGN_OR_RETURN(auto broadcast, mpi.broadcast(rank == root ? root_bytes : std::vector<std::uint8_t>{}, root));
  failures.check(broadcast == root_bytes, "broadcast from the last rank arrived wrong");
  SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t sum, mpi.allreduce_sum(static_cast<std::uint64_t>(rank) + 1));
  failures.check(sum == static_cast<std::uint64_t>(nranks) * (nranks + 1) / 2, fmt::format("allreduce_sum gave {}", sum));
  failures.check(!mpi.broadcast({}, nranks).ok(), "broadcast from a rank that does not exist succeeded");
  return mpi.barrier();
}

Status run_pattern_phase(const MpiSession& mpi, const FabricOptions& options, Failures& failures) {
  const int rank = mpi.rank();
  const int nranks = mpi.size();
  SHARDMIX_ASSIGN_OR_RETURN(std::unique_ptr<Fabric> fabric, Fabric::create(options, rank, nranks));
  if (rank == 0) std::printf("provider %s, domain %s\n", fabric->provider_name().c_str(), fabric->domain_name().c_str());

  std::vector<std::uint8_t> exposed(kExposedLength);
  for (std::size_t i = 0; i < exposed.size(); ++i) exposed[i] = pattern_byte(rank, i);
  SHARDMIX_RETURN_IF_ERROR(fabric->expose(exposed.data(), exposed.size()));

  std::size_t local_bytes = 0;
  const std::vector<PlannedRead> reads = plan_reads(rank, nranks, local_bytes);
  std::vector<std::uint8_t> target(local_bytes, kGuardByte);
  SHARDMIX_ASSIGN_OR_RETURN(LocalRegion local, register_and_connect(mpi, *fabric, target));

  // Good reads, issued from two threads at once (read() is documented thread-safe);
  // far more than max_outstanding_reads, so the queue and EAGAIN paths get used.
  Completions good(reads.size());
  {
    auto issue = [&](std::size_t first, std::size_t step) {
      for (std::size_t i = first; i < reads.size(); i += step) {
        const PlannedRead& r = reads[i];
        fabric->read(r.peer, r.remote_offset, r.length, local, r.local_offset, good.callback_for(i));
      }
    };
    std::thread helper(issue, 1, 2);
    issue(0, 2);
    helper.join();
  }
  if (!good.wait()) {
    failures.fail(fmt::format("{} of {} reads did not complete within {} s", good.remaining(), reads.size(),
                              kCompletionTimeout.count()));
    std::fflush(stderr);
    std::_Exit(EXIT_FAILURE);  // the fabric still owns the buffers; nothing can be torn down safely
  }
  std::uint64_t expected_bytes = 0;
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const PlannedRead& r = reads[i];
    const std::string what = fmt::format("read {} bytes at {} from peer {}", r.length, r.remote_offset, r.peer);
    if (!good.status(i).ok()) {
      failures.fail(what + ": " + good.status(i).to_string());
      continue;
    }
    expected_bytes += r.length;
    for (std::size_t b = 0; b < r.length; ++b) {
      if (target[r.local_offset + b] != pattern_byte(r.peer, r.remote_offset + b)) {
        failures.fail(fmt::format("{}: wrong byte at +{}: {:#04x}, expected {:#04x}", what, b,
                                  target[r.local_offset + b], pattern_byte(r.peer, r.remote_offset + b)));
        break;
      }
    }
    for (std::size_t g = 1; g <= kGuardBytes; ++g) {
      if (target[r.local_offset - g] != kGuardByte || target[r.local_offset + r.length + g - 1] != kGuardByte) {
        failures.fail(what + ": wrote outside its target range");
        break;
      }
    }
  }

  // Bad reads: each must fail through its callback, and say which peer it was about.
  const int next = (rank + 1) % nranks;
  struct BadRead {
    int peer;
    std::uint64_t remote_offset;
    std::size_t length;
    std::size_t local_offset;
    const char* why;
  };
  const BadRead bad_reads[] = {
      {next, kExposedLength - 10, 100, kGuardBytes, "runs past the end of the peer's region"},
      {next, kExposedLength + 1, 1, kGuardBytes, "starts past the end of the peer's region"},
      {next, ~std::uint64_t{0} - 2, 16, kGuardBytes, "offset + length overflows"},
      {nranks, 0, 1, kGuardBytes, "peer rank does not exist"},
      {-1, 0, 1, kGuardBytes, "negative peer rank"},
      {next, 0, 16, local_bytes - 8, "overflows the local region"},
  };
  const std::size_t kBadReads = std::size(bad_reads);
  Completions bad(kBadReads);
  for (std::size_t i = 0; i < kBadReads; ++i) {
    const BadRead& r = bad_reads[i];
    fabric->read(r.peer, r.remote_offset, r.length, local, r.local_offset, bad.callback_for(i));
  }
  // A zero-length read inside the region is valid and moves nothing.
  Completions empty(1);
  fabric->read(next, 5, 0, local, kGuardBytes, empty.callback_for(0));
  if (!bad.wait() || !empty.wait()) {
    failures.fail("bad or empty reads did not complete");
    std::fflush(stderr);
    std::_Exit(EXIT_FAILURE);
  }
  for (std::size_t i = 0; i < kBadReads; ++i) {
    const Status& status = bad.status(i);
    const std::string peer_text = fmt::format("peer {}", bad_reads[i].peer);
    failures.check(!status.ok(), fmt::format("a read that {} succeeded", bad_reads[i].why));
    failures.check(status.message().find(peer_text) != std::string::npos,
                   fmt::format("error for a read that {} does not name '{}': {}", bad_reads[i].why, peer_text,
                               status.to_string()));
  }
  failures.check(empty.status(0).ok(), "zero-length read failed: " + empty.status(0).to_string());

  const shardmix::fabric::FabricStats stats = fabric->stats();
  failures.check(stats.bytes_read == expected_bytes,
                 fmt::format("stats().bytes_read {} != {} bytes read", stats.bytes_read, expected_bytes));
  failures.check(stats.reads_posted == reads.size(),
                 fmt::format("stats().reads_posted {} != {}", stats.reads_posted, reads.size()));
  failures.check(stats.reads_completed == reads.size() + 1,
                 fmt::format("stats().reads_completed {} != {}", stats.reads_completed, reads.size() + 1));
  failures.check(stats.reads_failed == kBadReads,
                 fmt::format("stats().reads_failed {} != {}", stats.reads_failed, kBadReads));

  // Serving while in MPI: every other rank is already waiting in the barrier (it cannot
  // leave before rank 0 arrives) when rank 0 reads from all of them once more. Only their
  // progress threads can answer; without them this hangs and the wait below fails.
  if (rank == 0) {
    Completions late(static_cast<std::size_t>(nranks));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the others reach the barrier
    for (int peer = 0; peer < nranks; ++peer) {
      fabric->read(peer, 4096, 112 * 1024, local, kGuardBytes, late.callback_for(static_cast<std::size_t>(peer)));
    }
    if (!late.wait()) {
      failures.fail("reads from ranks waiting in MPI_Ibarrier did not complete: their progress stopped");
      std::fflush(stderr);
      std::_Exit(EXIT_FAILURE);
    }
    for (int peer = 0; peer < nranks; ++peer) {
      failures.check(late.status(static_cast<std::size_t>(peer)).ok(),
                     fmt::format("read from peer {} while it waited in MPI: {}", peer,
                                 late.status(static_cast<std::size_t>(peer)).to_string()));
    }
  }
  SHARDMIX_RETURN_IF_ERROR(mpi.barrier());
  fabric->stop_progress();

  Completions after_stop(1);
  fabric->read(next, 0, 1, local, kGuardBytes, after_stop.callback_for(0));
  failures.check(after_stop.wait() && after_stop.status(0).code() == StatusCode::kCancelled,
                 "a read after stop_progress was not cancelled: " + after_stop.status(0).to_string());

  if (rank == 0) {
    std::printf("pattern phase: %zu reads per rank (%.1f MiB), %zu bad reads rejected\n", reads.size(),
                static_cast<double>(expected_bytes) / (1 << 20), kBadReads);
  }
  return Status::ok_status();
}

// Vectored reads (read_many): groups of segments of one peer, at odd sizes and in an
// order unrelated to their local targets, each checked byte by byte with its guards;
// then vectors that must fail (too many segments, one segment out of range, an empty
// segment), naming the peer.
Status run_vector_phase(const MpiSession& mpi, const FabricOptions& options, Failures& failures) {
  using shardmix::fabric::ReadSegment;
  using shardmix::fabric::VectorRead;
  const int rank = mpi.rank();
  const int nranks = mpi.size();
  SHARDMIX_ASSIGN_OR_RETURN(std::unique_ptr<Fabric> fabric, Fabric::create(options, rank, nranks));
  const std::size_t max_segments = fabric->max_segments_per_read();
  // tcp takes 4 here; shm is held to 1 on purpose (read_segments_for), so there this phase
  // checks read_many with single segments and that a second segment is refused.
  const bool shm = fabric->provider_name() == "shm";
  failures.check(shm ? max_segments == 1 : max_segments >= 2,
                 fmt::format("provider {} allows {} segments per read; expected {}", fabric->provider_name(),
                             max_segments, shm ? "1" : "at least 2"));
  std::vector<std::uint8_t> exposed(kExposedLength);
  for (std::size_t i = 0; i < exposed.size(); ++i) exposed[i] = pattern_byte(rank, i);
  SHARDMIX_RETURN_IF_ERROR(fabric->expose(exposed.data(), exposed.size()));

  std::mt19937_64 rng(kSeed * 7 + static_cast<std::uint64_t>(rank));
  std::vector<VectorRead> reads;
  std::size_t local_bytes = kGuardBytes;
  std::uniform_int_distribution<std::size_t> random_size(1, 200 * 1024);
  for (int round = 0; round < 6; ++round) {
    for (int peer = 0; peer < nranks; ++peer) {
      VectorRead read;
      read.peer = peer;
      read.segment_count = 1 + (static_cast<std::size_t>(round) + static_cast<std::size_t>(peer)) % max_segments;
      for (std::size_t k = 0; k < read.segment_count; ++k) {
        const std::size_t size = k == 0 && round == 0 ? 1 : random_size(rng);
        std::uniform_int_distribution<std::uint64_t> offset(0, kExposedLength - size);
        read.segments[k] = ReadSegment{offset(rng), size, local_bytes};
        local_bytes += size + kGuardBytes;
      }
      // Local targets in reverse order of the remote ones: the provider must pair
      // segment i with segment i, not just concatenate.
      std::reverse(read.segments.begin(), read.segments.begin() + static_cast<std::ptrdiff_t>(read.segment_count));
      reads.push_back(read);
    }
  }
  std::shuffle(reads.begin(), reads.end(), rng);
  std::vector<std::uint8_t> target(local_bytes, kGuardByte);
  SHARDMIX_ASSIGN_OR_RETURN(LocalRegion local, register_and_connect(mpi, *fabric, target));

  Completions good(reads.size());
  std::vector<VectorRead> issued = reads;
  for (std::size_t i = 0; i < issued.size(); ++i) issued[i].done = good.callback_for(i);
  fabric->read_many(std::move(issued), local);
  if (!good.wait()) {
    failures.fail("vectored reads did not complete");
    std::fflush(stderr);
    std::_Exit(EXIT_FAILURE);
  }
  std::uint64_t expected_bytes = 0;
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const VectorRead& r = reads[i];
    if (!good.status(i).ok()) {
      failures.fail(fmt::format("vectored read of {} segments from peer {}: {}", r.segment_count, r.peer,
                                good.status(i).to_string()));
      continue;
    }
    for (std::size_t k = 0; k < r.segment_count; ++k) {
      const ReadSegment& seg = r.segments[k];
      expected_bytes += seg.length;
      const std::string what = fmt::format("segment {} of {} ({} bytes at {} from peer {})", k, r.segment_count,
                                           seg.length, seg.remote_offset, r.peer);
      for (std::size_t b = 0; b < seg.length; ++b) {
        if (target[seg.local_offset + b] != pattern_byte(r.peer, seg.remote_offset + b)) {
          failures.fail(fmt::format("{}: wrong byte at +{}", what, b));
          break;
        }
      }
      for (std::size_t g = 1; g <= kGuardBytes; ++g) {
        if (target[seg.local_offset - g] != kGuardByte || target[seg.local_offset + seg.length + g - 1] != kGuardByte) {
          failures.fail(what + ": wrote outside its target range");
          break;
        }
      }
    }
  }
  const shardmix::fabric::FabricStats stats = fabric->stats();
  failures.check(stats.bytes_read == expected_bytes,
                 fmt::format("stats().bytes_read {} != {} bytes read by vectored reads", stats.bytes_read,
                             expected_bytes));
  failures.check(stats.reads_posted == reads.size(),
                 fmt::format("stats().reads_posted {} != {} vectored reads", stats.reads_posted, reads.size()));

  // Vectors that must fail, each naming the peer.
  const int next = (rank + 1) % nranks;
  std::vector<VectorRead> bad(3);
  for (VectorRead& b : bad) b.peer = next;
  bad[0].segment_count = max_segments + 1 <= shardmix::fabric::kMaxReadSegments ? max_segments + 1 : 0;
  for (std::size_t k = 0; k < std::min(bad[0].segment_count, bad[0].segments.size()); ++k) {
    bad[0].segments[k] = ReadSegment{k * 10, 10, kGuardBytes + k * 10};
  }
  bad[1].segment_count = 2;
  bad[1].segments[0] = ReadSegment{0, 10, kGuardBytes};
  bad[1].segments[1] = ReadSegment{kExposedLength - 5, 10, kGuardBytes + 10};  // past the peer's end
  bad[2].segment_count = 2;
  bad[2].segments[0] = ReadSegment{0, 10, kGuardBytes};
  bad[2].segments[1] = ReadSegment{20, 0, kGuardBytes + 10};  // empty
  Completions rejected(bad.size());
  for (std::size_t i = 0; i < bad.size(); ++i) bad[i].done = rejected.callback_for(i);
  fabric->read_many(std::move(bad), local);
  if (!rejected.wait()) {
    failures.fail("bad vectored reads did not complete");
    std::fflush(stderr);
    std::_Exit(EXIT_FAILURE);
  }
  const char* why[] = {"has too many (or no) segments", "has a segment past the peer's end", "has an empty segment"};
  for (std::size_t i = 0; i < 3; ++i) {
    const Status& status = rejected.status(i);
    failures.check(!status.ok(), fmt::format("a vectored read that {} succeeded", why[i]));
    failures.check(status.message().find(fmt::format("peer {}", next)) != std::string::npos,
                   fmt::format("error for a vectored read that {} does not name the peer: {}", why[i],
                               status.to_string()));
  }
  SHARDMIX_RETURN_IF_ERROR(mpi.barrier());
  fabric->stop_progress();
  if (rank == 0) {
    std::printf("vector phase: %zu vectored reads per rank (up to %zu segments, %.1f MiB), 3 bad ones rejected\n",
                reads.size(), max_segments, static_cast<double>(expected_bytes) / (1 << 20));
  }
  return Status::ok_status();
}

// The last rank owns nothing (expose of length 0): reading from it fails naming it,
// reading from the others still works.
Status run_empty_peer_phase(const MpiSession& mpi, const FabricOptions& options, Failures& failures) {
  const int rank = mpi.rank();
  const int nranks = mpi.size();
  const int empty_rank = nranks - 1;
  SHARDMIX_ASSIGN_OR_RETURN(std::unique_ptr<Fabric> fabric, Fabric::create(options, rank, nranks));
  std::vector<std::uint8_t> exposed(rank == empty_rank ? 0 : 4096);
  for (std::size_t i = 0; i < exposed.size(); ++i) exposed[i] = pattern_byte(rank, i);
  SHARDMIX_RETURN_IF_ERROR(fabric->expose(exposed.data(), exposed.size()));
  std::vector<std::uint8_t> target(4096);
  SHARDMIX_ASSIGN_OR_RETURN(LocalRegion local, register_and_connect(mpi, *fabric, target));

  const int nonempty_peer = (empty_rank + 1) % nranks;
  Completions done(2);
  fabric->read(empty_rank, 0, 1, local, 0, done.callback_for(0));
  fabric->read(nonempty_peer, 100, 1000, local, 0, done.callback_for(1));
  if (!done.wait()) {
    failures.fail("reads in the empty-peer phase did not complete");
    std::fflush(stderr);
    std::_Exit(EXIT_FAILURE);
  }
  const std::string empty_text = fmt::format("peer {}", empty_rank);
  failures.check(!done.status(0).ok() && done.status(0).message().find(empty_text) != std::string::npos,
                 "read from a rank that exposes nothing: " + done.status(0).to_string());
  failures.check(done.status(1).ok(), "read next to an empty peer failed: " + done.status(1).to_string());
  failures.check(done.status(1).ok() && target[0] == pattern_byte(nonempty_peer, 100) &&
                     target[999] == pattern_byte(nonempty_peer, 1099),
                 "read next to an empty peer returned wrong bytes");

  SHARDMIX_RETURN_IF_ERROR(mpi.barrier());
  fabric->stop_progress();
  return Status::ok_status();
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  const char* log_level = std::getenv("SHARDMIX_LOG_LEVEL");
  shardmix::log::init(mpi.rank(), log_level != nullptr ? log_level : "warn");
  if (argc < 2) {
    if (mpi.rank() == 0) std::fprintf(stderr, "usage: %s PROVIDER [INTERFACE]\n", argv[0]);
    return EXIT_FAILURE;
  }
  FabricOptions options;
  options.provider = argv[1];
  options.interface = argc > 2 ? argv[2] : "";
  options.max_outstanding_reads = 8;

  Failures failures(mpi.rank());
  if (mpi.size() < 2) failures.fail("needs at least 2 ranks");
  for (auto phase : {run_collectives_phase, run_pattern_phase, run_vector_phase, run_empty_peer_phase}) {
    if (failures.count() > 0) break;
    if (Status status = phase(mpi, options, failures); !status.ok()) failures.fail(status.to_string());
  }

  // Every rank exits with the same verdict.
  const auto total = mpi.allreduce_sum(static_cast<std::uint64_t>(failures.count()));
  const bool passed = total.ok() && *total == 0;
  if (mpi.rank() == 0) {
    std::printf("%s: fabric_read_mpitest provider=%s ranks=%d (%llu failures)\n", passed ? "PASS" : "FAIL", argv[1],
                mpi.size(), total.ok() ? static_cast<unsigned long long>(*total) : 0ULL);
  }
  std::fflush(stdout);
  return passed ? EXIT_SUCCESS : EXIT_FAILURE;
}
