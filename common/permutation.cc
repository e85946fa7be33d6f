#include "common/permutation.h"

#include <algorithm>
#include <bit>

namespace shardmix {

Permutation::Permutation(std::uint64_t n, Rng keys) : n_(n) {
  // The smallest b >= kMinBits with 2^b >= n. For n = 1 cycle walking brings 0 back to 0.
  const unsigned bits = n <= 1 ? kMinBits : std::max(kMinBits, static_cast<unsigned>(std::bit_width(n - 1)));
  right_bits_ = bits - bits / 2;
  left_mask_ = (std::uint64_t{1} << (bits / 2)) - 1;
  right_mask_ = (std::uint64_t{1} << right_bits_) - 1;
  for (auto& key : keys_) key = keys.next();
}

}  // namespace shardmix
