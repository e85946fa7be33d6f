// shardmix-bench-trace-record: what the sample-journey trace (common/trace.h) costs per
// batch on the threads that record it, measured without the rest of a job, so that a busy
// machine's noise does not hide it. Runs the trace points one batch passes through, in a
// loop on one thread: the trainer's (a wait, a hold with its sample ids) and a daemon's
// (the batch's key scope, a read posted and completed per peer, three staged-bytes
// counters, as the scheduler's pumps record them), first with tracing off, then on at
// full detail. Then times writing the JSON, which happens at exit, off the data path.
// Prints a table and one 'JSON {...}' line (bench/trace_overhead.sh reads it).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "common/command_line.h"
#include "common/trace.h"

namespace {

namespace trace = shardmix::trace;
using Clock = std::chrono::steady_clock;

// One batch's trace points on the trainer's side (client/client.cc).
void trainer_batch(std::uint64_t batch, const std::vector<std::uint64_t>& ids) {
  const trace::Key key{1, 3, batch};
  const std::int64_t waited = trace::start();
  trace::span(trace::What::kWaitBatch, 0, waited, key, {key.epoch, key.batch});
  const std::int64_t held = trace::start();
  trace::hold(held, key, ids.size(), [&](std::size_t i) { return ids[i]; });
}

// One batch's trace points on a daemon (common/trainer_scheduler.cc, FabricFetcher).
void daemon_batch(std::uint64_t batch, std::uint32_t peers) {
  const trace::Key key{1, 3, batch};
  const trace::KeyScope scope(key);
  std::vector<trace::PendingRead> pending;  // as the read callbacks capture them
  pending.reserve(peers);
  for (std::uint32_t p = 0; p < peers; ++p) pending.push_back(trace::begin_read(p));
  for (std::uint32_t p = 0; p < peers; ++p) trace::end_read(pending[p], p, 32 * 112 * 1024 / peers, 32 / peers);
  for (int pump = 0; pump < 3; ++pump) trace::counter(trace::What::kStagedBytes, 0, 1 << 22, key);
}

template <typename Body>
double ns_per_batch(std::uint64_t batches, Body body) {
  const auto begin = Clock::now();
  for (std::uint64_t b = 0; b < batches; ++b) body(b);
  return std::chrono::duration<double, std::nano>(Clock::now() - begin).count() / static_cast<double>(batches);
}

}  // namespace

struct Options {
  std::uint64_t batches = 40000;
  std::uint32_t batch_size = 32;
  std::uint32_t peers = 3;  // peer reads per batch on the daemon
};

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"shardmix-bench-trace-record: the trace's recording cost per batch"};
  app.add_option("--batches", options.batches, "Batches per measurement");
  app.add_option("--batch-size", options.batch_size, "Samples per batch (ids in the trainer's hold)");
  app.add_option("--peers", options.peers, "Peer reads per batch on the daemon");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;
  const std::uint64_t batches = options.batches;
  const std::uint32_t batch_size = options.batch_size, peers = options.peers;
  std::vector<std::uint64_t> ids(batch_size);
  for (std::uint32_t i = 0; i < batch_size; ++i) ids[i] = 1000 + 7 * i;

  const double trainer_off = ns_per_batch(batches, [&](std::uint64_t b) { trainer_batch(b, ids); });
  const double daemon_off = ns_per_batch(batches, [&](std::uint64_t b) { daemon_batch(b, peers); });

  const std::string dir = "/tmp/shardmix-bench-trace-record-" + std::to_string(::getpid());
  trace::Settings settings;
  settings.path = dir + "/bench.json";
  settings.process_name = "shardmix-bench-trace-record";
  settings.role = "daemon";
  settings.pid = trace::daemon_pid(0);
  settings.peers = peers;
  settings.max_events_per_thread = 1 << 22;  // the whole measurement fits: nothing is dropped
  if (auto s = trace::enable(settings); !s.ok()) {
    std::fprintf(stderr, "shardmix-bench-trace-record: %s\n", s.to_string().c_str());
    return 1;
  }
  const double trainer_on = ns_per_batch(batches, [&](std::uint64_t b) { trainer_batch(b, ids); });
  const double daemon_on = ns_per_batch(batches, [&](std::uint64_t b) { daemon_batch(b, peers); });
  const std::uint64_t events = trace::recorder()->recorded_events();
  const std::uint64_t dropped = trace::recorder()->dropped_events();
  const auto write_begin = Clock::now();
  const shardmix::Status written = trace::write();
  const double write_s = std::chrono::duration<double>(Clock::now() - write_begin).count();
  const auto file_bytes = written.ok() ? std::filesystem::file_size(settings.path) : 0;
  std::filesystem::remove_all(dir);

  std::printf("trace recording cost per batch (%llu batches, batch %u, %u peer reads), one thread:\n",
              static_cast<unsigned long long>(batches), batch_size, peers);
  std::printf("  trainer: %.0f ns off, %.0f ns on (+%.0f ns)\n", trainer_off, trainer_on, trainer_on - trainer_off);
  std::printf("  daemon:  %.0f ns off, %.0f ns on (+%.0f ns)\n", daemon_off, daemon_on, daemon_on - daemon_off);
  std::printf("  %llu events (%llu dropped), written at exit in %.3f s (%.1f MB)%s\n",
              static_cast<unsigned long long>(events), static_cast<unsigned long long>(dropped), write_s,
              file_bytes / 1e6, written.ok() ? "" : (" FAILED: " + written.to_string()).c_str());
  std::printf("JSON {\"bench\": \"trace_record\", \"batches\": %llu, \"batch_size\": %u, \"peers\": %u, "
              "\"trainer_ns_off\": %.1f, \"trainer_ns_on\": %.1f, \"daemon_ns_off\": %.1f, \"daemon_ns_on\": %.1f, "
              "\"events\": %llu, \"dropped\": %llu, \"write_seconds\": %.4f, \"file_bytes\": %llu}\n",
              static_cast<unsigned long long>(batches), batch_size, peers, trainer_off, trainer_on, daemon_off,
              daemon_on, static_cast<unsigned long long>(events), static_cast<unsigned long long>(dropped), write_s,
              static_cast<unsigned long long>(file_bytes));
  std::fflush(stdout);
  // The trace was written and removed above; the exit handler would write it again.
  std::_Exit(written.ok() ? 0 : 1);
}
