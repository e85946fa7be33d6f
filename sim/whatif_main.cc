// shardmix-whatif: a finished job's stats file -> the simulator's prediction for another node
// count or knob setting (docs/simulator.md "What-if").
//   shardmix-whatif STATS_FILE [--calibration FILE] [--nodes P] [--set section.key=value ...]
//                   [--epochs E] [--json]
// Prints a table of measured / simulated-as-measured / predicted figures, then one JSON line
// (with --json only the JSON line). Exit status 0, 1 when a simulation failed its
// exactly-once audit, 2 for bad input (the error names the file and line or key).
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/command_line.h"
#include "sim/whatif.h"

int main(int argc, char** argv) {
  CLI::App app{"shardmix-whatif: predict a finished job at another node count or setting"};
  shardmix::sim::WhatifOptions options;
  bool json_only = false;
  app.add_option("stats_file", options.stats_path, "The job's stats file (telemetry.stats_file)")->required();
  app.add_option("--calibration", options.calibration_path, "Calibration TOML ([sim] keys, bench/calibrate.sh)");
  app.add_option("--nodes", options.nodes, "Node count to predict (default: the job's)");
  app.add_option("--set", options.sets, "Change a key for the prediction: section.key=value (repeatable)");
  app.add_option("--epochs", options.epochs, "Simulated epochs (default: the measured count, 2 to 4)");
  app.add_flag("--json", json_only, "Print only the JSON line");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  auto result = shardmix::sim::run_whatif(options);
  if (!result.ok()) {
    std::fprintf(stderr, "shardmix-whatif: %s\n", result.status().to_string().c_str());
    return 2;
  }
  const auto& r = *result;
  if (!json_only) {
    std::printf("job: %u nodes x %u trainers, %llu samples, median %llu bytes; fitted trainer rate %.0f samples/s, "
                "link %.3g Gb/s (0 = from calibration/defaults)\n",
                r.job.nodes, r.job.trainers_per_node, static_cast<unsigned long long>(r.job.samples),
                static_cast<unsigned long long>(r.job.median_sample_bytes), r.fitted_trainer_samples_per_s,
                r.fitted_link_gbps);
    std::printf("%-22s %12s %8s %8s %8s %8s\n", "", "samples/s", "stall", "local", "peer", "storage");
    auto row = [](const std::string& name, const shardmix::sim::WhatifFigures& f) {
      std::printf("%-22s %12.0f %8.3f %8.3f %8.3f %8.3f\n", name.c_str(), f.samples_per_s, f.stall_fraction,
                  f.tier_local, f.tier_peer, f.tier_storage);
    };
    row(fmt::format("measured ({} nodes)", r.job.nodes), r.measured);
    row("simulated as measured", r.reproduced);
    row(fmt::format("predicted ({} nodes)", r.predicted_nodes), r.predicted);
    if (r.reproduced.samples_per_s > 0) {
      std::printf("model reproduces the measured rate to %.2fx\n", r.reproduced.samples_per_s / r.measured.samples_per_s);
    }
  }
  std::printf("%s\n", shardmix::sim::to_json(r).c_str());
  return r.reproduced_exactly_once && r.predicted_exactly_once ? 0 : 1;
}
