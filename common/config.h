// The daemon's configuration: one struct, loaded with the precedence
// defaults < TOML file < SHARDMIX_* environment < --set section.key=value.
// Every key is declared once in config.cc's key table, which drives parsing, env names,
// --print-config and the checks that unknown keys and wrong types are errors naming the key.
// Thread-safety: plain value type.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace shardmix {

enum class DatasetFormat { kFolder, kFileList, kWebDataset, kTfRecord };
enum class PlacementPolicy { kBalanced, kSorted, kSpread };
// dataset.placement's value for a policy ("balanced", "sorted", "spread"), and back (an
// unknown name is kBalanced: the key table has already checked it).
const char* placement_policy_name(PlacementPolicy policy);
PlacementPolicy placement_policy_from_name(std::string_view name);

// [storage.s3]: the S3 source (dataset.path = "s3://..."); empty strings defer to the
// AWS environment (common/s3_client.h). No secret is a key: they come from the
// environment or a credentials file only. Held in DatasetConfig: every function that reads
// the dataset (scan, load, cold reads) takes that already.
struct S3Config {
  std::string endpoint;          // storage.s3.endpoint ("" = AWS_ENDPOINT_URL, else AWS's for the region)
  std::string region;            // storage.s3.region ("" = AWS_REGION / AWS_DEFAULT_REGION, else us-east-1)
  std::string profile;           // storage.s3.profile ("" = the environment's keys, else AWS_PROFILE)
  std::string credentials_file;  // storage.s3.credentials_file ("" = AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials)
  std::string addressing = "auto";  // storage.s3.addressing = "auto" | "path" | "virtual"
  std::uint32_t concurrency = 64;   // storage.s3.concurrency: requests in flight per daemon
  std::chrono::microseconds connect_timeout{5'000'000};   // storage.s3.connect_timeout
  std::chrono::microseconds request_timeout{60'000'000};  // storage.s3.request_timeout
  std::uint32_t max_attempts = 6;                         // storage.s3.max_attempts
  std::uint64_t merge_gap = 64ull << 10;   // storage.s3.merge_gap: bytes between samples one GET still covers
  std::uint64_t merge_max = 16ull << 20;   // storage.s3.merge_max: largest merged GET (0 = one GET per sample)

  bool operator==(const S3Config&) const = default;
};

struct DatasetConfig {
  std::string path;                              // dataset.path (folder root, list file, shard dir or shard)
  DatasetFormat format = DatasetFormat::kFolder; // dataset.format = "folder" | "filelist" | "webdataset" | "tfrecord"
  PlacementPolicy placement = PlacementPolicy::kBalanced;  // dataset.placement
  std::string metadata = "global";               // dataset.metadata = "global" | "owner" (decision 0063)
  std::uint64_t max_sample_bytes = 64ull << 20;  // dataset.max_sample_bytes
  std::string sample_ext = "jpg,jpeg,png,webp,bin";  // dataset.sample_ext: webdataset data member, by preference
  std::string label_ext = "cls";                 // dataset.label_ext: webdataset label member ("" = label 0)
  std::string label_feature;                     // dataset.label_feature: tfrecord int64 feature ("" = label 0)
  bool strict = false;                           // dataset.strict: bad shard input fails start-up
  S3Config s3;                                   // [storage.s3]

  bool operator==(const DatasetConfig&) const = default;
};

struct BatchConfig {
  std::uint32_t size = 32;   // batch.size, samples per trainer micro-batch
  bool drop_last = false;    // batch.drop_last

  bool operator==(const BatchConfig&) const = default;
};

struct ShuffleConfig {
  std::uint64_t seed = 0;              // shuffle.seed
  double exchange_fraction = 1.0;      // shuffle.exchange_fraction (Q)
  std::uint32_t window = 0;            // shuffle.window (W)
  double min_entropy = 0.0;            // shuffle.min_entropy (0 = off)

  bool operator==(const ShuffleConfig&) const = default;
};

struct CacheConfig {
  // cache.capacity: bytes per node for the cache arena; 0 = no limit beyond RAM.
  // Accepts an integer, "8GiB", or a fraction of physical RAM such as 0.5.
  std::uint64_t capacity_bytes = 0;
  std::string capacity_text = "0.8";   // as the user wrote it (printed back by --print-config)
  // cache.rotation_epochs: a new resident set every this many epochs (0 = static set;
  // docs/decisions/0033). Only acts when some samples are cold.
  std::uint32_t rotation_epochs = 0;
  // cache.reuse_rounds: split every epoch into this many rounds and re-choose each node's
  // resident set every round by next use, so slots of consumed samples hold samples needed
  // later (0 = off; docs/decisions/0035). Exclusive with rotation_epochs.
  std::uint32_t reuse_rounds = 0;

  bool operator==(const CacheConfig&) const = default;
};

struct FabricConfig {
  std::string provider = "auto";       // fabric.provider = auto | tcp | shm | verbs | <any>
  std::string interface;               // fabric.interface: domain/interface name filter, "" = any
  std::uint32_t max_outstanding_reads = 8;  // fabric.max_outstanding_reads
  std::uint32_t max_read_segments = 4;      // fabric.max_read_segments: samples per vectored read
  std::string netns;                   // fabric.netns: network namespace to join, "" = stay; {rank} expands

  bool operator==(const FabricConfig&) const = default;
};

struct ServiceConfig {
  std::string run_dir;                 // service.run_dir ("" = $SHARDMIX_RUN_DIR or /tmp/shardmix-<uid>)
  std::uint32_t trainers_per_node = 1; // service.trainers_per_node
  std::uint32_t prefetch = 4;          // service.prefetch: batches in flight per trainer
  std::uint64_t staging_bytes_per_trainer = 256ull << 20;  // service.staging_bytes_per_trainer
  std::uint32_t loader_threads = 4;    // service.loader_threads (also the storage readers of cold samples)
  std::uint32_t cold_readahead_batches = 8;  // service.cold_readahead_batches
  std::uint32_t open_shard_files = 64; // service.open_shard_files: cached shard descriptors (0 = open per read)

  bool operator==(const ServiceConfig&) const = default;
};

// What a daemon does when a peer daemon dies (docs/decisions/0025, 0026; degrade: 0032).
struct FaultConfig {
  std::string peer_death = "stop";     // fault.peer_death = stop|degrade
  std::chrono::microseconds peer_timeout{std::chrono::seconds(10)};  // fault.peer_timeout

  bool operator==(const FaultConfig&) const = default;
};

// Fault injection, for tests and benchmarks only.
struct InjectConfig {
  std::int64_t slow_peer_rank = -1;    // inject.slow_peer_rank: -1 = none
  std::chrono::microseconds slow_peer_delay{0};  // inject.slow_peer_delay
  std::chrono::microseconds storage_delay{0};    // inject.storage_delay
  std::chrono::microseconds load_delay{0};       // inject.load_delay: per sample loaded

  bool operator==(const InjectConfig&) const = default;
};

// Per-epoch statistics and counters (server/telemetry.h).
struct TelemetryConfig {
  std::string stats_file;              // telemetry.stats_file: JSON lines on rank 0; "" = off; {job} expands
  std::string prometheus_file;         // telemetry.prometheus_file: per daemon; "" = off; {rank}, {job} expand
  std::chrono::microseconds interval{std::chrono::seconds(10)};  // telemetry.interval
  std::string trace_dir;               // telemetry.trace_dir: per-process trace files; "" = off (common/trace.h)
  double trace_sample_fraction = 1.0;  // telemetry.trace_sample_fraction
  std::uint64_t trace_max_events = 1 << 20;  // telemetry.trace_max_events, per recording thread

  bool operator==(const TelemetryConfig&) const = default;
};

// Resuming an epoch with a different number of trainers (docs/decisions/0022).
struct ResumeConfig {
  std::string checkpoint_dir;          // resume.checkpoint_dir: every old rank's checkpoint blob; "" = off

  bool operator==(const ResumeConfig&) const = default;
};

// Model checkpoint absorption (docs/decisions/0053, 0056): off while dir is "".
struct CheckpointConfig {
  std::string dir;                     // checkpoint.dir: where versions drain to; "" = off
  std::uint64_t capacity_bytes = 2ull << 30;  // checkpoint.capacity: RAM for checkpoints, taken from cache.capacity
  std::uint32_t retain = 2;            // checkpoint.retain: versions of a name kept in RAM and on disk
  std::string when_full = "wait";      // checkpoint.when_full = wait | write_through
  bool prefault = true;                // checkpoint.prefault: allocate checkpoint.capacity's pages at start

  bool operator==(const CheckpointConfig&) const = default;
};

struct LogConfig {
  std::string level = "info";          // log.level = trace|debug|info|warn|error
  std::string components;              // log.components = "fabric=debug,service=warn"

  bool operator==(const LogConfig&) const = default;
};

// The simulator's models (shardmix-sim, docs/simulator.md); the daemon ignores this section.
// Defaults follow the reference figures of the development and 16-core machines where there
// is one (see each key's doc in config.cc).
struct SimConfig {
  double link_gbps = 72.0;              // sim.link_gbps: per-node NIC, gigabits/s, each direction
  double link_latency_us = 15.0;        // sim.link_latency_us: one read group's round trip
  double storage_gbps = 11.0;           // sim.storage_gbps: per-node storage read bandwidth, gigabits/s
  double storage_iops = 12000.0;        // sim.storage_iops: per-node storage reads/s
  double trainer_samples_per_s = 2500.0;  // sim.trainer_samples_per_s: compute rate of one trainer
  double service_us_per_sample = 0.0;   // sim.service_us_per_sample: a node's CPU per delivered sample (0 = free)
  double straggler_fraction = 0.0;      // sim.straggler_fraction: share of trainers that are slow
  double straggler_factor = 1.0;        // sim.straggler_factor: their compute time multiplier
  std::int64_t fault_node = -1;         // sim.fault_node: node that dies (-1 = none)
  double fault_time_s = 0.0;            // sim.fault_time_s: when it dies (simulated seconds)
  std::int64_t slow_link_node = -1;     // sim.slow_link_node: node whose link is slow (-1 = none)
  double slow_link_factor = 1.0;        // sim.slow_link_factor: its link bandwidth is divided by this
  std::uint32_t classes = 1000;         // sim.classes: labels of the synthetic dataset
  double size_sigma = 0.5;              // sim.size_sigma: sigma of ln(sample size)
  std::uint64_t dataset_seed = 1;       // sim.dataset_seed: seed of the synthetic sizes and labels
  std::uint64_t samples_per_shard = 0;  // sim.samples_per_shard: 0 = compact catalog; N = a shard format's layout

  bool operator==(const SimConfig&) const = default;
};

struct Config {
  DatasetConfig dataset;
  BatchConfig batch;
  ShuffleConfig shuffle;
  CacheConfig cache;
  FabricConfig fabric;
  ServiceConfig service;
  FaultConfig fault;
  InjectConfig inject;
  TelemetryConfig telemetry;
  ResumeConfig resume;
  LogConfig log;
  SimConfig sim;
  CheckpointConfig checkpoint;

  bool operator==(const Config&) const = default;
};

// Loads the effective config. `file` may be empty (defaults only). `env` is the process
// environment as name -> value (only SHARDMIX_<SECTION>_<KEY> names are read, e.g.
// SHARDMIX_BATCH_SIZE for batch.size). `sets` are "section.key=value" strings.
Result<Config> load_config(const std::string& file, const std::map<std::string, std::string>& env,
                           const std::vector<std::string>& sets);

// The process environment as a map, for load_config.
std::map<std::string, std::string> environment_map();

// The effective config as TOML that load_config reads back to the same Config.
std::string config_to_toml(const Config& config);

// Parses "4096", "8KiB", "1.5GiB", "2MB" into bytes. Error names `key`.
Result<std::uint64_t> parse_size(std::string_view text, std::string_view key);
// Parses "250ms", "1.5s", "100us", "2min", "1h" (a unit is required; "0" alone is allowed)
// into microseconds, rounded down. Error names `key`.
Result<std::chrono::microseconds> parse_duration(std::string_view text, std::string_view key);

// "folder", "filelist", "webdataset", "tfrecord".
std::string_view dataset_format_name(DatasetFormat format);

// SHARDMIX_* environment variables that are not config keys; load_config ignores them
// (every other SHARDMIX_* name must be a key's env name). SHARDMIX_LOG_LEVEL is also the
// env name of log.level, so it sets log.level for the daemon too. The client's timeouts are
// listed so that a future config section of the same name cannot turn them into errors.
inline constexpr std::array<std::string_view, 11> kNonConfigEnvVars = {
    "SHARDMIX_RUN_DIR",         "SHARDMIX_LOG_LEVEL",       "SHARDMIX_DAEMON",
    "SHARDMIX_RANK",            "SHARDMIX_WORLD_SIZE",      "SHARDMIX_LOCAL_RANK",
    "SHARDMIX_LOCAL_SIZE",      "SHARDMIX_CONNECT_TIMEOUT", "SHARDMIX_RECEIVE_TIMEOUT",
    "SHARDMIX_PROGRESS_TIMEOUT", "SHARDMIX_JOB_TOKEN"};

// One row of config.cc's key table, for docs, tools and tests.
struct ConfigKeyInfo {
  std::string name;          // "batch.size"
  std::string type;          // "uint", "size", "enum", ...
  std::string default_text;  // as in the table, e.g. "64MiB"
  std::string doc;           // one line: what it means
  std::string tradeoff;      // what it trades against what
  std::string env_name;      // "SHARDMIX_BATCH_SIZE"
};
std::vector<ConfigKeyInfo> config_keys();

// The key table rendered as Markdown (the generated part of docs/configuration.md).
std::string config_reference_markdown();

}  // namespace shardmix
