// shardmix-entropy: scores the order a loader actually delivered. Reads the per-rank trace
// files DIR/rank-*.csv (as written by shardmix-consume --trace, or by any loader that emits
// the columns epoch,rank,batch,sample_id,label[,position,bytes,tier,...]), groups them by
// epoch and rank, and prints the shuffle-quality and locality metrics of every epoch
// (common/shuffle_metrics.h; formulas in docs/shuffle-quality.md). Several directories are
// scored separately, e.g. to compare two loaders on the same dataset.
//
//   shardmix-entropy /tmp/trace-a /tmp/trace-b            # a table per directory
//   shardmix-entropy /tmp/trace-a --json | jq .order_entropy
//
// Exit status: 0 all directories scored, 1 some directory could not be read or scored,
// 2 bad command line.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/command_line.h"
#include "common/shuffle_metrics.h"

namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_number(double x) { return std::isnan(x) ? "null" : fmt::format("{:.6f}", x); }

std::string cell(double x, int width, int precision) {
  if (std::isnan(x)) return fmt::format("{:>{}}", "-", width);
  return fmt::format("{:>{}.{}f}", x, width, precision);
}

std::string json_line(const std::string& dir, std::uint64_t epoch, const shardmix::EpochMetrics& m) {
  return fmt::format(
      "{{\"trace\": {}, \"epoch\": {}, \"samples\": {}, \"distinct_samples\": {}, \"trainers\": {}, "
      "\"classes\": {}, \"batch_label_entropy_mean\": {}, \"batch_label_entropy_p5\": {}, "
      "\"batches_scored\": {}, \"batches_skipped\": {}, \"order_entropy\": {}, \"randomization_level\": {}, "
      "\"affinity\": {}, \"local_fraction\": {}, \"peer_fraction\": {}, \"storage_fraction\": {}, "
      "\"unknown_tier_fraction\": {}, \"network_bytes_per_sample\": {}, \"storage_bytes_per_sample\": {}, "
      "\"coverage\": {}}}",
      json_string(dir), epoch, m.samples, m.distinct_samples, m.trainers, m.classes,
      json_number(m.batch_label_entropy_mean), json_number(m.batch_label_entropy_p5), m.batches_scored,
      m.batches_skipped, json_number(m.order_entropy), json_number(m.randomization_level), json_number(m.affinity),
      json_number(m.local_fraction), json_number(m.peer_fraction), json_number(m.storage_fraction),
      json_number(m.unknown_tier_fraction), json_number(m.network_bytes_per_sample),
      json_number(m.storage_bytes_per_sample), json_number(m.coverage));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "shardmix-entropy: shuffle-quality and locality metrics of delivered traces (DIR/rank-*.csv), one row per "
      "epoch; see docs/shuffle-quality.md"};
  std::vector<std::string> dirs;
  bool json = false;
  std::uint64_t seed = 0;
  std::uint64_t num_classes = 0;
  std::uint64_t dataset_size = 0;
  app.add_option("TRACE_DIR", dirs, "Trace directories, each scored separately")->required();
  app.add_flag("--json", json, "Print one JSON object per (directory, epoch) instead of the table");
  app.add_option("--seed", seed, "Seed of the reference permutation for order entropy (default 0)");
  app.add_option("--num-classes", num_classes,
                 "Classes in the dataset (C); default: distinct labels found in the directory's traces");
  app.add_option("--dataset-size", dataset_size,
                 "Samples in the dataset (N), for coverage; default: distinct sample ids found in the directory");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) {
    return *status == 0 ? 0 : 2;  // --help is 0; any usage error is 2
  }

  int exit_code = 0;
  for (const std::string& dir : dirs) {
    shardmix::Result<shardmix::TraceSet> read = shardmix::read_trace_dir(dir);
    if (!read.ok()) {
      std::fprintf(stderr, "shardmix-entropy: %s\n", read.status().to_string().c_str());
      exit_code = 1;
      continue;
    }
    const shardmix::TraceSet& trace = *read;
    shardmix::MetricsContext ctx;
    ctx.seed = seed;
    ctx.num_classes = num_classes != 0 ? num_classes : trace.distinct_labels;
    ctx.dataset_size = dataset_size != 0 ? dataset_size : trace.distinct_samples;
    if (!json) {
      std::printf("== %s: %zu trace files, %llu rows, %zu ranks, %zu epochs, C = %llu classes, N = %llu samples%s\n",
                  dir.c_str(), trace.files.size(), static_cast<unsigned long long>(trace.rows), trace.ranks.size(),
                  trace.epochs.size(), static_cast<unsigned long long>(ctx.num_classes),
                  static_cast<unsigned long long>(ctx.dataset_size),
                  dataset_size != 0 ? "" : " (distinct ids seen)");
      std::printf("%6s %9s %5s %7s %7s %7s %7s %7s %6s %6s %6s %10s %10s %6s\n", "epoch", "samples", "ranks",
                  "batchH", "bH_p5", "orderH", "randLv", "affin", "local", "peer", "stor", "netB/smp", "storB/smp",
                  "cover");
    }
    for (std::size_t i = 0; i < trace.epochs.size(); ++i) {
      const shardmix::EpochTrace& e = trace.epochs[i];
      ctx.epoch = e.epoch;
      const shardmix::EpochDelivery* previous =
          i > 0 && trace.epochs[i - 1].epoch + 1 == e.epoch ? &trace.epochs[i - 1].per_trainer : nullptr;
      shardmix::Result<shardmix::EpochMetrics> scored = shardmix::compute_epoch_metrics(e.per_trainer, ctx, previous);
      if (!scored.ok()) {
        std::fprintf(stderr, "shardmix-entropy: %s: %s\n", dir.c_str(), scored.status().to_string().c_str());
        exit_code = 1;
        continue;
      }
      const shardmix::EpochMetrics& m = *scored;
      if (json) {
        std::printf("%s\n", json_line(dir, e.epoch, m).c_str());
        continue;
      }
      std::printf("%6llu %9llu %5llu %s %s %s %s %s %s %s %s %s %s %s\n", static_cast<unsigned long long>(e.epoch),
                  static_cast<unsigned long long>(m.samples), static_cast<unsigned long long>(m.trainers),
                  cell(m.batch_label_entropy_mean, 7, 3).c_str(), cell(m.batch_label_entropy_p5, 7, 3).c_str(),
                  cell(m.order_entropy, 7, 3).c_str(), cell(m.randomization_level, 7, 3).c_str(),
                  cell(m.affinity, 7, 3).c_str(), cell(m.local_fraction, 6, 3).c_str(),
                  cell(m.peer_fraction, 6, 3).c_str(), cell(m.storage_fraction, 6, 3).c_str(),
                  cell(m.network_bytes_per_sample, 10, 1).c_str(), cell(m.storage_bytes_per_sample, 10, 1).c_str(),
                  cell(m.coverage, 6, 3).c_str());
      if (m.unknown_tier_fraction > 0) {
        std::printf("       (%.1f%% of samples have no tier in the trace)\n", 100.0 * m.unknown_tier_fraction);
      }
    }
    std::fflush(stdout);
  }
  return exit_code;
}
