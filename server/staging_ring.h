// A variable-size ring allocator over one trainer's slice of the staging region.
// Batches allocate their peer samples' bytes in plan order and usually release in the
// same order; an out-of-order release is held until everything before it is released.
// Thread-safety: none; owned by the client-service thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>

namespace shardmix {

class StagingRing {
 public:
  StagingRing(std::uint64_t base, std::uint64_t capacity) : base_(base), capacity_(capacity) {}

  // Returns the absolute offset of `length` free bytes, or nullopt when they do not fit now.
  // length must be > 0.
  std::optional<std::uint64_t> allocate(std::uint64_t length);
  // Frees the allocation that starts at `offset` (as returned by allocate). If bytes were
  // freed and someone waits for them, the waiter is called (once) after the ring is updated.
  void release(std::uint64_t offset);
  // Registers `waiter` to be called at the next release that frees bytes (replacing an
  // earlier waiter: one scheduler owns a trainer slot at a time).
  void wait_for_release(std::function<void()> waiter) { waiter_ = std::move(waiter); }

  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t bytes_in_use() const;
  bool empty() const { return live_.empty(); }

 private:
  struct Span {
    std::uint64_t begin;  // relative to base_
    std::uint64_t end;
    bool released;
  };
  std::uint64_t base_;
  std::uint64_t capacity_;
  std::deque<Span> live_;  // allocation order
  std::function<void()> waiter_;
};

}  // namespace shardmix
