#include "common/ownership.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/status.h"

namespace shardmix {
namespace {

// The spread layout's stream (distinct from the planner's small stream ids and from the
// residency stream in placement.cc).
constexpr std::uint64_t kStreamSpread = 0x737072656164ull;  // "spread"

}  // namespace

Ownership Ownership::listed(const std::vector<std::vector<SampleId>>& owned, const std::vector<std::uint32_t>& owner) {
  Ownership o;
  o.owned_ = &owned;
  o.owner_ = &owner;
  return o;
}

Ownership Ownership::spread(std::uint64_t num_samples, const std::vector<std::uint64_t>& node_owned,
                            std::uint64_t seed) {
  Ownership o;
  o.first_.assign(node_owned.size() + 1, 0);
  for (std::size_t k = 0; k < node_owned.size(); ++k) o.first_[k + 1] = o.first_[k] + node_owned[k];
  // The shape is computed from N by make_plan_shape, so a mismatch is a bug of ours.
  if (o.first_.back() != num_samples) {
    invariant_failed("Ownership::spread: the nodes own {} samples of {}", o.first_.back(), num_samples);
  }
  o.layout_ = Permutation::for_stream(num_samples, seed, {kStreamSpread});
  return o;
}

std::uint32_t Ownership::owner(SampleId id) const {
  return is_spread() ? locate(id).node : (*owner_)[id];
}

Ownership::Share Ownership::locate(SampleId id) const {
  if (!is_spread()) invariant_failed("Ownership::locate needs dataset.placement = spread");
  // The permutation's cycle walk is undefined past its range (it can loop for ever): a bug
  // in the caller, stopped with its name rather than a hang.
  if (id >= layout_.size()) {
    invariant_failed(fmt::format("Ownership::locate: sample id {} of a dataset of {} samples", id, layout_.size()));
  }
  const std::uint64_t position = layout_(id);
  // The last node whose range starts at or before `position` (empty ranges are skipped).
  const auto node = static_cast<std::uint32_t>(std::upper_bound(first_.begin(), first_.end(), position) -
                                               first_.begin() - 1);
  return Share{node, position - first_[node]};
}

std::uint64_t Ownership::memory_bytes() const {
  return sizeof(*this) + first_.capacity() * sizeof(std::uint64_t);
}

}  // namespace shardmix
