// Loading owned samples into the arena, and what happens when storage changed since the scan.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cstring>
#include <map>
#include <numeric>

#include "common/rng.h"
#include "server/cache_loader.h"

namespace shardmix {
namespace cache_loader_test {
namespace fs = std::filesystem;

class CacheLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("loader-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "a");
    fs::create_directories(root_ / "b");
    Rng rng(1);
    for (int i = 0; i < 40; ++i) {
      const std::string rel = std::string(i % 2 ? "a" : "b") + "/f " + std::to_string(i) + "é.bin";
      std::string bytes(i == 7 ? 0 : 1 + rng.below(3000), '\0');
      for (auto& c : bytes) c = static_cast<char>(rng.below(256));
      std::ofstream(root_ / rel, std::ios::binary) << bytes;
      entries_.push_back({rel, bytes.size(), i % 2});
      contents_[rel] = bytes;
    }
    catalog_ = std::move(Catalog::from_entries(entries_, {"a", "b"}).value());
    shape_ = make_plan_shape(catalog_.size(), JobShape{2, 1, 4, false});
    placement_ = make_placement(catalog_.sizes(), shape_, PlacementPolicy::kBalanced, 3);
    dataset_.path = root_.string();
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path root_;
  std::vector<CatalogEntry> entries_;
  std::map<std::string, std::string> contents_;
  Catalog catalog_;
  PlanShape shape_;
  Placement placement_;
  DatasetConfig dataset_;
};

TEST_F(CacheLoaderTest, LoadsEveryOwnedSampleAtItsOffset) {
  for (std::uint32_t node = 0; node < 2; ++node) {
    std::vector<std::uint8_t> arena(placement_.arena_bytes[node] + 1);
    auto stats = load_owned_samples(catalog_, placement_, node, dataset_, 3, arena.data());
    ASSERT_TRUE(stats.ok()) << stats.status().to_string();
    EXPECT_EQ(stats->samples, placement_.owned[node].size());
    EXPECT_EQ(stats->bytes, placement_.sample_bytes[node]);
    for (SampleId id : placement_.owned[node]) {
      const std::string& want = contents_[std::string(catalog_.path(id))];
      ASSERT_EQ(0, std::memcmp(want.data(), arena.data() + placement_.arena_offset[id], want.size()));
    }
  }
}

TEST_F(CacheLoaderTest, AFileThatShrankSinceTheScanIsAnErrorNamingFileAndOffset) {
  const SampleId victim = placement_.owned[0].front() == 7 ? placement_.owned[0][1] : placement_.owned[0].front();
  const fs::path file = root_ / std::string(catalog_.path(victim));
  fs::resize_file(file, catalog_.sample_bytes(victim) / 2);
  std::vector<std::uint8_t> arena(placement_.arena_bytes[0] + 1);
  auto stats = load_owned_samples(catalog_, placement_, 0, dataset_, 2, arena.data());
  ASSERT_FALSE(stats.ok());
  const std::string msg = stats.status().message();
  EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("shrank"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(catalog_.sample_bytes(victim) / 2)), std::string::npos) << msg;
}

TEST_F(CacheLoaderTest, AFileThatGrewOrVanishedIsAnErrorNamingIt) {
  const SampleId grown = placement_.owned[1].front();
  std::ofstream(root_ / std::string(catalog_.path(grown)), std::ios::app) << "more";
  std::vector<std::uint8_t> arena(placement_.arena_bytes[1] + 1);
  auto stats = load_owned_samples(catalog_, placement_, 1, dataset_, 1, arena.data());
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("changed size"), std::string::npos) << stats.status().message();

  fs::remove(root_ / std::string(catalog_.path(grown)));
  stats = load_owned_samples(catalog_, placement_, 1, dataset_, 1, arena.data());
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), StatusCode::kNotFound);
  EXPECT_NE(stats.status().message().find(std::string(catalog_.path(grown))), std::string::npos);
}

}  // namespace cache_loader_test
}  // namespace shardmix
