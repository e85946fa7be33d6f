// Linked against shardmix_core and shardmix_client alone (with --no-as-needed, so every
// library they ask for shows up in its NEEDED list): check_layering.sh reads that list to
// prove that the core and the client pull in no MPI, libfabric, ibverbs or Boost library.
#include <cstdio>

#include "client/client.h"
#include "common/config.h"

int main() {
  // A real consumer of both libraries: a config from defaults, and a connection attempt to
  // a run dir where no daemon is (it fails at once; the probe only needs to have linked).
  shardmix::Config config;
  shardmix::ClientOptions options;
  options.run_dir = "/nonexistent/shardmix-layering-probe";
  options.ready_timeout_s = 0;
  auto client = shardmix::Client::try_connect(options);
  std::printf("probe: seed %llu, connect %s\n", static_cast<unsigned long long>(config.shuffle.seed),
              client.ok() ? "ok" : "failed as expected");
  return 0;
}
