// The trainer's rank and world size come from whichever launcher started it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

#include "client/client.h"

namespace shardmix {
namespace launcher_rank_test {

// Every variable detect_launcher_rank reads, cleared around each test.
const char* const kVars[] = {"SHARDMIX_RANK",          "SHARDMIX_WORLD_SIZE",        "SHARDMIX_LOCAL_RANK",
                             "SHARDMIX_LOCAL_SIZE",    "OMPI_COMM_WORLD_RANK",       "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_APP_CTX_NUM_PROCS",
                             "OMPI_MCA_orte_app_num",  "PMI_RANK",                   "PMI_SIZE",
                             "MPI_LOCALRANKID",        "MPI_LOCALNRANKS",            "SLURM_PROCID",
                             "SLURM_NTASKS",           "SLURM_LOCALID",              "SLURM_NNODES",
                             "RANK",                   "WORLD_SIZE",                 "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE"};

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
  static void set_all(std::initializer_list<std::pair<const char*, const char*>> variables) {
    for (const auto& [name, value] : variables) set(name, value);
  }
  // detect_launcher_rank() finds rank of world_size, read from `source` when one is given.
  static void expect_rank(int rank, int world_size, const std::string& source = "") {
    const LauncherRank r = detect_launcher_rank();
    EXPECT_EQ(r.rank, rank);
    EXPECT_EQ(r.world_size, world_size);
    if (!source.empty()) EXPECT_EQ(r.source, source);
  }
  // `r` places this trainer at rank, local rank of local_size per node, on `nodes` nodes.
  static void expect_place(const LauncherRank& r, int rank, int local_rank, int local_size, int nodes) {
    EXPECT_EQ(r.rank, rank);
    EXPECT_EQ(r.local_rank, local_rank);
    EXPECT_EQ(r.local_size, local_size);
    EXPECT_EQ(r.nodes, nodes);
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST_F(LauncherRankTest, NoLauncherMeansRankZeroOfOne) { expect_rank(0, 1, "default"); }

TEST_F(LauncherRankTest, OpenMpi) {
  set_all({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}});
  expect_rank(5, 8, "OMPI_COMM_WORLD_RANK");
}

TEST_F(LauncherRankTest, Slurm) {
  set_all({{"SLURM_PROCID", "17"}, {"SLURM_NTASKS", "64"}});
  expect_rank(17, 64);
}

TEST_F(LauncherRankTest, Torchrun) {
  set_all({{"RANK", "3"}, {"WORLD_SIZE", "4"}});
  expect_rank(3, 4);
}

TEST_F(LauncherRankTest, Pmi) {
  set_all({{"PMI_RANK", "2"}, {"PMI_SIZE", "6"}});
  EXPECT_EQ(detect_launcher_rank().rank, 2);
}

TEST_F(LauncherRankTest, ExplicitSettingWinsOverTheLauncher) {
  set_all({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"SHARDMIX_RANK", "1"},
           {"SHARDMIX_WORLD_SIZE", "4"}});
  expect_rank(1, 4, "SHARDMIX_RANK");
}

TEST_F(LauncherRankTest, MpirunInsideSlurmUsesMpisNumbering) {
  // srun-launched mpirun jobs carry both; the MPI rank is the trainer's rank.
  set_all({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "8"}});
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

TEST_F(LauncherRankTest, OpenMpiLocalRankAndSize) {
  set("OMPI_COMM_WORLD_RANK", "5");
  set("OMPI_COMM_WORLD_SIZE", "8");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  set("OMPI_APP_CTX_NUM_PROCS", "8");  // one app context: not MPMD
  const LauncherRank r = detect_launcher_rank();
  expect_place(r, 5, 1, 4, 2);
}

TEST_F(LauncherRankTest, OpenMpiMpmdCountsOnlyThisAppsRanks) {
  // mpirun -np 2 shardmixd : -np 4 ./train  -> the trainers are world ranks 2..5 of 6.
  set_all({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "6"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "4"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "6"}, {"OMPI_APP_CTX_NUM_PROCS", "2 4"}, {"OMPI_MCA_orte_app_num", "1"}});
  const LauncherRank r = detect_launcher_rank();
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.local_rank, -1);  // the node's local ranks mix daemons and trainers
  EXPECT_EQ(r.local_size, -1);
  EXPECT_NE(r.source.find("MPMD"), std::string::npos) << r.source;
}

TEST_F(LauncherRankTest, SlurmLocalIdAndNodes) {
  set_all({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}, {"SLURM_NNODES", "2"}});
  const LauncherRank r = detect_launcher_rank();
  expect_place(r, 6, 2, 4, 2);
  EXPECT_EQ(r.describe(), "8 trainers (rank 6, local rank 2 of 4 per node, 2 nodes; from SLURM_PROCID)");
}

TEST_F(LauncherRankTest, TorchrunLocalRankAndSize) {
  set_all({{"RANK", "7"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"}});
  const LauncherRank r = detect_launcher_rank();
  expect_place(r, 7, 3, 4, 4);
}

TEST_F(LauncherRankTest, HydraLocalRank) {
  set_all({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  const LauncherRank r = detect_launcher_rank();
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 2);
}

TEST_F(LauncherRankTest, ARankOutsideTheWorldIsIgnored) {
  set_all({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}});
  EXPECT_EQ(detect_launcher_rank().source, "default");
}

// The layout check runs before any socket is touched: a ready file is enough.
class LayoutCheckTest : public LauncherRankTest {
 protected:
  void SetUp() override {
    LauncherRankTest::SetUp();
    dir_ = ::testing::TempDir() + "/layout-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    // 2 daemons, both on this host (an emulated cluster), 2 trainers each.
    std::ofstream(dir_ + "/ready") << "daemons=2\ntrainers_per_node=2\nhost.0=" << host << "\nhost.1=" << host
                                   << "\n";
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    LauncherRankTest::TearDown();
  }
  Status connect_error() {
    ClientOptions o;
    o.run_dir = dir_;
    o.ready_timeout_s = 5;
    auto c = Client::try_connect(o);
    return c.ok() ? Status::ok_status() : c.status();
  }
  Status connect_error_default_timeout() {
    ClientOptions o;
    o.run_dir = dir_;
    auto c = Client::try_connect(o);
    return c.ok() ? Status::ok_status() : c.status();
  }
  std::string dir_;
};

TEST_F(LayoutCheckTest, AWrongWorldSizeNamesBothLayouts) {
  set_all({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "6"}});
  const Status s = connect_error();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("6 trainers (rank 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("from SLURM_PROCID"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("2 nodes x service.trainers_per_node 2 = 4 trainers"), std::string::npos) << s.message();
}

TEST_F(LayoutCheckTest, AWrongNumberOfTrainersOnThisHostIsRefused) {
  set("RANK", "1");
  set("WORLD_SIZE", "4");
  set("LOCAL_RANK", "0");
  set("LOCAL_WORLD_SIZE", "1");  // 4 nodes of 1, but 2 daemons x 2 trainers run on this host
  const Status s = connect_error();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("local rank 0 of 1 per node, 4 nodes"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("(4 on this host"), std::string::npos) << s.message();
}

TEST_F(LayoutCheckTest, LauncherNodesAreTheDaemonsNodesWhenTheyCountTheSame) {
  // srun over 2 (emulated) nodes with 2 tasks each, both daemons on this host: fine...
  set_all({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NNODES", "2"}});
  EXPECT_EQ(connect_error().code(), StatusCode::kUnavailable);  // past the check: no daemon listens
  // ... but on 1 node of 4 tasks (this host, both daemons), rank 3 must be local rank 3.
  set("SLURM_NNODES", "1");
  const Status s = connect_error();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("wrong node"), std::string::npos) << s.message();
}

TEST_F(LayoutCheckTest, ATrainerMappedToTheWrongNodeIsRefused) {
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "2");  // round-robin mapping: rank 1 is local rank 2
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  const Status s = connect_error();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("wrong node"), std::string::npos) << s.message();
}

TEST_F(LayoutCheckTest, AMatchingLayoutGetsPastTheCheck) {
  set_all({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  const Status s = connect_error();  // no daemon listens: the connect itself fails
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("d1.sock"), std::string::npos) << s.message();
}

TEST_F(LayoutCheckTest, ConnectTimeoutFromTheEnvironment) {
  std::filesystem::remove(dir_ + "/ready");
  set("SHARDMIX_CONNECT_TIMEOUT", "0");
  const Status s = connect_error_default_timeout();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("within 0 s"), std::string::npos) << s.message();
  ::unsetenv("SHARDMIX_CONNECT_TIMEOUT");
}

// A timeout from the environment that is neither seconds nor a duration is an error naming
// the variable, not a silent fallback to the default.
TEST_F(LayoutCheckTest, AnUnreadableTimeoutInTheEnvironmentIsAnErrorNamingIt) {
  for (const char* name : {"SHARDMIX_CONNECT_TIMEOUT", "SHARDMIX_RECEIVE_TIMEOUT", "SHARDMIX_PROGRESS_TIMEOUT"}) {
    SCOPED_TRACE(name);
    set(name, "soon");
    Status s = connect_error_default_timeout();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(std::string(name) + "=soon: not seconds or a duration"), std::string::npos)
        << s.message();
    set(name, "1000000");  // beyond what poll's int milliseconds can hold
    s = connect_error_default_timeout();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("more than a day"), std::string::npos) << s.message();
    ::unsetenv(name);
  }
}

}  // namespace launcher_rank_test
}  // namespace shardmix
