// Telemetry: what each trainer's epoch looked like, summed per node, and per epoch for the
// whole job on rank 0.
//
//  - TrainerEpochRecord: one trainer's finished pass over an epoch (the daemon's EpochStats
//    plus the stall time the trainer reported in its Releases and the pass's wall-clock
//    span). Made on the client-service thread; trivially copyable, so a daemon sends it to
//    rank 0 as bytes (MPI point-to-point on the main thread; docs/decisions/0014).
//  - NodeTelemetry: a node's counters since start (Prometheus text: the textfile for
//    node_exporter and the GetStats reply) and the queue of records not yet sent to rank 0.
//  - JobAggregator: rank 0's merge of every trainer's record of an epoch into one
//    JobEpochStats, written as one JSON line of the stats file when all trainers reported.
//
// Thread-safety: NodeTelemetry is thread-safe (one mutex guards everything). JobAggregator
// and JobEpochStats are not (rank 0's main thread only).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <set>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/checkpoint_node.h"
#include "common/peer_monitor.h"
#include "proto/wire.h"

namespace shardmix {

// A node's model checkpoint figures at one moment (all 0 without checkpoint.dir).
struct NodeCheckpointFigures {
  std::uint64_t ram_bytes = 0, waiting_bytes = 0;  // gauges
  std::uint64_t drained_bytes = 0, drain_us = 0, saves = 0, save_us = 0;  // totals so far
  // The checkpoint pool's (decision 0068), so that a save slowed by fresh pages shows as an
  // overflow where its time in save shows, rather than only in the daemon log.
  std::uint64_t pool_in_use_bytes = 0, pool_capacity_bytes = 0;  // gauges
  // Pages the prefault allocated so far: a gauge that grows to the capacity, as load bytes
  // do (0 without checkpoint.prefault).
  std::uint64_t pool_prefaulted_bytes = 0;
  // Totals so far: versions placed in the pool's reused pages, and those that found too few
  // free chunks and went into fresh pages (overflows / (buffers + overflows): the share of
  // checkpoints that paid for new pages).
  std::uint64_t pool_buffers = 0, pool_overflows = 0, pool_overflow_bytes = 0;
};

struct TrainerEpochRecord {
  std::uint32_t node = 0;
  std::uint32_t trainer_rank = 0;
  proto::EpochStats stats;         // as sent in the trainer's EpochEnd
  std::uint64_t stall_us = 0;      // sum of the trainer's Release.wait_us for this pass
  std::uint64_t released_batches = 0;
  std::uint64_t node_errors_total = 0;  // the node's error count when this record was made
  NodeCheckpointFigures node_checkpoints;  // and its checkpoint figures
  double t_start = 0;  // system clock, seconds since 1970: StartEpoch received
  double t_end = 0;    // ... last batch released (or the pass ended otherwise)
};
static_assert(std::is_trivially_copyable_v<TrainerEpochRecord>);

// One epoch of the whole job (a line of the stats file).
struct JobEpochStats {
  std::uint64_t epoch = 0;
  bool complete = false;          // every trainer reported this epoch
  std::uint32_t nodes = 0;
  std::uint32_t trainers = 0;     // expected
  std::uint32_t trainers_reporting = 0;
  double t_start = 0, t_end = 0, seconds = 0;  // earliest start .. latest end, over all trainers
  std::uint64_t batches = 0, samples = 0, bytes = 0;
  std::uint64_t local_samples = 0, peer_samples = 0, storage_samples = 0, peer_bytes = 0;
  double samples_per_second = 0, gb_per_second = 0;
  double stall_seconds = 0;       // summed over trainers
  double stall_seconds_max = 0;   // the most-stalled trainer
  double stall_fraction = 0;      // stall_seconds / (seconds x trainers_reporting)
  double fetch_wait_seconds = 0;  // daemons' wait on fabric reads, summed
  double exchange_fraction = 0;   // Q of the epoch (the same on every trainer)
  std::uint32_t window = 0;
  std::uint64_t substituted_samples = 0;
  // Samples whose bytes could not be read and were skipped (dataset.strict = false): part
  // of skipped_samples below.
  std::uint64_t unreadable_samples = 0;
  std::uint64_t batches_scored = 0;
  double label_entropy_mean = 0;  // mean over every scored batch of every trainer (NaN: none)
  double label_entropy_p5_min = 0;  // the lowest per-trainer 5th percentile (NaN: none)
  double affinity = 0;            // sample-weighted mean of the trainers' affinity (NaN: first epoch)
  std::uint64_t errors_total = 0; // error frames sent to trainers so far, all nodes
  // Dataset samples not delivered (complete epochs): the leftovers of batch.drop_last plus
  // the invalid samples the scan left out of the catalog (damaged shard input).
  std::optional<std::uint64_t> skipped_samples;
  std::uint64_t invalid_samples = 0;  // of which left out by the scan (the same every epoch)
  // Model checkpoints: every node's latest figures (as its last record of this epoch
  // carried them), summed.
  NodeCheckpointFigures checkpoints;

  // One JSON object on one line (no trailing newline); NaN becomes null.
  std::string to_json() const;
  // One human line for the daemon log and shardmix-stat.
  std::string summary() const;

 private:
  std::string skipped_parts() const;  // " (of which N invalid ..., M unreadable ...)" or ""
};

// The first line of a job's stats file: what the job was, so that shardmix-whatif
// (docs/simulator.md) can rebuild it in the simulator. `config` holds the keys that shape
// the data path as "section.key" -> value text that load_config reads back (--set).
struct JobRecord {
  std::uint32_t nodes = 0;
  std::uint32_t trainers_per_node = 0;
  std::uint64_t samples = 0;          // valid samples in the catalog
  std::uint64_t bytes = 0;            // their total bytes
  std::uint64_t median_sample_bytes = 0;
  double mean_sample_bytes = 0;
  double ln_size_sigma = 0;           // standard deviation of ln(sample bytes)
  std::uint64_t classes = 0;
  std::string provider;               // the fabric provider the job ran on
  std::vector<std::pair<std::string, std::string>> config;

  // {"job": {...}} on one line (no trailing newline).
  std::string to_json() const;
};

// Fills the dataset figures of a JobRecord from the catalog's sample sizes (O(N)).
void set_dataset_figures(JobRecord& record, const std::vector<std::uint64_t>& sizes);

class JobAggregator {
 public:
  // dataset_samples: the catalog's (valid) samples; invalid_samples: what the scan left out.
  JobAggregator(std::uint32_t nodes, std::uint32_t trainers, std::uint64_t dataset_samples,
                std::uint64_t invalid_samples = 0)
      : nodes_(nodes), trainers_(trainers), dataset_samples_(dataset_samples), invalid_samples_(invalid_samples) {}

  // A trainer's record (the latest one wins if a trainer ran an epoch twice before it completed).
  void add(const TrainerEpochRecord& record);
  // Epochs every trainer has reported, in epoch order, removed from the aggregator.
  std::vector<JobEpochStats> take_complete();
  // Whatever is left (incomplete epochs), for the end of the job.
  std::vector<JobEpochStats> flush();

 private:
  JobEpochStats merge(std::uint64_t epoch, const std::map<std::uint32_t, TrainerEpochRecord>& records) const;

  std::uint32_t nodes_;
  std::uint32_t trainers_;
  std::uint64_t dataset_samples_;
  std::uint64_t invalid_samples_;
  std::map<std::uint64_t, std::map<std::uint32_t, TrainerEpochRecord>> pending_;  // epoch -> rank -> record
  std::map<std::uint32_t, std::uint64_t> node_errors_;  // latest cumulative error count per node
  std::map<std::uint32_t, NodeCheckpointFigures> node_checkpoints_;  // latest per node (most saves and drained bytes)
};

// What a node knows about itself, for the Prometheus text.
struct NodeInfo {
  std::uint32_t node = 0;
  std::uint32_t nodes = 0;
  std::uint32_t trainers_per_node = 0;
  std::string provider;
  std::string host;
  std::uint64_t dataset_samples = 0;   // valid samples in the catalog (the same on every node)
  std::uint64_t invalid_samples = 0;   // left out by the scan: damaged shard input
};

class NodeTelemetry {
 public:
  void set_info(NodeInfo info);
  // Load progress (the loader's figures so far) and its end.
  void set_load(std::uint64_t samples, std::uint64_t bytes, std::uint64_t total_samples, std::uint64_t total_bytes,
                double seconds, bool done);
  void set_serving(bool serving);
  void trainer_connected();
  void trainer_disconnected();
  void error_sent();
  std::uint64_t errors_total() const;
  // Degraded mode (fault.peer_death = degrade): a peer daemon declared dead whose samples
  // this node now reads from storage, and the counter schedulers add to for each sample
  // read from storage instead of a dead or failing peer.
  void peer_degraded(std::uint32_t rank);
  std::uint64_t degraded_peers() const;
  std::atomic<std::uint64_t>* rerouted_samples() { return &rerouted_samples_; }
  // A finished pass: counted here and queued for rank 0.
  void add_record(const TrainerEpochRecord& record);
  std::vector<TrainerEpochRecord> take_records();
  // Rank 0: the job's latest complete epoch, shown in its Prometheus text.
  void set_job_epoch(const JobEpochStats& job);
  // The most scheduler state (TrainerScheduler::metadata_bytes summed over this node's
  // trainers) seen at the sampling points (each trainer's mid-epoch batch and epoch end),
  // for node_metadata_bytes: the same figure the simulator reports.
  void note_scheduler_metadata_bytes(std::uint64_t bytes);
  std::uint64_t scheduler_metadata_bytes_max() const { return scheduler_metadata_max_.load(); }

  // Model checkpoints (checkpoint.dir): where prometheus_text() reads their figures; called
  // once before serving, from the daemon's thread. Unset: no checkpoint metrics.
  void set_checkpoint_stats(std::function<CheckpointNodeStats()> source);
  // The failure detector's figures (PeerMonitor::figures), the same way; unset: none shown.
  void set_failure_detector_figures(std::function<PeerMonitor::Figures()> source);
  NodeCheckpointFigures checkpoint_figures() const;

  // Prometheus text exposition format 0.0.4 (# HELP/# TYPE, one sample per line).
  std::string prometheus_text() const;

 private:
  mutable std::mutex mutex_;  // guards everything below
  NodeInfo info_;
  std::uint64_t load_samples_ = 0, load_bytes_ = 0, load_total_samples_ = 0, load_total_bytes_ = 0;
  double load_seconds_ = 0;
  bool load_done_ = false;
  bool serving_ = false;
  std::int64_t trainers_connected_ = 0;
  std::uint64_t errors_ = 0;
  std::set<std::uint32_t> degraded_peers_;
  std::atomic<std::uint64_t> rerouted_samples_{0};  // written by schedulers without the mutex
  std::atomic<std::uint64_t> scheduler_metadata_max_{0};  // written by the service thread, read at exit
  // Sums over every finished pass on this node.
  std::uint64_t passes_ = 0, batches_ = 0, samples_ = 0, bytes_ = 0, local_ = 0, peer_ = 0, storage_ = 0,
                peer_bytes_ = 0, substituted_ = 0, unreadable_ = 0, stall_us_ = 0, fetch_wait_us_ = 0;
  std::optional<TrainerEpochRecord> last_;  // latest record (quality figures of the last pass)
  std::optional<JobEpochStats> job_;
  std::vector<TrainerEpochRecord> queue_;
  std::function<CheckpointNodeStats()> checkpoint_stats_;
  std::function<PeerMonitor::Figures()> failure_detector_figures_;
};

// Seconds since 1970 on the system clock (comparable across NTP-synchronised nodes).
double wall_seconds_now();

}  // namespace shardmix
