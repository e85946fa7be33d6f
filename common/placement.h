// Placement: which node caches which sample, and where in that node's cache arena.
// A pure function of the catalog, the plan shape and the config: every daemon computes
// the same placement, so a peer's sample address needs no lookup message.
//
// Node n caches exactly shape.node_owned[n] samples, so that at exchange_fraction 0 each
// node's trainers can be fed from local RAM alone with equal batch counts.
//  - balanced (default): largest samples first, each to the node with the fewest bytes
//    among nodes that still have room; nodes end up within about one sample's size of
//    each other in bytes while the counts stay exact.
//  - sorted: contiguous runs of sample ids (ids are sorted by label, then path), i.e.
//    class-sorted shards: the worst case for local shuffles, for studies.
// Thread-safety: immutable value after make_placement.
#pragma once

#include <cstdint>
#include <vector>

#include "common/catalog.h"
#include "common/config.h"
#include "common/epoch_plan.h"

namespace shardmix {

// Samples start at multiples of this in the arena (cache-line aligned copies and reads).
inline constexpr std::uint64_t kArenaAlignment = 64;

// Rounds a byte count up to kArenaAlignment: the space a sample takes in an arena or in
// a staging slot.
constexpr std::uint64_t align_to_arena(std::uint64_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

struct Placement {
  std::vector<std::uint32_t> owner;          // sample -> node
  std::vector<std::uint64_t> arena_offset;   // sample -> offset in its owner's arena
  std::vector<std::vector<SampleId>> owned;  // node -> its samples, ascending ids
  std::vector<std::uint64_t> arena_bytes;    // node -> arena size (aligned sum)
  std::vector<std::uint64_t> sample_bytes;   // node -> sum of sample sizes
};

Placement make_placement(const std::vector<std::uint64_t>& sizes, const PlanShape& shape,
                         PlacementPolicy policy, std::uint64_t seed);

}  // namespace shardmix
