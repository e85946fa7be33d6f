#include "server/staging_ring.h"

namespace shardmix {

std::optional<std::uint64_t> StagingRing::allocate(std::uint64_t length) {
  if (length == 0 || length > capacity_) return std::nullopt;
  std::uint64_t begin = 0;
  if (!live_.empty()) {
    const Span& head = live_.front();
    const Span& tail = live_.back();
    const bool wrapped = tail.begin < head.begin;
    if (!wrapped && capacity_ - tail.end >= length) {
      begin = tail.end;
    } else if (!wrapped && head.begin >= length) {
      begin = 0;  // wrap around to the start
    } else if (wrapped && head.begin - tail.end >= length) {
      begin = tail.end;
    } else {
      return std::nullopt;
    }
  }
  live_.push_back({begin, begin + length, false});
  return base_ + begin;
}

void StagingRing::release(std::uint64_t offset) {
  for (auto& span : live_) {
    if (span.begin + base_ == offset && !span.released) {
      span.released = true;
      break;
    }
  }
  const std::size_t before = live_.size();
  while (!live_.empty() && live_.front().released) live_.pop_front();
  if (live_.size() != before && waiter_) {
    auto waiter = std::move(waiter_);
    waiter_ = nullptr;
    waiter();
  }
}

std::uint64_t StagingRing::bytes_in_use() const {
  std::uint64_t total = 0;
  for (const auto& span : live_) total += span.end - span.begin;
  return total;
}

}  // namespace shardmix
