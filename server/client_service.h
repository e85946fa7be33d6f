// The daemon's trainer-facing service: a Unix socket served by Boost.Asio on one thread.
// Each connection: the peer's uid (SO_PEERCRED) must be ours; Hello (validated: protocol
// version, job token, trainer layout) ->
// Welcome with the arena and staging memfds (SCM_RIGHTS) -> StartEpoch / Release /
// GetCatalog requests, answered by Batch / EpochEnd / Catalog frames from the trainer's
// scheduler. A malformed frame or a vanished trainer closes that connection only.
// A GetStats request (allowed before any Hello: shardmix-stat) is answered with the node's
// telemetry as Prometheus text. A connection whose first frame is a CheckpointHello is a
// checkpoint connection (docs/decisions/0056): it carries only CheckpointSave (with the
// trainer's sealed memfd), CheckpointWaitDurable, CheckpointLoad and CheckpointList, served
// by the node's CheckpointNode, and never batches. Each finished pass (EpochEnd sent and every batch released,
// with the trainer's reported waits summed) becomes a TrainerEpochRecord in the telemetry.
// Thread-safety: all methods and callbacks run on the io_context's thread, except
// stop(), which posts to it.
#pragma once

#include <utility>  // boost 1.74 asio/awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <functional>
#include <vector>

#include "common/checkpoint_node.h"
#include "common/staging_allocator.h"
#include "common/status.h"
#include "common/trainer_scheduler.h"
#include "fabric/fabric.h"
#include "server/shared_region.h"
#include "server/telemetry.h"

namespace shardmix {

// What the service serves; owned by the daemon, outliving the service.
struct ServedJob {
  SchedulerContext context;
  const Catalog* catalog = nullptr;  // served whole to clients that ask (GetCatalog); null: none held
  // With no catalog held (owner-side metadata): builds one per GetCatalog from the owners
  // (assemble_catalog in common/sample_directory.h). Runs on the service's thread.
  std::function<Result<Catalog>()> assemble_catalog;
  const PlanShape* shape = nullptr;
  std::uint32_t nodes = 1;
  std::uint32_t trainers_per_node = 1;
  SharedRegion* arena = nullptr;
  SharedRegion* staging = nullptr;
  std::uint64_t staging_per_trainer = 0;
  PeerFetcher* fetcher = nullptr;
  NodeTelemetry* telemetry = nullptr;  // optional: counters, finished passes, GetStats replies
  // The job token a Hello must carry (common/job_token.h); 0 = accept any (tests only:
  // the daemon always sets one).
  std::uint32_t job_token = 0;
  // Plan identity for checkpoints (common/resume_plan.h plan_digest; proto/checkpoint.h).
  std::uint64_t plan_digest = 0;
  std::uint64_t seed = 0;
  // Model checkpoints (checkpoint.dir set); nullptr = checkpoint connections are refused.
  CheckpointNode* checkpoints = nullptr;
};

// Checks a trainer's checkpoint blob against what this daemon serves (plan digest, job
// shape, trainer rank, epoch; a re-dealt epoch's digest for that epoch) and returns its
// position. The error says which fields differ, naming the config keys.
Result<ResumePoint> accept_checkpoint(std::span<const std::uint8_t> blob, const ServedJob& job,
                                      std::uint32_t trainer_rank, std::uint64_t epoch);

// Fault injection (inject.slow_peer_*): fetches that read from `rank` complete `delay` late.
struct SlowPeer {
  std::int64_t rank = -1;  // -1: none
  std::chrono::microseconds delay{0};
};

// PeerFetcher over the libfabric adapter: completions hop from the fabric progress
// thread to the io_context thread.
class FabricFetcher : public PeerFetcher {
 public:
  FabricFetcher(boost::asio::io_context& io, fabric::Fabric& fabric, fabric::LocalRegion staging,
                SlowPeer slow_peer = {})
      : io_(io), fabric_(fabric), staging_(staging), slow_peer_(slow_peer) {}
  void fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) override;
  // Called on the fabric progress thread for every failed read, with the peer's rank (the
  // daemon's failure detector listens here). Set before the first fetch.
  void on_peer_error(std::function<void(std::uint32_t peer, const Status&)> hook) { peer_error_ = std::move(hook); }

 private:
  std::function<void(std::uint32_t, const Status&)> peer_error_;
  boost::asio::io_context& io_;
  fabric::Fabric& fabric_;
  fabric::LocalRegion staging_;
  SlowPeer slow_peer_;
};

class TrainerConnection;

class ClientService {
 public:
  ClientService(boost::asio::io_context& io, ServedJob job, std::string socket_path);
  ~ClientService();  // unlinks the socket file

  // Binds the socket (0600), replacing a stale file left by a crashed daemon, and starts
  // accepting. Fails if another live daemon answers on the path.
  Status listen();
  // Closes the acceptor and every connection. With a `why`, each trainer first receives
  // it as an Error frame (after the frames already queued for it), so it fails with the
  // daemon's reason instead of a bare hang-up. Safe from any thread.
  void stop(const Status& why = Status::ok_status());

  std::size_t connections() const { return connections_.size(); }  // io thread only
  // Waits (from another thread) until every connection has closed, e.g. after stop(why)
  // once each trainer's Error frame is written, or until `timeout`; true if all closed.
  bool wait_all_closed(std::chrono::milliseconds timeout);
  // Logs, once per epoch and node, what shuffle.min_entropy chose for `epoch` (nothing
  // when the mode is off).
  void report_epoch_choice(std::uint64_t epoch);
  // fault.peer_death = degrade: peer daemon `peer` is dead; every scheduler, and those of
  // trainers that connect later, reads its samples from storage (TrainerScheduler::peer_dead).
  // Safe from any thread (runs on the io thread).
  void peer_dead(std::uint32_t peer);

 private:
  friend class TrainerConnection;
  void accept_next();
  // Sums this node's schedulers' metadata_bytes() into the telemetry's maximum (io thread).
  void sample_metadata();
  void forget(const std::shared_ptr<TrainerConnection>& connection);

  boost::asio::io_context& io_;
  // Loads that read a checkpoint's file run here, not on the io thread, so a large read
  // from slow storage never delays a batch.
  boost::asio::thread_pool checkpoint_reads_{1};
  ServedJob job_;
  std::string socket_path_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer accept_backoff_;
  // One per local trainer. Shared with schedulers: fetches still in flight when a
  // connection (or the service) goes away must free their bytes into a live allocator.
  std::vector<std::shared_ptr<StagingAllocator>> staging_;
  // The live connection of each local trainer, if any (to tell a restarted trainer
  // from a duplicate when the old connection's hang-up is not processed yet).
  std::vector<std::weak_ptr<TrainerConnection>> trainer_connection_;
  std::set<std::shared_ptr<TrainerConnection>> connections_;
  bool listening_ = false;
  std::set<std::uint64_t> reported_epochs_;  // epochs whose choice report_epoch_choice logged
  std::vector<std::uint32_t> dead_peers_;    // io thread: peers declared dead (degraded mode)
};

}  // namespace shardmix
