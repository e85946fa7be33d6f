// An in-process test cluster: the real ClientService on a real Unix socket, the real
// client library, and a fake fabric that "reads" peer samples from a local buffer.
// Node 0 of a 2-node job with 2 trainers per node is served; node 1's arena is faked.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <poll.h>
#include <fcntl.h>
#include <fstream>
#include <sys/mman.h>
#include <atomic>
#include <filesystem>
#include <limits>
#include <map>
#include <future>
#include <optional>
#include <sys/stat.h>
#include <thread>
#include <tuple>
#include <utility>

#include <grp.h>
#include <sys/wait.h>

#include "client/client.h"
#include "common/checkpoint_file.h"
#include "common/job_token.h"
#include "common/resume_plan.h"
#include "common/rng.h"
#include "proto/checkpoint.h"
#include "server/client_service.h"
#include "server/shared_region.h"
#include "tests/unit/mapping_support.h"

namespace shardmix {
namespace client_service_test {
namespace fs = std::filesystem;

// Bytes of sample `id`: deterministic, so every view can be checked.
void sample_bytes(SampleId id, std::uint8_t* out, std::uint64_t n) {
  Rng rng(0x5a5a0000ull + id);
  rng.fill_bytes(std::span<std::uint8_t>(out, n));
}

class LocalArenaFetcher : public PeerFetcher {
 public:
  LocalArenaFetcher(boost::asio::io_context& io, const std::vector<std::uint8_t>& peer_arena, SharedRegion& staging)
      : io_(io), peer_arena_(peer_arena), staging_(staging) {}
  // Runs on the io thread (the scheduler's). With `hold` set, reads are kept in flight
  // (neither copied nor completed) until release_held(), like a slow peer.
  void fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) override {
    auto land = [this, reads = std::move(reads), done = std::move(done)] {
      for (const PeerRead& r : reads) {
        std::memcpy(staging_.data() + r.staging_offset, peer_arena_.data() + r.remote_offset, r.length);
      }
      done(Status::ok_status());
    };
    if (hold || hold_first.fetch_sub(1) > 0) {
      held_.push_back(std::move(land));
      return;
    }
    boost::asio::post(io_, std::move(land));
  }
  std::size_t held_count() {
    std::promise<std::size_t> count;
    boost::asio::post(io_, [&] { count.set_value(held_.size()); });
    return count.get_future().get();
  }
  void release_held() {
    boost::asio::post(io_, [this] {
      auto held = std::move(held_);
      held_.clear();
      for (auto& land : held) land();
    });
  }
  std::atomic<bool> hold{false};
  std::atomic<int> hold_first{0};  // hold this many fetches, let later ones land (a straggler)

 private:
  std::vector<std::function<void()>> held_;  // io thread only
  boost::asio::io_context& io_;
  const std::vector<std::uint8_t>& peer_arena_;
  SharedRegion& staging_;
};

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("svc-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::vector<CatalogEntry> entries;
    Rng rng(9);
    for (int i = 0; i < 203; ++i) {
      entries.push_back({"c/" + std::to_string(i), i % 50 == 0 ? 0 : 1 + rng.below(9000), i % 5});
    }
    catalog_ = std::move(Catalog::from_entries(std::move(entries), {}).value());
    shape_ = make_plan_shape(catalog_.size(), JobShape{2, 2, 7, false});
    placement_ = make_placement(catalog_.sizes(), shape_, PlacementPolicy::kBalanced, 1);
    ShuffleConfig shuffle;
    shuffle.seed = 4;
    planner_ = std::make_unique<EpochPlanner>(shape_, placement_, shuffle);
    directory_ = std::make_unique<GlobalDirectory>(catalog_, placement_);

    arena_ = std::move(SharedRegion::create("test-arena", placement_.arena_bytes[0]).value());
    staging_ = std::move(SharedRegion::create("test-staging", 2 * staging_per_trainer_).value());
    peer_arena_.resize(placement_.arena_bytes[1] + 1);
    for (SampleId id = 0; id < catalog_.size(); ++id) {
      std::uint8_t* base = placement_.owner[id] == 0 ? arena_->data() : peer_arena_.data();
      sample_bytes(id, base + placement_.arena_offset[id], catalog_.sample_bytes(id));
    }
    fetcher_ = std::make_unique<LocalArenaFetcher>(io_, peer_arena_, *staging_);
    ServedJob job;
    job.catalog = &catalog_;
    job.context = SchedulerContext{directory_.get(), planner_.get(), 0, 3};
    job.context.window = window_;
    job.context.redealt = redealt_.plans.empty() ? nullptr : &redealt_;
    job.plan_digest = plan_digest(catalog_digest(catalog_), catalog_.size(), shape_.job, shuffle,
                                  PlacementPolicy::kBalanced);
    job.seed = shuffle.seed;
    job.shape = &shape_;
    job.nodes = 2;
    job.trainers_per_node = 2;
    job.arena = arena_.get();
    job.staging = staging_.get();
    job.staging_per_trainer = staging_per_trainer_;
    job.fetcher = fetcher_.get();
    job.telemetry = &telemetry_;
    job.job_token = kJobToken;
    CheckpointNodeOptions checkpoint_options;
    checkpoint_options.dir = dir_ / "ckpt";
    checkpoint_options.capacity_bytes = 1 << 20;
    checkpoints_ = std::move(CheckpointNode::start(checkpoint_options, nullptr).value());
    job.checkpoints = checkpoints_.get();
    ASSERT_TRUE(write_job_token_file((dir_ / kJobTokenFile).string(), kJobToken).ok());
    service_ = std::make_unique<ClientService>(io_, std::move(job), (dir_ / "d0.sock").string());
    ASSERT_TRUE(service_->listen().ok());
    io_thread_ = std::thread([this] { io_.run(); });
  }

  void TearDown() override {
    // Destroy the service on its own thread, then let the io thread run out of work.
    std::promise<void> gone;
    boost::asio::post(io_, [&] {
      service_.reset();
      gone.set_value();
    });
    gone.get_future().wait();
    work_.reset();
    io_thread_.join();
    fs::remove_all(dir_);
  }

  ClientOptions options(int rank) {
    ClientOptions o;
    o.run_dir = dir_.string();
    o.daemon = 0;
    o.rank = rank;
    o.world_size = 4;
    o.receive_timeout_s = 30;
    return o;
  }

  // Trainer 1's options with an interrupt hook that counts its calls in `asked` and always
  // says stop.
  ClientOptions options_always_interrupted(std::atomic<int>& asked) {
    ClientOptions o = options(1);
    o.interrupted = [&asked] {
      ++asked;
      return true;
    };
    return o;
  }
  // Runs epoch 0 to its end, or to the Error the client throws: its code and message (kOk
  // and "" when the epoch ended).
  static std::pair<StatusCode, std::string> run_epoch_0(Client& client) {
    try {
      for (const Batch& batch : client.epoch(0)) (void)batch;
    } catch (const Error& e) {
      return {e.code(), e.what()};
    }
    return {StatusCode::kOk, ""};
  }

  // After an interrupted wait: the held reads let go, a new client of trainer 1 gets all of
  // epoch 0, as planned.
  void expect_a_new_client_gets_epoch_0_whole() {
    fetcher_->hold = false;
    fetcher_->release_held();
    Client again = Client::connect(options(1));
    EXPECT_EQ(consume(again, 0), planner_->plan_node(0, 0)[1].order);
  }

  // Consumes a whole epoch, checking every byte; returns the ids in delivery order.
  std::vector<SampleId> consume(Client& client, std::uint64_t epoch) {
    std::vector<SampleId> ids;
    std::vector<std::uint8_t> expected;
    for (const Batch& batch : client.epoch(epoch)) {
      for (const Sample& s : batch) {
        expected.resize(s.bytes().size());
        sample_bytes(s.id(), expected.data(), expected.size());
        EXPECT_EQ(s.bytes().size(), catalog_.sample_bytes(s.id()));
        EXPECT_EQ(0, std::memcmp(expected.data(), s.bytes().data(), expected.size())) << "sample " << s.id();
        EXPECT_EQ(s.label(), catalog_.label(s.id()));
        ids.push_back(s.id());
      }
    }
    return ids;
  }

  static constexpr std::uint64_t kStagingPerTrainer = 7 * 9088;
  static constexpr std::uint32_t kJobToken = 0x5eed1234;
  // Set by a derived fixture's constructor, before SetUp.
  std::uint32_t window_ = 0;
  std::uint64_t staging_per_trainer_ = kStagingPerTrainer;
  RedealtEpoch redealt_;  // plans empty: no re-dealt epoch
  fs::path dir_;
  Catalog catalog_;
  PlanShape shape_;
  Placement placement_;
  std::unique_ptr<EpochPlanner> planner_;
  std::unique_ptr<GlobalDirectory> directory_;
  std::unique_ptr<SharedRegion> arena_;
  std::unique_ptr<SharedRegion> staging_;
  std::vector<std::uint8_t> peer_arena_;
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_{
      boost::asio::make_work_guard(io_)};
  std::unique_ptr<LocalArenaFetcher> fetcher_;
  NodeTelemetry telemetry_;
  // Model checkpoints (docs/decisions/0056) in dir_/ckpt; outlives the service.
  std::unique_ptr<CheckpointNode> checkpoints_;
  std::unique_ptr<ClientService> service_;
  std::thread io_thread_;
};

TEST_F(ServiceTest, DeliversThePlannedSamplesWithTheRightBytes) {
  Client client = Client::connect(options(1));
  EXPECT_EQ(client.batches_per_epoch(), shape_.batches_per_trainer);
  for (std::uint64_t epoch : {0u, 1u}) {
    const auto ids = consume(client, epoch);
    EXPECT_EQ(ids, planner_->plan_node(epoch, 0)[1].order);
    ASSERT_TRUE(client.last_epoch_stats().has_value());
    EXPECT_EQ(client.last_epoch_stats()->samples, ids.size());
  }
  EXPECT_EQ(client.catalog().size(), catalog_.size());
}

// A trainer that falls behind finds several frames queued on its socket; the client reads
// them with one receive into its inbox and must still split them exactly (the pause only
// lets frames pile up; nothing is asserted about time).
TEST_F(ServiceTest, FramesThatPiledUpAreSplitExactly) {
  Client client = Client::connect(options(1));
  for (std::uint64_t epoch : {0u, 1u}) {
    std::vector<SampleId> ids;
    Epoch pass = client.epoch(epoch);
    for (auto it = pass.begin(); it != pass.end(); ++it) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (const Sample& s : *it) ids.push_back(s.id());
    }
    EXPECT_EQ(ids, planner_->plan_node(epoch, 0)[1].order);
  }
  EXPECT_EQ(client.catalog().size(), catalog_.size());
}

TEST_F(ServiceTest, AKilledTrainerDoesNotDisturbTheOtherAndCanComeBack) {
  Client steady = Client::connect(options(0));
  {
    Client doomed = Client::connect(options(1));
    int batches = 0;
    for (const Batch& batch : doomed.epoch(0)) {
      (void)batch;
      if (++batches == 2) break;  // then the process "dies": the connection closes mid-epoch
    }
  }
  EXPECT_EQ(consume(steady, 0), planner_->plan_node(0, 0)[0].order);
  // The same rank reconnects and gets its whole epoch, exactly once.
  Client back = Client::connect(options(1));
  EXPECT_EQ(consume(back, 0), planner_->plan_node(0, 0)[1].order);
}

TEST_F(ServiceTest, AbandoningAnEpochAndStartingAnotherWorks) {
  Client client = Client::connect(options(0));
  for (const Batch& batch : client.epoch(0)) {
    (void)batch;
    break;
  }
  EXPECT_EQ(consume(client, 1), planner_->plan_node(1, 0)[0].order);
}

TEST_F(ServiceTest, RefusesAWrongLayoutAndADuplicateRank) {
  ClientOptions wrong = options(1);
  wrong.world_size = 6;
  auto refused = Client::try_connect(wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("world size 6"), std::string::npos) << refused.status().message();

  ClientOptions other_node = options(3);  // rank 3 belongs to node 1
  auto misrouted = Client::try_connect(other_node);
  ASSERT_FALSE(misrouted.ok());
  EXPECT_NE(misrouted.status().message().find("node 1"), std::string::npos) << misrouted.status().message();

  Client first = Client::connect(options(0));
  auto twice = Client::try_connect(options(0));
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("already connected"), std::string::npos);
}

// A socket connected to the daemon at `socket_path`, to speak the protocol raw.
int connect_raw(const fs::path& socket_path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(0, ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  return fd;
}

// Sends raw bytes as a client would and returns what the daemon answered before closing.
std::vector<std::uint8_t> raw_exchange(const fs::path& socket_path, const std::vector<std::uint8_t>& bytes) {
  const int fd = connect_raw(socket_path);
  EXPECT_EQ(static_cast<ssize_t>(bytes.size()), ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL));
  std::vector<std::uint8_t> answer;
  std::uint8_t buf[4096];
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;  // closed by the daemon (or timed out: then the test fails below)
    answer.insert(answer.end(), buf, buf + n);
  }
  ::close(fd);
  return answer;
}

std::string error_message(const std::vector<std::uint8_t>& answer) {
  proto::FrameHeader h{};
  if (answer.size() < sizeof(h) || !proto::decode_header(std::span(answer).first(sizeof(h)), h).empty()) return "";
  proto::ErrorFrame e;
  if (h.type != static_cast<std::uint16_t>(proto::FrameType::kError)) return "";
  if (!proto::decode(std::span(answer).subspan(sizeof(h)), e).empty()) return "";
  return e.message;
}

TEST_F(ServiceTest, AClientWithAnotherProtocolVersionGetsANamedError) {
  std::vector<std::uint8_t> hello;
  proto::encode(hello, proto::Hello{0, 4, 1});
  const std::uint16_t future_version = proto::kProtocolVersion + 1;
  std::memcpy(hello.data() + offsetof(proto::FrameHeader, version), &future_version, sizeof(future_version));
  const std::string message = error_message(raw_exchange(dir_ / "d0.sock", hello));
  EXPECT_NE(message.find("protocol version " + std::to_string(future_version)), std::string::npos) << message;
  // The daemon keeps serving well-behaved trainers.
  Client client = Client::connect(options(0));
  EXPECT_EQ(consume(client, 0).size(), shape_.trainer_quota[0]);
}

// Model checkpoints ride a connection of their own: saving, listing and loading between
// batches leaves the batch stream exactly as planned, and what was saved comes back.
TEST_F(ServiceTest, CheckpointsSavedBetweenBatchesLeaveTheEpochExact) {
  Client client = Client::connect(options(0));
  std::vector<std::uint8_t> first(100000), second(5000);
  Rng rng(77);
  rng.fill_bytes(first);
  rng.fill_bytes(second);
  std::vector<SampleId> ids;
  std::uint64_t batches = 0;
  for (const Batch& batch : client.epoch(0)) {
    for (const Sample& s : batch) ids.push_back(s.id());
    if (++batches == 2) {
      EXPECT_EQ(client.save("rank0", first), 1u);
      EXPECT_EQ(client.save("rank0", second.size(), [&](std::span<std::uint8_t> into) {
                  std::memcpy(into.data(), second.data(), second.size());
                }),
                2u);
      const LoadedCheckpoint loaded = client.load("rank0");
      EXPECT_EQ(loaded.version(), 2u);
      EXPECT_TRUE(std::equal(loaded.bytes().begin(), loaded.bytes().end(), second.begin(), second.end()));
    }
  }
  EXPECT_GE(batches, 3u);
  EXPECT_EQ(ids, planner_->plan_node(0, 0)[0].order);
  client.wait_durable("rank0");
  std::ifstream file(dir_ / "ckpt" / "rank0" / "v2.smxckpt", std::ios::binary);
  const std::vector<char> on_disk((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ASSERT_EQ(on_disk.size(), kCheckpointFileHeaderBytes + second.size());
  EXPECT_EQ(0, std::memcmp(on_disk.data() + kCheckpointFileHeaderBytes, second.data(), second.size()));
  const std::vector<CheckpointVersion> listed = client.list();
  EXPECT_TRUE(std::any_of(listed.begin(), listed.end(),
                          [](const CheckpointVersion& v) { return v.name == "rank0" && v.version == 2; }));
  try {
    (void)client.load("never-saved");
    ADD_FAILURE() << "loading a checkpoint never saved did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("never-saved"), std::string::npos) << e.what();
  }
  // The batch connection is untouched: the next epoch is whole.
  EXPECT_EQ(consume(client, 1), planner_->plan_node(1, 0)[0].order);
}

// Whether the page at `address` is a mapping of the daemon's checkpoint pool memfd
// (/proc/self/maps). A lease unmapped must not be; the address itself may be reused by any
// other mapping at once (the daemon runs in this process, and malloc maps large blocks), so
// "nothing is mapped there" would be a race, not a check.
bool pool_mapped_at(const void* address) {
  return test::mapping_holding(address).header.find("shardmix-checkpoint-pool") != std::string::npos;
}

// A lease (decision 0069): the trainer writes into the daemon's memory and saves part of
// it; afterwards its mapping is gone, so it cannot change what was saved, and the used
// lease is refused by name. A new lease replaces one still held; an abandoned one is gone.
TEST_F(ServiceTest, ALeasedCheckpointIsSavedFromWhereTheTrainerWroteIt) {
  Client client = Client::connect(options(0));
  std::vector<std::uint8_t> state(300000);
  Rng rng(5);
  rng.fill_bytes(state);
  const std::uint64_t buffers_before = checkpoints_->stats().pool.buffers;
  CheckpointLease lease = client.lease_checkpoint("rank0", 400000);
  ASSERT_EQ(lease.bytes.size(), 400000u);
  EXPECT_TRUE(client.holds_lease(lease));
  EXPECT_TRUE(pool_mapped_at(lease.bytes.data()));  // what the checks after the save look for
  std::memcpy(lease.bytes.data(), state.data(), state.size());
  EXPECT_EQ(client.save_lease(lease, state.size()), 1u);
  // No copy: the version saved is the leased buffer itself, the one pool buffer the save
  // took (a copy would have taken a second to copy into), and it holds what was written.
  EXPECT_EQ(checkpoints_->stats().pool.buffers, buffers_before + 1);
  EXPECT_EQ(checkpoints_->stats().pool.overflows, 0u);
  EXPECT_FALSE(client.holds_lease(lease));
  EXPECT_FALSE(pool_mapped_at(lease.bytes.data()));
  EXPECT_FALSE(pool_mapped_at(lease.bytes.data() + state.size() - 1));
  const LoadedCheckpoint loaded = client.load("rank0");
  EXPECT_EQ(loaded.version(), 1u);
  EXPECT_TRUE(std::equal(loaded.bytes().begin(), loaded.bytes().end(), state.begin(), state.end()));
  try {
    (void)client.save_lease(lease, 10);
    ADD_FAILURE() << "a lease saved already was saved again";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("rank0"), std::string::npos) << e.what();
  }
  CheckpointLease replaced = client.lease_checkpoint("rank0", 5000);
  CheckpointLease current = client.lease_checkpoint("rank1", 5000);
  EXPECT_FALSE(client.holds_lease(replaced));  // (its address may be the new lease's now)
  EXPECT_THROW((void)client.save_lease(replaced, 10), Error);
  EXPECT_THROW((void)client.save_lease(current, 5001), Error);  // more than leased
  EXPECT_TRUE(client.holds_lease(current));
  client.abandon_lease(current);
  EXPECT_FALSE(client.holds_lease(current));
  EXPECT_THROW(client.abandon_lease(current), Error);
  // An empty checkpoint is a lease of nothing.
  CheckpointLease empty = client.lease_checkpoint("rank0", 0);
  EXPECT_EQ(client.save_lease(empty, 0), 2u);
  EXPECT_TRUE(client.load("rank0").bytes().empty());
  const std::vector<CheckpointVersion> listed = client.list();
  EXPECT_FALSE(std::any_of(listed.begin(), listed.end(), [](const CheckpointVersion& v) { return v.name == "rank1"; }));
  EXPECT_THROW((void)client.lease_checkpoint("not/a/name", 10), Error);
  client.wait_durable("rank0");  // the drain done before TearDown removes checkpoint.dir
}

// A lease belongs to its connection. When the client closes that connection (here: an
// answer that did not come within the receive timeout, so the connection is out of step)
// the daemon takes the lease's chunks back for other checkpoints, so the client must unmap
// it at once and refuse it from then on; and since the daemon numbers leases per
// connection, the stale lease must not match the first lease of the next connection.
TEST_F(ServiceTest, ALeaseEndsWithItsConnectionAndNeverMatchesALaterOne) {
  ClientOptions o = options(0);
  o.receive_timeout_s = 1;
  Client client = Client::connect(o);
  const CheckpointLease stale = client.lease_checkpoint("rank0", 10000);
  ASSERT_TRUE(client.holds_lease(stale));
  EXPECT_TRUE(pool_mapped_at(stale.bytes.data()));
  std::promise<void> unblock;
  std::promise<void> blocked;
  boost::asio::post(io_, [&blocked, unblocked = unblock.get_future().share()] {
    blocked.set_value();
    unblocked.wait();  // the daemon's io thread hangs: the listing below is not answered
  });
  blocked.get_future().wait();
  EXPECT_THROW((void)client.list(), Error);
  EXPECT_FALSE(client.holds_lease(stale));
  EXPECT_FALSE(pool_mapped_at(stale.bytes.data()));  // before any new lease could map there
  unblock.set_value();
  const CheckpointLease fresh = client.lease_checkpoint("rank0", 10000);  // a new connection: its lease 1 again
  EXPECT_NE(fresh.id, stale.id);
  EXPECT_FALSE(client.holds_lease(stale));
  EXPECT_TRUE(client.holds_lease(fresh));
  try {
    (void)client.save_lease(stale, 10);
    ADD_FAILURE() << "a lease of a closed connection was saved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("connection to the daemon was closed"), std::string::npos) << e.what();
  }
  std::memset(fresh.bytes.data(), 9, 10);
  EXPECT_EQ(client.save_lease(fresh, 10), 1u);
  EXPECT_EQ(client.load("rank0").bytes().size(), 10u);
  client.wait_durable("rank0");  // the drain done before TearDown removes checkpoint.dir
}

// The save(name, size, write) form gives its lease back when `write` throws: the caller's
// exception comes out, and the next save is not refused for a lease still held.
TEST_F(ServiceTest, ASaveWhoseWriterThrowsGivesItsLeaseBack) {
  Client client = Client::connect(options(0));
  EXPECT_THROW((void)client.save("rank0", 5000, [](std::span<std::uint8_t>) { throw std::runtime_error("no"); }),
               std::runtime_error);
  EXPECT_EQ(checkpoints_->stats().pool.bytes_in_use, 0u);
  EXPECT_EQ(client.save("rank0", 4, [](std::span<std::uint8_t> into) { std::memset(into.data(), 1, 4); }), 1u);
  client.wait_durable("rank0");
}

// Frames read from `fd` until `count` have arrived (or 5 s pass): each frame's header and
// payload. Descriptors sent along are dropped by recv.
std::vector<std::pair<proto::FrameHeader, std::vector<std::uint8_t>>> read_frames(int fd, std::size_t count) {
  std::vector<std::pair<proto::FrameHeader, std::vector<std::uint8_t>>> frames;
  std::vector<std::uint8_t> got;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::uint8_t buf[4096];
  std::size_t at = 0;
  while (frames.size() < count) {
    proto::FrameHeader h{};
    if (got.size() - at >= sizeof(h) && proto::decode_header(std::span(got).subspan(at, sizeof(h)), h).empty() &&
        got.size() - at >= sizeof(h) + h.payload_bytes) {
      frames.emplace_back(h, std::vector<std::uint8_t>(got.begin() + static_cast<std::ptrdiff_t>(at + sizeof(h)),
                                                       got.begin() + static_cast<std::ptrdiff_t>(at + sizeof(h) + h.payload_bytes)));
      at += sizeof(h) + h.payload_bytes;
      continue;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.insert(got.end(), buf, buf + n);
  }
  return frames;
}

// The daemon's side of the bound: one lease per connection. A second lease request while
// one is held is refused naming both checkpoints, and a commit of a lease the connection
// does not hold is refused; the connection stays open and the held lease still commits.
TEST_F(ServiceTest, AConnectionHoldsOneLeaseAtATime) {
  const int fd = connect_raw(dir_ / "d0.sock");
  std::vector<std::uint8_t> out;
  proto::encode_checkpoint_hello(out, proto::Hello{0, 4, 1});
  proto::set_hello_job_token(out, kJobToken);
  proto::encode_checkpoint_lease(out, proto::CheckpointSave{1, 10000, "first"});
  proto::encode_checkpoint_lease(out, proto::CheckpointSave{2, 10000, "second"});
  proto::encode(out, proto::FrameType::kCheckpointCommit, proto::CheckpointCommit{3, 99, 10});
  ASSERT_EQ(static_cast<ssize_t>(out.size()), ::send(fd, out.data(), out.size(), MSG_NOSIGNAL));
  auto frames = read_frames(fd, 4);
  ASSERT_EQ(frames.size(), 4u);
  EXPECT_EQ(frames[0].first.type, static_cast<std::uint16_t>(proto::FrameType::kCheckpointWelcome));
  // The grant comes when the pool buffer is ready, so the refusals may come before it.
  std::map<std::uint64_t, proto::CheckpointLeaseGrant> grants;
  std::map<std::uint64_t, proto::CheckpointReply> replies;
  for (std::size_t i = 1; i < frames.size(); ++i) {
    if (frames[i].first.type == static_cast<std::uint16_t>(proto::FrameType::kCheckpointLeaseGrant)) {
      proto::CheckpointLeaseGrant g;
      ASSERT_EQ(proto::decode(frames[i].second, g), "");
      grants[g.request] = g;
    } else {
      ASSERT_EQ(frames[i].first.type, static_cast<std::uint16_t>(proto::FrameType::kCheckpointReply));
      proto::CheckpointReply r;
      ASSERT_EQ(proto::decode(frames[i].second, r), "");
      replies[r.request] = r;
    }
  }
  ASSERT_EQ(grants.size(), 2u);
  ASSERT_EQ(replies.size(), 1u);
  const proto::CheckpointLeaseGrant granted = grants[1], refused = grants[2];
  EXPECT_EQ(granted.code, 0);
  EXPECT_EQ(granted.size, 10000u);
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.message.find("second"), std::string::npos) << refused.message;
  EXPECT_NE(refused.message.find("first"), std::string::npos) << refused.message;
  const proto::CheckpointReply wrong = replies[3];
  EXPECT_EQ(wrong.code, static_cast<std::uint16_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(wrong.message.find("lease 99"), std::string::npos) << wrong.message;
  out.clear();
  proto::encode(out, proto::FrameType::kCheckpointCommit, proto::CheckpointCommit{4, granted.lease, 10});
  ASSERT_EQ(static_cast<ssize_t>(out.size()), ::send(fd, out.data(), out.size(), MSG_NOSIGNAL));
  frames = read_frames(fd, 1);
  ASSERT_EQ(frames.size(), 1u);
  proto::CheckpointReply saved;
  ASSERT_EQ(proto::decode(frames[0].second, saved), "");
  EXPECT_EQ(saved.code, 0) << saved.message;
  EXPECT_EQ(saved.version, 1u);
  EXPECT_EQ(saved.length, 10u);
  ::close(fd);
  Client client = Client::connect(options(0));
  client.wait_durable("first");  // the drain done before TearDown removes checkpoint.dir
}

// Every way a lease ends, spoken raw as a hostile or broken client could: a commit longer
// than the lease is refused and ends it; a second commit, or one after an abandon, is
// refused naming the lease; a lease no memfd could hold (2^64 - 1 bytes) is refused naming
// the checkpoint and takes nothing; a lease larger than checkpoint.capacity is granted (it
// is an upper bound) but a commit of more than checkpoint.capacity is refused naming the
// key; and a connection closed while holding a lease (a trainer that died) gives its chunks
// back. The daemon serves on throughout.
TEST_F(ServiceTest, ALeaseEndsOnceByCommitAbandonOrCloseAndItsChunksGoBack) {
  const int fd = connect_raw(dir_ / "d0.sock");
  std::vector<std::uint8_t> out;
  proto::encode_checkpoint_hello(out, proto::Hello{0, 4, 1});
  proto::set_hello_job_token(out, kJobToken);
  ASSERT_EQ(static_cast<ssize_t>(out.size()), ::send(fd, out.data(), out.size(), MSG_NOSIGNAL));
  ASSERT_EQ(read_frames(fd, 1).size(), 1u);  // the welcome
  // One request, its one answer.
  const auto ask = [fd](const std::vector<std::uint8_t>& frame) {
    EXPECT_EQ(static_cast<ssize_t>(frame.size()), ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL));
    auto frames = read_frames(fd, 1);
    EXPECT_EQ(frames.size(), 1u);
    return frames.empty() ? std::vector<std::uint8_t>() : frames[0].second;
  };
  const auto lease = [&](std::uint64_t request, std::uint64_t size, const std::string& name) {
    std::vector<std::uint8_t> frame;
    proto::encode_checkpoint_lease(frame, proto::CheckpointSave{request, size, name});
    proto::CheckpointLeaseGrant grant;
    EXPECT_EQ(proto::decode(ask(frame), grant), "");
    return grant;
  };
  const auto end = [&](proto::FrameType type, std::uint64_t request, std::uint64_t lease_id, std::uint64_t length) {
    std::vector<std::uint8_t> frame;
    proto::encode(frame, type, proto::CheckpointCommit{request, lease_id, length});
    proto::CheckpointReply reply;
    EXPECT_EQ(proto::decode(ask(frame), reply), "");
    return reply;
  };
  const auto in_use = [this] { return checkpoints_->stats().pool.bytes_in_use; };
  constexpr auto kCommit = proto::FrameType::kCheckpointCommit;
  constexpr auto kAbandon = proto::FrameType::kCheckpointAbandon;

  const proto::CheckpointLeaseGrant first = lease(1, 10000, "first");
  ASSERT_EQ(first.code, 0) << first.message;
  EXPECT_GT(in_use(), 0u);
  const proto::CheckpointReply too_long = end(kCommit, 2, first.lease, 10001);
  EXPECT_EQ(too_long.code, static_cast<std::uint16_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(too_long.message.find("'first': the commit says 10001 bytes, its lease holds 10000"), std::string::npos)
      << too_long.message;
  EXPECT_EQ(in_use(), 0u);  // that ended it
  EXPECT_NE(end(kCommit, 3, first.lease, 10).code, 0);

  const proto::CheckpointLeaseGrant second = lease(4, 10000, "second");
  ASSERT_EQ(second.code, 0) << second.message;
  const proto::CheckpointReply saved = end(kCommit, 5, second.lease, 10);
  EXPECT_EQ(saved.code, 0) << saved.message;
  EXPECT_EQ(saved.version, 1u);
  const std::uint64_t holding_second = in_use();
  EXPECT_GT(holding_second, 0u);
  const proto::CheckpointReply twice = end(kCommit, 6, second.lease, 10);
  EXPECT_EQ(twice.code, static_cast<std::uint16_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(twice.message.find("holds no checkpoint lease " + std::to_string(second.lease)), std::string::npos)
      << twice.message;

  const proto::CheckpointLeaseGrant third = lease(7, 20000, "third");
  ASSERT_EQ(third.code, 0) << third.message;
  EXPECT_GT(in_use(), holding_second);
  EXPECT_EQ(end(kAbandon, 8, third.lease, 0).code, 0);
  EXPECT_EQ(in_use(), holding_second);
  EXPECT_NE(end(kCommit, 9, third.lease, 10).code, 0);

  const proto::CheckpointLeaseGrant huge = lease(10, std::numeric_limits<std::uint64_t>::max(), "huge");
  EXPECT_EQ(huge.code, static_cast<std::uint16_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(huge.message.find("huge"), std::string::npos) << huge.message;
  EXPECT_EQ(in_use(), holding_second);
  // checkpoint.capacity is 1 MiB here: a 3 MiB lease is granted; 5 bytes of it are saved,
  // 2 MiB of it are not.
  const proto::CheckpointLeaseGrant big = lease(12, 3 << 20, "big");
  ASSERT_EQ(big.code, 0) << big.message;
  EXPECT_EQ(end(kCommit, 13, big.lease, 5).code, 0);
  const proto::CheckpointLeaseGrant bigger = lease(14, 3 << 20, "big");
  ASSERT_EQ(bigger.code, 0) << bigger.message;
  const proto::CheckpointReply too_big = end(kCommit, 15, bigger.lease, 2 << 20);
  EXPECT_EQ(too_big.code, static_cast<std::uint16_t>(StatusCode::kResourceExhausted));
  EXPECT_NE(too_big.message.find("checkpoint.capacity"), std::string::npos) << too_big.message;

  const std::uint64_t holding_both = in_use();  // "second" and "big", the refused one gone
  EXPECT_GT(holding_both, holding_second);

  const proto::CheckpointLeaseGrant fifth = lease(11, 30000, "fifth");
  ASSERT_EQ(fifth.code, 0) << fifth.message;
  EXPECT_GT(in_use(), holding_both);
  ::close(fd);  // dies holding it
  for (int i = 0; i < 500 && in_use() != holding_both; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(in_use(), holding_both);
  Client client = Client::connect(options(0));
  EXPECT_EQ(client.list().size(), 2u);  // "second" and "big"
  client.wait_durable("second");  // the drains done before TearDown removes checkpoint.dir
  client.wait_durable("big");
}

TEST_F(ServiceTest, CheckpointAndBatchFramesNeverCrossConnectionKinds) {
  std::vector<std::uint8_t> save;
  proto::encode(save, proto::CheckpointSave{1, 10, "rank0"});
  EXPECT_EQ(error_message(raw_exchange(dir_ / "d0.sock", save)),
            "checkpoint requests need a connection opened with a CheckpointHello");
  std::vector<std::uint8_t> frames;
  proto::encode_checkpoint_hello(frames, proto::Hello{0, 4, 1});
  proto::set_hello_job_token(frames, kJobToken);
  proto::encode(frames, proto::StartEpoch{0, 1, {}});
  const std::vector<std::uint8_t> answer = raw_exchange(dir_ / "d0.sock", frames);
  // A CheckpointWelcome, then the refusal of the batch request.
  proto::FrameHeader h{};
  ASSERT_GE(answer.size(), sizeof(h));
  ASSERT_EQ(proto::decode_header(std::span(answer).first(sizeof(h)), h), "");
  EXPECT_EQ(h.type, static_cast<std::uint16_t>(proto::FrameType::kCheckpointWelcome));
  const std::size_t welcome_end = sizeof(h) + h.payload_bytes;
  ASSERT_LE(welcome_end, answer.size());
  EXPECT_EQ(error_message(std::vector<std::uint8_t>(answer.begin() + welcome_end, answer.end())),
            "frame type 4 on a checkpoint connection (it carries checkpoint requests only)");
  // A checkpoint Hello without this job's token is refused like a trainer's.
  std::vector<std::uint8_t> stranger;
  proto::encode_checkpoint_hello(stranger, proto::Hello{0, 4, 1});
  EXPECT_NE(error_message(raw_exchange(dir_ / "d0.sock", stranger)).find("job token mismatch"), std::string::npos);
  // Trainers are served as before.
  Client client = Client::connect(options(0));
  EXPECT_EQ(consume(client, 0), planner_->plan_node(0, 0)[0].order);
}

TEST_F(ServiceTest, MalformedFramesCloseOnlyThatConnection) {
  Client steady = Client::connect(options(1));
  std::vector<std::uint8_t> garbage(64, 0xab);
  EXPECT_FALSE(error_message(raw_exchange(dir_ / "d0.sock", garbage)).empty());
  std::vector<std::uint8_t> truncated_hello;
  proto::encode(truncated_hello, proto::Hello{0, 4, 1});
  truncated_hello[offsetof(proto::FrameHeader, payload_bytes)] = 4;  // claims 4 bytes
  truncated_hello.resize(sizeof(proto::FrameHeader) + 4);
  // Refused from the header alone: a Hello is exactly 12 bytes.
  EXPECT_NE(error_message(raw_exchange(dir_ / "d0.sock", truncated_hello)).find("must carry 12 payload bytes"),
            std::string::npos);
  EXPECT_EQ(consume(steady, 0), planner_->plan_node(0, 0)[1].order);
}

int raw_connect(const fs::path& socket_path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(0, ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  return fd;
}

// Says Hello as trainer `rank` and returns the two descriptors of the Welcome.
void raw_hello(int fd, std::uint32_t rank, int fds[2]) {
  std::vector<std::uint8_t> hello;
  proto::encode(hello, proto::Hello{rank, 4, 1});
  proto::set_hello_job_token(hello, 0x5eed1234);  // ServiceTest::kJobToken
  ASSERT_EQ(static_cast<ssize_t>(hello.size()), ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL));
  std::uint8_t buf[256];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ASSERT_GT(::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC), 0);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  ASSERT_NE(c, nullptr);
  std::memcpy(fds, CMSG_DATA(c), 2 * sizeof(int));
}

long rss_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

TEST_F(ServiceTest, TrainersGetReadOnlySizeSealedMemory) {
  const int fd = raw_connect(dir_ / "d0.sock");
  int fds[2] = {-1, -1};
  raw_hello(fd, 0, fds);
  for (int f : fds) {
    errno = 0;
    void* w = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    EXPECT_EQ(w, MAP_FAILED) << "a trainer could map the daemon's memory writable";
    EXPECT_NE(0, ::ftruncate(f, 0)) << "a trainer could resize the daemon's memory";
    void* r = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, f, 0);
    EXPECT_NE(r, MAP_FAILED);
    if (r != MAP_FAILED) ::munmap(r, 4096);
    ::close(f);
  }
  ::close(fd);
}

TEST_F(ServiceTest, RestartingTheSameEpochNeverDeliversStaleBatches) {
  Client client = Client::connect(options(0));
  for (int round = 0; round < 3; ++round) {
    for (const Batch& batch : client.epoch(0)) {
      (void)batch;
      break;  // leaves prefetched batches of this pass in flight
    }
  }
  // consume() checks every byte: stale descriptors would point at reused staging.
  EXPECT_EQ(consume(client, 0), planner_->plan_node(0, 0)[0].order);
}

TEST_F(ServiceTest, AnOversizedHeaderIsRefusedBeforeAnyAllocation) {
  std::vector<std::uint8_t> header(sizeof(proto::FrameHeader));
  const proto::FrameHeader h{proto::kMagic, proto::kProtocolVersion,
                             static_cast<std::uint16_t>(proto::FrameType::kHello), proto::kMaxPayloadBytes, 0};
  std::memcpy(header.data(), &h, sizeof(h));
  const long before = rss_kb();
  const std::string message = error_message(raw_exchange(dir_ / "d0.sock", header));
  EXPECT_NE(message.find("must carry 12 payload bytes"), std::string::npos) << message;
  EXPECT_LT(rss_kb() - before, 100 * 1024) << "the daemon allocated for a payload it should refuse";
}

TEST_F(ServiceTest, ATrainerThatDoesNotReadItsRepliesIsThrottled) {
  const int fd = raw_connect(dir_ / "d0.sock");
  int fds[2] = {-1, -1};
  raw_hello(fd, 0, fds);
  ::close(fds[0]);
  ::close(fds[1]);
  const std::size_t catalog_bytes = catalog_.serialize().size();
  std::vector<std::uint8_t> requests;
  for (int i = 0; i < 1000; ++i) proto::encode_get_catalog(requests);
  // Ask for far more than the 64 MiB reply limit, never reading: the daemon must stop
  // reading requests instead of queueing every reply.
  const std::size_t rounds = (256u << 20) / (1000 * catalog_bytes) + 1;
  const long before = rss_kb();
  ::fcntl(fd, F_SETFL, O_NONBLOCK);
  // Push the requests whenever the socket takes them; a daemon that stops reading makes
  // the socket stay full, and we give up after a few seconds (a bound on the loop, not
  // an assertion on time).
  const std::size_t total = rounds * requests.size();
  std::size_t sent = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (sent < total && std::chrono::steady_clock::now() < give_up) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const std::size_t at = sent % requests.size();
    const ssize_t n = ::send(fd, requests.data() + at, requests.size() - at, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<std::size_t>(n);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the daemon act on what it read
  const long grown_mb = (rss_kb() - before) / 1024;
  EXPECT_LT(grown_mb, 160) << "replies queued without bound: +" << grown_mb << " MB";
  ::close(fd);
}

TEST_F(ServiceTest, ATrainerRestartedWhileItsOldReadsAreInFlightGetsItsEpoch) {
  fetcher_->hold = true;
  {
    const int fd = raw_connect(dir_ / "d0.sock");
    int fds[2] = {-1, -1};
    raw_hello(fd, 0, fds);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<std::uint8_t> start;
    proto::encode(start, proto::StartEpoch{0, 1, {}});
    ASSERT_EQ(static_cast<ssize_t>(start.size()), ::send(fd, start.data(), start.size(), MSG_NOSIGNAL));
    while (fetcher_->held_count() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::close(fd);  // the trainer dies with reads in flight that fill its staging ring
  }
  fetcher_->hold = false;
  ClientOptions o = options(0);
  o.receive_timeout_s = 20;
  Client back = Client::connect(o);
  std::jthread slow_peer([this] {  // joins even if consume() throws
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    fetcher_->release_held();  // the old reads land only now, after the new pass began
  });
  EXPECT_EQ(consume(back, 0), planner_->plan_node(0, 0)[0].order);
}

TEST_F(ServiceTest, FinishedPassesAreRecordedWithTheTrainersWait) {
  Client client = Client::connect(options(1));
  fetcher_->hold = true;  // the first batch with a peer sample cannot arrive yet
  std::vector<SampleId> ids;
  std::jthread trainer([&] { ids = consume(client, 0); });
  while (fetcher_->held_count() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // The trainer asked for epoch 0 before the read was posted; it waits at least this long.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  fetcher_->hold = false;
  fetcher_->release_held();
  trainer.join();
  // The last Release (which completes the pass) may still be on its way to the service.
  auto wait_for_records = [this] {
    std::vector<TrainerEpochRecord> got;
    for (int tries = 0; tries < 1000 && got.empty(); ++tries) {
      got = telemetry_.take_records();
      if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return got;
  };
  const auto records = wait_for_records();
  ASSERT_EQ(records.size(), 1u);
  const TrainerEpochRecord& r = records[0];
  EXPECT_EQ(r.trainer_rank, 1u);
  EXPECT_EQ(r.stats.epoch, 0u);
  EXPECT_EQ(r.stats.samples, ids.size());
  EXPECT_EQ(r.released_batches, shape_.batches_per_trainer);
  EXPECT_GE(r.stall_us, 200'000u);
  EXPECT_LE(r.t_start, r.t_end);
  // An abandoned pass is not a finished one.
  for (const Batch& batch : client.epoch(1)) {
    (void)batch;
    break;
  }
  (void)consume(client, 2);
  const auto later = wait_for_records();
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].stats.epoch, 2u);
}

TEST_F(ServiceTest, GetStatsNeedsNoHelloAndCountsWhatWasDelivered) {
  Client client = Client::connect(options(0));
  const auto ids = consume(client, 0);
  ClientOptions o = options(0);
  // The last Release and the record it completes may still be in flight on the service thread.
  std::string text;
  for (int tries = 0; tries < 200; ++tries) {
    auto got = query_daemon_stats(o, 0);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    text = *got;
    if (text.find("shardmix_trainer_epochs_total{node=\"0\"} 1\n") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  double delivered = 0;
  for (const char* tier : {"local", "peer", "storage"}) {
    const std::string key = std::string("shardmix_samples_total{node=\"0\",tier=\"") + tier + "\"} ";
    const auto at = text.find(key);
    ASSERT_NE(at, std::string::npos) << key << "\n" << text;
    delivered += std::strtod(text.c_str() + at + key.size(), nullptr);
  }
  EXPECT_EQ(delivered, static_cast<double>(ids.size()));
  EXPECT_NE(text.find("shardmix_trainers_connected{node=\"0\"} 1\n"), std::string::npos) << text;
}

TEST_F(ServiceTest, SocketFileIsPrivate) {
  struct stat st {};
  ASSERT_EQ(0, ::stat((dir_ / "d0.sock").c_str(), &st));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

}  // namespace client_service_test
}  // namespace shardmix

namespace shardmix {
namespace client_service_test {

// SHARDMIX_JOB_TOKEN set for one scope, restored afterwards.
class ScopedJobTokenEnv {
 public:
  explicit ScopedJobTokenEnv(const char* value) {
    if (const char* old = std::getenv(kJobTokenEnv)) saved_ = old;
    if (value != nullptr) {
      ::setenv(kJobTokenEnv, value, 1);
    } else {
      ::unsetenv(kJobTokenEnv);
    }
  }
  ~ScopedJobTokenEnv() {
    if (saved_) {
      ::setenv(kJobTokenEnv, saved_->c_str(), 1);
    } else {
      ::unsetenv(kJobTokenEnv);
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST_F(ServiceTest, ATrainerOfAnotherJobIsRefusedByItsToken) {
  {
    ScopedJobTokenEnv other_job("job-b-0123456789");  // e.g. launch.sh of a second job
    auto refused = Client::try_connect(options(0));
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
    EXPECT_NE(refused.status().message().find("belongs to another job (job token mismatch"), std::string::npos)
        << refused.status().message();
  }
  // A Hello without any token (an older client) is refused too, naming that.
  std::vector<std::uint8_t> hello;
  proto::encode(hello, proto::Hello{0, 4, 1});
  const std::string message = error_message(raw_exchange(dir_ / "d0.sock", hello));
  EXPECT_NE(message.find("the trainer sent none"), std::string::npos) << message;
  {
    // The launcher's token is accepted when the daemon holds the same one.
    ScopedJobTokenEnv same_job(nullptr);
    Client client = Client::connect(options(0));  // RUN_DIR/token
    EXPECT_EQ(consume(client, 0), planner_->plan_node(0, 0)[0].order);
  }
  EXPECT_EQ(job_token_from_text("job-b-0123456789"), job_token_from_text("job-b-0123456789"));
  EXPECT_NE(job_token_from_text("job-b-0123456789"), job_token_from_text("job-a-0123456789"));
}

// The daemon builds its Catalog reply in the serialization's own buffer; the frame must be
// byte for byte what the copying encoder makes, and decode back to the catalog.
TEST(CatalogFrameTest, BuiltInPlaceEqualsTheCopyingEncoder) {
  std::vector<CatalogEntry> entries = {{"b/x y.jpg", 10, 1}, {"a/\xc3\xa9.jpg", 0, 0}, {"a/z", 70000, 0}};
  const Catalog catalog = std::move(Catalog::from_entries(std::move(entries), {"a", "b"}).value());
  std::vector<std::uint8_t> copied;
  proto::encode_catalog(copied, catalog.serialize());
  std::vector<std::uint8_t> in_place = catalog.serialize(sizeof(proto::FrameHeader));
  proto::finish_catalog_frame(in_place);
  EXPECT_EQ(in_place, copied);
  proto::FrameHeader h{};
  ASSERT_EQ(proto::decode_header(std::span(in_place).first(sizeof(h)), h), "");
  EXPECT_EQ(h.type, static_cast<std::uint16_t>(proto::FrameType::kCatalog));
  auto back = Catalog::deserialize(std::span(in_place).subspan(sizeof(h)));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->serialize(), catalog.serialize());
}

TEST(JobTokenFileTest, IsPrivateAndRefusedWhenNot) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("token-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / kJobTokenFile).string();
  ASSERT_TRUE(write_job_token_file(path, 0xabcdef01).ok());
  struct stat st {};
  ASSERT_EQ(0, ::stat(path.c_str(), &st));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto token = read_job_token_file(path);
  ASSERT_TRUE(token.ok()) << token.status().to_string();
  EXPECT_EQ(*token, 0xabcdef01u);
  ASSERT_EQ(0, ::chmod(path.c_str(), 0644));
  auto exposed = read_job_token_file(path);
  ASSERT_FALSE(exposed.ok());
  EXPECT_EQ(exposed.status().code(), StatusCode::kPermissionDenied);
  std::ofstream(path) << "not a token\n";
  ASSERT_EQ(0, ::chmod(path.c_str(), 0600));
  EXPECT_EQ(read_job_token_file(path).status().code(), StatusCode::kCorrupt);
  fs::remove_all(dir);
}

// What a process of another user gets from the daemon's socket: the bytes it read, or why
// it could not connect. The child runs as uid/gid 65534 (nobody), like
// `setpriv --reuid=65534 --regid=65534 --clear-groups`; only async-signal-safe calls there.
struct OtherUserResult {
  int connect_errno = 0;
  std::vector<std::uint8_t> answer;
};
OtherUserResult connect_as_nobody(const fs::path& socket_path) {
  int pipe_fds[2];
  EXPECT_EQ(0, ::pipe(pipe_fds));
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    const gid_t no_groups[1] = {65534};
    if (::setgroups(1, no_groups) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
        ::setresuid(65534, 65534, 65534) != 0) {
      ::_exit(2);
    }
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const int e = errno;
      (void)!::write(pipe_fds[1], &e, sizeof(e));
      ::_exit(0);
    }
    const int ok = 0;
    (void)!::write(pipe_fds[1], &ok, sizeof(ok));
    std::uint8_t frame[sizeof(proto::FrameHeader) + 12] = {};
    proto::FrameHeader h{proto::kMagic, proto::kProtocolVersion, static_cast<std::uint16_t>(proto::FrameType::kHello),
                         12, 0};
    std::memcpy(frame, &h, sizeof(h));
    (void)!::send(fd, frame, sizeof(frame), MSG_NOSIGNAL);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::uint8_t buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) (void)!::write(pipe_fds[1], buf, static_cast<std::size_t>(n));
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  OtherUserResult result;
  std::vector<std::uint8_t> all;
  std::uint8_t buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0;) all.insert(all.end(), buf, buf + n);
  ::close(pipe_fds[0]);
  int status = 0;
  EXPECT_EQ(child, ::waitpid(child, &status, 0));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not become uid 65534";
  if (all.size() >= sizeof(int)) {
    std::memcpy(&result.connect_errno, all.data(), sizeof(int));
    result.answer.assign(all.begin() + sizeof(int), all.end());
  }
  return result;
}

TEST_F(ServiceTest, AnotherUserIsRefusedByFileModesAndByPeerCredentials) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a child as uid 65534 (setresuid)";
  // The run dir of a real daemon is 0700; here the test dir is searchable, so this checks
  // the socket's own mode: 0600 keeps uid 65534 out at connect().
  ASSERT_EQ(0, ::chmod(dir_.c_str(), 0755));
  const OtherUserResult by_mode = connect_as_nobody(dir_ / "d0.sock");
  EXPECT_EQ(by_mode.connect_errno, EACCES);
  // With the file modes out of the way (a misconfigured node), SO_PEERCRED still refuses.
  ASSERT_EQ(0, ::chmod((dir_ / "d0.sock").c_str(), 0666));
  const OtherUserResult by_cred = connect_as_nobody(dir_ / "d0.sock");
  ASSERT_EQ(by_cred.connect_errno, 0);
  const std::string message = error_message(by_cred.answer);
  EXPECT_NE(message.find("uid 65534 may not use the daemon of uid 0"), std::string::npos) << message;
  // Nothing was mapped or handed over: the answer is exactly one Error frame (no Welcome).
  proto::FrameHeader h{};
  ASSERT_GE(by_cred.answer.size(), sizeof(h));
  ASSERT_TRUE(proto::decode_header(std::span(by_cred.answer).first(sizeof(h)), h).empty());
  EXPECT_EQ(by_cred.answer.size(), sizeof(h) + h.payload_bytes);
  // And the daemon goes on serving its own user.
  Client client = Client::connect(options(1));
  EXPECT_EQ(consume(client, 0), planner_->plan_node(0, 0)[1].order);
}

TEST_F(ServiceTest, StoppingTheServiceEndsATrainersEpochWithTheReason) {
  Client client = Client::connect(options(0));
  std::string error;
  std::size_t batches = 0;
  try {
    for (const Batch& batch : client.epoch(0)) {
      (void)batch;
      if (++batches == 2) {
        service_->stop(make_error(StatusCode::kCancelled, "the daemon of node 0 is shutting down"));
      }
    }
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("the daemon of node 0 is shutting down"), std::string::npos) << error;
  EXPECT_LT(batches, shape_.batches_per_trainer);
}

TEST_F(ServiceTest, ATrainerWhoseSendHitsAClosedDaemonReportsTheDaemonsReason) {
  Client client = Client::connect(options(1));
  std::string error;
  try {
    auto epoch = client.epoch(0);
    auto it = epoch.begin();
    ASSERT_FALSE(it == std::default_sentinel);
    // The daemon says why and closes before the trainer sends its next request (a Release):
    // the send fails with EPIPE, and the client must report the Error frame waiting in the
    // socket behind the batches, not "Broken pipe".
    service_->stop(make_error(StatusCode::kUnavailable, "daemon rank 1 (host h) is dead or unreachable"));
    ASSERT_TRUE(service_->wait_all_closed(std::chrono::seconds(10)));
    for (; !(it == std::default_sentinel); ++it) {
    }
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("daemon rank 1 (host h) is dead or unreachable"), std::string::npos) << error;
  EXPECT_EQ(error.find("Broken pipe"), std::string::npos) << error;
}

// Keepalives (decision 0036): a daemon whose batches are slow to come (here: every peer
// read held for longer than twice the trainer's receive timeout) is alive, and the trainer
// keeps waiting; it then gets the whole epoch. Without keepalives this fails with "sent
// nothing for 3 s".
TEST_F(ServiceTest, ATrainerWaitsOutSlowReadsLongerThanItsReceiveTimeout) {
  fetcher_->hold = true;
  ClientOptions o = options(1);
  o.receive_timeout_s = 3;
  Client client = Client::connect(o);
  std::size_t held_at_release = 0;
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(6500));
    held_at_release = fetcher_->held_count();
    fetcher_->hold = false;
    fetcher_->release_held();
  });
  std::vector<SampleId> ids;
  std::string error;
  try {
    ids = consume(client, 0);
  } catch (const Error& e) {
    error = e.what();
  }
  releaser.join();
  EXPECT_EQ(error, "");
  EXPECT_GT(held_at_release, 0u);  // the trainer really waited on held reads
  EXPECT_EQ(ids, planner_->plan_node(0, 0)[1].order);
}

// The backstop behind the keepalives: a live daemon that never delivers (here: every peer
// read held until the end) is an error after the progress timeout, naming the daemon.
TEST_F(ServiceTest, ALiveDaemonThatNeverDeliversIsAnErrorAfterTheProgressTimeout) {
  fetcher_->hold = true;
  ClientOptions o = options(1);
  o.receive_timeout_s = 2;
  o.progress_timeout_s = 3;
  Client client = Client::connect(o);
  const std::string error = run_epoch_0(client).second;
  EXPECT_GT(fetcher_->held_count(), 0u);
  fetcher_->hold = false;
  fetcher_->release_held();
  EXPECT_NE(error.find("the daemon of node 0 ("), std::string::npos) << error;
  EXPECT_NE(error.find("is alive (it sends keepalives) but sent nothing else for 3 s"), std::string::npos) << error;
}

// ClientOptions::interrupted (what the Python binding uses for Ctrl-C): a signal that
// interrupts the wait for a batch asks the hook; on true the wait fails as cancelled and
// the connection closes. The daemon frees what that trainer held, so the same rank can
// connect again and get its whole epoch.
TEST_F(ServiceTest, AnInterruptedWaitFailsAsCancelledAndTheRankCanConnectAgain) {
  fetcher_->hold = true;
  struct sigaction quiet {}, saved {};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  quiet.sa_flags = 0;  // no SA_RESTART: the signal interrupts poll
  ASSERT_EQ(::sigaction(SIGUSR1, &quiet, &saved), 0);
  std::atomic<int> asked{0};
  const ClientOptions o = options_always_interrupted(asked);
  std::string error;
  StatusCode code = StatusCode::kOk;
  {
    Client client = Client::connect(o);
    const pthread_t waiter = ::pthread_self();
    std::atomic<bool> done{false};
    // Signals until the wait gives up: one may land outside a system call and change nothing.
    std::thread signaller([&] {
      while (!done) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!done) ::pthread_kill(waiter, SIGUSR1);
      }
    });
    std::tie(code, error) = run_epoch_0(client);
    done = true;
    signaller.join();
  }
  ASSERT_EQ(::sigaction(SIGUSR1, &saved, nullptr), 0);
  EXPECT_EQ(code, StatusCode::kCancelled) << error;
  EXPECT_NE(error.find("interrupted by a signal while waiting for the daemon of node 0"), std::string::npos) << error;
  EXPECT_GE(asked.load(), 1);
  expect_a_new_client_gets_epoch_0_whole();
}

// A signal that lands while the waiting thread is between system calls (e.g. reading a
// keepalive) interrupts no poll: the hook is asked at each keepalive as well. Here no
// signal is sent at all and the hook says "stop" from the start: the wait must end at the
// first keepalive. The held reads are let go after several keepalive intervals, so a client
// that asks only on EINTR gets its batches and the epoch ends without the error.
TEST_F(ServiceTest, AWaitAsksTheInterruptHookAtEveryKeepalive) {
  fetcher_->hold = true;
  std::atomic<int> asked{0};
  const ClientOptions o = options_always_interrupted(asked);
  std::string error;
  StatusCode code = StatusCode::kOk;
  std::promise<void> finished;
  std::thread releaser([this, done = finished.get_future()] {
    if (done.wait_for(5 * proto::kKeepaliveInterval) == std::future_status::timeout) fetcher_->release_held();
    fetcher_->hold = false;
  });
  {
    Client client = Client::connect(o);
    std::tie(code, error) = run_epoch_0(client);
  }
  finished.set_value();
  releaser.join();
  EXPECT_EQ(code, StatusCode::kCancelled) << (error.empty() ? "the epoch ended: the hook was never asked" : error);
  EXPECT_GE(asked.load(), 1);
  expect_a_new_client_gets_epoch_0_whole();
}

// A daemon that is alive as a process but answers nothing (its io thread blocked, as under
// SIGSTOP or a hang): the trainer gets an error naming the daemon and the socket after its
// receive timeout, not a wait for ever.
TEST_F(ServiceTest, AHungDaemonIsNamedAfterTheReceiveTimeout) {
  ClientOptions o = options(0);
  o.receive_timeout_s = 2;
  Client client = Client::connect(o);
  std::promise<void> unblock;
  std::shared_future<void> unblocked = unblock.get_future().share();
  std::promise<void> blocked;
  boost::asio::post(io_, [&blocked, unblocked] {
    blocked.set_value();
    unblocked.wait();  // the daemon's io thread hangs: no batch, no keepalive
  });
  blocked.get_future().wait();
  const std::string error = run_epoch_0(client).second;
  unblock.set_value();
  EXPECT_NE(error.find("the daemon of node 0 ("), std::string::npos) << error;
  EXPECT_NE(error.find("d0.sock) sent nothing for 2 s, not even its keepalive"), std::string::npos) << error;
}

TEST_F(ServiceTest, AFloodOfIdleConnectionsDoesNotStopTheTrainers) {
  // 300 connections that never say Hello (a runaway script of the same user): the daemon
  // keeps serving its trainers, and every descriptor is returned when they go.
  const int before = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
  }();
  std::vector<int> flood;
  for (int i = 0; i < 300; ++i) flood.push_back(raw_connect(dir_ / "d0.sock"));
  Client client = Client::connect(options(0));
  EXPECT_EQ(consume(client, 0), planner_->plan_node(0, 0)[0].order);
  for (int fd : flood) ::close(fd);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto count = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  // The trainer's connection is still open: its socket and the daemon's end of it.
  while (count() > before + 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LE(count(), before + 2) << "descriptors before the flood: " << before;
}

int open_fds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Soak: many short epochs, by one long-lived trainer and by a trainer that reconnects
// every epoch (fresh socket, fresh mappings of the arena and staging memfds). After a
// warm-up, resident memory stays within a bound far below what a per-epoch leak of one
// mapping, staging area or catalog copy would add up to, and the open files return to
// their count. Daemon and trainers share this process, so both sides are measured.
TEST_F(ServiceTest, SoakManyEpochsKeepsMemoryAndOpenFilesFlat) {
  constexpr int kWarmup = 5;
  constexpr int kEpochs = 60;
  // A leak of one arena mapping per reconnect alone would add arena_bytes per epoch.
  const long arena_kb = static_cast<long>(placement_.arena_bytes[0] / 1024);
  Client steady = Client::connect(options(0));
  long rss_after_warmup = 0, rss_max = 0;
  int fds_after_warmup = 0;
  for (int e = 0; e < kEpochs; ++e) {
    EXPECT_EQ(consume(steady, static_cast<std::uint64_t>(e)).size(), shape_.trainer_quota[0]);
    {
      Client again = Client::connect(options(1));
      (void)again.catalog();  // a catalog copy per connection, too
      EXPECT_EQ(consume(again, static_cast<std::uint64_t>(e)).size(), shape_.trainer_quota[1]);
    }
    // The daemon side closes the old connection when it processes the hang-up; wait for
    // the count to come back (bounded), instead of assuming when that happens.
    if (e == kWarmup) {
      rss_after_warmup = rss_kb();
      fds_after_warmup = open_fds();
    } else if (e > kWarmup) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (open_fds() > fds_after_warmup && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      EXPECT_LE(open_fds(), fds_after_warmup) << "epoch " << e << ": open files grew";
      rss_max = std::max(rss_max, rss_kb());
    }
  }
  const long grown_kb = rss_max - rss_after_warmup;
  RecordProperty("rss_after_warmup_kb", std::to_string(rss_after_warmup));
  RecordProperty("rss_growth_kb", std::to_string(grown_kb));
  std::printf("soak: %d epochs, RSS after warm-up %ld kB, max growth %ld kB (bound %ld kB), open fds %d\n", kEpochs,
              rss_after_warmup, grown_kb, std::max(2048L, 4 * arena_kb), fds_after_warmup);
  // Bound: 2 MiB or 4 arenas, whichever is more; 54 leaked arena mappings would be far beyond.
  EXPECT_LE(grown_kb, std::max(2048L, 4 * arena_kb));
}

// Checkpoint and resume (docs/decisions/0022). A trainer consumes k batches, saves
// checkpoint(), "dies" (its connection closes), and a new process of the same rank
// resumes from the blob: both halves together must be its planned samples exactly once,
// in batches k.. of the epoch with the planned sizes, and the next epoch is normal.
struct Half {
  std::vector<SampleId> ids;
  std::vector<std::uint64_t> batch_index;
  std::vector<std::size_t> batch_size;
};

Half take(Client& client, std::uint64_t epoch, std::size_t batches, std::span<const std::uint8_t> resume = {}) {
  Half h;
  auto pass = resume.empty() ? client.epoch(epoch) : client.epoch(epoch, resume);
  for (const Batch& batch : pass) {
    h.batch_index.push_back(batch.index());
    h.batch_size.push_back(batch.size());
    for (const Sample& s : batch) h.ids.push_back(s.id());
    if (h.batch_index.size() == batches) break;  // the checkpoint is taken while holding this batch
  }
  return h;
}

void expect_exactly_the_plan(const Half& a, const Half& b, const TrainerPlan& plan) {
  std::multiset<SampleId> all(a.ids.begin(), a.ids.end());
  all.insert(b.ids.begin(), b.ids.end());
  EXPECT_EQ(all, std::multiset<SampleId>(plan.order.begin(), plan.order.end()));
  std::vector<std::uint64_t> indices = a.batch_index;
  indices.insert(indices.end(), b.batch_index.begin(), b.batch_index.end());
  ASSERT_EQ(indices.size(), plan.num_batches());
  std::vector<std::size_t> sizes = a.batch_size;
  sizes.insert(sizes.end(), b.batch_size.begin(), b.batch_size.end());
  for (std::uint64_t j = 0; j < plan.num_batches(); ++j) {
    EXPECT_EQ(indices[j], j);
    EXPECT_EQ(sizes[j], plan.batch_begin[j + 1] - plan.batch_begin[j]) << "batch " << j;
  }
}

TEST_F(ServiceTest, ACheckpointedTrainerResumesWithExactlyTheRestOfItsEpoch) {
  const TrainerPlan plan = planner_->plan_node(1, 0)[1];
  std::vector<std::uint8_t> blob;
  Half first;
  {
    Client client = Client::connect(options(1));
    EXPECT_THROW((void)client.checkpoint(), Error);  // no epoch started: nothing to save
    EXPECT_EQ(consume(client, 0), planner_->plan_node(0, 0)[1].order);
    first = take(client, 1, 3);
    blob = client.checkpoint();
  }  // the trainer dies holding batch 2
  const CheckpointInfo info = Client::inspect_checkpoint(blob);
  EXPECT_EQ(info.epoch, 1u);
  EXPECT_EQ(info.batches_consumed, 3u);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(first.ids, std::vector<SampleId>(plan.order.begin(), plan.order.begin() + 21));  // W = 0: plan order

  Client back = Client::connect(options(1));
  // The resumed half is checkpointed again and resumed once more: positions compose.
  Half second = take(back, 1, 2, blob);
  const auto blob2 = back.checkpoint();
  EXPECT_EQ(Client::inspect_checkpoint(blob2).batches_consumed, 5u);
  Half third = take(back, 1, 1000, blob2);
  second.ids.insert(second.ids.end(), third.ids.begin(), third.ids.end());
  second.batch_index.insert(second.batch_index.end(), third.batch_index.begin(), third.batch_index.end());
  second.batch_size.insert(second.batch_size.end(), third.batch_size.begin(), third.batch_size.end());
  expect_exactly_the_plan(first, second, plan);
  EXPECT_EQ(std::vector<SampleId>(plan.order.begin() + 21, plan.order.end()), second.ids);
  ASSERT_TRUE(back.last_epoch_stats().has_value());
  EXPECT_EQ(back.last_epoch_stats()->samples, third.ids.size());  // the last pass's own figures
  // A checkpoint at the end of the epoch resumes to nothing; the next epoch is normal.
  const auto done = back.checkpoint();
  EXPECT_TRUE(take(back, 1, 1000, done).ids.empty());
  EXPECT_EQ(consume(back, 2), planner_->plan_node(2, 0)[1].order);
}

TEST_F(ServiceTest, AMismatchedCheckpointIsAClearError) {
  std::vector<std::uint8_t> blob;
  {
    Client client = Client::connect(options(0));
    take(client, 0, 2);
    blob = client.checkpoint();
  }
  Client other = Client::connect(options(1));
  try {
    take(other, 0, 1000, blob);
    ADD_FAILURE() << "another rank's checkpoint was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another rank's checkpoint"), std::string::npos) << e.what();
  }
  Client same = Client::connect(options(0));
  try {
    take(same, 1, 1000, blob);  // taken in epoch 0
    ADD_FAILURE() << "a checkpoint of epoch 0 resumed epoch 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("epoch 0"), std::string::npos) << e.what();
  }
  auto damaged = blob;
  damaged[damaged.size() / 2] ^= 1;
  EXPECT_THROW(take(same, 0, 1000, damaged), Error);
  EXPECT_THROW((void)Client::inspect_checkpoint(damaged), Error);
  // The same job's blob, with a plan digest from another seed: refused, naming the cause.
  proto::Checkpoint c;
  ASSERT_EQ(proto::decode_checkpoint(blob, c), "");
  c.seed += 1;
  c.plan_digest += 1;
  const auto foreign = proto::encode_checkpoint(c);
  try {
    take(same, 0, 1000, foreign);  // the errors above were the client's own: still connected
    ADD_FAILURE() << "a checkpoint of another plan was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shuffle.seed"), std::string::npos) << e.what();
  }
}

// With a window and a straggling peer, samples of later batches overtake late ones: the
// checkpoint carries those exceptions and the resumed pass delivers exactly the rest.
class WindowServiceTest : public ServiceTest {
 protected:
  WindowServiceTest() {
    window_ = 7;  // = batch.size: a late batch can always be completed from the next one
    staging_per_trainer_ = 8 * kStagingPerTrainer;
  }
};

TEST_F(WindowServiceTest, ACheckpointUnderTheWindowCarriesItsExceptionsAndResumesExactly) {
  const TrainerPlan plan = planner_->plan_node(0, 0)[0];
  fetcher_->hold_first = 1;  // the first peer read straggles until the trainer is gone
  std::vector<std::uint8_t> blob;
  Half first;
  {
    Client client = Client::connect(options(0));
    first = take(client, 0, 3);
    blob = client.checkpoint();
  }
  proto::Checkpoint c;
  ASSERT_EQ(proto::decode_checkpoint(blob, c), "");
  ASSERT_FALSE(c.late.empty()) << "the straggler was not overtaken: the test provoked nothing";
  EXPECT_EQ(c.early.size(), c.late.size());
  EXPECT_LE(c.early.size(), 7u);
  EXPECT_NE(std::vector<SampleId>(plan.order.begin(), plan.order.begin() + 21), first.ids);
  fetcher_->hold_first = 0;
  fetcher_->release_held();  // the straggler's read lands after its trainer died
  Client back = Client::connect(options(0));
  const Half second = take(back, 0, 1000, blob);
  expect_exactly_the_plan(first, second, plan);
  EXPECT_EQ(consume(back, 1).size(), planner_->plan_node(1, 0)[0].order.size());
}

// Every checkpoint point of the epoch, each followed by a resume that meets a straggler of
// its own and is checkpointed and resumed once more: exceptions compose across passes.
TEST_F(WindowServiceTest, CheckpointsAtEveryPointWithStragglersInEveryPassResumeExactly) {
  const TrainerPlan plan = planner_->plan_node(2, 0)[0];
  std::size_t with_exceptions = 0;
  // The second leg's batch is followed by a full batch: a straggler held until its trainer
  // is gone can be overtaken only while W ready samples follow it in the plan; at the end
  // of the epoch the trainer waits for it (as it must: nothing is skipped), and here it
  // would never land. (This plan's last batch holds 2 samples.)
  ASSERT_GE(plan.num_batches(), 5u);
  for (std::size_t k = 1; k + 3 <= plan.num_batches(); ++k) {
    std::vector<std::uint8_t> blob;
    Half all;
    auto append = [&all](const Half& h) {
      all.ids.insert(all.ids.end(), h.ids.begin(), h.ids.end());
      all.batch_index.insert(all.batch_index.end(), h.batch_index.begin(), h.batch_index.end());
      all.batch_size.insert(all.batch_size.end(), h.batch_size.begin(), h.batch_size.end());
    };
    for (int leg = 0; leg < 2; ++leg) {
      fetcher_->hold_first = 1;
      {
        Client client = Client::connect(options(0));
        append(take(client, 2, leg == 0 ? k : 1, blob));
        blob = client.checkpoint();
      }
      proto::Checkpoint c;
      ASSERT_EQ(proto::decode_checkpoint(blob, c), "");
      if (!c.late.empty()) ++with_exceptions;
      fetcher_->hold_first = 0;
      fetcher_->release_held();
    }
    Client last = Client::connect(options(0));
    const Half rest = take(last, 2, 1000, blob);
    expect_exactly_the_plan(all, rest, plan);
  }
  EXPECT_GT(with_exceptions, 0u) << "no checkpoint carried exceptions: the test provoked nothing";
}

// A job restarted with another world size: the daemons re-dealt epoch 3 from checkpoints
// (here: every sample with an odd id is left). Trainers learn the epoch from the Welcome,
// get the re-dealt plan, and can checkpoint and restore inside it with the same world size.
class RedealtServiceTest : public ServiceTest {
 protected:
  RedealtServiceTest() {
    std::vector<SampleId> rest;
    for (SampleId id = 1; id < 203; id += 2) rest.push_back(id);
    redealt_.epoch = 3;
    redealt_.digest = redeal_digest(77, 3, rest);
    redealt_.plans = redeal_epoch(rest, JobShape{2, 2, 7, false}, 4, 3);
    redealt_.batches_per_trainer = redealt_.plans[0].num_batches();
  }
};

TEST_F(RedealtServiceTest, TrainersIterateTheReDealtEpochAndCanCheckpointInsideIt) {
  const TrainerPlan& plan = redealt_.plans[1];
  std::vector<std::uint8_t> normal_blob, blob;
  Half first;
  {
    Client client = Client::connect(options(1));
    ASSERT_EQ(client.resumed_epoch(), std::optional<std::uint64_t>(3));
    take(client, 2, 1);
    normal_blob = client.checkpoint();  // epoch 2 follows the normal plan
    first = take(client, 3, 2);
    blob = client.checkpoint();
  }
  EXPECT_TRUE(Client::inspect_checkpoint(blob).redealt);
  EXPECT_FALSE(Client::inspect_checkpoint(normal_blob).redealt);
  Client back = Client::connect(options(1));
  const Half second = take(back, 3, 1000, blob);
  expect_exactly_the_plan(first, second, plan);
  // A blob of the normal plan cannot resume the re-dealt epoch.
  proto::Checkpoint c;
  ASSERT_EQ(proto::decode_checkpoint(normal_blob, c), "");
  c.epoch = 3;
  const auto wrong = proto::encode_checkpoint(c);
  try {
    take(back, 3, 1000, wrong);
    ADD_FAILURE() << "a normal plan's checkpoint resumed a re-dealt epoch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("re-dealt that epoch"), std::string::npos) << e.what();
  }
}

}  // namespace client_service_test
}  // namespace shardmix
