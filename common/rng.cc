#include "common/rng.h"

#include <cstring>
#include <vector>

#include <xxhash.h>

namespace shardmix {
namespace {

void put_le64(std::uint8_t* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

}  // namespace

std::uint64_t mix_seed(std::uint64_t seed, std::span<const std::uint64_t> stream) {
  std::uint8_t small[8 * 8];
  std::vector<std::uint8_t> large;
  const std::size_t n = 8 * (1 + stream.size());
  std::uint8_t* buf = small;
  if (n > sizeof(small)) {
    large.resize(n);
    buf = large.data();
  }
  put_le64(buf, seed);
  for (std::size_t i = 0; i < stream.size(); ++i) put_le64(buf + 8 * (i + 1), stream[i]);
  return XXH64(buf, n, kStreamHashSeed);
}

std::uint64_t mix_seed(std::uint64_t seed, std::initializer_list<std::uint64_t> stream) {
  return mix_seed(seed, std::span<const std::uint64_t>(stream.begin(), stream.size()));
}

Rng::Rng(std::uint64_t seed) {
  std::uint64_t sm = seed;
  for (auto& word : s_) word = splitmix64_next(sm);
  // SplitMix64 is a bijection of its counter, so four consecutive zero outputs cannot
  // happen; keep the guard anyway: the all-zero state is xoshiro's only fixed point.
  if ((s_[0] | s_[1] | s_[2] | s_[3]) == 0) s_[0] = 1;
}

void Rng::fill_bytes(std::span<std::uint8_t> out) {
  std::size_t i = 0;
  std::uint8_t word[8];
  for (; i + 8 <= out.size(); i += 8) {
    put_le64(word, next());
    std::memcpy(out.data() + i, word, 8);
  }
  if (i < out.size()) {
    put_le64(word, next());
    std::memcpy(out.data() + i, word, out.size() - i);
  }
}

}  // namespace shardmix
