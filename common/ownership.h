// Ownership: which node's share each sample is, as the epoch planner and the owner-side
// directory (sample_directory.h) need it: node k owns owned_count(k) samples, the i-th of
// which is owned_at(k, i), and owner(id) is the node whose share `id` is.
//
// Two forms (docs/decisions/0055):
//  - listed: the placement's per-node lists (dataset.placement = balanced or sorted). The
//    lists are the placement's own vectors, O(N) on every node, because those policies
//    are global decisions (balanced sorts all N sizes; sorted is the class-sorted study).
//  - spread (dataset.placement = spread): a pure function of (N, the nodes' counts, seed)
//    in O(P) memory. A seeded bijection rho over [0, N) (permutation.h, stream
//    {seed, kStreamSpread}) lays the ids out; node k owns the ids whose position rho(id)
//    falls in [first[k], first[k] + node_owned[k]). So owned_at(k, i) = rho^-1(first[k] + i),
//    owner(id) = the range holding rho(id) (binary search over P + 1 prefix sums) and
//    local_index(id) = rho(id) - first[owner]. Counts per node are exact (node_owned);
//    bytes per node are balanced only statistically (a random share of the sizes: the
//    relative spread of a node's bytes is about cv / sqrt(N / P), under 1 % at 100,000
//    samples a node with cv 2).
// Thread-safety: an immutable value; every member is const and safe to call concurrently.
#pragma once

#include <cstdint>
#include <vector>

#include "common/catalog.h"
#include "common/permutation.h"

namespace shardmix {

class Ownership {
 public:
  Ownership() = default;
  // The lists of a placement (index = node; each list the node's samples), with `owner`
  // the node of every sample. Both must outlive this object (they are referenced).
  static Ownership listed(const std::vector<std::vector<SampleId>>& owned, const std::vector<std::uint32_t>& owner);
  // dataset.placement = spread over `num_samples` ids, node k owning node_owned[k] of them
  // (the counts must sum to num_samples).
  static Ownership spread(std::uint64_t num_samples, const std::vector<std::uint64_t>& node_owned,
                          std::uint64_t seed);

  bool is_spread() const { return owned_ == nullptr; }
  std::uint32_t nodes() const {
    return is_spread() ? static_cast<std::uint32_t>(first_.size() - 1) : static_cast<std::uint32_t>(owned_->size());
  }
  std::uint64_t owned_count(std::uint32_t node) const {
    return is_spread() ? first_[node + 1] - first_[node] : (*owned_)[node].size();
  }
  // The i-th sample of node's share, i < owned_count(node). Listed: the list's i-th entry
  // (ascending ids); spread: in rho order (not ascending).
  SampleId owned_at(std::uint32_t node, std::uint64_t i) const {
    return is_spread() ? static_cast<SampleId>(layout_.inverse(first_[node] + i)) : (*owned_)[node][i];
  }
  // The node whose share `id` is.
  std::uint32_t owner(SampleId id) const;
  // Spread only: `id`'s owner and its index in that share
  // (owned_at(share.node, share.index) == id).
  struct Share {
    std::uint32_t node = 0;
    std::uint64_t index = 0;
  };
  Share locate(SampleId id) const;
  // Bytes this object itself holds (the listed form's vectors belong to the placement).
  std::uint64_t memory_bytes() const;

 private:
  const std::vector<std::vector<SampleId>>* owned_ = nullptr;  // listed
  const std::vector<std::uint32_t>* owner_ = nullptr;          // listed
  Permutation layout_;                                         // spread: rho
  std::vector<std::uint64_t> first_;                           // spread: P + 1 prefix sums of node_owned
};

}  // namespace shardmix
