#include "common/config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace shardmix {
namespace config_test {

namespace fs = std::filesystem;
using Env = std::map<std::string, std::string>;
using Sets = std::vector<std::string>;

std::uint64_t physical_ram() {
  return static_cast<std::uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

class ConfigTest : public test_support::TempDirTest {
 protected:
  ConfigTest() : TempDirTest("config") {}
};

std::string error_of(const Result<Config>& r) { return r.ok() ? std::string("<ok>") : r.status().message(); }

// The load failed with an error that says `what`.
void expect_error(const Result<Config>& r, std::string_view what) {
  ASSERT_FALSE(r.ok()) << "loaded, but expected an error saying: " << what;
  EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
}

TEST_F(ConfigTest, DefaultsInTheTableMatchTheStruct) {
  auto config = load_config("", {}, {"dataset.path=/data/x"});
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  Config expected;
  expected.dataset.path = "/data/x";
  expected.cache.capacity_bytes = static_cast<std::uint64_t>(std::floor(0.8 * static_cast<double>(physical_ram())));
  EXPECT_EQ(*config, expected);
  EXPECT_EQ(config->cache.capacity_text, "0.8");
}

TEST_F(ConfigTest, ParsesEveryTypeFromAFile) {
  const std::string file = write("c.toml", R"(
[dataset]
path = "/gpfs/imagenet/train"
format = "filelist"
placement = "sorted"
max_sample_bytes = "8MiB"

[batch]
size = 256
drop_last = true

[shuffle]
seed = 0x2a
exchange_fraction = 0.25
window = 0

[cache]
capacity = "1.5GiB"

[fabric]
provider = "tcp"
interface = "lo"
max_outstanding_reads = 16

[service]
run_dir = "/tmp/smx run"
trainers_per_node = 4
prefetch = 2
staging_bytes_per_trainer = 1048576
loader_threads = 8

[log]
level = "debug"
)");
  auto c = load_config(file, {}, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->dataset.path, "/gpfs/imagenet/train");
  EXPECT_EQ(c->dataset.format, DatasetFormat::kFileList);
  EXPECT_EQ(c->dataset.placement, PlacementPolicy::kSorted);
  EXPECT_EQ(c->dataset.max_sample_bytes, 8u << 20);
  EXPECT_EQ(c->batch.size, 256u);
  EXPECT_TRUE(c->batch.drop_last);
  EXPECT_EQ(c->shuffle.seed, 42u);
  EXPECT_DOUBLE_EQ(c->shuffle.exchange_fraction, 0.25);
  EXPECT_EQ(c->shuffle.window, 0u);
  EXPECT_EQ(c->cache.capacity_bytes, 1610612736u);
  EXPECT_EQ(c->cache.capacity_text, "1.5GiB");
  EXPECT_EQ(c->fabric.provider, "tcp");
  EXPECT_EQ(c->fabric.interface, "lo");
  EXPECT_EQ(c->fabric.max_outstanding_reads, 16u);
  EXPECT_EQ(c->service.run_dir, "/tmp/smx run");
  EXPECT_EQ(c->service.trainers_per_node, 4u);
  EXPECT_EQ(c->service.prefetch, 2u);
  EXPECT_EQ(c->service.staging_bytes_per_trainer, 1048576u);
  EXPECT_EQ(c->service.loader_threads, 8u);
  EXPECT_EQ(c->log.level, "debug");
}

TEST_F(ConfigTest, UnknownKeyInFileIsAnErrorNamingKeyAndFile) {
  const std::string file = write("typo.toml", "[dataset]\npath = \"/d\"\n[batch]\nsise = 3\n");
  auto c = load_config(file, {}, {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(error_of(c).find("unknown config key 'batch.sise' in " + file), std::string::npos) << error_of(c);
  EXPECT_NE(error_of(c).find(":4"), std::string::npos) << error_of(c);  // the line
  EXPECT_NE(error_of(c).find("did you mean 'batch.size'"), std::string::npos) << error_of(c);
}

TEST_F(ConfigTest, UnknownSectionAndTopLevelKeysAreErrors) {
  auto c = load_config(write("s.toml", "[datset]\npath = \"/d\"\n"), {}, {});
  EXPECT_NE(error_of(c).find("unknown config key 'datset'"), std::string::npos) << error_of(c);
  EXPECT_NE(error_of(c).find("did you mean 'dataset'"), std::string::npos) << error_of(c);
  c = load_config(write("t.toml", "size = 3\n"), {}, {});
  EXPECT_NE(error_of(c).find("unknown config key 'size'"), std::string::npos) << error_of(c);
  c = load_config(write("u.toml", "dataset = 3\n"), {}, {});
  EXPECT_NE(error_of(c).find("must be a table"), std::string::npos) << error_of(c);
  c = load_config(write("v.toml", "[batch.inner]\nx = 1\n"), {}, {});
  EXPECT_NE(error_of(c).find("'batch.inner'"), std::string::npos) << error_of(c);
}

TEST_F(ConfigTest, WrongTypeNamesKeyExpectedTypeAndValue) {
  struct Case {
    std::string toml, key, expected_type, value;
  };
  const std::vector<Case> cases = {
      {"[batch]\nsize = \"abc\"", "batch.size", "uint", "abc"},
      {"[batch]\nsize = -4", "batch.size", "uint", "-4"},
      {"[batch]\nsize = 5000000000", "batch.size", "uint", "5000000000"},
      {"[batch]\ndrop_last = 1", "batch.drop_last", "bool", "1"},
      {"[shuffle]\nexchange_fraction = \"half\"", "shuffle.exchange_fraction", "double", "half"},
      {"[dataset]\nformat = \"tar\"", "dataset.format", "enum", "tar"},
      {"[dataset]\nmax_sample_bytes = 1.5", "dataset.max_sample_bytes", "size", "1.5"},
      {"[dataset]\npath = 7", "dataset.path", "string", "7"},
      {"[fabric]\nprovider = [\"tcp\"]", "fabric.provider", "string", "tcp"},
      {"[cache]\ncapacity = true", "cache.capacity", "size or fraction", "true"},
  };
  for (const Case& tc : cases) {
    auto c = load_config(write("w.toml", tc.toml + "\n"), {}, {"dataset.path=/d"});
    ASSERT_FALSE(c.ok()) << tc.toml;
    const std::string msg = error_of(c);
    EXPECT_NE(msg.find("'" + tc.key + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("type " + tc.expected_type), std::string::npos) << msg;
    EXPECT_NE(msg.find(tc.value), std::string::npos) << msg;
    EXPECT_NE(msg.find("w.toml"), std::string::npos) << msg;
  }
}

// The range in a type error starts at the key's own minimum, and a duration's minimum is
// said with a unit, not in the microseconds it is stored as.
TEST_F(ConfigTest, RangeErrorsSayTheKeysOwnMinimumInItsUnit) {
  auto c = load_config(write("r.toml", "[batch]\nsize = \"abc\"\n"), {}, {"dataset.path=/d"});
  expect_error(c, "an integer in 1..4294967295");
  c = load_config("", {}, {"dataset.path=/d", "telemetry.interval=500us"});
  expect_error(c, "'telemetry.interval' must be at least 1ms, got 500us");
}

TEST_F(ConfigTest, BadTomlAndMissingFile) {
  auto c = load_config(write("bad.toml", "[batch]\nsize = = 3\n"), {}, {});
  expect_error(c, "bad.toml:2:");
  c = load_config((dir_ / "nope.toml").string(), {}, {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(error_of(c).find("nope.toml"), std::string::npos);
}

TEST_F(ConfigTest, PrecedenceDefaultsFileEnvSet) {
  const std::string file = write("p.toml", "[dataset]\npath = \"/file\"\n[batch]\nsize = 64\n[shuffle]\nseed = 1\n");
  auto c = load_config(file, {}, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->batch.size, 64u);
  EXPECT_EQ(c->service.prefetch, 4u);  // default

  const Env env = {{"SHARDMIX_BATCH_SIZE", "128"}, {"SHARDMIX_SERVICE_PREFETCH", "16"}, {"HOME", "/root"}};
  c = load_config(file, env, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->batch.size, 128u);     // env beats file
  EXPECT_EQ(c->service.prefetch, 16u);  // env beats default
  EXPECT_EQ(c->shuffle.seed, 1u);     // file beats default

  c = load_config(file, env, {"batch.size=256", "dataset.path=/set path"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->batch.size, 256u);  // --set beats env
  EXPECT_EQ(c->dataset.path, "/set path");
  EXPECT_EQ(c->service.prefetch, 16u);

  // Later --set wins over an earlier one.
  c = load_config(file, env, {"batch.size=2", "batch.size=3"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->batch.size, 3u);
}

TEST_F(ConfigTest, EnvAndSetValuesAreParsedByType) {
  const Env env = {{"SHARDMIX_DATASET_PATH", "/env"},
                   {"SHARDMIX_BATCH_DROP_LAST", "yes"},
                   {"SHARDMIX_SHUFFLE_EXCHANGE_FRACTION", "0.5"},
                   {"SHARDMIX_DATASET_MAX_SAMPLE_BYTES", "1MiB"},
                   {"SHARDMIX_DATASET_FORMAT", "filelist"},
                   {"SHARDMIX_CACHE_CAPACITY", "512MB"},
                   {"SHARDMIX_LOG_LEVEL", "warn"}};
  auto c = load_config("", env, {"shuffle.seed=0xff", "service.staging_bytes_per_trainer=2 GiB"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->dataset.path, "/env");
  EXPECT_TRUE(c->batch.drop_last);
  EXPECT_DOUBLE_EQ(c->shuffle.exchange_fraction, 0.5);
  EXPECT_EQ(c->dataset.max_sample_bytes, 1u << 20);
  EXPECT_EQ(c->dataset.format, DatasetFormat::kFileList);
  EXPECT_EQ(c->cache.capacity_bytes, 512000000u);
  EXPECT_EQ(c->log.level, "warn");  // SHARDMIX_LOG_LEVEL is also log.level's env name
  EXPECT_EQ(c->shuffle.seed, 255u);
  EXPECT_EQ(c->service.staging_bytes_per_trainer, 2ull << 30);

  c = load_config("", {{"SHARDMIX_BATCH_SIZE", "many"}}, {"dataset.path=/d"});
  expect_error(c, "'batch.size' in environment variable SHARDMIX_BATCH_SIZE");
  EXPECT_NE(error_of(c).find("many"), std::string::npos);
}

TEST_F(ConfigTest, UnknownShardmixEnvVarsAreErrorsExceptTheAllowlist) {
  auto c = load_config("", {{"SHARDMIX_BATCH_SISE", "3"}}, {"dataset.path=/d"});
  expect_error(c, "SHARDMIX_BATCH_SISE");
  EXPECT_NE(error_of(c).find("SHARDMIX_BATCH_SIZE (for batch.size)"), std::string::npos) << error_of(c);

  c = load_config("", {{"SHARDMIX_SERVICE_PREFECH", "3"}}, {"dataset.path=/d"});  // section prefix
  expect_error(c, "SHARDMIX_SERVICE_PREFETCH (for service.prefetch)");
  c = load_config("", {{"SHARDMIX_BATHC_SIZE", "3"}}, {"dataset.path=/d"});  // near miss of a key
  EXPECT_FALSE(c.ok());
  c = load_config("", {{"SHARDMIX_LOG_FILE", "/x"}}, {"dataset.path=/d"});
  EXPECT_FALSE(c.ok());

  // SHARDMIX_* names of other tools (deploy/launch.sh) that do not look like keys pass.
  c = load_config("",
                  {{"SHARDMIX_READY_TIMEOUT", "60"}, {"SHARDMIX_DAEMON_CMD", "x"}, {"SHARDMIX_BUILD_DIR", "/b"},
                   {"SHARDMIX_MPIRUN_FLAGS", "--bind-to none"}},
                  {"dataset.path=/d"});
  EXPECT_TRUE(c.ok()) << c.status().to_string();

  Env allowed;
  for (std::string_view name : kNonConfigEnvVars) allowed[std::string(name)] = "1";
  allowed["SHARDMIX_LOG_LEVEL"] = "error";
  allowed["NOT_SHARDMIX_BATCH_SIZE"] = "x";  // other prefixes are not ours
  c = load_config("", allowed, {"dataset.path=/d"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->log.level, "error");
  EXPECT_EQ(c->service.run_dir, "");  // SHARDMIX_RUN_DIR is not service.run_dir
}

TEST_F(ConfigTest, SetErrors) {
  auto c = load_config("", {}, {"dataset.path=/d", "batch.sise=4"});
  expect_error(c, "unknown config key 'batch.sise' in --set batch.sise=4");
  c = load_config("", {}, {"dataset.path"});
  expect_error(c, "section.key=value");
  c = load_config("", {}, {"dataset.path=/d", "batch.drop_last=maybe"});
  expect_error(c, "'batch.drop_last' in --set batch.drop_last=maybe");
}

TEST_F(ConfigTest, ValidationNamesKeyAndSource) {
  struct Case {
    Env env;
    Sets sets;
    std::string key, source;
  };
  const std::vector<Case> cases = {
      {{}, {}, "dataset.path", "not set"},
      {{{"SHARDMIX_DATASET_PATH", ""}}, {}, "dataset.path", "SHARDMIX_DATASET_PATH"},
      {{{"SHARDMIX_BATCH_SIZE", "0"}}, {"dataset.path=/d"}, "batch.size", "SHARDMIX_BATCH_SIZE"},
      {{}, {"dataset.path=/d", "shuffle.exchange_fraction=1.5"}, "shuffle.exchange_fraction", "--set"},
      {{}, {"dataset.path=/d", "shuffle.exchange_fraction=-0.1"}, "shuffle.exchange_fraction", "--set"},
      {{}, {"dataset.path=/d", "shuffle.exchange_fraction=nan"}, "shuffle.exchange_fraction", "--set"},
      {{}, {"dataset.path=/d", "service.prefetch=0"}, "service.prefetch", "--set"},
      {{}, {"dataset.path=/d", "service.trainers_per_node=0"}, "service.trainers_per_node", "--set"},
      {{}, {"dataset.path=/d", "fabric.max_outstanding_reads=0"}, "fabric.max_outstanding_reads", "--set"},
      {{}, {"dataset.path=/d", "dataset.format=tar"}, "dataset.format", "--set"},
      {{}, {"dataset.path=/d", "dataset.placement=random"}, "dataset.placement", "--set"},
      {{}, {"dataset.path=/d", "log.level=loud"}, "log.level", "--set"},
      {{}, {"dataset.path=/d", "dataset.max_sample_bytes=0"}, "dataset.max_sample_bytes", "--set"},
      {{}, {"dataset.path=/d", "service.staging_bytes_per_trainer=0KiB"}, "service.staging_bytes_per_trainer",
       "--set"},
      {{}, {"dataset.path=/d", "fabric.provider="}, "fabric.provider", "--set"},
      {{}, {"dataset.path=/d", "shuffle.seed=9223372036854775808"}, "shuffle.seed", "--set"},
  };
  for (const Case& tc : cases) {
    auto c = load_config("", tc.env, tc.sets);
    ASSERT_FALSE(c.ok()) << tc.key;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(error_of(c).find("'" + tc.key + "'"), std::string::npos) << error_of(c);
    EXPECT_NE(error_of(c).find(tc.source), std::string::npos) << error_of(c);
  }
  // A value from the file that is later overridden is not validated.
  const std::string file = write("v.toml", "[batch]\nsize = 0\n");
  auto c = load_config(file, {}, {"dataset.path=/d", "batch.size=1"});
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  c = load_config(file, {}, {"dataset.path=/d"});
  expect_error(c, "v.toml:2");
  // The largest seed TOML can hold is accepted.
  c = load_config("", {}, {"dataset.path=/d", "shuffle.seed=9223372036854775807"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->shuffle.seed, 9223372036854775807ull);
}

TEST(ConfigSizeTest, ParsesUnits) {
  const std::vector<std::pair<std::string, std::uint64_t>> good = {
      {"0", 0},
      {"4096", 4096},
      {"8KiB", 8192},
      {"8kib", 8192},
      {"8 KiB", 8192},
      {"2KB", 2000},
      {"512MB", 512000000},
      {"2MiB", 2u << 20},
      {"8GiB", 8ull << 30},
      {"1.5GiB", 1610612736},
      {"0.5KiB", 512},
      {"1.3KiB", 1331},  // rounded down to whole bytes
      {"3GB", 3000000000},
      {"2TiB", 2ull << 40},
      {"17B", 17},
      {" 64MiB ", 64u << 20},
  };
  for (const auto& [text, bytes] : good) {
    auto r = parse_size(text, "k.x");
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().to_string();
    EXPECT_EQ(*r, bytes) << text;
  }
  for (const std::string bad : {"", "abc", "-1", "1.5.5GiB", "8XB", "16EiB", "99999999999TiB",
                                "18446744073709551616", "9223372036854775808", "8388608TiB", ".", "GiB", "1e3"}) {
    auto r = parse_size(bad, "dataset.max_sample_bytes");
    ASSERT_FALSE(r.ok()) << "'" << bad << "' parsed as " << *r;
    EXPECT_NE(r.status().message().find("dataset.max_sample_bytes"), std::string::npos);
  }
  // The largest: a TOML integer's, so that any size prints into a config that loads again.
  auto max = parse_size("9223372036854775807", "k");
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(*max, static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
}

TEST_F(ConfigTest, CapacityAcceptsBytesSizesAndFractions) {
  const std::uint64_t ram = physical_ram();
  ASSERT_GT(ram, 0u);
  struct Case {
    std::string toml_value;
    std::uint64_t bytes;
    std::string text;
  };
  const std::vector<Case> cases = {
      {"0.5", static_cast<std::uint64_t>(std::floor(0.5 * static_cast<double>(ram))), "0.5"},
      {"1.0", ram, "1.0"},
      {"1e-1", static_cast<std::uint64_t>(std::floor(0.1 * static_cast<double>(ram))), "0.1"},
      {"\"0.25\"", static_cast<std::uint64_t>(std::floor(0.25 * static_cast<double>(ram))), "0.25"},
      {"1", 1, "1"},  // an integer is bytes, not "all of RAM"
      {"0", 0, "0"},  // no limit beyond RAM
      {"8589934592", 8ull << 30, "8589934592"},
      {"\"8GiB\"", 8ull << 30, "8GiB"},
      {"\"512MB\"", 512000000, "512MB"},
      {"\"1.5GiB\"", 1610612736, "1.5GiB"},
  };
  for (const Case& tc : cases) {
    auto c = load_config(write("cap.toml", "[cache]\ncapacity = " + tc.toml_value + "\n"), {}, {"dataset.path=/d"});
    ASSERT_TRUE(c.ok()) << tc.toml_value << ": " << c.status().to_string();
    EXPECT_EQ(c->cache.capacity_bytes, tc.bytes) << tc.toml_value;
    EXPECT_EQ(c->cache.capacity_text, tc.text) << tc.toml_value;
  }
  auto c = load_config("", {{"SHARDMIX_CACHE_CAPACITY", "0.5"}}, {"dataset.path=/d"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cache.capacity_bytes, static_cast<std::uint64_t>(std::floor(0.5 * static_cast<double>(ram))));
  for (const std::string bad : {"1.5", "0.0", "-0.5", "\"lots\"", "-3", "\"2 XB\""}) {
    auto r = load_config(write("cap.toml", "[cache]\ncapacity = " + bad + "\n"), {}, {"dataset.path=/d"});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(error_of(r).find("cache.capacity"), std::string::npos) << error_of(r);
    EXPECT_NE(error_of(r).find("cap.toml"), std::string::npos) << error_of(r);
  }
}

TEST_F(ConfigTest, PeerDeathDegradeIsAcceptedAndOtherValuesAreNot) {
  auto degrade = load_config("", {}, {"dataset.path=/d", "fault.peer_death=degrade"});
  ASSERT_TRUE(degrade.ok()) << degrade.status().to_string();
  EXPECT_EQ(degrade->fault.peer_death, "degrade");
  auto bad = load_config("", {}, {"dataset.path=/d", "fault.peer_death=ignore"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fault.peer_death"), std::string::npos) << bad.status().to_string();
}

TEST_F(ConfigTest, ReuseRoundsAndRotationEpochsAreExclusive) {
  auto rounds = load_config("", {}, {"dataset.path=/d", "cache.reuse_rounds=4"});
  ASSERT_TRUE(rounds.ok()) << rounds.status().to_string();
  EXPECT_EQ(rounds->cache.reuse_rounds, 4u);
  auto both = load_config("", {}, {"dataset.path=/d", "cache.reuse_rounds=4", "cache.rotation_epochs=1"});
  expect_error(both, "cache.reuse_rounds");
  EXPECT_NE(error_of(both).find("cache.rotation_epochs"), std::string::npos) << error_of(both);
}

TEST_F(ConfigTest, PrintedConfigReadsBackToTheSameConfig) {
  // Defaults.
  auto base = load_config("", {}, {"dataset.path=/data/imagenet"});
  ASSERT_TRUE(base.ok());
  // Every key changed, with strings that need escaping and each capacity form.
  const Sets everything = {
      "dataset.path=/data/odd \"name\" \\ tab\there/ünïcode\nnewline",
      "dataset.format=filelist",
      "dataset.placement=sorted",
      "dataset.max_sample_bytes=12345",
      "batch.size=7",
      "batch.drop_last=true",
      "shuffle.seed=9223372036854775807",
      "shuffle.exchange_fraction=0.1",
      "shuffle.window=0",
      "fabric.provider=verbs",
      "fabric.interface=mlx5_0",
      "fabric.max_outstanding_reads=2",
      "service.run_dir=/run/smx",
      "service.trainers_per_node=8",
      "service.prefetch=9",
      "service.staging_bytes_per_trainer=3GiB",
      "service.loader_threads=1",
      "log.level=trace",
      "log.components=fabric=debug,service=warn",
      "telemetry.stats_file=/scratch/stats-{job}.jsonl",
      "telemetry.prometheus_file=/var/lib/node_exporter/shardmix-{rank}.prom",
      "telemetry.interval=2500ms",
  };
  std::vector<Config> configs = {*base};
  for (const std::string capacity : {"0.3", "1.0", "1", "0", "8GiB", "1.5GiB", "1000MB", "123456789"}) {
    Sets sets = everything;
    sets.push_back("cache.capacity=" + capacity);
    auto c = load_config("", {}, sets);
    ASSERT_TRUE(c.ok()) << capacity << ": " << c.status().to_string();
    configs.push_back(*c);
  }
  for (const Config& config : configs) {
    const std::string text = config_to_toml(config);
    auto back = load_config(write("printed.toml", text), {}, {});
    ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << text;
    EXPECT_EQ(*back, config) << text;
    EXPECT_EQ(config_to_toml(*back), text);
  }
}

TEST_F(ConfigTest, PrintedConfigListsSectionsInTableOrderWithEveryKey) {
  auto c = load_config("", {}, {"dataset.path=/d"});
  ASSERT_TRUE(c.ok());
  const std::string text = config_to_toml(*c);
  std::size_t last = 0;
  for (const std::string section : {"[dataset]", "[batch]", "[shuffle]", "[cache]", "[fabric]", "[service]", "[log]"}) {
    const std::size_t at = text.find("\n" + section + "\n");
    ASSERT_NE(at, std::string::npos) << section;
    EXPECT_GT(at, last) << section;
    last = at;
  }
  for (const ConfigKeyInfo& key : config_keys()) {
    const std::string leaf = key.name.substr(key.name.rfind('.') + 1);  // [storage.s3] holds storage.s3.*
    EXPECT_NE(text.find("\n" + leaf + " = "), std::string::npos) << key.name;
  }
}

TEST_F(ConfigTest, NestedSectionsReadAsTablesOrDottedKeys) {
  // [storage.s3] as a table header, and as dotted keys under [storage] (sm_write_config's form).
  for (const std::string text : {"[dataset]\npath = \"s3://b/p\"\n[storage.s3]\nconcurrency = 8\nregion = \"eu\"\n",
                                 "[dataset]\npath = \"s3://b/p\"\n[storage]\ns3.concurrency = 8\ns3.region = \"eu\"\n"}) {
    auto c = load_config(write("s3.toml", text), {}, {});
    ASSERT_TRUE(c.ok()) << error_of(c);
    EXPECT_EQ(c->dataset.s3.concurrency, 8u);
    EXPECT_EQ(c->dataset.s3.region, "eu");
  }
  expect_error(load_config(write("typo.toml", "[dataset]\npath = \"/d\"\n[storage.s3]\nconcurency = 8\n"), {}, {}),
               "unknown config key 'storage.s3.concurency'");
  expect_error(load_config(write("bare.toml", "[dataset]\npath = \"/d\"\n[storage]\nendpoint = \"x\"\n"), {}, {}),
               "unknown config key 'storage.endpoint'");
  auto env = load_config("", {{"SHARDMIX_STORAGE_S3_CONCURRENCY", "3"}}, {"dataset.path=/d", "storage.s3.max_attempts=2"});
  ASSERT_TRUE(env.ok()) << error_of(env);
  EXPECT_EQ(env->dataset.s3.concurrency, 3u);
  EXPECT_EQ(env->dataset.s3.max_attempts, 2u);
}

// Model checkpoints (docs/decisions/0056): their RAM comes out of the cache's, and a
// bad value names its key.
TEST(CheckpointConfigTest, KeysAreCheckedNamingTheKey) {
  auto ok = load_config("", {}, {"dataset.path=/d", "checkpoint.dir=/ckpt", "cache.capacity=8GiB",
                                 "checkpoint.capacity=1GiB", "checkpoint.when_full=write_through",
                                 "checkpoint.prefault=false"});
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->checkpoint.capacity_bytes, 1ull << 30);
  EXPECT_EQ(ok->checkpoint.when_full, "write_through");
  EXPECT_FALSE(ok->checkpoint.prefault);
  EXPECT_TRUE(Config{}.checkpoint.prefault);
  auto too_big = load_config("", {}, {"dataset.path=/d", "checkpoint.dir=/ckpt", "cache.capacity=1GiB",
                                      "checkpoint.capacity=1GiB"});
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("'checkpoint.capacity'"), std::string::npos) << too_big.status().message();
  EXPECT_NE(too_big.status().message().find("'cache.capacity'"), std::string::npos) << too_big.status().message();
  // Without checkpoint.dir the capacity is not taken from the cache, so it is not compared.
  EXPECT_TRUE(load_config("", {}, {"dataset.path=/d", "cache.capacity=1GiB", "checkpoint.capacity=1GiB"}).ok());
  auto bad_mode = load_config("", {}, {"dataset.path=/d", "checkpoint.when_full=block"});
  ASSERT_FALSE(bad_mode.ok());
  EXPECT_NE(bad_mode.status().message().find("checkpoint.when_full"), std::string::npos) << bad_mode.status().message();
  auto no_retain = load_config("", {}, {"dataset.path=/d", "checkpoint.retain=0"});
  ASSERT_FALSE(no_retain.ok());
  EXPECT_NE(no_retain.status().message().find("checkpoint.retain"), std::string::npos) << no_retain.status().message();
}

TEST(ConfigKeysTest, TableIsWellFormed) {
  const auto keys = config_keys();
  EXPECT_EQ(keys.size(), 77u);  // update with config.h when adding a key
  std::set<std::string> names;
  for (const ConfigKeyInfo& key : keys) {
    EXPECT_TRUE(names.insert(key.name).second) << "duplicate " << key.name;
    // section.key, or section.subsection.key ([storage.s3])
    const auto dots = std::count(key.name.begin(), key.name.end(), '.');
    EXPECT_TRUE(dots == 1 || dots == 2) << key.name;
    EXPECT_FALSE(key.doc.empty()) << key.name;
    EXPECT_FALSE(key.tradeoff.empty()) << key.name;
    EXPECT_EQ(key.env_name.rfind("SHARDMIX_", 0), 0u) << key.name;
  }
  EXPECT_EQ(keys.front().env_name, "SHARDMIX_DATASET_PATH");
}

TEST(ConfigShardKeysTest, ShardFormatKeys) {
  auto c = load_config("", {{"SHARDMIX_DATASET_FORMAT", "webdataset"}, {"SHARDMIX_DATASET_PATH", "/d"}},
                       {"dataset.sample_ext=png, jpg", "dataset.label_ext=label", "dataset.strict=true"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->dataset.format, DatasetFormat::kWebDataset);
  EXPECT_EQ(c->dataset.sample_ext, "png, jpg");
  EXPECT_EQ(c->dataset.label_ext, "label");
  EXPECT_TRUE(c->dataset.strict);
  auto t = load_config("", {}, {"dataset.path=/d", "dataset.format=tfrecord", "dataset.label_feature=y"});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dataset.format, DatasetFormat::kTfRecord);
  EXPECT_EQ(t->dataset.label_feature, "y");
  EXPECT_FALSE(t->dataset.strict);
  auto back = load_config("", {}, {"dataset.path=/d", "dataset.format=tfrecord"});
  ASSERT_TRUE(back.ok());
  EXPECT_NE(config_to_toml(*back).find("format = \"tfrecord\""), std::string::npos);
  auto bad = load_config("", {}, {"dataset.path=/d", "dataset.sample_ext=.jpg"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dataset.sample_ext"), std::string::npos) << bad.status().message();
}

// Owner-side metadata (decision 0063) names each setting it does not work with yet, and
// the key to change, instead of a daemon failing later.
TEST(OwnerSideConfig, RefusesWhatItCannotServeYetNamingTheKey) {
  const std::vector<std::string> base{"dataset.path=/d", "dataset.metadata=owner", "dataset.placement=spread"};
  ASSERT_TRUE(load_config("", {}, base).ok());
  const std::vector<std::pair<std::string, std::string>> refused{
      {"dataset.placement=balanced", "'dataset.placement' = \"balanced\""},
      {"dataset.path=s3://bucket/train", "'dataset.path' = \"s3://bucket/train\""},
      {"cache.rotation_epochs=1", "'cache.rotation_epochs' = 1"},
      {"cache.reuse_rounds=2", "'cache.reuse_rounds' = 2"},
      {"fault.peer_death=degrade", "'fault.peer_death' = \"degrade\""},
  };
  for (const auto& [setting, named] : refused) {
    std::vector<std::string> sets = base;
    sets.push_back(setting);
    auto c = load_config("", {}, sets);
    ASSERT_FALSE(c.ok()) << setting;
    EXPECT_NE(c.status().message().find("'dataset.metadata' = \"owner\""), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find(named), std::string::npos) << c.status().message();
  }
  // What it serves since: the entropy floor (decision 0065), a re-dealt resume (0067).
  for (const std::string setting : {"shuffle.min_entropy=0.5", "resume.checkpoint_dir=/ckpt"}) {
    std::vector<std::string> sets = base;
    sets.push_back(setting);
    EXPECT_TRUE(load_config("", {}, sets).ok()) << setting;
  }
  auto unknown = load_config("", {}, {"dataset.path=/d", "dataset.metadata=sharded"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("dataset.metadata"), std::string::npos) << unknown.status().message();
}

// docs/configuration.md holds the generated reference between two markers. Regenerate with
//   SHARDMIX_SOURCE_DIR=$PWD REGENERATE_DOCS=1 build/tests/shardmix_unit_tests --gtest_filter='ConfigDocsTest.*'
// from the source tree.
TEST(ConfigDocsTest, ConfigurationMdDocumentsEveryKey) {
  // The source tree, from ctest's environment (tests/CMakeLists.txt): __FILE__ is relative
  // under ccache's base_dir, and ctest runs this from build/tests.
  const char* source_dir = std::getenv("SHARDMIX_SOURCE_DIR");
  ASSERT_NE(source_dir, nullptr) << "SHARDMIX_SOURCE_DIR is not set: run this test through ctest, or set it to the "
                                    "source tree";
  const fs::path doc = fs::path(source_dir) / "docs" / "configuration.md";
  std::ifstream in(doc);
  ASSERT_TRUE(in) << "cannot open " << doc;
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  const std::string begin = "<!-- BEGIN GENERATED KEY REFERENCE (config_reference_markdown) -->\n";
  const std::string end = "<!-- END GENERATED KEY REFERENCE -->";
  const std::size_t b = text.find(begin);
  const std::size_t e = text.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  const std::string generated = config_reference_markdown();
  if (std::getenv("REGENERATE_DOCS") != nullptr) {
    text = text.substr(0, b + begin.size()) + generated + text.substr(e);
    std::ofstream(doc, std::ios::binary) << text;
    GTEST_SKIP() << "rewrote " << doc;
  }
  EXPECT_EQ(text.substr(b + begin.size(), e - b - begin.size()), generated)
      << doc << " is out of date: REGENERATE_DOCS=1 shardmix_unit_tests --gtest_filter='ConfigDocsTest.*'";
  for (const ConfigKeyInfo& key : config_keys()) {
    EXPECT_NE(text.find("`" + key.name + "`"), std::string::npos) << key.name;
    EXPECT_NE(text.find(key.env_name), std::string::npos) << key.env_name;
  }
  for (std::string_view var : kNonConfigEnvVars) EXPECT_NE(text.find(var), std::string::npos) << var;
}

}  // namespace config_test
}  // namespace shardmix

namespace shardmix {
namespace config_test {

TEST(ConfigWindowTest, WindowAndMinEntropyAreAccepted) {
  auto c = load_config("", {}, {"dataset.path=/d", "shuffle.window=64", "shuffle.min_entropy=0.6"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->shuffle.window, 64u);
  EXPECT_DOUBLE_EQ(c->shuffle.min_entropy, 0.6);
  auto bad = load_config("", {}, {"dataset.path=/d", "shuffle.min_entropy=1.5"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("shuffle.min_entropy"), std::string::npos) << bad.status().message();
}

TEST(ConfigDurationTest, ParsesUnitsAndRefusesBareNumbers) {
  EXPECT_EQ(parse_duration("250ms", "k").value(), std::chrono::milliseconds(250));
  EXPECT_EQ(parse_duration("1.5s", "k").value(), std::chrono::milliseconds(1500));
  EXPECT_EQ(parse_duration(" 100us ", "k").value(), std::chrono::microseconds(100));
  EXPECT_EQ(parse_duration("2min", "k").value(), std::chrono::minutes(2));
  EXPECT_EQ(parse_duration("1h", "k").value(), std::chrono::hours(1));
  EXPECT_EQ(parse_duration("0", "k").value(), std::chrono::microseconds(0));
  for (const char* bad : {"20", "-5ms", "5 parsecs", "ms", "1.2.3s", ""}) {
    auto d = parse_duration(bad, "inject.slow_peer_delay");
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_NE(d.status().message().find("inject.slow_peer_delay"), std::string::npos) << d.status().message();
  }
}

TEST(ConfigDurationTest, DurationKeyRoundTripsThroughPrintedToml) {
  auto c = load_config("", {{"SHARDMIX_INJECT_SLOW_PEER_DELAY", "1500us"}},
                       {"dataset.path=/d", "inject.slow_peer_rank=2"});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->inject.slow_peer_delay, std::chrono::microseconds(1500));
  EXPECT_EQ(c->inject.slow_peer_rank, 2);
  const std::string toml = config_to_toml(*c);
  EXPECT_NE(toml.find("slow_peer_delay = \"1500us\""), std::string::npos) << toml;
  const test_support::TempDir dir("config");
  const std::string path = dir.write("duration_roundtrip.toml", toml);
  auto again = load_config(path, {}, {});
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(*again, *c);
  auto bare = load_config("", {}, {"dataset.path=/d", "inject.slow_peer_delay=20"});
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(bare.status().message().find("missing unit"), std::string::npos) << bare.status().message();
}

}  // namespace config_test
}  // namespace shardmix
