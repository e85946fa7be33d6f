// The trainer's rank and world size come from whichever launcher started it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "client/client.h"

namespace shardmix {
namespace {

// Every variable detect_launcher_rank reads, cleared around each test.
const char* const kVars[] = {"SHARDMIX_RANK", "SHARDMIX_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "PMI_RANK",      "PMI_SIZE",            "SLURM_PROCID",         "SLURM_NTASKS",
                             "RANK",          "WORLD_SIZE"};

class LauncherRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      ::unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char* v : kVars) ::unsetenv(v);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }
  static void set(const char* name, const char* value) { ::setenv(name, value, 1); }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(LauncherRankTest, NoLauncherMeansRankZeroOfOne) {
  const LauncherRank r = detect_launcher_rank();
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.source, "default");
}

TEST_F(LauncherRankTest, OpenMpi) {
  set("OMPI_COMM_WORLD_RANK", "5");
  set("OMPI_COMM_WORLD_SIZE", "8");
  const LauncherRank r = detect_launcher_rank();
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.source, "OMPI_COMM_WORLD_RANK");
}

TEST_F(LauncherRankTest, Slurm) {
  set("SLURM_PROCID", "17");
  set("SLURM_NTASKS", "64");
  const LauncherRank r = detect_launcher_rank();
  EXPECT_EQ(r.rank, 17);
  EXPECT_EQ(r.world_size, 64);
}

TEST_F(LauncherRankTest, Torchrun) {
  set("RANK", "3");
  set("WORLD_SIZE", "4");
  const LauncherRank r = detect_launcher_rank();
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world_size, 4);
}

TEST_F(LauncherRankTest, Pmi) {
  set("PMI_RANK", "2");
  set("PMI_SIZE", "6");
  EXPECT_EQ(detect_launcher_rank().rank, 2);
}

TEST_F(LauncherRankTest, ExplicitSettingWinsOverTheLauncher) {
  set("OMPI_COMM_WORLD_RANK", "0");
  set("OMPI_COMM_WORLD_SIZE", "1");
  set("SHARDMIX_RANK", "1");
  set("SHARDMIX_WORLD_SIZE", "4");
  const LauncherRank r = detect_launcher_rank();
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.source, "SHARDMIX_RANK");
}

TEST_F(LauncherRankTest, MpirunInsideSlurmUsesMpisNumbering) {
  // srun-launched mpirun jobs carry both; the MPI rank is the trainer's rank.
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "1");
  set("OMPI_COMM_WORLD_RANK", "6");
  set("OMPI_COMM_WORLD_SIZE", "8");
  EXPECT_EQ(detect_launcher_rank().rank, 6);
}

TEST_F(LauncherRankTest, AHalfSetOrMalformedPairIsIgnored) {
  set("OMPI_COMM_WORLD_RANK", "3");  // size missing
  set("SLURM_PROCID", "x1");         // not a number
  set("SLURM_NTASKS", "4");
  set("RANK", "2");
  set("WORLD_SIZE", "4");
  const LauncherRank r = detect_launcher_rank();
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.source, "RANK");
}

}  // namespace
}  // namespace shardmix
