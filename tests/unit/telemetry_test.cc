// Telemetry: rank 0's merge of trainer passes into per-epoch job lines, their JSON, the
// node's Prometheus text, and per-component log levels.
#include "server/telemetry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <sstream>

#include "common/log.h"

namespace shardmix {
namespace telemetry_test {

TrainerEpochRecord record(std::uint32_t node, std::uint32_t rank, std::uint64_t epoch, std::uint64_t samples,
                          double t_start, double t_end, std::uint64_t stall_us) {
  TrainerEpochRecord r;
  r.node = node;
  r.trainer_rank = rank;
  r.stats.epoch = epoch;
  r.stats.batches = 4;
  r.stats.samples = samples;
  r.stats.bytes = samples * 1000;
  r.stats.local_samples = samples / 4;
  r.stats.peer_samples = samples - samples / 4;
  r.stats.peer_bytes = r.stats.peer_samples * 1000;
  r.stats.exchange_fraction = 0.5;
  r.stats.batches_scored = 4;
  r.stats.label_entropy_mean = 0.5 + 0.1 * rank;
  r.stats.label_entropy_p5 = 0.4 + 0.1 * rank;
  r.stats.affinity = 0.25;
  r.stall_us = stall_us;
  r.released_batches = 4;
  r.t_start = t_start;
  r.t_end = t_end;
  return r;
}

TEST(JobAggregatorTest, AnEpochIsWrittenOnlyWhenEveryTrainerReported) {
  JobAggregator agg(/*nodes=*/2, /*trainers=*/2, /*dataset_samples=*/200);
  agg.add(record(0, 0, 0, 100, 10.0, 12.0, 500'000));
  EXPECT_TRUE(agg.take_complete().empty());
  agg.add(record(1, 1, 0, 100, 10.5, 14.0, 1'500'000));
  auto done = agg.take_complete();
  ASSERT_EQ(done.size(), 1u);
  const JobEpochStats& j = done[0];
  EXPECT_TRUE(j.complete);
  EXPECT_EQ(j.trainers_reporting, 2u);
  EXPECT_EQ(j.samples, 200u);
  EXPECT_EQ(j.bytes, 200'000u);
  EXPECT_DOUBLE_EQ(j.seconds, 4.0);  // earliest start 10.0 .. latest end 14.0
  EXPECT_DOUBLE_EQ(j.samples_per_second, 50.0);
  EXPECT_DOUBLE_EQ(j.stall_seconds, 2.0);
  EXPECT_DOUBLE_EQ(j.stall_seconds_max, 1.5);
  EXPECT_DOUBLE_EQ(j.stall_fraction, 2.0 / (4.0 * 2));
  EXPECT_EQ(j.local_samples, 50u);
  EXPECT_EQ(j.peer_samples, 150u);
  EXPECT_DOUBLE_EQ(j.label_entropy_mean, 0.55);  // both trainers scored 4 batches
  EXPECT_DOUBLE_EQ(j.label_entropy_p5_min, 0.4);
  EXPECT_DOUBLE_EQ(j.affinity, 0.25);
  ASSERT_TRUE(j.skipped_samples.has_value());
  EXPECT_EQ(*j.skipped_samples, 0u);
  EXPECT_TRUE(agg.take_complete().empty());
  EXPECT_TRUE(agg.flush().empty());
}

TEST(JobAggregatorTest, InvalidDatasetSamplesCountAsSkippedEveryEpoch) {
  // 200 valid samples in the catalog, 7 left out by the scan (damaged shards).
  JobAggregator agg(1, 2, 200, 7);
  agg.add(record(0, 0, 0, 100, 1, 2, 0));
  agg.add(record(0, 1, 0, 100, 1, 2, 0));
  auto done = agg.take_complete();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].skipped_samples.value_or(999), 7u);
  EXPECT_EQ(done[0].invalid_samples, 7u);
  EXPECT_NE(done[0].to_json().find("\"invalid_samples\": 7"), std::string::npos) << done[0].to_json();
  EXPECT_NE(done[0].summary().find("skipped 7 (of which 7 invalid in the dataset)"), std::string::npos)
      << done[0].summary();
}

TEST(JobAggregatorTest, SkippedSamplesAndIncompleteEpochsAtShutdown) {
  JobAggregator agg(1, 2, 250);
  agg.add(record(0, 0, 3, 100, 1, 2, 0));
  agg.add(record(0, 1, 3, 100, 1, 2, 0));  // drop_last: 50 samples not delivered
  agg.add(record(0, 0, 4, 60, 2, 3, 0));   // epoch 4: trainer 1 never finished it
  auto done = agg.take_complete();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].epoch, 3u);
  EXPECT_EQ(done[0].skipped_samples.value_or(999), 50u);
  auto rest = agg.flush();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].epoch, 4u);
  EXPECT_FALSE(rest[0].complete);
  EXPECT_EQ(rest[0].trainers_reporting, 1u);
  EXPECT_FALSE(rest[0].skipped_samples.has_value());
}

TEST(JobAggregatorTest, ErrorsAreTheNodesLatestTotalsSummed) {
  JobAggregator agg(2, 2, 200);
  auto a = record(0, 0, 0, 100, 0, 1, 0);
  auto b = record(1, 1, 0, 100, 0, 1, 0);
  a.node_errors_total = 2;
  b.node_errors_total = 3;
  agg.add(a);
  agg.add(b);
  EXPECT_EQ(agg.take_complete().at(0).errors_total, 5u);
}

TEST(JobAggregatorTest, CheckpointFiguresAreTheNodesLatestSummed) {
  JobAggregator agg(2, 2, 200);
  auto a = record(0, 0, 0, 100, 0, 1, 0);
  auto b = record(1, 1, 0, 100, 0, 1, 0);
  // ram, waiting, drained, drain_us, saves, save_us; pool in use, capacity, prefaulted,
  // buffers, overflows, overflow bytes: every figure distinct, so that one not carried shows.
  a.node_checkpoints = {100, 40, 1000, 2000000, 3, 500000, 4096, 65536, 32768, 2, 1, 3000};
  b.node_checkpoints = {7, 0, 50, 1000000, 1, 250000, 2048, 8192, 8192, 5, 3, 900};
  auto a_older = a;
  // An earlier pass of node 0, arriving late.
  a_older.node_checkpoints = {10, 10, 10, 10, 1, 10, 10, 10, 10, 1, 0, 0};
  agg.add(a);
  agg.add(a_older);
  agg.add(b);
  const JobEpochStats j = agg.take_complete().at(0);
  EXPECT_EQ(j.checkpoints.ram_bytes, 107u);
  EXPECT_EQ(j.checkpoints.waiting_bytes, 40u);
  EXPECT_EQ(j.checkpoints.drained_bytes, 1050u);
  EXPECT_EQ(j.checkpoints.saves, 4u);
  EXPECT_EQ(j.checkpoints.pool_in_use_bytes, 6144u);
  EXPECT_EQ(j.checkpoints.pool_capacity_bytes, 73728u);
  EXPECT_EQ(j.checkpoints.pool_prefaulted_bytes, 40960u);
  EXPECT_EQ(j.checkpoints.pool_buffers, 7u);
  EXPECT_EQ(j.checkpoints.pool_overflows, 4u);
  EXPECT_EQ(j.checkpoints.pool_overflow_bytes, 3900u);
  const std::string json = j.to_json();
  EXPECT_NE(json.find("\"checkpoint_drained_bytes\": 1050,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_drain_seconds\": 3,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_save_seconds\": 0.75"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_pool_in_use_bytes\": 6144,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_pool_capacity_bytes\": 73728,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_pool_prefaulted_bytes\": 40960,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_pool_buffers\": 7,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_pool_overflows\": 4,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_pool_overflow_bytes\": 3900}"), std::string::npos) << json;
}

TEST(JobEpochStatsTest, JsonIsOneLineWithNullForMissingFigures) {
  JobAggregator agg(1, 1, 100);
  auto r = record(0, 0, 0, 100, 0, 2, 0);
  r.stats.affinity = std::nan("");  // first epoch: no affinity yet
  agg.add(r);
  const std::string json = agg.take_complete().at(0).to_json();
  EXPECT_EQ(json.find('\n'), std::string::npos);
  EXPECT_NE(json.find("\"affinity\": null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"samples\": 100,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"samples_per_second\": 50,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"complete\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"tier_local\": 0.25,"), std::string::npos) << json;
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
}

// name{labels} -> value of every sample in `text`, checking that every non-comment line is
// name{labels} value and that every name has HELP and TYPE.
std::map<std::string, double> prometheus_values(const std::string& text) {
  const std::regex sample(R"(^([a-z_][a-z0-9_]*)\{([a-z_]+="([^"\\]|\\.)*"(,[a-z_]+="([^"\\]|\\.)*")*)\} (-?[0-9.e+-]+|NaN)$)");
  std::map<std::string, double> values;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0) {
      EXPECT_TRUE(line.rfind("# HELP shardmix_", 0) == 0 || line.rfind("# TYPE shardmix_", 0) == 0) << line;
      continue;
    }
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, sample)) << line;
    if (m.empty()) continue;
    EXPECT_NE(text.find("# TYPE " + m[1].str() + " "), std::string::npos) << m[1];
    values[line.substr(0, line.rfind(' '))] = std::strtod(line.substr(line.rfind(' ') + 1).c_str(), nullptr);
  }
  return values;
}

TEST(NodeTelemetryTest, PrometheusTextIsWellFormedAndCountsPasses) {
  NodeTelemetry t;
  t.set_info(NodeInfo{2, 4, 2, "tcp", "host\"x", 500, 3});
  t.trainer_connected();
  t.add_record(record(2, 4, 0, 100, 0, 1, 250'000));
  t.add_record(record(2, 5, 0, 80, 0, 1, 750'000));
  t.error_sent();
  const std::string text = t.prometheus_text();
  std::map<std::string, double> values = prometheus_values(text);
  EXPECT_EQ(values.count("shardmix_checkpoint_ram_bytes{node=\"2\"}"), 0u);  // no checkpoint.dir: none
  EXPECT_EQ(values["shardmix_samples_total{node=\"2\",tier=\"local\"}"], 25 + 20);
  EXPECT_EQ(values["shardmix_dataset_samples{node=\"2\"}"], 500);
  EXPECT_EQ(values["shardmix_dataset_invalid_samples{node=\"2\"}"], 3);
  EXPECT_EQ(values["shardmix_samples_total{node=\"2\",tier=\"peer\"}"], 75 + 60);
  EXPECT_EQ(values["shardmix_bytes_total{node=\"2\"}"], 180'000);
  EXPECT_EQ(values["shardmix_trainer_stall_seconds_total{node=\"2\"}"], 1.0);
  EXPECT_EQ(values["shardmix_trainer_epochs_total{node=\"2\"}"], 2);
  EXPECT_EQ(values["shardmix_errors_total{node=\"2\"}"], 1);
  EXPECT_EQ(values["shardmix_trainers_connected{node=\"2\"}"], 1);
  EXPECT_NE(text.find("host=\"host\\\"x\""), std::string::npos);  // label value escaped
  EXPECT_EQ(t.take_records().size(), 2u);
  EXPECT_TRUE(t.take_records().empty());
}

// A node's checkpoint stats with every figure distinct, so that one not carried shows.
CheckpointNodeStats checkpoint_node_stats() {
  CheckpointNodeStats c;
  c.store.bytes_in_ram = 3'000'000;
  c.store.bytes_waiting = 1'000'000;
  c.store.bytes_drained = 8'000'000;
  c.store.drain_failures = 2;
  c.saves = 4;
  c.save_us = 1'500'000;
  c.drain_busy_us = 4'000'000;
  c.saves_waiting_for_room = 1;
  c.pool.capacity_bytes = 64u << 20;
  c.pool.chunk_bytes = 2u << 20;
  c.pool.bytes_in_use = 6u << 20;
  c.pool.buffers = 5;
  c.pool.overflows = 3;
  c.pool.overflow_bytes = 7'000'000;
  c.pool.prefaulted_bytes = 32u << 20;
  return c;
}

TEST(NodeTelemetryTest, CheckpointFiguresReachThePrometheusTextAndTheRecords) {
  NodeTelemetry t;
  t.set_info(NodeInfo{1, 2, 1, "tcp", "h", 10, 0});
  t.set_checkpoint_stats(checkpoint_node_stats);
  std::map<std::string, double> values = prometheus_values(t.prometheus_text());
  EXPECT_EQ(values["shardmix_checkpoint_ram_bytes{node=\"1\"}"], 3'000'000);
  EXPECT_EQ(values["shardmix_checkpoint_waiting_bytes{node=\"1\"}"], 1'000'000);
  EXPECT_EQ(values["shardmix_checkpoint_drained_bytes_total{node=\"1\"}"], 8'000'000);
  EXPECT_EQ(values["shardmix_checkpoint_drain_seconds_total{node=\"1\"}"], 4.0);
  EXPECT_EQ(values["shardmix_checkpoint_drain_failures_total{node=\"1\"}"], 2);
  EXPECT_EQ(values["shardmix_checkpoint_saves_total{node=\"1\"}"], 4);
  EXPECT_EQ(values["shardmix_checkpoint_save_seconds_total{node=\"1\"}"], 1.5);
  EXPECT_EQ(values["shardmix_checkpoint_saves_waiting_for_room{node=\"1\"}"], 1);
  EXPECT_EQ(values["shardmix_checkpoint_pool_in_use_bytes{node=\"1\"}"], 6u << 20);
  EXPECT_EQ(values["shardmix_checkpoint_pool_capacity_bytes{node=\"1\"}"], 64u << 20);
  EXPECT_EQ(values["shardmix_checkpoint_pool_prefaulted_bytes{node=\"1\"}"], 32u << 20);
  EXPECT_EQ(values["shardmix_checkpoint_pool_buffers_total{node=\"1\"}"], 5);
  EXPECT_EQ(values["shardmix_checkpoint_pool_overflows_total{node=\"1\"}"], 3);
  EXPECT_EQ(values["shardmix_checkpoint_pool_overflow_bytes_total{node=\"1\"}"], 7'000'000);

  // What a trainer's record carries to rank 0's stats file.
  const NodeCheckpointFigures f = t.checkpoint_figures();
  EXPECT_EQ(f.ram_bytes, 3'000'000u);
  EXPECT_EQ(f.waiting_bytes, 1'000'000u);
  EXPECT_EQ(f.drained_bytes, 8'000'000u);
  EXPECT_EQ(f.drain_us, 4'000'000u);
  EXPECT_EQ(f.saves, 4u);
  EXPECT_EQ(f.save_us, 1'500'000u);
  EXPECT_EQ(f.pool_in_use_bytes, 6u << 20);
  EXPECT_EQ(f.pool_capacity_bytes, 64u << 20);
  EXPECT_EQ(f.pool_prefaulted_bytes, 32u << 20);
  EXPECT_EQ(f.pool_buffers, 5u);
  EXPECT_EQ(f.pool_overflows, 3u);
  EXPECT_EQ(f.pool_overflow_bytes, 7'000'000u);

  t.set_checkpoint_stats({});  // the daemon's node is gone: no figures, no metrics
  EXPECT_EQ(t.checkpoint_figures().pool_capacity_bytes, 0u);
  EXPECT_EQ(t.prometheus_text().find("shardmix_checkpoint_"), std::string::npos);
}

TEST(NodeTelemetryTest, FailureDetectorFiguresReachThePrometheusText) {
  NodeTelemetry t;
  t.set_info(NodeInfo{0, 4, 1, "tcp", "h", 10, 0});
  EXPECT_EQ(t.prometheus_text().find("shardmix_peer_heartbeat"), std::string::npos);  // one daemon: none
  t.set_failure_detector_figures([] {
    PeerMonitor::Figures f;
    f.slowest_answer = std::chrono::milliseconds(6100);
    f.slowest_rank = 2;
    f.longest_pause = std::chrono::milliseconds(3500);
    f.pauses = 7;
    return f;
  });
  std::map<std::string, double> values = prometheus_values(t.prometheus_text());
  EXPECT_EQ(values["shardmix_peer_heartbeat_slowest_seconds{node=\"0\"}"], 6.1);
  EXPECT_EQ(values["shardmix_failure_detector_longest_pause_seconds{node=\"0\"}"], 3.5);
  EXPECT_EQ(values["shardmix_failure_detector_pauses_total{node=\"0\"}"], 7);
  t.set_failure_detector_figures({});
  EXPECT_EQ(t.prometheus_text().find("shardmix_failure_detector"), std::string::npos);
}

TEST(LogComponentsTest, ParsesPairsAndNamesTheBadOne) {
  auto ok = log::parse_component_levels(" fabric=debug, service = warn ,");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->size(), 2u);
  EXPECT_EQ(ok->at("fabric"), "debug");
  EXPECT_EQ(ok->at("service"), "warn");
  EXPECT_TRUE(log::parse_component_levels("").ok());
  auto bad = log::parse_component_levels("fabric=debug,service=loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("service=loud"), std::string::npos);
  EXPECT_FALSE(log::parse_component_levels("fabric").ok());
}

TEST(LogComponentsTest, AComponentOverrideBeatsTheDefaultLevel) {
  log::init(0, "warn", "unit_a=debug");
  EXPECT_EQ(log::get("unit_a")->level(), spdlog::level::debug);
  EXPECT_EQ(log::get("unit_b")->level(), spdlog::level::warn);
  log::init(0, "info", "");
  EXPECT_EQ(log::get("unit_a")->level(), spdlog::level::info);
}

}  // namespace telemetry_test
}  // namespace shardmix
