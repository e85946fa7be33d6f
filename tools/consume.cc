// shardmix-consume: a trainer stand-in. Touches every byte of every sample (XXH64 by
// default; --touch copy or none for the benchmarks), prints per-epoch samples/s, GB/s and
// stall time (waiting for batches), and with
// --trace writes DIR/rank-<R>.csv:
//   epoch,rank,batch,position,sample_id,path,label,bytes,xxh64,tier,owner
// (path relative to dataset.path, or "<shard>@<offset>" for a sample inside a tar or
// TFRecord shard; CSV-quoted when needed; xxh64 seed 0, 16 hex digits), and
// DIR/skipped-rank-<R>.csv: epoch,rank,batch,sample_id,path of the samples the daemon
// could not read and skipped (dataset.strict = false; Batch::skipped()), and
// DIR/empty-rank-<R>.csv: epoch,rank,batch of the empty batches received (the last batch
// of an epoch with drop_last = false and fewer leftovers than trainers), which have no row.
// Run it as the trainer ranks, e.g. under deploy/launch.sh.
// Checkpoint and resume (docs/decisions/0022): --checkpoint-after K --checkpoint-dir DIR
// saves Client::checkpoint() to DIR/rank-<R>.ckpt after the K-th batch of the first epoch
// and then exits at once, still holding that batch, as a trainer killed right after its
// checkpoint would (the trace holds exactly the batches the checkpoint covers).
// --resume-dir DIR continues: from DIR/rank-<R>.ckpt (same world size), or, when the
// daemons re-dealt an epoch from resume.checkpoint_dir, from Client::resumed_epoch();
// --epochs then counts from the resumed epoch.
// --lockstep (docs/decisions/0050) holds the trainers in step as DDP's gradient all-reduce
// does: after each batch's body every trainer joins one MPI_Allreduce of one int over all
// trainer ranks of the job, so no trainer asks for batch k+1 before every trainer has
// finished batch k. With --trace it also writes DIR/batch-rank-<R>.csv:
//   epoch,rank,batch,t_request,t_received
// (monotonic seconds: when the trainer began waiting for the batch, and when it was in hand).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>
#include <vector>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <mpi.h>
#include <xxhash.h>

#include "client/client.h"
#include "common/command_line.h"

namespace {

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

// steady_clock is CLOCK_MONOTONIC on Linux: comparable between processes on one machine,
// so a benchmark can take the wall-clock span from the first trainer's start to the last
// trainer's end.
double monotonic_seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// --lockstep: the trainers are the ranks of one mpirun job (deploy/launch.sh starts them
// so, on one machine or across hosts), so MPI_COMM_WORLD is exactly the job's trainers.
// One MPI_Allreduce(MAX) of "I still have a batch" per batch is the stand-in for DDP's
// per-step gradient all-reduce. A trainer whose epoch has ended (fewer batches, or only its
// empty last batch left behind it) keeps joining with 0 until the maximum is 0, so trainers
// with different batch counts cannot deadlock. Leaving main without finish() (an error, an
// exception) calls MPI_Abort: mpirun then ends every trainer instead of leaving the others
// blocked in the collective; a trainer killed by a signal ends the job through mpirun too.
class Lockstep {
 public:
  Lockstep(int* argc, char*** argv) { MPI_Init(argc, argv); }
  Lockstep(const Lockstep&) = delete;
  Lockstep& operator=(const Lockstep&) = delete;
  ~Lockstep() {
    if (!finished_) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  // After a batch's body: returns once every trainer has finished its batch of this step.
  void batch_done() { all_reduce_max(1); }
  // After the epoch's last batch: takes part until no trainer has a batch left.
  void epoch_done() {
    while (all_reduce_max(0) != 0) {
    }
  }
  void finish() {
    finished_ = true;
    MPI_Finalize();
  }

 private:
  static int all_reduce_max(int mine) {
    int max = 0;
    MPI_Allreduce(&mine, &max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return max;
  }
  bool finished_ = false;
};

// DS-Analyzer's reference run (Mohan et al., VLDB 2021): the same per-batch work fed from
// memory, so its epoch time is the trainer's own; a loader's epoch time minus this is stall.
int run_synthetic(std::uint64_t epochs, std::uint64_t batches, std::uint64_t batch_bytes, const std::string& touch,
                  double compute_ms, bool json) {
  const char* rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  const int rank = rank_env != nullptr ? std::atoi(rank_env) : 0;
  std::vector<std::byte> source(batch_bytes, std::byte{1});
  std::vector<std::byte> sink(batch_bytes);
  std::uint64_t checksum = 0;
  for (std::uint64_t e = 0; e < epochs; ++e) {
    const auto start = std::chrono::steady_clock::now();
    for (std::uint64_t b = 0; b < batches; ++b) {
      if (touch == "copy") {
        std::memcpy(sink.data(), source.data(), source.size());
        checksum ^= sink.empty() ? 0 : static_cast<std::uint64_t>(sink[sink.size() / 2]);
      } else if (touch == "hash") {
        checksum ^= XXH64(source.data(), source.size(), b);
      }
      if (compute_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(compute_ms));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d synthetic epoch %llu: %llu batches of %llu bytes, %.3f s (checksum %016llx)\n", rank,
                static_cast<unsigned long long>(e), static_cast<unsigned long long>(batches),
                static_cast<unsigned long long>(batch_bytes), secs, static_cast<unsigned long long>(checksum));
    if (json) {
      std::printf("JSON {\"rank\": %d, \"epoch\": %llu, \"synthetic\": true, \"batches\": %llu, \"bytes\": %llu, "
                  "\"seconds\": %.6f, \"t_start\": %.6f, \"t_end\": %.6f}\n",
                  rank, static_cast<unsigned long long>(e), static_cast<unsigned long long>(batches),
                  static_cast<unsigned long long>(batches * batch_bytes), secs, monotonic_seconds(start),
                  monotonic_seconds(start) + secs);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardmix-consume: a trainer stand-in that reads every byte ShardMix delivers"};
  std::uint64_t epochs = 1;
  std::uint64_t first_epoch = 0;
  std::string trace_dir;
  int daemon = -1;
  std::string touch = "hash";
  bool json = false;
  double compute_ms = 0;
  app.add_option("--epochs", epochs, "Epochs to consume")->check(CLI::PositiveNumber);
  app.add_option("--first-epoch", first_epoch, "Number of the first epoch");
  app.add_option("--trace", trace_dir, "Write DIR/rank-<R>.csv with one row per delivered sample");
  app.add_option("--daemon", daemon, "Use this node's daemon instead of finding it by rank");
  app.add_option("--touch", touch,
                 "How every byte is touched: hash (XXH64, needed for --trace), copy (memcpy into a "
                 "private buffer, as a trainer staging data for a GPU would) or none (take the zero-copy "
                 "views without reading them: measures delivery alone, like a raw fi_read benchmark)")
      ->check(CLI::IsMember({"hash", "copy", "none"}));
  app.add_flag("--json", json, "Also print one 'JSON {...}' line per epoch for scripts");
  app.add_option("--compute-ms", compute_ms, "Simulated compute per batch (sleep), as a training step would take")
      ->check(CLI::NonNegativeNumber);
  std::uint64_t checkpoint_after = 0;
  std::string checkpoint_dir;
  std::string resume_dir;
  std::string between_epochs;
  app.add_option("--between-epochs", between_epochs,
                 "Shell command run (std::system) after every epoch but the last, outside the epoch's timing, "
                 "e.g. 'sync; echo 3 > /proc/sys/vm/drop_caches' to drop the page cache while the daemons run")
      ->check(CLI::Validator([](std::string& s) { return s.empty() ? "must not be empty" : ""; }, "COMMAND"));
  app.add_option("--checkpoint-after", checkpoint_after,
                 "Save a checkpoint after this many batches of the first epoch, then exit at once (0 = never)");
  app.add_option("--checkpoint-dir", checkpoint_dir, "Where --checkpoint-after writes rank-<R>.ckpt");
  app.add_option("--resume-dir", resume_dir,
                 "Resume: from DIR/rank-<R>.ckpt, or from the epoch the daemons re-dealt (resume.checkpoint_dir)");
  std::uint64_t synthetic_batches = 0;
  std::uint64_t synthetic_batch_bytes = 0;
  app.add_option("--synthetic-batches", synthetic_batches,
                 "Do not connect: run each epoch over this many batches of in-memory bytes (touched as --touch "
                 "says, then --compute-ms): the stall-free reference of bench/stall.sh");
  app.add_option("--synthetic-batch-bytes", synthetic_batch_bytes, "Bytes per --synthetic-batches batch");
  bool first_batch_only = false;
  app.add_flag("--first-batch-only", first_batch_only,
               "Print when the first batch was in hand (a 'JSON {...}' line with t_first_batch) and exit at once, "
               "without finishing the epoch: bench/startup.sh's mpirun-to-first-batch");
  bool lockstep = false;
  app.add_flag("--lockstep", lockstep,
               "Hold all trainers of the job in step as DDP does: one MPI_Allreduce of one int per batch over "
               "the trainer ranks (run them as their own mpirun job, as deploy/launch.sh does; not under "
               "deploy/mpmd.sh, whose wrapper is the MPI rank)");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;
  if (lockstep && (synthetic_batches > 0 || first_batch_only || checkpoint_after > 0)) {
    // Those leave the loop early or never enter it: the other trainers would wait in the
    // collective for a batch that never comes.
    std::fprintf(stderr,
                 "shardmix-consume: --lockstep cannot be combined with --synthetic-batches, --first-batch-only "
                 "or --checkpoint-after\n");
    return 2;
  }
  if (synthetic_batches > 0) {
    return run_synthetic(epochs, synthetic_batches, synthetic_batch_bytes, touch, compute_ms, json);
  }
  if (checkpoint_after > 0 && checkpoint_dir.empty()) {
    std::fprintf(stderr, "shardmix-consume: --checkpoint-after needs --checkpoint-dir\n");
    return 2;
  }

  std::optional<Lockstep> in_step;
  if (lockstep) in_step.emplace(&argc, &argv);
  try {
    shardmix::ClientOptions options;
    options.daemon = daemon;
    shardmix::Client client = shardmix::Client::connect(options);
    const int rank = client.rank();
    std::FILE* trace = nullptr;
    std::FILE* skipped_trace = nullptr;
    std::FILE* empty_trace = nullptr;
    std::FILE* batch_times = nullptr;
    const shardmix::Catalog* catalog = nullptr;
    if (!trace_dir.empty()) {
      std::filesystem::create_directories(trace_dir);
      auto open_csv = [&](const char* stem, const char* header) -> std::FILE* {
        const std::string path = fmt::format("{}/{}-{}.csv", trace_dir, stem, rank);
        std::FILE* f = std::fopen(path.c_str(), "w");
        if (f == nullptr) {
          std::fprintf(stderr, "shardmix-consume: cannot write %s\n", path.c_str());
          return nullptr;
        }
        std::fputs(header, f);
        std::fflush(f);  // a trainer that exits at a checkpoint (std::_Exit) still leaves a header
        return f;
      };
      trace = open_csv("rank", "epoch,rank,batch,position,sample_id,path,label,bytes,xxh64,tier,owner\n");
      skipped_trace = open_csv("skipped-rank", "epoch,rank,batch,sample_id,path\n");
      empty_trace = open_csv("empty-rank", "epoch,rank,batch\n");
      batch_times = open_csv("batch-rank", "epoch,rank,batch,t_request,t_received\n");
      if (trace == nullptr || skipped_trace == nullptr || empty_trace == nullptr || batch_times == nullptr) return 1;
      try {
        catalog = &client.catalog();
      } catch (const shardmix::Error& e) {
        // A daemon that cannot serve the catalog (an owner that did not answer while its
        // daemon assembled it): the traces keep every column but the path, left empty.
        std::fprintf(stderr, "shardmix-consume: trace paths left empty: %s\n", e.what());
      }
    }
    if (touch != "hash" && !trace_dir.empty()) {
      std::fprintf(stderr, "shardmix-consume: --trace needs --touch hash\n");
      return 2;
    }
    std::vector<std::uint8_t> resume_blob;
    if (!resume_dir.empty()) {
      if (auto redealt = client.resumed_epoch()) {
        first_epoch = *redealt;  // the daemons re-dealt it: iterate it without a blob
      } else {
        const std::string path = fmt::format("{}/rank-{}.ckpt", resume_dir, rank);
        std::ifstream in(path, std::ios::binary);
        if (!in) {
          std::fprintf(stderr, "shardmix-consume: cannot read %s\n", path.c_str());
          return 1;
        }
        resume_blob.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        const shardmix::CheckpointInfo info = shardmix::Client::inspect_checkpoint(resume_blob);
        first_epoch = info.epoch;
        std::printf("rank %d: resuming epoch %llu after %llu batches (%s)\n", rank,
                    static_cast<unsigned long long>(info.epoch), static_cast<unsigned long long>(info.batches_consumed),
                    path.c_str());
      }
    }
    const bool copy = touch == "copy";
    const bool none = touch == "none";
    std::vector<std::byte> sink;
    std::string rows;
    for (std::uint64_t e = first_epoch; e < first_epoch + epochs; ++e) {
      std::uint64_t samples = 0, bytes = 0, batches = 0, checksum = 0, unreadable = 0;
      const auto start = std::chrono::steady_clock::now();
      // Stall: time spent waiting for a batch, from the end of the previous batch's body
      // (touching its bytes and --compute-ms) or from the epoch's start, until the batch
      // is in hand. The wait that only ends the epoch (no batch) is not counted.
      std::chrono::steady_clock::duration stall{0};
      // --lockstep: time spent in the per-batch collective, waiting for the other trainers.
      std::chrono::steady_clock::duration in_step_wait{0};
      auto waiting_since = start;
      auto last_batch_done = start;
      // When the first batch was in hand: bench/startup.sh's "mpirun to first batch".
      std::optional<std::chrono::steady_clock::time_point> first_batch_at;
      const bool resuming = e == first_epoch && !resume_blob.empty();
      for (const shardmix::Batch& batch : resuming ? client.epoch(e, resume_blob) : client.epoch(e)) {
        const auto received = std::chrono::steady_clock::now();
        stall += received - waiting_since;
        if (batch_times != nullptr) {
          std::fprintf(batch_times, "%llu,%d,%llu,%.9f,%.9f\n", static_cast<unsigned long long>(e), rank,
                       static_cast<unsigned long long>(batch.index()), monotonic_seconds(waiting_since),
                       monotonic_seconds(received));
        }
        if (!first_batch_at) {
          first_batch_at = received;
          if (first_batch_only) {
            std::printf("JSON {\"rank\": %d, \"epoch\": %llu, \"first_batch_only\": true, \"samples\": %zu, "
                        "\"t_start\": %.6f, \"t_first_batch\": %.6f}\n",
                        rank, static_cast<unsigned long long>(e), batch.size(), monotonic_seconds(start),
                        monotonic_seconds(*first_batch_at));
            std::fflush(stdout);
            std::_Exit(0);  // like a trainer that goes away mid-epoch: the daemon copes (trainer_killed e2e)
          }
        }
        ++batches;
        unreadable += batch.skipped().size();
        if (skipped_trace != nullptr) {
          for (const shardmix::SampleId id : batch.skipped()) {
            std::fprintf(skipped_trace, "%llu,%d,%llu,%u,%s\n", static_cast<unsigned long long>(e), rank,
                         static_cast<unsigned long long>(batch.index()), id, csv_field(catalog ? catalog->location(id) : std::string()).c_str());
          }
          std::fflush(skipped_trace);  // a trainer that exits at a checkpoint skips the close
        }
        // An empty batch leaves no row in rank-<R>.csv: say that it came, so that a checker
        // can tell it from a batch that never arrived.
        if (empty_trace != nullptr && batch.size() == 0 && batch.skipped().empty()) {
          std::fprintf(empty_trace, "%llu,%d,%llu\n", static_cast<unsigned long long>(e), rank,
                       static_cast<unsigned long long>(batch.index()));
          std::fflush(empty_trace);
        }
        std::size_t position = 0;
        for (const shardmix::Sample& s : batch) {
          const auto view = s.bytes();
          std::uint64_t h = 0;
          if (none) {
            h = view.size();
          } else if (copy) {
            if (sink.size() < view.size()) sink.resize(view.size());
            std::memcpy(sink.data(), view.data(), view.size());
            h = view.empty() ? 0 : static_cast<std::uint64_t>(sink[view.size() / 2]);
          } else {
            h = XXH64(view.data(), view.size(), 0);
          }
          checksum ^= h;
          ++samples;
          bytes += view.size();
          if (trace != nullptr) {
            rows += fmt::format("{},{},{},{},{},{},{},{},{:016x},{},{}\n", e, rank, batch.index(), position, s.id(),
                                csv_field(catalog ? catalog->location(s.id()) : std::string()), s.label(), view.size(), h,
                                shardmix::proto::tier_name(s.tier()), s.owner());
          }
          ++position;
        }
        if (compute_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(compute_ms));
        if (checkpoint_after > 0 && e == first_epoch && batches == checkpoint_after) {
          // After the "optimizer step" on this batch: save, then die holding it.
          const std::vector<std::uint8_t> blob = client.checkpoint();
          std::filesystem::create_directories(checkpoint_dir);
          const std::string path = fmt::format("{}/rank-{}.ckpt", checkpoint_dir, rank);
          const std::string tmp = path + ".tmp";
          std::ofstream(tmp, std::ios::binary)
              .write(reinterpret_cast<const char*>(blob.data()), static_cast<std::streamsize>(blob.size()));
          std::filesystem::rename(tmp, path);
          if (trace != nullptr) {
            std::fwrite(rows.data(), 1, rows.size(), trace);
            std::fclose(trace);
          }
          std::printf("rank %d: checkpoint after %llu batches of epoch %llu written to %s; exiting\n", rank,
                      static_cast<unsigned long long>(batches), static_cast<unsigned long long>(e), path.c_str());
          std::fflush(stdout);
          std::_Exit(0);  // no clean-up: like a trainer killed right after its checkpoint
        }
        if (rows.size() > (1u << 20)) {
          std::fwrite(rows.data(), 1, rows.size(), trace);
          rows.clear();
        }
        last_batch_done = std::chrono::steady_clock::now();
        if (in_step) {
          in_step->batch_done();
          waiting_since = std::chrono::steady_clock::now();
          in_step_wait += waiting_since - last_batch_done;
        } else {
          waiting_since = last_batch_done;
        }
      }
      if (in_step) {
        const auto ended = std::chrono::steady_clock::now();
        in_step->epoch_done();
        in_step_wait += std::chrono::steady_clock::now() - ended;
      }
      const double stall_seconds = std::chrono::duration<double>(stall).count();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const auto& stats = client.last_epoch_stats();
      std::printf(
          "rank %d epoch %llu: %llu samples in %llu batches, %.3f s, %.0f samples/s, %.3f GB/s, stalled %.3f s "
          "(local %llu, peer %llu, storage %llu; checksum %016llx)%s\n",
          rank, static_cast<unsigned long long>(e), static_cast<unsigned long long>(samples),
          static_cast<unsigned long long>(batches), secs, secs > 0 ? samples / secs : 0.0,
          secs > 0 ? bytes / secs / 1e9 : 0.0, stall_seconds,
          static_cast<unsigned long long>(stats ? stats->local_samples : 0),
          static_cast<unsigned long long>(stats ? stats->peer_samples : 0),
          static_cast<unsigned long long>(stats ? stats->storage_samples : 0), static_cast<unsigned long long>(checksum),
          unreadable > 0 ? fmt::format("; {} unreadable samples skipped", unreadable).c_str() : "");
      if (json) {
        std::printf(
            "JSON {\"rank\": %d, \"epoch\": %llu, \"samples\": %llu, \"bytes\": %llu, \"batches\": %llu, "
            "\"seconds\": %.6f, \"local_samples\": %llu, \"peer_samples\": %llu, \"storage_samples\": %llu, \"peer_bytes\": %llu, "
            "\"daemon_fetch_wait_us\": %llu, \"stall_seconds\": %.6f, \"t_start\": %.6f, \"t_end\": %.6f, "
            "\"t_first_batch\": %.6f, \"t_last_batch\": %.6f, \"lockstep\": %s, \"lockstep_wait_seconds\": %.6f}\n",
            rank, static_cast<unsigned long long>(e), static_cast<unsigned long long>(samples),
            static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(batches), secs,
            static_cast<unsigned long long>(stats ? stats->local_samples : 0),
            static_cast<unsigned long long>(stats ? stats->peer_samples : 0),
            static_cast<unsigned long long>(stats ? stats->storage_samples : 0),
            static_cast<unsigned long long>(stats ? stats->peer_bytes : 0),
            static_cast<unsigned long long>(stats ? stats->fetch_wait_us : 0), stall_seconds, monotonic_seconds(start),
            monotonic_seconds(start) + secs, monotonic_seconds(first_batch_at.value_or(start)),
            monotonic_seconds(last_batch_done), in_step ? "true" : "false",
            std::chrono::duration<double>(in_step_wait).count());
      }
      std::fflush(stdout);
      if (!between_epochs.empty() && e + 1 < first_epoch + epochs) {
        // A failed hook would leave the next epoch in a state the caller did not ask for
        // (e.g. a warm page cache in a cold-cache benchmark): stop rather than mislabel it.
        const int status = std::system(between_epochs.c_str());
        if (status != 0) {
          std::fprintf(stderr, "shardmix-consume: --between-epochs command '%s' failed (status %d) after epoch %llu\n",
                       between_epochs.c_str(), status, static_cast<unsigned long long>(e));
          return 1;
        }
      }
    }
    if (trace != nullptr) {
      std::fwrite(rows.data(), 1, rows.size(), trace);
      std::fclose(trace);
    }
    if (skipped_trace != nullptr) std::fclose(skipped_trace);
    if (empty_trace != nullptr) std::fclose(empty_trace);
    if (batch_times != nullptr) std::fclose(batch_times);
  } catch (const shardmix::Error& e) {
    std::fprintf(stderr, "shardmix-consume: %s\n", e.what());
    return 1;
  }
  if (in_step) in_step->finish();
  return 0;
}
