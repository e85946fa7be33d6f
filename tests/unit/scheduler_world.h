// Shared fixtures of the scheduler tests (trainer_scheduler_test, storage_tier_test,
// rotation_test): a small synthetic job (catalog, plan shape, placement, planner,
// scheduler context), a FrameSink that records what the scheduler sends, and peer and
// storage fetchers whose calls queue up until the test completes them.
// Thread-safety: none; test-only values.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "common/catalog.h"
#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/rng.h"
#include "common/trainer_scheduler.h"

namespace shardmix::test_support {

struct RecordingSink : FrameSink {
  std::vector<proto::BatchFrame> batches;
  std::vector<proto::EpochStats> ends;
  std::vector<Status> errors;
  void send_batch(const proto::BatchFrame& b) override { batches.push_back(b); }
  void send_epoch_end(const proto::EpochStats& s) override { ends.push_back(s); }
  void send_error(const Status& s) override { errors.push_back(s); }
};

// One fetch call of either kind, held until the test completes it with done().
template <typename Read, typename Result = Status>
struct Pending {
  std::vector<Read> reads;
  std::function<void(const Result&)> done;
};

struct QueuedPeers : PeerFetcher {
  std::deque<Pending<PeerRead>> pending;
  void fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) override {
    pending.push_back({std::move(reads), std::move(done)});
  }
};

struct QueuedStorage : StorageFetcher {
  std::deque<Pending<StorageRead, StorageOutcome>> pending;
  std::vector<StorageRead> all;  // every read ever posted, in posting order
  void fetch(std::vector<StorageRead> reads, std::function<void(const StorageOutcome&)> done) override {
    all.insert(all.end(), reads.begin(), reads.end());
    pending.push_back({std::move(reads), std::move(done)});
  }
};

// n samples of 100..5099 bytes (drawn from `catalog_seed`), labels i % 7, one trainer per
// node, balanced placement; the scheduler context is node 0's. With resident_share < 1 each
// node's cache.capacity is resident_share x (dataset bytes / nodes) (with < 1 some samples
// are cold, read through `storage`); without it nothing limits the cache.
struct SchedulerWorld {
  Catalog catalog;
  PlanShape shape;
  Placement placement;
  std::unique_ptr<EpochPlanner> planner;
  std::unique_ptr<GlobalDirectory> directory;
  SchedulerContext context;

  SchedulerWorld(std::uint64_t catalog_seed, std::size_t n, std::uint32_t nodes, std::uint32_t batch,
                 std::uint32_t prefetch, std::uint32_t window, std::optional<double> resident_share = std::nullopt,
                 StorageFetcher* storage = nullptr, std::uint32_t readahead = 0) {
    std::vector<CatalogEntry> entries;
    Rng rng(catalog_seed);
    for (std::size_t i = 0; i < n; ++i) {
      entries.push_back({fmt::format("s{}", i), 100 + rng.below(5000), static_cast<std::int32_t>(i % 7)});
    }
    catalog = std::move(Catalog::from_entries(std::move(entries), {}).value());
    shape = make_plan_shape(n, JobShape{nodes, 1, batch, false});
    const std::uint64_t capacity =
        resident_share ? static_cast<std::uint64_t>(*resident_share * static_cast<double>(catalog.total_bytes()) / nodes)
                       : kNoCapacityLimit;
    placement = make_placement(catalog.sizes(), shape, PlacementPolicy::kBalanced, 1, capacity);
    ShuffleConfig shuffle;
    shuffle.seed = 5;
    planner = std::make_unique<EpochPlanner>(shape, placement, shuffle);
    directory = std::make_unique<GlobalDirectory>(catalog, placement);
    context = SchedulerContext{directory.get(), planner.get(), 0, prefetch, window, 7, storage, readahead};
  }
};

}  // namespace shardmix::test_support
