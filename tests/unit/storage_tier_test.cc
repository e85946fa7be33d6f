// The storage tier: the scheduler with cold samples (cached on no node) read through a
// fake StorageFetcher, in ordered (W = 0) and opportunistic (W > 0) modes, its clairvoyant
// read-ahead, and the real StorageReaderPool against files.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/rng.h"
#include "common/trainer_scheduler.h"
#include "server/storage_reader.h"
#include "tests/unit/scheduler_world.h"

namespace shardmix {
namespace storage_tier_test {

using test_support::Pending;
using FakePeers = test_support::QueuedPeers;

// Queued storage reads that fail as the test says when completed.
struct FakeStorage : test_support::QueuedStorage {
  Status fail_with;              // every read fails with it
  std::set<SampleId> unreadable;  // these fail every time
  std::set<SampleId> flaky;       // these fail the first time they are read
  std::map<SampleId, int> fail_on_read;  // this sample's n-th read fails
  std::map<SampleId, int> reads_of;
  // What pending group k completes with: its failed reads, like StorageReaderPool.
  StorageOutcome outcome_of(std::size_t k) {
    StorageOutcome o;
    for (std::size_t i = 0; i < pending[k].reads.size(); ++i) {
      const SampleId id = pending[k].reads[i].sample;
      const int n = ++reads_of[id];
      if (!fail_with.ok()) {
        o.failed.emplace_back(i, fail_with);
      } else if (unreadable.count(id) > 0 || (flaky.count(id) > 0 && n == 1) ||
                 (fail_on_read.count(id) > 0 && fail_on_read.at(id) == n)) {
        o.failed.emplace_back(
            i, make_error(StatusCode::kCorrupt, "/data/s{}.bin: file shrank since the scan (EOF at offset 16)", id));
      }
    }
    return o;
  }
  void complete(std::size_t k) {
    const StorageOutcome o = outcome_of(k);
    auto call = std::move(pending[k]);
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
    call.done(o);
  }
};

using Sink = test_support::RecordingSink;

// A job whose nodes cache only `resident_share` of their share (by bytes): scheduler_world.h
// with catalog seed 11.
struct ColdWorld : test_support::SchedulerWorld {
  ColdWorld(std::size_t n, std::uint32_t nodes, std::uint32_t batch, std::uint32_t prefetch, std::uint32_t window,
            double resident_share, StorageFetcher* storage, std::uint32_t readahead = 0)
      : SchedulerWorld(11, n, nodes, batch, prefetch, window, resident_share, storage, readahead) {}

  proto::Tier expected_tier(SampleId id) const {
    if (!placement.is_resident(id)) return proto::Tier::kStorage;
    return placement.owner[id] == 0 ? proto::Tier::kLocal : proto::Tier::kPeer;
  }
};

template <typename Fetcher>
void complete_one(Fetcher& f, std::size_t k, const Status& s = Status::ok_status()) {
  auto call = std::move(f.pending[k]);
  f.pending.erase(f.pending.begin() + static_cast<std::ptrdiff_t>(k));
  call.done(s);
}

// Storage: every read of group k fails with `s`, or none does.
void complete_one(FakeStorage& f, std::size_t k, const Status& s = Status::ok_status()) {
  auto call = std::move(f.pending[k]);
  f.pending.erase(f.pending.begin() + static_cast<std::ptrdiff_t>(k));
  StorageOutcome o;
  if (!s.ok()) {
    for (std::size_t i = 0; i < call.reads.size(); ++i) o.failed.emplace_back(i, s);
  }
  call.done(o);
}

// The trainer goes away; every read still pending lands, so staging can be checked empty.
void close_and_drain(TrainerScheduler& scheduler, FakePeers& peers, FakeStorage& storage) {
  scheduler.close();
  while (!peers.pending.empty()) complete_one(peers, 0);
  while (!storage.pending.empty()) complete_one(storage, 0);
}

// What a pass delivered, in delivery order, against its plan: W = 0 exactly the planned
// order; with a window, the same samples in any order.
bool matches_plan(std::vector<SampleId> order, const TrainerPlan& plan, std::uint32_t window) {
  if (window == 0) return order == plan.order;
  std::vector<SampleId> want = plan.order;
  std::sort(order.begin(), order.end());
  std::sort(want.begin(), want.end());
  return order == want;
}

// Runs a pass (stream `stream`) until its EpochEnd or an error, for the properties: at each
// step a seeded choice completes a random pending read (storage ones as FakeStorage says)
// or releases the oldest batch the trainer holds; a step with neither is a hang.
void run_pass_randomly(TrainerScheduler& scheduler, FakePeers& peers, FakeStorage& storage, Sink& sink,
                       std::uint64_t stream, std::uint64_t seed) {
  Rng choices(seed);
  std::deque<std::uint64_t> held;
  std::size_t seen = 0;
  for (int guard = 0; sink.ends.empty() && sink.errors.empty() && guard < 100000; ++guard) {
    for (; seen < sink.batches.size(); ++seen) held.push_back(sink.batches[seen].batch);
    const std::size_t fetches = peers.pending.size() + storage.pending.size();
    if (fetches > 0 && (held.empty() || choices.below(3) != 0)) {
      const std::size_t k = choices.below(fetches);
      if (k < peers.pending.size()) {
        complete_one(peers, k);
      } else {
        storage.complete(k - peers.pending.size());
      }
    } else {
      RC_ASSERT(!held.empty());  // otherwise nothing can move: a hang
      RC_ASSERT(scheduler.release(stream, held.front()).ok());
      held.pop_front();
    }
  }
}

// Runs one pass to its EpochEnd: completes fetches (storage ones in a seeded random order,
// which W = 0 must not let change the delivered order) and releases every batch.
std::vector<SampleId> run_pass(TrainerScheduler& scheduler, FakePeers& peers, FakeStorage& storage, Sink& sink,
                               std::uint64_t stream, std::size_t ends_before, std::uint64_t seed) {
  Rng choices(seed);
  std::vector<SampleId> got;
  std::size_t released = sink.batches.size();
  for (int guard = 0; sink.ends.size() == ends_before && sink.errors.empty() && guard < 100000; ++guard) {
    if (!storage.pending.empty() && choices.below(2) == 0) {
      storage.complete(choices.below(storage.pending.size()));
    } else if (!peers.pending.empty()) {
      complete_one(peers, 0);
    } else if (released < sink.batches.size()) {
      for (const auto& d : sink.batches[released].samples) got.push_back(d.sample_id);
      EXPECT_TRUE(scheduler.release(stream, sink.batches[released].batch).ok());
      ++released;
    } else if (!storage.pending.empty()) {
      storage.complete(0);
    }
  }
  for (; released < sink.batches.size(); ++released) {
    for (const auto& d : sink.batches[released].samples) got.push_back(d.sample_id);
  }
  return got;
}

TEST(StorageTier, ColdSamplesComeFromStorageInThePlannedOrder) {
  FakeStorage storage;
  ColdWorld w(300, 4, 8, 3, 0, 0.4, &storage);
  ASSERT_GT(w.placement.total_cold_samples(), 100u);  // most samples are cold
  auto staging = std::make_shared<StagingAllocator>(4096, 1 << 22);
  FakePeers peers;
  Sink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
  for (std::uint64_t e = 0; e < 2; ++e) {
    const std::size_t from = sink.batches.size();
    const std::size_t reads_before = storage.all.size();
    scheduler->start_epoch(e, e + 1);
    const std::vector<SampleId> got = run_pass(*scheduler, peers, storage, sink, e + 1, e, 100 + e);
    ASSERT_TRUE(sink.errors.empty()) << sink.errors[0].message();
    const TrainerPlan plan = w.planner->plan_node(e, 0)[0];
    EXPECT_EQ(got, plan.order);  // W = 0: exactly the plan, whatever order reads land in
    std::uint64_t cold = 0, local = 0;
    for (SampleId id : plan.order) {
      cold += w.placement.is_resident(id) ? 0 : 1;
      local += w.expected_tier(id) == proto::Tier::kLocal ? 1 : 0;
    }
    ASSERT_EQ(sink.ends.size(), e + 1);
    EXPECT_EQ(sink.ends[e].storage_samples, cold);
    EXPECT_EQ(sink.ends[e].local_samples, local);
    EXPECT_EQ(sink.ends[e].local_samples + sink.ends[e].peer_samples + sink.ends[e].storage_samples,
              plan.order.size());
    EXPECT_GT(cold, 0u);
    for (std::size_t i = from; i < sink.batches.size(); ++i) {
      for (const auto& d : sink.batches[i].samples) {
        if (sink.batches[i].epoch != e) continue;
        EXPECT_EQ(d.tier, static_cast<std::uint8_t>(w.expected_tier(d.sample_id)));
        EXPECT_EQ(d.owner, w.placement.owner[d.sample_id]);
        if (d.tier != static_cast<std::uint8_t>(proto::Tier::kLocal)) {
          EXPECT_EQ(d.region, static_cast<std::uint8_t>(proto::Region::kStaging));
          EXPECT_GE(d.offset, 4096u);
        }
      }
    }
    // Every cold sample of the plan was read from storage (epoch e's reads, plus the next
    // epoch's first batches read ahead), each with its catalog length, into staging.
    std::multiset<SampleId> read_ids;
    for (std::size_t i = reads_before; i < storage.all.size(); ++i) {
      const StorageRead& r = storage.all[i];
      EXPECT_FALSE(w.placement.is_resident(r.sample));
      EXPECT_EQ(r.length, w.catalog.sample_bytes(r.sample));
      EXPECT_GE(r.staging_offset, 4096u);
      read_ids.insert(r.sample);
    }
    for (SampleId id : plan.order) {
      if (!w.placement.is_resident(id)) {
        EXPECT_GE(read_ids.count(id), 1u) << "sample " << id;
      }
    }
  }
  // Peers were asked only for resident samples.
  close_and_drain(*scheduler, peers, storage);
  EXPECT_TRUE(staging->empty());
}

// Any completion order of peer and storage reads, any release pattern, any window, any
// share of cold samples: every planned sample exactly once, planned batch sizes, inside the
// window; W = 0 exactly the planned order.
RC_GTEST_PROP(StorageTier, ExactlyOnceInEitherModeWhateverReadsLandFirst, ()) {
  const auto n = *rc::gen::inRange<std::size_t>(1, 200);
  const auto nodes = *rc::gen::inRange<std::uint32_t>(1, 5);
  const auto batch = *rc::gen::inRange<std::uint32_t>(1, 10);
  const auto prefetch = *rc::gen::inRange<std::uint32_t>(1, 4);
  const auto window = *rc::gen::element<std::uint32_t>(0, 0, 3, 16, 1000);
  const auto readahead = *rc::gen::element<std::uint32_t>(0, 2, 8);
  const auto share = *rc::gen::element(0.0, 0.2, 0.6, 1.01);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  FakeStorage storage;
  ColdWorld w(n, nodes, batch, prefetch, window, share, &storage, readahead);
  const std::uint64_t capacity = (std::uint64_t{prefetch + readahead} * batch + window + 2 * batch) * 5200;
  auto staging = std::make_shared<StagingAllocator>(0, capacity);
  FakePeers peers;
  Sink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
  const TrainerPlan plan = w.planner->plan_node(1, 0)[0];
  scheduler->start_epoch(1, 3);
  run_pass_randomly(*scheduler, peers, storage, sink, 3, seed);
  RC_ASSERT(sink.errors.empty());
  RC_ASSERT(sink.ends.size() == 1u);
  RC_ASSERT(sink.batches.size() == plan.num_batches());
  std::map<SampleId, std::uint64_t> at;
  for (std::uint64_t i = 0; i < plan.order.size(); ++i) at[plan.order[i]] = i;
  std::vector<SampleId> order;
  std::uint64_t cold = 0;
  for (std::uint64_t j = 0; j < sink.batches.size(); ++j) {
    const std::uint64_t begin = plan.batch_begin[j];
    const std::uint64_t size = plan.batch_begin[j + 1] - begin;
    RC_ASSERT(sink.batches[j].samples.size() == size);
    for (const auto& d : sink.batches[j].samples) {
      RC_ASSERT(at.count(d.sample_id) == 1u);
      RC_ASSERT(at.at(d.sample_id) < begin + size + window);
      RC_ASSERT(d.tier == static_cast<std::uint8_t>(w.expected_tier(d.sample_id)));
      cold += d.tier == static_cast<std::uint8_t>(proto::Tier::kStorage) ? 1 : 0;
      order.push_back(d.sample_id);
    }
  }
  RC_ASSERT(sink.ends[0].storage_samples == cold);
  RC_ASSERT(matches_plan(order, plan, window));
  close_and_drain(*scheduler, peers, storage);
  RC_ASSERT(staging->empty());
}

// Storage reads that hang: W = 0 waits for them; W > 0 overtakes them with ready samples
// (peer and local) and delivers the cold ones once they land, still exactly once.
TEST(StorageTier, LateColdReadsAreOvertakenOnlyWithAWindow) {
  for (const std::uint32_t window : {0u, 64u}) {
    FakeStorage storage;
    ColdWorld w(400, 4, 8, 2, window, 0.75, &storage);
    const TrainerPlan plan = w.planner->plan_node(0, 0)[0];
    bool first_batch_cold = false;
    for (std::uint64_t i = plan.batch_begin[0]; i < plan.batch_begin[1]; ++i) {
      first_batch_cold = first_batch_cold || !w.placement.is_resident(plan.order[i]);
    }
    ASSERT_TRUE(first_batch_cold) << "pick another world: the test needs a cold sample in batch 0";
    auto staging = std::make_shared<StagingAllocator>(0, 1 << 24);
    FakePeers peers;
    Sink sink;
    auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
    scheduler->start_epoch(0, 1);
    std::size_t released = 0;
    for (int round = 0; round < 8; ++round) {  // peers answer, storage does not
      while (!peers.pending.empty()) complete_one(peers, 0);
      for (; released < sink.batches.size(); ++released) {
        ASSERT_TRUE(scheduler->release(1, sink.batches[released].batch).ok());
      }
    }
    if (window == 0) {
      EXPECT_TRUE(sink.batches.empty()) << "W = 0 must wait for the cold read";
    } else {
      EXPECT_GE(sink.batches.size(), 3u) << "W > 0 must overtake the late cold reads";
      for (const auto& b : sink.batches) {
        for (const auto& d : b.samples) EXPECT_NE(d.tier, static_cast<std::uint8_t>(proto::Tier::kStorage));
      }
    }
    std::vector<SampleId> all;
    for (const auto& b : sink.batches) {
      for (const auto& d : b.samples) all.push_back(d.sample_id);
    }
    const std::vector<SampleId> rest = run_pass(*scheduler, peers, storage, sink, 1, 0, 7);
    all.insert(all.end(), rest.begin(), rest.end());
    ASSERT_TRUE(sink.errors.empty());
    ASSERT_EQ(sink.ends.size(), 1u);
    std::sort(all.begin(), all.end());
    std::vector<SampleId> want = plan.order;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(all, want);
    if (window > 0) {
      EXPECT_GT(sink.ends[0].substituted_samples, 0u);
    }
    EXPECT_GT(sink.ends[0].storage_samples, 0u);
  }
}

// Degraded mode (fault.peer_death = degrade): trainer 0 of node 0 in a 4-node job where
// everything is resident, so storage serves only a dead peer's samples. Two batches are
// delivered and released while all peers are healthy.
struct DegradedTrainer {
  FakeStorage storage;
  ColdWorld w{400, 4, 8, 3, 0, 2.0, &storage};
  std::atomic<std::uint64_t> rerouted{0};
  std::shared_ptr<StagingAllocator> staging = std::make_shared<StagingAllocator>(4096, 128 << 10);
  FakePeers peers;
  Sink sink;
  std::shared_ptr<TrainerScheduler> scheduler;
  TrainerPlan plan;
  std::vector<SampleId> got;  // released batches' samples, in delivery order
  std::size_t released = 0;

  DegradedTrainer() {
    w.context.degrade_dead_peers = true;
    w.context.rerouted_samples = &rerouted;
    scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
    scheduler->start_epoch(0, 1);
    plan = w.planner->plan_node(0, 0)[0];
    while (sink.batches.size() < 2 && !peers.pending.empty()) complete_one(peers, 0);
    release_all();
  }
  void release_one() {
    for (const auto& d : sink.batches[released].samples) got.push_back(d.sample_id);
    EXPECT_TRUE(scheduler->release(1, sink.batches[released].batch).ok());
    ++released;
  }
  void release_all() {
    while (released < sink.batches.size()) release_one();
  }
  static bool reads_from(const Pending<PeerRead>& call, std::uint32_t peer) {
    return std::any_of(call.reads.begin(), call.reads.end(), [&](const PeerRead& r) { return r.peer == peer; });
  }
  // Takes every pending read group that touches `peer` out of the fake: they never land
  // unless the test completes them.
  std::vector<Pending<PeerRead>> take_stuck(std::uint32_t peer) {
    std::vector<Pending<PeerRead>> stuck;
    std::deque<Pending<PeerRead>> healthy;
    for (auto& call : peers.pending) {
      if (reads_from(call, peer)) {
        stuck.push_back(std::move(call));
      } else {
        healthy.push_back(std::move(call));
      }
    }
    peers.pending = std::move(healthy);
    return stuck;
  }
};

// Degraded mode (fault.peer_death = degrade): rank 1 dies mid-epoch with reads from it in
// flight, one failing and the others stuck. Those positions, and every later sample of
// rank 1, come from storage; the trainer gets the whole plan once, in planned order
// (W = 0), and staging bytes a stuck read could still write into are not reused.
TEST(StorageTier, ADeadPeersSamplesComeFromStorageExactlyOnceInThePlannedOrder) {
  DegradedTrainer t;
  // Plain references, not a structured binding: clang 14 cannot capture those in lambdas.
  FakeStorage& storage = t.storage;
  ColdWorld& w = t.w;
  std::atomic<std::uint64_t>& rerouted = t.rerouted;
  std::shared_ptr<StagingAllocator>& staging = t.staging;
  FakePeers& peers = t.peers;
  Sink& sink = t.sink;
  std::shared_ptr<TrainerScheduler>& scheduler = t.scheduler;
  const TrainerPlan& plan = t.plan;
  std::vector<SampleId>& got = t.got;
  std::size_t& released = t.released;
  ASSERT_EQ(w.placement.total_cold_samples(), 0u);  // nothing cold: storage only for the dead peer
  ASSERT_GE(plan.num_batches(), 10u);
  ASSERT_EQ(sink.batches.size(), 2u);
  auto release_all = [&] { t.release_all(); };
  const std::size_t healthy_batches = sink.batches.size();
  // Rank 1 dies: its oldest read group fails with a transport error...
  std::size_t failing = 0;
  while (failing < peers.pending.size() && !DegradedTrainer::reads_from(peers.pending[failing], 1)) ++failing;
  ASSERT_LT(failing, peers.pending.size());
  complete_one(peers, failing, make_error(StatusCode::kUnavailable, "read from daemon rank 1 failed"));
  EXPECT_TRUE(sink.errors.empty());
  // ... and the other groups reading from it are stuck (never answered until the end).
  std::vector<Pending<PeerRead>> stuck = t.take_stuck(1);
  ASSERT_FALSE(stuck.empty());
  struct StuckRange {
    std::uint64_t length = 0;
    int reads_since = 0;
  };
  std::map<std::uint64_t, StuckRange> stuck_ranges;  // staging offset -> a stuck read's bytes
  for (const auto& call : stuck) {
    for (const PeerRead& r : call.reads) stuck_ranges[r.staging_offset] = {r.length, 0};
  }
  const std::size_t storage_before = storage.all.size();
  scheduler->peer_dead(1);
  auto check_not_into_stuck_bytes = [&](std::uint64_t offset, std::uint64_t length) {
    auto it = stuck_ranges.upper_bound(offset + length - 1);
    if (it == stuck_ranges.begin()) return;
    --it;
    if (it->first + it->second.length <= offset) return;  // no overlap
    // Only a stuck position's own re-post may target its bytes, once.
    EXPECT_EQ(it->first, offset) << "a read lands in bytes a stuck read of the dead peer may still write";
    if (it->first == offset) {
      EXPECT_LE(++it->second.reads_since, 1) << "stuck bytes at " << offset << " were reused";
    }
  };
  Rng choices(17);
  std::size_t storage_seen = storage_before;
  for (int guard = 0; sink.ends.empty() && sink.errors.empty() && guard < 100000; ++guard) {
    for (; storage_seen < storage.all.size(); ++storage_seen) {
      check_not_into_stuck_bytes(storage.all[storage_seen].staging_offset, storage.all[storage_seen].length);
    }
    if (!storage.pending.empty() && choices.below(2) == 0) {
      complete_one(storage, choices.below(storage.pending.size()));
    } else if (!peers.pending.empty()) {
      for (const PeerRead& r : peers.pending.front().reads) {
        EXPECT_NE(r.peer, 1u) << "a read from the dead rank was posted after it was declared dead";
        check_not_into_stuck_bytes(r.staging_offset, r.length);
      }
      complete_one(peers, 0);
    } else if (released < sink.batches.size()) {
      release_all();
    } else if (!storage.pending.empty()) {
      complete_one(storage, 0);
    }
  }
  release_all();
  // The stuck reads finally fail: they change nothing.
  for (auto& call : stuck) call.done(make_error(StatusCode::kUnavailable, "read from daemon rank 1 timed out"));
  ASSERT_TRUE(sink.errors.empty()) << sink.errors[0].message();
  ASSERT_EQ(sink.ends.size(), 1u);
  EXPECT_EQ(got, plan.order);  // exactly once, in the planned order
  std::uint64_t from_storage = 0;
  for (std::size_t b = 0; b < sink.batches.size(); ++b) {
    for (const auto& d : sink.batches[b].samples) {
      const bool storage_tier = d.tier == static_cast<std::uint8_t>(proto::Tier::kStorage);
      from_storage += storage_tier ? 1 : 0;
      if (b >= healthy_batches && d.owner == 1) {
        EXPECT_TRUE(storage_tier) << "sample " << d.sample_id;
      }
      if (b < healthy_batches) {
        EXPECT_FALSE(storage_tier);
      }
    }
  }
  EXPECT_GT(from_storage, 8u);
  EXPECT_EQ(sink.ends[0].storage_samples, from_storage);
  EXPECT_EQ(scheduler->rerouted_samples(), storage.all.size());
  EXPECT_EQ(rerouted.load(), storage.all.size());
  // Once per epoch: the scheduler also reads ahead into epoch 1, whose plan may hold a
  // sample of rank 1 that epoch 0's plan holds too (so it is read twice, once per epoch).
  std::map<SampleId, int> reads;
  for (const StorageRead& r : storage.all) ++reads[r.sample];
  const TrainerPlan next = w.planner->plan_node(1, 0)[0];
  const std::set<SampleId> in_epoch0(plan.order.begin(), plan.order.end());
  const std::set<SampleId> in_epoch1(next.order.begin(), next.order.end());
  for (const auto& [sample, count] : reads) {
    EXPECT_LE(count, static_cast<int>(in_epoch0.count(sample) + in_epoch1.count(sample))) << "sample " << sample;
  }
  // Every byte comes back once the stuck reads have landed (next epoch's work aside).
  close_and_drain(*scheduler, peers, storage);
  EXPECT_EQ(staging->bytes_in_use(), 0u);
}

// Degraded mode, the bug CI's ASan stage caught once (decision 0032): a read of the dead
// peer that was re-posted to storage lands (fails) while the trainer still holds the batch
// its positions were delivered in. Its staging bytes are free only once both have let go:
// no later read, from a peer or from storage, may target bytes of a batch the trainer
// holds. Seeded over which batch the trainer holds when the stuck reads land.
TEST(StorageTier, AStaleReadLandingDoesNotFreeBytesTheTrainerHolds) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    DegradedTrainer t;
    // Plain references, not a structured binding: clang 14 cannot capture those in lambdas.
    FakeStorage& storage = t.storage;
    std::shared_ptr<StagingAllocator>& staging = t.staging;
    FakePeers& peers = t.peers;
    Sink& sink = t.sink;
    std::shared_ptr<TrainerScheduler>& scheduler = t.scheduler;
    const TrainerPlan& plan = t.plan;
    std::vector<SampleId>& got = t.got;
    std::size_t& released = t.released;
    auto release_one = [&] { t.release_one(); };
    // Staging bytes of the batches the trainer holds (delivered, not released).
    auto check_not_held = [&](std::uint64_t offset, std::uint64_t length, const char* what) {
      if (length == 0) return;
      for (std::size_t b = released; b < sink.batches.size(); ++b) {
        for (const auto& d : sink.batches[b].samples) {
          if (d.region != static_cast<std::uint8_t>(proto::Region::kStaging) || d.length == 0) continue;
          const bool overlap = offset < d.offset + d.length && d.offset < offset + length;
          ASSERT_FALSE(overlap) << what << " read into staging [" << offset << ", +" << length
                                << ") while the trainer holds sample " << d.sample_id << " of batch "
                                << sink.batches[b].batch << " there";
        }
      }
    };
    ASSERT_EQ(sink.batches.size(), 2u);
    // Rank 1 hangs: every read group touching it is stuck, then it is declared dead.
    std::vector<Pending<PeerRead>> stuck = t.take_stuck(1);
    ASSERT_FALSE(stuck.empty());
    scheduler->peer_dead(1);
    Rng choices(seed);
    std::size_t storage_seen = 0, batches_at_death = sink.batches.size();
    bool stuck_landed = false;
    for (int guard = 0; sink.ends.empty() && sink.errors.empty() && guard < 100000; ++guard) {
      for (; storage_seen < storage.all.size(); ++storage_seen) {
        check_not_held(storage.all[storage_seen].staging_offset, storage.all[storage_seen].length, "a storage");
      }
      for (const auto& call : peers.pending) {
        for (const PeerRead& r : call.reads) check_not_held(r.staging_offset, r.length, "a peer");
      }
      if (::testing::Test::HasFatalFailure()) return;
      // The stuck reads fail while the trainer holds a batch delivered after the death.
      if (!stuck_landed && sink.batches.size() > batches_at_death + choices.below(3)) {
        for (auto& call : stuck) call.done(make_error(StatusCode::kUnavailable, "read from daemon rank 1 failed"));
        stuck_landed = true;
        continue;
      }
      const std::uint64_t pick = choices.below(3);
      if (pick == 0 && !storage.pending.empty()) {
        complete_one(storage, choices.below(storage.pending.size()));
      } else if (pick == 1 && !peers.pending.empty()) {
        complete_one(peers, 0);
      } else if (released < sink.batches.size() && (stuck_landed || sink.batches.size() - released > 1)) {
        release_one();  // hold at least one batch until the stuck reads have landed
      } else if (!storage.pending.empty()) {
        complete_one(storage, 0);
      } else if (!peers.pending.empty()) {
        complete_one(peers, 0);
      } else if (released < sink.batches.size()) {
        release_one();
      }
    }
    ASSERT_TRUE(stuck_landed);
    while (released < sink.batches.size()) release_one();
    ASSERT_TRUE(sink.errors.empty()) << sink.errors[0].message();
    ASSERT_EQ(sink.ends.size(), 1u);
    EXPECT_EQ(got, plan.order);
    close_and_drain(*scheduler, peers, storage);
    EXPECT_EQ(staging->bytes_in_use(), 0u);  // every byte back once, none twice (the allocator aborts)
  }
}

// Degraded mode: the trainer lets go of batches holding bytes a stuck read of the dead peer
// may still write, not by releasing them but by starting another pass (the scheduler frees
// what it still held) or by disconnecting. Those bytes are reused only once the stuck read
// has landed, and every byte comes back once (the allocator aborts on a double free).
TEST(StorageTier, StaleBytesOfBatchesLetGoByARestartOrADisconnectComeBackOnce) {
  for (const bool restart : {true, false}) {
    SCOPED_TRACE(restart ? "a new pass" : "a disconnect");
    DegradedTrainer t;
    // Plain references, not a structured binding: clang 14 cannot capture those in lambdas.
    FakeStorage& storage = t.storage;
    std::shared_ptr<StagingAllocator>& staging = t.staging;
    FakePeers& peers = t.peers;
    Sink& sink = t.sink;
    std::shared_ptr<TrainerScheduler>& scheduler = t.scheduler;
    std::size_t& released = t.released;
    std::vector<Pending<PeerRead>> stuck = t.take_stuck(1);
    ASSERT_FALSE(stuck.empty());
    std::map<std::uint64_t, std::uint64_t> stuck_bytes;  // staging offset -> length
    for (const auto& call : stuck) {
      for (const PeerRead& r : call.reads) stuck_bytes[r.staging_offset] = r.length;
    }
    scheduler->peer_dead(1);
    // Deliver, without releasing, batches with positions re-posted from the stuck reads.
    auto holds_stuck_bytes = [&] {
      for (std::size_t b = released; b < sink.batches.size(); ++b) {
        for (const auto& d : sink.batches[b].samples) {
          if (d.region == static_cast<std::uint8_t>(proto::Region::kStaging) && stuck_bytes.count(d.offset) > 0) {
            return true;
          }
        }
      }
      return false;
    };
    for (int guard = 0; !holds_stuck_bytes() && guard < 10000; ++guard) {
      if (!storage.pending.empty()) {
        complete_one(storage, 0);
      } else if (!peers.pending.empty()) {
        complete_one(peers, 0);
      } else {
        break;
      }
    }
    ASSERT_TRUE(holds_stuck_bytes()) << "no batch delivered the re-posted positions";
    const std::size_t storage_seen = storage.all.size();
    auto overlaps_stuck = [&](std::uint64_t offset, std::uint64_t length) {
      for (const auto& [begin, bytes] : stuck_bytes) {
        if (length > 0 && offset < begin + bytes && begin < offset + length) return true;
      }
      return false;
    };
    if (restart) {
      scheduler->start_epoch(1, 2);
      // The new pass stages into free bytes only: none a stuck read may still write.
      for (int guard = 0; guard < 10000 && (!peers.pending.empty() || !storage.pending.empty()); ++guard) {
        for (const auto& call : peers.pending) {
          for (const PeerRead& r : call.reads) {
            EXPECT_FALSE(overlaps_stuck(r.staging_offset, r.length)) << "a peer read into stuck bytes";
          }
        }
        for (std::size_t i = storage_seen; i < storage.all.size(); ++i) {
          EXPECT_FALSE(overlaps_stuck(storage.all[i].staging_offset, storage.all[i].length))
              << "a storage read into stuck bytes";
        }
        if (!peers.pending.empty()) {
          complete_one(peers, 0);
        } else {
          complete_one(storage, 0);
        }
        while (released < sink.batches.size()) {
          if (sink.batches[released].stream == 2) {
            EXPECT_TRUE(scheduler->release(2, sink.batches[released].batch).ok());
          }
          ++released;
        }
      }
      EXPECT_TRUE(sink.errors.empty()) << sink.errors[0].message();
    }
    scheduler->close();
    for (auto& call : stuck) call.done(make_error(StatusCode::kUnavailable, "read from daemon rank 1 timed out"));
    while (!peers.pending.empty()) complete_one(peers, 0);
    while (!storage.pending.empty()) complete_one(storage, 0);
    EXPECT_EQ(staging->bytes_in_use(), 0u);
  }
}

// Without degraded mode a failed peer read still fails the trainer (fault.peer_death = stop).
TEST(StorageTier, WithoutDegradeAFailedPeerReadIsAnError) {
  FakeStorage storage;
  ColdWorld w(200, 4, 8, 2, 0, 2.0, &storage);
  auto staging = std::make_shared<StagingAllocator>(4096, 1 << 20);
  FakePeers peers;
  Sink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
  scheduler->start_epoch(0, 1);
  ASSERT_FALSE(peers.pending.empty());
  complete_one(peers, 0, make_error(StatusCode::kUnavailable, "read from daemon rank 1 failed"));
  ASSERT_EQ(sink.errors.size(), 1u);
  EXPECT_TRUE(storage.all.empty());
}

TEST(StorageTier, AColdReadErrorReachesTheTrainerNamingTheFile) {
  FakeStorage storage;
  storage.fail_with = make_error(StatusCode::kCorrupt, "/data/c3/x.bin: file shrank since the scan (EOF at offset 2048)");
  ColdWorld w(200, 2, 8, 2, 0, 0.3, &storage);
  auto staging = std::make_shared<StagingAllocator>(0, 1 << 22);
  FakePeers peers;
  Sink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
  scheduler->start_epoch(0, 1);
  (void)run_pass(*scheduler, peers, storage, sink, 1, 0, 3);
  ASSERT_EQ(sink.errors.size(), 1u);
  EXPECT_NE(sink.errors[0].message().find("/data/c3/x.bin"), std::string::npos) << sink.errors[0].message();
  EXPECT_NE(sink.errors[0].message().find("offset 2048"), std::string::npos);
  EXPECT_NE(sink.errors[0].message().find("plan position"), std::string::npos);
  close_and_drain(*scheduler, peers, storage);
  EXPECT_TRUE(staging->empty());
}

// A storage read that fails once (an I/O hiccup) is read again on its own and delivered;
// one that keeps failing fails the trainer when dataset.strict = true (the default of the
// scheduler), after that one retry.
TEST(StorageTier, AFailedColdReadIsRetriedOnceOnItsOwn) {
  FakeStorage storage;
  ColdWorld w(200, 2, 8, 2, 0, 0.3, &storage);
  const TrainerPlan plan = w.planner->plan_node(0, 0)[0];
  std::vector<SampleId> cold;
  for (SampleId id : plan.order) {
    if (!w.placement.is_resident(id)) cold.push_back(id);
  }
  ASSERT_GE(cold.size(), 20u);
  for (std::size_t i = 0; i < cold.size(); i += 4) storage.flaky.insert(cold[i]);
  auto staging = std::make_shared<StagingAllocator>(0, 1 << 22);
  FakePeers peers;
  Sink sink;
  {
    auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
    scheduler->start_epoch(0, 1);
    const std::vector<SampleId> got = run_pass(*scheduler, peers, storage, sink, 1, 0, 5);
    ASSERT_TRUE(sink.errors.empty()) << sink.errors[0].message();
    EXPECT_EQ(got, plan.order);
    EXPECT_EQ(sink.ends.at(0).unreadable_samples, 0u);
    for (SampleId id : storage.flaky) EXPECT_GE(storage.reads_of[id], 2) << "sample " << id;
    close_and_drain(*scheduler, peers, storage);
  }
  EXPECT_TRUE(staging->empty());
  // Strict: a sample that never reads fails the trainer, naming its file, after 2 reads.
  storage.unreadable = {cold[1]};
  storage.reads_of.clear();
  Sink strict_sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, strict_sink);
  scheduler->start_epoch(0, 1);
  (void)run_pass(*scheduler, peers, storage, strict_sink, 1, 0, 6);
  ASSERT_EQ(strict_sink.errors.size(), 1u);
  EXPECT_NE(strict_sink.errors[0].message().find(fmt::format("/data/s{}.bin", cold[1])), std::string::npos)
      << strict_sink.errors[0].message();
  EXPECT_EQ(storage.reads_of[cold[1]], 2);
  close_and_drain(*scheduler, peers, storage);
  EXPECT_TRUE(staging->empty());
}

// Only the reads that failed are read again: a bad file's neighbours in its read group are
// not, so a neighbour whose next read would fail is delivered, and the bad file costs two
// reads. (Read per group, a neighbour read a second time would have failed and been
// skipped.)
TEST(StorageTier, OnlyTheFailedReadsOfAGroupAreReadAgain) {
  FakeStorage storage;
  ColdWorld w(200, 2, 8, 2, 0, 0.3, &storage);
  w.context.skip_unreadable_samples = true;
  std::vector<SampleId> reported;
  w.context.on_skipped = [&reported](std::uint64_t, SampleId id, const Status&) { reported.push_back(id); };
  const TrainerPlan plan = w.planner->plan_node(0, 0)[0];
  std::vector<SampleId> first_batch_cold;
  for (std::uint64_t i = plan.batch_begin[0]; i < plan.batch_begin[1]; ++i) {
    if (!w.placement.is_resident(plan.order[i])) first_batch_cold.push_back(plan.order[i]);
  }
  ASSERT_GE(first_batch_cold.size(), 2u) << "the first batch needs two cold samples";
  const SampleId bad = first_batch_cold[0];
  storage.unreadable = {bad};
  for (std::size_t i = 1; i < first_batch_cold.size(); ++i) storage.fail_on_read[first_batch_cold[i]] = 2;
  auto staging = std::make_shared<StagingAllocator>(0, 1 << 22);
  FakePeers peers;
  Sink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
  scheduler->start_epoch(0, 1);
  ASSERT_FALSE(storage.pending.empty());
  storage.complete(0);  // the first batch's cold group: `bad` fails
  while (sink.ends.empty() && sink.errors.empty()) {
    if (!storage.pending.empty()) {
      storage.complete(0);
    } else if (!peers.pending.empty()) {
      complete_one(peers, 0);
    } else {
      ASSERT_FALSE(sink.batches.empty());
      for (const auto& b : sink.batches) (void)scheduler->release(1, b.batch);
    }
  }
  ASSERT_TRUE(sink.errors.empty()) << sink.errors[0].message();
  EXPECT_EQ(storage.reads_of[bad], 2);
  for (std::size_t i = 1; i < first_batch_cold.size(); ++i) {
    EXPECT_EQ(storage.reads_of[first_batch_cold[i]], 1) << "neighbour " << first_batch_cold[i];
  }
  EXPECT_EQ(sink.ends.at(0).unreadable_samples, 1u);
  EXPECT_EQ(reported, std::vector<SampleId>{bad});
  close_and_drain(*scheduler, peers, storage);
  EXPECT_TRUE(staging->empty());
}

// dataset.strict = false (skip_unreadable_samples): any completion order, release pattern,
// window and share of cold samples, with some cold samples unreadable for good and some
// failing once: every planned position goes out exactly once in a batch of its planned
// size; the unreadable ones, and only they, as skipped descriptors (no bytes), each
// reported once and counted in the epoch's statistics; the flaky ones delivered; staging
// all given back.
RC_GTEST_PROP(StorageTier, UnreadableSamplesAreSkippedAndCountedExactlyOnce, ()) {
  const auto n = *rc::gen::inRange<std::size_t>(1, 160);
  const auto nodes = *rc::gen::inRange<std::uint32_t>(1, 4);
  const auto batch = *rc::gen::inRange<std::uint32_t>(1, 9);
  const auto prefetch = *rc::gen::inRange<std::uint32_t>(1, 4);
  const auto window = *rc::gen::element<std::uint32_t>(0, 0, 3, 1000);
  const auto readahead = *rc::gen::element<std::uint32_t>(0, 2);
  const auto share = *rc::gen::element(0.0, 0.3, 0.7);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  FakeStorage storage;
  ColdWorld w(n, nodes, batch, prefetch, window, share, &storage, readahead);
  w.context.skip_unreadable_samples = true;
  std::multiset<SampleId> reported;
  w.context.on_skipped = [&reported](std::uint64_t epoch, SampleId id, const Status& s) {
    RC_ASSERT(s.message().find(fmt::format("/data/s{}.bin", id)) != std::string::npos);
    RC_ASSERT(epoch == 1u);  // reported when delivered: never for the next epoch, only read ahead
    reported.insert(id);
  };
  const TrainerPlan plan = w.planner->plan_node(1, 0)[0];
  Rng picks(seed ^ 0x5eed);
  std::set<SampleId> want_skipped;
  for (SampleId id : plan.order) {
    if (w.placement.is_resident(id)) continue;
    const std::uint64_t r = picks.below(4);
    if (r == 0) {
      storage.unreadable.insert(id);
      want_skipped.insert(id);
    } else if (r == 1) {
      storage.flaky.insert(id);
    }
  }
  const std::uint64_t capacity = (std::uint64_t{prefetch + readahead} * batch + window + 2 * batch) * 5200;
  auto staging = std::make_shared<StagingAllocator>(0, capacity);
  FakePeers peers;
  Sink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
  scheduler->start_epoch(1, 3);
  run_pass_randomly(*scheduler, peers, storage, sink, 3, seed);
  RC_ASSERT(sink.errors.empty());
  RC_ASSERT(sink.ends.size() == 1u);
  RC_ASSERT(sink.batches.size() == plan.num_batches());
  std::vector<SampleId> order;
  std::set<SampleId> skipped;
  for (std::uint64_t j = 0; j < sink.batches.size(); ++j) {
    RC_ASSERT(sink.batches[j].samples.size() == plan.batch_begin[j + 1] - plan.batch_begin[j]);
    for (const auto& d : sink.batches[j].samples) {
      order.push_back(d.sample_id);
      if ((d.flags & proto::kSampleSkipped) != 0) {
        RC_ASSERT(d.length == 0u);
        RC_ASSERT(skipped.insert(d.sample_id).second);
      } else {
        RC_ASSERT(d.length == w.catalog.sample_bytes(d.sample_id));
      }
    }
  }
  RC_ASSERT(skipped == want_skipped);
  RC_ASSERT(std::multiset<SampleId>(want_skipped.begin(), want_skipped.end()) == reported);
  RC_ASSERT(sink.ends[0].unreadable_samples == want_skipped.size());
  RC_ASSERT(sink.ends[0].samples + sink.ends[0].unreadable_samples == plan.order.size());
  RC_ASSERT(matches_plan(order, plan, window));
  close_and_drain(*scheduler, peers, storage);
  RC_ASSERT(staging->empty());
}

// Clairvoyant read-ahead: with storage not answering and the trainer holding everything it
// got, the scheduler posts the cold reads of prefetch + cold_readahead_batches planned
// batches, no more; fewer when staging is too small to hold them (never an error).
TEST(StorageTier, ReadAheadPostsColdReadsOfPrefetchPlusReadAheadBatches) {
  const std::uint32_t batch = 8, prefetch = 2;
  for (const std::uint32_t readahead : {0u, 5u}) {
    FakeStorage storage;
    ColdWorld w(600, 2, batch, prefetch, 0, 0.3, &storage, readahead);
    auto staging = std::make_shared<StagingAllocator>(0, 1 << 24);
    FakePeers peers;
    Sink sink;
    auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
    scheduler->start_epoch(0, 1);
    while (!peers.pending.empty()) complete_one(peers, 0);
    const TrainerPlan plan = w.planner->plan_node(0, 0)[0];
    std::uint64_t cold_ahead = 0;
    for (std::uint64_t i = 0; i < plan.batch_begin[prefetch + readahead]; ++i) {
      cold_ahead += w.placement.is_resident(plan.order[i]) ? 0 : 1;
    }
    EXPECT_EQ(storage.all.size(), cold_ahead) << "read-ahead " << readahead;
    EXPECT_EQ(scheduler->staged_samples(), std::uint64_t{prefetch + readahead} * batch);
    // Credits still bound what the trainer holds: prefetch batches.
    while (!storage.pending.empty()) complete_one(storage, 0);
    while (!peers.pending.empty()) complete_one(peers, 0);
    EXPECT_EQ(sink.batches.size(), prefetch);
    scheduler->close();
  }
  // Staging for about two batches: read-ahead stops at what fits, and still delivers all.
  FakeStorage storage;
  ColdWorld w(300, 2, batch, prefetch, 0, 0.3, &storage, 50);
  auto staging = std::make_shared<StagingAllocator>(0, 2 * batch * 5200);
  FakePeers peers;
  Sink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
  scheduler->start_epoch(0, 1);
  EXPECT_LT(scheduler->staged_samples(), std::uint64_t{prefetch + 50} * batch);
  const std::vector<SampleId> got = run_pass(*scheduler, peers, storage, sink, 1, 0, 5);
  ASSERT_TRUE(sink.errors.empty()) << sink.errors[0].message();
  EXPECT_EQ(got, w.planner->plan_node(0, 0)[0].order);
}

// Without cold samples the read-ahead key changes nothing (same budget as before).
TEST(StorageTier, ReadAheadIsUnusedWhenEverythingIsCached) {
  FakeStorage storage;
  ColdWorld w(300, 2, 8, 2, 0, 1.5, &storage, 10);
  ASSERT_EQ(w.placement.total_cold_samples(), 0u);
  auto staging = std::make_shared<StagingAllocator>(0, 1 << 24);
  FakePeers peers;
  Sink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, peers, sink);
  scheduler->start_epoch(0, 1);
  EXPECT_EQ(scheduler->staged_samples(), 2u * 8u);
  EXPECT_TRUE(storage.all.empty());
  scheduler->close();
}

// --- the real pool against files ---

class StorageReaderPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) / ("storage-pool-" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "c");
    Rng rng(4);
    std::vector<CatalogEntry> entries;
    for (int i = 0; i < 50; ++i) {
      std::string bytes(i == 3 ? 0 : 1 + rng.below(9000), '\0');
      for (auto& ch : bytes) ch = static_cast<char>(rng.below(256));
      const std::string rel = fmt::format("c/s{:02}.bin", i);
      std::ofstream(root_ / rel, std::ios::binary) << bytes;
      entries.push_back({rel, bytes.size(), 0});
      contents_.push_back(bytes);
    }
    catalog_ = std::move(Catalog::from_entries(std::move(entries), {"c"}).value());
    dataset_.path = root_.string();
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Completions are queued here and run by the test, as the io thread would run them.
  std::deque<std::function<void()>> posted_;
  std::mutex posted_mutex_;
  StorageReaderPool::Post post() {
    return [this](std::function<void()> f) {
      std::lock_guard lock(posted_mutex_);
      posted_.push_back(std::move(f));
    };
  }
  // Runs posted completions until `done` or a deadline (a hang fails, never blocks ctest).
  void run_until(const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::function<void()> f;
      {
        std::lock_guard lock(posted_mutex_);
        if (!posted_.empty()) {
          f = std::move(posted_.front());
          posted_.pop_front();
        }
      }
      if (f) {
        f();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    ASSERT_TRUE(done()) << "timed out";
  }

  std::filesystem::path root_;
  std::vector<std::string> contents_;
  Catalog catalog_;
  DatasetConfig dataset_;
};

TEST_F(StorageReaderPoolTest, ReadsEachGroupIntoStagingAndCompletesItOnce) {
  std::vector<std::uint8_t> staging(1 << 20, 0xee);
  // With an injected per-read delay, as the benchmarks use it: same bytes, same single completion.
  StorageReaderPool pool(catalog_, dataset_, staging.data(), 3, post(), std::chrono::microseconds(200));
  std::vector<int> completions(2, 0);
  std::vector<Status> results(2);
  std::vector<StorageRead> groups[2];
  std::uint64_t offset = 64;
  for (SampleId id = 0; id < catalog_.size(); ++id) {
    groups[id % 2].push_back({id, catalog_.sample_bytes(id), offset});
    offset += align_to_arena(catalog_.sample_bytes(id));
  }
  for (int g = 0; g < 2; ++g) {
    pool.fetch(groups[g], [&, g](const StorageOutcome& o) {
      ++completions[g];
      results[g] = o.first_error();
    });
  }
  run_until([&] { return completions[0] + completions[1] == 2; });
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(completions[g], 1);
    EXPECT_TRUE(results[g].ok()) << results[g].to_string();
    for (const StorageRead& r : groups[g]) {
      const std::string& want = contents_[r.sample];
      ASSERT_EQ(catalog_.path(r.sample), fmt::format("c/s{:02}.bin", r.sample));
      EXPECT_EQ(0, std::memcmp(want.data(), staging.data() + r.staging_offset, want.size())) << "sample " << r.sample;
    }
  }
  EXPECT_EQ(staging[0], 0xee);  // nothing written outside the reads
  EXPECT_EQ(pool.stats().reads_completed, catalog_.size());
  EXPECT_EQ(pool.stats().reads_failed, 0u);
}

// Owner-side metadata, a whole-file format: each read carries its file's path; the pool
// holds no catalog of the samples. Errors name the job's sample id and the file.
TEST_F(StorageReaderPoolTest, ReadsWithoutACatalogByThePathsTheReadsCarry) {
  const Catalog files = Catalog::of_share({}, {}, {"c"});
  std::vector<std::uint8_t> staging(1 << 20, 0xee);
  std::vector<StorageRead> reads;
  std::uint64_t offset = 64;
  for (SampleId id = 1; id < catalog_.size(); id += 3) {
    const CatalogEntry where{std::string(catalog_.path(id)), catalog_.sample_bytes(id), catalog_.label(id)};
    reads.push_back({id + 500, catalog_.sample_bytes(id), offset, where});
    offset += align_to_arena(catalog_.sample_bytes(id));
  }
  const SampleId victim = 10;  // id 510, the fourth read
  ASSERT_EQ(reads[3].sample, victim + 500);
  std::filesystem::resize_file(root_ / std::string(catalog_.path(victim)), 5);
  StorageReaderPool pool(files, dataset_, staging.data(), 2, post());
  std::optional<StorageOutcome> outcome;
  pool.fetch(reads, [&](const StorageOutcome& o) { outcome = o; });
  run_until([&] { return outcome.has_value(); });
  ASSERT_EQ(outcome->failed.size(), 1u);
  EXPECT_EQ(outcome->failed[0].first, 3u);
  const std::string message = outcome->failed[0].second.to_string();
  EXPECT_NE(message.find("cold sample 510"), std::string::npos) << message;
  EXPECT_NE(message.find(std::string(catalog_.path(victim))), std::string::npos) << message;
  for (std::size_t k = 0; k < reads.size(); ++k) {
    if (k == 3) continue;
    const std::string& want = contents_[reads[k].sample - 500];
    EXPECT_EQ(0, std::memcmp(want.data(), staging.data() + reads[k].staging_offset, want.size()))
        << "sample " << reads[k].sample;
  }
  EXPECT_EQ(staging[0], 0xee);
  EXPECT_EQ(pool.stats().reads_completed, reads.size() - 1);
}

TEST_F(StorageReaderPoolTest, AFileThatShrankIsAnErrorNamingTheFileAndOffset) {
  const SampleId victim = 10;
  std::filesystem::resize_file(root_ / std::string(catalog_.path(victim)), 5);
  std::vector<std::uint8_t> staging(1 << 20);
  StorageReaderPool pool(catalog_, dataset_, staging.data(), 2, post());
  std::optional<StorageOutcome> outcome;
  pool.fetch({{9, catalog_.sample_bytes(9), 0}, {victim, catalog_.sample_bytes(victim), 16384}},
             [&](const StorageOutcome& o) { outcome = o; });
  run_until([&] { return outcome.has_value(); });
  // Only the shrunk file's read failed, and the outcome says which one it was.
  ASSERT_EQ(outcome->failed.size(), 1u);
  EXPECT_EQ(outcome->failed[0].first, 1u);
  const std::string message = outcome->failed[0].second.to_string();
  EXPECT_NE(message.find(std::string(catalog_.path(victim))), std::string::npos) << message;
  EXPECT_NE(message.find("offset 5"), std::string::npos) << message;
  EXPECT_NE(message.find("cold sample 10"), std::string::npos) << message;
  EXPECT_EQ(pool.stats().reads_failed, 1u);
}

TEST_F(StorageReaderPoolTest, StopCompletesWhatIsLeftWithAnError) {
  std::vector<std::uint8_t> staging(1 << 20);
  StorageReaderPool pool(catalog_, dataset_, staging.data(), 1, post());
  pool.stop();
  std::optional<StorageOutcome> outcome;
  pool.fetch({{1, catalog_.sample_bytes(1), 0}}, [&](const StorageOutcome& o) { outcome = o; });
  run_until([&] { return outcome.has_value(); });
  ASSERT_EQ(outcome->failed.size(), 1u);
  EXPECT_NE(outcome->first_error().to_string().find("stopping"), std::string::npos);
}

}  // namespace storage_tier_test
}  // namespace shardmix
