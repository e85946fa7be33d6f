// shardmix-bench-posix-reader: the "many threads of small reads" baseline (tf.data-style
// input pipelines, Chien et al., PDSW-DISC 2018). Each epoch reads every sample file of a
// folder dataset exactly once, whole, in a seeded random order that changes per epoch:
// --threads threads take the next file of that order from a shared counter and do
// open + one exact-size pread + close into a private buffer (the bytes land in memory, as a
// loader handing them to a trainer would). With --drop-caches the page cache is dropped
// (sync; echo 3 > /proc/sys/vm/drop_caches, root) before every epoch, outside the timed
// span: the stand-in for reading from a shared file system whose data is not cached here.
// Prints one line per epoch and one 'JSON {...}' line per epoch for scripts; --list FILE
// writes "epoch<TAB>relative path" for every file read (the ctest checks exactly-once).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_util.h"
#include "common/command_line.h"
#include "common/rng.h"

namespace {

// Drops clean page-cache pages so the next epoch reads from the disk. Needs root; a
// benchmark that silently ran warm would report a cold figure that is not one, so failing
// here is an error, not a warning.
bool drop_page_cache(std::string& error) {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd < 0) {
    error = std::string("cannot open /proc/sys/vm/drop_caches (needs root): ") + std::strerror(errno);
    return false;
  }
  const bool ok = ::write(fd, "3\n", 2) == 2;
  if (!ok) error = std::string("writing /proc/sys/vm/drop_caches: ") + std::strerror(errno);
  ::close(fd);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shardmix-bench-posix-reader: N threads pread-ing whole sample files in random order"};
  std::string dataset;
  int threads = 4;
  int epochs = 3;
  std::uint64_t seed = 1;
  bool drop_caches = false;
  std::string list_path;
  app.add_option("--dataset", dataset, "Folder dataset (as shardmix-gen writes) to read")->required();
  app.add_option("--threads", threads, "Reader threads")->check(CLI::PositiveNumber);
  app.add_option("--epochs", epochs, "Epochs (passes over every file)")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Seed of the per-epoch random order (epoch e uses seed + e)");
  app.add_flag("--drop-caches", drop_caches, "Drop the page cache before every epoch (root)");
  app.add_option("--list", list_path, "Write 'epoch<TAB>path' for every file read to this file");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  const auto scanned = shardmix::bench::scan_dataset("shardmix-bench-posix-reader", dataset);
  if (!scanned) return 1;
  const auto& config = scanned->config;
  const auto& scan = scanned->scan;
  if (!scan.shards.empty()) {
    std::fprintf(stderr, "shardmix-bench-posix-reader: %s is a sharded dataset; this reader wants one file per sample\n",
                 dataset.c_str());
    return 2;
  }
  const auto& entries = scan.entries;
  std::vector<std::string> paths;
  std::uint64_t max_size = 0;
  for (const auto& e : entries) {
    paths.push_back(shardmix::sample_file_path(config, e.path));
    max_size = std::max<std::uint64_t>(max_size, e.size);
  }
  std::ofstream list;
  if (!list_path.empty()) {
    list.open(list_path);
    if (!list) {
      std::fprintf(stderr, "shardmix-bench-posix-reader: cannot write --list %s\n", list_path.c_str());
      return 1;
    }
  }

  std::vector<std::uint32_t> order(entries.size());
  std::iota(order.begin(), order.end(), 0u);
  std::mutex list_mutex;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    if (drop_caches) {
      std::string error;
      if (!drop_page_cache(error)) {
        std::fprintf(stderr, "shardmix-bench-posix-reader: --drop-caches: %s\n", error.c_str());
        return 1;
      }
    }
    shardmix::Rng rng(seed + static_cast<std::uint64_t>(epoch));
    shardmix::shuffle(std::span<std::uint32_t>(order), rng);
    std::atomic<std::size_t> next{0};
    std::atomic<std::uint64_t> bytes_read{0};
    std::atomic<bool> failed{false};
    std::string failure;
    std::mutex failure_mutex;
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        std::vector<char> buffer(max_size + 1);
        std::string listed;
        std::uint64_t local_bytes = 0;
        for (std::size_t i = next++; i < order.size() && !failed; i = next++) {
          const auto id = order[i];
          const std::uint64_t size = entries[id].size;
          const int fd = ::open(paths[id].c_str(), O_RDONLY | O_CLOEXEC);
          ssize_t got = -1;
          int saved_errno = 0;
          if (fd >= 0) {
            got = ::pread(fd, buffer.data(), size, 0);
            saved_errno = errno;
            ::close(fd);
          } else {
            saved_errno = errno;
          }
          if (got != static_cast<ssize_t>(size)) {
            std::lock_guard lock(failure_mutex);
            failure = paths[id] + ": read " + std::to_string(got) + " of " + std::to_string(size) + " bytes at offset 0" +
                      (got < 0 ? std::string(" (") + std::strerror(saved_errno) + ")" : std::string());
            failed = true;
            break;
          }
          local_bytes += size;
          if (list.is_open()) listed += std::to_string(epoch) + "\t" + entries[id].path + "\n";
        }
        bytes_read += local_bytes;
        if (!listed.empty()) {
          std::lock_guard lock(list_mutex);
          list << listed;
        }
      });
    }
    for (auto& th : pool) th.join();
    const auto end = std::chrono::steady_clock::now();
    if (failed) {
      std::fprintf(stderr, "shardmix-bench-posix-reader: %s\n", failure.c_str());
      return 1;
    }
    const double secs = std::chrono::duration<double>(end - start).count();
    const double samples_per_s = static_cast<double>(entries.size()) / secs;
    const double gbps = static_cast<double>(bytes_read.load()) / secs / 1e9;
    std::printf("epoch %d: %zu files, %.1f MB, %d threads, %s cache, %.3f s, %.0f samples/s, %.3f GB/s\n", epoch,
                entries.size(), bytes_read.load() / 1e6, threads, drop_caches ? "dropped" : "warm", secs, samples_per_s,
                gbps);
    std::printf(
        "JSON {\"bench\": \"posix_reader\", \"epoch\": %d, \"threads\": %d, \"drop_caches\": %s, \"samples\": %zu, "
        "\"bytes\": %llu, \"seconds\": %.6f, \"samples_per_s\": %.1f, \"gbps\": %.4f, \"t_start\": %.6f, \"t_end\": %.6f}\n",
        epoch, threads, drop_caches ? "true" : "false", entries.size(),
        static_cast<unsigned long long>(bytes_read.load()), secs, samples_per_s, gbps, shardmix::bench::monotonic_seconds(start),
        shardmix::bench::monotonic_seconds(end));
    std::fflush(stdout);
  }
  return 0;
}
