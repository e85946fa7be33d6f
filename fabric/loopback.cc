#include "fabric/loopback.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace shardmix::fabric {
namespace {

// The exposed region: large enough for the probe's biggest reads, small enough to pin.
constexpr std::size_t kRegionBytes = 4 << 20;
constexpr auto kReadTimeout = std::chrono::seconds(30);

// Bytes that differ at every offset within 2^24, so a read from the wrong offset (an
// address taken as an offset or the reverse) cannot match by chance.
std::uint8_t pattern_byte(std::size_t offset) {
  return static_cast<std::uint8_t>((offset * 2654435761u) >> 24 ^ offset);
}

// Counts completions of reads handed to the fabric and keeps the first error. The state
// is shared with the callbacks: a read that completes after wait() gave up writes live memory.
class Completions {
 public:
  ReadCallback callback() {
    return [state = state_](const Status& status) {
      std::lock_guard lock(state->mutex);
      ++state->done;
      if (!status.ok() && state->first_error.ok()) state->first_error = status;
      state->cv.notify_all();
    };
  }
  // Waits until `expected` reads completed; an error when one failed or time ran out.
  Status wait(std::size_t expected) {
    std::unique_lock lock(state_->mutex);
    if (!state_->cv.wait_for(lock, kReadTimeout, [&] { return state_->done >= expected; })) {
      return make_error(StatusCode::kUnavailable, "loopback: {} of {} reads completed within {} s",
                        state_->done, expected, kReadTimeout.count());
    }
    return state_->first_error;
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::size_t done = 0;
    Status first_error;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

Status compare(const std::vector<std::uint8_t>& target, std::size_t local_offset, std::uint64_t remote_offset,
               std::size_t length, const std::string& provider) {
  for (std::size_t i = 0; i < length; ++i) {
    if (target[local_offset + i] != pattern_byte(remote_offset + i)) {
      return make_error(StatusCode::kCorrupt,
                        "loopback on {}: byte {} of the read at remote offset {} is {:#04x}, the region holds {:#04x}",
                        provider, i, remote_offset, target[local_offset + i], pattern_byte(remote_offset + i));
    }
  }
  return Status::ok_status();
}

}  // namespace

Result<LoopbackReport> run_loopback(const FabricOptions& options, std::span<const std::size_t> probe_sizes,
                                    std::size_t probe_total_bytes) {
  // Declared before `fabric`, so destroyed after it: a read still with the provider when
  // an error returns early may write them until the endpoint is closed.
  std::vector<std::uint8_t> exposed(kRegionBytes);
  for (std::size_t i = 0; i < exposed.size(); ++i) exposed[i] = pattern_byte(i);
  std::vector<std::uint8_t> target(kRegionBytes, 0);
  SHARDMIX_ASSIGN_OR_RETURN(std::unique_ptr<Fabric> fabric, Fabric::create(options, 0, 1));
  LoopbackReport report;
  report.provider_name = fabric->provider_name();
  report.domain_name = fabric->domain_name();
  report.granted_mr_mode = fabric->mr_mode();
  const std::string& provider = report.provider_name;
  SHARDMIX_RETURN_IF_ERROR(fabric->expose(exposed.data(), exposed.size()));
  SHARDMIX_ASSIGN_OR_RETURN(LocalRegion local, fabric->register_local(target.data(), target.size()));
  SHARDMIX_RETURN_IF_ERROR(fabric->connect_peers({fabric->endpoint_blob()}));
  fabric->start_progress();

  // Single reads at unaligned remote and local offsets, the last one the whole region.
  const ReadSegment singles[] = {{12345, 77777, 3}, {kRegionBytes - 4097, 4097, 200000}, {0, kRegionBytes, 0}};
  for (const ReadSegment& s : singles) {
    std::fill(target.begin(), target.end(), 0);
    Completions completions;
    fabric->read(0, s.remote_offset, s.length, local, s.local_offset, completions.callback());
    SHARDMIX_RETURN_IF_ERROR(completions.wait(1).with_context(fmt::format("loopback read on {}", provider)));
    SHARDMIX_RETURN_IF_ERROR(compare(target, s.local_offset, s.remote_offset, s.length, provider));
    ++report.reads_checked;
    report.bytes_checked += s.length;
  }

  // One vectored read with as many segments as the provider takes.
  std::fill(target.begin(), target.end(), 0);
  VectorRead vector_read;
  vector_read.peer = 0;
  vector_read.segment_count = fabric->max_segments_per_read();
  for (std::size_t i = 0; i < vector_read.segment_count; ++i) {
    vector_read.segments[i] = ReadSegment{1000003 * (i + 1) % (kRegionBytes / 2), 3001 + i, 8192 * i + 5};
  }
  Completions vector_done;
  vector_read.done = vector_done.callback();
  std::vector<VectorRead> batch;
  batch.push_back(vector_read);
  fabric->read_many(std::move(batch), local);
  SHARDMIX_RETURN_IF_ERROR(vector_done.wait(1).with_context(fmt::format("loopback vectored read on {}", provider)));
  for (std::size_t i = 0; i < vector_read.segment_count; ++i) {
    const ReadSegment& s = vector_read.segments[i];
    SHARDMIX_RETURN_IF_ERROR(compare(target, s.local_offset, s.remote_offset, s.length, provider));
    report.bytes_checked += s.length;
  }
  ++report.reads_checked;

  // A region offered after connect_peers (how a checkpoint reaches its replica holder),
  // read by its RemoteRegion into a target registered for that one read, both given back
  // afterwards: the same mr_mode rules as the arena, with a key of its own.
  {
    constexpr std::size_t kOfferedBytes = 3 * 4096 + 11;
    constexpr std::size_t kOfferedStart = 777;  // offered[i] holds pattern_byte(kOfferedStart + i)
    std::vector<std::uint8_t> offered(exposed.begin() + kOfferedStart, exposed.begin() + kOfferedStart + kOfferedBytes);
    std::vector<std::uint8_t> landing(kOfferedBytes, 0);
    SHARDMIX_ASSIGN_OR_RETURN(OfferedRegion region, fabric->offer_region(offered.data(), offered.size()));
    SHARDMIX_ASSIGN_OR_RETURN(LocalRegion landing_region, fabric->register_local(landing.data(), landing.size()));
    Completions offered_done;
    fabric->read_region(0, region.remote, 5, kOfferedBytes - 5, landing_region, 5, offered_done.callback());
    Status read = offered_done.wait(1).with_context(fmt::format("loopback read of an offered region on {}", provider));
    fabric->unregister_local(landing_region);
    fabric->withdraw_region(region.handle);
    SHARDMIX_RETURN_IF_ERROR(read);
    std::fill(target.begin(), target.end(), 0);
    std::copy(landing.begin(), landing.end(), target.begin());
    SHARDMIX_RETURN_IF_ERROR(compare(target, 5, kOfferedStart + 5, kOfferedBytes - 5, provider));
    ++report.reads_checked;
    report.bytes_checked += kOfferedBytes - 5;
  }

  for (const std::size_t size : probe_sizes) {
    if (size == 0 || size > kRegionBytes) {
      return make_error(StatusCode::kInvalidArgument, "loopback probe: read size {} is not in 1..{}", size,
                        kRegionBytes);
    }
    const std::size_t reads = std::max<std::size_t>(1, probe_total_bytes / size);
    const std::size_t slots = kRegionBytes / size;
    Completions completions;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < reads; ++i) {
      const std::size_t offset = (i % slots) * size;
      fabric->read(0, offset, size, local, offset, completions.callback());
    }
    SHARDMIX_RETURN_IF_ERROR(completions.wait(reads).with_context(
        fmt::format("loopback probe of {}-byte reads on {}", size, provider)));
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    report.bandwidth.push_back(BandwidthSample{size, reads * size, elapsed.count()});
  }
  fabric->stop_progress();
  return report;
}

}  // namespace shardmix::fabric
