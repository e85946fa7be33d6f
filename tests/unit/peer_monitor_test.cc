// The failure detector alone, with a fake heartbeat: which peer is declared dead, when
// (counted in poll() calls at given instants, not in wall-clock time), and why.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "common/peer_monitor.h"

namespace shardmix {
namespace peer_monitor_test {

using namespace std::chrono_literals;
using Clock = PeerMonitor::Clock;

// Holds every heartbeat until the test answers it.
struct FakeHeartbeats {
  std::map<std::uint32_t, std::vector<std::function<void(const Status&)>>> pending;
  int posted = 0;
  PeerMonitor::Heartbeat hook() {
    return [this](std::uint32_t peer, std::function<void(const Status&)> done) {
      ++posted;
      pending[peer].push_back(std::move(done));
    };
  }
  void answer(std::uint32_t peer, const Status& s = Status::ok_status()) {
    auto waiting = std::move(pending[peer]);
    pending[peer].clear();
    for (auto& done : waiting) done(s);
  }
};

// Every test's fake heartbeats, and the instant its polls count from.
class PeerMonitorTest : public ::testing::Test {
 protected:
  FakeHeartbeats hb;
  const Clock::time_point t0{};
};

TEST_F(PeerMonitorTest, AnsweringPeersAreNeverDeclaredDead) {
  PeerMonitor monitor(0, 3, 2s, hb.hook());
  EXPECT_EQ(monitor.interval(), 200ms);
  for (int i = 0; i < 100; ++i) {  // 100 intervals = 10 timeouts
    EXPECT_FALSE(monitor.poll(t0 + i * 200ms).has_value()) << "poll " << i;
    hb.answer(1);
    hb.answer(2);
  }
  EXPECT_EQ(hb.posted, 200);  // one per peer per interval, never to ourselves
  EXPECT_EQ(monitor.monitored(), 2u);
}

TEST_F(PeerMonitorTest, AnUnansweredHeartbeatMakesThePeerDeadAfterTheTimeout) {
  PeerMonitor monitor(1, 3, 2s, hb.hook());
  std::optional<PeerMonitor::Failure> dead;
  int polls = 0;
  for (auto t = t0; !dead && t < t0 + 10s; t += 100ms, ++polls) {
    dead = monitor.poll(t);
    hb.answer(0);  // peer 0 answers, peer 2 is silent (a hung or unreachable node)
  }
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->rank, 2u);
  EXPECT_NE(dead->reason.find("no answer to a heartbeat read for 2.0 s"), std::string::npos) << dead->reason;
  EXPECT_EQ(polls, 21);  // posted at t0, declared at t0 + 2 s: the bound is the timeout
  // Sticky: the first failure stays the answer.
  hb.answer(2, Status(StatusCode::kUnavailable, "late"));
  EXPECT_EQ(monitor.poll(t0 + 20s)->rank, 2u);
}

TEST_F(PeerMonitorTest, AFailedHeartbeatOrSampleReadMakesThePeerDeadAtOnce) {
  PeerMonitor monitor(0, 4, 10s, hb.hook());
  EXPECT_FALSE(monitor.poll(t0).has_value());
  hb.answer(3, Status(StatusCode::kUnavailable, "read from peer 3: Transport endpoint is not connected"));
  auto dead = monitor.poll(t0 + 1ms);
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->rank, 3u);
  EXPECT_NE(dead->reason.find("a heartbeat read failed: read from peer 3"), std::string::npos) << dead->reason;

  PeerMonitor by_sample(0, 4, 10s, hb.hook());
  by_sample.report(2, Status(StatusCode::kUnavailable, "read from peer 2: connection reset"));
  ASSERT_TRUE(by_sample.failure().has_value());
  EXPECT_EQ(by_sample.failure()->rank, 2u);
  EXPECT_NE(by_sample.failure()->reason.find("a sample read failed"), std::string::npos);
}

TEST_F(PeerMonitorTest, OurOwnShutdownAndUnreadablePeersAreNotFailures) {
  PeerMonitor monitor(0, 3, 1s, hb.hook());
  EXPECT_FALSE(monitor.poll(t0).has_value());
  hb.answer(1, Status(StatusCode::kCancelled, "read from peer 1: the fabric has stopped"));
  hb.answer(2, Status(StatusCode::kInvalidArgument, "read from peer 2: the peer exposes no memory"));
  monitor.report(1, Status(StatusCode::kCancelled, "cancelled by stop_progress"));
  EXPECT_FALSE(monitor.poll(t0 + 100ms).has_value());
  EXPECT_EQ(monitor.monitored(), 1u);  // peer 2 owns nothing: not watched any more
  for (auto t = t0 + 200ms; t < t0 + 5s; t += 100ms) {
    EXPECT_FALSE(monitor.poll(t).has_value());
    hb.answer(1);
  }
  EXPECT_TRUE(hb.pending[2].empty());
}

TEST_F(PeerMonitorTest, AForgottenPeerIsNotWatchedAndTheNextFailureIsReported) {
  // Degraded mode: rank 3 died and was acted on; the others are still watched, rank 3's
  // late errors and heartbeats are ignored, and a second death is reported on its own.
  PeerMonitor monitor(0, 4, 1s, hb.hook());
  EXPECT_FALSE(monitor.poll(t0).has_value());
  hb.answer(3, Status(StatusCode::kUnavailable, "read from peer 3: connection refused"));
  ASSERT_EQ(monitor.poll(t0 + 1ms)->rank, 3u);
  monitor.forget(3);
  EXPECT_FALSE(monitor.failure().has_value());
  EXPECT_EQ(monitor.monitored(), 2u);
  monitor.report(3, Status(StatusCode::kUnavailable, "read from peer 3: not posted, the peer was failed"));
  const int posted = hb.posted;
  for (auto t = t0 + 100ms; t < t0 + 3s; t += 100ms) {
    EXPECT_FALSE(monitor.poll(t).has_value()) << "at " << (t - t0).count();
    hb.answer(1);
    hb.answer(2);
  }
  EXPECT_TRUE(hb.pending[3].empty()) << "a forgotten peer got heartbeats";
  EXPECT_GT(hb.posted, posted);
  // Rank 2 now stops answering: reported after the timeout, naming rank 2.
  std::optional<PeerMonitor::Failure> dead;
  for (auto t = t0 + 3s; !dead && t < t0 + 10s; t += 100ms) {
    dead = monitor.poll(t);
    hb.answer(1);
  }
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->rank, 2u);
}

TEST_F(PeerMonitorTest, TheHeartbeatsDueWhenAPeerTimesOutAreStillSent) {
  // Rank 2 goes silent; rank 0's heartbeat falls due in the very poll that declares rank
  // 2 dead. It must still be posted: after forget(2) a live rank 0 is never declared dead.
  PeerMonitor monitor(1, 3, 1s, hb.hook());
  ASSERT_EQ(monitor.interval(), 100ms);
  std::optional<PeerMonitor::Failure> dead;
  auto t = t0;
  for (; !dead && t < t0 + 5s; t += 100ms) {
    dead = monitor.poll(t);
    hb.answer(0);
  }
  ASSERT_TRUE(dead.has_value());
  ASSERT_EQ(dead->rank, 2u);
  monitor.forget(2);
  for (; t < t0 + 10s; t += 100ms) {
    auto again = monitor.poll(t);
    ASSERT_FALSE(again.has_value()) << "live rank " << again->rank << " declared dead: " << again->reason;
    hb.answer(0);
  }
}

TEST_F(PeerMonitorTest, TheWatchersOwnPauseIsNotCountedAgainstThePeers) {
  // The daemon's main thread stops for 30 s (a saturated machine): rank 1's answer may have
  // sat unread in our queues meanwhile. The pause counts one interval, not 30 s.
  PeerMonitor monitor(0, 2, 2s, hb.hook());
  ASSERT_EQ(monitor.interval(), 200ms);
  EXPECT_FALSE(monitor.poll(t0).has_value());
  EXPECT_FALSE(monitor.poll(t0 + 30s).has_value());
  hb.answer(1);
  for (auto t = t0 + 30s + 100ms; t < t0 + 60s; t += 100ms) {
    ASSERT_FALSE(monitor.poll(t).has_value()) << "at " << (t - t0).count();
    hb.answer(1);
  }
  const PeerMonitor::Figures f = monitor.figures();
  EXPECT_EQ(f.pauses, 1u);
  EXPECT_EQ(f.longest_pause, 30s);
  EXPECT_EQ(f.slowest_answer, 100ms);  // the answer seen after the pause is not measured
}

TEST_F(PeerMonitorTest, AGapTheCallerChoseIsChargedLikeAPauseButNotCountedAsOne) {
  PeerMonitor monitor(0, 2, 2s, hb.hook());
  EXPECT_FALSE(monitor.poll(t0).has_value());
  monitor.pausing_on_purpose();  // e.g. the daemon drains its checkpoints before the barrier
  EXPECT_FALSE(monitor.poll(t0 + 60s).has_value());
  hb.answer(1);
  EXPECT_FALSE(monitor.poll(t0 + 60s + 100ms).has_value());
  EXPECT_EQ(monitor.figures().pauses, 0u);
  EXPECT_EQ(monitor.figures().longest_pause, 100ms);
  // Only the next gap: a later one is a pause again.
  EXPECT_FALSE(monitor.poll(t0 + 70s).has_value());
  EXPECT_EQ(monitor.figures().pauses, 1u);
}

TEST_F(PeerMonitorTest, ASilentPeerIsFoundEvenWhenTheWatcherOnlyRunsNowAndThen) {
  // Every poll comes late (3 s apart, past the 200 ms interval): each gap counts one
  // interval, so a silent peer is declared dead at the tenth poll after its heartbeat.
  PeerMonitor monitor(0, 2, 2s, hb.hook());
  std::optional<PeerMonitor::Failure> dead;
  int polls = 0;
  for (auto t = t0; !dead && t < t0 + 10min; t += 3s, ++polls) dead = monitor.poll(t);
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->rank, 1u);
  EXPECT_EQ(polls, 11);  // posted at the first, declared at the eleventh
  EXPECT_NE(dead->reason.find("no answer to a heartbeat read for 30.0 s"), std::string::npos) << dead->reason;
}

TEST_F(PeerMonitorTest, TheSlowestAnswerIsKeptWithItsPeer) {
  PeerMonitor monitor(0, 3, 10s, hb.hook());
  ASSERT_EQ(monitor.interval(), 1s);
  EXPECT_FALSE(monitor.poll(t0).has_value());
  hb.answer(1);
  EXPECT_FALSE(monitor.poll(t0 + 100ms).has_value());  // rank 1: 100 ms
  for (auto t = t0 + 200ms; t <= t0 + 700ms; t += 100ms) EXPECT_FALSE(monitor.poll(t).has_value());
  hb.answer(2);
  EXPECT_FALSE(monitor.poll(t0 + 800ms).has_value());  // rank 2: 800 ms
  const PeerMonitor::Figures f = monitor.figures();
  EXPECT_EQ(f.slowest_answer, 800ms);
  EXPECT_EQ(f.slowest_rank, 2u);
  EXPECT_EQ(f.pauses, 0u);
  EXPECT_EQ(f.longest_pause, 100ms);
}

}  // namespace peer_monitor_test
}  // namespace shardmix
