// Permutation (common/permutation.h): a bijection on [0, n) for every n, inverse() undoes
// it, and over many keys it behaves like a uniformly random permutation: each position
// lands anywhere with equal frequency, the gap between the images of neighbouring
// positions is uniform (which an identity or a rotation fails), and fixed points average
// one. The statistical tests use fixed seeds, so they are deterministic.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "common/permutation.h"
#include "common/rng.h"

namespace shardmix {
namespace permutation_test {

// Every i < n maps to a distinct value < n, and inverse maps it back.
void expect_bijection(const Permutation& p) {
  const std::uint64_t n = p.size();
  std::vector<bool> hit(n, false);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t j = p(i);
    ASSERT_LT(j, n) << "n=" << n << " i=" << i;
    ASSERT_FALSE(hit[j]) << "n=" << n << ": " << j << " is hit twice";
    hit[j] = true;
    ASSERT_EQ(p.inverse(j), i) << "n=" << n;
  }
}

TEST(Permutation, IsABijectionForSmallAndAwkwardSizes) {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t n = 0; n <= 70; ++n) sizes.push_back(n);
  for (unsigned b = 7; b <= 17; ++b) {
    const std::uint64_t p2 = std::uint64_t{1} << b;
    sizes.insert(sizes.end(), {p2 - 1, p2, p2 + 1});
  }
  sizes.insert(sizes.end(), {97, 101, 1009, 7919, 65521, 100003});  // primes
  for (std::uint64_t n : sizes) {
    for (std::uint64_t seed : {0ull, 1ull, 0xdeadbeefull}) {
      expect_bijection(Permutation::for_stream(n, seed, {n}));
    }
  }
}

RC_GTEST_PROP(Permutation, InverseRoundTripsAtLargeSizes, ()) {
  // Too large to enumerate: sampled positions, both directions.
  const auto n = *rc::gen::oneOf(rc::gen::inRange<std::uint64_t>(1, 1u << 20),
                                 rc::gen::inRange<std::uint64_t>(1, std::uint64_t{1} << 40),
                                 rc::gen::inRange<std::uint64_t>(1, std::uint64_t{1} << 62));
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const Permutation p = Permutation::for_stream(n, seed, {7});
  for (int k = 0; k < 50; ++k) {
    const std::uint64_t i = *rc::gen::inRange<std::uint64_t>(0, n);
    const std::uint64_t j = p(i);
    RC_ASSERT(j < n);
    RC_ASSERT(p.inverse(j) == i);
    RC_ASSERT(p(p.inverse(i)) == i);
  }
}

RC_GTEST_PROP(Permutation, IsABijectionForAnySmallSize, ()) {
  const auto n = *rc::gen::inRange<std::uint64_t>(0, 5000);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const Permutation p = Permutation::for_stream(n, seed, {1, 2});
  std::vector<bool> hit(n, false);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t j = p(i);
    RC_ASSERT(j < n);
    RC_ASSERT(!hit[j]);
    hit[j] = true;
    RC_ASSERT(p.inverse(j) == i);
  }
}

TEST(Permutation, SameKeySamePermutationOtherStreamAnother) {
  const std::uint64_t n = 1000;
  const Permutation a = Permutation::for_stream(n, 5, {1, 2, 3});
  const Permutation b = Permutation::for_stream(n, 5, {1, 2, 3});
  const Permutation c = Permutation::for_stream(n, 5, {1, 2, 4});
  const Permutation d = Permutation::for_stream(n, 6, {1, 2, 3});
  std::uint64_t same_c = 0, same_d = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a(i), b(i));
    same_c += a(i) == c(i);
    same_d += a(i) == d(i);
  }
  // Independent permutations agree at about one position.
  EXPECT_LT(same_c, 10u);
  EXPECT_LT(same_d, 10u);
}

TEST(Permutation, OutputsArePinned) {
  // Part of the plan compatibility promise (permutation.h): a change here changes every
  // epoch plan.
  const Permutation p = Permutation::for_stream(1000, 42, {1, 2});
  std::vector<std::uint64_t> first;
  for (std::uint64_t i = 0; i < 6; ++i) first.push_back(p(i));
  const std::vector<std::uint64_t> pinned = {372, 852, 146, 866, 567, 262};
  EXPECT_EQ(first, pinned);
}

// Pearson's chi-square statistic of `observed` against equal expected counts.
double chi_square(const std::vector<std::uint64_t>& observed) {
  std::uint64_t total = 0;
  for (auto o : observed) total += o;
  const double expected = static_cast<double>(total) / static_cast<double>(observed.size());
  double chi = 0;
  for (auto o : observed) chi += (static_cast<double>(o) - expected) * (static_cast<double>(o) - expected) / expected;
  return chi;
}

// An upper bound the statistic of a uniform sample exceeds with probability about 1e-6:
// the Wilson-Hilferty approximation of the chi-square quantile with z = 4.75.
double chi_square_bound(double df) {
  const double z = 4.75;
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// For n in several sizes (power of two, not, prime) and 20,000 keys: where position i
// lands (all i), and the gap (p(i+1) - p(i)) mod n. A uniform permutation makes both
// uniform; identity and rotation make the gap a constant, a reversal too.
TEST(Permutation, PositionsAndGapsAreUniformOverKeys) {
  constexpr std::uint64_t kKeys = 20000;
  for (const std::uint64_t n : {5ull, 8ull, 13ull, 64ull, 100ull}) {
    std::vector<std::uint64_t> landing(n * n, 0);  // (i, p(i))
    std::vector<std::uint64_t> gap(n - 1, 0);      // (p(i+1) - p(i)) mod n, never 0
    double fixed_points = 0;
    for (std::uint64_t key = 0; key < kKeys; ++key) {
      const Permutation p = Permutation::for_stream(n, 2024, {n, key});
      for (std::uint64_t i = 0; i < n; ++i) {
        ++landing[i * n + p(i)];
        fixed_points += p(i) == i;
        if (i + 1 < n) ++gap[(p(i + 1) + n - p(i)) % n - 1];
      }
    }
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::vector<std::uint64_t> row(landing.begin() + i * n, landing.begin() + (i + 1) * n);
      EXPECT_LT(chi_square(row), chi_square_bound(static_cast<double>(n - 1))) << "n=" << n << " position " << i;
    }
    EXPECT_LT(chi_square(gap), chi_square_bound(static_cast<double>(n - 2))) << "n=" << n;
    // Fixed points of a uniform permutation: mean 1, variance 1 (n >= 2); over 20,000 keys
    // the average is within 0.04 of 1 with overwhelming probability (5.6 sigma).
    EXPECT_NEAR(fixed_points / kKeys, 1.0, 0.04) << "n=" << n;
  }
}

// Every order of a 3- and a 4-element domain occurs, about equally often (kMinBits).
TEST(Permutation, EveryOrderOfASmallDomainIsAboutEquallyLikely) {
  for (const std::uint64_t n : {3ull, 4ull}) {
    std::map<std::vector<std::uint64_t>, std::uint64_t> seen;
    for (std::uint64_t key = 0; key < 60000; ++key) {
      const Permutation p = Permutation::for_stream(n, 99, {key});
      std::vector<std::uint64_t> order;
      for (std::uint64_t i = 0; i < n; ++i) order.push_back(p(i));
      ++seen[order];
    }
    const std::uint64_t orders = n == 3 ? 6 : 24;
    ASSERT_EQ(seen.size(), orders) << "n=" << n;
    std::vector<std::uint64_t> counts;
    for (const auto& [order, count] : seen) counts.push_back(count);
    EXPECT_LT(chi_square(counts), chi_square_bound(static_cast<double>(orders - 1))) << "n=" << n;
  }
}

// At a size where the network is the cost (no enumeration): the images of a large
// permutation's first 200,000 positions spread over ten equal ranges.
TEST(Permutation, ImagesOfALargePermutationSpreadEvenly) {
  const std::uint64_t n = 100'000'007;
  const Permutation p = Permutation::for_stream(n, 3, {0});
  std::vector<std::uint64_t> decile(10, 0);
  for (std::uint64_t i = 0; i < 200000; ++i) ++decile[p(i) * 10 / n];
  EXPECT_LT(chi_square(decile), chi_square_bound(9.0));
}

}  // namespace permutation_test
}  // namespace shardmix
