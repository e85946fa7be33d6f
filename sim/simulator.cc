#include "sim/simulator.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <queue>

#include <fmt/format.h>

#include "common/catalog.h"
#include "common/epoch_plan.h"
#include "common/placement.h"
#include "common/sample_directory.h"
#include "common/rng.h"
#include "common/staging_allocator.h"
#include "common/trainer_scheduler.h"

namespace shardmix::sim {
namespace {

// Audit problems kept in the result (the count of problems is unbounded; the list is not).
constexpr std::size_t kMaxAuditErrors = 20;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The synthetic dataset: lognormal sizes (median `median_bytes`, sigma of ln size), labels
// uniform over `classes`, ids in label order like a scanned catalog.
Result<Catalog> synthetic_dataset(std::uint64_t n, double median_bytes, const SimConfig& sim) {
  std::vector<std::uint64_t> sizes(n);
  Rng size_rng = Rng::for_stream(sim.dataset_seed, {0x73697a6573ull});  // "sizes"
  for (std::uint64_t i = 0; i < n; ++i) {
    // Box-Muller; 1 - u keeps the logarithm finite.
    const double u1 = 1.0 - size_rng.uniform();
    const double u2 = size_rng.uniform();
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    sizes[i] = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(median_bytes * std::exp(sim.size_sigma * z))));
  }
  // Uniform labels, then in label order: draw each sample's class, keep only the counts.
  std::vector<std::uint64_t> per_class(sim.classes, 0);
  Rng label_rng = Rng::for_stream(sim.dataset_seed, {0x6c6162656c73ull});  // "labels"
  for (std::uint64_t i = 0; i < n; ++i) ++per_class[label_rng.below(sim.classes)];
  std::vector<std::int32_t> labels;
  labels.reserve(n);
  for (std::uint32_t c = 0; c < sim.classes; ++c) labels.insert(labels.end(), per_class[c], static_cast<std::int32_t>(c));
  return Catalog::synthetic(std::move(sizes), std::move(labels), sim.samples_per_shard);
}

std::uint64_t mix_id(SampleId id) {
  std::uint64_t state = id;
  return splitmix64_next(state);
}

class Simulation;

class SimPeerFetcher final : public PeerFetcher {
 public:
  SimPeerFetcher(Simulation& sim, std::uint32_t node) : sim_(sim), node_(node) {}
  void fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) override;

 private:
  Simulation& sim_;
  std::uint32_t node_;
};

class SimStorageFetcher final : public StorageFetcher {
 public:
  SimStorageFetcher(Simulation& sim, std::uint32_t node) : sim_(sim), node_(node) {}
  void fetch(std::vector<StorageRead> reads, std::function<void(const StorageOutcome&)> done) override;

 private:
  Simulation& sim_;
  std::uint32_t node_;
};

class SimSink final : public FrameSink {
 public:
  SimSink(Simulation& sim, std::uint32_t trainer) : sim_(sim), trainer_(trainer) {}
  void send_batch(const proto::BatchFrame& batch) override;
  void send_epoch_end(const proto::EpochStats& stats) override;
  void send_error(const Status& status) override;

 private:
  Simulation& sim_;
  std::uint32_t trainer_;
};

class Simulation {
 public:
  Simulation(const SimOptions& options, const SimHooks& hooks) : options_(options), hooks_(hooks), sim_(options.config.sim) {}

  Result<SimResult> run();

  // Modelled transports (called by the fetchers).
  void peer_fetch(std::uint32_t node, std::vector<PeerRead> reads, std::function<void(const Status&)> done);
  void storage_fetch(std::uint32_t node, std::vector<StorageRead> reads,
                     std::function<void(const StorageOutcome&)> done);
  // The trainers' side (called by the sinks).
  void on_batch(std::uint32_t trainer, const proto::BatchFrame& frame);
  void on_epoch_end(std::uint32_t trainer, const proto::EpochStats& stats);
  void on_error(std::uint32_t trainer, const Status& status);

 private:
  struct Event {
    double time;
    std::uint64_t seq;
    std::function<void()> fn;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };
  struct NodeModel {
    double link_bytes_per_s = 0;
    double ingress_free = 0;
    double egress_free = 0;
    double storage_free = 0;
    double service_free = 0;  // sim.service_us_per_sample: when the node's service CPU is next free
    bool alive = true;
  };
  struct TrainerState {
    std::shared_ptr<TrainerScheduler> scheduler;
    std::deque<double> ready;  // when each batch from the current step on arrived
    double compute_factor = 1.0;
    double stall_s = 0;        // this epoch
    bool alive = true;
    std::uint64_t delivered = 0;      // this epoch
    std::uint64_t fingerprint = 0;    // this epoch: sum of mix_id over delivered samples
    double label_entropy_mean = std::numeric_limits<double>::quiet_NaN();
  };

  void at(double time, std::function<void()> fn) { queue_.push(Event{time, next_seq_++, std::move(fn)}); }
  void audit_error(std::string message) {
    ++audit_problems_;
    if (result_.audit_errors.size() < kMaxAuditErrors) result_.audit_errors.push_back(std::move(message));
  }
  void try_step();
  void finish_step();
  void end_epoch();
  void start_epoch(std::uint64_t epoch);
  void kill_node(std::uint32_t node);
  void sample_metadata();
  bool dies_before(std::uint32_t owner, double time) const {
    return fault_ && owner == fault_node_ && time > sim_.fault_time_s;
  }

  const SimOptions& options_;
  const SimHooks& hooks_;
  const SimConfig& sim_;
  SimResult result_;

  Catalog catalog_;  // the dataset on storage (the truth the nodes' metadata describes)
  PlanShape shape_;
  // Global metadata (dataset.placement = balanced or sorted): every node's view is the
  // one placement_ and directories_[0] (a GlobalDirectory).
  Placement placement_;
  // Owner-side metadata (spread, decision 0055): each node holds shards_[k] and its own
  // ShardedDirectory; other shards are reached only through exchange_.
  bool sharded_ = false;
  Ownership ownership_;
  std::vector<OwnerShard> shards_;
  std::unique_ptr<InProcessExchange> exchange_;
  std::vector<std::unique_ptr<SampleDirectory>> directories_;  // one (global) or one per node (sharded)
  std::unique_ptr<EpochPlanner> planner_;
  std::vector<SchedulerContext> contexts_;
  std::vector<std::unique_ptr<SimPeerFetcher>> peer_fetchers_;
  std::vector<std::unique_ptr<SimStorageFetcher>> storage_fetchers_;
  std::vector<std::unique_ptr<SimSink>> sinks_;
  std::vector<NodeModel> nodes_;
  std::vector<TrainerState> trainers_;
  std::atomic<std::uint64_t> rerouted_{0};

  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  std::uint64_t next_seq_ = 0;
  double now_ = 0;
  bool done_ = false;

  // Fault model.
  bool fault_ = false;
  std::uint32_t fault_node_ = 0;
  double detect_time_ = 0;

  // Lockstep.
  std::uint64_t epoch_ = 0;
  std::uint64_t step_ = 0;
  std::uint32_t alive_trainers_ = 0;
  std::uint32_t ready_trainers_ = 0;  // alive trainers holding the current step's batch
  bool step_running_ = false;
  bool finishing_ = false;
  double step_end_ = 0;      // when the previous step ended
  double epoch_start_ = 0;

  // Audit of the current epoch.
  std::vector<std::uint64_t> seen_;
  std::uint64_t audit_problems_ = 0;
  std::uint64_t tier_counts_[3] = {0, 0, 0};

  // Plan CPU, [epoch][node], nanoseconds.
  std::vector<std::vector<std::uint64_t>> plan_cpu_ns_;
};

void SimPeerFetcher::fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) {
  sim_.peer_fetch(node_, std::move(reads), std::move(done));
}
void SimStorageFetcher::fetch(std::vector<StorageRead> reads, std::function<void(const StorageOutcome&)> done) {
  sim_.storage_fetch(node_, std::move(reads), std::move(done));
}
void SimSink::send_batch(const proto::BatchFrame& batch) { sim_.on_batch(trainer_, batch); }
void SimSink::send_epoch_end(const proto::EpochStats& stats) { sim_.on_epoch_end(trainer_, stats); }
void SimSink::send_error(const Status& status) { sim_.on_error(trainer_, status); }

void Simulation::peer_fetch(std::uint32_t node, std::vector<PeerRead> reads, std::function<void(const Status&)> done) {
  // The reader's link takes the group's bytes one after another (its ingress is shared by
  // its trainers), each owner's link sends its part (its egress is shared by every reader),
  // and the group completes when both have finished, plus one latency.
  NodeModel& reader = nodes_[node];
  std::uint64_t total = 0;
  double finish = now_;
  bool from_dead = false;
  for (std::size_t i = 0; i < reads.size();) {
    // Reads of one owner are contiguous in a group more often than not; charge runs.
    const std::uint32_t owner = reads[i].peer;
    std::uint64_t bytes = 0;
    for (; i < reads.size() && reads[i].peer == owner; ++i) bytes += reads[i].length;
    total += bytes;
    NodeModel& source = nodes_[owner];
    source.egress_free = std::max(now_, source.egress_free) + static_cast<double>(bytes) / source.link_bytes_per_s;
    finish = std::max(finish, source.egress_free);
    if (!source.alive || dies_before(owner, now_)) from_dead = true;
  }
  reader.ingress_free = std::max(now_, reader.ingress_free) + static_cast<double>(total) / reader.link_bytes_per_s;
  finish = std::max(finish, reader.ingress_free) + sim_.link_latency_us * 1e-6;
  bool fails = from_dead;
  if (!fails) {
    for (const PeerRead& r : reads) fails = fails || dies_before(r.peer, finish);
  }
  if (fails) {
    // A dead owner answers nothing: the read fails when the failure detector says so (the
    // modelled heartbeat timeout), or at once if it has already said so.
    const double when = std::max(finish, detect_time_);
    at(when, [done = std::move(done), when, node] {
      done(make_error(StatusCode::kUnavailable, "simulated peer read by node {} failed at {:.6f} s: owner is dead", node,
                      when));
    });
    return;
  }
  at(finish, [done = std::move(done)] { done(Status::ok_status()); });
}

void Simulation::storage_fetch(std::uint32_t node, std::vector<StorageRead> reads,
                               std::function<void(const StorageOutcome&)> done) {
  NodeModel& model = nodes_[node];
  std::uint64_t bytes = 0;
  for (const StorageRead& r : reads) bytes += r.length;
  const double service = std::max(static_cast<double>(bytes) / (sim_.storage_gbps * 1e9 / 8),
                                   static_cast<double>(reads.size()) / sim_.storage_iops);
  model.storage_free = std::max(now_, model.storage_free) + service;
  at(model.storage_free, [done = std::move(done)] { done(StorageOutcome{}); });
}

void Simulation::on_batch(std::uint32_t trainer, const proto::BatchFrame& sent) {
  TrainerState& t = trainers_[trainer];
  if (!t.alive) return;
  // A copy only for the test hook: at 100 M samples the copy per batch is measurable.
  std::optional<proto::BatchFrame> tampered;
  if (hooks_.tamper_frame) {
    tampered = sent;
    hooks_.tamper_frame(trainer, *tampered);
  }
  const proto::BatchFrame& frame = tampered ? *tampered : sent;
  if (frame.epoch != epoch_ || frame.batch != step_ + t.ready.size()) {
    audit_error(fmt::format("trainer {} received epoch {} batch {} while expecting epoch {} batch {}", trainer,
                            frame.epoch, frame.batch, epoch_, step_ + t.ready.size()));
  }
  for (const proto::SampleDescriptor& d : frame.samples) {
    if ((d.flags & proto::kSampleSkipped) != 0) continue;
    const SampleId id = d.sample_id;
    if (id >= catalog_.size()) {
      audit_error(fmt::format("epoch {}: trainer {} received sample {} beyond the dataset", epoch_, trainer, id));
      continue;
    }
    std::uint64_t& word = seen_[id / 64];
    const std::uint64_t bit = std::uint64_t{1} << (id % 64);
    if ((word & bit) != 0) {
      audit_error(fmt::format("epoch {}: sample {} delivered again (to trainer {}, batch {})", epoch_, id, trainer,
                              frame.batch));
    }
    word |= bit;
    ++t.delivered;
    t.fingerprint += mix_id(id);
    if (d.tier <= 2) ++tier_counts_[d.tier];
  }
  // The node's service CPU serves its trainers' batches one after another (the daemon's
  // service thread): the batch is in the trainer's hands when its samples have been served.
  double ready = now_;
  if (sim_.service_us_per_sample > 0) {
    NodeModel& node = nodes_[trainer / options_.trainers_per_node];
    ready = std::max(now_, node.service_free) + static_cast<double>(frame.samples.size()) * sim_.service_us_per_sample * 1e-6;
    node.service_free = ready;
  }
  t.ready.push_back(ready);
  if (t.ready.size() == 1) ++ready_trainers_;
  if (!finishing_) try_step();
}

void Simulation::on_epoch_end(std::uint32_t trainer, const proto::EpochStats& stats) {
  trainers_[trainer].label_entropy_mean = stats.label_entropy_mean;
}

void Simulation::on_error(std::uint32_t trainer, const Status& status) {
  if (!trainers_[trainer].alive) return;
  if (result_.error.empty()) {
    result_.error = fmt::format("trainer {} failed at {:.6f} s: {}", trainer, now_, status.to_string());
  }
}

void Simulation::try_step() {
  if (step_running_ || done_ || alive_trainers_ == 0 || ready_trainers_ < alive_trainers_) return;
  // DDP: each trainer computes as soon as it holds its batch and the previous step is over;
  // the step ends with the slowest (the gradient all-reduce). Waiting for the batch is stall.
  double end = step_end_;
  for (std::uint32_t g = 0; g < trainers_.size(); ++g) {
    TrainerState& t = trainers_[g];
    if (!t.alive) continue;
    const double ready = t.ready.front();
    const double start = std::max(step_end_, ready);
    t.stall_s += start - step_end_;
    const double compute = static_cast<double>(shape_.batch_length(g, step_)) / sim_.trainer_samples_per_s *
                           t.compute_factor;
    end = std::max(end, start + compute);
  }
  step_running_ = true;
  at(end, [this] { finish_step(); });
}

void Simulation::finish_step() {
  step_running_ = false;
  step_end_ = now_;
  finishing_ = true;
  for (TrainerState& t : trainers_) {
    if (!t.alive || t.ready.empty()) continue;
    t.ready.pop_front();
    if (t.ready.empty()) --ready_trainers_;
  }
  const std::uint64_t finished = step_;
  ++step_;
  if (step_ == shape_.batches_per_trainer / 2) sample_metadata();
  // The trainers are done with the batch: its staging may be reused (this may deliver
  // more batches at once, counted by on_batch).
  for (std::uint32_t g = 0; g < trainers_.size(); ++g) {
    TrainerState& t = trainers_[g];
    if (!t.alive) continue;
    const Status released = t.scheduler->release(epoch_, finished);
    if (!released.ok() && result_.error.empty()) result_.error = released.to_string();
  }
  finishing_ = false;
  if (step_ == shape_.batches_per_trainer) {
    end_epoch();
    return;
  }
  try_step();
}

void Simulation::sample_metadata() {
  // A node holds its directory (the global catalog and placement, the same on every node;
  // or its owner-side shard and O(P) tables) and its schedulers' state; the maximum over
  // nodes is the figure. (Summing the global placement per node would cost O(P) per node,
  // O(P^2) in all, so a global directory is counted once.)
  for (std::uint32_t node = 0; node < options_.nodes; ++node) {
    std::uint64_t schedulers = 0;
    for (std::uint32_t l = 0; l < options_.trainers_per_node; ++l) {
      schedulers += trainers_[node * options_.trainers_per_node + l].scheduler->metadata_bytes();
    }
    const SampleDirectory& directory = *directories_[sharded_ ? node : 0];
    const NodeMetadataBytes bytes = node_metadata_bytes(directory, schedulers);
    if (bytes.total() > result_.metadata_bytes_per_node_max) {
      result_.metadata_bytes_per_node_max = bytes.total();
      result_.metadata_breakdown = bytes;
    }
  }
}

void Simulation::end_epoch() {
  sample_metadata();
  // The audit: every alive trainer got exactly its quota; without a fault every sample was
  // seen once (repeats were caught as they came); with one, each survivor's samples are
  // exactly its planned ones (order-independent fingerprint of the plan).
  SimEpochResult e;
  e.epoch = epoch_;
  e.sim_seconds = now_ - epoch_start_;
  double stall = 0;
  double entropy = 0;
  std::uint32_t entropy_n = 0;
  for (std::uint32_t g = 0; g < trainers_.size(); ++g) {
    TrainerState& t = trainers_[g];
    if (!t.alive) continue;
    ++e.trainers;
    e.samples += t.delivered;
    stall += t.stall_s;
    if (!std::isnan(t.label_entropy_mean)) {
      entropy += t.label_entropy_mean;
      ++entropy_n;
    }
    if (t.delivered != shape_.trainer_quota[g]) {
      audit_error(fmt::format("epoch {}: trainer {} received {} samples, planned {}", epoch_, g, t.delivered,
                              shape_.trainer_quota[g]));
    }
  }
  if (!fault_ || now_ <= sim_.fault_time_s) {
    const std::uint64_t expected = shape_.delivered_per_epoch;
    std::uint64_t seen = 0;
    for (std::uint64_t w : seen_) seen += static_cast<std::uint64_t>(__builtin_popcountll(w));
    if (!shape_.job.drop_last && seen != expected) {
      for (SampleId id = 0; id < catalog_.size(); ++id) {
        if ((seen_[id / 64] >> (id % 64) & 1) == 0) {
          audit_error(fmt::format("epoch {}: sample {} was never delivered ({} of {} seen)", epoch_, id, seen, expected));
          break;
        }
      }
    } else if (seen != expected) {
      audit_error(fmt::format("epoch {}: {} samples seen, planned {}", epoch_, seen, expected));
    }
  } else {
    for (std::uint32_t node = 0; node < options_.nodes; ++node) {
      if (!nodes_[node].alive) continue;
      const std::vector<TrainerPlan> plans = planner_->plan_node(epoch_, node);
      for (std::uint32_t l = 0; l < plans.size(); ++l) {
        std::uint64_t fingerprint = 0;
        for (SampleId id : plans[l].order) fingerprint += mix_id(id);
        const std::uint32_t g = node * options_.trainers_per_node + l;
        if (fingerprint != trainers_[g].fingerprint) {
          audit_error(fmt::format("epoch {}: trainer {} received other samples than planned", epoch_, g));
        }
      }
    }
  }
  const std::uint64_t tiers = tier_counts_[0] + tier_counts_[1] + tier_counts_[2];
  if (tiers > 0) {
    e.tier_local = static_cast<double>(tier_counts_[0]) / static_cast<double>(tiers);
    e.tier_peer = static_cast<double>(tier_counts_[1]) / static_cast<double>(tiers);
    e.tier_storage = static_cast<double>(tier_counts_[2]) / static_cast<double>(tiers);
  }
  e.samples_per_s = e.sim_seconds > 0 ? static_cast<double>(e.samples) / e.sim_seconds : 0;
  e.stall_fraction = e.sim_seconds > 0 && e.trainers > 0 ? stall / e.trainers / e.sim_seconds : 0;
  e.label_entropy_mean = entropy_n > 0 ? entropy / entropy_n : std::numeric_limits<double>::quiet_NaN();
  result_.epochs.push_back(e);
  if (epoch_ + 1 < options_.epochs) {
    start_epoch(epoch_ + 1);
  } else {
    done_ = true;
  }
}

void Simulation::start_epoch(std::uint64_t epoch) {
  epoch_ = epoch;
  step_ = 0;
  epoch_start_ = now_;
  step_end_ = now_;
  std::fill(seen_.begin(), seen_.end(), 0);
  std::fill(std::begin(tier_counts_), std::end(tier_counts_), 0);
  finishing_ = true;
  for (TrainerState& t : trainers_) {
    t.stall_s = 0;
    t.delivered = 0;
    t.fingerprint = 0;
    t.label_entropy_mean = std::numeric_limits<double>::quiet_NaN();
  }
  for (TrainerState& t : trainers_) {
    if (t.alive) t.scheduler->start_epoch(epoch, epoch);  // stream = epoch
  }
  finishing_ = false;
  try_step();
}

void Simulation::kill_node(std::uint32_t node) {
  nodes_[node].alive = false;
  for (std::uint32_t l = 0; l < options_.trainers_per_node; ++l) {
    TrainerState& t = trainers_[node * options_.trainers_per_node + l];
    if (!t.ready.empty()) --ready_trainers_;
    t.ready.clear();
    t.alive = false;
    --alive_trainers_;
    t.scheduler->close();
  }
  if (!step_running_) try_step();
}

Result<SimResult> Simulation::run() {
  const auto wall_start = std::chrono::steady_clock::now();
  const Config& config = options_.config;
  if (options_.nodes == 0 || options_.trainers_per_node == 0 || options_.epochs == 0) {
    return make_error(StatusCode::kInvalidArgument, "--nodes, --trainers-per-node and --epochs must be at least 1");
  }
  const std::uint64_t trainers = std::uint64_t{options_.nodes} * options_.trainers_per_node;
  if (options_.samples < trainers) {
    return make_error(StatusCode::kInvalidArgument, "--samples {} is fewer than the {} trainers", options_.samples, trainers);
  }
  if (options_.median_kib <= 0) return make_error(StatusCode::kInvalidArgument, "--median-kib must be positive");
  if (sim_.fault_node >= static_cast<std::int64_t>(options_.nodes) ||
      sim_.slow_link_node >= static_cast<std::int64_t>(options_.nodes)) {
    return make_error(StatusCode::kInvalidArgument, "config keys 'sim.fault_node' ({}) and 'sim.slow_link_node' ({}) "
                      "must be below --nodes {}", sim_.fault_node, sim_.slow_link_node, options_.nodes);
  }
  if (sim_.fault_node >= 0 && options_.nodes < 2) {
    return make_error(StatusCode::kInvalidArgument, "config key 'sim.fault_node' needs at least 2 nodes");
  }
  result_.nodes = options_.nodes;
  result_.trainers_per_node = options_.trainers_per_node;
  result_.samples = options_.samples;
  result_.median_kib = options_.median_kib;
  result_.placement = placement_policy_name(config.dataset.placement);

  // The core, as a daemon builds it (minus the scan: the catalog is synthetic).
  auto catalog = synthetic_dataset(options_.samples, options_.median_kib * 1024.0, sim_);
  if (!catalog.ok()) return catalog.status();
  catalog_ = std::move(*catalog);
  shape_ = make_plan_shape(options_.samples, JobShape{options_.nodes, options_.trainers_per_node, config.batch.size,
                                                      config.batch.drop_last});
  const std::uint64_t capacity = config.cache.capacity_bytes == 0 ? kNoCapacityLimit : config.cache.capacity_bytes;
  // Per node: samples it owns, and the samples and bytes resident in its arena.
  std::vector<std::uint64_t> cached_samples(options_.nodes);
  std::vector<std::uint64_t> cached_bytes(options_.nodes);
  sharded_ = config.dataset.placement == PlacementPolicy::kSpread;
  if (sharded_) {
    ownership_ = Ownership::spread(options_.samples, shape_.node_owned, config.shuffle.seed);
    std::vector<std::uint64_t> cold(options_.nodes);
    shards_.reserve(options_.nodes);
    for (std::uint32_t k = 0; k < options_.nodes; ++k) {
      shards_.push_back(OwnerShard::build(catalog_, ownership_, k, capacity, config.shuffle.seed));
      cold[k] = shards_[k].cold_samples();
      cached_samples[k] = shards_[k].cached_samples();
      cached_bytes[k] = shards_[k].cached_bytes();
    }
    exchange_ = std::make_unique<InProcessExchange>(shards_);
    // The shard file table (paths, O(files)) is on every node, as the daemons' catalog has it.
    const std::uint64_t file_table_bytes = catalog_.file_table_bytes();
    for (std::uint32_t k = 0; k < options_.nodes; ++k) {
      directories_.push_back(
          std::make_unique<ShardedDirectory>(k, ownership_, shards_[k], *exchange_, cold, file_table_bytes));
    }
    planner_ = std::make_unique<EpochPlanner>(shape_, ownership_, config.shuffle, catalog_.labels());
  } else {
    placement_ = make_placement(catalog_.sizes(), shape_, config.dataset.placement, config.shuffle.seed, capacity);
    for (std::uint32_t k = 0; k < options_.nodes; ++k) {
      cached_samples[k] = placement_.cached[k].size();
      cached_bytes[k] = placement_.cached_bytes[k];
    }
    directories_.push_back(std::make_unique<GlobalDirectory>(catalog_, placement_));
    planner_ = std::make_unique<EpochPlanner>(shape_, placement_, config.shuffle, catalog_.labels());
  }
  const std::uint64_t num_classes = catalog_.num_classes();

  fault_ = sim_.fault_node >= 0;
  fault_node_ = fault_ ? static_cast<std::uint32_t>(sim_.fault_node) : 0;
  detect_time_ = fault_ ? sim_.fault_time_s + std::chrono::duration<double>(config.fault.peer_timeout).count() : 0;
  const bool degrade = config.fault.peer_death == "degrade";

  nodes_.resize(options_.nodes);
  for (std::uint32_t k = 0; k < options_.nodes; ++k) {
    nodes_[k].link_bytes_per_s = sim_.link_gbps * 1e9 / 8;
    if (static_cast<std::int64_t>(k) == sim_.slow_link_node) nodes_[k].link_bytes_per_s /= sim_.slow_link_factor;
    peer_fetchers_.push_back(std::make_unique<SimPeerFetcher>(*this, k));
    storage_fetchers_.push_back(std::make_unique<SimStorageFetcher>(*this, k));
  }
  plan_cpu_ns_.assign(options_.epochs, std::vector<std::uint64_t>(options_.nodes, 0));
  contexts_.resize(options_.nodes);
  for (std::uint32_t k = 0; k < options_.nodes; ++k) {
    SchedulerContext& c = contexts_[k];
    c.directory = directories_[sharded_ ? k : 0].get();
    c.planner = planner_.get();
    c.node = k;
    c.prefetch = config.service.prefetch;
    c.window = config.shuffle.window;
    c.num_classes = num_classes;
    c.storage = storage_fetchers_[k].get();
    c.cold_readahead_batches = c.directory->has_cold_samples() ? config.service.cold_readahead_batches : 0;
    c.degrade_dead_peers = degrade;
    c.rerouted_samples = &rerouted_;
    c.on_plan_cpu = [this, k](std::uint64_t epoch, std::uint64_t ns) {
      if (epoch < plan_cpu_ns_.size()) plan_cpu_ns_[epoch][k] += ns;
    };
  }
  Rng straggler_rng = Rng::for_stream(sim_.dataset_seed, {0x7374726167676c65ull});  // "straggle"
  trainers_.resize(trainers);
  for (std::uint32_t g = 0; g < trainers; ++g) {
    const std::uint32_t node = g / options_.trainers_per_node;
    sinks_.push_back(std::make_unique<SimSink>(*this, g));
    TrainerState& t = trainers_[g];
    t.scheduler = std::make_shared<TrainerScheduler>(
        contexts_[node], g % options_.trainers_per_node,
        std::make_shared<StagingAllocator>(0, config.service.staging_bytes_per_trainer), *peer_fetchers_[node],
        *sinks_.back());
    if (straggler_rng.uniform() < sim_.straggler_fraction) t.compute_factor = sim_.straggler_factor;
  }
  alive_trainers_ = static_cast<std::uint32_t>(trainers);
  seen_.assign((options_.samples + 63) / 64, 0);
  result_.setup_wall_s = seconds_since(wall_start);

  // Modelled start-up, per node: the scan (one metadata operation per sample of its share of
  // the listing), the catalog exchange (global: an allgather, every node receives every
  // other node's entries, 12 bytes per sample here; owner-side: each node receives its
  // share's entries, about OwnerShard's 32 bytes a sample, from the nodes that scanned
  // them), and the load of its resident samples from storage.
  const double storage_bytes_per_s = sim_.storage_gbps * 1e9 / 8;
  for (std::uint32_t k = 0; k < options_.nodes; ++k) {
    const double scan = static_cast<double>(shape_.node_owned[k]) / sim_.storage_iops;
    const double exchanged_bytes = sharded_ ? static_cast<double>(shape_.node_owned[k]) * 32.0
                                            : static_cast<double>(options_.samples) * 12.0;
    const double exchange = exchanged_bytes / nodes_[k].link_bytes_per_s;
    const double load = std::max(static_cast<double>(cached_bytes[k]) / storage_bytes_per_s,
                                 static_cast<double>(cached_samples[k]) / sim_.storage_iops);
    result_.startup_modelled_s = std::max(result_.startup_modelled_s, scan + exchange + load);
  }

  if (fault_) {
    at(sim_.fault_time_s, [this] { kill_node(fault_node_); });
    at(detect_time_, [this, degrade] {
      for (std::uint32_t g = 0; g < trainers_.size(); ++g) {
        TrainerState& t = trainers_[g];
        if (!t.alive) continue;
        if (degrade) {
          t.scheduler->peer_dead(fault_node_);
        } else if (result_.error.empty()) {
          result_.error = fmt::format("node {} died at {:.6f} s and fault.peer_death = stop: the job stops at {:.6f} s",
                                      fault_node_, sim_.fault_time_s, now_);
          done_ = true;
        }
      }
    });
  }

  start_epoch(0);
  while (!done_ && !queue_.empty()) {
    Event event = std::move(const_cast<Event&>(queue_.top()));
    queue_.pop();
    now_ = event.time;
    ++result_.events;
    event.fn();
  }
  result_.sim_seconds = now_;
  if (!done_ && result_.error.empty()) {
    result_.error = fmt::format("the simulation stalled at {:.6f} s in epoch {} step {} ({} of {} trainers ready)",
                                now_, epoch_, step_, ready_trainers_, alive_trainers_);
  }
  for (TrainerState& t : trainers_) t.scheduler->close();

  result_.exactly_once = audit_problems_ == 0 && result_.error.empty() && result_.epochs.size() == options_.epochs;
  for (const auto& per_node : plan_cpu_ns_) {
    for (const std::uint64_t ns : per_node) {
      result_.plan_cpu_s_per_epoch_per_node_max = std::max(result_.plan_cpu_s_per_epoch_per_node_max, ns * 1e-9);
    }
  }
  result_.startup_s = result_.startup_modelled_s + result_.setup_wall_s;
  result_.fault = fault_;
  result_.fault_node = sim_.fault_node;
  result_.fault_time_s = fault_ ? sim_.fault_time_s : 0;
  result_.fault_detect_s = detect_time_;
  result_.rerouted_samples = rerouted_.load();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  result_.peak_rss_bytes = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
  result_.wall_s = seconds_since(wall_start);
  return std::move(result_);
}

std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.6g}", v);
}

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

}  // namespace

Result<SimResult> run_simulation(const SimOptions& options, const SimHooks& hooks) {
  Simulation simulation(options, hooks);
  return simulation.run();
}

std::string to_json(const SimResult& r) {
  std::string out = "{";
  out += fmt::format("\"nodes\":{},\"trainers_per_node\":{},\"samples\":{},\"median_kib\":{},\"placement\":{}", r.nodes,
                     r.trainers_per_node, r.samples, number(r.median_kib), quoted(r.placement));
  out += fmt::format(",\"exactly_once\":{}", r.exactly_once ? "true" : "false");
  out += fmt::format(",\"metadata_bytes_per_node_max\":{}", r.metadata_bytes_per_node_max);
  out += fmt::format(",\"metadata_bytes_breakdown\":{{\"catalog\":{},\"placement\":{},\"schedulers\":{}}}",
                     r.metadata_breakdown.catalog, r.metadata_breakdown.placement, r.metadata_breakdown.schedulers);
  out += fmt::format(",\"plan_cpu_s_per_epoch_per_node_max\":{}", number(r.plan_cpu_s_per_epoch_per_node_max));
  out += fmt::format(",\"startup_s\":{},\"startup_modelled_s\":{},\"setup_wall_s\":{}", number(r.startup_s),
                     number(r.startup_modelled_s), number(r.setup_wall_s));
  out += fmt::format(",\"peak_rss_bytes\":{},\"wall_s\":{},\"sim_s\":{},\"events\":{}", r.peak_rss_bytes,
                     number(r.wall_s), number(r.sim_seconds), r.events);
  if (r.fault) {
    out += fmt::format(",\"fault\":{{\"node\":{},\"time_s\":{},\"detect_s\":{},\"rerouted_samples\":{}}}", r.fault_node,
                       number(r.fault_time_s), number(r.fault_detect_s), r.rerouted_samples);
  }
  out += ",\"error\":" + (r.error.empty() ? std::string("null") : quoted(r.error));
  out += ",\"audit_errors\":[";
  for (std::size_t i = 0; i < r.audit_errors.size(); ++i) out += (i > 0 ? "," : "") + quoted(r.audit_errors[i]);
  out += "],\"epochs\":[";
  for (std::size_t i = 0; i < r.epochs.size(); ++i) {
    const SimEpochResult& e = r.epochs[i];
    out += fmt::format(
        "{}{{\"epoch\":{},\"samples_per_s\":{},\"stall_fraction\":{},\"tier_local\":{},\"tier_peer\":{},"
        "\"tier_storage\":{},\"label_entropy_mean\":{},\"sim_s\":{},\"samples\":{},\"trainers\":{}}}",
        i > 0 ? "," : "", e.epoch, number(e.samples_per_s), number(e.stall_fraction), number(e.tier_local),
        number(e.tier_peer), number(e.tier_storage), number(e.label_entropy_mean), number(e.sim_seconds), e.samples,
        e.trainers);
  }
  out += "]}";
  return out;
}

}  // namespace shardmix::sim
