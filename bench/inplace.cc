// shardmix-bench-inplace: the limit for zero-copy local delivery with P trainer processes.
// ShardMix's Q=0 trainers read samples in place from the daemon's shared memory; the best
// they could do is what P processes achieve reading the same bytes from their own private
// memory. This forks --processes children; child r lays out samples r, r+P, r+2P, ... of
// the dataset (real sizes, 64-byte aligned, as the cache arena does) in memory it
// allocated and touched itself, then per pass copies each of its samples, in a seeded
// random order, into a private buffer (--touch copy: what shardmix-consume --touch copy
// does with each delivered view). Passes start together (a process-shared barrier); a
// pass's aggregate rate is all children's bytes over the span from the first child's
// start to the last child's end. Prints a table and one 'JSON {...}' line (median of
// --passes, with min and max).
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_util.h"
#include "common/command_line.h"
#include "common/rng.h"

namespace {

constexpr int kMaxProcesses = 64;
constexpr int kMaxPasses = 64;

// Lives in a MAP_SHARED mapping created before fork, so every child sees the same barrier
// and writes its own timings where the parent reads them.
struct Shared {
  pthread_barrier_t barrier;
  double start[kMaxPasses][kMaxProcesses];
  double end[kMaxPasses][kMaxProcesses];
  std::uint64_t bytes[kMaxProcesses];
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardmix-bench-inplace: P processes copying their share of a dataset out of their own memory"};
  std::string dataset;
  int processes = 1;
  int passes = 3;
  app.add_option("--dataset", dataset, "Folder dataset whose sample sizes to use")->required();
  app.add_option("--processes", processes, "Reading processes (each reads its 1/P of the samples)")
      ->check(CLI::Range(1, kMaxProcesses));
  app.add_option("--passes", passes, "Passes over all samples (median reported)")->check(CLI::Range(1, kMaxPasses));
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  const auto scanned = shardmix::bench::scan_dataset("shardmix-bench-inplace", dataset);
  if (!scanned) return 1;
  std::vector<std::uint64_t> all_sizes;
  for (const auto& e : scanned->scan.entries) all_sizes.push_back(e.size);

  void* mapping = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) {
    std::perror("shardmix-bench-inplace: mmap");
    return 1;
  }
  auto* shared = new (mapping) Shared{};
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&shared->barrier, &attr, static_cast<unsigned>(processes));

  std::vector<pid_t> children;
  for (int r = 0; r < processes; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("shardmix-bench-inplace: fork");
      return 1;
    }
    if (pid > 0) {
      children.push_back(pid);
      continue;
    }
    // Child r: its own arena, allocated and filled (first-touched) here, after fork.
    std::vector<std::uint64_t> sizes;
    for (std::size_t i = r; i < all_sizes.size(); i += processes) sizes.push_back(all_sizes[i]);
    const auto layout = shardmix::bench::arena_layout(sizes);
    const auto& offsets = layout.offsets;
    const std::uint64_t max_size = layout.max_size;
    std::vector<std::uint8_t> arena(layout.total + 64);
    shardmix::Rng fill(1 + r);
    fill.fill_bytes(arena);
    std::vector<std::uint8_t> out(max_size + 1);
    std::vector<std::uint32_t> order(sizes.size());
    std::iota(order.begin(), order.end(), 0u);
    shared->bytes[r] = layout.bytes;
    for (int p = 0; p < passes; ++p) {
      shardmix::Rng rng(100 + p * kMaxProcesses + r);
      shardmix::shuffle(std::span<std::uint32_t>(order), rng);
      pthread_barrier_wait(&shared->barrier);
      shared->start[p][r] = shardmix::bench::monotonic_seconds();
      for (const auto id : order) std::memcpy(out.data(), arena.data() + offsets[id], sizes[id]);
      shared->end[p][r] = shardmix::bench::monotonic_seconds();
      // Keeps the copies from being optimised away.
      if (out[max_size / 2] == 0xFF && out[0] == 0xFE) std::fputc(' ', stderr);
    }
    std::_Exit(0);
  }
  bool ok = true;
  for (const pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok) {
    std::fprintf(stderr, "shardmix-bench-inplace: a reading process failed\n");
    return 1;
  }
  std::uint64_t bytes = 0;
  for (int r = 0; r < processes; ++r) bytes += shared->bytes[r];
  std::vector<double> rates;
  for (int p = 0; p < passes; ++p) {
    const double first = *std::min_element(shared->start[p], shared->start[p] + processes);
    const double last = *std::max_element(shared->end[p], shared->end[p] + processes);
    rates.push_back(static_cast<double>(bytes) / (last - first));
  }
  const auto rate = shardmix::bench::summarize_passes(rates);
  const double mean_size = all_sizes.empty() ? 0 : static_cast<double>(bytes) / all_sizes.size();
  std::printf("in-place copy of %zu samples (%.1f MB), %d process(es), %d passes: median %.2f GB/s (%.0f samples/s), "
              "min %.2f, max %.2f\n",
              all_sizes.size(), bytes / 1e6, processes, passes, rate.median / 1e9, rate.median / mean_size,
              rate.min / 1e9, rate.max / 1e9);
  std::printf(
      "JSON {\"bench\": \"inplace\", \"processes\": %d, \"passes\": %d, \"samples\": %zu, \"bytes\": %llu, "
      "\"gbps_median\": %.4f, \"gbps_min\": %.4f, \"gbps_max\": %.4f, \"samples_per_s_median\": %.1f}\n",
      processes, passes, all_sizes.size(), static_cast<unsigned long long>(bytes), rate.median / 1e9, rate.min / 1e9,
      rate.max / 1e9, rate.median / mean_size);
  return 0;
}
