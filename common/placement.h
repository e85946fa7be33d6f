// Placement: which node caches which sample, and where in that node's cache arena.
// A pure function of the catalog, the plan shape and the config: every daemon computes
// the same placement, so a peer's sample address needs no lookup message.
//
// Node n caches exactly shape.node_owned[n] samples, so that at exchange_fraction 0 each
// node's trainers can be fed from local RAM alone with equal batch counts.
//  - balanced (default): largest samples first, each to the node with the fewest bytes
//    among nodes that still have room; nodes end up within about one sample's size of
//    each other in bytes while the counts stay exact.
//  - spread: a seeded pseudo-random share of exactly node_owned[k] samples, a function of
//    the id alone (ownership.h; what owner-side metadata needs, decision 0055). Here it is
//    tabulated into the same vectors as the other policies.
//  - sorted: contiguous runs of sample ids (ids are sorted by label, then path), i.e.
//    class-sorted shards: the worst case for local shuffles, for studies.
//
// Residency (the storage tier, docs/decisions/0015): when a node's share does not fit its
// cache capacity, only a *resident* subset of its owned samples is in its arena; the rest
// are *cold*: cached nowhere, read from storage by whichever daemon's trainer needs them.
// Ownership (which node's trainers keep a sample at exchange_fraction < 1) does not depend
// on the capacity, so the epoch plan is the same with or without a storage tier. Which
// owned samples are resident is choose_resident(): a seeded-random order (never by id,
// which is class-sorted), first fit, so every cold sample is larger than the room left.
// The arena holds the resident samples only, at aligned offsets in ascending id order;
// every daemon computes every node's layout, so peers still need no lookup message.
// Thread-safety: immutable value after make_placement; the functions are pure.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/catalog.h"
#include "common/config.h"
#include "common/epoch_plan.h"
#include "common/ownership.h"

namespace shardmix {

// Samples start at multiples of this in the arena (cache-line aligned copies and reads).
inline constexpr std::uint64_t kArenaAlignment = 64;

// Rounds a byte count up to kArenaAlignment: the space a sample takes in an arena or in
// a staging slot.
constexpr std::uint64_t align_to_arena(std::uint64_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

// A capacity that never limits (cache.capacity = 0 means "no limit beyond RAM").
inline constexpr std::uint64_t kNoCapacityLimit = ~std::uint64_t{0};
// arena_offset of a cold sample (in no arena): never a valid offset.
inline constexpr std::uint64_t kNotResident = ~std::uint64_t{0};

struct Placement {
  PlacementPolicy policy = PlacementPolicy::kBalanced;  // how `owner` was chosen
  std::uint64_t seed = 0;                               // the seed it was chosen with
  std::vector<std::uint32_t> owner;          // sample -> node
  std::vector<std::uint64_t> arena_offset;   // sample -> offset in its owner's arena; kNotResident if cold
  std::vector<std::vector<SampleId>> owned;  // node -> its samples, ascending ids
  std::vector<std::uint64_t> arena_bytes;    // node -> arena size (aligned sum of its resident samples)
  std::vector<std::uint64_t> sample_bytes;   // node -> sum of its owned samples' sizes
  std::vector<std::uint8_t> resident;        // sample -> 1 if in its owner's arena, 0 if cold
  std::vector<std::vector<SampleId>> cached; // node -> its resident samples, ascending ids
  std::vector<std::uint64_t> cached_bytes;   // node -> sum of its resident samples' sizes
  std::vector<std::uint64_t> cold_samples;   // node -> owned samples that are not resident
  std::vector<std::uint64_t> cold_bytes;     // node -> their bytes

  bool is_resident(SampleId id) const { return resident[id] != 0; }
  std::uint64_t total_cold_samples() const;
};

// Sample `id` (of `bytes` bytes) stays owned by its node but leaves the node's arena: it is
// cold from now on, read from storage whenever a trainer needs it. For a resident sample
// whose bytes could not be loaded (S3: its object was deleted since the listing); every
// daemon applies the same calls, so their placements stay identical. Its arena slot stays
// allocated and unused. A sample that is already cold is left as it is.
void make_cold(Placement& placement, SampleId id, std::uint64_t bytes);

// The ownership the epoch planner reads: the placement's lists (balanced, sorted; they
// must outlive the result) or, for spread, the function itself, whose order of each
// node's share (rho order) is what plans are made of, so that a planner built from a
// tabulated placement and one built from the function alone plan the same epochs.
Ownership ownership_of(const Placement& placement);

// The resident subset of one node's `owned` samples (ascending ids) for an arena of
// `capacity` bytes: the owned samples in a seeded-random order (stream {seed, node}), each
// taken if its aligned size still fits (first fit), returned in ascending id order. Zero-byte
// samples always fit. Deterministic: a pure function of its arguments.
// `generation` (cache rotation, docs/decisions/0033): generation 0 is the static choice
// above (stream {seed, node}); generation g > 0 draws its order from stream {seed, node, g},
// so every generation is an independent random subset. When everything fits, every
// generation is the whole share: rotation is then a no-op.
std::vector<SampleId> choose_resident(const std::vector<std::uint64_t>& sizes, const std::vector<SampleId>& owned,
                                      std::uint64_t capacity, std::uint64_t seed, std::uint32_t node,
                                      std::uint64_t generation = 0);

// The same choice over one node's share given as the sizes of its samples in ascending id
// order: the positions (indices into `owned_sizes`) of the resident samples, ascending.
// choose_resident is this applied to the share's sizes (the owner-side directory calls it
// on its own entries, decision 0055).
std::vector<std::uint64_t> choose_resident_positions(std::span<const std::uint64_t> owned_sizes,
                                                     std::uint64_t capacity, std::uint64_t seed, std::uint32_t node,
                                                     std::uint64_t generation = 0);

// The residency generation of `epoch` under cache.rotation_epochs = `rotation_epochs`
// (0 = static: always generation 0): epoch / rotation_epochs.
constexpr std::uint64_t residency_generation(std::uint64_t epoch, std::uint32_t rotation_epochs) {
  return rotation_epochs == 0 ? 0 : epoch / rotation_epochs;
}

// `node_capacity_bytes[k]`: node k's own arena limit (kNoCapacityLimit = all its owned
// samples resident, the layout of a dataset that fits in RAM). One entry per node, and it is
// per node on purpose: cache.capacity may be a fraction of each node's RAM, so nodes with
// different RAM have different limits. Every daemon must pass the same vector (the daemon
// allgathers it at start-up), or peers would read offsets the owner laid out differently.
Placement make_placement(const std::vector<std::uint64_t>& sizes, const PlanShape& shape,
                         PlacementPolicy policy, std::uint64_t seed,
                         const std::vector<std::uint64_t>& node_capacity_bytes);

// The same limit on every node (tests, resume's old-shape placement).
Placement make_placement(const std::vector<std::uint64_t>& sizes, const PlanShape& shape,
                         PlacementPolicy policy, std::uint64_t seed,
                         std::uint64_t capacity_bytes = kNoCapacityLimit);

}  // namespace shardmix
