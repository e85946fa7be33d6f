// Cache rotation (docs/decisions/0033): per-generation residency and delta layouts, and the
// fence, in an in-process cluster: several nodes' real TrainerSchedulers, ResidencyTables
// and RotationCoordinators, with fake arenas, fabric, storage, MPI messages and reloads
// whose every step happens in an order rapidcheck picks. Invariants: every byte a trainer
// sees equals its sample's file bytes, each pass delivers its plan exactly once, and no
// reload ever writes a slot that a posted read or a held batch can still touch.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "common/arena_layout.h"
#include "common/catalog.h"
#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/rng.h"
#include "common/rotation.h"
#include "common/slot_reuse.h"
#include "common/staging_allocator.h"
#include "common/trainer_scheduler.h"
#include "tests/unit/plan_support.h"
#include "tests/unit/scheduler_world.h"

namespace shardmix {
namespace rotation_test {

// The "file" bytes of a sample: a function of (sample, index), so any misplaced byte shows.
std::uint8_t file_byte(SampleId id, std::uint64_t i) {
  return static_cast<std::uint8_t>(mix_seed(0x66696c65ull, {id, i / 8}) >> (8 * (i % 8)));
}

void write_sample(std::vector<std::uint8_t>& into, std::uint64_t offset, SampleId id, std::uint64_t length) {
  for (std::uint64_t i = 0; i < length; ++i) into[offset + i] = file_byte(id, i);
}

bool holds_sample(const std::vector<std::uint8_t>& from, std::uint64_t offset, SampleId id, std::uint64_t length) {
  if (offset + length > from.size()) return false;
  for (std::uint64_t i = 0; i < length; ++i) {
    if (from[offset + i] != file_byte(id, i)) return false;
  }
  return true;
}

using test_support::random_sizes;

// --- Residency per generation and delta layouts --------------------------------------

TEST(RotationResidencyTest, GenerationZeroIsTheStaticChoice) {
  const auto sizes = random_sizes(3, 300);
  std::vector<SampleId> owned(300);
  for (SampleId i = 0; i < 300; ++i) owned[i] = i;
  EXPECT_EQ(choose_resident(sizes, owned, 40'000, 9, 2), choose_resident(sizes, owned, 40'000, 9, 2, 0));
  EXPECT_NE(choose_resident(sizes, owned, 40'000, 9, 2, 0), choose_resident(sizes, owned, 40'000, 9, 2, 1));
  EXPECT_NE(choose_resident(sizes, owned, 40'000, 9, 2, 1), choose_resident(sizes, owned, 40'000, 9, 2, 2));
}

RC_GTEST_PROP(RotationResidencyTest, DeltaLayoutKeepsOffsetsAndNeverOverlaps, ()) {
  const auto n = *rc::gen::inRange<std::size_t>(1, 300);
  const auto sizes = random_sizes(*rc::gen::arbitrary<std::uint64_t>(), n);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  const double share = *rc::gen::inRange(5, 130) / 100.0;
  const std::uint32_t generations = *rc::gen::inRange(1, 6);
  const PlanShape shape = make_plan_shape(n, JobShape{1, 1, 1, false});
  std::uint64_t total = 0;
  for (auto s : sizes) total += align_to_arena(s);
  const auto capacity = static_cast<std::uint64_t>(share * static_cast<double>(total));
  const Placement placement = make_placement(sizes, shape, PlacementPolicy::kBalanced, seed, capacity);
  const std::uint64_t arena = rotating_arena_bytes(sizes, placement, 0, capacity);
  ArenaLayout layout = initial_arena_layout(placement, 0, arena);
  for (std::uint32_t g = 1; g <= generations; ++g) {
    const auto wanted = choose_resident(sizes, placement.owned[0], capacity, seed, 0, g);
    const ArenaLayout next = next_arena_layout(layout, sizes, wanted);
    RC_ASSERT(next.generation == g);
    RC_ASSERT(std::is_sorted(next.resident.begin(), next.resident.end()));
    RC_ASSERT(next.resident.size() + next.unplaced == wanted.size());
    // Slots never overlap and lie inside the arena.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> extents;
    for (std::size_t i = 0; i < next.resident.size(); ++i) {
      extents.emplace_back(next.offset[i], next.offset[i] + align_to_arena(sizes[next.resident[i]]));
    }
    std::sort(extents.begin(), extents.end());
    for (std::size_t i = 0; i < extents.size(); ++i) {
      RC_ASSERT(extents[i].second <= arena);
      if (i > 0) RC_ASSERT(extents[i - 1].second <= extents[i].first);
    }
    // A sample in both generations keeps its offset; only entering samples are written, and
    // never over a kept one.
    std::set<SampleId> entering;
    for (const auto& [id, at] : next.entering) {
      entering.insert(id);
      RC_ASSERT(!layout.offset_of(id).has_value());
      RC_ASSERT(next.offset_of(id) == std::optional<std::uint64_t>(at));
    }
    for (SampleId id : next.resident) {
      if (!entering.count(id)) RC_ASSERT(layout.offset_of(id) == next.offset_of(id));
    }
    if (share >= 1.0) RC_ASSERT(next.entering.empty() && next.resident == layout.resident);  // no-op at full capacity
    layout = next;
  }
}

// --- The fence in an in-process cluster ----------------------------------------------

struct Message {
  enum Kind { kDone, kReadable } kind;
  std::uint32_t from;
  std::uint32_t node;
  std::uint64_t generation;
};

using test_support::QueuedPeers;
using test_support::QueuedStorage;

struct Node {
  std::vector<std::uint8_t> arena;
  std::vector<std::uint8_t> staging;
  std::shared_ptr<StagingAllocator> allocator;
  QueuedPeers peers;
  QueuedStorage storage;
  test_support::RecordingSink sink;
  std::unique_ptr<ResidencyTable> table;
  std::unique_ptr<RotationCoordinator> coordinator;
  std::shared_ptr<TrainerScheduler> scheduler;
  std::deque<Message> inbox;
  std::deque<std::pair<SampleId, std::uint64_t>> reload;  // entering samples still to write
  bool reloading = false;
  // Trainer side.
  std::uint64_t stream = 0;
  std::uint64_t epoch = 0;
  std::size_t batches_seen = 0;  // sink.batches already taken in hand
  std::size_t ends_seen = 0;
  std::deque<proto::BatchFrame> held;
  std::vector<SampleId> got;  // this stream's samples
  bool restarted = false;
  bool finished = false;
};

struct Cluster {
  std::uint32_t nodes;
  std::uint32_t epochs;
  std::vector<std::uint64_t> sizes;
  Catalog catalog;
  PlanShape shape;
  Placement placement;
  std::unique_ptr<EpochPlanner> planner;
  std::unique_ptr<GlobalDirectory> directory;
  std::uint64_t capacity;
  std::uint64_t seed = 17;
  std::vector<std::unique_ptr<Node>> node;
  std::uint64_t storage_reads_total = 0;
  GenerationClock clock;
  std::map<std::uint64_t, std::vector<std::uint32_t>> consumption;  // reuse rounds: epoch -> round per sample

  const std::vector<std::uint32_t>& rounds_of(std::uint64_t epoch) {
    auto it = consumption.find(epoch);
    if (it == consumption.end()) {
      it = consumption.emplace(epoch, consumption_rounds(planner->plan_all(epoch), sizes.size(), clock)).first;
    }
    return it->second;
  }

  Cluster(std::uint32_t nodes_, std::uint32_t epochs_, std::size_t n, std::uint32_t batch, std::uint32_t prefetch,
          std::uint32_t window, std::uint32_t readahead, double share, std::uint32_t rotation_epochs,
          std::uint64_t sizes_seed, std::uint32_t reuse_rounds = 0)
      : nodes(nodes_), epochs(epochs_), sizes(random_sizes(sizes_seed, n)) {
    std::vector<CatalogEntry> entries;
    for (std::size_t i = 0; i < n; ++i) entries.push_back({fmt::format("s{}", i), sizes[i], static_cast<std::int32_t>(i % 5)});
    catalog = std::move(Catalog::from_entries(std::move(entries), {}).value());
    sizes = catalog.sizes();  // the catalog sorts by label, then path: ids are its own
    shape = make_plan_shape(n, JobShape{nodes, 1, batch, false});
    capacity = test_support::capacity_for_share(sizes, nodes, share);
    placement = make_placement(sizes, shape, PlacementPolicy::kBalanced, seed, capacity);
    ShuffleConfig shuffle;
    shuffle.seed = 5;
    planner = std::make_unique<EpochPlanner>(shape, placement, shuffle);
    directory = std::make_unique<GlobalDirectory>(catalog, placement);
    clock = GenerationClock::make(rotation_epochs, reuse_rounds, shape.batches_per_trainer);
    std::vector<ArenaLayout> initial;
    for (std::uint32_t k = 0; k < nodes; ++k) {
      initial.push_back(initial_arena_layout(placement, k, rotating_arena_bytes(sizes, placement, k, capacity)));
    }
    for (std::uint32_t k = 0; k < nodes; ++k) {
      auto nd = std::make_unique<Node>();
      nd->arena.assign(initial[k].arena_bytes, 0xEE);
      for (std::size_t i = 0; i < initial[k].resident.size(); ++i) {
        write_sample(nd->arena, initial[k].offset[i], initial[k].resident[i], sizes[initial[k].resident[i]]);
      }
      nd->table = std::make_unique<ResidencyTable>(initial, clock);
      node.push_back(std::move(nd));
    }
    for (std::uint32_t k = 0; k < nodes; ++k) {
      Node& nd = *node[k];
      RotationCoordinator::Hooks hooks;
      hooks.send_done = [this, k](std::uint32_t to, std::uint64_t g) {
        node[to]->inbox.push_back({Message::kDone, k, to, g});
      };
      hooks.announce_readable = [this, k](std::uint64_t g) {
        for (std::uint32_t j = 0; j < nodes; ++j) {
          if (j != k) node[j]->inbox.push_back({Message::kReadable, k, k, g});
        }
      };
      hooks.start_reload = [&nd](const ArenaLayout& layout) {
        nd.reload.assign(layout.entering.begin(), layout.entering.end());
        nd.reloading = true;
      };
      hooks.reload_finished = [&nd]() -> std::optional<Status> {
        if (!nd.reload.empty()) return std::nullopt;
        nd.reloading = false;
        return Status::ok_status();
      };
      hooks.wanted = [this](std::uint32_t owner, std::uint64_t g, const ArenaLayout& current) {
        if (clock.rounds == 0) return choose_resident(sizes, placement.owned[owner], capacity, seed, owner, g);
        const std::uint64_t epoch = g / clock.rounds;
        return choose_by_next_use(sizes, placement.owned[owner], current.arena_bytes, current,
                                  {epoch > 0 ? &rounds_of(epoch - 1) : nullptr, &rounds_of(epoch),
                                   &rounds_of(epoch + 1), &rounds_of(epoch + 2)},
                                  clock, g, seed);
      };
      nd.coordinator = std::make_unique<RotationCoordinator>(k, nodes, sizes, *nd.table, hooks);
      const std::uint64_t staging_bytes = 1 << 20;
      nd.staging.assign(staging_bytes, 0xDD);
      nd.allocator = std::make_shared<StagingAllocator>(0, staging_bytes);
      SchedulerContext context{directory.get(), planner.get(), k, prefetch, window, 5, &nd.storage, readahead};
      context.residency = nd.table.get();
      nd.scheduler = std::make_shared<TrainerScheduler>(context, 0, nd.allocator, nd.peers, nd.sink);
    }
  }

  // A posted, unlanded peer read or a held local sample overlapping node k's [begin, end).
  std::optional<std::string> reader_of(std::uint32_t k, std::uint64_t begin, std::uint64_t end) const {
    for (std::uint32_t j = 0; j < nodes; ++j) {
      for (const auto& group : node[j]->peers.pending) {
        for (const PeerRead& r : group.reads) {
          if (r.peer == k && r.remote_offset < end && begin < r.remote_offset + align_to_arena(r.length)) {
            return fmt::format("node {} has a read of node {}'s [{}, +{}) in flight", j, k, r.remote_offset, r.length);
          }
        }
      }
    }
    for (const auto& batch : node[k]->held) {
      for (const auto& d : batch.samples) {
        if (d.region == static_cast<std::uint8_t>(proto::Region::kArena) && d.offset < end &&
            begin < d.offset + align_to_arena(d.length)) {
          return fmt::format("node {}'s trainer holds sample {} at arena offset {}", k, d.sample_id, d.offset);
        }
      }
    }
    return std::nullopt;
  }

  // The trainer reads every byte of a batch it holds.
  void check_bytes(std::uint32_t k, const proto::BatchFrame& batch) const {
    for (const auto& d : batch.samples) {
      const bool arena = d.region == static_cast<std::uint8_t>(proto::Region::kArena);
      RC_ASSERT(d.length == sizes[d.sample_id]);
      if (!holds_sample(arena ? node[k]->arena : node[k]->staging, d.offset, d.sample_id, d.length)) {
        RC_FAIL(fmt::format("trainer of node {}: sample {} (tier {}, {} offset {}) has wrong bytes", k, d.sample_id,
                            d.tier, arena ? "arena" : "staging", d.offset));
      }
    }
  }

  void start(std::uint32_t k, std::uint64_t epoch) {
    Node& nd = *node[k];
    nd.epoch = epoch;
    ++nd.stream;
    nd.got.clear();
    nd.held.clear();  // a new pass releases the old one's batches implicitly
    nd.ends_seen = nd.sink.ends.size();
    nd.batches_seen = nd.sink.batches.size();
    nd.scheduler->start_epoch(epoch, nd.stream);
  }

  // The trainer's side of one step: take what arrived, release, or start the next pass.
  void trainer_step(std::uint32_t k, Rng& rng) {
    Node& nd = *node[k];
    if (nd.finished) return;
    RC_ASSERT(nd.sink.errors.empty());
    while (nd.batches_seen < nd.sink.batches.size()) {
      const proto::BatchFrame& b = nd.sink.batches[nd.batches_seen++];
      if (b.stream != nd.stream) continue;
      check_bytes(k, b);
      for (const auto& d : b.samples) nd.got.push_back(d.sample_id);
      nd.held.push_back(b);
    }
    if (!nd.held.empty() && rng.below(3) != 0) {
      const proto::BatchFrame b = nd.held.front();
      check_bytes(k, b);  // still intact just before release
      nd.held.pop_front();
      RC_ASSERT(nd.scheduler->release(b.stream, b.batch).ok());
      return;
    }
    if (!nd.restarted && nd.epoch > 0 && rng.below(40) == 0) {
      // A restarted pass over an older epoch, mid-rotation.
      nd.restarted = true;
      start(k, nd.epoch - 1);
      return;
    }
    if (nd.sink.ends.size() > nd.ends_seen && nd.held.empty()) {
      RC_ASSERT(nd.sink.ends.back().stream == nd.stream);
      // Exactly once: the pass delivered its plan's samples, each once.
      auto planned = planner->plan_node(nd.epoch, k)[0].order;
      auto got = nd.got;
      std::sort(planned.begin(), planned.end());
      std::sort(got.begin(), got.end());
      RC_ASSERT(got == planned);
      if (nd.epoch + 1 < epochs) {
        start(k, nd.epoch + 1);
      } else {
        nd.finished = true;
      }
    }
  }

  bool all_finished() const {
    return std::all_of(node.begin(), node.end(), [](const auto& nd) { return nd->finished; });
  }

  // One system step chosen by `rng`; false if the chosen kind had nothing to do.
  bool system_step(Rng& rng) {
    const std::uint32_t k = static_cast<std::uint32_t>(rng.below(nodes));
    Node& nd = *node[k];
    switch (rng.below(5)) {
      case 0: {  // a peer read lands: the bytes are copied *now*, as late as possible
        if (nd.peers.pending.empty()) return false;
        const std::size_t i = rng.below(nd.peers.pending.size());
        auto call = std::move(nd.peers.pending[i]);
        nd.peers.pending.erase(nd.peers.pending.begin() + static_cast<std::ptrdiff_t>(i));
        for (const PeerRead& r : call.reads) {
          std::copy_n(node[r.peer]->arena.begin() + static_cast<std::ptrdiff_t>(r.remote_offset), r.length,
                      nd.staging.begin() + static_cast<std::ptrdiff_t>(r.staging_offset));
        }
        call.done(Status::ok_status());
        return true;
      }
      case 1: {  // a storage read lands
        if (nd.storage.pending.empty()) return false;
        const std::size_t i = rng.below(nd.storage.pending.size());
        auto call = std::move(nd.storage.pending[i]);
        nd.storage.pending.erase(nd.storage.pending.begin() + static_cast<std::ptrdiff_t>(i));
        for (const StorageRead& r : call.reads) write_sample(nd.staging, r.staging_offset, r.sample, r.length);
        call.done(StorageOutcome{});
        return true;
      }
      case 2: {  // the reload writes one entering sample
        if (nd.reload.empty()) return false;
        const auto [id, at] = nd.reload.front();
        nd.reload.pop_front();
        if (auto who = reader_of(k, at, at + align_to_arena(sizes[id]))) {
          RC_FAIL(fmt::format("node {} reloads sample {} at offset {} while {}", k, id, at, *who));
        }
        write_sample(nd.arena, at, id, sizes[id]);
        return true;
      }
      case 3: {  // the main thread's poll
        const Status s = nd.coordinator->poll();
        RC_ASSERT(s.ok());
        return true;
      }
      default: {  // an MPI message arrives (FIFO per destination, so per pair too)
        if (nd.inbox.empty()) return false;
        const Message m = nd.inbox.front();
        nd.inbox.pop_front();
        if (m.kind == Message::kDone) {
          nd.coordinator->on_done(m.from, m.node, m.generation);
        } else {
          nd.coordinator->on_readable(m.node, m.generation);
        }
        return true;
      }
    }
  }
};

struct ClusterCase {
  std::uint32_t nodes, batch, prefetch, window, readahead, epochs;
  std::size_t n;
  double share;
  std::uint64_t sizes_seed, order_seed;
};

void show(const ClusterCase& c, std::ostream& os) {
  os << fmt::format("nodes {} n {} batch {} prefetch {} window {} readahead {} epochs {} share {} seeds {} {}",
                    c.nodes, c.n, c.batch, c.prefetch, c.window, c.readahead, c.epochs, c.share, c.sizes_seed,
                    c.order_seed);
}

rc::Gen<ClusterCase> gen_cluster_case() {
  return rc::gen::exec([] {
    ClusterCase c;
    c.nodes = *rc::gen::inRange<std::uint32_t>(2, 5);
    c.batch = *rc::gen::inRange<std::uint32_t>(1, 7);
    c.n = *rc::gen::inRange<std::size_t>(c.nodes * c.batch, 120);
    c.prefetch = *rc::gen::inRange<std::uint32_t>(1, 4);
    c.window = *rc::gen::element<std::uint32_t>(0, 0, 5);
    c.readahead = *rc::gen::inRange<std::uint32_t>(0, 3);
    c.epochs = *rc::gen::inRange<std::uint32_t>(2, 5);
    c.share = *rc::gen::element(0.3, 0.5, 0.8, 1.2);
    c.sizes_seed = *rc::gen::arbitrary<std::uint64_t>();
    c.order_seed = *rc::gen::arbitrary<std::uint64_t>();
    return c;
  });
}

// Runs one random case to the end and checks the fence's invariants (trainer_step and
// system_step assert bytes, exactly once and no rewrite under a reader as they go) and
// its liveness. Returns the entering samples all nodes loaded.
std::uint64_t run_fence_case(const ClusterCase& c, std::uint32_t rotation_epochs, std::uint32_t reuse_rounds) {
  Cluster cluster(c.nodes, c.epochs, c.n, c.batch, c.prefetch, c.window, c.readahead, c.share, rotation_epochs,
                  c.sizes_seed, reuse_rounds);
  RC_TAG(cluster.placement.total_cold_samples() > 0 ? "some samples cold" : "everything fits");
  Rng rng(c.order_seed);
  for (std::uint32_t k = 0; k < c.nodes; ++k) cluster.start(k, 0);
  std::uint64_t steps = 0;
  while (!cluster.all_finished()) {
    RC_ASSERT(++steps < 2'000'000);
    if (rng.below(3) == 0) {
      cluster.trainer_step(static_cast<std::uint32_t>(rng.below(c.nodes)), rng);
    } else {
      cluster.system_step(rng);
    }
  }
  // Liveness: once the trainers are gone (their connections close, dropping what they and
  // their read-ahead held), every fence completes up to the generation every daemon has
  // staged into: a daemon retires a generation only when its own schedulers move on (0033),
  // so a daemon whose read-ahead stopped earlier (with rounds, the last epoch's read-ahead
  // ends in different rounds on different nodes) holds the next fence, and the daemons
  // that went further stay in transition towards it (their changing samples on storage).
  for (auto& nd : cluster.node) nd->scheduler->close();
  for (std::uint64_t quiet = 0; quiet < 200'000; ++quiet) cluster.system_step(rng);
  std::uint64_t target = ~std::uint64_t{0};
  for (auto& nd : cluster.node) target = std::min(target, nd->table->furthest_generation_staged().value_or(0));
  std::uint64_t loaded = 0;
  for (std::uint32_t k = 0; k < c.nodes; ++k) {
    for (std::uint32_t j = 0; j < c.nodes; ++j) {
      RC_ASSERT(cluster.node[j]->coordinator->generation(k) == target);
      const bool went_further = cluster.node[j]->table->furthest_generation_staged().value_or(0) > target;
      RC_ASSERT(cluster.node[j]->coordinator->in_transition(k) == went_further);
    }
    const auto stats = cluster.node[k]->coordinator->stats();
    RC_ASSERT(stats.unexpected_messages == 0u);
    loaded += stats.samples_loaded;
  }
  // Everything fits (the share alone does not say: balanced placement may give a node more
  // than the average): every generation is the whole share, rotation writes nothing.
  if (cluster.placement.total_cold_samples() == 0) RC_ASSERT(loaded == 0u);
  return loaded;
}

RC_GTEST_PROP(RotationFenceTest, BytesCorrectExactlyOnceAndNoSlotRewrittenUnderAReader, ()) {
  run_fence_case(*gen_cluster_case(), 1, 0);
}

// Slot reuse within an epoch (cache.reuse_rounds, 0035): the same fence with a generation
// per round, so slots are rewritten mid-epoch while passes read the samples around them.
RC_GTEST_PROP(SlotReuseFenceTest, RoundsKeepBytesCorrectExactlyOnceAndNoSlotRewrittenUnderAReader, ()) {
  const ClusterCase c = *gen_cluster_case();
  const auto rounds = *rc::gen::inRange<std::uint32_t>(2, 9);
  RC_TAG(fmt::format("{} rounds", rounds));
  const std::uint64_t loaded = run_fence_case(c, 0, rounds);
  RC_TAG(loaded > 0 ? "slots reused" : "nothing reloaded");
}

// A scheduler that failed (here: a peer read error) must not keep the arena pins of slots it
// staged but never delivered: a trainer that catches the error and idles would otherwise
// hold up its node's reloads for good. Once the trainer has released what it was given,
// only the view itself (and this test) hold node 0's pin.
TEST(RotationFenceTest, AFailedSchedulerDropsThePinsOfUndeliveredSlots) {
  Cluster cluster(2, 2, 80, 4, 4, 0, 0, 1.2, 1, 11);  // everything resident: local slots pin
  Node& nd = *cluster.node[0];
  const std::shared_ptr<const int> pin = cluster.node[0]->table->view(0)->pin;
  cluster.start(0, 0);
  ASSERT_GT(pin.use_count(), 2) << "no local slot was staged: the test proves nothing";
  ASSERT_FALSE(nd.peers.pending.empty()) << "no peer read to fail";
  auto call = std::move(nd.peers.pending.front());
  nd.peers.pending.pop_front();
  call.done(make_error(StatusCode::kUnavailable, "read from peer 1: failed by the test"));
  ASSERT_FALSE(nd.sink.errors.empty()) << "the scheduler did not fail";
  for (const proto::BatchFrame& b : nd.sink.batches) ASSERT_TRUE(nd.scheduler->release(b.stream, b.batch).ok());
  EXPECT_EQ(pin.use_count(), 2) << "undelivered slots of the failed scheduler still pin node 0's arena view";
  nd.scheduler->close();
}

// A deterministic run: rotation really changes what is resident, and what trainers read
// from storage while a node reloads is bounded.
TEST(RotationFenceTest, ResidentSetChangesEveryGenerationAndEveryNodeReloads) {
  Cluster cluster(4, 3, 240, 4, 2, 0, 1, 0.5, 1, 7);
  Rng rng(3);
  for (std::uint32_t k = 0; k < 4; ++k) cluster.start(k, 0);
  for (std::uint64_t steps = 0; !cluster.all_finished() && steps < 5'000'000; ++steps) {
    if (rng.below(3) == 0) {
      cluster.trainer_step(static_cast<std::uint32_t>(rng.below(4)), rng);
    } else {
      cluster.system_step(rng);
    }
  }
  ASSERT_TRUE(cluster.all_finished());
  for (auto& nd : cluster.node) nd->scheduler->close();
  for (std::uint64_t quiet = 0; quiet < 200'000; ++quiet) cluster.system_step(rng);
  for (std::uint32_t k = 0; k < 4; ++k) {
    const auto stats = cluster.node[k]->coordinator->stats();
    // Epochs 0-2 ran and the read-ahead staged into epoch 3: generations 1, 2 and 3 loaded.
    EXPECT_EQ(stats.generations_loaded, 3u) << "node " << k;
    EXPECT_GT(stats.samples_loaded, 0u) << "node " << k;
    const auto now = cluster.node[k]->table->view(k)->layout;
    EXPECT_NE(now->resident, cluster.placement.cached[k]) << "node " << k;
  }
}

}  // namespace rotation_test
}  // namespace shardmix
