// Arena layouts per residency generation (cache rotation, docs/decisions/0033).
//
// Generation 0 is the static placement's layout (ascending ids, packed). Generation g+1 is
// derived from generation g so that only the *delta* is loaded: a sample resident in both
// keeps its offset, so it is never written during the reload and stays readable by peers
// and local trainers throughout; samples that enter take holes left by the ones that leave,
// largest first, each into the smallest hole that fits (best fit decreasing). One that finds no hole stays cold for that
// generation (fragmentation with unequal sizes; counted in `unplaced`). Because entering
// samples are written only into holes, the bytes a reload writes never overlap a kept
// sample: the fence (common/rotation.h) only has to wait for readers of *leaving* slots.
// Every daemon computes every node's layouts from the same inputs, so a peer still needs
// no lookup message.
// Thread-safety: immutable values; the functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/catalog.h"
#include "common/placement.h"

namespace shardmix {

struct ArenaLayout {
  std::uint32_t node = 0;
  std::uint64_t generation = 0;
  std::uint64_t arena_bytes = 0;          // the arena's size (the same for every generation)
  std::vector<SampleId> resident;         // ascending ids
  std::vector<std::uint64_t> offset;      // offset[i] of resident[i]
  // Samples that entered in this generation, (sample, offset), ascending ids: what a
  // reload writes. Empty for generation 0 (the initial load writes everything).
  std::vector<std::pair<SampleId, std::uint64_t>> entering;
  std::uint64_t unplaced = 0;             // chosen for this generation but found no hole

  // Offset of `id` in this layout, or nullopt if it is not resident.
  std::optional<std::uint64_t> offset_of(SampleId id) const;
};

// The arena size for a node under rotation: room for the cache.capacity (at most the whole
// owned share, aligned), at least the static layout's size.
std::uint64_t rotating_arena_bytes(const std::vector<std::uint64_t>& sizes, const Placement& placement,
                                   std::uint32_t node, std::uint64_t capacity);

// Generation 0: the placement's own layout for `node`, in an arena of `arena_bytes`.
ArenaLayout initial_arena_layout(const Placement& placement, std::uint32_t node, std::uint64_t arena_bytes);

// Generation current.generation + 1: `wanted` (ascending ids, e.g. choose_resident for
// that generation) laid out by keeping current offsets and filling holes best fit.
ArenaLayout next_arena_layout(const ArenaLayout& current, const std::vector<std::uint64_t>& sizes,
                              const std::vector<SampleId>& wanted);

}  // namespace shardmix
