#include "common/peer_monitor.h"

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "common/log.h"

namespace shardmix {

struct PeerMonitor::State {
  struct Peer {
    bool monitored = true;
    bool outstanding = false;
    bool answered = false;  // an answer came since the last poll(): its delay is measured there
    bool paused_meanwhile = false;  // we paused while it was out: its delay measures us too
    Clock::time_point posted{};
    std::chrono::microseconds watched{0};  // how long we watched it go unanswered (see poll)
    Clock::time_point next{};  // when the next heartbeat is due
  };
  mutable std::mutex mutex;  // guards everything below
  std::vector<Peer> peers;
  std::optional<Failure> failure;
  std::optional<Clock::time_point> last_poll;
  bool on_purpose = false;  // the next gap is the caller's choice (pausing_on_purpose)
  Figures figures;

  void fail(std::uint32_t rank, std::string reason) {
    if (!failure) failure = Failure{rank, std::move(reason)};
  }
};

PeerMonitor::PeerMonitor(std::uint32_t self, std::uint32_t nodes, std::chrono::microseconds timeout,
                         Heartbeat heartbeat)
    : self_(self),
      timeout_(timeout),
      interval_(std::clamp<std::chrono::microseconds>(timeout / 10, std::chrono::milliseconds(10),
                                                      std::chrono::seconds(1))),
      heartbeat_(std::move(heartbeat)),
      state_(std::make_shared<State>()) {
  state_->peers.resize(nodes);
  if (self < nodes) state_->peers[self].monitored = false;
}

std::optional<PeerMonitor::Failure> PeerMonitor::poll(Clock::time_point now) {
  std::vector<std::uint32_t> due;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->failure) return state_->failure;
    Figures& figures = state_->figures;
    // Heartbeats age by the time this watcher was watching: a gap between two polls counts
    // at most one heartbeat interval. A longer gap is our own pause (the main thread was
    // held up), during which the answers may have sat unread in our own queues; counting
    // it in full would blame the peers. A peer that stays silent is still declared dead
    // after at most timeout / interval polls, however slowly they come.
    std::chrono::microseconds gap{0};
    if (state_->last_poll && now > *state_->last_poll) {
      gap = std::chrono::duration_cast<std::chrono::microseconds>(now - *state_->last_poll);
    }
    state_->last_poll = now;
    const bool paused = gap > interval_;
    const bool on_purpose = std::exchange(state_->on_purpose, false);
    if (!on_purpose) figures.longest_pause = std::max(figures.longest_pause, gap);
    if (paused && !on_purpose) {
      ++figures.pauses;
      if (gap >= timeout_ / 4) {
        log::get("peers")->warn("the failure detector did not run for {:.1f} s (this daemon's main thread was held "
                                "up: a saturated machine, a stopped process); heartbeats outstanding meanwhile are "
                                "charged {:.1f} s of it",
                                std::chrono::duration<double>(gap).count(),
                                std::chrono::duration<double>(interval_).count());
      }
    }
    for (std::uint32_t r = 0; r < state_->peers.size(); ++r) {
      State::Peer& p = state_->peers[r];
      if (!p.monitored) continue;
      if (p.answered && !paused && !p.paused_meanwhile) {  // else it would measure our pause
        const auto delay = std::chrono::duration_cast<std::chrono::microseconds>(now - p.posted);
        if (delay > figures.slowest_answer) {
          figures.slowest_answer = delay;
          figures.slowest_rank = r;
          if (delay >= timeout_ / 2) {
            log::get("peers")->warn("daemon rank {} answered a heartbeat after {:.1f} s, more than half of "
                                    "fault.peer_timeout ({:.1f} s)",
                                    r, std::chrono::duration<double>(delay).count(),
                                    std::chrono::duration<double>(timeout_).count());
          }
        }
      }
      p.answered = false;
      if (p.outstanding) {
        p.watched += std::min(gap, interval_);
        p.paused_meanwhile = p.paused_meanwhile || paused;
        if (p.watched >= timeout_) {
          const double seconds = std::chrono::duration<double>(now - p.posted).count();
          state_->fail(r, fmt::format("no answer to a heartbeat read for {:.1f} s (fault.peer_timeout = {:.1f} s)",
                                      seconds, std::chrono::duration<double>(timeout_).count()));
          // No early return: heartbeats already marked outstanding in this pass must still
          // be posted, or (degraded mode, where watching goes on) a live peer would be
          // declared dead a timeout later for a heartbeat that was never sent.
        }
        continue;
      }
      if (now >= p.next) {
        p.outstanding = true;
        p.posted = now;
        p.watched = std::chrono::microseconds{0};
        p.paused_meanwhile = false;
        p.next = now + interval_;
        due.push_back(r);
      }
    }
  }
  // Outside the lock: a completion may run inline.
  for (std::uint32_t r : due) {
    std::weak_ptr<State> weak = state_;
    heartbeat_(r, [weak, r](const Status& status) {
      auto state = weak.lock();
      if (!state) return;
      std::lock_guard lock(state->mutex);
      State::Peer& p = state->peers[r];
      p.outstanding = false;
      if (!p.monitored) return;  // forgotten (degraded mode) while the heartbeat was out
      p.answered = status.ok();
      if (status.ok() || status.code() == StatusCode::kCancelled) return;  // answered, or we are stopping
      if (status.code() == StatusCode::kInvalidArgument) {
        p.monitored = false;  // e.g. the peer exposes no memory: nothing to read
        return;
      }
      state->fail(r, "a heartbeat read failed: " + status.message());
    });
  }
  std::lock_guard lock(state_->mutex);
  return state_->failure;
}

void PeerMonitor::report(std::uint32_t peer, const Status& status) {
  if (status.ok() || status.code() != StatusCode::kUnavailable || peer == self_) return;
  std::lock_guard lock(state_->mutex);
  if (peer >= state_->peers.size() || !state_->peers[peer].monitored) return;
  state_->fail(peer, "a sample read failed: " + status.message());
}

void PeerMonitor::forget(std::uint32_t peer) {
  std::lock_guard lock(state_->mutex);
  if (peer >= state_->peers.size()) return;
  state_->peers[peer].monitored = false;
  state_->peers[peer].outstanding = false;
  if (state_->failure && state_->failure->rank == peer) state_->failure.reset();
}

void PeerMonitor::pausing_on_purpose() {
  std::lock_guard lock(state_->mutex);
  state_->on_purpose = true;
}

PeerMonitor::Figures PeerMonitor::figures() const {
  std::lock_guard lock(state_->mutex);
  return state_->figures;
}

std::optional<PeerMonitor::Failure> PeerMonitor::failure() const {
  std::lock_guard lock(state_->mutex);
  return state_->failure;
}

std::uint32_t PeerMonitor::monitored() const {
  std::lock_guard lock(state_->mutex);
  return static_cast<std::uint32_t>(
      std::count_if(state_->peers.begin(), state_->peers.end(), [](const State::Peer& p) { return p.monitored; }));
}

}  // namespace shardmix
