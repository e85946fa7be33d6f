// shardmix-sim's engine: P simulated daemons with T trainers each, in one process, driving
// the core the daemon runs (Catalog, Placement, EpochPlanner, TrainerScheduler,
// StagingAllocator) through modelled transports. docs/simulator.md says what is modelled
// and what is real; docs/decisions/0041 says why.
//
// One discrete-event loop ordered by simulated time (ties in posting order): every peer or
// storage read group the schedulers post completes as an event at its modelled time (per
// node link bandwidth and latency, storage bandwidth and IOPS, config section [sim]); the
// trainers step in lockstep like DDP; every delivered sample goes through an exactly-once
// audit per epoch.
// Thread-safety: run_simulation is self-contained (no globals) and runs on the calling
// thread; two simulations may run on two threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/metadata_footprint.h"
#include "common/status.h"
#include "proto/wire.h"

namespace shardmix::sim {

struct SimOptions {
  std::uint32_t nodes = 1;
  std::uint32_t trainers_per_node = 1;
  std::uint64_t samples = 0;
  double median_kib = 100.0;
  std::uint32_t epochs = 1;
  Config config;  // batch, shuffle, service, cache, fault and sim sections are read
};

// Test hooks: prove the audit can fail.
struct SimHooks {
  // Sees (and may change) every batch a trainer (global rank) receives, before the audit.
  std::function<void(std::uint32_t trainer, proto::BatchFrame& frame)> tamper_frame;
};

struct SimEpochResult {
  std::uint64_t epoch = 0;
  double sim_seconds = 0;        // simulated time from the epoch's first to its last step
  std::uint64_t samples = 0;     // delivered to the trainers alive at its end
  double samples_per_s = 0;
  double stall_fraction = 0;     // mean over trainers alive at its end of stall / epoch time
  double tier_local = 0;
  double tier_peer = 0;
  double tier_storage = 0;
  double label_entropy_mean = 0;  // mean over those trainers of the scheduler's own figure
  std::uint32_t trainers = 0;     // trainers alive at its end
};

struct SimResult {
  std::uint32_t nodes = 0;
  std::uint32_t trainers_per_node = 0;
  std::uint64_t samples = 0;
  double median_kib = 0;
  std::string placement;
  bool exactly_once = false;
  std::vector<std::string> audit_errors;  // the first problems found (sample, epoch, trainer)
  std::string error;                      // a scheduler error or a stalled run, else empty
  std::uint64_t metadata_bytes_per_node_max = 0;
  NodeMetadataBytes metadata_breakdown;   // of the node with the maximum
  double plan_cpu_s_per_epoch_per_node_max = 0;
  double startup_s = 0;                   // modelled + measured, below
  double startup_modelled_s = 0;          // max over nodes: scan + catalog allgather + load
  double setup_wall_s = 0;                // measured: dataset, placement, planner, schedulers
  std::uint64_t peak_rss_bytes = 0;
  double wall_s = 0;
  double sim_seconds = 0;
  std::uint64_t events = 0;
  std::vector<SimEpochResult> epochs;
  // Fault injection (sim.fault_node).
  bool fault = false;
  std::int64_t fault_node = -1;
  double fault_time_s = 0;
  double fault_detect_s = 0;              // fault_time_s + fault.peer_timeout (modelled)
  std::uint64_t rerouted_samples = 0;     // read from storage instead of the dead node
};

// Runs the whole simulation. An error only for bad options; a failed audit or a stalled
// run is a result (exactly_once false, audit_errors / error say why).
Result<SimResult> run_simulation(const SimOptions& options, const SimHooks& hooks = {});

// One JSON object on one line (the contract of shardmix-sim --json).
std::string to_json(const SimResult& result);

}  // namespace shardmix::sim
