#include "common/placement.h"

#include <algorithm>
#include <numeric>
#include <queue>

#include "common/rng.h"

namespace shardmix {
namespace {

std::vector<std::uint32_t> place_sorted(std::size_t n, const PlanShape& shape) {
  std::vector<std::uint32_t> owner(n);
  std::size_t id = 0;
  for (std::uint32_t k = 0; k < shape.job.nodes; ++k) {
    for (std::uint64_t i = 0; i < shape.node_owned[k]; ++i) owner[id++] = k;
  }
  return owner;
}

std::vector<std::uint32_t> place_balanced(const std::vector<std::uint64_t>& sizes,
                                          const PlanShape& shape, std::uint64_t seed) {
  const std::size_t n = sizes.size();
  // Largest first; equal sizes in a seeded order so that equal-size datasets do not end
  // up class-sorted by accident (ids are sorted by label).
  std::vector<std::uint64_t> tie(n);
  for (std::size_t i = 0; i < n; ++i) tie[i] = mix_seed(seed, {0x706c6163ull, i});
  std::vector<SampleId> order(n);
  std::iota(order.begin(), order.end(), SampleId{0});
  std::sort(order.begin(), order.end(), [&](SampleId a, SampleId b) {
    if (sizes[a] != sizes[b]) return sizes[a] > sizes[b];
    return tie[a] < tie[b];
  });
  // Min-heap of (bytes so far, node) over nodes that still have room.
  using Slot = std::pair<std::uint64_t, std::uint32_t>;
  std::priority_queue<Slot, std::vector<Slot>, std::greater<>> lightest;
  std::vector<std::uint64_t> room(shape.node_owned);
  for (std::uint32_t k = 0; k < shape.job.nodes; ++k) {
    if (room[k] > 0) lightest.emplace(0, k);
  }
  std::vector<std::uint32_t> owner(n);
  for (SampleId id : order) {
    auto [bytes, k] = lightest.top();
    lightest.pop();
    owner[id] = k;
    if (--room[k] > 0) lightest.emplace(bytes + sizes[id], k);
  }
  return owner;
}

}  // namespace

Placement make_placement(const std::vector<std::uint64_t>& sizes, const PlanShape& shape,
                         PlacementPolicy policy, std::uint64_t seed) {
  Placement p;
  p.owner = policy == PlacementPolicy::kSorted ? place_sorted(sizes.size(), shape)
                                               : place_balanced(sizes, shape, seed);
  const std::uint32_t nodes = shape.job.nodes;
  p.owned.assign(nodes, {});
  for (std::uint32_t k = 0; k < nodes; ++k) p.owned[k].reserve(shape.node_owned[k]);
  p.arena_offset.assign(sizes.size(), 0);
  p.arena_bytes.assign(nodes, 0);
  p.sample_bytes.assign(nodes, 0);
  for (SampleId id = 0; id < sizes.size(); ++id) {
    const std::uint32_t k = p.owner[id];
    p.owned[k].push_back(id);
    p.arena_offset[id] = p.arena_bytes[k];
    p.arena_bytes[k] = align_to_arena(p.arena_bytes[k] + sizes[id]);
    p.sample_bytes[k] += sizes[id];
  }
  return p;
}

}  // namespace shardmix
