// shardmix-whatif's mechanics on a synthetic stats file written here: the job record is
// parsed, bad files are errors naming the file and line, the fit and --nodes reach the
// simulator, and calibration files accept [sim] keys only. Behaviour only, no timing.
#include "sim/whatif.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace shardmix::sim {
namespace {

namespace fs = std::filesystem;

constexpr const char* kJob =
    R"({"job": {"version": 1, "nodes": 4, "trainers_per_node": 1, "samples": 4000, "bytes": 40000000, )"
    R"("median_sample_bytes": 10000, "mean_sample_bytes": 10000, "ln_size_sigma": 0.25, "classes": 100, )"
    R"("provider": "tcp", "config": {"batch.size": "32", "batch.drop_last": "false", "cache.capacity": "0", )"
    R"("shuffle.seed": "1", "shuffle.exchange_fraction": "1", "shuffle.window": "0", "dataset.placement": "balanced", )"
    R"("service.prefetch": "4", "service.staging_bytes_per_trainer": "268435456", "service.cold_readahead_batches": "8"}}})";

// An epoch line as JobEpochStats::to_json writes it (the fields whatif reads, and others).
std::string epoch_line(int epoch, double seconds = 2.0, double stall = 0.8) {
  return fmt::format(
      R"({{"epoch": {}, "complete": true, "nodes": 4, "trainers": 4, "trainers_reporting": 4, "t_start": 0, )"
      R"("t_end": {}, "seconds": {}, "batches": 128, "samples": 4000, "bytes": 40000000, "samples_per_second": {}, )"
      R"("stall_seconds": {}, "stall_fraction": 0.1, "fetch_wait_seconds": 0.5, "local_samples": 1000, )"
      R"("peer_samples": 3000, "storage_samples": 0, "peer_bytes": 30000000, "tier_local": 0.25, "label_entropy_mean": null, )"
      R"("skipped_samples": 0}})",
      epoch, seconds, seconds, 4000 / seconds, stall);
}

class WhatifTest : public test_support::TempDirTest {
 protected:
  WhatifTest() : TempDirTest("whatif") {}
  std::string good_stats() {
    // Epoch 0 is slower (connection set-up) and must not count.
    return write("stats.jsonl", std::string(kJob) + "\n" + epoch_line(0, 5.0, 3.0) + "\n" + epoch_line(1) + "\n" +
                                    epoch_line(2) + "\n");
  }
};

TEST_F(WhatifTest, ParsesTheJobRecordAndTheEpochs) {
  auto stats = read_stats_file(good_stats());
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  EXPECT_EQ(stats->job.nodes, 4u);
  EXPECT_EQ(stats->job.trainers_per_node, 1u);
  EXPECT_EQ(stats->job.samples, 4000u);
  EXPECT_EQ(stats->job.median_sample_bytes, 10000u);
  EXPECT_EQ(stats->job.provider, "tcp");
  EXPECT_EQ(stats->job.config.size(), 10u);
  ASSERT_EQ(stats->epochs.size(), 3u);
  EXPECT_EQ(stats->epochs[1].peer_bytes, 30000000u);
  EXPECT_DOUBLE_EQ(stats->epochs[0].seconds, 5.0);
}

TEST_F(WhatifTest, ALaterJobRecordStartsItsOwnEpochs) {
  auto stats = read_stats_file(write("two.jsonl", std::string(kJob) + "\n" + epoch_line(0) + "\n" + epoch_line(1) +
                                                      "\n" + kJob + "\n" + epoch_line(0) + "\n"));
  ASSERT_TRUE(stats.ok()) << stats.status().to_string();
  EXPECT_EQ(stats->epochs.size(), 1u);
}

TEST_F(WhatifTest, BadFilesAreErrorsNamingFileAndLine) {
  const std::string not_json = write("bad.jsonl", std::string(kJob) + "\n" + epoch_line(0) + "\n{\"epoch\": 1,,}\n");
  auto r = read_stats_file(not_json);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(not_json + ":3"), std::string::npos) << r.status().to_string();

  std::string line = epoch_line(1);
  line.replace(line.find("\"peer_bytes\""), 12, "\"peer_bytez\"");
  const std::string missing = write("missing.jsonl", std::string(kJob) + "\n" + line + "\n");
  r = read_stats_file(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(missing + ":2"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("peer_bytes"), std::string::npos) << r.status().to_string();

  const std::string no_job = write("nojob.jsonl", epoch_line(0) + "\n");
  r = read_stats_file(no_job);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(no_job + ":1"), std::string::npos) << r.status().to_string();

  r = read_stats_file((dir_ / "absent.jsonl").string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("absent.jsonl"), std::string::npos);
}

TEST_F(WhatifTest, FitsTheTrainerRateAndPredictsAnotherNodeCount) {
  WhatifOptions options;
  options.stats_path = good_stats();
  options.nodes = 2;
  auto r = run_whatif(options);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Epochs 1 and 2 only: 1000 samples per trainer in 2.0 s, of which 0.8 / 4 s stalled.
  EXPECT_NEAR(r->fitted_trainer_samples_per_s, 1000 / (2.0 - 0.2), 1e-6);
  EXPECT_NEAR(r->fitted_link_gbps, 2 * 30e6 * 8 / (2 * 0.5) / 1e9, 1e-9);
  EXPECT_EQ(r->measured.epochs, 2u);
  EXPECT_NEAR(r->measured.samples_per_s, 2000, 1e-9);
  EXPECT_NEAR(r->measured.stall_fraction, 0.1, 1e-9);
  EXPECT_NEAR(r->measured.tier_peer, 0.75, 1e-9);
  EXPECT_TRUE(r->reproduced_exactly_once);
  EXPECT_TRUE(r->predicted_exactly_once);
  EXPECT_EQ(r->predicted_nodes, 2u);
  // Q = 1: a trainer's own node holds 1/P of what it gets.
  EXPECT_NEAR(r->reproduced.tier_local, 0.25, 0.05);
  EXPECT_NEAR(r->predicted.tier_local, 0.5, 0.05);
  // The simulated trainers cannot beat the fitted compute rate.
  EXPECT_LE(r->reproduced.samples_per_s, 4 * r->fitted_trainer_samples_per_s * (1 + 1e-9));
  EXPECT_LE(r->predicted.samples_per_s, 2 * r->fitted_trainer_samples_per_s * (1 + 1e-9));

  const std::string json = to_json(*r);
  for (const char* field : {"\"measured\"", "\"reproduced\"", "\"predicted\"", "\"predicted_nodes\": 2",
                            "\"fitted_trainer_samples_per_s\"", "\"samples_per_s\"", "\"stall_fraction\"",
                            "\"tier_local\"", "\"tier_peer\"", "\"tier_storage\"", "\"model\""}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << " missing in " << json;
  }
}

TEST_F(WhatifTest, SetsChangeThePrediction) {
  WhatifOptions options;
  options.stats_path = good_stats();
  options.sets = {"shuffle.exchange_fraction=0"};
  auto r = run_whatif(options);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->predicted_nodes, 4u);
  EXPECT_NEAR(r->predicted.tier_local, 1.0, 1e-9);
  options.sets = {"shuffle.no_such_key=1"};
  r = run_whatif(options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("shuffle.no_such_key"), std::string::npos) << r.status().to_string();
}

TEST_F(WhatifTest, CalibrationFilesHoldSimKeysOnly) {
  auto sets = read_calibration(write("cal.toml", "[sim]\nlink_gbps = 8.5\nstorage_iops = 20000\n"));
  ASSERT_TRUE(sets.ok()) << sets.status().to_string();
  EXPECT_EQ(*sets, (std::vector<std::string>{"sim.link_gbps=8.5", "sim.storage_iops=20000"}));

  auto bad = read_calibration(write("unknown.toml", "[sim]\nlink_gbps = 8.5\nbogus_rate = 1\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sim.bogus_rate"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("unknown.toml"), std::string::npos) << bad.status().to_string();

  bad = read_calibration(write("section.toml", "[batch]\nsize = 8\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("batch"), std::string::npos) << bad.status().to_string();

  bad = read_calibration(write("syntax.toml", "[sim\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("syntax.toml"), std::string::npos) << bad.status().to_string();

  // A calibrated link rate is used as is, not fitted.
  WhatifOptions options;
  options.stats_path = good_stats();
  options.calibration_path = (dir_ / "cal.toml").string();
  auto r = run_whatif(options);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->fitted_link_gbps, 0);
  EXPECT_NE(std::find(r->model_sets.begin(), r->model_sets.end(), "sim.link_gbps=8.5"), r->model_sets.end());
}

}  // namespace
}  // namespace shardmix::sim
