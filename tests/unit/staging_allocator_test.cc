// The staging extent allocator against a byte-map model: first-fit, no two live
// allocations share a byte, and frees of any sub-range coalesce back to one extent.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "common/staging_allocator.h"

namespace shardmix {
namespace staging_allocator_test {

TEST(StagingAllocator, ReusesTheLowestHoleInsteadOfWalkingOn) {
  // In-order use (a batch allocated, released, the next allocated) must stay at the
  // bottom of the area: the pages touched are then the read-ahead budget, not the whole
  // staging area (decisions/0031).
  StagingAllocator staging(0, 1 << 20);
  for (int batch = 0; batch < 100; ++batch) {
    auto a = staging.allocate(3000);
    auto b = staging.allocate(5000);
    ASSERT_TRUE(a && b);
    EXPECT_LT(*b + 5000, 8001u) << "batch " << batch;
    staging.release(*a, 3000);
    staging.release(*b, 5000);
  }
  auto a = staging.allocate(200);
  auto b = staging.allocate(200);
  auto c = staging.allocate(200);
  ASSERT_TRUE(a && b && c);
  staging.release(*a, 200);
  auto d = staging.allocate(100);  // next-fit would have gone on after c
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, *a);
}

// A model: one flag per byte (capacities are small), the live allocations, and the
// first-fit answer computed by scanning the flags.
struct Model {
  std::uint64_t base;
  std::vector<bool> used;
  std::optional<std::uint64_t> first_fit(std::uint64_t length) const {
    std::uint64_t run = 0;
    for (std::uint64_t i = 0; i < used.size(); ++i) {
      run = used[i] ? 0 : run + 1;
      if (run == length) return base + i + 1 - length;
    }
    return std::nullopt;
  }
};

RC_GTEST_PROP(StagingAllocator, MatchesAFirstFitByteModelUnderRandomUse, ()) {
  const auto base = *rc::gen::inRange<std::uint64_t>(0, 5000);
  const auto capacity = *rc::gen::inRange<std::uint64_t>(1, 600);
  StagingAllocator staging(base, capacity);
  Model model{base, std::vector<bool>(capacity, false)};
  struct Live {
    std::uint64_t offset, length;
  };
  std::vector<Live> live;
  const auto steps = *rc::gen::inRange(1, 200);
  for (int step = 0; step < steps; ++step) {
    const bool allocate = live.empty() || *rc::gen::inRange(0, 3) > 0;
    if (allocate) {
      const auto length = *rc::gen::inRange<std::uint64_t>(1, capacity + 2);
      const auto got = staging.allocate(length);
      const auto want = length <= capacity ? model.first_fit(length) : std::nullopt;
      RC_ASSERT(got == want);
      if (got) {
        for (std::uint64_t i = *got - base; i < *got - base + length; ++i) model.used[i] = true;
        live.push_back({*got, length});
      }
    } else {
      // Free a random sub-range of a random live allocation; the rest stays live.
      const auto k = *rc::gen::inRange<std::size_t>(0, live.size());
      const Live l = live[k];
      const auto from = *rc::gen::inRange<std::uint64_t>(0, l.length);
      const auto len = *rc::gen::inRange<std::uint64_t>(1, l.length - from + 1);
      staging.release(l.offset + from, len);
      for (std::uint64_t i = l.offset - base + from; i < l.offset - base + from + len; ++i) model.used[i] = false;
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      if (from > 0) live.push_back({l.offset, from});
      if (from + len < l.length) live.push_back({l.offset + from + len, l.length - from - len});
    }
    std::uint64_t in_use = 0;
    for (const bool u : model.used) in_use += u ? 1 : 0;
    RC_ASSERT(staging.bytes_in_use() == in_use);
  }
  for (const Live& l : live) staging.release(l.offset, l.length);
  RC_ASSERT(staging.empty());
  RC_ASSERT(staging.allocate(capacity) == std::optional<std::uint64_t>(base));  // coalesced back into one extent
}

}  // namespace staging_allocator_test
}  // namespace shardmix
