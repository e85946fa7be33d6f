// shardmix-sim on small clusters: the audit passes on the real scheduler, fails when a
// delivery is tampered with, and the reported figures follow the configuration.
#include "sim/simulator.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "common/catalog.h"
#include "common/config.h"

namespace shardmix::sim {
namespace {

SimOptions small(std::vector<std::string> sets = {}, std::uint32_t nodes = 4, std::uint32_t trainers_per_node = 2,
                 std::uint64_t samples = 20000) {
  sets.push_back("dataset.path=(synthetic)");
  auto config = load_config("", {}, sets);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  SimOptions options;
  options.nodes = nodes;
  options.trainers_per_node = trainers_per_node;
  options.samples = samples;
  options.median_kib = 100;
  options.epochs = 2;
  options.config = *config;
  return options;
}

SimResult run(const SimOptions& options, const SimHooks& hooks = {}) {
  auto result = run_simulation(options, hooks);
  EXPECT_TRUE(result.ok()) << result.status().to_string();
  return result.ok() ? *result : SimResult{};
}

TEST(SimulatorTest, SmallRunIsExactlyOnceAndReportsSaneFigures) {
  const SimResult r = run(small());
  EXPECT_TRUE(r.exactly_once) << (r.audit_errors.empty() ? r.error : r.audit_errors.front());
  EXPECT_TRUE(r.audit_errors.empty());
  EXPECT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(r.epochs.size(), 2u);
  for (const SimEpochResult& e : r.epochs) {
    EXPECT_EQ(e.samples, 20000u);
    EXPECT_EQ(e.trainers, 8u);
    EXPECT_NEAR(e.tier_local + e.tier_peer + e.tier_storage, 1.0, 1e-9);
    EXPECT_GT(e.samples_per_s, 0);
    // 8 trainers at 2500 samples/s each: the compute bound.
    EXPECT_LE(e.samples_per_s, 8 * 2500.0 * (1 + 1e-9));
    EXPECT_GE(e.stall_fraction, 0);
    EXPECT_LT(e.stall_fraction, 1);
    EXPECT_GT(e.label_entropy_mean, 0.5);
    EXPECT_LE(e.label_entropy_mean, 1.0);
  }
  EXPECT_GT(r.metadata_bytes_per_node_max, 20000u * 12);  // at least the catalog's sizes and labels
  EXPECT_EQ(r.metadata_bytes_per_node_max, r.metadata_breakdown.total());
  EXPECT_GT(r.metadata_breakdown.schedulers, 0u);
  EXPECT_GT(r.plan_cpu_s_per_epoch_per_node_max, 0);
  EXPECT_GT(r.startup_modelled_s, 0);
  EXPECT_DOUBLE_EQ(r.startup_s, r.startup_modelled_s + r.setup_wall_s);
  EXPECT_GT(r.peak_rss_bytes, 0u);
  const std::string json = to_json(r);
  for (const char* key : {"\"nodes\":4", "\"trainers_per_node\":2", "\"samples\":20000", "\"exactly_once\":true",
                          "\"metadata_bytes_per_node_max\":", "\"plan_cpu_s_per_epoch_per_node_max\":",
                          "\"startup_s\":", "\"peak_rss_bytes\":", "\"wall_s\":", "\"epochs\":[{\"epoch\":0,",
                          "\"samples_per_s\":", "\"stall_fraction\":", "\"tier_local\":", "\"tier_peer\":",
                          "\"tier_storage\":", "\"label_entropy_mean\":"}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " missing in " << json;
  }
  EXPECT_EQ(json.find('\n'), std::string::npos);
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
}

TEST(SimulatorTest, NoExchangeMeansNoPeerReads) {
  const SimResult r = run(small({"shuffle.exchange_fraction=0"}));
  EXPECT_TRUE(r.exactly_once);
  for (const SimEpochResult& e : r.epochs) {
    EXPECT_EQ(e.tier_peer, 0.0);
    EXPECT_EQ(e.tier_local, 1.0);
  }
}

TEST(SimulatorTest, FullExchangeOnFourNodesReadsThreeQuartersFromPeers) {
  const SimResult r = run(small({"shuffle.exchange_fraction=1"}));
  EXPECT_TRUE(r.exactly_once);
  for (const SimEpochResult& e : r.epochs) EXPECT_NEAR(e.tier_peer, 0.75, 0.03);
}

TEST(SimulatorTest, AuditCatchesADuplicateDelivery) {
  SimHooks hooks;
  hooks.tamper_frame = [](std::uint32_t trainer, proto::BatchFrame& frame) {
    if (trainer == 3 && frame.epoch == 1 && frame.batch == 5 && frame.samples.size() >= 2) {
      frame.samples[1].sample_id = frame.samples[0].sample_id;
    }
  };
  const SimResult r = run(small(), hooks);
  EXPECT_FALSE(r.exactly_once);
  ASSERT_FALSE(r.audit_errors.empty());
  bool repeat = false;
  bool missing = false;
  for (const std::string& e : r.audit_errors) {
    repeat = repeat || (e.find("epoch 1") != std::string::npos && e.find("delivered again") != std::string::npos);
    missing = missing || e.find("never delivered") != std::string::npos;
  }
  EXPECT_TRUE(repeat);
  EXPECT_TRUE(missing);
}

TEST(SimulatorTest, AuditCatchesAMissingDelivery) {
  SimHooks hooks;
  hooks.tamper_frame = [](std::uint32_t trainer, proto::BatchFrame& frame) {
    if (trainer == 0 && frame.epoch == 0 && frame.batch == 0) frame.samples.pop_back();
  };
  const SimResult r = run(small(), hooks);
  EXPECT_FALSE(r.exactly_once);
  bool quota = false;
  bool missing = false;
  for (const std::string& e : r.audit_errors) {
    quota = quota || e.find("trainer 0 received") != std::string::npos;
    missing = missing || e.find("never delivered") != std::string::npos;
  }
  EXPECT_TRUE(quota);
  EXPECT_TRUE(missing);
}

TEST(SimulatorTest, DeadNodeDegradesToStorageAndSurvivorsStayExactlyOnce) {
  const SimResult r = run(small({"fault.peer_death=degrade", "fault.peer_timeout=100ms", "sim.fault_node=2",
                                 "sim.fault_time_s=0.5"}));
  EXPECT_TRUE(r.exactly_once) << (r.audit_errors.empty() ? r.error : r.audit_errors.front());
  EXPECT_TRUE(r.fault);
  EXPECT_DOUBLE_EQ(r.fault_detect_s, 0.6);
  EXPECT_GT(r.rerouted_samples, 0u);
  ASSERT_EQ(r.epochs.size(), 2u);
  for (const SimEpochResult& e : r.epochs) {
    EXPECT_EQ(e.trainers, 6u);
    EXPECT_EQ(e.samples, 15000u);  // the survivors' quotas
  }
  // The dead node's quarter of the samples comes from storage in the epoch after it died.
  EXPECT_NEAR(r.epochs[1].tier_storage, 0.25, 0.03);
}

TEST(SimulatorTest, DeadNodeWithStopPolicyStopsTheJob) {
  const SimResult r = run(small({"fault.peer_timeout=100ms", "sim.fault_node=1", "sim.fault_time_s=0.5"}));
  EXPECT_FALSE(r.exactly_once);
  EXPECT_NE(r.error.find("peer_death = stop"), std::string::npos) << r.error;
  EXPECT_LT(r.epochs.size(), 2u);
}

TEST(SimulatorTest, ColdSamplesComeFromStorageExactlyOnce) {
  const SimResult r = run(small({"cache.capacity=200MiB"}));
  EXPECT_TRUE(r.exactly_once) << (r.audit_errors.empty() ? r.error : r.audit_errors.front());
  for (const SimEpochResult& e : r.epochs) EXPECT_GT(e.tier_storage, 0.1);
}

TEST(SimulatorTest, WindowAndStragglersKeepExactlyOnce) {
  const SimResult r = run(small({"shuffle.window=64", "sim.straggler_fraction=0.25", "sim.straggler_factor=3",
                                 "sim.slow_link_node=1", "sim.slow_link_factor=20"}));
  EXPECT_TRUE(r.exactly_once) << (r.audit_errors.empty() ? r.error : r.audit_errors.front());
}

// Owner-side metadata (dataset.placement = spread, decision 0055): each simulated node holds
// its own shard and asks the owners for the rest, through the same scheduler code; the
// audit holds with cold samples, a window, stragglers and a dead node.
TEST(SimulatorTest, OwnerSideMetadataKeepsExactlyOnce) {
  for (const std::vector<std::string>& sets : std::vector<std::vector<std::string>>{
           {"dataset.placement=spread"},
           {"dataset.placement=spread", "cache.capacity=200MiB", "shuffle.window=64",
            "sim.straggler_fraction=0.25", "sim.straggler_factor=3"},
           {"dataset.placement=spread", "shuffle.exchange_fraction=0.2", "fault.peer_death=degrade",
            "fault.peer_timeout=100ms", "sim.fault_node=2", "sim.fault_time_s=0.5"}}) {
    const SimResult r = run(small(sets));
    EXPECT_TRUE(r.exactly_once) << sets.size() << ": " << (r.audit_errors.empty() ? r.error : r.audit_errors.front());
    EXPECT_EQ(r.placement, "spread");
    ASSERT_EQ(r.epochs.size(), 2u);
  }
  const SimResult cold = run(small({"dataset.placement=spread", "cache.capacity=200MiB"}));
  for (const SimEpochResult& e : cold.epochs) EXPECT_GT(e.tier_storage, 0.1);
}

// The scale property the owner-side directory exists for: at a fixed dataset the metadata a
// node holds falls as nodes are added; with the global catalog and placement it does not.
TEST(SimulatorTest, OwnerSideMetadataPerNodeFallsWithTheNodeCount) {
  const auto metadata = [](const char* placement, std::uint32_t nodes) {
    const SimResult r = run(small({std::string("dataset.placement=") + placement}, nodes, 2, 40000));
    EXPECT_TRUE(r.exactly_once) << placement << " " << nodes;
    return r.metadata_breakdown;
  };
  const NodeMetadataBytes spread4 = metadata("spread", 4);
  const NodeMetadataBytes spread16 = metadata("spread", 16);
  const NodeMetadataBytes global4 = metadata("balanced", 4);
  const NodeMetadataBytes global16 = metadata("balanced", 16);
  // The catalog part is the node's share (N/P entries): a quarter at four times the nodes.
  EXPECT_LT(spread16.catalog, spread4.catalog / 3) << spread4.catalog << " -> " << spread16.catalog;
  EXPECT_LT(spread16.total(), spread4.total() / 3) << spread4.total() << " -> " << spread16.total();
  EXPECT_LT(spread16.placement, 4096u);  // O(P) tables only
  EXPECT_GE(global16.catalog, global4.catalog);
  // The directory itself (catalog + placement parts): the node's share against every sample.
  EXPECT_GT(global16.catalog + global16.placement, 10 * (spread16.catalog + spread16.placement));
}

TEST(SimulatorTest, ASlowLinkStallsTheTrainers) {
  const std::vector<std::string> fast = {"sim.trainer_samples_per_s=100000"};
  std::vector<std::string> slow = fast;
  slow.push_back("sim.slow_link_node=1");
  slow.push_back("sim.slow_link_factor=100");
  const SimResult a = run(small(fast));
  const SimResult b = run(small(slow));
  ASSERT_EQ(a.epochs.size(), 2u);
  ASSERT_EQ(b.epochs.size(), 2u);
  EXPECT_GT(b.epochs[1].stall_fraction, a.epochs[1].stall_fraction + 0.1);
  EXPECT_LT(b.epochs[1].samples_per_s, a.epochs[1].samples_per_s);
}

TEST(SimulatorTest, SameInputsGiveTheSameSimulatedFigures) {
  const SimResult a = run(small({"shuffle.window=16"}));
  const SimResult b = run(small({"shuffle.window=16"}));
  ASSERT_EQ(a.epochs.size(), b.epochs.size());
  for (std::size_t i = 0; i < a.epochs.size(); ++i) {
    EXPECT_EQ(a.epochs[i].sim_seconds, b.epochs[i].sim_seconds);
    EXPECT_EQ(a.epochs[i].stall_fraction, b.epochs[i].stall_fraction);
    EXPECT_EQ(a.epochs[i].tier_peer, b.epochs[i].tier_peer);
  }
  EXPECT_EQ(a.events, b.events);
}

TEST(SimulatorTest, BadOptionsAreErrors) {
  SimOptions options = small({"sim.fault_node=4"});
  EXPECT_FALSE(run_simulation(options).ok());
  options = small({}, 4, 2, 7);  // fewer samples than trainers
  EXPECT_FALSE(run_simulation(options).ok());
}

TEST(SimConfigTest, UnknownSimKeyIsAnError) {
  auto config = load_config("", {}, {"dataset.path=/d", "sim.link_gbit=1"});
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("sim.link_gbit"), std::string::npos);
  auto env = load_config("", {{"SHARDMIX_SIM_STORAGE_IOPS", "500"}}, {"dataset.path=/d"});
  ASSERT_TRUE(env.ok()) << env.status().to_string();
  EXPECT_EQ(env->sim.storage_iops, 500.0);
  EXPECT_FALSE(load_config("", {}, {"dataset.path=/d", "sim.fault_node=-2"}).ok());
}

TEST(SyntheticCatalogTest, KeepsSizesAndLabelsWithoutPaths) {
  auto c = Catalog::synthetic({10, 20, 30}, {0, 0, 2});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->size(), 3u);
  EXPECT_EQ(c->total_bytes(), 60u);
  EXPECT_EQ(c->max_sample_bytes(), 30u);
  EXPECT_EQ(c->num_classes(), 2u);
  EXPECT_EQ(c->file_count(), 0u);
  EXPECT_TRUE(c->path(1).empty());
  EXPECT_EQ(c->location(1), "synthetic:1");
  EXPECT_FALSE(Catalog::synthetic({1, 2}, {1, 0}).ok());  // not in label order
  EXPECT_FALSE(Catalog::synthetic({1, 2}, {0}).ok());
  EXPECT_FALSE(Catalog::synthetic({1}, {-1}).ok());
}

TEST(SyntheticCatalogTest, AShardLayoutHoldsWhatARealShardCatalogHolds) {
  // 5 samples in shards of 2: the layout of a tfrecord/webdataset catalog.
  const std::vector<std::uint64_t> sizes{10, 20, 30, 40, 50};
  auto c = Catalog::synthetic(sizes, {0, 0, 1, 1, 2}, 2);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->sharded());
  EXPECT_EQ(c->file_count(), 3u);
  EXPECT_EQ(c->shard(3), 1u);
  EXPECT_EQ(c->offset(3), 30u);  // after sample 2 in shard 1
  EXPECT_EQ(c->path(4), "synthetic-00000002");
  // The same samples scanned from real shards of those names take the same memory, so the
  // simulator's metadata figure is the daemons' for the same job.
  std::vector<std::string> shards{"synthetic-00000000", "synthetic-00000001", "synthetic-00000002"};
  std::vector<CatalogEntry> entries;
  const std::int32_t labels[] = {0, 0, 1, 1, 2};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    entries.push_back(CatalogEntry{"", sizes[i], labels[i], static_cast<std::uint32_t>(i / 2), c->offset(i)});
  }
  auto real = Catalog::from_shard_entries(shards, entries, {});
  ASSERT_TRUE(real.ok()) << real.status().to_string();
  EXPECT_EQ(real->size(), c->size());
  EXPECT_EQ(real->memory_bytes(), c->memory_bytes());
}

}  // namespace
}  // namespace shardmix::sim

namespace shardmix::sim {
namespace {

// sim.service_us_per_sample: each node serves its trainers' samples one after another, so
// a node delivers at most 1e6 / cost samples per second, whatever the trainers could take.
TEST(SimulatorServiceCpuTest, ServiceCostBoundsEachNode) {
  const SimResult free = run(small());
  const SimResult costly = run(small({"sim.service_us_per_sample=1000"}));
  EXPECT_TRUE(costly.exactly_once) << (costly.audit_errors.empty() ? costly.error : costly.audit_errors.front());
  ASSERT_EQ(costly.epochs.size(), free.epochs.size());
  for (std::size_t e = 0; e < costly.epochs.size(); ++e) {
    // 4 nodes x 1000 samples/s; the trainers alone would take 8 x 2500.
    EXPECT_LE(costly.epochs[e].samples_per_s, 4 * 1000.0 * (1 + 1e-9));
    EXPECT_GT(costly.epochs[e].samples_per_s, 0.8 * 4 * 1000.0);
    EXPECT_GT(costly.epochs[e].stall_fraction, 0.5);
    EXPECT_GT(free.epochs[e].samples_per_s, 2 * costly.epochs[e].samples_per_s);
    EXPECT_DOUBLE_EQ(costly.epochs[e].tier_local, free.epochs[e].tier_local);
  }
}

}  // namespace
}  // namespace shardmix::sim
