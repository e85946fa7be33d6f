#include "server/cache_loader.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/s3_client.h"
#include "server/sample_reader.h"

namespace shardmix {
namespace {

// Ids follow (label, shard, offset), so reading in id order visits every shard once per
// class, and a descriptor cache (service.open_shard_files) smaller than the number of shards
// would never hit. Storage order (shard, offset) reads each shard front to back: about one
// open per shard, and sequential reads for the file system's read-ahead. Where a sample
// lands in the arena does not depend on when it is read.
bool before_in_storage(const Catalog& catalog, SampleId a, SampleId b) {
  return std::pair(catalog.shard(a), catalog.offset(a)) < std::pair(catalog.shard(b), catalog.offset(b));
}

// S3 datasets: every (sample, arena offset) of `targets` through read_samples_s3, with a
// window of requests queued beyond the ones in flight (so the client never waits for the
// next batch, and the queue stays small for a large load). `progress` about every 50 ms.
// Shard formats: `targets` are in storage order and a GET carries a run of one shard's
// samples (storage.s3.merge_gap), so the window holds 4 x concurrency shards' worth of
// samples; counted in samples it would keep a fraction of the connections busy.
Result<LoadStats> load_from_s3(const Catalog& catalog, const DatasetConfig& dataset,
                               const std::vector<std::pair<SampleId, std::uint64_t>>& targets, std::uint8_t* arena,
                               const std::function<void(const LoadStats&)>& progress,
                               const std::function<bool()>& cancelled, bool skip_gone_objects) {
  const std::size_t samples_per_get = catalog.sharded() && dataset.s3.merge_max > 0 && catalog.file_count() > 0
                                          ? std::max<std::size_t>(1, catalog.size() / catalog.file_count())
                                          : 1;
  const std::size_t window =
      4 * samples_per_get * static_cast<std::size_t>(std::max<std::uint32_t>(1, dataset.s3.concurrency));
  const auto start = std::chrono::steady_clock::now();
  std::mutex mutex;  // guards everything below
  std::condition_variable changed;
  std::size_t outstanding = 0, next = 0;
  LoadStats stats;
  Status first_error;
  std::unique_lock lock(mutex);
  while (outstanding > 0 || (next < targets.size() && first_error.ok())) {
    if (first_error.ok() && cancelled && cancelled()) {
      first_error = make_error(StatusCode::kCancelled, "loading from S3: stopped after {} of {} samples",
                               stats.samples, targets.size());
    }
    if (first_error.ok() && outstanding < window && next < targets.size()) {
      std::vector<std::pair<SampleId, std::uint8_t*>> batch;
      const std::size_t first = next;
      while (outstanding + batch.size() < window && next < targets.size()) {
        batch.emplace_back(targets[next].first, arena + targets[next].second);
        ++next;
      }
      outstanding += batch.size();
      lock.unlock();
      read_samples_s3(catalog, dataset, std::move(batch), [&, first](std::size_t i, const Status& s) {
        std::lock_guard done_lock(mutex);
        --outstanding;
        if (s.ok()) {
          ++stats.samples;
          stats.bytes += catalog.sample_bytes(targets[first + i].first);
        } else if (skip_gone_objects && (s.code() == StatusCode::kNotFound || s.code() == StatusCode::kCorrupt)) {
          stats.unreadable.emplace_back(targets[first + i].first, s);
        } else if (first_error.ok()) {
          first_error = dataset.strict ? s.with_context("dataset.strict = true") : s;
        }
        changed.notify_all();
      });
      lock.lock();
      continue;
    }
    changed.wait_for(lock, std::chrono::milliseconds(50));
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (progress) progress(stats);
  }
  if (!first_error.ok()) return first_error;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace

Result<LoadStats> load_owned_samples(const Catalog& catalog, const Placement& placement, std::uint32_t node,
                                     const DatasetConfig& dataset, std::uint32_t threads, std::uint8_t* arena,
                                     const LoadProgress& progress, const std::function<bool()>& cancelled,
                                     std::chrono::microseconds per_sample_delay, ShardFileCache* open_shards) {
  // Only the resident samples: cold ones are read from storage when a trainer needs them.
  std::vector<std::pair<SampleId, std::uint64_t>> targets;
  targets.reserve(placement.cached[node].size());
  for (const SampleId id : placement.cached[node]) targets.emplace_back(id, placement.arena_offset[id]);
  return load_samples(catalog, std::move(targets), node, dataset, threads, arena, progress, cancelled,
                      per_sample_delay, open_shards);
}

Result<LoadStats> load_samples(const Catalog& catalog, std::vector<std::pair<SampleId, std::uint64_t>> targets,
                               std::uint32_t node, const DatasetConfig& dataset, std::uint32_t threads,
                               std::uint8_t* arena, const LoadProgress& progress, const std::function<bool()>& cancelled,
                               std::chrono::microseconds per_sample_delay, ShardFileCache* open_shards) {
  if (catalog.sharded()) {
    std::sort(targets.begin(), targets.end(),
              [&catalog](const auto& a, const auto& b) { return before_in_storage(catalog, a.first, b.first); });
  }
  std::uint64_t total_bytes = 0;
  for (const auto& [id, offset] : targets) total_bytes += catalog.sample_bytes(id);
  if (is_s3_path(dataset.path)) {
    auto loaded = load_from_s3(catalog, dataset, targets, arena, [&](const LoadStats& so_far) {
      if (progress) progress(so_far, targets.size(), total_bytes, false);
    }, cancelled, !dataset.strict);
    if (loaded.ok() && progress) progress(*loaded, targets.size(), total_bytes, true);
    return loaded;
  }
  auto log = log::get("loader");
  const auto start = std::chrono::steady_clock::now();
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> loaded_samples{0};
  std::atomic<std::uint64_t> loaded_bytes{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;  // guards first_error
  Status first_error;

  auto worker = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const std::size_t i = next.fetch_add(1);
      if (i >= targets.size()) return;
      const auto [id, offset] = targets[i];
      const std::uint64_t size = catalog.sample_bytes(id);
      Status s = read_sample(catalog, dataset, id, arena + offset, open_shards);
      if (!s.ok()) {
        std::lock_guard lock(error_mutex);
        if (first_error.ok()) first_error = s;
        failed = true;
        return;
      }
      loaded_samples.fetch_add(1, std::memory_order_relaxed);
      loaded_bytes.fetch_add(size, std::memory_order_relaxed);
      if (per_sample_delay.count() > 0) std::this_thread::sleep_for(per_sample_delay);
    }
  };
  std::vector<std::thread> pool;
  const std::uint32_t n_threads = std::max<std::uint32_t>(1, std::min<std::uint64_t>(threads, targets.size()));
  for (std::uint32_t t = 0; t < n_threads; ++t) pool.emplace_back(worker);

  // Progress: a line every 2 s while loading (the daemon's stderr is usually a log file).
  auto last_log = start;
  while (loaded_samples.load() + 0 < targets.size() && !failed.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (cancelled && cancelled()) {
      std::lock_guard lock(error_mutex);
      if (first_error.ok()) {
        first_error = make_error(StatusCode::kCancelled, "loading node {}'s samples: stopped after {} of {}", node,
                                 loaded_samples.load(), targets.size());
      }
      failed = true;
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (progress) {
      progress(LoadStats{loaded_samples.load(), loaded_bytes.load(), std::chrono::duration<double>(now - start).count()},
               targets.size(), total_bytes, false);
    }
    if (now - last_log >= std::chrono::seconds(2)) {
      last_log = now;
      const double secs = std::chrono::duration<double>(now - start).count();
      const double mbps = static_cast<double>(loaded_bytes.load()) / secs / 1e6;
      const double left = mbps > 0 ? static_cast<double>(total_bytes - loaded_bytes.load()) / 1e6 / mbps : 0.0;
      log->info("loading: {}/{} samples, {:.0f}/{:.0f} MB, {:.0f} MB/s, ETA {:.0f} s", loaded_samples.load(),
                targets.size(), loaded_bytes.load() / 1e6, total_bytes / 1e6, mbps, left);
    }
  }
  for (auto& t : pool) t.join();
  if (!first_error.ok()) return first_error;
  LoadStats stats;
  stats.samples = loaded_samples.load();
  stats.bytes = loaded_bytes.load();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (progress) progress(stats, targets.size(), total_bytes, true);
  return stats;
}

Result<LoadStats> load_entering_samples(const Catalog& catalog, const DatasetConfig& dataset,
                                        std::vector<std::pair<SampleId, std::uint64_t>> entering,
                                        std::uint32_t threads, std::uint8_t* arena,
                                        const std::function<bool()>& cancelled, ShardFileCache* open_shards) {
  if (catalog.sharded()) {
    std::sort(entering.begin(), entering.end(),
              [&catalog](const auto& a, const auto& b) { return before_in_storage(catalog, a.first, b.first); });
  }
  if (is_s3_path(dataset.path)) return load_from_s3(catalog, dataset, entering, arena, {}, cancelled, false);
  const auto start = std::chrono::steady_clock::now();
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;  // guards first_error
  Status first_error;
  auto worker = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      if (cancelled && cancelled()) {
        std::lock_guard lock(error_mutex);
        if (first_error.ok()) first_error = make_error(StatusCode::kCancelled, "cache reload stopped");
        failed = true;
        return;
      }
      const std::size_t i = next.fetch_add(1);
      if (i >= entering.size()) return;
      const auto [id, offset] = entering[i];
      Status s = read_sample(catalog, dataset, id, arena + offset, open_shards);
      if (!s.ok()) {
        std::lock_guard lock(error_mutex);
        if (first_error.ok()) first_error = s;
        failed = true;
        return;
      }
      bytes.fetch_add(catalog.sample_bytes(id), std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> pool;
  const auto n_threads = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, std::min<std::uint64_t>(threads, entering.size())));
  for (std::uint32_t t = 0; t < n_threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (!first_error.ok()) return first_error;
  LoadStats stats;
  stats.samples = entering.size();
  stats.bytes = bytes.load();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace shardmix
