#include "common/rng.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>
#include <xxhash.h>

namespace shardmix {
namespace rng_test {

// xoshiro256** seeded by SplitMix64(0): values checked against an independent
// implementation of the reference algorithms (Vigna's xoshiro256starstar.c / splitmix64.c).
TEST(RngTest, MatchesReferenceXoshiro256StarStar) {
  Rng rng(0);
  EXPECT_EQ(rng.state()[0], 0xe220a8397b1dcdafull);
  EXPECT_EQ(rng.state()[1], 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(rng.state()[2], 0x06c45d188009454full);
  EXPECT_EQ(rng.state()[3], 0xf88bb8a8724c81ecull);
  EXPECT_EQ(rng.next(), 0x99ec5f36cb75f2b4ull);
  EXPECT_EQ(rng.next(), 0xbf6e1f784956452aull);
  EXPECT_EQ(rng.next(), 0x1a5f849d4933e6e0ull);
  EXPECT_EQ(rng.next(), 0x6aa594f1262d2d2cull);
}

// Pinned outputs: changing any of these changes every epoch plan (a compatibility break).
TEST(RngTest, StreamsArePinned) {
  EXPECT_EQ(mix_seed(42, {1, 2}), 0x363cd909b077b9d6ull);
  Rng rng = Rng::for_stream(42, {1, 2});
  EXPECT_EQ(rng.next(), 0x18d0030bef1b37e1ull);
  EXPECT_EQ(rng.next(), 0x6f18ff87d3834d31ull);

  Rng bounded(7);
  std::vector<std::uint64_t> draws;
  for (int i = 0; i < 6; ++i) draws.push_back(bounded.below(10));
  EXPECT_EQ(draws, (std::vector<std::uint64_t>{7, 2, 8, 9, 9, 8}));

  std::vector<int> v(10);
  std::iota(v.begin(), v.end(), 0);
  Rng shuffler(123);
  shuffle(std::span<int>(v), shuffler);
  EXPECT_EQ(v, (std::vector<int>{6, 5, 7, 9, 4, 2, 0, 3, 8, 1}));
}

TEST(RngTest, MixSeedIsXxh64OfLittleEndianWords) {
  const std::uint8_t bytes[24] = {42, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(mix_seed(42, {1, 2}), XXH64(bytes, sizeof(bytes), kStreamHashSeed));
  // Long streams (beyond the small on-stack buffer) hash the same way.
  std::vector<std::uint64_t> stream(20);
  std::iota(stream.begin(), stream.end(), 1);
  std::vector<std::uint8_t> le;
  for (std::uint64_t w : std::vector<std::uint64_t>{9}) {
    for (int i = 0; i < 8; ++i) le.push_back(static_cast<std::uint8_t>(w >> (8 * i)));
  }
  for (std::uint64_t w : stream) {
    for (int i = 0; i < 8; ++i) le.push_back(static_cast<std::uint8_t>(w >> (8 * i)));
  }
  EXPECT_EQ(mix_seed(9, std::span<const std::uint64_t>(stream)), XXH64(le.data(), le.size(), kStreamHashSeed));
}

TEST(RngTest, SameSeedSameSequenceDifferentStreamsDiffer) {
  Rng a = Rng::for_stream(5, {3, 1});
  Rng b = Rng::for_stream(5, {3, 1});
  Rng c = Rng::for_stream(5, {1, 3});
  Rng d = Rng::for_stream(5, {3});
  Rng e = Rng::for_stream(6, {3, 1});
  bool c_differs = false, d_differs = false, e_differs = false;
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t x = a.next();
    EXPECT_EQ(x, b.next());
    c_differs |= x != c.next();
    d_differs |= x != d.next();
    e_differs |= x != e.next();
  }
  EXPECT_TRUE(c_differs);
  EXPECT_TRUE(d_differs);
  EXPECT_TRUE(e_differs);
  EXPECT_NE(mix_seed(5, {}), 5u);
}

TEST(RngTest, BelowStaysInRange) {
  Rng rng(99);
  for (std::uint64_t n : {1ull, 2ull, 3ull, 7ull, 10ull, 1000ull, (1ull << 32) + 1, (1ull << 63) + 1, ~0ull}) {
    for (int i = 0; i < 2000; ++i) EXPECT_LT(rng.below(n), n) << "n = " << n;
  }
  EXPECT_EQ(rng.below(0), 0u);
  EXPECT_EQ(rng.below(1), 0u);
}

double chi_square(const std::vector<std::uint64_t>& counts, double expected) {
  double chi2 = 0;
  for (std::uint64_t c : counts) chi2 += (static_cast<double>(c) - expected) * (static_cast<double>(c) - expected) / expected;
  return chi2;
}

TEST(RngTest, BelowIsRoughlyUniform) {
  Rng rng(2024);
  constexpr int kBuckets = 10;
  constexpr int kDraws = 200000;
  std::vector<std::uint64_t> counts(kBuckets);
  for (int i = 0; i < kDraws; ++i) ++counts[rng.below(kBuckets)];
  // 9 degrees of freedom: P(chi2 > 40) ~ 7e-6. The seed is fixed, so this is deterministic.
  EXPECT_LT(chi_square(counts, kDraws / kBuckets), 40.0);

  // A bound where modulo reduction would be badly biased: n = 3 * 2^62. With `next() % n`
  // values below 2^62 would be twice as likely; Lemire's method keeps each third at 1/3.
  const std::uint64_t n = 3ull << 62;
  std::vector<std::uint64_t> thirds(3);
  for (int i = 0; i < 60000; ++i) ++thirds[rng.below(n) / (1ull << 62)];
  EXPECT_LT(chi_square(thirds, 20000), 25.0);
}

TEST(RngTest, UniformIsInUnitIntervalWithMeanOneHalf) {
  Rng rng(1);
  double sum = 0;
  constexpr int kDraws = 100000;
  for (int i = 0; i < kDraws; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);
}

TEST(RngTest, ShuffleIsAPermutation) {
  for (std::size_t n : {0u, 1u, 2u, 5u, 1000u}) {
    std::vector<std::uint32_t> v(n);
    std::iota(v.begin(), v.end(), 0u);
    Rng rng = Rng::for_stream(11, {n});
    shuffle(std::span<std::uint32_t>(v), rng);
    std::vector<std::uint32_t> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
    if (n == 1000) {
      EXPECT_FALSE(std::is_sorted(v.begin(), v.end()));
    }
  }
}

TEST(RngTest, ShuffleHitsEveryPermutationEvenly) {
  Rng rng(77);
  std::map<std::array<int, 4>, std::uint64_t> seen;
  constexpr int kTrials = 48000;
  for (int t = 0; t < kTrials; ++t) {
    std::array<int, 4> a = {0, 1, 2, 3};
    shuffle(std::span<int>(a), rng);
    ++seen[a];
  }
  ASSERT_EQ(seen.size(), 24u);
  std::vector<std::uint64_t> counts;
  for (const auto& [perm, count] : seen) counts.push_back(count);
  // 23 degrees of freedom: P(chi2 > 70) ~ 1e-6.
  EXPECT_LT(chi_square(counts, kTrials / 24.0), 70.0);
}

TEST(RngTest, FillBytesIsDeterministicAndCoversTail) {
  std::vector<std::uint8_t> a(37), b(37);
  Rng ra(5), rb(5);
  ra.fill_bytes(a);
  rb.fill_bytes(b);
  EXPECT_EQ(a, b);
  Rng rc(5);
  const std::uint64_t first = rc.next();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a[i], static_cast<std::uint8_t>(first >> (8 * i)));
  // The 5-byte tail is filled too (not all zero for this seed).
  EXPECT_TRUE(std::any_of(a.begin() + 32, a.end(), [](std::uint8_t x) { return x != 0; }));
}

}  // namespace rng_test
}  // namespace shardmix
