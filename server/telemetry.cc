#include "server/telemetry.h"

#include "common/json_text.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include <fmt/format.h>

namespace shardmix {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  return fmt::format("{:.6g}", x);
}

std::string prom_number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  return fmt::format("{:.9g}", x);
}

// Escapes a Prometheus label value (backslash, double quote, newline).
std::string prom_label(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

class PromWriter {
 public:
  explicit PromWriter(std::string labels) : labels_(std::move(labels)) {}
  void metric(std::string_view name, std::string_view type, std::string_view help, double value,
              std::string_view extra_labels = {}) {
    header(name, type, help);
    sample(name, value, extra_labels);
  }
  void header(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(std::string_view name, double value, std::string_view extra_labels = {}) {
    std::string labels = labels_;
    if (!extra_labels.empty()) {
      if (!labels.empty()) labels += ',';
      labels.append(extra_labels);
    }
    out_ += fmt::format("{}{{{}}} {}\n", name, labels, prom_number(value));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string labels_;
  std::string out_;
};

}  // namespace

double wall_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------- JobEpochStats

void NodeTelemetry::note_scheduler_metadata_bytes(std::uint64_t bytes) {
  std::uint64_t seen = scheduler_metadata_max_.load();
  while (bytes > seen && !scheduler_metadata_max_.compare_exchange_weak(seen, bytes)) {
  }
}

std::string JobEpochStats::to_json() const {
  std::string s = "{";
  auto field = [&](std::string_view name, const std::string& value) {
    if (s.size() > 1) s += ", ";
    s += fmt::format("\"{}\": {}", name, value);
  };
  auto u = [](std::uint64_t x) { return std::to_string(x); };
  field("epoch", u(epoch));
  field("complete", complete ? "true" : "false");
  field("nodes", u(nodes));
  field("trainers", u(trainers));
  field("trainers_reporting", u(trainers_reporting));
  field("t_start", fmt::format("{:.6f}", t_start));
  field("t_end", fmt::format("{:.6f}", t_end));
  field("seconds", json_number(seconds));
  field("batches", u(batches));
  field("samples", u(samples));
  field("bytes", u(bytes));
  field("samples_per_second", json_number(samples_per_second));
  field("gb_per_second", json_number(gb_per_second));
  field("stall_seconds", json_number(stall_seconds));
  field("stall_seconds_max", json_number(stall_seconds_max));
  field("stall_fraction", json_number(stall_fraction));
  field("fetch_wait_seconds", json_number(fetch_wait_seconds));
  field("local_samples", u(local_samples));
  field("peer_samples", u(peer_samples));
  field("storage_samples", u(storage_samples));
  field("peer_bytes", u(peer_bytes));
  const double n = samples > 0 ? static_cast<double>(samples) : kNaN;
  field("tier_local", json_number(local_samples / n));
  field("tier_peer", json_number(peer_samples / n));
  field("tier_storage", json_number(storage_samples / n));
  field("exchange_fraction", json_number(exchange_fraction));
  field("window", u(window));
  field("substituted_samples", u(substituted_samples));
  field("unreadable_samples", u(unreadable_samples));
  field("batches_scored", u(batches_scored));
  field("label_entropy_mean", json_number(label_entropy_mean));
  field("label_entropy_p5_min", json_number(label_entropy_p5_min));
  field("affinity", json_number(affinity));
  field("errors_total", u(errors_total));
  field("skipped_samples", skipped_samples ? u(*skipped_samples) : "null");
  field("invalid_samples", u(invalid_samples));
  field("checkpoint_ram_bytes", u(checkpoints.ram_bytes));
  field("checkpoint_waiting_bytes", u(checkpoints.waiting_bytes));
  field("checkpoint_drained_bytes", u(checkpoints.drained_bytes));
  field("checkpoint_drain_seconds", json_number(checkpoints.drain_us / 1e6));
  field("checkpoint_saves", u(checkpoints.saves));
  field("checkpoint_save_seconds", json_number(checkpoints.save_us / 1e6));
  field("checkpoint_pool_in_use_bytes", u(checkpoints.pool_in_use_bytes));
  field("checkpoint_pool_capacity_bytes", u(checkpoints.pool_capacity_bytes));
  field("checkpoint_pool_prefaulted_bytes", u(checkpoints.pool_prefaulted_bytes));
  field("checkpoint_pool_buffers", u(checkpoints.pool_buffers));
  field("checkpoint_pool_overflows", u(checkpoints.pool_overflows));
  field("checkpoint_pool_overflow_bytes", u(checkpoints.pool_overflow_bytes));
  return s + "}";
}

std::string JobRecord::to_json() const {
  std::vector<std::string> cfg;
  for (const auto& [key, value] : config) cfg.push_back(fmt::format("{}: {}", json_quote(key), json_quote(value)));
  return fmt::format(
      "{{\"job\": {{\"version\": 1, \"nodes\": {}, \"trainers_per_node\": {}, \"samples\": {}, \"bytes\": {}, "
      "\"median_sample_bytes\": {}, \"mean_sample_bytes\": {}, \"ln_size_sigma\": {}, \"classes\": {}, "
      "\"provider\": {}, \"config\": {{{}}}}}}}",
      nodes, trainers_per_node, samples, bytes, median_sample_bytes, json_number(mean_sample_bytes),
      json_number(ln_size_sigma), classes, json_quote(provider), fmt::join(cfg, ", "));
}

void set_dataset_figures(JobRecord& record, const std::vector<std::uint64_t>& sizes) {
  record.samples = sizes.size();
  record.bytes = 0;
  double sum_ln = 0, sum_ln2 = 0;
  for (std::uint64_t b : sizes) {
    record.bytes += b;
    const double l = std::log(static_cast<double>(std::max<std::uint64_t>(b, 1)));
    sum_ln += l;
    sum_ln2 += l * l;
  }
  if (sizes.empty()) return;
  const double n = static_cast<double>(sizes.size());
  record.mean_sample_bytes = static_cast<double>(record.bytes) / n;
  const double mean_ln = sum_ln / n;
  record.ln_size_sigma = std::sqrt(std::max(0.0, sum_ln2 / n - mean_ln * mean_ln));
  std::vector<std::uint64_t> copy = sizes;
  std::nth_element(copy.begin(), copy.begin() + copy.size() / 2, copy.end());
  record.median_sample_bytes = copy[copy.size() / 2];
}

std::string JobEpochStats::skipped_parts() const {
  std::vector<std::string> parts;
  if (invalid_samples > 0) parts.push_back(fmt::format("{} invalid in the dataset", invalid_samples));
  if (unreadable_samples > 0) parts.push_back(fmt::format("{} unreadable this epoch", unreadable_samples));
  return parts.empty() ? std::string() : fmt::format(" (of which {})", fmt::join(parts, ", "));
}

std::string JobEpochStats::summary() const {
  const double n = samples > 0 ? static_cast<double>(samples) : kNaN;
  return fmt::format(
      "epoch {}{}: {} samples, {:.3f} GB in {:.2f} s = {:.0f} samples/s, {:.3f} GB/s; stall {:.2f} s summed over "
      "{} trainers ({:.1f}% of their time, worst {:.2f} s); local {:.3f} peer {:.3f} storage {:.3f}; Q {:.2f}; "
      "label entropy mean {:.3f} p5(min) {:.3f}; affinity {:.3f}; errors {}; skipped {}{}",
      epoch, complete ? "" : fmt::format(" (incomplete: {} of {} trainers)", trainers_reporting, trainers), samples,
      bytes / 1e9, seconds, samples_per_second, gb_per_second, stall_seconds, trainers_reporting,
      100 * stall_fraction, stall_seconds_max, local_samples / n, peer_samples / n, storage_samples / n,
      exchange_fraction, label_entropy_mean, label_entropy_p5_min, affinity, errors_total,
      skipped_samples ? std::to_string(*skipped_samples) : std::string("?"),
      skipped_parts());
}

// ---------------------------------------------------------------- JobAggregator

void JobAggregator::add(const TrainerEpochRecord& record) {
  pending_[record.stats.epoch][record.trainer_rank] = record;
  auto& errors = node_errors_[record.node];
  errors = std::max(errors, record.node_errors_total);
  // Records of one node may arrive out of order; its totals only grow.
  NodeCheckpointFigures& latest = node_checkpoints_[record.node];
  const NodeCheckpointFigures& now = record.node_checkpoints;
  if (now.saves + now.drained_bytes >= latest.saves + latest.drained_bytes) latest = now;
}

JobEpochStats JobAggregator::merge(std::uint64_t epoch,
                                   const std::map<std::uint32_t, TrainerEpochRecord>& records) const {
  JobEpochStats j;
  j.epoch = epoch;
  j.nodes = nodes_;
  j.trainers = trainers_;
  j.trainers_reporting = static_cast<std::uint32_t>(records.size());
  j.complete = j.trainers_reporting >= trainers_;
  j.t_start = std::numeric_limits<double>::infinity();
  j.t_end = -std::numeric_limits<double>::infinity();
  double entropy_weighted = 0, affinity_weighted = 0;
  std::uint64_t affinity_samples = 0;
  j.label_entropy_p5_min = kNaN;
  for (const auto& [rank, r] : records) {
    const proto::EpochStats& s = r.stats;
    j.t_start = std::min(j.t_start, r.t_start);
    j.t_end = std::max(j.t_end, r.t_end);
    j.batches += s.batches;
    j.samples += s.samples;
    j.bytes += s.bytes;
    j.local_samples += s.local_samples;
    j.peer_samples += s.peer_samples;
    j.storage_samples += s.storage_samples;
    j.peer_bytes += s.peer_bytes;
    j.fetch_wait_seconds += s.fetch_wait_us / 1e6;
    j.substituted_samples += s.substituted_samples;
    j.unreadable_samples += s.unreadable_samples;
    j.exchange_fraction = s.exchange_fraction;
    j.window = s.window;
    const double stall = r.stall_us / 1e6;
    j.stall_seconds += stall;
    j.stall_seconds_max = std::max(j.stall_seconds_max, stall);
    if (s.batches_scored > 0 && std::isfinite(s.label_entropy_mean)) {
      j.batches_scored += s.batches_scored;
      entropy_weighted += s.label_entropy_mean * static_cast<double>(s.batches_scored);
      if (std::isfinite(s.label_entropy_p5) &&
          (std::isnan(j.label_entropy_p5_min) || s.label_entropy_p5 < j.label_entropy_p5_min)) {
        j.label_entropy_p5_min = s.label_entropy_p5;
      }
    }
    if (std::isfinite(s.affinity)) {
      affinity_weighted += s.affinity * static_cast<double>(s.samples);
      affinity_samples += s.samples;
    }
  }
  if (records.empty()) j.t_start = j.t_end = 0;
  j.seconds = std::max(0.0, j.t_end - j.t_start);
  j.samples_per_second = j.seconds > 0 ? j.samples / j.seconds : kNaN;
  j.gb_per_second = j.seconds > 0 ? j.bytes / j.seconds / 1e9 : kNaN;
  j.stall_fraction = j.seconds > 0 && j.trainers_reporting > 0 ? j.stall_seconds / (j.seconds * j.trainers_reporting)
                                                                : kNaN;
  j.label_entropy_mean = j.batches_scored > 0 ? entropy_weighted / static_cast<double>(j.batches_scored) : kNaN;
  j.affinity = affinity_samples > 0 ? affinity_weighted / static_cast<double>(affinity_samples) : kNaN;
  for (const auto& [node, errors] : node_errors_) j.errors_total += errors;
  for (const auto& [node, c] : node_checkpoints_) {
    j.checkpoints.ram_bytes += c.ram_bytes;
    j.checkpoints.waiting_bytes += c.waiting_bytes;
    j.checkpoints.drained_bytes += c.drained_bytes;
    j.checkpoints.drain_us += c.drain_us;
    j.checkpoints.saves += c.saves;
    j.checkpoints.save_us += c.save_us;
    j.checkpoints.pool_in_use_bytes += c.pool_in_use_bytes;
    j.checkpoints.pool_capacity_bytes += c.pool_capacity_bytes;
    j.checkpoints.pool_prefaulted_bytes += c.pool_prefaulted_bytes;
    j.checkpoints.pool_buffers += c.pool_buffers;
    j.checkpoints.pool_overflows += c.pool_overflows;
    j.checkpoints.pool_overflow_bytes += c.pool_overflow_bytes;
  }
  j.invalid_samples = invalid_samples_;
  if (j.complete && dataset_samples_ >= j.samples) j.skipped_samples = dataset_samples_ - j.samples + invalid_samples_;
  return j;
}

std::vector<JobEpochStats> JobAggregator::take_complete() {
  std::vector<JobEpochStats> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.size() >= trainers_) {
      out.push_back(merge(it->first, it->second));
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<JobEpochStats> JobAggregator::flush() {
  std::vector<JobEpochStats> out;
  for (const auto& [epoch, records] : pending_) out.push_back(merge(epoch, records));
  pending_.clear();
  return out;
}

// ---------------------------------------------------------------- NodeTelemetry

void NodeTelemetry::set_info(NodeInfo info) {
  std::lock_guard lock(mutex_);
  info_ = std::move(info);
}

void NodeTelemetry::set_load(std::uint64_t samples, std::uint64_t bytes, std::uint64_t total_samples,
                             std::uint64_t total_bytes, double seconds, bool done) {
  std::lock_guard lock(mutex_);
  load_samples_ = samples;
  load_bytes_ = bytes;
  load_total_samples_ = total_samples;
  load_total_bytes_ = total_bytes;
  load_seconds_ = seconds;
  load_done_ = done;
}

void NodeTelemetry::set_serving(bool serving) {
  std::lock_guard lock(mutex_);
  serving_ = serving;
}

void NodeTelemetry::trainer_connected() {
  std::lock_guard lock(mutex_);
  ++trainers_connected_;
}

void NodeTelemetry::trainer_disconnected() {
  std::lock_guard lock(mutex_);
  --trainers_connected_;
}

void NodeTelemetry::error_sent() {
  std::lock_guard lock(mutex_);
  ++errors_;
}

void NodeTelemetry::peer_degraded(std::uint32_t rank) {
  std::lock_guard lock(mutex_);
  degraded_peers_.insert(rank);
}

std::uint64_t NodeTelemetry::degraded_peers() const {
  std::lock_guard lock(mutex_);
  return degraded_peers_.size();
}

std::uint64_t NodeTelemetry::errors_total() const {
  std::lock_guard lock(mutex_);
  return errors_;
}

void NodeTelemetry::add_record(const TrainerEpochRecord& record) {
  std::lock_guard lock(mutex_);
  const proto::EpochStats& s = record.stats;
  ++passes_;
  batches_ += s.batches;
  samples_ += s.samples;
  bytes_ += s.bytes;
  local_ += s.local_samples;
  peer_ += s.peer_samples;
  storage_ += s.storage_samples;
  peer_bytes_ += s.peer_bytes;
  substituted_ += s.substituted_samples;
  unreadable_ += s.unreadable_samples;
  stall_us_ += record.stall_us;
  fetch_wait_us_ += s.fetch_wait_us;
  last_ = record;
  queue_.push_back(record);
}

std::vector<TrainerEpochRecord> NodeTelemetry::take_records() {
  std::lock_guard lock(mutex_);
  return std::exchange(queue_, {});
}

void NodeTelemetry::set_job_epoch(const JobEpochStats& job) {
  std::lock_guard lock(mutex_);
  job_ = job;
}

void NodeTelemetry::set_checkpoint_stats(std::function<CheckpointNodeStats()> source) {
  std::lock_guard lock(mutex_);
  checkpoint_stats_ = std::move(source);
}

void NodeTelemetry::set_failure_detector_figures(std::function<PeerMonitor::Figures()> source) {
  std::lock_guard lock(mutex_);
  failure_detector_figures_ = std::move(source);
}

NodeCheckpointFigures NodeTelemetry::checkpoint_figures() const {
  std::function<CheckpointNodeStats()> source;
  {
    std::lock_guard lock(mutex_);
    source = checkpoint_stats_;
  }
  if (!source) return {};
  const CheckpointNodeStats c = source();
  NodeCheckpointFigures f;
  f.ram_bytes = c.store.bytes_in_ram;
  f.waiting_bytes = c.store.bytes_waiting;
  f.drained_bytes = c.store.bytes_drained;
  f.drain_us = c.drain_busy_us;
  f.saves = c.saves;
  f.save_us = c.save_us;
  f.pool_in_use_bytes = c.pool.bytes_in_use;
  f.pool_capacity_bytes = c.pool.capacity_bytes;
  f.pool_prefaulted_bytes = c.pool.prefaulted_bytes;
  f.pool_buffers = c.pool.buffers;
  f.pool_overflows = c.pool.overflows;
  f.pool_overflow_bytes = c.pool.overflow_bytes;
  return f;
}

std::string NodeTelemetry::prometheus_text() const {
  std::lock_guard lock(mutex_);
  PromWriter w(fmt::format("node=\"{}\"", info_.node));
  w.metric("shardmix_info", "gauge", "Constant 1, with the daemon's layout as labels.", 1,
           fmt::format("nodes=\"{}\",trainers_per_node=\"{}\",provider=\"{}\",host=\"{}\"", info_.nodes,
                       info_.trainers_per_node, prom_label(info_.provider), prom_label(info_.host)));
  w.metric("shardmix_serving", "gauge", "1 while the daemon serves trainers, 0 while loading or after shutdown.",
           serving_ ? 1 : 0);
  w.metric("shardmix_dataset_samples", "gauge", "Valid samples in the dataset's catalog (delivered every epoch).",
           static_cast<double>(info_.dataset_samples));
  w.metric("shardmix_dataset_invalid_samples", "gauge",
           "Samples the scan left out as damaged (shard formats; see the daemon log for files and offsets).",
           static_cast<double>(info_.invalid_samples));
  w.metric("shardmix_load_samples", "gauge", "Samples loaded into this node's cache so far.",
           static_cast<double>(load_samples_));
  w.metric("shardmix_load_samples_target", "gauge", "Samples this node caches.",
           static_cast<double>(load_total_samples_));
  w.metric("shardmix_load_bytes", "gauge", "Bytes loaded into this node's cache so far.",
           static_cast<double>(load_bytes_));
  w.metric("shardmix_load_bytes_target", "gauge", "Bytes this node caches.", static_cast<double>(load_total_bytes_));
  w.metric("shardmix_load_seconds", "gauge", "Time spent loading (so far, or in total once done).", load_seconds_);
  w.metric("shardmix_trainers_connected", "gauge", "Trainers connected to this daemon.",
           static_cast<double>(trainers_connected_));
  w.metric("shardmix_trainer_epochs_total", "counter", "Trainer passes over an epoch finished on this node.",
           static_cast<double>(passes_));
  w.metric("shardmix_batches_total", "counter", "Batches delivered to trainers.", static_cast<double>(batches_));
  w.header("shardmix_samples_total", "counter", "Samples delivered to trainers, by where they came from.");
  w.sample("shardmix_samples_total", static_cast<double>(local_), "tier=\"local\"");
  w.sample("shardmix_samples_total", static_cast<double>(peer_), "tier=\"peer\"");
  w.sample("shardmix_samples_total", static_cast<double>(storage_), "tier=\"storage\"");
  w.metric("shardmix_bytes_total", "counter", "Sample bytes delivered to trainers.", static_cast<double>(bytes_));
  w.metric("shardmix_peer_bytes_total", "counter", "Delivered bytes read from peers' caches.",
           static_cast<double>(peer_bytes_));
  w.metric("shardmix_substituted_samples_total", "counter",
           "Samples delivered in another batch than planned (shuffle.window).", static_cast<double>(substituted_));
  w.metric("shardmix_unreadable_samples_total", "counter",
           "Samples skipped because their bytes could not be read from storage (dataset.strict = false).",
           static_cast<double>(unreadable_));
  w.metric("shardmix_trainer_stall_seconds_total", "counter",
           "Time trainers waited for batches (as they reported it), summed over trainers.", stall_us_ / 1e6);
  w.metric("shardmix_fetch_wait_seconds_total", "counter", "Time batches waited on peer reads in this daemon.",
           fetch_wait_us_ / 1e6);
  w.metric("shardmix_errors_total", "counter", "Error frames sent to trainers (failed reads, protocol errors).",
           static_cast<double>(errors_));
  w.metric("shardmix_degraded_peers", "gauge",
           "Peer daemons declared dead whose samples this node reads from storage (fault.peer_death = degrade).",
           static_cast<double>(degraded_peers_.size()));
  w.metric("shardmix_dead_peer_storage_samples_total", "counter",
           "Samples read from storage instead of a dead or failing peer daemon (degraded mode).",
           static_cast<double>(rerouted_samples_.load(std::memory_order_relaxed)));
  if (failure_detector_figures_) {
    const PeerMonitor::Figures f = failure_detector_figures_();
    w.metric("shardmix_peer_heartbeat_slowest_seconds", "gauge",
             "The slowest answer to a failure detector heartbeat so far (a peer is declared dead at "
             "fault.peer_timeout).",
             std::chrono::duration<double>(f.slowest_answer).count());
    w.metric("shardmix_failure_detector_longest_pause_seconds", "gauge",
             "The longest this daemon's failure detector went without running (its main thread held up).",
             std::chrono::duration<double>(f.longest_pause).count());
    w.metric("shardmix_failure_detector_pauses_total", "counter",
             "Gaps longer than a heartbeat interval between the failure detector's runs (charged one interval "
             "each, not in full, against the peers).",
             static_cast<double>(f.pauses));
  }
  if (checkpoint_stats_) {
    const CheckpointNodeStats c = checkpoint_stats_();
    w.metric("shardmix_checkpoint_ram_bytes", "gauge", "Model checkpoint bytes held in this daemon's RAM.",
             static_cast<double>(c.store.bytes_in_ram));
    w.metric("shardmix_checkpoint_waiting_bytes", "gauge",
             "Checkpoint bytes saved here and not yet durable in checkpoint.dir.",
             static_cast<double>(c.store.bytes_waiting));
    w.metric("shardmix_checkpoint_drained_bytes_total", "counter", "Checkpoint bytes made durable by this daemon.",
             static_cast<double>(c.store.bytes_drained));
    w.metric("shardmix_checkpoint_drain_seconds_total", "counter",
             "Time the drain spent writing checkpoint files (drained bytes / this = the drain rate).",
             c.drain_busy_us / 1e6);
    w.metric("shardmix_checkpoint_drain_failures_total", "counter", "Failed attempts to write a checkpoint file.",
             static_cast<double>(c.store.drain_failures));
    w.metric("shardmix_checkpoint_saves_total", "counter", "Checkpoint saves completed for trainers.",
             static_cast<double>(c.saves));
    w.metric("shardmix_checkpoint_save_seconds_total", "counter",
             "Time trainers' saves took, from the daemon receiving them to their reply, summed.", c.save_us / 1e6);
    w.metric("shardmix_checkpoint_saves_waiting_for_room", "gauge",
             "Saves waiting for checkpoint.capacity to free room (when_full = wait).",
             static_cast<double>(c.saves_waiting_for_room));
    // The pool (decision 0068): an overflow is a version (a save or a peer's replica) that
    // paid for fresh pages, the slow path the pool exists to avoid, so it is counted next to
    // the save times it may explain rather than only logged.
    w.metric("shardmix_checkpoint_pool_in_use_bytes", "gauge",
             "Checkpoint pool bytes held by versions now (whole chunks).", static_cast<double>(c.pool.bytes_in_use));
    w.metric("shardmix_checkpoint_pool_capacity_bytes", "gauge",
             "Checkpoint pool size: checkpoint.capacity in whole chunks, and a few spare chunks.",
             static_cast<double>(c.pool.capacity_bytes));
    w.metric("shardmix_checkpoint_pool_prefaulted_bytes", "gauge",
             "Checkpoint pool pages allocated ahead of use so far (all once done; 0 without checkpoint.prefault).",
             static_cast<double>(c.pool.prefaulted_bytes));
    w.metric("shardmix_checkpoint_pool_buffers_total", "counter",
             "Checkpoint buffers served from the pool's reused pages (saves, leases, replica landings).", static_cast<double>(c.pool.buffers));
    w.metric("shardmix_checkpoint_pool_overflows_total", "counter",
             "Checkpoint versions that found too few free pool chunks and went into fresh pages.",
             static_cast<double>(c.pool.overflows));
    w.metric("shardmix_checkpoint_pool_overflow_bytes_total", "counter",
             "Bytes of the checkpoint versions that overflowed the pool.", static_cast<double>(c.pool.overflow_bytes));
  }
  if (last_) {
    const proto::EpochStats& s = last_->stats;
    w.metric("shardmix_last_epoch", "gauge", "Epoch of the latest finished trainer pass on this node.",
             static_cast<double>(s.epoch));
    w.metric("shardmix_last_exchange_fraction", "gauge", "Q used in that pass.", s.exchange_fraction);
    w.metric("shardmix_last_label_entropy_mean", "gauge", "Mean micro-batch label entropy of that pass.",
             s.label_entropy_mean);
    w.metric("shardmix_last_label_entropy_p5", "gauge", "5th percentile micro-batch label entropy of that pass.",
             s.label_entropy_p5);
    w.metric("shardmix_last_affinity", "gauge", "Share of that pass's samples the trainer also got the epoch before.",
             s.affinity);
  }
  if (job_) {
    const JobEpochStats& j = *job_;
    w.metric("shardmix_job_epoch", "gauge", "Latest complete epoch of the whole job (rank 0 only).",
             static_cast<double>(j.epoch));
    w.metric("shardmix_job_samples_per_second", "gauge", "All trainers' samples/s in that epoch.",
             j.samples_per_second);
    w.metric("shardmix_job_bytes_per_second", "gauge", "All trainers' bytes/s in that epoch.", j.gb_per_second * 1e9);
    w.metric("shardmix_job_stall_fraction", "gauge", "Share of the trainers' time spent waiting in that epoch.",
             j.stall_fraction);
    w.metric("shardmix_job_label_entropy_mean", "gauge", "Mean micro-batch label entropy over all trainers.",
             j.label_entropy_mean);
    w.metric("shardmix_job_label_entropy_p5_min", "gauge", "Lowest per-trainer 5th percentile label entropy.",
             j.label_entropy_p5_min);
    w.metric("shardmix_job_affinity", "gauge", "Sample-weighted mean affinity over all trainers.", j.affinity);
  }
  return w.take();
}

}  // namespace shardmix
