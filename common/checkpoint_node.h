// One daemon's checkpoint absorption (docs/decisions/0053): the CheckpointStore's state
// machine with the things that move bytes around it: the background drain thread (write
// to checkpoint.dir, retention on disk, retries of a failing file system), back-pressure
// (a save waits for room, or with when_full = write_through is written straight to the
// file system), replication through a CheckpointReplicator (the transport is the daemon's
// adapter; tests connect nodes in one process), and the waiters of saves and of
// wait_durable. No socket, MPI or libfabric here.
//
// Thread-safety: every public method may be called from any thread; one mutex guards the
// store and the waiters. Completion callbacks run on the drain thread, on a replicator's
// thread, or on the caller's thread when the outcome is known at once; never under the
// mutex, so they may call back into the node.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/checkpoint_pool.h"
#include "common/checkpoint_store.h"
#include "common/status.h"

namespace shardmix {

// How a copy reaches a peer daemon and how that peer is told to drop it. The daemon's
// implementation announces the version over the control plane and the peer reads it;
// `done` runs once, on any thread, with ok when the peer holds the whole copy.
class CheckpointReplicator {
 public:
  virtual ~CheckpointReplicator() = default;
  virtual void copy(std::int32_t holder, const CheckpointId& id, CheckpointBytesPtr bytes,
                    std::function<void(const Status&)> done) = 0;
  // The owner made `id` durable: `holder` may drop its copy. Best effort (a lost release
  // leaves a durable copy the holder evicts when it needs room).
  virtual void release(std::int32_t holder, const CheckpointId& id) = 0;
};

enum class WhenFull : std::uint8_t { kWait, kWriteThrough };

struct CheckpointNodeOptions {
  std::int32_t rank = 0;
  std::filesystem::path dir;              // checkpoint.dir
  std::uint64_t capacity_bytes = 0;       // checkpoint.capacity
  std::uint32_t retain = 2;               // checkpoint.retain: versions of a name in RAM and on disk
  WhenFull when_full = WhenFull::kWait;   // checkpoint.when_full
  std::vector<std::string> domains;       // failure domain of every rank (host names); size = ranks
  std::chrono::milliseconds retry_interval{1000};  // between attempts of a failing drain
  // Allocate the checkpoint pool's pages at start, in the background (decision 0068); the
  // daemon does, tests mostly need not.
  bool prefault_pool = false;
};

struct CheckpointNodeStats {
  CheckpointStoreStats store;
  std::uint64_t saves = 0;
  std::uint64_t save_us = 0;          // summed time from save() to its completion
  std::uint64_t drain_busy_us = 0;    // summed time the drain spent writing files
  std::uint64_t written_through_bytes = 0;
  std::uint64_t saves_waiting_for_room = 0;  // now
  CheckpointPoolStats pool;
};

class CheckpointNode {
 public:
  using SaveDone = std::function<void(Result<CheckpointId>)>;
  using DurableDone = std::function<void(const Status&)>;

  // Lists checkpoint.dir (a restarted job finds the durable versions) and starts the
  // drain thread. The replicator must outlive the node, and deliver no completion after
  // the node is destroyed (the daemon stops its transport first).
  static Result<std::unique_ptr<CheckpointNode>> start(CheckpointNodeOptions options, CheckpointReplicator* replicator);
  ~CheckpointNode();  // stops the drain thread (a write in progress finishes first)
  CheckpointNode(const CheckpointNode&) = delete;
  CheckpointNode& operator=(const CheckpointNode&) = delete;

  // Saves a new version of `name`. `done` gets its id once the bytes are in this node's
  // RAM and one peer holds a copy (with no live peer, once they are in RAM), or once they
  // are in a file (written through). Errors name the checkpoint: a bad name, larger than
  // checkpoint.capacity in wait mode, no peer could take a copy, a failed write-through.
  void save(std::string name, CheckpointBytesPtr bytes, SaveDone done);
  // `done` once the newest version of `name` saved so far is durable; with the drain's
  // error (naming checkpoint and directory) if an attempt to write it fails, the RAM copy
  // kept and retried. kNotFound if no version of `name` is known.
  void wait_durable(const std::string& name, DurableDone done);
  // The newest version of `name`: from RAM (owned or replica) when it is there, without a
  // copy (the daemon can hand the mapping to the trainer), else read from its file.
  // kNotFound naming the name and checkpoint.dir.
  Result<CheckpointBytesPtr> load(const std::string& name);
  std::vector<CheckpointId> list() const;

  // A buffer for a version's bytes in the node's checkpoint pool (resident pages, reused;
  // a memfd of its own when the pool is short): where the daemon copies a trainer's save
  // buffer, and where a peer's replica lands. The durable versions the new one will
  // displace from checkpoint.capacity are evicted first, so that their chunks are free.
  // A size past off_t, which no memfd holds, is refused naming the checkpoint. Any thread.
  Result<std::shared_ptr<CheckpointBuffer>> allocate(std::uint64_t size, std::string_view checkpoint);

  // The replica side, called by the daemon's transport.
  Status accept_replica(std::int32_t owner, const CheckpointId& id, CheckpointBytesPtr bytes);
  void release_replica(const CheckpointId& id);
  // A peer daemon died: take over its versions held here (drained first), copy ours that
  // it held to another peer. Returns how many versions not yet durable were taken over.
  std::size_t peer_died(std::int32_t rank);
  // Names with a version in RAM that this daemon drains (saved here or taken over from a
  // dead owner), as opposed to replicas it holds for a live peer: what a stopping daemon
  // must make durable before it exits.
  std::vector<std::string> owned_names() const;

  CheckpointNodeStats stats() const;
  const CheckpointNodeOptions& options() const { return options_; }

 private:
  struct PendingSave {
    std::string name;
    CheckpointBytesPtr bytes;
    SaveDone done;
    std::chrono::steady_clock::time_point started;
  };
  struct Replication {
    std::vector<std::int32_t> excluded;  // refused, failed or died
    std::int32_t holder = kNoRank;       // the copy in flight goes there
    SaveDone done;  // empty for a re-replication after a holder died
    std::chrono::steady_clock::time_point started;
    std::vector<std::int32_t> busy;  // of `excluded`, the ones with no room now (kUnavailable)
    // when_full = wait and every live peer was busy: ask them again then (drain thread).
    std::optional<std::chrono::steady_clock::time_point> retry_at;
  };
  struct DurableWaiter {
    CheckpointId target;
    DurableDone done;
  };
  using Callbacks = std::vector<std::function<void()>>;

  CheckpointNode(CheckpointNodeOptions options, CheckpointReplicator* replicator);
  // Admits `save` into the store (or queues it, or writes it through); callbacks to run
  // after unlocking go to `out`. Holds mutex_.
  void admit(PendingSave save, Callbacks& out);
  // Retries queued saves in order after room was freed. Holds mutex_.
  void admit_waiting(Callbacks& out);
  // Sends `id` to the next peer not yet excluded; completes or fails the save when there
  // is none. Holds mutex_.
  void replicate(const CheckpointId& id, Callbacks& out);
  // Replications waiting for a busy holder (Replication::retry_at) that are due: asked
  // again. Returns when the next one is due, if any.
  std::optional<std::chrono::steady_clock::time_point> retry_replications(Callbacks& out);
  void on_copied(const CheckpointId& id, std::int32_t holder, const Status& status);
  // The order in which this node first replicated `name` (choose_replica_holder's slot).
  // Holds mutex_.
  std::uint32_t slot_of(const std::string& name);
  void drain_loop();
  void finish_save(SaveDone done, std::chrono::steady_clock::time_point started, Result<CheckpointId> result,
                   Callbacks& out);
  static void run(Callbacks& callbacks);

  CheckpointNodeOptions options_;
  CheckpointReplicator* replicator_;
  std::unique_ptr<CheckpointPool> pool_;
  mutable std::mutex mutex_;
  std::condition_variable wake_drain_;
  CheckpointStore store_;
  std::vector<bool> alive_;
  std::deque<PendingSave> waiting_for_room_;
  std::deque<PendingSave> write_through_;
  std::map<CheckpointId, Replication> replicating_;
  std::vector<DurableWaiter> durable_waiters_;
  std::map<std::string, std::uint32_t, std::less<>> name_slots_;
  CheckpointNodeStats stats_;
  bool stopping_ = false;
  std::thread drain_thread_;
};

}  // namespace shardmix
