// MPI bootstrap: init/finalize, the few collectives ShardMix uses (catalog allgather,
// endpoint names and memory keys, barriers), and point-to-point messages for load
// progress, per-epoch telemetry to rank 0 and the cache-rotation fence (decisions 0014,
// 0033). MPI is never on the per-sample path.
// Thread-safety: call from the main thread only (MPI_THREAD_FUNNELED).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/collectives.h"
#include "common/status.h"

namespace shardmix {

class MpiSession {
 public:
  // MPI_Init_thread(FUNNELED). Aborts the process with a message if MPI cannot start.
  MpiSession(int* argc, char*** argv);
  ~MpiSession();  // MPI_Finalize
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string hostname() const;

  // Every rank contributes `mine`; returns all ranks' bytes, indexed by rank.
  Result<std::vector<std::vector<std::uint8_t>>> allgather(std::span<const std::uint8_t> mine) const;
  // outgoing[r] to rank r; returns what each rank sent here, indexed by rank (MPI_Alltoallv;
  // an error naming the sizes when this rank's total in or out exceeds INT_MAX bytes).
  Result<std::vector<std::vector<std::uint8_t>>> alltoall(const std::vector<std::vector<std::uint8_t>>& outgoing) const;
  // Rank `root`'s bytes on every rank.
  Result<std::vector<std::uint8_t>> broadcast(std::span<const std::uint8_t> bytes, int root) const;
  // Sum of `value` across ranks.
  Result<std::uint64_t> allreduce_sum(std::uint64_t value) const;
  // A barrier that keeps calling `progress` while it waits (MPI_Ibarrier + MPI_Test), so
  // libfabric providers with manual progress keep serving peers during shutdown.
  Status barrier(const std::function<void()>& progress = {}) const;
  // The same, but gives up as soon as `check` (called while waiting) returns an error,
  // and returns that error: e.g. a peer daemon was found dead and will never arrive. The
  // barrier is then left pending: do not call MPI_Finalize (which would wait for it).
  Status barrier_unless(const std::function<Status()>& check) const;

  // Point-to-point, for per-epoch telemetry (every daemon sends its finished trainer
  // passes to rank 0; docs/decisions/0014) and cache rotation (post_send). A blocking send of a small message (eager in
  // practice), and a non-blocking receive of any waiting message from any rank.
  struct Message {
    int source = 0;
    int tag = 0;
    std::vector<std::uint8_t> bytes;
  };
  Status send(int dest, int tag, std::span<const std::uint8_t> bytes) const;
  // Non-blocking send of a small message (cache rotation's Done/Readable, which go out from
  // the thread that also runs the failure detector: a blocking MPI_Send to a slow rank
  // would stall it). The bytes are kept until the send completes; test_sends() completes
  // finished ones and returns the first failure, naming the destination rank. Sends still
  // pending at destruction are waited for before MPI_Finalize.
  Status post_send(int dest, int tag, std::vector<std::uint8_t> bytes) const;
  Status test_sends() const;
  std::size_t pending_sends() const { return pending_sends_.size(); }
  // nullopt if no message is waiting. With `tag`, only a message with that tag (so that
  // the telemetry and the cache-rotation fence each take only their own messages).
  Result<std::optional<Message>> try_receive(std::optional<int> tag = std::nullopt) const;

 private:
  int rank_ = 0;
  int size_ = 1;
  struct PendingSend {
    void* request = nullptr;  // MPI_Request, owned (kept opaque: no <mpi.h> in this header)
    int dest = 0;
    int tag = 0;
    std::vector<std::uint8_t> bytes;  // the send buffer, alive until the send completes
  };
  mutable std::vector<PendingSend> pending_sends_;
};

// The core's Collectives (common/collectives.h) over an MpiSession, for core logic that
// talks to every rank (the owner-side catalog). Main thread only, like the session.
class MpiCollectives : public Collectives {
 public:
  explicit MpiCollectives(const MpiSession& mpi) : mpi_(mpi) {}
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  Result<RankBytes> allgather(std::span<const std::uint8_t> mine) override { return mpi_.allgather(mine); }
  Result<RankBytes> alltoall(RankBytes outgoing) override { return mpi_.alltoall(outgoing); }

 private:
  const MpiSession& mpi_;
};

}  // namespace shardmix
