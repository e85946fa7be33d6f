// Free-space management of one trainer's slice of the staging region, where peer
// samples land before the trainer reads them.
//
// Why not a ring: with shuffle.window > 0 a sample may be delivered long after the
// samples staged after it, so bytes are freed out of order; a FIFO ring would keep every
// later byte hostage behind the oldest undelivered sample and stop staging until that
// straggler lands (decisions/0013). This is an extent allocator instead: free bytes are a map of
// coalesced extents, allocation is next-fit (in the usual in-order use it takes the
// extent right after the previous allocation; a failing search visits every free extent,
// a handful in practice), an empty allocator starts again at offset 0, and any sub-range
// of an allocation can be freed on its own (a batch is allocated as one extent, its
// samples are freed as they are released).
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
  std::uint64_t cursor_ = 0;                 // next-fit: where the last allocation ended
  std::map<std::uint64_t, std::uint64_t> free_;  // begin -> end, relative, coalesced
  void free_range(std::uint64_t offset, std::uint64_t length);
  void notify();

  std::function<void()> waiter_;
};

}  // namespace shardmix
