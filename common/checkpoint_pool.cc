#include "common/checkpoint_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/checkpoint_memfd.h"
#include "common/log.h"

namespace shardmix {

struct CheckpointPool::Shared {
  int fd = -1;
  std::uint64_t chunk_bytes = 0;
  std::uint64_t chunks = 0;
  std::atomic<bool> stop_prefault{false};
  mutable std::mutex mutex;
  std::set<std::uint64_t> free;  // chunk indices; taken lowest first, so that views map in few runs
  CheckpointPoolStats stats;

  ~Shared() {
    if (fd >= 0) ::close(fd);
  }
  void give_back(const std::vector<std::uint64_t>& taken) {
    std::lock_guard lock(mutex);
    free.insert(taken.begin(), taken.end());
    stats.bytes_in_use -= taken.size() * chunk_bytes;
  }
};

namespace {

// Chunks of the pool's memfd mapped side by side at one reserved address.
class PooledBuffer final : public CheckpointBuffer {
 public:
  PooledBuffer(std::shared_ptr<CheckpointPool::Shared> pool, std::vector<std::uint64_t> chunks, std::uint8_t* view,
               std::uint64_t view_bytes, std::uint64_t size)
      : pool_(std::move(pool)), chunks_(std::move(chunks)), view_(view), view_bytes_(view_bytes), size_(size) {}
  ~PooledBuffer() override {
    if (view_ != nullptr) munmap(view_, view_bytes_);
    pool_->give_back(chunks_);
  }
  std::span<const std::uint8_t> bytes() const override { return {view_, size_}; }
  std::span<std::uint8_t> writable() override { return {view_, size_}; }
  bool pooled() const override { return true; }

 private:
  std::shared_ptr<CheckpointPool::Shared> pool_;
  std::vector<std::uint64_t> chunks_;
  std::uint8_t* view_;
  std::uint64_t view_bytes_;
  std::uint64_t size_;
};

// Too few free chunks: a memfd of its own, as every version had before the pool.
class OverflowBuffer final : public CheckpointBuffer {
 public:
  explicit OverflowBuffer(CheckpointMemfd memfd) : memfd_(std::move(memfd)) {}
  std::span<const std::uint8_t> bytes() const override { return memfd_.data(); }
  std::span<std::uint8_t> writable() override { return memfd_.data(); }
  bool pooled() const override { return false; }

 private:
  CheckpointMemfd memfd_;
};

}  // namespace

CheckpointPool::CheckpointPool(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

CheckpointPool::~CheckpointPool() {
  shared_->stop_prefault = true;
  if (prefault_.joinable()) prefault_.join();
}

Result<std::unique_ptr<CheckpointPool>> CheckpointPool::create(std::uint64_t capacity_bytes, bool prefault,
                                                               std::uint64_t chunk_bytes) {
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  if (chunk_bytes == 0 || chunk_bytes % page != 0) {
    return make_error(StatusCode::kInvalidArgument, "checkpoint pool: chunk of {} bytes is not a multiple of the page ({})",
                      chunk_bytes, page);
  }
  auto shared = std::make_shared<Shared>();
  shared->chunk_bytes = chunk_bytes;
  shared->chunks = (capacity_bytes + chunk_bytes - 1) / chunk_bytes;
  const std::uint64_t total = shared->chunks * chunk_bytes;
  shared->fd = memfd_create("shardmix-checkpoint-pool", MFD_CLOEXEC);
  if (shared->fd < 0 || ftruncate(shared->fd, static_cast<off_t>(total)) != 0) {
    return make_error(StatusCode::kResourceExhausted, "checkpoint.capacity: a memfd of {} bytes for checkpoints: {}",
                      total, std::strerror(errno));
  }
  for (std::uint64_t c = 0; c < shared->chunks; ++c) shared->free.insert(shared->free.end(), c);
  shared->stats.capacity_bytes = total;
  shared->stats.chunk_bytes = chunk_bytes;
  std::unique_ptr<CheckpointPool> pool(new CheckpointPool(shared));
  if (prefault && total > 0) {
    pool->prefault_ = std::thread([shared] {
      // In steps, so that a daemon stopping soon after start does not wait for all of it.
      constexpr std::uint64_t kStep = 64ull << 20;
      for (std::uint64_t offset = 0; offset < shared->chunks * shared->chunk_bytes && !shared->stop_prefault;
           offset += kStep) {
        const std::uint64_t length = std::min(kStep, shared->chunks * shared->chunk_bytes - offset);
        if (fallocate(shared->fd, 0, static_cast<off_t>(offset), static_cast<off_t>(length)) != 0) {
          // Not fatal: the pages are then allocated when first written, as without prefault.
          log::get("checkpoint")->warn("allocating the checkpoint pool's pages ahead of use stopped at {} bytes: {}",
                                       offset, std::strerror(errno));
          return;
        }
        std::lock_guard lock(shared->mutex);
        shared->stats.prefaulted_bytes = offset + length;
      }
    });
  }
  return pool;
}

Result<std::shared_ptr<CheckpointBuffer>> CheckpointPool::allocate(std::uint64_t size, std::string_view checkpoint) {
  const std::uint64_t chunk = shared_->chunk_bytes;
  const std::uint64_t needed = (size + chunk - 1) / chunk;
  std::vector<std::uint64_t> taken;
  std::uint64_t in_use_at_overflow = 0;
  {
    std::lock_guard lock(shared_->mutex);
    if (needed <= shared_->free.size()) {
      auto it = shared_->free.begin();
      for (std::uint64_t i = 0; i < needed; ++i) taken.push_back(*it++);
      shared_->free.erase(shared_->free.begin(), it);
      shared_->stats.bytes_in_use += needed * chunk;
      ++shared_->stats.buffers;
    } else {
      in_use_at_overflow = shared_->stats.bytes_in_use;
      ++shared_->stats.overflows;
      shared_->stats.overflow_bytes += size;
    }
  }
  const auto overflow = [&]() -> Result<std::shared_ptr<CheckpointBuffer>> {
    SHARDMIX_ASSIGN_OR_RETURN(CheckpointMemfd memfd, CheckpointMemfd::create(checkpoint, size));
    return std::shared_ptr<CheckpointBuffer>(std::make_shared<OverflowBuffer>(std::move(memfd)));
  };
  if (taken.size() != needed) {
    log::get("checkpoint")->info("checkpoint {} ({} bytes): the checkpoint pool has {} of its {} bytes in use, so it "
                                 "goes in a memfd of its own (fresh pages)",
                                 checkpoint, size, in_use_at_overflow, shared_->chunks * chunk);
    return overflow();
  }
  if (needed == 0) return std::shared_ptr<CheckpointBuffer>(std::make_shared<PooledBuffer>(shared_, taken, nullptr, 0, 0));
  const std::uint64_t view_bytes = needed * chunk;
  // A view that cannot be mapped (vm.max_map_count, with the free chunks scattered) gives
  // its chunks back and overflows, as a pool short of chunks does: never a refusal.
  const auto fail = [&](const char* step) -> Result<std::shared_ptr<CheckpointBuffer>> {
    log::get("checkpoint")->warn("checkpoint {} ({} bytes): {} in the checkpoint pool: {}; it goes in a memfd of its "
                                 "own (fresh pages)",
                                 checkpoint, size, step, std::strerror(errno));
    shared_->give_back(taken);
    {
      std::lock_guard lock(shared_->mutex);
      --shared_->stats.buffers;
      ++shared_->stats.overflows;
      shared_->stats.overflow_bytes += size;
    }
    return overflow();
  };
  void* reserved = mmap(nullptr, view_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return fail("reserving its view");
  auto* view = static_cast<std::uint8_t*>(reserved);
  // Runs of consecutive chunks map in one call; MAP_POPULATE fills the page tables at once
  // (the pages are there already), rather than a fault per page as the bytes are written.
  for (std::size_t first = 0; first < taken.size();) {
    std::size_t last = first;
    while (last + 1 < taken.size() && taken[last + 1] == taken[last] + 1) ++last;
    void* at = view + first * chunk;
    void* mapped = mmap(at, (last - first + 1) * chunk, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
                        shared_->fd, static_cast<off_t>(taken[first] * chunk));
    if (mapped != at) {
      munmap(view, view_bytes);
      return fail("mapping its chunks");
    }
    first = last + 1;
  }
  return std::shared_ptr<CheckpointBuffer>(std::make_shared<PooledBuffer>(shared_, std::move(taken), view, view_bytes, size));
}

bool CheckpointPool::fits(std::uint64_t size) const {
  std::lock_guard lock(shared_->mutex);
  return (size + shared_->chunk_bytes - 1) / shared_->chunk_bytes <= shared_->free.size();
}

CheckpointPoolStats CheckpointPool::stats() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->stats;
}

}  // namespace shardmix
