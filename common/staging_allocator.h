// Free-space management of one trainer's slice of the staging region, where peer
// samples land before the trainer reads them.
//
// Why not a ring: with shuffle.window > 0 a sample may be delivered long after the
// samples staged after it, so bytes are freed out of order; a FIFO ring would keep every
// later byte hostage behind the oldest undelivered sample and stop staging until that
// straggler lands (decisions/0013). This is an extent allocator instead: free bytes are a map of
// coalesced extents, allocation is first-fit (the lowest free extent that is large
// enough; a search visits the free extents below it, a handful in practice), and any
// sub-range of an allocation can be freed on its own (a batch is allocated as one extent,
// its samples are freed as they are released).
// Why first-fit (decisions/0031): it keeps the bytes in use at the bottom of the area, so
// the pages staging touches are about the read-ahead budget (prefetch x batch), not the
// whole service.staging_bytes_per_trainer. Next-fit walked all of it before wrapping, and
// every first write of a fresh memfd page is a page fault inside the fabric's copy
// (measured: 5.5 of 8.4 daemon CPU seconds of a 4-epoch run went to that).
// Thread-safety: none; owned by the client-service thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <utility>

namespace shardmix {

class StagingAllocator {
 public:
  StagingAllocator(std::uint64_t base, std::uint64_t capacity);

  // The absolute offset of `length` (> 0) free contiguous bytes, or nullopt when no free
  // extent is large enough now.
  std::optional<std::uint64_t> allocate(std::uint64_t length);
  // Frees [offset, offset + length), which must lie inside allocated bytes (freeing free
  // bytes aborts: two samples sharing bytes would be silent corruption). If someone waits
  // for free bytes, the waiter is called (once) after the bytes are free.
  void release(std::uint64_t offset, std::uint64_t length);
  // Frees several ranges, then wakes the waiter once: a batch's samples are freed
  // together, and one wake-up per sample made a blocked scheduler retry per sample.
  void release_all(std::span<const std::pair<std::uint64_t, std::uint64_t>> ranges);
  // Registers `waiter` to be called at the next release (replacing an earlier waiter: one
  // scheduler owns a trainer slot at a time).
  void wait_for_release(std::function<void()> waiter) { waiter_ = std::move(waiter); }

  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t bytes_in_use() const { return in_use_; }
  std::uint64_t bytes_free() const { return capacity_ - in_use_; }
  bool empty() const { return in_use_ == 0; }

 private:
  std::uint64_t base_;
  std::uint64_t capacity_;
  std::uint64_t in_use_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_;  // begin -> end, relative, coalesced
  void free_range(std::uint64_t offset, std::uint64_t length);
  void notify();

  std::function<void()> waiter_;
};

}  // namespace shardmix
