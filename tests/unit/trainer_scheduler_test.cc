// The per-trainer scheduler against a fake fabric and a recording socket.
#include <gtest/gtest.h>

#include <deque>
#include <set>

#include <fmt/format.h>

#include "common/rng.h"
#include "server/trainer_scheduler.h"

namespace shardmix {
namespace {

struct FakeFetcher : PeerFetcher {
  struct Call {
    std::vector<PeerRead> reads;
    std::function<void(const Status&)> done;
  };
  std::deque<Call> pending;
  Status fail_with;
  void fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) override {
    pending.push_back({std::move(reads), std::move(done)});
  }
  void complete_all() {
    while (!pending.empty()) {
      auto call = std::move(pending.front());
      pending.pop_front();
      call.done(fail_with);
    }
  }
};

struct RecordingSink : FrameSink {
  std::vector<proto::BatchFrame> batches;
  std::vector<proto::EpochStats> ends;
  std::vector<Status> errors;
  void send_batch(const proto::BatchFrame& b) override { batches.push_back(b); }
  void send_epoch_end(const proto::EpochStats& s) override { ends.push_back(s); }
  void send_error(const Status& s) override { errors.push_back(s); }
};

struct World {
  Catalog catalog;
  PlanShape shape;
  Placement placement;
  std::unique_ptr<EpochPlanner> planner;
  SchedulerContext context;

  World(std::size_t n, std::uint32_t nodes, std::uint32_t batch, std::uint32_t prefetch) {
    std::vector<CatalogEntry> entries;
    Rng rng(3);
    for (std::size_t i = 0; i < n; ++i) {
      entries.push_back({fmt::format("s{}", i), 100 + rng.below(5000), static_cast<std::int32_t>(i % 7)});
    }
    catalog = std::move(Catalog::from_entries(std::move(entries), {}).value());
    shape = make_plan_shape(n, JobShape{nodes, 1, batch, false});
    placement = make_placement(catalog.sizes(), shape, PlacementPolicy::kBalanced, 1);
    ShuffleConfig shuffle;
    shuffle.seed = 5;
    planner = std::make_unique<EpochPlanner>(shape, placement, shuffle);
    context = SchedulerContext{&catalog, &placement, planner.get(), 0, prefetch};
  }
};

TEST(TrainerScheduler, DeliversThePlanInOrderWithCredits) {
  World w(200, 4, 8, 3);
  auto ring_ptr = std::make_shared<StagingRing>(0, 1 << 20);
  StagingRing& ring = *ring_ptr;
  FakeFetcher fetcher;
  RecordingSink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, ring_ptr, fetcher, sink);
  scheduler->start_epoch(0, 1);
  const auto plan = w.planner->plan_node(0, 0)[0];
  EXPECT_LE(scheduler->live_batches(), 3u);
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
  scheduler->close();
  fetcher.complete_all();
  EXPECT_TRUE(ring.empty());
}

TEST(TrainerScheduler, WithoutReleasesStopsAtThePrefetchDepth) {
  World w(400, 2, 4, 2);
  auto ring_ptr = std::make_shared<StagingRing>(0, 1 << 20);
  FakeFetcher fetcher;
  RecordingSink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, ring_ptr, fetcher, sink);
  scheduler->start_epoch(0, 1);
  fetcher.complete_all();
  fetcher.complete_all();
  EXPECT_EQ(sink.batches.size(), 2u);
  ASSERT_TRUE(scheduler->release(1, 0).ok());
  fetcher.complete_all();
  EXPECT_EQ(sink.batches.size(), 3u);
  EXPECT_FALSE(scheduler->release(1, 0).ok());  // not outstanding any more
}

TEST(TrainerScheduler, SmallStagingRingStillDeliversEverything) {
  World w(300, 4, 6, 4);
  auto ring_ptr = std::make_shared<StagingRing>(4096, 6 * 5200);
  StagingRing& ring = *ring_ptr;  // room for about one batch of peer samples
  FakeFetcher fetcher;
  RecordingSink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, ring_ptr, fetcher, sink);
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
  scheduler->close();
  fetcher.complete_all();
  EXPECT_TRUE(ring.empty());
}

TEST(TrainerScheduler, FetchErrorReachesTheTrainer) {
  World w(100, 2, 10, 2);
  auto ring_ptr = std::make_shared<StagingRing>(0, 1 << 20);
  FakeFetcher fetcher;
  fetcher.fail_with = make_error(StatusCode::kUnavailable, "peer rank 1 is gone");
  RecordingSink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, ring_ptr, fetcher, sink);
  scheduler->start_epoch(0, 1);
  fetcher.complete_all();
  ASSERT_EQ(sink.errors.size(), 1u);
  EXPECT_NE(sink.errors[0].message().find("peer rank 1"), std::string::npos);
}

TEST(TrainerScheduler, ClosingMidEpochFreesStagingWhenFetchesLand) {
  World w(200, 4, 8, 4);
  auto ring_ptr = std::make_shared<StagingRing>(0, 1 << 20);
  StagingRing& ring = *ring_ptr;
  FakeFetcher fetcher;
  RecordingSink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, ring_ptr, fetcher, sink);
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
  auto ring_ptr = std::make_shared<StagingRing>(0, 1 << 20);
  StagingRing& ring = *ring_ptr;
  FakeFetcher fetcher;
  RecordingSink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, ring_ptr, fetcher, sink);
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
  scheduler->close();
  fetcher.complete_all();
  EXPECT_TRUE(ring.empty());
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
  auto ring_ptr = std::make_shared<StagingRing>(0, 1 << 20);
  FakeFetcher fetcher;
  RecordingSink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, ring_ptr, fetcher, sink);
  scheduler->start_epoch(0, 1);
  std::vector<SampleId> e0;
  drain(*scheduler, fetcher, sink, 1, 0, 0, e0);
  EXPECT_EQ(e0, w.planner->plan_node(0, 0)[0].order);
  // Epoch 0 is over and nothing asked for epoch 1 yet, but its reads are under way.
  EXPECT_FALSE(fetcher.pending.empty());
  EXPECT_EQ(scheduler->live_batches(), 4u);
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

TEST(TrainerScheduler, DiscardsAheadWorkWhenAnotherEpochIsAsked) {
  World w(300, 4, 8, 4);
  auto ring_ptr = std::make_shared<StagingRing>(0, 1 << 20);
  FakeFetcher fetcher;
  RecordingSink sink;
  auto scheduler = std::make_shared<TrainerScheduler>(w.context, 0, ring_ptr, fetcher, sink);
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

TEST(StagingRing, WrapsAndRefusesWhatDoesNotFit) {
  auto ring_ptr = std::make_shared<StagingRing>(100, 1000);
  StagingRing& ring = *ring_ptr;
  auto a = ring.allocate(400);
  auto b = ring.allocate(400);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, 100u);
  EXPECT_EQ(*b, 500u);
  EXPECT_FALSE(ring.allocate(300));  // 200 left at the end, 0 at the start
  ring.release(*a);
  auto c = ring.allocate(300);  // wraps to the start
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, 100u);
  EXPECT_FALSE(ring.allocate(150));  // only 100 between c and b
  ring.release(*b);
  ring.release(*c);
  EXPECT_TRUE(ring.empty());
  EXPECT_FALSE(ring.allocate(1001));
}

}  // namespace
}  // namespace shardmix
