// shardmix-bench-mapping: what a checkpoint's pages cost to reach, through the checkpoint
// pool's own code (common/checkpoint_pool.h). A pool of --mib MiB is prefaulted (timed),
// then each round takes one buffer of all of it and writes every byte twice:
//   pool      through the pool's own mapping (how the daemon fills a save or a replica);
//   new map   through a new mapping of the same pages, as a trainer's lease maps them
//             (SideBySideMapping, made and filled anew each round, its cost included).
// The figures are seconds per GiB, the median of --rounds; the kernel's shared-memory huge
// page setting is printed with them, since it decides what the pool's MADV_HUGEPAGE does
// (bench/huge_pages.sh runs this under each setting). One 'JSON {...}' line at the end.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_util.h"
#include "common/checkpoint_pool.h"
#include "common/command_line.h"
#include "common/huge_pages.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardmix-bench-mapping: seconds per GiB to prefault the checkpoint pool and to write it through "
               "its own mapping and through a new one"};
  std::uint64_t mib = 1024;
  int rounds = 3;
  app.add_option("--mib", mib, "Pool size and buffer size in MiB");
  app.add_option("--rounds", rounds, "Rounds of writes (median reported)")->check(CLI::PositiveNumber);
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  const std::uint64_t bytes = mib << 20;
  const double gib = static_cast<double>(bytes) / (1ull << 30);
  const std::string setting = shardmix::shmem_huge_page_setting();
  const auto started = std::chrono::steady_clock::now();
  auto pool = shardmix::CheckpointPool::create(bytes, /*prefault=*/true);
  if (!pool.ok()) {
    std::fprintf(stderr, "shardmix-bench-mapping: %s\n", pool.status().to_string().c_str());
    return 1;
  }
  while ((*pool)->stats().prefaulted_bytes < (*pool)->stats().capacity_bytes) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double prefault_s = seconds_since(started) / gib;

  std::vector<double> own, fresh;
  for (int r = 0; r < rounds; ++r) {
    auto buffer = (*pool)->allocate(bytes, "bench");
    if (!buffer.ok() || !(*buffer)->pooled()) {
      std::fprintf(stderr, "shardmix-bench-mapping: the buffer did not come from the pool\n");
      return 1;
    }
    auto start = std::chrono::steady_clock::now();
    std::memset((*buffer)->writable().data(), r + 1, bytes);
    own.push_back(seconds_since(start) / gib);

    start = std::chrono::steady_clock::now();
    const std::vector<shardmix::MemfdRun> runs = (*buffer)->runs();
    auto lease = shardmix::SideBySideMapping::map((*buffer)->lease_memfd(), runs);
    if (!lease.ok()) {
      std::fprintf(stderr, "shardmix-bench-mapping: %s\n", lease.status().to_string().c_str());
      return 1;
    }
    std::memset(lease->bytes().data(), r + 2, bytes);
    fresh.push_back(seconds_since(start) / gib);
  }
  const auto o = shardmix::bench::summarize_passes(own);
  const auto f = shardmix::bench::summarize_passes(fresh);
  std::printf("shmem_enabled = %s, %llu MiB\n", setting.empty() ? "unknown" : setting.c_str(),
              static_cast<unsigned long long>(mib));
  std::printf("  prefault (once)               %.3f s/GiB\n", prefault_s);
  std::printf("  write, the pool's own mapping %.3f s/GiB (%.3f-%.3f)\n", o.median, o.min, o.max);
  std::printf("  map anew and write (a lease)  %.3f s/GiB (%.3f-%.3f)\n", f.median, f.min, f.max);
  std::printf("JSON {\"bench\": \"mapping\", \"shmem_enabled\": \"%s\", \"mib\": %llu, \"prefault_s_per_gib\": %.4f, "
              "\"own_mapping_s_per_gib\": %.4f, \"new_mapping_s_per_gib\": %.4f}\n",
              setting.c_str(), static_cast<unsigned long long>(mib), prefault_s, o.median, f.median);
  return 0;
}
