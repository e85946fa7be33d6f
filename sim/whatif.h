// shardmix-whatif's engine: rebuild a finished job from its stats file (telemetry.stats_file:
// the job record, then one line per epoch), fit what the run reveals on top of a calibration
// file's [sim] figures, and simulate the job as it ran and as it would run with another node
// count or knob setting (docs/simulator.md "What-if").
// Thread-safety: free functions over values; no globals; run_whatif runs simulations on the
// calling thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace shardmix::sim {

// The first line of a stats file ({"job": {...}}, server/telemetry.h JobRecord).
struct StatsJob {
  std::uint32_t nodes = 0;
  std::uint32_t trainers_per_node = 0;
  std::uint64_t samples = 0;
  std::uint64_t bytes = 0;
  std::uint64_t median_sample_bytes = 0;
  double mean_sample_bytes = 0;
  double ln_size_sigma = 0;
  std::uint64_t classes = 0;
  std::string provider;
  std::vector<std::pair<std::string, std::string>> config;  // "section.key", value text
};

// The figures of one epoch line that whatif uses.
struct StatsEpoch {
  std::uint64_t epoch = 0;
  bool complete = false;
  std::uint32_t trainers_reporting = 0;
  double seconds = 0;
  std::uint64_t samples = 0;
  std::uint64_t local_samples = 0, peer_samples = 0, storage_samples = 0, peer_bytes = 0;
  double stall_seconds = 0;
  double fetch_wait_seconds = 0;
};

struct StatsFile {
  StatsJob job;
  std::vector<StatsEpoch> epochs;  // the epochs after the last job record, in file order
};

// Reads a stats file. Errors name the file and line (no job record, not JSON, a missing or
// mistyped field, no epochs).
Result<StatsFile> read_stats_file(const std::string& path);

// Reads a calibration file: TOML holding only a [sim] table whose keys are config keys
// (unknown keys and other sections are errors naming the key). Returns "sim.key=value"
// strings for load_config's --set list.
Result<std::vector<std::string>> read_calibration(const std::string& path);

// Throughput, stall and tiers of a measured or simulated run (epochs after the first).
struct WhatifFigures {
  double samples_per_s = 0;
  double stall_fraction = 0;
  double tier_local = 0, tier_peer = 0, tier_storage = 0;
  std::uint32_t epochs = 0;  // epochs the figures cover
};

struct WhatifOptions {
  std::string stats_path;
  std::string calibration_path;     // "" = the [sim] defaults
  std::uint32_t nodes = 0;          // 0 = the job's node count
  std::vector<std::string> sets;    // section.key=value for the changed run (and any sim.* figure)
  std::uint32_t epochs = 0;         // simulated epochs; 0 = the measured count, 2 to 4
};

struct WhatifResult {
  StatsJob job;
  WhatifFigures measured;           // from the stats file, epochs >= 1 (epoch 0 if it is the only one)
  double fitted_trainer_samples_per_s = 0;  // 0 = not fitted (kept the calibration's)
  double fitted_link_gbps = 0;              // 0 = not fitted
  std::vector<std::string> model_sets;      // the sim.* keys the simulations ran with (calibration + fit)
  WhatifFigures reproduced;         // the simulator on the measured configuration
  bool reproduced_exactly_once = false;
  std::uint32_t predicted_nodes = 0;
  std::vector<std::string> changes; // the user's --set list
  WhatifFigures predicted;          // the simulator on the changed configuration
  bool predicted_exactly_once = false;
};

Result<WhatifResult> run_whatif(const WhatifOptions& options);

// One JSON object on one line (shardmix-whatif --json).
std::string to_json(const WhatifResult& result);

}  // namespace shardmix::sim
