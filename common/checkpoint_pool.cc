#include "common/checkpoint_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/checkpoint_memfd.h"
#include "common/huge_pages.h"
#include "common/log.h"

// Linux 5.14's madvise flag; glibc headers older than the kernel may not name it. A kernel
// without it answers EINVAL, and the prefault falls back to fallocate.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace shardmix {

struct CheckpointPool::Shared {
  int fd = -1;
  std::uint64_t chunk_bytes = 0;
  std::uint64_t chunks = 0;
  // The whole memfd, mapped once for the pool's life. A buffer of consecutive chunks is a
  // window of it, so most buffers cost no mapping at all: a page is then always reached
  // through the same address, whose page-table entries (and, in a virtual machine, the
  // hypervisor's) were filled by the prefault or by an earlier version. Through a new
  // mapping the first touch of each page costs again: 1.4-1.5 s a GiB on the development
  // machine (a virtual machine; the cause in its paging was not pinned down) against 0.07 s
  // through the same mapping.
  std::uint8_t* view = nullptr;
  std::atomic<bool> stop_prefault{false};
  mutable std::mutex mutex;
  std::set<std::uint64_t> free;  // chunk indices; consecutive ones first, then lowest first
  CheckpointPoolStats stats;

  ~Shared() {
    if (view != nullptr) munmap(view, chunks * chunk_bytes);
    if (fd >= 0) ::close(fd);
  }
  // Under `mutex`: the first `needed` consecutive free chunks, else the lowest `needed`
  // ones (a buffer mapped side by side); removed from `free`. `needed` <= free.size().
  std::vector<std::uint64_t> take(std::uint64_t needed) {
    std::vector<std::uint64_t> taken;
    auto run_start = free.begin();
    std::uint64_t run_length = 0, previous = 0;
    for (auto it = free.begin(); it != free.end() && run_length < needed; ++it) {
      if (run_length == 0 || *it != previous + 1) {
        run_start = it;
        run_length = 0;
      }
      ++run_length;
      previous = *it;
    }
    if (run_length < needed) run_start = free.begin();
    auto it = run_start;
    for (std::uint64_t i = 0; i < needed; ++i) taken.push_back(*it++);
    free.erase(run_start, it);
    return taken;
  }
  // How many chunks hold `size` bytes; written so that no size wraps it (a raw client may
  // ask for a lease of nearly 2^64 bytes, which must overflow, not become a chunkless buffer).
  std::uint64_t chunks_for(std::uint64_t size) const { return size / chunk_bytes + (size % chunk_bytes != 0 ? 1 : 0); }
  // The chunks as runs of the memfd: consecutive chunks make one run (one mapping).
  std::vector<MemfdRun> runs_of(const std::vector<std::uint64_t>& taken) const {
    std::vector<MemfdRun> runs;
    for (std::uint64_t c : taken) {
      if (!runs.empty() && runs.back().offset + runs.back().length == c * chunk_bytes) {
        runs.back().length += chunk_bytes;
      } else {
        runs.push_back(MemfdRun{c * chunk_bytes, chunk_bytes});
      }
    }
    return runs;
  }
  void give_back(const std::vector<std::uint64_t>& taken) {
    std::lock_guard lock(mutex);
    free.insert(taken.begin(), taken.end());
    stats.bytes_in_use -= taken.size() * chunk_bytes;
  }
};

Result<SideBySideMapping> SideBySideMapping::map(int fd, std::span<const MemfdRun> runs) {
  SideBySideMapping out;
  for (const MemfdRun& run : runs) out.bytes_ += run.length;
  if (out.bytes_ == 0) return out;
  std::uint8_t* reserved = reserve_huge_aligned(out.bytes_);
  if (reserved == nullptr) {
    const int err = errno;
    const std::uint64_t wanted = std::exchange(out.bytes_, 0);
    return make_error(StatusCode::kResourceExhausted, "reserving a view of {} bytes: {}", wanted, std::strerror(err));
  }
  out.data_ = reserved;
  std::uint64_t at = 0;
  for (const MemfdRun& run : runs) {
    void* want = out.data_ + at;
    if (mmap(want, run.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, static_cast<off_t>(run.offset)) !=
        want) {
      return make_error(StatusCode::kResourceExhausted, "mapping {} bytes at offset {} of the memfd: {}", run.length,
                        run.offset, std::strerror(errno));  // `out` unmaps the whole view
    }
    at += run.length;
  }
  // Huge pages before the page tables are filled, so that they are filled with 2 MiB
  // entries where the memfd's pages are huge. Without MADV_POPULATE_WRITE (Linux < 5.14)
  // the pages fault in at first touch instead.
  advise_huge_pages(out.data_, out.bytes_);
  (void)madvise(out.data_, out.bytes_, MADV_POPULATE_WRITE);
  return out;
}

SideBySideMapping::SideBySideMapping(SideBySideMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

SideBySideMapping& SideBySideMapping::operator=(SideBySideMapping&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, bytes_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

SideBySideMapping::~SideBySideMapping() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

void SideBySideMapping::unmap_after(std::uint64_t keep) {
  if (keep >= bytes_) return;
  munmap(data_ + keep, bytes_ - keep);
  bytes_ = keep;
  if (bytes_ == 0) data_ = nullptr;
}

namespace {

// Chunks of the pool's memfd: consecutive ones seen through the pool's own mapping, others
// mapped side by side at one reserved address (`view_`, empty for consecutive chunks).
class PooledBuffer final : public CheckpointBuffer {
 public:
  PooledBuffer(std::shared_ptr<CheckpointPool::Shared> pool, std::vector<std::uint64_t> chunks,
               SideBySideMapping view, std::uint64_t size)
      : pool_(std::move(pool)), chunks_(std::move(chunks)), view_(std::move(view)), size_(size) {
    data_ = view_.bytes().empty() && !chunks_.empty() ? pool_->view + chunks_.front() * pool_->chunk_bytes
                                                      : view_.bytes().data();
  }
  ~PooledBuffer() override {
    view_ = SideBySideMapping();  // unmapped before its chunks can serve another buffer
    pool_->give_back(chunks_);
  }
  std::span<const std::uint8_t> bytes() const override { return {data_, size_}; }
  std::span<std::uint8_t> writable() override { return {data_, size_}; }
  bool pooled() const override { return true; }
  int lease_memfd() const override { return pool_->fd; }
  std::vector<MemfdRun> runs() const override { return pool_->runs_of(chunks_); }
  void shrink(std::uint64_t size) override {
    if (size >= size_) return;
    size_ = size;
    const std::uint64_t keep = pool_->chunks_for(size);
    if (keep == chunks_.size()) return;
    view_.unmap_after(keep * pool_->chunk_bytes);
    pool_->give_back(std::vector<std::uint64_t>(chunks_.begin() + static_cast<std::ptrdiff_t>(keep), chunks_.end()));
    chunks_.resize(keep);
  }

 private:
  std::shared_ptr<CheckpointPool::Shared> pool_;
  std::vector<std::uint64_t> chunks_;
  SideBySideMapping view_;
  std::uint64_t size_;
  std::uint8_t* data_ = nullptr;
};

// Too few free chunks: a memfd of its own, as every version had before the pool.
class OverflowBuffer final : public CheckpointBuffer {
 public:
  explicit OverflowBuffer(CheckpointMemfd memfd) : memfd_(std::move(memfd)), size_(memfd_.size()) {}
  std::span<const std::uint8_t> bytes() const override { return memfd_.data().first(size_); }
  std::span<std::uint8_t> writable() override { return memfd_.data().first(size_); }
  bool pooled() const override { return false; }
  int lease_memfd() const override { return memfd_.fd(); }
  std::vector<MemfdRun> runs() const override {
    const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    if (size_ == 0) return {};
    return {MemfdRun{0, (size_ + page - 1) / page * page}};  // the last page's tail is in the memfd too
  }
  void shrink(std::uint64_t size) override { size_ = std::min(size_, size); }

 private:
  CheckpointMemfd memfd_;
  std::uint64_t size_;
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
  shared->fd = memfd_create("shardmix-checkpoint-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (shared->fd < 0 || ftruncate(shared->fd, static_cast<off_t>(total)) != 0) {
    return make_error(StatusCode::kResourceExhausted, "checkpoint.capacity: a memfd of {} bytes for checkpoints: {}",
                      total, std::strerror(errno));
  }
  // Trainers get this memfd with their leases (decision 0069). Sealed at its size, so that
  // no process holding it can shrink it under the daemon's views (a SIGBUS in the daemon)
  // or grow it; the seals cannot be undone.
  if (fcntl(shared->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return make_error(StatusCode::kResourceExhausted, "checkpoint.capacity: sealing the checkpoint pool's memfd: {}",
                      std::strerror(errno));
  }
  if (total > 0) {
    // Huge pages asked for before the prefault allocates the pages: then they are
    // allocated huge where the kernel allows (decision 0070).
    std::uint8_t* view = map_shared_huge_aligned(shared->fd, total, PROT_READ | PROT_WRITE);
    if (view == nullptr) {
      return make_error(StatusCode::kResourceExhausted, "checkpoint.capacity: mapping the checkpoint pool's {} bytes: {}",
                        total, std::strerror(errno));
    }
    shared->view = view;
    // Not in the daemon's core dumps: the checkpoints are on disk or with their replicas,
    // and a dump of a node's whole pool would be as large as checkpoint.capacity.
    (void)madvise(view, total, MADV_DONTDUMP);
  }
  for (std::uint64_t c = 0; c < shared->chunks; ++c) shared->free.insert(shared->free.end(), c);
  shared->stats.capacity_bytes = total;
  shared->stats.chunk_bytes = chunk_bytes;
  std::unique_ptr<CheckpointPool> pool(new CheckpointPool(shared));
  if (prefault && total > 0) {
    pool->prefault_ = std::thread([shared] {
      // Each page is faulted in writable, not only allocated: fallocate on a memfd allocates
      // pages but leaves them to be zeroed at their first write (and, in a virtual machine
      // whose free pages went back to the host, faulted in by the host then). Writing 1 GiB
      // here took 0.42 s after fallocate against 0.14 s after MADV_POPULATE_WRITE (0.6 s
      // into new pages). MADV_POPULATE_WRITE does not change a page's bytes, so a buffer a
      // save is filling meanwhile is safe; without it (Linux before 5.14) fallocate is the
      // best there is. Through the pool's own mapping, which buffers of consecutive chunks
      // use, so that their page-table entries are filled too. In steps, so that a daemon
      // stopping soon after start does not wait for all of it.
      constexpr std::uint64_t kStep = 64ull << 20;
      const auto started = std::chrono::steady_clock::now();
      const std::uint64_t total = shared->chunks * shared->chunk_bytes;
      bool populate = true;
      for (std::uint64_t offset = 0; offset < total && !shared->stop_prefault; offset += kStep) {
        const std::uint64_t length = std::min(kStep, total - offset);
        if (populate) {
          const bool done = madvise(shared->view + offset, length, MADV_POPULATE_WRITE) == 0;
          const int err = errno;
          if (!done && err != EINVAL) {
            log::get("checkpoint")->warn("writing the checkpoint pool's pages ahead of use stopped at {} bytes: {}",
                                         offset, std::strerror(err));
            return;
          }
          populate = done;
        }
        if (!populate && fallocate(shared->fd, 0, static_cast<off_t>(offset), static_cast<off_t>(length)) != 0) {
          // Not fatal: the pages are then allocated when first written, as without prefault.
          log::get("checkpoint")->warn("allocating the checkpoint pool's pages ahead of use stopped at {} bytes: {}",
                                       offset, std::strerror(errno));
          return;
        }
        std::lock_guard lock(shared->mutex);
        shared->stats.prefaulted_bytes = offset + length;
      }
      if (!shared->stop_prefault) {
        log::get("checkpoint")->info("the checkpoint pool's {} bytes are in memory ({} s, {})", total,
                                     std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
                                     populate ? "written ahead of use" : "allocated ahead of use, zeroed when first written");
      }
    });
  }
  return pool;
}

Result<std::shared_ptr<CheckpointBuffer>> CheckpointPool::allocate(std::uint64_t size, std::string_view checkpoint) {
  const std::uint64_t chunk = shared_->chunk_bytes;
  const std::uint64_t needed = shared_->chunks_for(size);
  std::vector<std::uint64_t> taken;
  std::uint64_t in_use_at_overflow = 0;
  {
    std::lock_guard lock(shared_->mutex);
    if (needed <= shared_->free.size()) {
      taken = shared_->take(needed);
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
    // A lease hands this memfd to a trainer too: sealed at its size as the pool's is.
    if (fcntl(memfd.fd(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      return make_error(StatusCode::kResourceExhausted, "checkpoint {} ({} bytes): sealing its memfd: {}", checkpoint,
                        size, std::strerror(errno));
    }
    return std::shared_ptr<CheckpointBuffer>(std::make_shared<OverflowBuffer>(std::move(memfd)));
  };
  if (taken.size() != needed) {
    log::get("checkpoint")->info("checkpoint {} ({} bytes): the checkpoint pool has {} of its {} bytes in use, so it "
                                 "goes in a memfd of its own (fresh pages)",
                                 checkpoint, size, in_use_at_overflow, shared_->chunks * chunk);
    return overflow();
  }
  // Consecutive chunks are a window of the pool's own mapping. Scattered ones are mapped
  // side by side; a view that cannot be mapped (vm.max_map_count) gives its chunks back
  // and overflows, as a pool short of chunks does: never a refusal.
  const std::vector<MemfdRun> runs = shared_->runs_of(taken);
  Result<SideBySideMapping> view = runs.size() <= 1 ? Result<SideBySideMapping>(SideBySideMapping())
                                                    : SideBySideMapping::map(shared_->fd, runs);
  if (!view.ok()) {
    log::get("checkpoint")->warn("checkpoint {} ({} bytes): in the checkpoint pool, {}; it goes in a memfd of its own "
                                 "(fresh pages)",
                                 checkpoint, size, view.status().message());
    shared_->give_back(taken);
    {
      std::lock_guard lock(shared_->mutex);
      --shared_->stats.buffers;
      ++shared_->stats.overflows;
      shared_->stats.overflow_bytes += size;
    }
    return overflow();
  }
  return std::shared_ptr<CheckpointBuffer>(
      std::make_shared<PooledBuffer>(shared_, std::move(taken), std::move(*view), size));
}

bool CheckpointPool::fits(std::uint64_t size) const {
  std::lock_guard lock(shared_->mutex);
  return shared_->chunks_for(size) <= shared_->free.size();
}

CheckpointPoolStats CheckpointPool::stats() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->stats;
}

}  // namespace shardmix
