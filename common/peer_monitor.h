// Failure detector for peer daemons (docs/decisions/0025-peer-failure-detector.md).
// Every interval (fault.peer_timeout / 10, at most 1 s) the daemon reads one byte of each
// peer's exposed cache arena: a heartbeat over the same fabric path that samples take, so
// a peer that can no longer serve samples is the peer that is declared dead. A peer is
// dead when
//   - a heartbeat read fails (tcp: the connection broke, e.g. the process died), or
//   - a heartbeat stays unanswered for fault.peer_timeout (a hung or unreachable node;
//     with manual progress a peer that stopped progressing looks the same), or
//   - a sample read from it fails with a transport error (report(), from the fetch path).
// The first failure is sticky; what to do about it is the daemon's policy (fault.peer_death).
// Peers that expose no memory (own no samples) cannot be read and are not monitored.
// The watcher's own pauses are not blamed on peers: a heartbeat's age is the time we
// watched it, and a gap between two poll() calls (the daemon's main thread did not run: a
// saturated machine, a stopped process, a long call on that thread) counts at most one
// heartbeat interval, since the answer may have sat unread in our own queues meanwhile. A
// silent peer is still declared dead after at most timeout / interval polls.
// Each answer's delay is measured (to the poll that sees it, so up to one poll period
// late) and the slowest kept, so an operator can see how close a job came to its timeout.
// Thread-safety: poll() from one thread (the daemon's main thread); report(), failure()
// and the heartbeat completions from any thread (one mutex inside guards the state).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace shardmix {

class PeerMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  // Posts one heartbeat read from `peer`; `done` runs once, on any thread.
  using Heartbeat = std::function<void(std::uint32_t peer, std::function<void(const Status&)> done)>;
  struct Failure {
    std::uint32_t rank = 0;
    std::string reason;  // "no answer to a heartbeat for 10.0 s (fault.peer_timeout)"
  };
  // What poll() saw of the heartbeats' answers and of its own pauses, for telemetry.
  struct Figures {
    std::chrono::microseconds slowest_answer{0};  // longest heartbeat round trip seen
    std::uint32_t slowest_rank = 0;               // the peer that took it
    std::chrono::microseconds longest_pause{0};   // longest gap between two poll() calls
    std::uint64_t pauses = 0;  // gaps longer than interval(): not counted in full (see above)
  };

  PeerMonitor(std::uint32_t self, std::uint32_t nodes, std::chrono::microseconds timeout, Heartbeat heartbeat);

  std::chrono::microseconds interval() const { return interval_; }
  std::chrono::microseconds timeout() const { return timeout_; }
  // Posts the heartbeats that are due and checks the overdue ones; the first failure.
  // Call it often, well under interval() apart: a longer gap is the watcher's own pause.
  std::optional<Failure> poll(Clock::time_point now = Clock::now());
  Figures figures() const;
  // The caller is about to stop calling poll() on purpose for a while (the daemon's
  // shutdown work on its main thread): the next gap is charged like a pause but is not
  // counted or logged as one.
  void pausing_on_purpose();
  // A read of a sample from `peer` failed: a transport error (kUnavailable) marks it dead;
  // cancellations (our own shutdown) and rejected requests do not.
  void report(std::uint32_t peer, const Status& status);
  std::optional<Failure> failure() const;
  // Degraded mode (fault.peer_death = degrade): the failure of `peer` has been acted on.
  // It is no longer watched, its later read errors are ignored, and if it was the sticky
  // failure that is cleared, so poll() goes on watching the others and reports the next.
  void forget(std::uint32_t peer);
  // Peers being watched (those that answered or have not been found unreadable).
  std::uint32_t monitored() const;

 private:
  struct State;
  std::uint32_t self_;
  std::chrono::microseconds timeout_;
  std::chrono::microseconds interval_;
  Heartbeat heartbeat_;
  std::shared_ptr<State> state_;  // shared with heartbeat completions that may outlive us
};

}  // namespace shardmix
