// The daemon's CheckpointReplicator (docs/decisions/0059): how a saved checkpoint version
// reaches its replica holder, another daemon of the job. The bytes travel over the fabric
// and never over MPI: the owner registers the version's sealed mapping for remote reads
// (Fabric::offer_region) and the holder pulls it with one-sided reads into a memfd of its
// own (Fabric::read_region). The small notices around that go over the MPI control plane,
// on the daemon's main thread (the only thread that calls MPI), one tag:
//   Offer    owner -> holder   name, version, length, and the region's address and key
//   Copied   holder -> owner   the holder's CheckpointNode accepted the copy
//   Refused  holder -> owner   it did not (no room in its checkpoint.capacity, a failed read)
//   Release  owner -> holder   the owner made the version durable: the copy may go
// A notice is never sent to a rank declared dead; an Offer to a holder that dies is
// answered here (kUnavailable), so the node asks the next peer.
//
// Thread-safety: copy() and release() (CheckpointReplicator) from any thread: they queue.
// pump() and peer_died() on the main thread. Read completions on the fabric's progress
// thread: they queue too. Nothing calls the CheckpointNode or a `done` under this
// object's mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "common/checkpoint_node.h"
#include "common/status.h"
#include "control/mpi_comm.h"
#include "fabric/fabric.h"

namespace shardmix {

// The MPI tag of every replication notice (server/daemon.cc holds the others).
inline constexpr int kTagCheckpointReplica = 46;

struct CheckpointReplicatorStats {
  std::uint64_t offers_sent = 0;
  std::uint64_t replicas_pulled = 0;   // copies landed here and accepted
  std::uint64_t bytes_pulled = 0;
  std::uint64_t refusals = 0;          // copies this daemon refused (room, read failure)
  // The most reads of one pull in the fabric at once (posted, not landed): the pacing that
  // keeps heartbeats and sample reads from queueing behind a whole version.
  std::uint64_t most_pull_reads_in_flight = 0;
  std::uint64_t malformed_notices = 0; // notices that did not decode (logged)
};

class FabricCheckpointReplicator final : public CheckpointReplicator {
 public:
  FabricCheckpointReplicator(fabric::Fabric& fabric, const MpiSession& mpi);
  ~FabricCheckpointReplicator() override;

  // The node whose replicas this daemon holds: set once, before pump() first runs.
  void attach(CheckpointNode* node) { node_ = node; }

  void copy(std::int32_t holder, const CheckpointId& id, CheckpointBytesPtr bytes,
            std::function<void(const Status&)> done) override;
  void release(std::int32_t holder, const CheckpointId& id) override;

  // Main thread: posts the queued offers and notices, handles the notices that arrived and
  // the pulls that finished. Cheap when there is nothing to do.
  void pump();
  // Main thread: `rank` was declared dead. Offers waiting for its answer fail (the node
  // then asks another peer), and no notice goes to it any more. Call it before
  // CheckpointNode::peer_died, which takes over the replicas held for `rank`.
  void peer_died(std::int32_t rank);

  CheckpointReplicatorStats stats() const;

  // A replica pull reads its version in chunks, at most this many in the fabric at a time
  // (checkpoint_replicator.cc says why).
  static constexpr std::size_t kPullReadsInFlight = 2;

 private:
  struct Outgoing {  // a copy() not yet offered
    std::int32_t holder = kNoRank;
    CheckpointId id;
    CheckpointBytesPtr bytes;
    std::function<void(const Status&)> done;
  };
  struct Offered {  // an Offer waiting for the holder's answer
    int region = -1;  // fabric::OfferedRegion::handle; -1 for an empty version
    CheckpointBytesPtr bytes;  // the registered memory stays mapped until the answer
    std::function<void(const Status&)> done;
  };
  struct Pull;  // a copy being read here from its owner
  struct Notice;
  using Key = std::pair<std::int32_t, CheckpointId>;  // (peer rank, version)

  // kUnavailable without sending to a rank declared dead; MPI's error otherwise (logged).
  Status post(std::int32_t to, const Notice& notice);
  void offer(Outgoing outgoing, std::vector<std::function<void()>>& after);
  void handle(std::int32_t source, const Notice& notice, std::vector<std::function<void()>>& after);
  void start_pull(std::int32_t owner, const Notice& offer);
  // Posts the pull's next chunk, if any is left and none has failed (any thread).
  void post_next_read(const std::shared_ptr<Pull>& pull);
  // A chunk's completion (the fabric's progress thread): the next one, or the pull landed.
  void on_read_landed(const std::shared_ptr<Pull>& pull, const Status& status);
  void finish_pull(const std::shared_ptr<Pull>& pull);
  bool is_dead(std::int32_t rank) const;

  fabric::Fabric& fabric_;
  const MpiSession& mpi_;
  CheckpointNode* node_ = nullptr;

  mutable std::mutex mutex_;  // guards the queues filled from other threads
  std::deque<Outgoing> to_offer_;
  std::deque<std::pair<std::int32_t, CheckpointId>> to_release_;
  std::deque<std::shared_ptr<Pull>> landed_;
  CheckpointReplicatorStats stats_;

  // Main thread only.
  std::map<Key, Offered> offered_;                 // by (holder, version)
  std::map<Key, std::shared_ptr<Pull>> pulling_;   // by (owner, version)
  std::vector<bool> dead_;
};

}  // namespace shardmix
