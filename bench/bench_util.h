// What the one-process dataset benchmarks (memcpy.cc, inplace.cc, posix_reader.cc) share:
// the scan of the folder dataset they read, the cache arena's layout of its samples, the
// monotonic clock their JSON lines report, and the median/min/max of repeated passes.
// Header-only: bench/CMakeLists.txt builds each bench/<name>.cc into its own program.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/catalog.h"

namespace shardmix::bench {

struct ScannedDataset {
  DatasetConfig config;
  ScanResult scan;
};

// The whole dataset at PATH as one rank of one scans it; on failure prints
// "PROGRAM: <why>" on stderr and returns nothing.
inline std::optional<ScannedDataset> scan_dataset(const char* program, const std::string& path) {
  ScannedDataset out;
  out.config.path = path;
  auto scan = scan_partition(out.config, 0, 1);
  if (!scan.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, scan.status().to_string().c_str());
    return std::nullopt;
  }
  out.scan = std::move(*scan);
  return out;
}

// Samples of these sizes back to back, each at a 64-byte aligned offset, as the cache
// arena lays them out: the memory the local-delivery limits copy from.
struct ArenaLayout {
  std::vector<std::uint64_t> offsets;
  std::uint64_t total = 0;     // bytes the arena spans, alignment included
  std::uint64_t bytes = 0;     // the samples' own bytes
  std::uint64_t max_size = 0;  // the largest sample
};

inline ArenaLayout arena_layout(const std::vector<std::uint64_t>& sizes) {
  ArenaLayout layout;
  for (const auto size : sizes) {
    layout.offsets.push_back(layout.total);
    layout.bytes += size;
    layout.max_size = std::max(layout.max_size, size);
    layout.total = (layout.total + size + 63) / 64 * 64;
  }
  return layout;
}

// CLOCK_MONOTONIC seconds, the clock shardmix-consume's t_start/t_end use.
inline double monotonic_seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}
inline double monotonic_seconds() { return monotonic_seconds(std::chrono::steady_clock::now()); }

// The median (the upper one of an even count), min and max of one figure per pass.
struct PassSummary {
  double median = 0;
  double min = 0;
  double max = 0;
};

inline PassSummary summarize_passes(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  return {values[values.size() / 2], values.front(), values.back()};
}

}  // namespace shardmix::bench
