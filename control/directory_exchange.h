// The daemons' per-plan directory exchange under owner-side metadata (decision 0062): the
// DirectoryExchange of common/sample_directory.h over the control plane. A scheduler that
// resolves a plan asks every owner of its foreign samples at once (one ask per owner, cut
// into asks of at most kMaxAskEntries) and waits; each daemon's main thread moves the asks
// and answers (MPI is FUNNELED) and answers the other daemons' asks from its own
// OwnerShard. So a plan costs one round trip to its owners, once per trainer per epoch,
// and nothing on the per-sample path.
// Thread-safety: describe() from any thread except the one that constructed the exchange
// (the main thread, which must keep calling pump() for describe() to return); pump() and
// wait_for_asks() from the main thread only; fail_owner() and close() from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/sample_directory.h"
#include "common/status.h"
#include "control/mpi_comm.h"

namespace shardmix {

// MPI tags of the exchange (the daemon's others are in server/daemon.cc and
// server/checkpoint_replicator.h).
inline constexpr int kTagDirectoryAsk = 47;
inline constexpr int kTagDirectoryAnswer = 48;

class MpiDirectoryExchange : public DirectoryExchange {
 public:
  // Most indices in one ask (an ask of 128 MiB, an answer of 320 MiB): a larger request
  // goes as several asks, so no message nears MPI's int count.
  static constexpr std::uint64_t kMaxAskEntries = std::uint64_t{1} << 24;

  // `own`: this node's shard, which answers the other daemons' asks; it must outlive the
  // exchange. describe() gives up after `timeout` without every answer, naming the owners
  // that did not answer.
  MpiDirectoryExchange(const MpiSession& mpi, const OwnerShard& own, std::chrono::milliseconds timeout);

  Status describe(std::span<const DescribeRequest> requests) const override;

  // Main thread, never blocks: sends the asks queued since the last call, answers every
  // ask waiting from the other daemons, and hands arrived answers to their describe().
  // Returns a control-plane failure (the exchange is then closed with it).
  Status pump();
  // Main thread: waits up to `max` until a describe() has queued an ask (at once if one
  // is), so a main loop can sleep on it and move asks without a tick's delay.
  void wait_for_asks(std::chrono::milliseconds max);
  // Asks to `owner` (waiting and future) fail with `why`: the failure detector found it dead.
  void fail_owner(std::uint32_t owner, const Status& why);
  // Every waiting and future describe() fails with `why` (shutdown, a transport failure).
  void close(const Status& why);

  struct Counters {
    std::uint64_t asks_sent = 0;
    std::uint64_t asks_answered = 0;  // the other daemons' asks this one answered
    std::uint64_t entries_received = 0;
    std::uint64_t entries_sent = 0;
  };
  Counters counters() const;

 private:
  // One describe() call: its asks still unanswered and the first failure.
  struct Call {
    std::size_t remaining = 0;
    Status error;
  };
  struct Pending {
    Call* call = nullptr;
    std::uint32_t owner = 0;
    std::span<SampleInfo> out;
    StorageLocations* located = nullptr;  // the request's, or null
    std::uint64_t first = 0;           // out[0]'s index in the request (asks are cut)
    bool every_location = false;       // the ask's kAskEveryLocation
  };
  struct Outgoing {
    std::uint32_t owner = 0;
    std::vector<std::uint8_t> bytes;
  };
  void finish_locked(std::uint64_t request, const Status& error) const;
  Status answer_asks();
  Status take_answers();

  const MpiSession& mpi_;
  const OwnerShard& own_;
  const std::chrono::milliseconds timeout_;
  const std::thread::id main_thread_;

  mutable std::mutex mutex_;
  mutable std::condition_variable answered_;   // a Call's remaining reached 0
  mutable std::condition_variable asks_queued_;
  mutable std::uint64_t next_request_ = 1;
  mutable std::map<std::uint64_t, Pending> pending_;  // by request number
  mutable std::vector<Outgoing> outgoing_;
  std::map<std::uint32_t, Status> dead_owners_;
  std::optional<Status> closed_;
  mutable Counters counters_;
};

}  // namespace shardmix
