#include "common/placement.h"

#include <algorithm>
#include <numeric>
#include <queue>

#include <fmt/format.h>

#include "common/ownership.h"
#include "common/rng.h"
#include "common/status.h"

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
  // up class-sorted by accident (ids are sorted by label). The keys are sorted as one
  // contiguous array rather than ids through a comparator that looks sizes and ties up:
  // the same order, without two cache misses per comparison (at 10 M samples the sort
  // went from about 25 s to a few seconds; the daemons' start-up and the simulator pay it).
  struct Key {
    std::uint64_t size;
    std::uint64_t tie;
    SampleId id;
  };
  std::vector<Key> keys(n);
  for (std::size_t i = 0; i < n; ++i) {
    keys[i] = Key{sizes[i], mix_seed(seed, {0x706c6163ull, i}), static_cast<SampleId>(i)};
  }
  std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    if (a.size != b.size) return a.size > b.size;
    return a.tie < b.tie;
  });
  // Min-heap of (bytes so far, node) over nodes that still have room.
  using Slot = std::pair<std::uint64_t, std::uint32_t>;
  std::priority_queue<Slot, std::vector<Slot>, std::greater<>> lightest;
  std::vector<std::uint64_t> room(shape.node_owned);
  for (std::uint32_t k = 0; k < shape.job.nodes; ++k) {
    if (room[k] > 0) lightest.emplace(0, k);
  }
  std::vector<std::uint32_t> owner(n);
  for (const Key& key : keys) {
    auto [bytes, k] = lightest.top();
    lightest.pop();
    owner[key.id] = k;
    if (--room[k] > 0) lightest.emplace(bytes + key.size, k);
  }
  return owner;
}

// The owner of every sample under spread ownership (ownership.h): the function, tabulated.
std::vector<std::uint32_t> place_spread(std::size_t n, const PlanShape& shape, std::uint64_t seed) {
  const Ownership spread = Ownership::spread(n, shape.node_owned, seed);
  std::vector<std::uint32_t> owner(n);
  for (std::uint32_t k = 0; k < shape.job.nodes; ++k) {
    for (std::uint64_t i = 0; i < shape.node_owned[k]; ++i) owner[spread.owned_at(k, i)] = k;
  }
  return owner;
}

// Stream id of the residency choice (distinct from the planner's streams 1..3).
constexpr std::uint64_t kStreamResident = 0x7265736964656e74ull;  // "resident"

}  // namespace

Ownership ownership_of(const Placement& placement) {
  if (placement.policy != PlacementPolicy::kSpread) return Ownership::listed(placement.owned, placement.owner);
  std::vector<std::uint64_t> counts(placement.owned.size());
  for (std::size_t k = 0; k < counts.size(); ++k) counts[k] = placement.owned[k].size();
  return Ownership::spread(placement.owner.size(), counts, placement.seed);
}

std::uint64_t Placement::total_cold_samples() const {
  std::uint64_t total = 0;
  for (std::uint64_t c : cold_samples) total += c;
  return total;
}

std::vector<std::uint64_t> choose_resident_positions(std::span<const std::uint64_t> owned_sizes,
                                                     std::uint64_t capacity, std::uint64_t seed, std::uint32_t node,
                                                     std::uint64_t generation) {
  std::vector<std::uint64_t> positions(owned_sizes.size());
  std::iota(positions.begin(), positions.end(), std::uint64_t{0});
  std::uint64_t needed = 0;
  for (std::uint64_t bytes : owned_sizes) {
    needed += align_to_arena(bytes);
    if (needed > capacity) break;
  }
  if (needed <= capacity) return positions;  // everything fits: no randomness spent
  // Random, not by id: ids are sorted by label, so a prefix would make the resident set
  // (and with it what stays local at low exchange_fraction) class-sorted.
  // Generation 0 keeps the static tier's stream, so a job without rotation is unchanged.
  Rng rng = generation == 0 ? Rng::for_stream(seed, {kStreamResident, node})
                            : Rng::for_stream(seed, {kStreamResident, node, generation});
  shuffle(std::span<std::uint64_t>(positions), rng);
  std::vector<std::uint64_t> resident;
  std::uint64_t used = 0;
  for (std::uint64_t position : positions) {
    const std::uint64_t bytes = align_to_arena(owned_sizes[position]);
    if (bytes > capacity - used) continue;  // first fit: a smaller one later may still fit
    used += bytes;
    resident.push_back(position);
  }
  std::sort(resident.begin(), resident.end());
  return resident;
}

std::vector<SampleId> choose_resident(const std::vector<std::uint64_t>& sizes, const std::vector<SampleId>& owned,
                                      std::uint64_t capacity, std::uint64_t seed, std::uint32_t node,
                                      std::uint64_t generation) {
  std::vector<std::uint64_t> owned_sizes(owned.size());
  for (std::size_t i = 0; i < owned.size(); ++i) owned_sizes[i] = sizes[owned[i]];
  const std::vector<std::uint64_t> positions = choose_resident_positions(owned_sizes, capacity, seed, node, generation);
  std::vector<SampleId> resident(positions.size());
  for (std::size_t i = 0; i < positions.size(); ++i) resident[i] = owned[positions[i]];
  return resident;
}

Placement make_placement(const std::vector<std::uint64_t>& sizes, const PlanShape& shape,
                         PlacementPolicy policy, std::uint64_t seed, std::uint64_t capacity_bytes) {
  return make_placement(sizes, shape, policy, seed, std::vector<std::uint64_t>(shape.job.nodes, capacity_bytes));
}

Placement make_placement(const std::vector<std::uint64_t>& sizes, const PlanShape& shape,
                         PlacementPolicy policy, std::uint64_t seed,
                         const std::vector<std::uint64_t>& node_capacity_bytes) {
  // The callers build the vector from the job's own ranks (an allgather, or one value
  // repeated), so a mismatch is a bug of ours, not input (decision 0046).
  if (node_capacity_bytes.size() != shape.job.nodes) {
    invariant_failed("make_placement: {} node capacities for {} nodes", node_capacity_bytes.size(), shape.job.nodes);
  }
  Placement p;
  p.policy = policy;
  p.seed = seed;
  switch (policy) {
    case PlacementPolicy::kSorted: p.owner = place_sorted(sizes.size(), shape); break;
    case PlacementPolicy::kBalanced: p.owner = place_balanced(sizes, shape, seed); break;
    case PlacementPolicy::kSpread: p.owner = place_spread(sizes.size(), shape, seed); break;
  }
  const std::uint32_t nodes = shape.job.nodes;
  p.owned.assign(nodes, {});
  for (std::uint32_t k = 0; k < nodes; ++k) p.owned[k].reserve(shape.node_owned[k]);
  p.sample_bytes.assign(nodes, 0);
  for (SampleId id = 0; id < sizes.size(); ++id) {
    const std::uint32_t k = p.owner[id];
    p.owned[k].push_back(id);
    p.sample_bytes[k] += sizes[id];
  }
  p.arena_offset.assign(sizes.size(), kNotResident);
  p.resident.assign(sizes.size(), 0);
  p.arena_bytes.assign(nodes, 0);
  p.cached.assign(nodes, {});
  p.cached_bytes.assign(nodes, 0);
  p.cold_samples.assign(nodes, 0);
  p.cold_bytes.assign(nodes, 0);
  for (std::uint32_t k = 0; k < nodes; ++k) {
    p.cached[k] = choose_resident(sizes, p.owned[k], node_capacity_bytes[k], seed, k);
    for (SampleId id : p.cached[k]) {
      p.resident[id] = 1;
      p.arena_offset[id] = p.arena_bytes[k];
      p.arena_bytes[k] = align_to_arena(p.arena_bytes[k] + sizes[id]);
      p.cached_bytes[k] += sizes[id];
    }
    p.cold_samples[k] = p.owned[k].size() - p.cached[k].size();
    p.cold_bytes[k] = p.sample_bytes[k] - p.cached_bytes[k];
  }
  return p;
}

void make_cold(Placement& placement, SampleId id, std::uint64_t bytes) {
  if (!placement.is_resident(id)) return;
  const std::uint32_t node = placement.owner[id];
  auto& cached = placement.cached[node];
  cached.erase(std::lower_bound(cached.begin(), cached.end(), id));  // ascending ids
  placement.resident[id] = 0;
  placement.arena_offset[id] = kNotResident;
  placement.cached_bytes[node] -= bytes;
  ++placement.cold_samples[node];
  placement.cold_bytes[node] += bytes;
}

}  // namespace shardmix
