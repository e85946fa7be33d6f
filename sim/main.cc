// shardmix-sim: P simulated daemons with T trainers each in one process (docs/simulator.md).
//   shardmix-sim --nodes P --trainers-per-node T --samples N --median-kib K --epochs E
//                [--config FILE] [--set section.key=value ...] [--json]
// The last line of stdout is one JSON object with the results (always; --json prints only it).
// Exit status: 0 when the exactly-once audit passed, 1 when it did not (or the run stalled or
// a trainer failed), 2 for bad options.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/command_line.h"
#include "common/config.h"
#include "sim/simulator.h"

int main(int argc, char** argv) {
  CLI::App app{"shardmix-sim: the ShardMix core with modelled transports, 1 to 16,384 nodes"};
  shardmix::sim::SimOptions options;
  std::string config_file;
  std::vector<std::string> sets;
  bool json_only = false;
  app.add_option("--nodes", options.nodes, "Simulated daemons (P)")->required();
  app.add_option("--trainers-per-node", options.trainers_per_node, "Trainers per daemon (T)")->required();
  app.add_option("--samples", options.samples, "Samples in the synthetic dataset (N)")->required();
  app.add_option("--median-kib", options.median_kib, "Median sample size in KiB (lognormal, sigma sim.size_sigma)")
      ->required();
  app.add_option("--epochs", options.epochs, "Epochs to simulate (E)")->required();
  app.add_option("-c,--config", config_file, "TOML config file; models under [sim] (docs/configuration.md)");
  app.add_option("--set", sets, "Override a key: --set section.key=value (repeatable)");
  app.add_flag("--json", json_only, "Print only the JSON result line");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  auto env = shardmix::environment_map();
  // The dataset is synthetic; dataset.path is required by the loader but unused here.
  env.emplace("SHARDMIX_DATASET_PATH", "(synthetic)");
  sets.push_back(fmt::format("service.trainers_per_node={}", options.trainers_per_node));
  auto config = shardmix::load_config(config_file, env, sets);
  if (!config.ok()) {
    std::fprintf(stderr, "shardmix-sim: %s\n", config.status().to_string().c_str());
    return 2;
  }
  options.config = *config;
  auto result = shardmix::sim::run_simulation(options);
  if (!result.ok()) {
    std::fprintf(stderr, "shardmix-sim: %s\n", result.status().to_string().c_str());
    return 2;
  }
  for (const std::string& problem : result->audit_errors) std::fprintf(stderr, "shardmix-sim: audit: %s\n", problem.c_str());
  if (!result->error.empty()) std::fprintf(stderr, "shardmix-sim: %s\n", result->error.c_str());
  if (!json_only) {
    std::printf("%u nodes x %u trainers, %llu samples, %zu epochs: exactly_once %s, wall %.2f s, peak RSS %.1f MiB\n",
                result->nodes, result->trainers_per_node, static_cast<unsigned long long>(result->samples),
                result->epochs.size(), result->exactly_once ? "true" : "false", result->wall_s,
                static_cast<double>(result->peak_rss_bytes) / (1 << 20));
    for (const auto& e : result->epochs) {
      std::printf("  epoch %llu: %.0f samples/s, stall %.3f, local/peer/storage %.3f/%.3f/%.3f, label entropy %.3f\n",
                  static_cast<unsigned long long>(e.epoch), e.samples_per_s, e.stall_fraction, e.tier_local,
                  e.tier_peer, e.tier_storage, e.label_entropy_mean);
    }
  }
  std::printf("%s\n", shardmix::sim::to_json(*result).c_str());
  return result->exactly_once ? 0 : 1;
}
