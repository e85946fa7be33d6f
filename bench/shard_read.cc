// shardmix-bench-shard-read: what the shard descriptor cache (service.open_shard_files,
// docs/decisions/0037) buys. N random samples of a tar (webdataset) or TFRecord dataset are
// read through read_sample(), the daemon's own storage read, by T threads as the storage
// readers do: once with the cache off (an open per sample, as before) and once with it on,
// in the same run, alternating which goes first on each repetition so that drift in the
// machine's load falls on both:
//
//   shardmix-bench-shard-read --dataset DIR --format webdataset [--samples 2048] [--threads 8]
//                             [--open-shards 64] [--repeat 3] [--seed 1] [--json]
//
// Each repetition reads the same N samples (a seeded random draw, with repeats when N is
// larger than the dataset) and starts with a fresh cache, so the "on" figure includes
// opening every shard once. Prints a table (rate, per-read latency, opens) with the
// cache-off baseline next to the cache-on figures and their ratio; with --json also one
// 'JSON {...}' line per run and one for the summary. Every read's bytes are checked against
// a first uncached pass (exit 1 on a mismatch or a read error).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/catalog.h"
#include "common/command_line.h"
#include "common/config.h"
#include "server/sample_reader.h"
#include "server/shard_file_cache.h"

namespace shardmix {
namespace {

using Clock = std::chrono::steady_clock;

struct RunResult {
  bool cached = false;
  int repetition = 0;
  double seconds = 0;
  std::uint64_t bytes = 0;
  std::uint64_t opens = 0;  // open() calls: one per read without the cache
  std::vector<double> latencies_ms;
  double samples_per_s(std::size_t n) const { return static_cast<double>(n) / seconds; }
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

// Reads `ids` with `threads` threads; checks each sample against `expected` (when given).
Result<RunResult> run(const Catalog& catalog, const DatasetConfig& dataset, const std::vector<SampleId>& ids,
                      unsigned threads, ShardFileCache* cache, const std::vector<std::string>* expected) {
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<bool> failed{false};
  std::vector<Status> errors(threads);
  std::vector<std::vector<double>> latencies(threads);
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::string buf;
      for (std::size_t i = next++; i < ids.size() && !failed; i = next++) {
        const SampleId id = ids[i];
        buf.assign(catalog.sample_bytes(id), '\0');
        const auto t0 = Clock::now();
        Status s = read_sample(catalog, dataset, id, reinterpret_cast<std::uint8_t*>(buf.data()), cache);
        latencies[t].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        if (s.ok() && expected != nullptr && buf != (*expected)[id]) {
          s = make_error(StatusCode::kCorrupt, "sample {} ({}): bytes differ from the uncached read", id,
                         catalog.location(id));
        }
        if (!s.ok()) {
          errors[t] = s;
          failed = true;
          return;
        }
        bytes += buf.size();
      }
    });
  }
  for (auto& th : pool) th.join();
  RunResult r;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const Status& e : errors) {
    if (!e.ok()) return e;
  }
  r.cached = cache != nullptr;
  r.bytes = bytes.load();
  r.opens = cache != nullptr ? cache->stats().opens : ids.size();
  for (auto& l : latencies) r.latencies_ms.insert(r.latencies_ms.end(), l.begin(), l.end());
  return r;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"Reads random samples of a shard dataset through read_sample() with the shard descriptor cache "
               "off and on, in the same run"};
  std::string path, format = "webdataset";
  std::size_t samples = 2048;
  unsigned threads = 8, repeat = 3;
  std::uint32_t open_shards = 64;
  std::uint64_t seed = 1;
  bool json = false;
  app.add_option("--dataset", path, "The shard directory (e.g. on a slowfs mount)")->required();
  app.add_option("--format", format, "webdataset or tfrecord")->check(CLI::IsMember({"webdataset", "tfrecord"}));
  app.add_option("--samples", samples, "Samples read per run (a seeded random draw)")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "Reader threads (the daemon's service.loader_threads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--open-shards", open_shards, "Cache capacity for the 'on' runs (service.open_shard_files)")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat, "Repetitions of the off/on pair")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Seed of the sample draw");
  app.add_flag("--json", json, "Also print 'JSON {...}' lines");
  if (const auto status = shardmix::parse_command_line(app, argc, argv)) return *status;

  DatasetConfig dataset;
  dataset.path = path;
  dataset.format = format == "tfrecord" ? DatasetFormat::kTfRecord : DatasetFormat::kWebDataset;
  dataset.sample_ext = "bin";  // shardmix-gen's data member
  if (dataset.format == DatasetFormat::kTfRecord) dataset.label_feature = "label";
  auto scan = scan_partition(dataset, 0, 1);
  if (!scan.ok()) {
    fmt::print(stderr, "shardmix-bench-shard-read: scanning {}: {}\n", path, scan.status().to_string());
    return 1;
  }
  std::vector<ScanResult> parts;
  parts.push_back(std::move(*scan));
  auto catalog = merge_scans(dataset, std::move(parts));
  if (!catalog.ok() || catalog->size() == 0) {
    fmt::print(stderr, "shardmix-bench-shard-read: {}: {}\n", path,
               catalog.ok() ? "no samples" : catalog.status().to_string());
    return 1;
  }
  std::mt19937_64 rng(seed);
  std::vector<SampleId> ids;
  while (ids.size() < samples) {
    std::vector<SampleId> all(catalog->size());
    for (SampleId i = 0; i < all.size(); ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + static_cast<std::ptrdiff_t>(
                                                          std::min<std::size_t>(all.size(), samples - ids.size())));
  }
  std::uint64_t draw_bytes = 0;
  for (SampleId id : ids) draw_bytes += catalog->sample_bytes(id);

  // The reference bytes of the drawn samples, read once without the cache by `threads`
  // threads (not timed; a direct_io mount such as slowfs caches nothing for the runs).
  std::vector<std::string> expected(catalog->size());
  {
    std::vector<SampleId> distinct = ids;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    std::atomic<std::size_t> next{0};
    std::vector<Status> errors(threads);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (std::size_t i = next++; i < distinct.size(); i = next++) {
          std::string& bytes = expected[distinct[i]];
          bytes.assign(catalog->sample_bytes(distinct[i]), '\0');
          const Status s = read_sample(*catalog, dataset, distinct[i], reinterpret_cast<std::uint8_t*>(bytes.data()));
          if (!s.ok() && errors[t].ok()) errors[t] = s;
        }
      });
    }
    for (auto& th : pool) th.join();
    for (const Status& e : errors) {
      if (!e.ok()) {
        fmt::print(stderr, "shardmix-bench-shard-read: {}\n", e.to_string());
        return 1;
      }
    }
  }

  std::vector<RunResult> runs;
  for (unsigned rep = 0; rep < repeat; ++rep) {
    for (int k = 0; k < 2; ++k) {
      const bool cached = (k == 1) != (rep % 2 == 1);  // off, on; then on, off; ...
      std::unique_ptr<ShardFileCache> cache = cached ? std::make_unique<ShardFileCache>(open_shards) : nullptr;
      auto r = run(*catalog, dataset, ids, threads, cache.get(), &expected);
      if (!r.ok()) {
        fmt::print(stderr, "shardmix-bench-shard-read: {}\n", r.status().to_string());
        return 1;
      }
      r->repetition = static_cast<int>(rep);
      if (json) {
        fmt::print("JSON {{\"bench\": \"shard_read\", \"kind\": \"run\", \"cache\": {}, \"repetition\": {}, "
                   "\"samples\": {}, \"bytes\": {}, \"seconds\": {:.6f}, \"samples_per_s\": {:.1f}, "
                   "\"latency_ms_median\": {:.4f}, \"latency_ms_p95\": {:.4f}, \"opens\": {}}}\n",
                   cached ? "true" : "false", rep, ids.size(), r->bytes, r->seconds, r->samples_per_s(ids.size()),
                   median(r->latencies_ms), percentile(r->latencies_ms, 0.95), r->opens);
      }
      runs.push_back(std::move(*r));
    }
  }

  // Summary: medians over repetitions; the ratio is taken per repetition (same minute).
  struct Side {
    std::vector<double> rate, lat_median, lat_p95, opens;
  } off, on;
  std::vector<double> ratios(repeat, 0.0);
  std::vector<double> off_rate(repeat), on_rate(repeat);
  for (const RunResult& r : runs) {
    Side& side = r.cached ? on : off;
    const double rate = r.samples_per_s(ids.size());
    side.rate.push_back(rate);
    side.lat_median.push_back(median(r.latencies_ms));
    side.lat_p95.push_back(percentile(r.latencies_ms, 0.95));
    side.opens.push_back(static_cast<double>(r.opens));
    (r.cached ? on_rate : off_rate)[static_cast<std::size_t>(r.repetition)] = rate;
  }
  for (unsigned i = 0; i < repeat; ++i) ratios[i] = on_rate[i] / off_rate[i];
  const auto range = [](const std::vector<double>& v) {
    return fmt::format("{:.0f} ({:.0f}-{:.0f})", median(v), *std::min_element(v.begin(), v.end()),
                       *std::max_element(v.begin(), v.end()));
  };
  fmt::print("shard-read: {} ({} samples, {} shards), {} random samples ({:.1f} MB) per run, {} threads, {} "
             "repetition(s) of cache off / on (service.open_shard_files {})\n",
             path, catalog->size(), catalog->file_count(), ids.size(), draw_bytes / 1e6, threads, repeat,
             open_shards);
  fmt::print("| cache | samples/s median (min-max) | MB/s | read latency median ms | p95 ms | open() calls per run |\n");
  fmt::print("|---|---|---|---|---|---|\n");
  for (const auto* side : {&off, &on}) {
    const double rate = median(side->rate);
    fmt::print("| {} | {} | {:.1f} | {:.2f} | {:.2f} | {:.0f} |\n", side == &off ? "off (open per read)" : "on",
               range(side->rate), rate * static_cast<double>(draw_bytes) / static_cast<double>(ids.size()) / 1e6,
               median(side->lat_median), median(side->lat_p95), median(side->opens));
  }
  fmt::print("cache on / off, per repetition: median {:.2f} (min {:.2f}, max {:.2f})\n", median(ratios),
             *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()));
  if (json) {
    fmt::print("JSON {{\"bench\": \"shard_read\", \"kind\": \"summary\", \"format\": \"{}\", \"dataset_samples\": {}, "
               "\"shards\": {}, \"samples\": {}, \"bytes\": {}, \"threads\": {}, \"open_shards\": {}, \"repeat\": {}, "
               "\"off_samples_per_s\": {:.1f}, \"on_samples_per_s\": {:.1f}, \"off_latency_ms_median\": {:.4f}, "
               "\"on_latency_ms_median\": {:.4f}, \"off_opens\": {:.0f}, \"on_opens\": {:.0f}, \"ratio_median\": {:.4f}, "
               "\"ratio_min\": {:.4f}, \"ratio_max\": {:.4f}}}\n",
               format, catalog->size(), catalog->file_count(), ids.size(), draw_bytes, threads, open_shards, repeat,
               median(off.rate), median(on.rate), median(off.lat_median), median(on.lat_median), median(off.opens),
               median(on.opens), median(ratios), *std::min_element(ratios.begin(), ratios.end()),
               *std::max_element(ratios.begin(), ratios.end()));
  }
  return 0;
}

}  // namespace
}  // namespace shardmix

int main(int argc, char** argv) { return shardmix::main_impl(argc, argv); }
