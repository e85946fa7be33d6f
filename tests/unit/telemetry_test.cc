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
  a.node_checkpoints = {100, 40, 1000, 2000000, 3, 500000};
  b.node_checkpoints = {7, 0, 50, 1000000, 1, 250000};
  auto a_older = a;
  a_older.node_checkpoints = {10, 10, 10, 10, 1, 10};  // an earlier pass of node 0, arriving late
  agg.add(a);
  agg.add(a_older);
  agg.add(b);
  const JobEpochStats j = agg.take_complete().at(0);
  EXPECT_EQ(j.checkpoints.ram_bytes, 107u);
  EXPECT_EQ(j.checkpoints.waiting_bytes, 40u);
  EXPECT_EQ(j.checkpoints.drained_bytes, 1050u);
  EXPECT_EQ(j.checkpoints.saves, 4u);
  const std::string json = j.to_json();
  EXPECT_NE(json.find("\"checkpoint_drained_bytes\": 1050,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_drain_seconds\": 3,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checkpoint_save_seconds\": 0.75"), std::string::npos) << json;
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

TEST(NodeTelemetryTest, PrometheusTextIsWellFormedAndCountsPasses) {
  NodeTelemetry t;
  t.set_info(NodeInfo{2, 4, 2, "tcp", "host\"x", 500, 3});
  t.trainer_connected();
  t.add_record(record(2, 4, 0, 100, 0, 1, 250'000));
  t.add_record(record(2, 5, 0, 80, 0, 1, 750'000));
  t.error_sent();
  const std::string text = t.prometheus_text();
  // Every non-comment line: name{labels} value; every name has HELP and TYPE.
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
    ASSERT_TRUE(std::regex_match(line, m, sample)) << line;
    EXPECT_NE(text.find("# TYPE " + m[1].str() + " "), std::string::npos) << m[1];
    values[line.substr(0, line.rfind(' '))] = std::strtod(line.substr(line.rfind(' ') + 1).c_str(), nullptr);
  }
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
