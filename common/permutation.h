// A seeded bijection on [0, n) that costs O(1) memory: position i maps to sigma(i) with a
// few rounds of arithmetic, and back with inverse(). The epoch planner uses it to compute
// one node's slice of a random order without materialising the whole order
// (docs/decisions/0040).
//
//   Construction: a Feistel network over [0, 2^b), 2^b the smallest power of two >= n
//   but at least 2^kMinBits, with alternating halves of floor(b/2) and ceil(b/2) bits, so
//   any b works (b odd included). Values that land at or beyond n are encrypted again
//   ("cycle walking") until they fall inside [0, n), which keeps the map a bijection on
//   [0, n); for n >= 2^kMinBits, 2^b < 2n, so that takes fewer than two passes on
//   average. The floor of 2^kMinBits exists for tiny n: a network of 1-bit halves
//   reaches its permutations with visibly unequal frequencies, one of 4-bit halves does
//   not (permutation_test.cc), and walking a 256-value domain is still cheap.
//   Round function: the SplitMix64 finaliser of (half + round key), masked to the other
//   half's width. kRounds = 6 rounds (Luby-Rackoff needs 4 for a pseudo-random
//   permutation from a pseudo-random round function).
//   Keys: the round keys are the first kRounds outputs of an Rng, normally
//   Rng::for_stream(seed, {...}) (for_stream() below), so every random choice of an epoch
//   keeps drawing from its own named stream.
// The outputs are part of the plan compatibility promise, like rng.h: permutation_test.cc
// pins some of them.
//
// Thread-safety: an immutable value after construction; operator() and inverse() are const
// and safe to call concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

#include "common/rng.h"

namespace shardmix {

class Permutation {
 public:
  static constexpr int kRounds = 6;
  static constexpr unsigned kMinBits = 8;

  // The identity on [0, 0): for default-constructed tables.
  Permutation() = default;
  // A bijection on [0, n) keyed by the next kRounds outputs of `keys`.
  Permutation(std::uint64_t n, Rng keys);
  // Keyed by Rng::for_stream(seed, stream).
  static Permutation for_stream(std::uint64_t n, std::uint64_t seed, std::initializer_list<std::uint64_t> stream) {
    return Permutation(n, Rng::for_stream(seed, stream));
  }

  std::uint64_t size() const { return n_; }

  // sigma(i) for i < size(); undefined for i >= size().
  std::uint64_t operator()(std::uint64_t i) const {
    std::uint64_t v = encrypt(i);
    while (v >= n_) v = encrypt(v);
    return v;
  }
  // sigma^-1(j) for j < size(): inverse(operator()(i)) == i.
  std::uint64_t inverse(std::uint64_t j) const {
    std::uint64_t v = decrypt(j);
    while (v >= n_) v = decrypt(v);
    return v;
  }

 private:
  static std::uint64_t round_fn(std::uint64_t half, std::uint64_t key) {
    std::uint64_t z = half + key;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // One pass of the network over [0, 2^bits). The state is (x, y), x the high part of
  // left_bits_ and y the low part of right_bits_; a round maps it to
  // (y, x ^ F(y) mod 2^|x|), which swaps the two widths, so two rounds restore them.
  std::uint64_t encrypt(std::uint64_t v) const {
    std::uint64_t x = v >> right_bits_;
    std::uint64_t y = v & right_mask_;
    for (int r = 0; r < kRounds; r += 2) {
      const std::uint64_t a = (x ^ round_fn(y, keys_[r])) & left_mask_;
      const std::uint64_t b = (y ^ round_fn(a, keys_[r + 1])) & right_mask_;
      x = a;
      y = b;
    }
    return (x << right_bits_) | y;
  }
  std::uint64_t decrypt(std::uint64_t v) const {
    std::uint64_t x = v >> right_bits_;
    std::uint64_t y = v & right_mask_;
    for (int r = kRounds - 2; r >= 0; r -= 2) {
      const std::uint64_t y_before = (y ^ round_fn(x, keys_[r + 1])) & right_mask_;
      const std::uint64_t x_before = (x ^ round_fn(y_before, keys_[r])) & left_mask_;
      x = x_before;
      y = y_before;
    }
    return (x << right_bits_) | y;
  }

  static_assert(kRounds % 2 == 0, "rounds go in pairs, which restore the widths");

  std::uint64_t n_ = 0;
  unsigned right_bits_ = 0;
  std::uint64_t left_mask_ = 0;
  std::uint64_t right_mask_ = 0;
  std::array<std::uint64_t, kRounds> keys_{};
};

}  // namespace shardmix
