// The per-trainer scheduler: walks one trainer's epoch plan ahead by `service.prefetch`
// batches. A locally cached sample becomes a descriptor pointing into the cache arena
// (no copy); a peer's sample gets room in the trainer's staging ring and is fetched
// with a one-sided read; a batch is sent once all its fetches completed, in plan order.
// Flow control by credits: at most `prefetch` batches assembled or unreleased at once.
// Clairvoyance across epochs: once the current pass has assembled its last batch, spare
// credits go to the first batches of the next epoch (the plan is known), so the pipeline
// does not drain at every epoch boundary. A StartEpoch for that epoch adopts them; any
// other StartEpoch discards them.
//
// Transport-free: the fabric and the socket are behind PeerFetcher and FrameSink, so
// this is tested as pure code (tests/unit/trainer_scheduler_test.cc).
// Thread-safety: none; every call, including fetch completions, must arrive on one
// thread (the daemon's client-service thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "common/catalog.h"
#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/status.h"
#include "proto/wire.h"
#include "server/staging_ring.h"

namespace shardmix {

// One one-sided read: `length` bytes at `remote_offset` of `peer`'s cache arena into the
// staging region at `staging_offset`.
struct PeerRead {
  std::uint32_t peer;
  std::uint64_t remote_offset;
  std::uint64_t length;
  std::uint64_t staging_offset;
};

class PeerFetcher {
 public:
  virtual ~PeerFetcher() = default;
  // Performs all `reads` (a batch's peer samples) and then calls `done` once, on the
  // scheduler's thread, with the first error if any. One completion per batch, not per
  // read: each hop to the scheduler's thread is a wake-up.
  virtual void fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) = 0;
};

class FrameSink {
 public:
  virtual ~FrameSink() = default;
  virtual void send_batch(const proto::BatchFrame& batch) = 0;
  virtual void send_epoch_end(const proto::EpochStats& stats) = 0;
  virtual void send_error(const Status& status) = 0;
};

// What a scheduler reads; owned by the daemon and outliving every scheduler.
struct SchedulerContext {
  const Catalog* catalog = nullptr;
  const Placement* placement = nullptr;
  const EpochPlanner* planner = nullptr;
  std::uint32_t node = 0;
  std::uint32_t prefetch = 1;
};

class TrainerScheduler : public std::enable_shared_from_this<TrainerScheduler> {
 public:
  TrainerScheduler(const SchedulerContext& context, std::uint32_t local_trainer, std::shared_ptr<StagingRing> ring,
                   PeerFetcher& fetcher, FrameSink& sink);

  // Begins streaming `epoch` as stream `stream` (the client's id for this pass; frames
  // carry it back). Batches of an earlier stream that were not released are released
  // implicitly (the client invalidates them when it starts a new pass).
  void start_epoch(std::uint64_t epoch, std::uint64_t stream);
  // The trainer is done with this batch of `stream`; its staging bytes may be reused.
  Status release(std::uint64_t stream, std::uint64_t batch);
  // The connection is gone: send nothing more; staging is freed as fetches complete.
  void close();

  std::uint32_t local_trainer() const { return local_trainer_; }
  // Batches assembled or sent but not released, ahead-of-time ones included (for tests
  // and telemetry).
  std::size_t live_batches() const { return current_.live.size() + (ahead_ ? ahead_->live.size() : 0); }

 private:
  struct Assembly {
    std::uint64_t generation = 0;
    proto::BatchFrame frame;
    std::optional<std::uint64_t> staging_offset;
    bool fetching = false;  // the batch's peer reads are in flight
    Status error;
    bool sent = false;
    bool released = false;
    std::chrono::steady_clock::time_point started;
  };

  // One pass over an epoch's plan for this trainer.
  struct Pass {
    std::uint64_t epoch = 0;
    std::uint64_t generation = 0;
    TrainerPlan plan;
    std::uint64_t next_to_assemble = 0;
    // Batches assembled or unreleased, by batch index.
    std::map<std::uint64_t, std::shared_ptr<Assembly>> live;
  };

  void pump();
  // Assembles the next batch of `pass`; false if it must wait for staging bytes.
  bool assemble_next(Pass& pass);
  void flush();
  void on_fetched(const std::shared_ptr<Assembly>& assembly, const Status& status);
  void retire(const std::shared_ptr<Assembly>& assembly);
  void abandon(Pass& pass);  // releases its batches; staging is freed as fetches land

  SchedulerContext context_;
  std::uint32_t local_trainer_;
  std::shared_ptr<StagingRing> ring_;
  PeerFetcher& fetcher_;
  FrameSink& sink_;

  bool closed_ = false;
  bool failed_ = false;
  std::uint64_t generation_ = 0;  // bumps with every start_epoch
  std::uint64_t stream_ = 0;
  bool started_ = false;
  Pass current_;
  std::optional<Pass> ahead_;  // the next epoch, assembled ahead of its StartEpoch
  std::uint64_t next_to_send_ = 0;
  bool end_sent_ = true;
  proto::EpochStats stats_;
};

}  // namespace shardmix
