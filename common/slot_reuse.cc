#include "common/slot_reuse.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "common/placement.h"
#include "common/rng.h"

namespace shardmix {

GenerationClock GenerationClock::make(std::uint32_t rotation_epochs, std::uint32_t reuse_rounds,
                                      std::uint64_t batches_per_trainer) {
  GenerationClock clock;
  clock.rotation_epochs = rotation_epochs;
  clock.batches_per_trainer = batches_per_trainer;
  clock.rounds = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(reuse_rounds, std::max<std::uint64_t>(batches_per_trainer, 1)));
  return clock;
}

std::uint32_t GenerationClock::round_of_batch(std::uint64_t batch) const {
  if (rounds == 0 || batches_per_trainer == 0) return 0;
  const std::uint64_t r = batch * rounds / batches_per_trainer;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(r, rounds - 1));
}

std::uint64_t GenerationClock::generation(std::uint64_t epoch, std::uint64_t batch) const {
  if (rounds > 0) return epoch * rounds + round_of_batch(batch);
  return residency_generation(epoch, rotation_epochs);
}

std::vector<std::uint32_t> consumption_rounds(const std::vector<TrainerPlan>& plans, std::uint64_t num_samples,
                                              const GenerationClock& clock) {
  std::vector<std::uint32_t> round(num_samples, kNotConsumed);
  for (const TrainerPlan& plan : plans) {
    for (std::uint64_t b = 0; b < plan.num_batches(); ++b) {
      const std::uint32_t r = clock.round_of_batch(b);
      for (std::uint64_t i = plan.batch_begin[b]; i < plan.batch_begin[b + 1]; ++i) round[plan.order[i]] = r;
    }
  }
  return round;
}

std::vector<SampleId> choose_by_next_use(const std::vector<std::uint64_t>& sizes, const std::vector<SampleId>& owned,
                                         std::uint64_t capacity, const ArenaLayout& current, const KnownRounds& known,
                                         const GenerationClock& clock, std::uint64_t generation, std::uint64_t seed) {
  // A share that fits stays whole: nothing to reuse, nothing to reload.
  std::uint64_t owned_bytes = 0;
  for (SampleId id : owned) owned_bytes += align_to_arena(sizes[id]);
  if (owned_bytes <= capacity) return owned;
  const std::uint64_t rounds = std::max<std::uint32_t>(clock.rounds, 1);
  const std::uint64_t epoch = generation / rounds;
  constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
  // Time of a use: generation units (epoch * rounds + round). known[j] is epoch e - 1 + j.
  auto use_in = [&](SampleId id, std::size_t j) -> std::optional<std::uint64_t> {
    if (known[j] == nullptr || (j == 0 && epoch == 0)) return std::nullopt;
    const std::uint32_t r = (*known[j])[id];
    if (r == kNotConsumed) return std::nullopt;
    return (epoch + j - 1) * rounds + r;
  };
  auto next_use = [&](SampleId id, std::uint64_t from) {
    for (std::size_t j = 0; j < known.size(); ++j) {
      if (auto at = use_in(id, j); at && *at >= from) return *at;
    }
    return kNever;
  };
  auto previous_use = [&](SampleId id, std::uint64_t before) -> std::uint64_t {
    for (std::size_t j = known.size(); j-- > 0;) {
      if (auto at = use_in(id, j); at && *at < before) return *at;
    }
    return 0;  // resident since the initial load
  };
  const std::uint64_t now = generation == 0 ? 0 : generation - 1;  // the slack round counts as now
  // The longest gap worth holding: the intervals that start in this epoch (one per sample,
  // from its use in epoch e to its use in e + 1), shortest first, while the slot-rounds they
  // need (the gap, the lookahead before it, the slack round after) fit in the arena on
  // average over an epoch, with kReuseFillTarget of it to absorb the rounds above average.
  // Without this bound every load is admitted while there is room and longer intervals are
  // later evicted half-way, which measured no better than the static set.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> intervals;  // (gap, aligned bytes)
  intervals.reserve(owned.size());
  for (SampleId id : owned) {
    const auto first = use_in(id, 1);
    if (!first) continue;
    const std::uint64_t following = next_use(id, *first + 1);
    if (following != kNever) intervals.emplace_back(following - *first, align_to_arena(sizes[id]));
  }
  std::sort(intervals.begin(), intervals.end());
  const double budget = kReuseFillTarget * static_cast<double>(capacity) * static_cast<double>(rounds);
  double spent = 0;
  std::uint64_t longest_gap = 0;
  for (const auto& [gap, bytes] : intervals) {
    spent += static_cast<double>((gap + kReuseLookaheadRounds + 1) * bytes);
    if (spent > budget) break;
    longest_gap = gap;
  }
  // (rank, 0 if resident now else 1, seeded tie-break, id): smallest first.
  std::vector<std::tuple<std::uint64_t, int, std::uint64_t, SampleId>> ranked;
  ranked.reserve(owned.size());
  for (SampleId id : owned) {
    std::uint64_t rank = kNever;
    const bool resident = current.offset_of(id).has_value();
    if (resident) {
      const std::uint64_t use = next_use(id, now);
      if (use <= generation + kReuseLookaheadRounds) {
        rank = 0;
      } else if (use != kNever && use - previous_use(id, now) <= longest_gap) {
        rank = use - previous_use(id, now);
      }
    } else {
      const std::uint64_t use = next_use(id, generation + 1);
      if (use <= generation + kReuseLookaheadRounds) {
        const std::uint64_t following = next_use(id, use + 1);
        if (following != kNever && following - use <= longest_gap) rank = following - use;
      }
    }
    if (rank == kNever) continue;  // not worth a slot (see the header)
    ranked.emplace_back(rank, resident ? 0 : 1, mix_seed(seed, {0x72657573ull, current.node, id}), id);
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<SampleId> chosen;
  std::uint64_t used = 0;
  for (const auto& entry : ranked) {
    const SampleId id = std::get<3>(entry);
    const std::uint64_t bytes = align_to_arena(sizes[id]);
    if (used + bytes > capacity) continue;  // first fit: a smaller, later-ranked sample may still fit
    used += bytes;
    chosen.push_back(id);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

}  // namespace shardmix
