// The project's deterministic randomness. Every random choice that must be identical on
// every daemon and in every run (epoch plans, placement tie-breaks, generated datasets)
// goes through this file and never through <random>'s distributions, whose output is
// implementation-defined.
//
//   Generator:  xoshiro256** (Blackman & Vigna), 256-bit state, period 2^256 - 1.
//   Seeding:    Rng(seed) expands `seed` into the state with SplitMix64.
//               Rng::for_stream(seed, {a, b, ...}) first hashes the little-endian 8-byte
//               encodings of seed, a, b, ... with XXH64 (hash seed kStreamHashSeed), so
//               independent streams (per epoch, per node, per trainer) are decorrelated.
//   Bounded:    below(n) uses Lemire's multiply-and-reject method: unbiased, one multiply
//               in the common case.
//   Shuffle:    shuffle(span, rng) is Fisher-Yates from the back: for i = n-1 .. 1,
//               swap(items[i], items[below(i + 1)]).
// All of these are fixed algorithms: the same seed gives the same numbers on every
// platform, compiler and standard library. Changing any of them changes every epoch
// plan: treat the outputs as a compatibility promise (rng_test.cc pins them).
//
// Thread-safety: an Rng is a small value type with mutable state; use one per thread
// (derive them with for_stream), do not share one between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>

namespace shardmix {

// The XXH64 seed used by mix_seed / Rng::for_stream. Part of the compatibility promise.
inline constexpr std::uint64_t kStreamHashSeed = 0x53484152444d4958ull;  // "SHARDMIX"

// One step of SplitMix64: advances `state` and returns the next output.
constexpr std::uint64_t splitmix64_next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// XXH64 of the little-endian encodings of seed followed by each stream id.
// mix_seed(s, {}) != s: even the empty stream is hashed.
std::uint64_t mix_seed(std::uint64_t seed, std::initializer_list<std::uint64_t> stream);
std::uint64_t mix_seed(std::uint64_t seed, std::span<const std::uint64_t> stream);

class Rng {
 public:
  explicit Rng(std::uint64_t seed);

  // A generator for one named stream of a seed, e.g. for_stream(seed, {epoch, node}).
  static Rng for_stream(std::uint64_t seed, std::initializer_list<std::uint64_t> stream) {
    return Rng(mix_seed(seed, stream));
  }
  static Rng for_stream(std::uint64_t seed, std::span<const std::uint64_t> stream) {
    return Rng(mix_seed(seed, stream));
  }

  // 64 uniformly random bits (xoshiro256**).
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  std::uint64_t operator()() { return next(); }

  // Uniform in [0, n), unbiased (Lemire 2019). below(0) and below(1) return 0 and
  // below(0) consumes no randomness.
  std::uint64_t below(std::uint64_t n) {
    if (n == 0) return 0;
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
    std::uint64_t low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const std::uint64_t threshold = (0 - n) % n;  // 2^64 mod n
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // Fills `out` with random bytes (little-endian words of next()); fast, for test data.
  void fill_bytes(std::span<std::uint8_t> out);

  // The raw state, for tests and for checkpointing a generator.
  const std::uint64_t* state() const { return s_; }

  // For <random>/<algorithm> interop if ever needed (UniformRandomBitGenerator).
  using result_type = std::uint64_t;
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

// Fisher-Yates shuffle in place: every permutation equally likely, deterministic per rng.
template <class T>
void shuffle(std::span<T> items, Rng& rng) {
  using std::swap;
  for (std::size_t i = items.size(); i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(rng.below(i));
    if (j != i - 1) swap(items[i - 1], items[j]);
  }
}

}  // namespace shardmix
