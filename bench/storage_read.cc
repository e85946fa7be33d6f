// shardmix-bench-storage-read: the storage bound of bench/storage.sh. N threads read whole
// files (or their first --read-bytes) from DIR in a seeded random order, each file with
// open + exact-size pread + close as a reader of sample files does, and report the
// aggregate rate and the per-file latency:
//
//   shardmix-bench-storage-read --dir /tmp/slow --list files.txt --threads 16 [--bytes N]
//                               [--read-bytes N] [--seed S] [--json]
//
// --list: paths relative to DIR, one per line (the first word of each line is used, so a
// dataset's filelist.txt works); --bytes stops after the files whose sizes add up to N
// bytes (a random subset of that size); --read-bytes reads only the first N bytes of each
// file (a latency probe). With --json also prints one 'JSON {...}' line.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/command_line.h"
#include <fmt/format.h>

namespace {

using Clock = std::chrono::steady_clock;

struct FileEntry {
  std::string path;
  std::uint64_t size = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Reads files from a directory with N threads in random order: aggregate rate and per-file latency"};
  std::string dir, list;
  unsigned threads = 16;
  std::uint64_t byte_limit = 0, read_bytes = 0, seed = 1;
  bool json = false;
  app.add_option("--dir", dir, "Directory the listed paths are relative to (e.g. the slow mount)")->required();
  app.add_option("--list", list, "File of paths relative to --dir, one per line (first word)")->required();
  app.add_option("--threads", threads, "Reader threads (the read parallelism)")->check(CLI::PositiveNumber);
  app.add_option("--bytes", byte_limit, "Read a random subset of the files adding up to this many bytes (0 = all)");
  app.add_option("--read-bytes", read_bytes, "Read only the first N bytes of each file (0 = whole files)");
  app.add_option("--seed", seed, "Seed of the random order");
  app.add_flag("--json", json, "Also print one 'JSON {...}' line");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  std::vector<FileEntry> files;
  {
    std::ifstream in(list);
    if (!in) {
      fmt::print(stderr, "shardmix-bench-storage-read: cannot read --list '{}'\n", list);
      return 2;
    }
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string path;
      if (words >> path) files.push_back({path, 0});
    }
  }
  std::mt19937_64 rng(seed);
  std::shuffle(files.begin(), files.end(), rng);
  // Sizes from the (attribute-cached) metadata, so that --bytes picks the subset up front.
  std::uint64_t planned = 0;
  std::size_t keep = 0;
  for (; keep < files.size(); ++keep) {
    if (byte_limit != 0 && planned >= byte_limit) break;
    struct stat st {};
    const std::string full = dir + "/" + files[keep].path;
    if (::stat(full.c_str(), &st) != 0) {
      fmt::print(stderr, "shardmix-bench-storage-read: cannot stat '{}': {}\n", full, std::strerror(errno));
      return 1;
    }
    files[keep].size = static_cast<std::uint64_t>(st.st_size);
    planned += read_bytes != 0 ? std::min<std::uint64_t>(read_bytes, files[keep].size) : files[keep].size;
  }
  files.resize(keep);

  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<bool> failed{false};
  std::vector<std::vector<double>> latencies(threads);
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<char> buf;
      for (std::size_t i = next++; i < files.size() && !failed; i = next++) {
        const FileEntry& f = files[i];
        const std::uint64_t want = read_bytes != 0 ? std::min(read_bytes, f.size) : f.size;
        if (buf.size() < want) buf.resize(want);
        const auto t0 = Clock::now();
        const std::string full = dir + "/" + f.path;
        const int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
          fmt::print(stderr, "shardmix-bench-storage-read: cannot open '{}': {}\n", full, std::strerror(errno));
          failed = true;
          return;
        }
        std::uint64_t done = 0;
        while (done < want) {
          const ssize_t n = ::pread(fd, buf.data() + done, want - done, static_cast<off_t>(done));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            fmt::print(stderr, "shardmix-bench-storage-read: short read of '{}' at {}\n", full, done);
            failed = true;
            break;
          }
          done += static_cast<std::uint64_t>(n);
        }
        ::close(fd);
        latencies[t].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        bytes += done;
      }
    });
  }
  for (auto& th : pool) th.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  if (failed) return 1;
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  const auto pct = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<std::size_t>(p * static_cast<double>(all.size())))];
  };
  const double mbps = static_cast<double>(bytes.load()) / secs / 1e6;
  fmt::print("storage-read: {} files, {} bytes in {:.3f} s with {} threads: {:.1f} MB/s, {:.0f} files/s; "
             "per-file latency median {:.2f} ms, p95 {:.2f} ms, min {:.2f} ms\n",
             all.size(), bytes.load(), secs, threads, mbps, static_cast<double>(all.size()) / secs, pct(0.5) * 1e3,
             pct(0.95) * 1e3, all.empty() ? 0.0 : all.front() * 1e3);
  if (json) {
    fmt::print("JSON {{\"bench\": \"storage_read\", \"threads\": {}, \"files\": {}, \"bytes\": {}, \"seconds\": {:.6f}, "
               "\"mbps\": {:.3f}, \"files_per_s\": {:.3f}, \"latency_ms_median\": {:.4f}, \"latency_ms_p95\": {:.4f}, "
               "\"latency_ms_min\": {:.4f}, \"read_bytes\": {}}}\n",
               threads, all.size(), bytes.load(), secs, mbps, static_cast<double>(all.size()) / secs, pct(0.5) * 1e3,
               pct(0.95) * 1e3, all.empty() ? 0.0 : all.front() * 1e3, read_bytes);
  }
  return 0;
}
