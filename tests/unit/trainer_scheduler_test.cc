// The per-trainer scheduler against a fake fabric and a recording socket.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <deque>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/rng.h"
#include "common/trainer_scheduler.h"
#include "tests/unit/scheduler_world.h"

namespace shardmix {
namespace trainer_scheduler_test {

// Queued peer reads that all land (or all fail with fail_with) when the test says.
struct FakeFetcher : test_support::QueuedPeers {
  Status fail_with;
  void complete_all() {
    while (!pending.empty()) {
      auto call = std::move(pending.front());
      pending.pop_front();
      call.done(fail_with);
    }
  }
};

using test_support::RecordingSink;

// The scheduler tests' job (scheduler_world.h): catalog seed 3, everything resident.
struct World : test_support::SchedulerWorld {
  World(std::size_t n, std::uint32_t nodes, std::uint32_t batch, std::uint32_t prefetch, std::uint32_t window = 0)
      : SchedulerWorld(3, n, nodes, batch, prefetch, window) {}
};

// Node 0's trainer scheduler in world `w`, staging [base, base + bytes), queued peer reads
// and a sink recording what it sends. Tests take the parts by structured binding.
struct Rig {
  explicit Rig(const World& w, std::uint64_t staging_bytes = 1 << 20, std::uint64_t staging_base = 0)
      : staging(std::make_shared<StagingAllocator>(staging_base, staging_bytes)),
        scheduler(std::make_shared<TrainerScheduler>(w.context, 0, staging, fetcher, sink)) {}
  std::shared_ptr<StagingAllocator> staging;
  FakeFetcher fetcher;
  RecordingSink sink;
  std::shared_ptr<TrainerScheduler> scheduler;

  // The trainer goes away; once the reads in flight land, all of staging is free again.
  void close_and_expect_staging_free() {
    scheduler->close();
    fetcher.complete_all();
    EXPECT_TRUE(staging->empty());
  }
};

TEST(TrainerScheduler, DeliversThePlanInOrderWithCredits) {
  World w(200, 4, 8, 3);
  Rig rig(w);
  auto& [ring_ptr, fetcher, sink, scheduler] = rig;
  scheduler->start_epoch(0, 1);
  const auto plan = w.planner->plan_node(0, 0)[0];
  EXPECT_LE(scheduler->outstanding_batches(), 3u);
  std::vector<SampleId> delivered;
  while (sink.ends.empty()) {
    fetcher.complete_all();
    ASSERT_LE(sink.batches.size(), 3u + delivered.size() / 8 + 1);
    ASSERT_FALSE(sink.batches.empty());
    // Release the oldest sent batch, as a trainer would.
    static std::size_t released = 0;
    for (; released < sink.batches.size(); ++released) {
      const auto& b = sink.batches[released];
      for (const auto& d : b.samples) {
        delivered.push_back(d.sample_id);
        EXPECT_EQ(d.length, w.catalog.sample_bytes(d.sample_id));
        EXPECT_EQ(d.label, w.catalog.label(d.sample_id));
        const bool local = w.placement.owner[d.sample_id] == 0;
        EXPECT_EQ(d.tier, static_cast<std::uint8_t>(local ? proto::Tier::kLocal : proto::Tier::kPeer));
        if (local) {
          EXPECT_EQ(d.offset, w.placement.arena_offset[d.sample_id]);
        }
      }
      ASSERT_TRUE(scheduler->release(1, b.batch).ok());
    }
  }
  EXPECT_EQ(delivered, plan.order);
  EXPECT_EQ(sink.ends[0].samples, plan.order.size());
  EXPECT_EQ(sink.ends[0].local_samples + sink.ends[0].peer_samples, plan.order.size());
  EXPECT_TRUE(sink.errors.empty());
  // The next epoch's first batches are assembled ahead; closing frees them too.
  rig.close_and_expect_staging_free();
}

TEST(TrainerScheduler, WithoutReleasesStopsAtThePrefetchDepth) {
  World w(400, 2, 4, 2);
  Rig rig(w);
  auto& [ring_ptr, fetcher, sink, scheduler] = rig;
  scheduler->start_epoch(0, 1);
  fetcher.complete_all();
  fetcher.complete_all();
  EXPECT_EQ(sink.batches.size(), 2u);
  ASSERT_TRUE(scheduler->release(1, 0).ok());
  fetcher.complete_all();
  EXPECT_EQ(sink.batches.size(), 3u);
  EXPECT_FALSE(scheduler->release(1, 0).ok());  // not outstanding any more
}

TEST(TrainerScheduler, SmallStagingAllocatorStillDeliversEverything) {
  World w(300, 4, 6, 4);
  Rig rig(w, 6 * 5200, 4096);
  auto& [ring_ptr, fetcher, sink, scheduler] = rig;
  StagingAllocator& ring = *ring_ptr;  // room for about one batch of peer samples
  scheduler->start_epoch(1, 2);
  std::size_t released = 0;
  for (int guard = 0; sink.ends.empty() && guard < 10000; ++guard) {
    fetcher.complete_all();
    for (; released < sink.batches.size(); ++released) {
      for (const auto& d : sink.batches[released].samples) {
        if (d.region == static_cast<std::uint8_t>(proto::Region::kStaging)) {
          EXPECT_GE(d.offset, 4096u);
          EXPECT_LE(d.offset + d.length, 4096u + ring.capacity());
        }
      }
      ASSERT_TRUE(scheduler->release(2, sink.batches[released].batch).ok());
    }
  }
  ASSERT_EQ(sink.ends.size(), 1u);
  EXPECT_EQ(sink.ends[0].batches, w.shape.batches_per_trainer);
  // The next epoch's first batches are assembled ahead; closing frees them too.
  rig.close_and_expect_staging_free();
}

TEST(TrainerScheduler, FetchErrorReachesTheTrainer) {
  World w(100, 2, 10, 2);
  Rig rig(w);
  auto& [ring_ptr, fetcher, sink, scheduler] = rig;
  fetcher.fail_with = make_error(StatusCode::kUnavailable, "peer rank 1 is gone");
  scheduler->start_epoch(0, 1);
  fetcher.complete_all();
  ASSERT_EQ(sink.errors.size(), 1u);
  EXPECT_NE(sink.errors[0].message().find("peer rank 1"), std::string::npos);
}

TEST(TrainerScheduler, ClosingMidEpochFreesStagingWhenFetchesLand) {
  World w(200, 4, 8, 4);
  Rig rig(w);
  auto& [ring_ptr, fetcher, sink, scheduler] = rig;
  StagingAllocator& ring = *ring_ptr;
  scheduler->start_epoch(0, 1);
  ASSERT_FALSE(fetcher.pending.empty());
  scheduler->close();
  EXPECT_FALSE(ring.empty());  // reads in flight still target the ring
  fetcher.complete_all();
  EXPECT_TRUE(ring.empty());
  EXPECT_TRUE(sink.batches.empty());
}

TEST(TrainerScheduler, RestartingAnEpochMidwayStartsOver) {
  World w(200, 2, 8, 2);
  Rig rig(w);
  auto& [ring_ptr, fetcher, sink, scheduler] = rig;
  scheduler->start_epoch(0, 1);
  fetcher.complete_all();
  scheduler->start_epoch(1, 2);
  sink.batches.clear();
  std::size_t released = 0;
  for (int guard = 0; sink.ends.size() < 1 && guard < 1000; ++guard) {
    fetcher.complete_all();
    for (; released < sink.batches.size(); ++released) {
      EXPECT_EQ(sink.batches[released].epoch, 1u);
      ASSERT_TRUE(scheduler->release(2, sink.batches[released].batch).ok());
    }
  }
  ASSERT_EQ(sink.ends.size(), 1u);
  EXPECT_EQ(sink.ends[0].epoch, 1u);
  // The next epoch's first batches are assembled ahead; closing frees them too.
  rig.close_and_expect_staging_free();
}

// Consumes the current pass completely (completing fetches, releasing every batch).
// `from` is the number of batches the sink had before the pass's start_epoch.
void drain(TrainerScheduler& scheduler, FakeFetcher& fetcher, RecordingSink& sink, std::uint64_t stream,
           std::size_t from, std::size_t ends, std::vector<SampleId>& delivered) {
  std::size_t released = from;
  for (int guard = 0; sink.ends.size() == ends && guard < 100000; ++guard) {
    fetcher.complete_all();
    for (; released < sink.batches.size(); ++released) {
      for (const auto& d : sink.batches[released].samples) delivered.push_back(d.sample_id);
      ASSERT_TRUE(scheduler.release(stream, sink.batches[released].batch).ok());
    }
  }
}

TEST(TrainerScheduler, WorksAheadAcrossTheEpochBoundaryAndAdoptsIt) {
  World w(300, 4, 8, 4);
  Rig rig(w);
  auto& [ring_ptr, fetcher, sink, scheduler] = rig;
  scheduler->start_epoch(0, 1);
  std::vector<SampleId> e0;
  drain(*scheduler, fetcher, sink, 1, 0, 0, e0);
  EXPECT_EQ(e0, w.planner->plan_node(0, 0)[0].order);
  // Epoch 0 is over and nothing asked for epoch 1 yet, but its reads are under way.
  EXPECT_FALSE(fetcher.pending.empty());
  EXPECT_EQ(scheduler->staged_samples(), 4u * 8u);
  const std::size_t sent_before = sink.batches.size();
  scheduler->start_epoch(1, 2);
  std::vector<SampleId> e1;
  drain(*scheduler, fetcher, sink, 2, sent_before, 1, e1);
  EXPECT_EQ(e1, w.planner->plan_node(1, 0)[0].order);  // exactly the plan, in order
  for (std::size_t i = sent_before; i < sink.batches.size(); ++i) {
    EXPECT_EQ(sink.batches[i].stream, 2u);
    EXPECT_EQ(sink.batches[i].epoch, 1u);
  }
  EXPECT_EQ(sink.ends.back().samples, e1.size());
}

// A directory that answers like the world's until its `fail_from`-th resolve (counting
// from 0), then fails as an owner-side exchange does when an owner cannot be asked.
struct FailingDirectory : SampleDirectory {
  const SampleDirectory& inner;
  int fail_from;
  mutable int calls = 0;
  FailingDirectory(const SampleDirectory& d, int from) : inner(d), fail_from(from) {}
  Result<std::unique_ptr<const PlanDirectory>> resolve(std::span<const SampleId> order) const override {
    if (calls++ >= fail_from) return make_error(StatusCode::kUnavailable, "owner daemon rank 1 did not answer");
    return inner.resolve(order);
  }
  bool has_cold_samples() const override { return inner.has_cold_samples(); }
  DirectoryBytes memory_bytes() const override { return inner.memory_bytes(); }
};

TEST(TrainerScheduler, APlanThatCannotBeResolvedFailsItsEpochOnlyAndNamesTheOwner) {
  World w(300, 4, 8, 4);
  const FailingDirectory failing(*w.directory, 1);  // epoch 0 resolves, the epoch read ahead does not
  w.context.directory = &failing;
  Rig rig(w);
  auto& [ring_ptr, fetcher, sink, scheduler] = rig;
  scheduler->start_epoch(0, 1);
  std::vector<SampleId> e0;
  drain(*scheduler, fetcher, sink, 1, 0, 0, e0);
  // Epoch 0 is whole and ends normally although epoch 1's plan failed while it was served.
  EXPECT_EQ(e0, w.planner->plan_node(0, 0)[0].order);
  ASSERT_EQ(sink.ends.size(), 1u);
  EXPECT_TRUE(sink.errors.empty());
  EXPECT_EQ(failing.calls, 2);
  EXPECT_EQ(scheduler->staged_samples(), 0u);  // nothing of the failed plan was staged
  // Asking for epoch 1 reports the failure, naming the owner, and sends no batch of it.
  const std::size_t sent_before = sink.batches.size();
  scheduler->start_epoch(1, 2);
  fetcher.complete_all();
  ASSERT_EQ(sink.errors.size(), 1u);
  EXPECT_NE(sink.errors[0].message().find("owner daemon rank 1"), std::string::npos) << sink.errors[0].message();
  EXPECT_NE(sink.errors[0].message().find("epoch 1"), std::string::npos) << sink.errors[0].message();
  EXPECT_EQ(sink.batches.size(), sent_before);
  rig.close_and_expect_staging_free();
}

TEST(TrainerScheduler, DiscardsAheadWorkWhenAnotherEpochIsAsked) {
  World w(300, 4, 8, 4);
  Rig rig(w);
  auto& [ring_ptr, fetcher, sink, scheduler] = rig;
  scheduler->start_epoch(0, 1);
  std::vector<SampleId> e0;
  drain(*scheduler, fetcher, sink, 1, 0, 0, e0);
  ASSERT_FALSE(fetcher.pending.empty());  // epoch 1 work in flight
  const std::size_t sent_before = sink.batches.size();
  scheduler->start_epoch(5, 2);             // the trainer skips ahead
  std::vector<SampleId> e5;
  drain(*scheduler, fetcher, sink, 2, sent_before, 1, e5);
  EXPECT_EQ(e5, w.planner->plan_node(5, 0)[0].order);
  scheduler->close();
  fetcher.complete_all();
  EXPECT_TRUE(ring_ptr->empty());
}

// The quality figures of EpochEnd are those of the batches actually sent: label entropy
// as shuffle_metrics computes it, affinity against the previous epoch (none before).
TEST(TrainerScheduler, EpochEndCarriesTheQualityOfWhatWasSent) {
  World w(300, 3, 8, 3);
  Rig rig(w, 1 << 24);
  auto& [staging, fetcher, sink, scheduler] = rig;
  std::vector<std::set<SampleId>> received(2);
  for (std::uint64_t e = 0; e < 2; ++e) {
    const std::size_t from = sink.batches.size();
    scheduler->start_epoch(e, e + 1);
    std::vector<SampleId> ids;
    drain(*scheduler, fetcher, sink, e + 1, from, e, ids);
    ASSERT_EQ(sink.ends.size(), e + 1);
    received[e].insert(ids.begin(), ids.end());
    BatchLabelEntropy expected(7);
    for (std::size_t i = from; i < sink.batches.size(); ++i) {
      if (sink.batches[i].epoch != e) continue;
      std::vector<std::int32_t> labels;
      for (const auto& d : sink.batches[i].samples) labels.push_back(d.label);
      expected.add_batch(labels);
    }
    const LabelEntropySummary want = expected.summary();
    const proto::EpochStats& got = sink.ends[e];
    EXPECT_EQ(got.batches_scored, want.scored);
    EXPECT_DOUBLE_EQ(got.label_entropy_mean, want.mean);
    EXPECT_DOUBLE_EQ(got.label_entropy_p5, want.p5);
    EXPECT_GT(got.label_entropy_mean, 0.5);  // 7 classes spread over every node
    EXPECT_DOUBLE_EQ(got.exchange_fraction, 1.0);
  }
  EXPECT_TRUE(std::isnan(sink.ends[0].affinity));
  std::size_t again = 0;
  for (SampleId id : received[1]) again += received[0].count(id);
  EXPECT_DOUBLE_EQ(sink.ends[1].affinity, static_cast<double>(again) / static_cast<double>(received[1].size()));
  EXPECT_LT(sink.ends[1].affinity, 0.9);  // a fresh global permutation every epoch
}

// --- shuffle.window: opportunistic ordering ---

// The plan position of every sample of a trainer's plan.
std::map<SampleId, std::uint64_t> positions_of(const TrainerPlan& plan) {
  std::map<SampleId, std::uint64_t> at;
  for (std::uint64_t i = 0; i < plan.order.size(); ++i) at[plan.order[i]] = i;
  return at;
}

// Any fetch completion order, any release pattern, any window: every planned sample is
// delivered exactly once, batch j has the planned size of batch j, and a sample delivered
// in batch j sits before plan position batch_begin[j] + size(j) + W.
RC_GTEST_PROP(TrainerSchedulerWindow, DeliversEveryPlannedSampleOnceWithinTheWindow, ()) {
  const auto n = *rc::gen::inRange<std::size_t>(1, 260);
  const auto nodes = *rc::gen::inRange<std::uint32_t>(1, 5);
  const auto batch = *rc::gen::inRange<std::uint32_t>(1, 12);
  const auto prefetch = *rc::gen::inRange<std::uint32_t>(1, 5);
  const auto window = *rc::gen::element<std::uint32_t>(0, 1, 3, 16, 64, 1000);
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  World w(n, nodes, batch, prefetch, window);
  // Enough staging that nothing can run out: everything staged ahead plus two batches.
  const std::uint64_t capacity = (std::uint64_t{prefetch} * batch + window + 2 * batch) * 5200;
  Rig rig(w, capacity);
  auto& [staging, fetcher, sink, scheduler] = rig;
  const TrainerPlan plan = w.planner->plan_node(2, 0)[0];
  const auto at = positions_of(plan);
  scheduler->start_epoch(2, 7);
  Rng choices(seed);
  std::deque<std::uint64_t> held;  // batches the trainer has and has not released
  std::size_t seen = 0;
  for (int guard = 0; sink.ends.empty() && guard < 100000; ++guard) {
    for (; seen < sink.batches.size(); ++seen) held.push_back(sink.batches[seen].batch);
    const bool can_complete = !fetcher.pending.empty();
    if (can_complete && (held.empty() || choices.below(3) != 0)) {
      // Complete a random pending fetch: later reads may land first.
      const std::size_t k = choices.below(fetcher.pending.size());
      auto call = std::move(fetcher.pending[k]);
      fetcher.pending.erase(fetcher.pending.begin() + static_cast<std::ptrdiff_t>(k));
      call.done(Status::ok_status());
    } else {
      RC_ASSERT(!held.empty());  // otherwise nothing can move: a hang
      RC_ASSERT(scheduler->release(7, held.front()).ok());
      held.pop_front();
    }
  }
  for (; seen < sink.batches.size(); ++seen) held.push_back(sink.batches[seen].batch);
  RC_ASSERT(sink.errors.empty());
  RC_ASSERT(sink.ends.size() == 1u);
  RC_ASSERT(sink.batches.size() == plan.num_batches());
  std::multiset<SampleId> delivered;
  std::uint64_t substituted = 0;
  for (std::uint64_t j = 0; j < sink.batches.size(); ++j) {
    const auto& b = sink.batches[j];
    RC_ASSERT(b.batch == j);
    RC_ASSERT(b.stream == 7u);
    const std::uint64_t begin = plan.batch_begin[j];
    const std::uint64_t size = plan.batch_begin[j + 1] - begin;
    RC_ASSERT(b.samples.size() == size);
    for (const auto& d : b.samples) {
      RC_ASSERT(at.count(d.sample_id) == 1u);
      const std::uint64_t position = at.at(d.sample_id);
      RC_ASSERT(position < begin + size + window);
      if (position < begin || position >= begin + size) ++substituted;
      delivered.insert(d.sample_id);
    }
  }
  RC_ASSERT(delivered == std::multiset<SampleId>(plan.order.begin(), plan.order.end()));
  RC_ASSERT(sink.ends[0].substituted_samples == substituted);
  RC_ASSERT(sink.ends[0].window == window);
  if (window == 0) RC_ASSERT(substituted == 0u);
  scheduler->close();
  fetcher.complete_all();
  RC_ASSERT(staging->empty());
}

// Whether `plan` (trainer 0 of `w`, on node 0) sets up the case below: batch 0 holds samples
// of node 1, and for each of them a stand-in of the same label that node 0 caches waits
// among the next `window` planned positions. Local samples are ready as soon as they are
// staged (all of the window is, at the start: prefetch x batch + W), so such a stand-in is
// ready whenever the scheduler gives up on node 1; a peer's might not have landed yet.
bool slow_node_1_has_stand_ins(const World& w, const TrainerPlan& plan, std::uint64_t window) {
  const std::uint64_t end = plan.batch_begin[1];
  const std::uint64_t window_end = std::min<std::uint64_t>(end + window, plan.order.size());
  std::map<std::int32_t, int> unmatched;  // label -> node-1 samples of batch 0 minus stand-ins
  bool batch_0_needs_node_1 = false;
  for (std::uint64_t i = plan.batch_begin[0]; i < window_end; ++i) {
    const SampleId id = plan.order[i];
    if (i < end && w.placement.owner[id] == 1) {
      ++unmatched[w.catalog.label(id)];
      batch_0_needs_node_1 = true;
    } else if (i >= end && w.placement.owner[id] == 0) {
      --unmatched[w.catalog.label(id)];
    }
  }
  return batch_0_needs_node_1 &&
         std::none_of(unmatched.begin(), unmatched.end(), [](const auto& label_count) { return label_count.second > 0; });
}

// Node 1's reads hang: W = 0 waits for them, W = 64 overtakes them with same-label stand-ins.
// The epoch is chosen from the plans: the first one that sets up that case (some epochs have
// no node-1 sample in batch 0, or a late sample without a local stand-in of its label).
TEST(TrainerSchedulerWindow, ASlowPeerIsOvertakenOnlyWithAWindow) {
  constexpr std::uint32_t kWindow = 64;
  std::uint64_t epoch = 0;
  {
    World w(400, 4, 8, 2, kWindow);
    while (epoch < 32 && !slow_node_1_has_stand_ins(w, w.planner->plan_node(epoch, 0)[0], kWindow)) ++epoch;
    ASSERT_LT(epoch, 32u) << "no epoch of this world has a node-1 sample in batch 0 with stand-ins for it";
  }
  for (const std::uint32_t window : {0u, kWindow}) {
    World w(400, 4, 8, 2, window);
    Rig rig(w, 1 << 24);
    // Plain references, not a structured binding: the lambda below captures `fetcher`, which
    // clang 14 (the asan stage) does not allow for a binding.
    auto& fetcher = rig.fetcher;
    auto& sink = rig.sink;
    auto& scheduler = rig.scheduler;
    scheduler->start_epoch(epoch, 1);
    const auto plan = w.planner->plan_node(epoch, 0)[0];
    // Every read from node 1 hangs; the others land.
    auto complete_fast = [&] {
      for (bool more = true; more;) {
        more = false;
        for (std::size_t k = 0; k < fetcher.pending.size(); ++k) {
          const bool slow = std::any_of(fetcher.pending[k].reads.begin(), fetcher.pending[k].reads.end(),
                                        [](const PeerRead& r) { return r.peer == 1; });
          if (slow) continue;
          auto call = std::move(fetcher.pending[k]);
          fetcher.pending.erase(fetcher.pending.begin() + static_cast<std::ptrdiff_t>(k));
          call.done(Status::ok_status());
          more = true;
          break;
        }
      }
    };
    std::size_t released = 0;
    for (int round = 0; round < 6; ++round) {
      complete_fast();
      for (; released < sink.batches.size(); ++released) {
        ASSERT_TRUE(scheduler->release(1, sink.batches[released].batch).ok());
      }
    }
    if (window == 0) {
      EXPECT_TRUE(sink.batches.empty()) << "W = 0 must wait for the slow read";
    } else {
      EXPECT_GE(sink.batches.size(), 3u) << "W > 0 must overtake the slow read";
      for (const auto& b : sink.batches) {
        for (const auto& d : b.samples) EXPECT_NE(d.owner, 1u);
      }
      // Stand-ins carry the late samples' labels: batch 0 keeps its planned label mix.
      std::vector<std::int32_t> planned_labels, delivered_labels;
      for (std::uint64_t i = plan.batch_begin[0]; i < plan.batch_begin[1]; ++i) {
        planned_labels.push_back(w.catalog.label(plan.order[i]));
      }
      ASSERT_FALSE(sink.batches.empty());
      for (const auto& d : sink.batches[0].samples) delivered_labels.push_back(d.label);
      std::sort(planned_labels.begin(), planned_labels.end());
      std::sort(delivered_labels.begin(), delivered_labels.end());
      EXPECT_EQ(delivered_labels, planned_labels);
    }
    // Once the slow peer answers, the epoch completes with every sample.
    std::vector<SampleId> all;
    for (const auto& b : sink.batches) {
      for (const auto& d : b.samples) all.push_back(d.sample_id);
    }
    drain(*scheduler, fetcher, sink, 1, released, 0, all);
    std::sort(all.begin(), all.end());
    std::vector<SampleId> expected = plan.order;
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(all, expected);
    ASSERT_EQ(sink.ends.size(), 1u);
    if (window > 0) {
      EXPECT_GT(sink.ends[0].substituted_samples, 0u);
    }
  }
}

// Two runs with the same inputs and W = 0 give identical batches, whatever the order in
// which reads land.
TEST(TrainerSchedulerWindow, ZeroWindowIsIndependentOfReadTiming) {
  std::vector<std::vector<SampleId>> runs;
  for (const std::uint64_t seed : {1u, 2u}) {
    World w(300, 3, 7, 3, 0);
    Rig rig(w, 1 << 24);
    auto& [staging, fetcher, sink, scheduler] = rig;
    scheduler->start_epoch(0, 1);
    Rng choices(seed);
    std::size_t released = 0;
    for (int guard = 0; sink.ends.empty() && guard < 100000; ++guard) {
      if (!fetcher.pending.empty() && choices.below(2) == 0) {
        const std::size_t k = choices.below(fetcher.pending.size());
        auto call = std::move(fetcher.pending[k]);
        fetcher.pending.erase(fetcher.pending.begin() + static_cast<std::ptrdiff_t>(k));
        call.done(Status::ok_status());
      } else if (released < sink.batches.size()) {
        ASSERT_TRUE(scheduler->release(1, sink.batches[released++].batch).ok());
      } else {
        fetcher.complete_all();
      }
    }
    std::vector<SampleId> order;
    for (const auto& b : sink.batches) {
      for (const auto& d : b.samples) order.push_back(d.sample_id);
    }
    runs.push_back(order);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_FALSE(runs[0].empty());
}

// Too little staging for what the window holds back: a clear error, not a hang.
TEST(TrainerSchedulerWindow, StagingTooSmallForTheWindowIsAnErrorNotAHang) {
  World w(400, 4, 8, 1, 64);
  // About one and a half batches of peer samples.
  Rig rig(w, 12 * 5200);
  auto& [staging, fetcher, sink, scheduler] = rig;
  scheduler->start_epoch(0, 1);
  std::size_t released = 0;
  // Reads from node 1 hang until nothing else can move, then land.
  for (int guard = 0; sink.ends.empty() && sink.errors.empty() && guard < 100000; ++guard) {
    bool moved = false;
    for (std::size_t k = 0; k < fetcher.pending.size(); ++k) {
      if (fetcher.pending[k].reads.front().peer == 1) continue;
      auto call = std::move(fetcher.pending[k]);
      fetcher.pending.erase(fetcher.pending.begin() + static_cast<std::ptrdiff_t>(k));
      call.done(Status::ok_status());
      moved = true;
      break;
    }
    for (; released < sink.batches.size(); ++released) {
      ASSERT_TRUE(scheduler->release(1, sink.batches[released].batch).ok());
      moved = true;
    }
    if (!moved) fetcher.complete_all();
  }
  // Either it got through (the slow reads landed in time) or it said why it could not.
  if (!sink.errors.empty()) {
    EXPECT_NE(sink.errors[0].message().find("staging_bytes_per_trainer"), std::string::npos)
        << sink.errors[0].message();
  } else {
    EXPECT_EQ(sink.ends.size(), 1u);
  }
}

// A fetcher whose reads land before fetch() returns.
struct InlineFetcher : PeerFetcher {
  void fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) override {
    (void)reads;
    done(Status::ok_status());
  }
};

// Peer bytes of the largest planned batch of local trainer 0 of node 0 (the daemon's floor
// for service.staging_bytes_per_trainer is the largest batch's bytes).
std::uint64_t largest_peer_batch_bytes(const World& w, std::uint64_t epochs) {
  std::uint64_t largest = 0;
  for (std::uint64_t e = 0; e < epochs; ++e) {
    const TrainerPlan plan = w.planner->plan_node(e, 0)[0];
    for (std::uint64_t j = 0; j < plan.num_batches(); ++j) {
      std::uint64_t bytes = 0;
      for (std::uint64_t i = plan.batch_begin[j]; i < plan.batch_begin[j + 1]; ++i) {
        if (w.placement.owner[plan.order[i]] != 0) bytes += align_to_arena(w.catalog.sample_bytes(plan.order[i]));
      }
      largest = std::max(largest, bytes);
    }
  }
  return largest;
}

// Regression (review of the window commit): staging of exactly one largest batch must
// deliver everything, whether reads land later or inline, with and without a window. The
// first extent allocator started a new batch wherever its cursor was and reported a
// false "staging too small".
TEST(TrainerScheduler, MinimumStagingDeliversEverything) {
  for (const std::uint32_t window : {0u, 4u}) {
    for (const bool inline_reads : {false, true}) {
      World w(300, 4, 8, 1, window);
      auto staging = std::make_shared<StagingAllocator>(0, largest_peer_batch_bytes(w, 3));
      FakeFetcher later;
      InlineFetcher now;
      PeerFetcher& fetcher = inline_reads ? static_cast<PeerFetcher&>(now) : later;
      RecordingSink sink;
      auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, staging, fetcher, sink);
      for (std::uint64_t e = 0; e < 2; ++e) {
        const std::size_t from = sink.batches.size();
        scheduler->start_epoch(e, e + 1);
        std::vector<SampleId> got;
        drain(*scheduler, later, sink, e + 1, from, e, got);
        ASSERT_TRUE(sink.errors.empty()) << "W " << window << " inline " << inline_reads << ": "
                                         << sink.errors[0].message();
        ASSERT_EQ(sink.ends.size(), e + 1);
        std::sort(got.begin(), got.end());
        std::vector<SampleId> want = w.planner->plan_node(e, 0)[0].order;
        std::sort(want.begin(), want.end());
        EXPECT_EQ(got, want);
      }
    }
  }
}

TEST(StagingAllocator, AllocatesFirstFitAndRefusesWhatDoesNotFit) {
  StagingAllocator staging(100, 1000);
  auto a = staging.allocate(400);
  auto b = staging.allocate(400);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, 100u);
  EXPECT_EQ(*b, 500u);
  EXPECT_FALSE(staging.allocate(300));  // 200 left
  staging.release(*a, 400);
  auto c = staging.allocate(300);  // the lowest hole that fits
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, 100u);
  EXPECT_FALSE(staging.allocate(250));  // free: 100 between c and b, 200 after b
  staging.release(*b, 400);
  staging.release(*c, 300);
  EXPECT_TRUE(staging.empty());
  EXPECT_FALSE(staging.allocate(1001));
  auto whole = staging.allocate(1000);  // everything coalesced again
  ASSERT_TRUE(whole);
  EXPECT_EQ(*whole, 100u);
}

TEST(StagingAllocator, AnEmptyAllocatorFitsAnythingUpToItsCapacity) {
  StagingAllocator staging(0, 1000);
  auto a = staging.allocate(300);
  ASSERT_TRUE(a);
  staging.release(*a, 300);
  auto b = staging.allocate(1000);  // the cursor must not split the empty area
  ASSERT_TRUE(b);
  EXPECT_EQ(*b, 0u);
}

TEST(StagingAllocator, ReleaseAllWakesTheWaiterOnce) {
  StagingAllocator staging(0, 1000);
  auto a = staging.allocate(600);
  ASSERT_TRUE(a);
  int woken = 0;
  staging.wait_for_release([&] { ++woken; });
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges = {{*a, 200}, {*a + 200, 200}, {*a + 400, 200}};
  staging.release_all(ranges);
  EXPECT_EQ(woken, 1);
  EXPECT_TRUE(staging.empty());
}

TEST(StagingAllocatorDeathTest, FreeingFreeBytesAborts) {
  StagingAllocator staging(0, 1000);
  auto a = staging.allocate(100);
  ASSERT_TRUE(a);
  staging.release(*a, 100);
  EXPECT_DEATH(staging.release(*a, 100), "frees free bytes");
}

TEST(StagingAllocator, FreesSubRangesOutOfOrderAndWakesTheWaiter) {
  StagingAllocator staging(0, 1000);
  auto a = staging.allocate(600);
  ASSERT_TRUE(a);
  int woken = 0;
  staging.wait_for_release([&] { ++woken; });
  staging.release(*a + 200, 200);  // the middle of the allocation
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(staging.bytes_in_use(), 400u);
  auto b = staging.allocate(500);  // 400 at the end + 200 in the middle: neither fits 500
  EXPECT_FALSE(b);
  auto c = staging.allocate(200);
  ASSERT_TRUE(c);
  staging.release(*a, 200);
  staging.release(*a + 400, 200);
  staging.release(*c, 200);
  EXPECT_EQ(woken, 1);  // the waiter fires once
  EXPECT_TRUE(staging.empty());
  EXPECT_TRUE(staging.allocate(1000));
}

}  // namespace trainer_scheduler_test
}  // namespace shardmix
