// shardmixd: the per-node ShardMix daemon. Launch one per node with mpirun or srun.
//   shardmixd --config FILE [--set section.key=value ...] [--print-config]
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/command_line.h"
#include "common/config.h"
#include "common/log.h"
#include "control/mpi_comm.h"
#include "server/daemon.h"

int main(int argc, char** argv) {
  CLI::App app{"shardmixd: per-node ShardMix daemon (cache, RDMA shuffle, trainer service)"};
  std::string config_file;
  std::vector<std::string> sets;
  bool print_config = false;
  app.add_option("-c,--config", config_file, "TOML config file (see docs/configuration.md)");
  app.add_option("--set", sets, "Override a key: --set section.key=value (repeatable)");
  app.add_flag("--print-config", print_config, "Print the effective config as TOML and exit");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  auto config = shardmix::load_config(config_file, shardmix::environment_map(), sets);
  if (!config.ok()) {
    std::fprintf(stderr, "shardmixd: %s\n", config.status().to_string().c_str());
    return 2;
  }
  if (auto levels = shardmix::log::parse_component_levels(config->log.components); !levels.ok()) {
    std::fprintf(stderr, "shardmixd: %s\n", levels.status().to_string().c_str());
    return 2;
  }
  if (print_config) {
    std::fputs(shardmix::config_to_toml(*config).c_str(), stdout);
    return 0;
  }
  shardmix::MpiSession mpi(&argc, &argv);
  return shardmix::run_daemon(*config, mpi);
}
