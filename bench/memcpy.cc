// shardmix-bench-memcpy: the physical limit for local-cache delivery. Lays out the
// dataset's samples (real sizes, scanned from --dataset) back to back and 64-byte aligned
// as the cache arena does, then copies every sample once per pass, in a seeded random
// order, into a private buffer: what a trainer that copies each sample out of RAM pays.
// Prints a readable table and one 'JSON {...}' line (median of --passes, with min/max).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_util.h"
#include "common/command_line.h"
#include "common/rng.h"

int main(int argc, char** argv) {
  CLI::App app{"shardmix-bench-memcpy: single- and multi-thread memcpy of a dataset's samples"};
  std::string dataset;
  int passes = 3;
  int threads = 1;
  app.add_option("--dataset", dataset, "Folder dataset whose sample sizes to use")->required();
  app.add_option("--passes", passes, "Passes over all samples (median reported)");
  app.add_option("--threads", threads, "Copying threads (each copies its share)");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  const auto scanned = shardmix::bench::scan_dataset("shardmix-bench-memcpy", dataset);
  if (!scanned) return 1;
  std::vector<std::uint64_t> sizes;
  for (const auto& e : scanned->scan.entries) sizes.push_back(e.size);
  const auto layout = shardmix::bench::arena_layout(sizes);
  const auto& offsets = layout.offsets;
  const std::uint64_t bytes = layout.bytes, max_size = layout.max_size;
  std::vector<std::uint8_t> arena(layout.total + 64);
  shardmix::Rng fill(1);
  fill.fill_bytes(arena);
  std::vector<std::uint32_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0u);

  std::vector<double> rates;
  volatile std::uint8_t sink_byte = 0;
  for (int p = 0; p < passes; ++p) {
    shardmix::Rng rng(100 + p);
    shardmix::shuffle(std::span<std::uint32_t>(order), rng);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<std::uint8_t> out(max_size + 1);
        for (std::size_t i = t; i < order.size(); i += threads) {
          const auto id = order[i];
          std::memcpy(out.data(), arena.data() + offsets[id], sizes[id]);
        }
        sink_byte = out[max_size / 2];
      });
    }
    for (auto& th : pool) th.join();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(static_cast<double>(bytes) / secs);
  }
  const auto rate = shardmix::bench::summarize_passes(rates);
  const double mean_size = sizes.empty() ? 0 : static_cast<double>(bytes) / sizes.size();
  std::printf("memcpy of %zu samples (%.1f MB, mean %.1f KiB), %d thread(s), %d passes\n", sizes.size(), bytes / 1e6,
              mean_size / 1024, threads, passes);
  std::printf("  %-10s %10s %12s\n", "", "GB/s", "samples/s");
  std::printf("  %-10s %10.2f %12.0f\n", "median", rate.median / 1e9, rate.median / mean_size);
  std::printf("  %-10s %10.2f %12.0f\n", "min", rate.min / 1e9, rate.min / mean_size);
  std::printf("  %-10s %10.2f %12.0f\n", "max", rate.max / 1e9, rate.max / mean_size);
  std::printf(
      "JSON {\"bench\": \"memcpy\", \"threads\": %d, \"samples\": %zu, \"bytes\": %llu, \"gbps_median\": %.4f, "
      "\"gbps_min\": %.4f, \"gbps_max\": %.4f, \"samples_per_s_median\": %.1f}\n",
      threads, sizes.size(), static_cast<unsigned long long>(bytes), rate.median / 1e9, rate.min / 1e9,
      rate.max / 1e9, rate.median / mean_size);
  (void)sink_byte;
  return 0;
}
