#include "common/staging_allocator.h"

#include "common/status.h"

namespace shardmix {

StagingAllocator::StagingAllocator(std::uint64_t base, std::uint64_t capacity) : base_(base), capacity_(capacity) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

std::optional<std::uint64_t> StagingAllocator::allocate(std::uint64_t length) {
  if (length == 0 || length > capacity_ - in_use_) return std::nullopt;
  // First-fit: the lowest free extent that holds `length`.
  auto take = free_.begin();
  while (take != free_.end() && take->second - take->first < length) ++take;
  if (take == free_.end()) return std::nullopt;
  const std::uint64_t begin = take->first;
  const std::uint64_t extent_end = take->second;
  free_.erase(take);
  if (begin + length < extent_end) free_.emplace(begin + length, extent_end);
  in_use_ += length;
  return base_ + begin;
}

void StagingAllocator::free_range(std::uint64_t offset, std::uint64_t length) {
  if (length == 0) return;
  std::uint64_t begin = offset - base_;
  std::uint64_t end = begin + length;
  auto next = free_.lower_bound(begin);
  const bool overlaps_next = next != free_.end() && next->first < end;
  const bool overlaps_prev = next != free_.begin() && std::prev(next)->second > begin;
  if (offset < base_ || end > capacity_ || length > in_use_ || overlaps_next || overlaps_prev) {
    // A scheduler bug: the same bytes would be handed to two samples. Stop loudly.
    invariant_failed("staging release of [{}, +{}) (base {}, capacity {}) frees free bytes", offset, length, base_,
                     capacity_);
  }
  // Coalesce with the neighbours.
  if (next != free_.end() && next->first == end) {
    end = next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == begin) {
      begin = prev->first;
      free_.erase(prev);
    }
  }
  free_.emplace(begin, end);
  in_use_ -= length;
}

void StagingAllocator::notify() {
  if (waiter_) {
    auto waiter = std::move(waiter_);
    waiter_ = nullptr;
    waiter();
  }
}

void StagingAllocator::release(std::uint64_t offset, std::uint64_t length) {
  if (length == 0) return;
  free_range(offset, length);
  notify();
}

void StagingAllocator::release_all(std::span<const std::pair<std::uint64_t, std::uint64_t>> ranges) {
  bool freed = false;
  for (const auto& [offset, length] : ranges) {
    if (length == 0) continue;
    free_range(offset, length);
    freed = true;
  }
  if (freed) notify();
}

}  // namespace shardmix
