// Slot reuse within an epoch (cache.reuse_rounds, docs/decisions/0035): the generation
// clock that cache rotation (0033) and reuse rounds share, and the next-use policy that
// picks what each node's arena holds in every round.
//
// A *generation* is the unit of the rotation fence (common/rotation.h): every daemon retires
// generation g of every node once one of its schedulers stages a batch of generation g+1.
//  - cache.rotation_epochs = K: g = epoch / K (0033).
//  - cache.reuse_rounds = R: every epoch is split into R rounds by batch number (every
//    trainer has the same number of batches per epoch, 0005), g = epoch * R + round.
// The policy for reuse rounds counts storage reads, and a reload's read of a sample is one
// too: loading a sample into a freed slot pays only if the sample then *stays* until a later
// use that would otherwise be read again. Each epoch every sample is used once, so what a
// slot can buy is the interval between two uses of one sample: holding a sample from one
// use to the next costs the slot for that gap and saves one read. The fewest reads come
// from holding the shortest gaps first (a sample used late in epoch e and early in e + 1
// costs a fraction of an epoch per saved read; the static set pays a whole epoch for
// each). So at generation t = (e, r) each node ranks its owned samples:
//  - in its arena, with a use in rounds t - 1 .. t + kReuseLookaheadRounds: first (rank 0).
//    The interval ends now: it was paid for, the hit must not be lost. t - 1 is a round of
//    slack for trainers that lag behind the one that moved the clock;
//  - in its arena otherwise: by the gap of the interval it is in (next use - previous use);
//  - not in its arena, with a use in rounds t + 1 .. t + kReuseLookaheadRounds: by the gap
//    from that use to the following one. Loading it replaces the read that use needs
//    anyway (moved off the trainer's path into the reload, DeepIO's double buffering: what
//    round t + 2 needs is loaded during round t + 1 at the latest), and it then holds its
//    slot for that gap. Never for round t, which has begun: the trainer's daemon may
//    already be reading it, and a load would read it twice;
//  - anything else: not a candidate (a load for a far use would be an extra read);
// and keeps the smallest ranks, first fit. A chosen interval keeps its rank while it lasts,
// so it stays chosen as long as shorter ones do not crowd it out. This is the offline
// optimum's shape (NoPFS's clairvoyant placement ranks by how soon and how often a sample
// is needed again; here every sample is needed once an epoch, so "how soon" is the gap)
// applied at round granularity, online from the known plans.
// Only the hit rate depends on this policy: which bytes may be read is decided by the
// fence and the pins alone, so a plan the policy mispredicts (the opportunistic window, a
// re-dealt resumed plan, a trainer far behind) costs storage reads, never wrong bytes.
// Every daemon computes every node's choice from the same inputs (plans are pure, the
// capacities were allgathered, layouts chain one generation at a time), so offsets agree.
// Thread-safety: values and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/arena_layout.h"
#include "common/catalog.h"
#include "common/epoch_plan.h"

namespace shardmix {

struct GenerationClock {
  std::uint32_t rotation_epochs = 0;  // cache.rotation_epochs (0 = not by epochs)
  std::uint32_t rounds = 0;           // cache.reuse_rounds, at most batches_per_trainer (0 = off)
  std::uint64_t batches_per_trainer = 0;

  // rounds is clamped to batches_per_trainer (a round without a batch would be a fence
  // round trip for nothing). rotation_epochs and rounds are exclusive (config validation).
  static GenerationClock make(std::uint32_t rotation_epochs, std::uint32_t reuse_rounds,
                              std::uint64_t batches_per_trainer);

  bool enabled() const { return rotation_epochs > 0 || rounds > 0; }
  // The generation of batch `batch` (0-based, of the epoch, not of a resumed pass) of `epoch`.
  std::uint64_t generation(std::uint64_t epoch, std::uint64_t batch) const;
  // Reuse rounds: the round of batch `batch` of an epoch.
  std::uint32_t round_of_batch(std::uint64_t batch) const;
};

// Per sample, the round of `epoch` in which a trainer consumes it (by the plan), or
// kNotConsumed (batch.drop_last left it out). `plans`: every trainer's plan of the epoch
// (EpochPlanner::plan_all).
inline constexpr std::uint32_t kNotConsumed = std::numeric_limits<std::uint32_t>::max();
std::vector<std::uint32_t> consumption_rounds(const std::vector<TrainerPlan>& plans, std::uint64_t num_samples,
                                              const GenerationClock& clock);

// Rounds ahead in which a sample not in the arena may be loaded for its use (see above).
inline constexpr std::uint64_t kReuseLookaheadRounds = 2;
// Share of the arena the admitted intervals may fill on average (see choose_by_next_use).
inline constexpr double kReuseFillTarget = 0.9;

// consumption_rounds of four consecutive epochs around a generation's epoch e: e - 1 (null
// when e = 0; for the previous use of a sample), e, e + 1 and e + 2 (a lookahead late in an
// epoch reaches into the next one, and the following use into the one after that).
using KnownRounds = std::array<const std::vector<std::uint32_t>*, 4>;

// The samples node `current.node` wants resident in generation `generation` (reuse rounds;
// ascending ids): its `owned` samples ranked as described above (ties: already resident
// first, then a seeded order that does not depend on the generation, so ties do not churn),
// first fit under `capacity` aligned bytes. `known[j]`: consumption_rounds of epoch
// generation / clock.rounds - 1 + j. Which of them find a hole is next_arena_layout's business.
std::vector<SampleId> choose_by_next_use(const std::vector<std::uint64_t>& sizes, const std::vector<SampleId>& owned,
                                         std::uint64_t capacity, const ArenaLayout& current,
                                         const KnownRounds& known, const GenerationClock& clock,
                                         std::uint64_t generation, std::uint64_t seed);

}  // namespace shardmix
