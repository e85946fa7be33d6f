// A dead peer must not stall reads of the live ones (decision 0032). Three fabrics in one
// process (ranks 0..2 over tcp;ofi_rxm on loopback); rank 2's is destroyed, which closes
// its endpoint and listener as a SIGKILL would. libfabric 1.17's rxm then answers every
// fi_read to rank 2 with -FI_EAGAIN (each call starts a new connect that is refused), so a
// read queue served strictly in order stalls behind the first read to rank 2: these tests
// hang-and-fail on that, under a timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "fabric/fabric.h"

namespace shardmix::fabric {
namespace fabric_dead_peer_test {

constexpr std::size_t kExposed = 64 * 1024;
constexpr auto kTimeout = std::chrono::seconds(20);

// One read's outcome, waited for from the test thread. The callback shares the state, so
// a read that completes after a failed assertion ended the test writes to live memory.
class Outcome {
 public:
  ReadCallback callback() {
    return [state = state_](const Status& status) {
      std::lock_guard lock(state->mutex);
      state->status = status;
      state->cv.notify_all();
    };
  }
  // nullopt when the read did not complete within kTimeout.
  std::optional<Status> wait() {
    std::unique_lock lock(state_->mutex);
    if (!state_->cv.wait_for(lock, kTimeout, [&] { return state_->status.has_value(); })) return std::nullopt;
    return state_->status;
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::optional<Status> status;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

struct Node {
  std::unique_ptr<Fabric> fabric;
  std::vector<std::uint8_t> exposed;
  std::vector<std::uint8_t> target;
  LocalRegion local;
};

// One fabric per node on this host: each exposes kExposed bytes of 0x10 + rank, registers
// a target of `target_bytes` and knows every node's endpoint. Progress is not started.
void create_connected_nodes(std::vector<Node>& nodes, const FabricOptions& options, std::size_t target_bytes) {
  std::vector<std::vector<std::uint8_t>> blobs;
  const int size = static_cast<int>(nodes.size());
  for (int rank = 0; rank < size; ++rank) {
    Node& node = nodes[static_cast<std::size_t>(rank)];
    auto created = Fabric::create(options, rank, size);
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    node.fabric = std::move(*created);
    node.exposed.assign(kExposed, static_cast<std::uint8_t>(0x10 + rank));
    ASSERT_TRUE(node.fabric->expose(node.exposed.data(), node.exposed.size()).ok());
    node.target.assign(target_bytes, 0);
    auto local = node.fabric->register_local(node.target.data(), node.target.size());
    ASSERT_TRUE(local.ok()) << local.status().to_string();
    node.local = *local;
    blobs.push_back(node.fabric->endpoint_blob());
  }
  for (Node& node : nodes) ASSERT_TRUE(node.fabric->connect_peers(blobs).ok());
}

class FabricDeadPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const FabricOptions options{.provider = "tcp", .interface = "lo", .max_outstanding_reads = 4};
    nodes_.resize(3);
    ASSERT_NO_FATAL_FAILURE(create_connected_nodes(nodes_, options, kExposed * 8));
    for (Node& node : nodes_) node.fabric->start_progress();
    // Connect rank 0 to both peers while they are alive.
    for (int peer : {1, 2}) {
      Outcome outcome;
      read_from(peer, 0, outcome);
      auto status = outcome.wait();
      ASSERT_TRUE(status.has_value()) << "read from live peer " << peer << " did not complete";
      ASSERT_TRUE(status->ok()) << status->to_string();
    }
  }

  // Every fabric stops (its progress thread may still be serving a peer's read of
  // `exposed`, or landing one in `target`) before any buffer is freed.
  void TearDown() override {
    for (Node& node : nodes_) node.fabric.reset();
  }

  void read_from(int peer, std::size_t target_slot, Outcome& outcome) {
    Node& reader = nodes_[0];
    reader.fabric->read(peer, 0, 4096, reader.local, target_slot * kExposed, outcome.callback());
  }

  void kill_rank_2() { nodes_[2].fabric.reset(); }

  std::vector<Node> nodes_;
};

TEST_F(FabricDeadPeerTest, ReadsOfALivePeerAreNotHeldUpByReadsOfADeadOne) {
  kill_rank_2();
  // More reads to the dead peer than max_outstanding_reads, queued ahead of a live one.
  std::vector<Outcome> to_dead(6);
  for (std::size_t i = 0; i < to_dead.size(); ++i) read_from(2, 1 + i % 6, to_dead[i]);
  Outcome to_live;
  read_from(1, 7, to_live);
  auto live = to_live.wait();
  ASSERT_TRUE(live.has_value()) << "a read of live rank 1 queued behind reads of dead rank 2 never completed";
  EXPECT_TRUE(live->ok()) << live->to_string();
  EXPECT_EQ(nodes_[0].target[7 * kExposed], 0x11);

  // Failing the peer ends every read still waiting for it, naming the peer and the reason.
  nodes_[0].fabric->fail_peer(2, make_error(StatusCode::kUnavailable, "declared dead by the test"));
  for (Outcome& outcome : to_dead) {
    auto status = outcome.wait();
    ASSERT_TRUE(status.has_value()) << "a read of dead rank 2 never completed after fail_peer";
    EXPECT_FALSE(status->ok());
  }
}

TEST_F(FabricDeadPeerTest, AFailedPeerIsNotReadAgainAndTheOthersStillAre) {
  kill_rank_2();
  nodes_[0].fabric->fail_peer(2, make_error(StatusCode::kUnavailable, "declared dead by the test"));
  const std::uint64_t posted_before = nodes_[0].fabric->stats().reads_posted;
  Outcome to_dead;
  read_from(2, 1, to_dead);
  auto dead = to_dead.wait();
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->code(), StatusCode::kUnavailable);
  EXPECT_NE(dead->message().find("peer 2"), std::string::npos) << dead->message();
  EXPECT_NE(dead->message().find("declared dead by the test"), std::string::npos) << dead->message();
  EXPECT_EQ(nodes_[0].fabric->stats().reads_posted, posted_before) << "the read reached the provider";
  // Many rounds of live reads: the live capacity is not eaten by the failed peer.
  for (int round = 0; round < 20; ++round) {
    std::vector<Outcome> live(4);
    for (std::size_t i = 0; i < live.size(); ++i) read_from(1, i, live[i]);
    for (Outcome& outcome : live) {
      auto status = outcome.wait();
      ASSERT_TRUE(status.has_value()) << "round " << round << ": a read of live rank 1 never completed";
      ASSERT_TRUE(status->ok()) << status->to_string();
    }
  }
}


// With 3+ ranks one peer may hold all but one read slot; with a single slot a hung peer
// would hold everything (live peers' heartbeats then time out), so create() refuses it and
// names the key.
TEST(FabricHeartbeat, OneOutstandingReadIsRefusedWithThreeRanks) {
  const FabricOptions options{.provider = "tcp", .interface = "lo", .max_outstanding_reads = 1};
  auto three = Fabric::create(options, 0, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(three.status().message().find("fabric.max_outstanding_reads"), std::string::npos)
      << three.status().message();
  auto two = Fabric::create(options, 0, 2);  // one peer: nothing to keep a slot for
  EXPECT_TRUE(two.ok()) << two.status().to_string();
}

// A heartbeat does not wait behind its peer's queued data reads: queued after 40 of them
// (before the progress thread starts, so the queue order is fixed), it completes first.
// With max_outstanding_reads = 2 and 3 ranks a peer gets one slot, so rank 1's reads go one
// at a time in posting order; a heartbeat posted as a plain read would complete last, and
// under a hung peer holding the other slot it would time out behind live data reads.
TEST(FabricHeartbeat, HeartbeatGoesAheadOfQueuedDataReads) {
  const FabricOptions options{.provider = "tcp", .interface = "lo", .max_outstanding_reads = 2};
  std::vector<Node> nodes(3);
  ASSERT_NO_FATAL_FAILURE(create_connected_nodes(nodes, options, kExposed));
  nodes[1].fabric->start_progress();
  nodes[2].fabric->start_progress();

  struct Order {
    std::mutex mutex;
    std::vector<int> completed;  // -1 = the heartbeat, i = data read i
    std::vector<Status> statuses;
  };
  auto order = std::make_shared<Order>();
  auto record = [order](int which) {
    return [order, which](const Status& status) {
      std::lock_guard lock(order->mutex);
      order->completed.push_back(which);
      order->statuses.push_back(status);
    };
  };
  constexpr int kDataReads = 40;
  Node& reader = nodes[0];
  for (int i = 0; i < kDataReads; ++i) {
    reader.fabric->read(1, 0, 1024, reader.local, static_cast<std::size_t>(i) * 1024, record(i));
  }
  Outcome heartbeat;
  reader.fabric->heartbeat_read(1, 0, 1, reader.local, kExposed - 1, [order, done = heartbeat.callback()](const Status& s) {
    {
      std::lock_guard lock(order->mutex);
      order->completed.push_back(-1);
      order->statuses.push_back(s);
    }
    done(s);
  });
  reader.fabric->start_progress();
  auto status = heartbeat.wait();
  ASSERT_TRUE(status.has_value()) << "the heartbeat never completed";
  EXPECT_TRUE(status->ok()) << status->to_string();
  EXPECT_EQ(reader.target[kExposed - 1], 0x11);
  // Every read completes; the heartbeat first.
  for (int spin = 0; spin < 2000; ++spin) {
    {
      std::lock_guard lock(order->mutex);
      if (order->completed.size() == kDataReads + 1) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard lock(order->mutex);
  ASSERT_EQ(order->completed.size(), static_cast<std::size_t>(kDataReads + 1));
  EXPECT_EQ(order->completed.front(), -1) << "the heartbeat waited behind data reads";
  for (const Status& s : order->statuses) EXPECT_TRUE(s.ok()) << s.to_string();
  for (Node& node : nodes) node.fabric.reset();
}

}  // namespace fabric_dead_peer_test
}  // namespace shardmix::fabric
