// CheckpointNode (common/checkpoint_node.h): daemons' checkpoint absorption connected in
// one process by a loopback replicator, with the faults the daemon must survive: the owner
// dying after a save returned, a file system that fails, a full RAM budget.
#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <limits>
#include <thread>

#include "common/checkpoint_file.h"
#include "common/checkpoint_node.h"
#include "tests/support/temp_dir.h"

namespace shardmix {
namespace checkpoint_node_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::vector<std::uint8_t> pattern(std::size_t size, std::uint8_t seed) {
  std::vector<std::uint8_t> data(size);
  for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<std::uint8_t>(seed + i * 13);
  return data;
}

CheckpointBytesPtr owned(const std::vector<std::uint8_t>& data) { return std::make_shared<OwnedCheckpointBytes>(data); }

// What load() found, as plain bytes (empty if it found nothing).
std::vector<std::uint8_t> loaded(CheckpointNode& node, const std::string& name) {
  const Result<CheckpointBytesPtr> bytes = node.load(name);
  if (!bytes.ok()) {
    ADD_FAILURE() << bytes.status().to_string();
    return {};
  }
  const auto span = (*bytes)->bytes();
  return {span.begin(), span.end()};
}

// Nodes of one test, and the loopback transport between them: a copy is a deep copy into
// the holder's accept_replica (as the holder's read of the owner's memory would be);
// `hold_copies` parks copies until deliver_held() so a test can look at a save in flight.
class Cluster {
 public:
  class Replicator : public CheckpointReplicator {
   public:
    Replicator(Cluster& cluster, std::int32_t self) : cluster_(cluster), self_(self) {}
    void copy(std::int32_t holder, const CheckpointId& id, CheckpointBytesPtr bytes,
              std::function<void(const Status&)> done) override {
      std::unique_lock lock(cluster_.mutex_);
      if (cluster_.hold_copies_) {
        cluster_.held_.push_back([this, holder, id, bytes, done] { deliver(holder, id, bytes, done); });
        return;
      }
      lock.unlock();
      deliver(holder, id, bytes, done);
    }
    void release(std::int32_t holder, const CheckpointId& id) override {
      if (CheckpointNode* node = cluster_.node(holder)) node->release_replica(id);
    }

   private:
    void deliver(std::int32_t holder, const CheckpointId& id, const CheckpointBytesPtr& bytes,
                 const std::function<void(const Status&)>& done) {
      CheckpointNode* node = cluster_.node(holder);
      if (node == nullptr) return done(Status(StatusCode::kUnavailable, "rank is dead"));
      const auto span = bytes->bytes();
      done(node->accept_replica(self_, id, owned(std::vector<std::uint8_t>(span.begin(), span.end()))));
    }
    Cluster& cluster_;
    std::int32_t self_;
  };

  explicit Cluster(std::vector<std::string> domains) : domains_(std::move(domains)) {
    for (std::size_t r = 0; r < domains_.size(); ++r) {
      replicators_.push_back(std::make_unique<Replicator>(*this, static_cast<std::int32_t>(r)));
    }
    nodes_.resize(domains_.size());
  }

  CheckpointNode& start(std::int32_t rank, const fs::path& dir, std::uint64_t capacity,
                        WhenFull when_full = WhenFull::kWait) {
    CheckpointNodeOptions options;
    options.rank = rank;
    options.dir = dir;
    options.capacity_bytes = capacity;
    options.when_full = when_full;
    options.domains = domains_;
    options.retry_interval = 5ms;
    Result<std::unique_ptr<CheckpointNode>> node =
        CheckpointNode::start(options, replicators_[static_cast<std::size_t>(rank)].get());
    if (!node.ok()) ADD_FAILURE() << node.status().to_string();
    std::lock_guard lock(mutex_);
    nodes_[static_cast<std::size_t>(rank)] = std::move(node).value();
    return *nodes_[static_cast<std::size_t>(rank)];
  }

  // SIGKILL, as far as the others can tell: gone, its drain never finishes, and every
  // survivor learns of it from its failure detector.
  void kill(std::int32_t rank) {
    std::unique_ptr<CheckpointNode> dead;
    {
      std::lock_guard lock(mutex_);
      dead = std::move(nodes_[static_cast<std::size_t>(rank)]);
    }
    dead.reset();
    for (std::size_t r = 0; r < nodes_.size(); ++r) {
      if (CheckpointNode* node = this->node(static_cast<std::int32_t>(r))) node->peer_died(rank);
    }
  }

  CheckpointNode* node(std::int32_t rank) {
    std::lock_guard lock(mutex_);
    return nodes_[static_cast<std::size_t>(rank)].get();
  }

  void hold_copies(bool hold) {
    std::lock_guard lock(mutex_);
    hold_copies_ = hold;
  }
  void deliver_held() {
    std::vector<std::function<void()>> held;
    {
      std::lock_guard lock(mutex_);
      held.swap(held_);
    }
    for (auto& deliver : held) deliver();
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> domains_;
  std::vector<std::unique_ptr<Replicator>> replicators_;
  std::vector<std::unique_ptr<CheckpointNode>> nodes_;
  bool hold_copies_ = false;
  std::vector<std::function<void()>> held_;
};

std::future<Result<CheckpointId>> save(CheckpointNode& node, const std::string& name, const std::vector<std::uint8_t>& data) {
  auto promise = std::make_shared<std::promise<Result<CheckpointId>>>();
  std::future<Result<CheckpointId>> future = promise->get_future();
  node.save(name, owned(data), [promise](Result<CheckpointId> result) { promise->set_value(std::move(result)); });
  return future;
}

Status wait_durable(CheckpointNode& node, const std::string& name) {
  std::promise<Status> promise;
  std::future<Status> future = promise.get_future();
  node.wait_durable(name, [&promise](const Status& status) { promise.set_value(status); });
  return future.get();
}

// Until the drain's retry succeeds: each call either fails at once (the last attempt
// failed) or waits for the next attempt.
void wait_until_durable(CheckpointNode& node, const std::string& name) {
  while (!wait_durable(node, name).ok()) std::this_thread::sleep_for(1ms);
}

// A file where the directory should be: every write below it fails, as on a broken mount.
void block(const fs::path& dir) {
  fs::remove_all(dir);
  std::ofstream(dir) << "not a directory";
}
void unblock(const fs::path& dir) {
  fs::remove(dir);
  fs::create_directories(dir);
}

class CheckpointNodeTest : public test_support::TempDirTest {
 protected:
  CheckpointNodeTest() : TempDirTest("ckptnode") {}
};

TEST_F(CheckpointNodeTest, SaveReturnsOnlyOnceAPeerInAnotherDomainHoldsACopyThenDrains) {
  Cluster cluster({"hostA", "hostA", "hostB"});
  CheckpointNode& owner = cluster.start(0, dir_ / "shared", 1 << 20);
  CheckpointNode& same_host = cluster.start(1, dir_ / "shared", 1 << 20);
  CheckpointNode& other_host = cluster.start(2, dir_ / "shared", 1 << 20);
  const std::vector<std::uint8_t> data = pattern(5000, 1);

  cluster.hold_copies(true);
  std::future<Result<CheckpointId>> saved = save(owner, "model", data);
  EXPECT_EQ(saved.wait_for(0s), std::future_status::timeout);  // the copy has not landed
  EXPECT_EQ(owner.load("model").status().code(), StatusCode::kNotFound);  // nor is it visible
  cluster.hold_copies(false);
  cluster.deliver_held();
  const Result<CheckpointId> id = saved.get();
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  EXPECT_EQ(*id, (CheckpointId{"model", 1}));
  EXPECT_EQ(loaded(owner, "model"), data);
  EXPECT_TRUE(same_host.list().empty());
  EXPECT_EQ(other_host.list(), std::vector<CheckpointId>{*id});  // the replica, readable there too
  EXPECT_EQ(loaded(other_host, "model"), data);

  ASSERT_TRUE(wait_durable(owner, "model").ok());
  EXPECT_EQ(*read_checkpoint_file(dir_ / "shared", *id), data);
  EXPECT_EQ(owner.stats().store.bytes_waiting, 0u);
  EXPECT_EQ(owner.stats().store.bytes_drained, data.size());
  EXPECT_EQ(owner.stats().saves, 1u);
}

// A buffer is filled before the store admits it, so the node must make room in its pool
// by the pool's free chunks, not by the store's budget: here the store has room for the
// new buffer but the pool does not, because another buffer is still being filled. The
// durable version goes first and the new buffer gets reused pages (decision 0068).
TEST_F(CheckpointNodeTest, ABufferTakesTheChunksOfDurableVersionsEvenWhileAnotherIsBeingFilled) {
  Cluster cluster({"h"});
  constexpr std::uint64_t kUnit = 8ull << 20;  // whole pool chunks (2 MiB)
  // checkpoint.capacity of 4 units; the pool has 8 spare chunks (2 units) on top: 6.
  CheckpointNode& node = cluster.start(0, dir_ / "ckpt", 4 * kUnit);
  Result<std::shared_ptr<CheckpointBuffer>> first = node.allocate(2 * kUnit, "model@1");
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE((*first)->pooled());
  std::promise<Result<CheckpointId>> saved;
  node.save("model", std::move(*first), [&saved](Result<CheckpointId> id) { saved.set_value(std::move(id)); });
  ASSERT_TRUE(saved.get_future().get().ok());
  ASSERT_TRUE(wait_durable(node, "model").ok());  // durable, in the store and in 2 units of the pool

  auto filling = node.allocate(3 * kUnit, "rank1@1");  // a replica landing: 5 of 6 units in use
  ASSERT_TRUE(filling.ok());
  EXPECT_TRUE((*filling)->pooled());
  // The store has 2 of its 4 units free, but the pool only 1.
  auto next = node.allocate(2 * kUnit, "model@2");
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE((*next)->pooled());
  EXPECT_EQ(node.stats().pool.overflows, 0u);
  EXPECT_EQ(node.stats().store.versions_in_ram, 0u);  // model@1 was durable: evicted for it
  EXPECT_EQ(loaded(node, "model").size(), 2 * kUnit);  // and still readable, from its file
}

// A buffer larger than the whole pool overflows whatever is evicted, so nothing is: the
// durable versions stay in RAM for loads. (Only write_through ever saves such a version.)
TEST_F(CheckpointNodeTest, ABufferLargerThanThePoolEvictsNothing) {
  Cluster cluster({"h"});
  constexpr std::uint64_t kUnit = 8ull << 20;
  CheckpointNode& node = cluster.start(0, dir_ / "ckpt", 2 * kUnit, WhenFull::kWriteThrough);  // pool: 4 units
  ASSERT_TRUE(save(node, "model", pattern(1000, 2)).get().ok());
  ASSERT_TRUE(wait_durable(node, "model").ok());
  ASSERT_EQ(node.stats().store.versions_in_ram, 1u);
  auto huge = node.allocate(5 * kUnit, "model@2");
  ASSERT_TRUE(huge.ok()) << huge.status().to_string();
  EXPECT_FALSE((*huge)->pooled());
  EXPECT_EQ(node.stats().store.versions_in_ram, 1u);
}

// A lease asks for its size before any byte exists, so a raw client can ask for anything.
// A size past off_t, which no memfd holds, is refused before any memory is taken, naming
// the checkpoint; the pool is untouched and the next buffer is served. A size past
// checkpoint.capacity is not refused here, under either when_full: a lease is an upper
// bound (shardmix.torch.save asks for its tensors plus 1 MiB), so it overflows, and the
// save is judged by the size committed.
TEST_F(CheckpointNodeTest, ABufferNoMemfdCouldHoldIsRefusedBeforeAnyMemoryIsTaken) {
  constexpr std::uint64_t kCapacity = 4ull << 20;
  Cluster waiting({"h"});
  CheckpointNode& wait = waiting.start(0, dir_ / "wait", kCapacity, WhenFull::kWait);
  Cluster writing_through({"h"});
  CheckpointNode& through = writing_through.start(0, dir_ / "through", kCapacity, WhenFull::kWriteThrough);
  for (CheckpointNode* node : {&wait, &through}) {
    for (std::uint64_t size : {std::numeric_limits<std::uint64_t>::max(), std::numeric_limits<std::uint64_t>::max() - 1,
                               std::uint64_t{(1ull << 63) + 5}}) {
      Result<std::shared_ptr<CheckpointBuffer>> buffer = node->allocate(size, "rank7");
      ASSERT_FALSE(buffer.ok()) << size << " bytes were allocated";
      EXPECT_NE(buffer.status().message().find("rank7"), std::string::npos) << buffer.status().message();
    }
    EXPECT_EQ(node->stats().pool.bytes_in_use, 0u);
    EXPECT_EQ(node->stats().pool.overflows, 0u);
    auto fits = node->allocate(kCapacity, "rank7");
    ASSERT_TRUE(fits.ok()) << fits.status().to_string();
    EXPECT_TRUE((*fits)->pooled());
    auto past_capacity = node->allocate(2 * kCapacity, "rank7");
    ASSERT_TRUE(past_capacity.ok()) << past_capacity.status().to_string();
    EXPECT_EQ((*past_capacity)->bytes().size(), 2 * kCapacity);
  }
}

TEST_F(CheckpointNodeTest, OwnerKilledRightAfterSaveReturnsItsReplicaHolderDrainsIt) {
  Cluster cluster({"hostA", "hostB"});
  const fs::path owner_dir = dir_ / "owner_view";  // the owner's mount, broken before it can drain
  CheckpointNode& owner = cluster.start(0, owner_dir, 1 << 20);
  CheckpointNode& holder = cluster.start(1, dir_ / "shared", 1 << 20);
  block(owner_dir);
  const std::vector<std::uint8_t> data = pattern(3000, 2);
  const Result<CheckpointId> id = save(owner, "rank0", data).get();
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  EXPECT_FALSE(fs::exists(checkpoint_file_path(dir_ / "shared", *id)));

  cluster.kill(0);
  ASSERT_TRUE(wait_durable(holder, "rank0").ok());
  EXPECT_EQ(*read_checkpoint_file(dir_ / "shared", *id), data);
  EXPECT_EQ(loaded(holder, "rank0"), data);
}

TEST_F(CheckpointNodeTest, ADeathTakesOverOnlyTheDeadRanksReplicasAndTheirNamesBecomeOwned) {
  Cluster cluster({"hostA", "hostB"});
  const fs::path owner_dir = dir_ / "owner_view";
  const fs::path holder_dir = dir_ / "holder_view";
  CheckpointNode& owner = cluster.start(0, owner_dir, 1 << 20);
  CheckpointNode& holder = cluster.start(1, holder_dir, 1 << 20);
  block(owner_dir);  // nothing becomes durable: every copy is still needed
  block(holder_dir);
  ASSERT_TRUE(save(owner, "rank0", pattern(100, 1)).get().ok());
  ASSERT_TRUE(save(owner, "rank0", pattern(200, 2)).get().ok());
  ASSERT_TRUE(save(holder, "rank1", pattern(300, 3)).get().ok());
  // What each must drain before it exits: its own names, not the replicas it holds.
  EXPECT_EQ(owner.owned_names(), std::vector<std::string>{"rank0"});
  EXPECT_EQ(holder.owned_names(), std::vector<std::string>{"rank1"});

  EXPECT_EQ(holder.peer_died(0), 2u);  // both versions of rank0, neither durable
  EXPECT_EQ(holder.owned_names(), (std::vector<std::string>{"rank0", "rank1"}));
  EXPECT_EQ(holder.peer_died(0), 0u);  // a second report of the same death changes nothing
  EXPECT_EQ(loaded(holder, "rank0"), pattern(200, 2));
  unblock(holder_dir);
  wait_until_durable(holder, "rank0");
  EXPECT_EQ(*read_checkpoint_file(holder_dir, CheckpointId{"rank0", 2}), pattern(200, 2));
}

TEST_F(CheckpointNodeTest, ACopyThatLandsAfterItsOwnerDiedIsDrainedByItsHolder) {
  Cluster cluster({"hostA", "hostB"});
  cluster.start(0, dir_ / "shared", 1 << 20);
  CheckpointNode& holder = cluster.start(1, dir_ / "shared", 1 << 20);
  cluster.kill(0);
  const std::vector<std::uint8_t> data = pattern(700, 6);
  ASSERT_TRUE(holder.accept_replica(0, CheckpointId{"rank0", 4}, owned(data)).ok());
  ASSERT_TRUE(wait_durable(holder, "rank0").ok());
  EXPECT_EQ(*read_checkpoint_file(dir_ / "shared", CheckpointId{"rank0", 4}), data);
}

TEST_F(CheckpointNodeTest, AFailingFileSystemIsAnErrorNamingCheckpointAndDirectoryAndTheRamCopyStays) {
  Cluster cluster({"hostA"});  // alone: the save completes with the one copy
  const fs::path dir = dir_ / "ckpt";
  CheckpointNode& node = cluster.start(0, dir, 1 << 20);
  block(dir);
  const std::vector<std::uint8_t> data = pattern(2000, 3);
  ASSERT_TRUE(save(node, "m", data).get().ok());

  // Either the first attempt has failed already, or wait_durable waits for it to fail.
  const Status failed = wait_durable(node, "m");
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), StatusCode::kIoError);
  EXPECT_NE(failed.message().find("m@1"), std::string::npos) << failed.message();
  EXPECT_NE(failed.message().find(dir.string()), std::string::npos) << failed.message();
  EXPECT_EQ(loaded(node, "m"), data);
  EXPECT_GE(node.stats().store.drain_failures, 1u);

  unblock(dir);
  wait_until_durable(node, "m");
  EXPECT_EQ(*read_checkpoint_file(dir, CheckpointId{"m", 1}), data);
}

TEST_F(CheckpointNodeTest, AFullBudgetMakesTheNextSaveWaitForTheDrain) {
  Cluster cluster({"hostA"});
  const fs::path dir = dir_ / "ckpt";
  CheckpointNode& node = cluster.start(0, dir, 100);
  block(dir);
  ASSERT_TRUE(save(node, "a", pattern(60, 1)).get().ok());
  std::future<Result<CheckpointId>> second = save(node, "b", pattern(60, 2));
  // Nothing can drain while the directory is broken, so the save cannot have completed.
  EXPECT_EQ(second.wait_for(0s), std::future_status::timeout);
  EXPECT_EQ(node.stats().saves_waiting_for_room, 1u);
  unblock(dir);
  const Result<CheckpointId> admitted = second.get();
  ASSERT_TRUE(admitted.ok()) << admitted.status().to_string();
  EXPECT_EQ(*admitted, (CheckpointId{"b", 1}));
  EXPECT_LE(node.stats().store.bytes_in_ram, 100u);
  EXPECT_EQ(loaded(node, "a"), pattern(60, 1));  // evicted from RAM, read from its file
}

TEST_F(CheckpointNodeTest, LargerThanTheBudgetIsWrittenThroughOrRefusedNamingTheKey) {
  Cluster cluster({"hostA"});
  CheckpointNode& through = cluster.start(0, dir_ / "through", 100, WhenFull::kWriteThrough);
  const std::vector<std::uint8_t> big = pattern(150, 4);
  const Result<CheckpointId> written = save(through, "big", big).get();
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  EXPECT_EQ(*read_checkpoint_file(dir_ / "through", *written), big);
  EXPECT_TRUE(wait_durable(through, "big").ok());
  EXPECT_EQ(through.stats().written_through_bytes, 150u);
  EXPECT_EQ(through.stats().store.bytes_in_ram, 0u);

  Cluster waiting({"hostA"});
  CheckpointNode& wait = waiting.start(0, dir_ / "wait", 100, WhenFull::kWait);
  const Result<CheckpointId> refused = save(wait, "big", big).get();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("checkpoint.capacity"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("big"), std::string::npos);
}

TEST_F(CheckpointNodeTest, NoPeerWithRoomForTheReplicaFailsTheSaveAndDropsIt) {
  Cluster cluster({"hostA", "hostB"});
  CheckpointNode& owner = cluster.start(0, dir_ / "shared", 1000);
  cluster.start(1, dir_ / "shared", 10);
  const Result<CheckpointId> refused = save(owner, "m", pattern(100, 5)).get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("m@1"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("ranks tried: 1"), std::string::npos) << refused.status().message();
  EXPECT_EQ(owner.stats().store.bytes_in_ram, 0u);
  EXPECT_TRUE(owner.list().empty());
}

// when_full = wait: a holder with no room *now* (its own version not yet durable) makes the
// owner's save wait, as a save waits for room in its own node's budget; once the holder's
// version is durable the owner's retry lands the copy and the save returns. (A holder whose
// whole checkpoint.capacity is too small refuses for good: the test above.)
TEST_F(CheckpointNodeTest, AHolderWithNoRoomNowMakesTheSaveWaitThenSucceed) {
  Cluster cluster({"hostA", "hostB"});
  CheckpointNode& owner = cluster.start(0, dir_ / "owner", 1000);
  CheckpointNode& holder = cluster.start(1, dir_ / "holder", 150);
  // The holder's directory breaks: its own version stays in RAM, filling 100 of its 150 bytes.
  fs::remove_all(dir_ / "holder");
  std::ofstream(dir_ / "holder") << "not a directory";
  ASSERT_TRUE(save(holder, "h", pattern(100, 1)).get().ok());
  std::future<Result<CheckpointId>> saved = save(owner, "m", pattern(100, 2));
  // Refused for room again and again (every 5 ms here), the save neither fails nor returns.
  ASSERT_EQ(saved.wait_for(200ms), std::future_status::timeout) << "the save ended while its holder was full";
  fs::remove(dir_ / "holder");
  fs::create_directory(dir_ / "holder");
  ASSERT_EQ(saved.wait_for(10s), std::future_status::ready) << "the save still waits after the holder had room";
  const Result<CheckpointId> id = saved.get();
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  EXPECT_EQ(*id, (CheckpointId{"m", 1}));
  EXPECT_TRUE(wait_durable(owner, "m").ok());
  EXPECT_EQ(*read_checkpoint_file(dir_ / "owner", *id), pattern(100, 2));
}

TEST_F(CheckpointNodeTest, ARestartedNodeLoadsTheLastDurableVersionAndContinuesItsNumbering) {
  const fs::path dir = dir_ / "ckpt";
  {
    Cluster first({"hostA"});
    CheckpointNode& node = first.start(0, dir, 1 << 20);
    for (std::uint8_t v = 1; v <= 3; ++v) ASSERT_TRUE(save(node, "m", pattern(100, v)).get().ok());
    ASSERT_TRUE(wait_durable(node, "m").ok());
  }
  Cluster second({"hostA", "hostB"});  // another world size
  CheckpointNode& node = second.start(1, dir, 1 << 20);
  EXPECT_EQ(loaded(node, "m"), pattern(100, 3));
  // retain = 2: the oldest version's file was removed once two newer ones were durable.
  EXPECT_EQ(node.list(), (std::vector<CheckpointId>{{"m", 3}}));
  EXPECT_EQ(*list_checkpoint_files(dir), (std::vector<CheckpointId>{{"m", 2}, {"m", 3}}));
  EXPECT_EQ(node.load("other").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(save(node, "bad/name", pattern(1, 1)).get().status().code(), StatusCode::kInvalidArgument);
}

}  // namespace checkpoint_node_test
}  // namespace shardmix
