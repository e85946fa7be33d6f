// Checkpoint replication between daemons (server/checkpoint_replicator.h, decision 0059)
// with the real transport: 3 ranks under mpirun, each with a Fabric (tcp on loopback), a
// CheckpointNode draining to a directory of its own and a FabricCheckpointReplicator,
// pumped on the main thread as the daemon does. Ranks 0 and 1 are on "hostA", rank 2 on
// "hostB"; rank 2's checkpoint.capacity is smaller than the others'.
//   1. Rank 0 saves a version of several pull chunks: the save returns once rank 2 (the
//      other failure domain) holds a copy with the same bytes; rank 1 holds nothing.
//   2. Rank 0 saves a version larger than rank 2's capacity: rank 2 refuses it, and the
//      save returns once rank 1 (the same domain, the only other taker) holds it.
//   3. Rank 0's drain makes both durable: the holders get the release (their wait_durable
//      returns) and the copies stay readable there.
// Prints PASS/FAIL on rank 0; exits non-zero on every rank on failure.
//   checkpoint_replication_mpitest PROVIDER [INTERFACE]
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/checkpoint_node.h"
#include "common/log.h"
#include "control/mpi_comm.h"
#include "fabric/fabric.h"
#include "server/checkpoint_replicator.h"

namespace {

using namespace shardmix;
namespace fs = std::filesystem;

constexpr auto kPatience = std::chrono::seconds(60);
constexpr std::uint64_t kLargeCapacity = 64u << 20;
constexpr std::uint64_t kSmallCapacity = 20u << 20;
constexpr std::size_t kFirstBytes = (17u << 20) + 5;   // five 4 MiB pull chunks, the last short: more than are in flight at once
constexpr std::size_t kSecondBytes = (24u << 20) + 3;  // above rank 2's capacity

std::vector<std::uint8_t> pattern(std::size_t size, std::uint8_t seed) {
  std::vector<std::uint8_t> data(size);
  for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<std::uint8_t>(seed + i * 31 + (i >> 13));
  return data;
}

bool holds(CheckpointNode& node, const std::string& name, const std::vector<std::uint8_t>& expected) {
  const Result<CheckpointBytesPtr> bytes = node.load(name);
  if (!bytes.ok()) return false;
  const auto span = (*bytes)->bytes();
  return std::equal(span.begin(), span.end(), expected.begin(), expected.end());
}

// One rank's daemon parts, in the daemon's order of destruction.
struct Rank {
  explicit Rank(MpiSession& session) : mpi(session) {}
  MpiSession& mpi;
  int failures = 0;
  fs::path dir;
  std::unique_ptr<FabricCheckpointReplicator> replicator;  // outlives the fabric's reads
  std::unique_ptr<fabric::Fabric> fabric;
  std::unique_ptr<CheckpointNode> node;

  void check(bool ok, const std::string& what) {
    if (ok) return;
    std::fprintf(stderr, "[rank %d] FAIL: %s\n", mpi.rank(), what.c_str());
    ++failures;
  }
  // Pumps until `done` holds (or kPatience passed: a failure), then waits for every rank
  // while still pumping, so a peer's offer or answer is never left unhandled.
  void pump_until(const std::function<bool()>& done, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    while (!done() && std::chrono::steady_clock::now() < deadline) replicator->pump();
    check(done(), fmt::format("{} within {} s", what, kPatience.count()));
    check(mpi.barrier([this] { replicator->pump(); }).ok(), "barrier after " + what);
  }
};

Status set_up(Rank& r, const fabric::FabricOptions& options) {
  char dir_template[] = "/tmp/smx-ckptrep-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return make_error(StatusCode::kIoError, "mkdtemp failed");
  r.dir = dir_template;
  SHARDMIX_ASSIGN_OR_RETURN(r.fabric, fabric::Fabric::create(options, r.mpi.rank(), r.mpi.size()));
  SHARDMIX_RETURN_IF_ERROR(r.fabric->expose(nullptr, 0));  // no arena: only offered regions are read
  SHARDMIX_ASSIGN_OR_RETURN(auto blobs, r.mpi.allgather(r.fabric->endpoint_blob()));
  SHARDMIX_RETURN_IF_ERROR(r.fabric->connect_peers(blobs));
  r.fabric->start_progress();
  r.replicator = std::make_unique<FabricCheckpointReplicator>(*r.fabric, r.mpi);
  CheckpointNodeOptions node_options;
  node_options.rank = r.mpi.rank();
  node_options.dir = r.dir;
  node_options.capacity_bytes = r.mpi.rank() == 2 ? kSmallCapacity : kLargeCapacity;
  node_options.domains = {"hostA", "hostA", "hostB"};
  SHARDMIX_ASSIGN_OR_RETURN(r.node, CheckpointNode::start(node_options, r.replicator.get()));
  r.replicator->attach(r.node.get());
  return Status::ok_status();
}

// Rank 0 saves `bytes` as `name`; every rank pumps until the save returned there. The save
// must have returned version `version`.
void save_at_rank_0(Rank& r, const std::string& name, const std::vector<std::uint8_t>& bytes, std::uint64_t version) {
  std::promise<Result<CheckpointId>> promise;
  std::future<Result<CheckpointId>> saved = promise.get_future();
  const auto returned = [&] { return saved.wait_for(std::chrono::seconds(0)) == std::future_status::ready; };
  if (r.mpi.rank() == 0) {
    r.node->save(name, std::make_shared<OwnedCheckpointBytes>(bytes),
                 [&](Result<CheckpointId> id) { promise.set_value(std::move(id)); });
  }
  const std::string what = fmt::format("the save of {}@{}", name, version);
  r.pump_until(r.mpi.rank() == 0 ? std::function<bool()>(returned) : [] { return true; }, what);
  if (r.mpi.rank() == 0 && returned()) {
    const Result<CheckpointId> id = saved.get();
    r.check(id.ok() && *id == (CheckpointId{name, version}),
            what + ": " + (id.ok() ? to_string(*id) : id.status().to_string()));
  }
}

void run(Rank& r) {
  const std::vector<std::uint8_t> first = pattern(kFirstBytes, 1);
  const std::vector<std::uint8_t> second = pattern(kSecondBytes, 2);
  const int rank = r.mpi.rank();

  // 1. The copy goes to the other failure domain, whole.
  save_at_rank_0(r, "model", first, 1);
  if (rank == 2) {
    r.check(holds(*r.node, "model", first), "rank 2 (hostB) does not hold model@1 with the saved bytes");
    r.check(r.replicator->stats().bytes_pulled == kFirstBytes, "rank 2 pulled another byte count");
    // Paced: the five chunks were never all in the fabric at once.
    const std::uint64_t most = r.replicator->stats().most_pull_reads_in_flight;
    r.check(most >= 1 && most <= FabricCheckpointReplicator::kPullReadsInFlight,
            fmt::format("rank 2 had {} reads of one pull in flight at once (limit {})", most,
                        FabricCheckpointReplicator::kPullReadsInFlight));
  }
  if (rank == 1) r.check(r.node->list().empty(), "rank 1 (the owner's host) holds a copy it should not");
  r.check(r.mpi.barrier([&] { r.replicator->pump(); }).ok(), "barrier after the checks of the first save");

  // 2. Too large for rank 2: refused there, held by rank 1.
  save_at_rank_0(r, "model", second, 2);
  if (rank == 2) r.check(r.replicator->stats().refusals == 1, "rank 2 did not refuse the oversized replica");
  if (rank == 1) r.check(holds(*r.node, "model", second), "rank 1 does not hold model@2 with the saved bytes");
  r.check(r.mpi.barrier([&] { r.replicator->pump(); }).ok(), "barrier after the checks of the second save");

  // 3. Durable at the owner: each holder learns it (release) and keeps a readable copy.
  std::promise<Status> durable_promise;
  std::future<Status> durable = durable_promise.get_future();
  // At the owner once its drain wrote model@2; at a holder once the owner's release of the
  // version it holds arrived.
  r.node->wait_durable("model", [&](const Status& s) { durable_promise.set_value(s); });
  r.pump_until([&] { return durable.wait_for(std::chrono::seconds(0)) == std::future_status::ready; },
               "model to be durable (owner) or released (holders)");
  if (durable.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    const Status s = durable.get();
    r.check(s.ok(), "wait_durable: " + s.to_string());
  }
  if (rank == 2) r.check(holds(*r.node, "model", first), "rank 2 lost model@1 after its release");
  if (rank == 1) r.check(holds(*r.node, "model", second), "rank 1 lost model@2 after its release");
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  const char* log_level = std::getenv("SHARDMIX_LOG_LEVEL");
  log::init(mpi.rank(), log_level != nullptr ? log_level : "warn");
  Rank r(mpi);
  if (argc < 2 || mpi.size() != 3) {
    r.check(false, fmt::format("usage: mpirun -np 3 {} PROVIDER [INTERFACE] (ran with {} ranks)", argv[0], mpi.size()));
  } else {
    fabric::FabricOptions options;
    options.provider = argv[1];
    options.interface = argc > 2 ? argv[2] : "";
    if (Status s = set_up(r, options); !s.ok()) {
      r.check(false, s.to_string());
    } else {
      run(r);
    }
  }
  const auto total = mpi.allreduce_sum(static_cast<std::uint64_t>(r.failures));
  const bool passed = total.ok() && *total == 0;
  if (mpi.rank() == 0) {
    std::printf("%s: checkpoint_replication_mpitest ranks=%d (%llu failures)\n", passed ? "PASS" : "FAIL",
                mpi.size(), total.ok() ? static_cast<unsigned long long>(*total) : 0ULL);
  }
  std::fflush(stdout);
  // The node (drain thread) before the fabric (progress thread) before the replicator.
  r.node.reset();
  if (r.fabric) r.fabric->stop_progress();
  r.fabric.reset();
  r.replicator.reset();
  if (!r.dir.empty()) fs::remove_all(r.dir);
  return passed ? EXIT_SUCCESS : EXIT_FAILURE;
}
