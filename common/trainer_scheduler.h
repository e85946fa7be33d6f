// The per-trainer scheduler: walks one trainer's epoch plan ahead and turns it into
// batch frames. A locally cached sample becomes a descriptor pointing into the cache arena
// (no copy); a peer's sample gets room in the trainer's staging area and is fetched with
// a one-sided read; a cold sample (cached nowhere: the dataset is larger than the nodes'
// caches) gets room in staging too and is read from storage by a StorageFetcher (tier
// storage), whichever node owns it.
//
// Two steps per planned position: *staging* (descriptor made, peer read posted; done a
// planned batch at a time, in plan order, ahead of need) and *delivery* (the sample is put
// in an outgoing batch once it is ready). Output batch j always has the planned size of
// batch j, so batch counts and sizes never change. Which samples fill it:
//  - window W = 0: exactly planned batch j, in plan order (bit-for-bit reproducible);
//  - W > 0 (opportunistic ordering): the first n_j undelivered positions if all are ready;
//    otherwise, when the trainer is about to starve (at most one batch in its hands), n_j
//    ready samples among the undelivered positions before plan position
//    batch_begin[j] + n_j + W: the ready planned ones, and for each late one (a read
//    posted after it has already landed) a ready stand-in of the same label if any, else
//    the earliest ready one. So a slow read is overtaken instead of
//    stalling the trainer, composition changes only inside the window, and a sample is
//    never skipped: the last batch's window holds every position still undelivered.
// Flow control: at most `prefetch` batches sent and unreleased (the trainer's credits),
// and at most (prefetch + R) x batch.size + W samples staged or in the trainer's hands,
// where R = cold_readahead_batches when the placement has cold samples, else 0: storage
// is slow per read, so with a storage tier the plan is walked further ahead (clairvoyant
// read-ahead) and the staging bytes bound how far.
// Clairvoyance across epochs: once the current pass is fully staged, spare budget stages
// the first batches of the next epoch (the plan is known), so the pipeline does not drain
// at every epoch boundary. A StartEpoch for that epoch adopts them; any other discards them.
//
// Degraded mode (fault.peer_death = degrade, docs/decisions/0032): once told that a peer
// is dead (peer_dead()), every sample it owns that is staged later is read from storage
// (tier storage, like a cold sample); reads from it still in flight are re-posted to
// storage for exactly their positions (same staging bytes; those bytes are not reused until
// the stale read has landed, since a hung peer's read may still write them), and with
// degrade_dead_peers a failed peer read is retried from storage instead of failing the
// trainer. Positions never change, so the plan, W = 0 order and exactly-once are untouched.
// The daemon wires this up for fault.peer_death = degrade; the scheduler half is tested as
// pure code in storage_tier_test.
//
// Cache rotation (cache.rotation_epochs, docs/decisions/0033; per round with
// cache.reuse_rounds, 0035): with a ResidencyTable in the context, every staged batch
// notes its (epoch, batch) there (the rotation follows the furthest generation staged), a
// sample is read from an arena (local or peer) only where the table locates it now, and
// the read or zero-copy reference holds that view's pin until it has landed or the batch
// was released; a sample the table does not locate is a storage read.
//
// Transport-free: the fabric, storage and the socket are behind PeerFetcher,
// StorageFetcher and FrameSink, so
// this is tested as pure code (tests/unit/trainer_scheduler_test.cc).
// Thread-safety: none; every call, including fetch completions, must arrive on one
// thread (the daemon's client-service thread).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "common/catalog.h"
#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/sample_directory.h"
#include "common/resume_plan.h"
#include "common/rotation.h"
#include "common/shuffle_metrics.h"
#include "common/staging_allocator.h"
#include "common/status.h"
#include "common/trace.h"
#include "proto/wire.h"

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
  // Performs all `reads` (a batch's peer samples, or with a window those of one owner)
  // and then calls `done` once, on the scheduler's thread, with the first error if any.
  // One completion per group, not per read: each hop to the scheduler's thread is a
  // wake-up. `done` may run before fetch() returns (the scheduler copes).
  virtual void fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) = 0;
};

// One read of a cold sample (resident in no node's arena) from storage: `length` bytes of
// sample `sample` into the staging region at `staging_offset`.
struct StorageRead {
  SampleId sample;
  std::uint64_t length;
  std::uint64_t staging_offset;
  // Where the sample is on storage when the reader has no catalog to look `sample` up in
  // (owner-side metadata: PlanDirectory::storage_location); empty = by id from the catalog.
  std::optional<CatalogEntry> location = std::nullopt;
};

// What a group of storage reads reports: each read that failed, as its index in the
// group's reads and its error (naming the sample, the file and the byte offset), in no
// particular order. Per read, so that one bad file costs only its own retry.
struct StorageOutcome {
  std::vector<std::pair<std::size_t, Status>> failed;
  bool ok() const { return failed.empty(); }
  Status first_error() const { return failed.empty() ? Status::ok_status() : failed.front().second; }
};

class StorageFetcher {
 public:
  virtual ~StorageFetcher() = default;
  // Performs all `reads` (a staged batch's cold samples) and then calls `done` once, on
  // the scheduler's thread, with the reads that failed. Same contract as
  // PeerFetcher::fetch: one completion per group; may run inline.
  virtual void fetch(std::vector<StorageRead> reads, std::function<void(const StorageOutcome&)> done) = 0;
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
  // Where each planned sample is (bytes, label, owner, arena offset or cold): the global
  // catalog and placement (the daemon) or owner-side shards (decision 0055).
  const SampleDirectory* directory = nullptr;
  const EpochPlanner* planner = nullptr;
  std::uint32_t node = 0;
  std::uint32_t prefetch = 1;
  std::uint32_t window = 0;  // shuffle.window (W)
  std::uint64_t num_classes = 0;  // C for the label-entropy figure (Catalog::num_classes(); 0 scores nothing)
  // Reads cold samples (not resident in their owner's arena). Required when the directory has any;
  // a cold sample without one is an error to the trainer.
  StorageFetcher* storage = nullptr;
  // service.cold_readahead_batches: when the placement has cold samples, planned batches
  // staged ahead beyond `prefetch`, so that storage reads are posted early enough to keep
  // the reader pool busy (bounded by the trainer's staging bytes). 0 when nothing is cold.
  std::uint32_t cold_readahead_batches = 0;
  // An epoch re-dealt from resume.checkpoint_dir (its plans replace the planner's), or null.
  const RedealtEpoch* redealt = nullptr;
  // fault.peer_death = degrade: a failed peer read is retried from `storage` (which must be
  // set) instead of failing the trainer; the same bytes are in the dataset's files.
  bool degrade_dead_peers = false;
  // dataset.strict = false: a sample whose storage read still fails after one retry (the
  // file vanished, shrank or was rewritten since the scan; an I/O error) is skipped: its
  // batch goes out without it (a descriptor flagged kSampleSkipped stands in its place,
  // so the client's positions stay exact), the epoch's statistics count it, and
  // `on_skipped` is told when its batch goes out (the daemon logs the error, which names
  // the file and offset).
  // false: that error fails the trainer (after the same retry).
  bool skip_unreadable_samples = false;
  std::function<void(std::uint64_t epoch, SampleId, const Status&)> on_skipped;
  // Counts samples read from storage instead of a dead or failing peer (telemetry), or null.
  std::atomic<std::uint64_t>* rerouted_samples = nullptr;
  // Cache rotation (cache.rotation_epochs or cache.reuse_rounds > 0, decisions 0033/0035): where each node's
  // samples are *now*; replaces placement's static residency and offsets. A sample it does
  // not locate (cold, or in a slot being rewritten) is read from `storage`, which must be
  // set. Null: the static placement.
  ResidencyTable* residency = nullptr;
  // Told the thread CPU time (CLOCK_THREAD_CPUTIME_ID, nanoseconds) each plan of this
  // trainer took to compute, and for which epoch (the simulator's plan-cost figure); or empty.
  std::function<void(std::uint64_t epoch, std::uint64_t cpu_ns)> on_plan_cpu;
};

class TrainerScheduler : public std::enable_shared_from_this<TrainerScheduler> {
 public:
  TrainerScheduler(const SchedulerContext& context, std::uint32_t local_trainer,
                   std::shared_ptr<StagingAllocator> staging, PeerFetcher& fetcher, FrameSink& sink);

  // Begins streaming `epoch` as stream `stream` (the client's id for this pass; frames
  // carry it back). Batches of an earlier stream that were not released are released
  // implicitly (the client invalidates them when it starts a new pass).
  void start_epoch(std::uint64_t epoch, std::uint64_t stream);
  // The same, resuming from a checkpoint's position in this trainer's plan of `epoch`:
  // delivers exactly the samples not yet delivered, as batches resume.batches_consumed..
  // (resume_trainer_plan). A position that does not fit the plan is an error, and
  // nothing changes (the previous pass, if any, goes on).
  Status start_epoch(std::uint64_t epoch, std::uint64_t stream, const ResumePoint& resume);
  // The trainer is done with this batch of `stream`; its staging bytes may be reused.
  Status release(std::uint64_t stream, std::uint64_t batch);
  // The connection is gone: send nothing more; staging is freed as fetches complete.
  void close();
  // Peer daemon `peer` is dead (fault.peer_death = degrade): its samples come from storage
  // from now on, including those whose reads from it are still in flight.
  void peer_dead(std::uint32_t peer);
  // Samples this scheduler read from storage instead of a dead or failing peer.
  std::uint64_t rerouted_samples() const { return rerouted_samples_; }

  std::uint32_t local_trainer() const { return local_trainer_; }
  std::uint32_t trainer_rank() const {
    return context_.planner->shape().job.first_trainer_of_node(context_.node) + local_trainer_;
  }
  // Batches sent and not yet released (for tests and telemetry).
  std::size_t outstanding_batches() const { return sent_.size(); }
  // Samples staged (fetched or being fetched, or local and ready) and not yet delivered,
  // next epoch's included (for tests and telemetry).
  std::uint64_t staged_samples() const;
  // Bytes of metadata this scheduler holds now: the plans of the current and the staged-ahead
  // pass, its slots and the per-epoch received-sample indexes (node_metadata_bytes).
  std::uint64_t metadata_bytes() const;

 private:
  static constexpr std::uint32_t kNoPeer = ~std::uint32_t{0};
  enum class SlotState : std::uint8_t { kFetching, kReady, kDelivered };
  // One planned position of a pass, from staging to delivery.
  struct Slot {
    proto::SampleDescriptor descriptor{};
    std::uint64_t staged_bytes = 0;  // bytes held in the staging area (aligned), 0 if local
    std::uint64_t fetch_seq = 0;     // the fetch that brings it (posting order), 0 if none
    std::uint32_t peer = kNoPeer;    // the peer it is being read from, kNoPeer if none
    // A peer read re-posted to storage while still in flight: that read may still land in
    // these bytes, so they are quarantined (not reused) until it completes.
    std::uint64_t stale_seq = 0;
    SlotState state = SlotState::kReady;
    // Its storage read failed once and was posted again on its own (one retry).
    bool storage_retried = false;
    // A local (zero-copy) slot under cache rotation: held until the trainer releases the batch.
    std::shared_ptr<const int> arena_pin;
  };

  // One pass over an epoch's plan for this trainer. Shared with fetch completions, which
  // must know whether their pass was abandoned meanwhile.
  struct Pass {
    std::uint64_t epoch = 0;
    TrainerPlan plan;
    // Where plan's samples are, resolved once when the plan is made (set_plan).
    std::unique_ptr<const PlanDirectory> where;
    // A resumed pass: plan batch 0 is batch first_batch of the epoch, and plan position p
    // is position planned_position[p] of the trainer's full plan (empty: identity).
    std::uint64_t first_batch = 0;
    std::vector<std::uint64_t> planned_position;
    bool abandoned = false;
    std::uint64_t next_to_stage = 0;  // planned batch
    std::uint64_t base = 0;           // plan position of slots.front()
    std::deque<Slot> slots;           // positions [base, base + slots.size())
    std::uint64_t undelivered = 0;    // staged slots not yet delivered
    std::uint64_t fetches_in_flight = 0;
    // Highest fetch_seq completed in this pass: a slot still fetching with a lower seq has
    // been overtaken by a read posted after it, i.e. it is late (no timer needed).
    std::uint64_t max_completed_seq = 0;
    // Peer reads (fetch_seq) whose positions were re-posted to storage while in flight, and
    // the staging bytes of such positions already delivered or abandoned, freed only once
    // the stale read completes (a dead process's read fails; a hung one may never return).
    std::set<std::uint64_t> stale_reads;
    std::map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> quarantine;
    // Cache rotation: each in-flight peer read group (fetch_seq) holds the pins of the arena
    // views it reads under, until it completes (ResidencyTable).
    std::map<std::uint64_t, std::vector<std::shared_ptr<const int>>> read_pins;
    Status error;                     // first fetch error, or why the plan could not be resolved
    std::uint64_t error_position = 0;
    // Skipped (unreadable) positions and their errors, reported (on_skipped) when their
    // placeholders are delivered: a pass read ahead and then abandoned reports none.
    std::map<std::uint64_t, Status> skip_errors;

    Slot& slot(std::uint64_t position) { return slots[position - base]; }
  };

  struct SentBatch {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> staging;  // (offset, bytes) to free
    std::uint64_t samples = 0;
    std::vector<std::shared_ptr<const int>> arena_pins;  // cache rotation: its local samples' views
    // Degraded mode: bytes of positions re-posted to storage while a read of the dead peer
    // may still land in them, by that read's fetch_seq. Free only once the trainer has
    // released the batch AND that read has landed: whichever comes second frees them.
    std::shared_ptr<Pass> pass;
    std::vector<std::pair<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>>> stale_staging;
  };

  std::shared_ptr<Pass> new_pass(std::uint64_t epoch);
  TrainerPlan plan_of(std::uint64_t epoch) const;
  void begin_pass(std::shared_ptr<Pass> pass, std::uint64_t epoch, std::uint64_t stream);
  void pump();
  // Stages the next planned batch of `pass`; false if it must wait for staging bytes.
  bool stage_next(const std::shared_ptr<Pass>& pass);
  // Sends the next batch if its samples are ready; false otherwise.
  bool deliver_next();
  // Opportunistic composition of a batch of n samples whose plan starts at plan_begin:
  // indices into current_->slots, or false if fewer than n candidates are ready.
  bool substitute(std::uint64_t n, std::uint64_t plan_begin, std::vector<std::size_t>& chosen);
  // `storage`: the group was read from storage; which of its reads failed.
  void on_fetched(const std::shared_ptr<Pass>& pass, const std::vector<std::uint64_t>& positions,
                  std::uint64_t seq, std::chrono::steady_clock::time_point started, const Status& status,
                  const StorageOutcome* storage = nullptr);
  // Re-posts the fetching `positions` of `pass` to storage (same staging bytes) as one read
  // group; `stale`: the read they were waiting for is still in flight; `rerouted`: they
  // were a peer's (counted as rerouted samples), not a retry of failed storage reads.
  void reroute_to_storage(const std::shared_ptr<Pass>& pass, const std::vector<std::uint64_t>& positions,
                          bool stale, bool rerouted = true);
  // Some reads of a storage group of `pass` failed: each failed position not retried yet
  // is read again on its own; one that failed its retry too is skipped
  // (skip_unreadable_samples) or becomes the pass's error. The others are ready.
  bool retry_or_skip_storage(const std::shared_ptr<Pass>& pass, const std::vector<std::uint64_t>& positions,
                             const StorageOutcome& outcome);
  // Moves a slot's staging bytes to `ranges`, or, while a stale read may still land there,
  // to `sent`'s stale_staging when a batch hands them to the trainer (nullptr: to quarantine).
  static void take_bytes(Pass& pass, Slot& slot, std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges,
                         SentBatch* sent = nullptr);
  // Frees what a sent batch holds: its staging, and its stale bytes whose read has landed
  // (the others go to quarantine, freed when it lands).
  void release_sent(const SentBatch& batch);
  bool is_dead(std::uint32_t peer) const { return peer < dead_.size() && dead_[peer]; }
  void abandon(const std::shared_ptr<Pass>& pass);  // frees its staging (in-flight: when it lands)
  void free_sent();
  std::uint64_t budget_used() const;
  void fail(const Status& status);
  // Fails the trainer with a clear error if staging can never make progress again.
  void fail_if_stuck();
  // Fills the quality figures of stats_ at the end of the current pass.
  void finish_quality_figures();
  // Whether a sample is served from this node's arena (owned here and resident).
  bool is_local(const SampleInfo& info) const { return info.owner == context_.node && info.resident(); }
  // Gives `pass` its plan and resolves where the plan's samples are.
  void set_plan(Pass& pass, TrainerPlan plan) const;

  SchedulerContext context_;
  std::uint32_t local_trainer_;
  std::shared_ptr<StagingAllocator> staging_;
  PeerFetcher& fetcher_;
  FrameSink& sink_;

  bool closed_ = false;
  bool failed_ = false;
  bool started_ = false;
  std::uint64_t stream_ = 0;
  std::shared_ptr<Pass> current_;
  std::shared_ptr<Pass> ahead_;  // the next epoch, staged ahead of its StartEpoch
  std::uint64_t next_to_send_ = 0;
  std::map<std::uint64_t, SentBatch> sent_;  // current pass, by batch index in the epoch
  std::uint64_t sent_samples_ = 0;
  bool end_sent_ = true;
  bool pumping_ = false;
  bool repump_ = false;           // pump() was called while pumping: go round again
  bool staging_blocked_ = false;  // the current pass could not stage its next batch
  std::uint64_t next_fetch_seq_ = 1;
  proto::EpochStats stats_;
  // Shuffle quality of what this trainer received this epoch (EpochStats figures).
  std::optional<BatchLabelEntropy> label_entropy_;
  // Sample ids received in this epoch's pass, in delivery order, and those of the previous
  // epoch's completed pass, sorted (for the affinity figure). Lists, not bitsets over the
  // dataset: a trainer's share is N / #trainers, and a bitset per trainer made every node
  // hold and clear trainers x N bits per epoch (2.5 GiB per 100 M samples and 8 trainers).
  std::vector<SampleId> received_;
  std::vector<SampleId> received_before_;
  std::optional<std::uint64_t> previous_epoch_;  // the epoch received_before_ describes
  std::uint64_t received_again_ = 0;     // samples also in received_before_
  std::vector<std::int32_t> labels_scratch_;
  std::vector<bool> dead_;  // by rank: peers declared dead (degraded mode)
  std::uint64_t rerouted_samples_ = 0;
  trace::Interval staging_wait_;  // open while a planned batch waits for staging bytes (trace)
};

}  // namespace shardmix
