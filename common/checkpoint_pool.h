// Resident memory for checkpoint versions (docs/decisions/0068): one memfd of
// checkpoint.capacity, cut into chunks, whose pages the daemon allocates once and then
// reuses for every version it holds (its trainers' saves and its peers' replicas).
//
// Why: a new page costs far more than a copy into a page already there. The kernel zeroes
// every fresh page, and in a virtual machine whose free pages go back to the host (virtio
// balloon page reporting) the first touch of one also faults in the host: 2-4 s per GiB on
// the development machine against 0.45 s to write a GiB into pages reused. A version of
// 1 GiB in a fresh memfd paid that at the trainer, and its replica paid it again at the
// holder. On RDMA fabrics memory the daemon reuses is also memory it need not pin anew.
//
// A buffer is a contiguous view of its chunks, so the rest of the daemon sees one span, as
// before: a window of the pool's own mapping of the whole memfd (made once) when its chunks
// are consecutive, which the pool prefers; else its chunks mapped side by side at one
// address (MAP_FIXED over a reserved range). Its chunks go back
// to the pool when the last reference to the buffer goes; their pages stay allocated. When
// too few chunks are free (a load or a drain still holds an evicted version, or a save
// waits for room outside the budget), the buffer gets a memfd of its own, fresh pages and
// all, and the pool counts it as an overflow: the pool is a speed-up, never a reason to
// refuse a checkpoint. The budget itself is CheckpointStore's (checkpoint.capacity).
//
// Huge pages (common/huge_pages.h, decision 0070): every mapping of a pool memfd (the
// pool's view, buffers side by side, a trainer's lease) starts on a 2 MiB boundary and
// asks for them; chunks are 2 MiB, so runs and leases are whole huge pages. Where the
// kernel grants them, mapping a GiB of the pool anew and writing it took 0.037-0.044 s
// instead of 1.54-1.58 s on the development VM (bench/huge_pages.sh), at the price of a
// slower prefault, once (1.4-1.9 s a GiB instead of 0.31).
//
// Thread-safety: every method may be called from any thread; a buffer's writable view
// belongs to whoever fills it, before it is shared as CheckpointBytes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/checkpoint_store.h"
#include "common/huge_pages.h"
#include "common/status.h"

namespace shardmix {

// A stretch of a memfd: `length` bytes (a whole number of pages) from `offset`.
struct MemfdRun {
  std::uint64_t offset = 0, length = 0;
  bool operator==(const MemfdRun&) const = default;
};

// Runs of one memfd mapped side by side, shared and writable, at one reserved address
// (MAP_FIXED over a PROT_NONE reservation on a huge-page boundary, huge pages advised),
// with their page tables filled (MADV_POPULATE_WRITE: the pages are there already, so one
// call beats a fault per page). How the daemon sees a
// pooled buffer as one span, and how a trainer sees the buffer it leases (decision 0069).
// Unmapped when destroyed. Thread-safety: one owner.
class SideBySideMapping {
 public:
  // An error (kResourceExhausted: the mapping count, vm.max_map_count, or the address
  // space ran out) says which step failed; the caller names the checkpoint.
  static Result<SideBySideMapping> map(int fd, std::span<const MemfdRun> runs);
  SideBySideMapping() = default;
  SideBySideMapping(SideBySideMapping&& other) noexcept;
  SideBySideMapping& operator=(SideBySideMapping&& other) noexcept;
  ~SideBySideMapping();

  std::span<std::uint8_t> bytes() const { return {data_, bytes_}; }
  // Unmaps everything past the first `keep` bytes (a multiple of the page).
  void unmap_after(std::uint64_t keep);

 private:
  std::uint8_t* data_ = nullptr;
  std::uint64_t bytes_ = 0;
};

// A buffer from CheckpointPool::allocate: writable while it is filled (a copy of the
// trainer's bytes, a trainer's lease, a peer's replica landing), then shared read-only as
// CheckpointBytes.
class CheckpointBuffer : public CheckpointBytes {
 public:
  virtual std::span<std::uint8_t> writable() = 0;
  virtual bool pooled() const = 0;  // false: an overflow, in a memfd of its own
  // Where the bytes are, for a trainer to map them and write its checkpoint in place (a
  // lease, decision 0069): a memfd the buffer owns (the pool's, for a pooled buffer: never
  // CheckpointBytes::memfd(), which a load hands to any trainer), and the runs of it
  // that, side by side, make the buffer (whole pages, at least size() bytes).
  virtual int lease_memfd() const = 0;
  virtual std::vector<MemfdRun> runs() const = 0;
  // Keeps the first `size` bytes only (a lease filled with fewer than it asked for); the
  // whole chunks past them go back to the pool. Before the buffer is shared.
  virtual void shrink(std::uint64_t size) = 0;
};

struct CheckpointPoolStats {
  std::uint64_t capacity_bytes = 0;    // chunks * chunk_bytes
  std::uint64_t chunk_bytes = 0;
  std::uint64_t bytes_in_use = 0;      // chunks held by live buffers
  std::uint64_t buffers = 0;           // allocations served from the pool
  std::uint64_t overflows = 0;         // allocations that found too few free chunks
  std::uint64_t overflow_bytes = 0;
  std::uint64_t prefaulted_bytes = 0;  // pages allocated ahead of use so far
};

class CheckpointPool {
 public:
  // Small enough that rounding a version up wastes little, large enough that a GiB is a few
  // hundred mappings at most.
  static constexpr std::uint64_t kDefaultChunkBytes = kHugePageBytes;

  // A pool of at least `capacity_bytes` (rounded up to whole chunks, of `chunk_bytes`, a
  // multiple of the page size). With `prefault`, a background thread faults all of its
  // pages in now, writable (MADV_POPULATE_WRITE), so that the first checkpoint finds them
  // allocated and zeroed too; without, each
  // page is allocated when first written and kept from then on. kResourceExhausted
  // naming checkpoint.capacity if the memfd cannot be made.
  static Result<std::unique_ptr<CheckpointPool>> create(std::uint64_t capacity_bytes, bool prefault,
                                                        std::uint64_t chunk_bytes = kDefaultChunkBytes);
  ~CheckpointPool();  // waits for the prefault; buffers still alive keep the memfd
  CheckpointPool(const CheckpointPool&) = delete;
  CheckpointPool& operator=(const CheckpointPool&) = delete;

  // A writable buffer of `size` bytes for checkpoint `checkpoint` (named in errors): in the
  // pool's chunks, or in a memfd of its own when they are too few (an overflow).
  Result<std::shared_ptr<CheckpointBuffer>> allocate(std::uint64_t size, std::string_view checkpoint);

  CheckpointPoolStats stats() const;
  // Whether a buffer of `size` bytes would come from the pool's chunks now.
  bool fits(std::uint64_t size) const;

  struct Shared;  // the memfd and the free chunks, shared with the buffers

 private:
  explicit CheckpointPool(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
  std::thread prefault_;
};

}  // namespace shardmix
