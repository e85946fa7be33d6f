#include "server/storage_reader.h"

#include <algorithm>
#include <map>

#include "common/s3_client.h"
#include "server/sample_reader.h"

namespace shardmix {
namespace {

// One group's reads that carry their locations as a catalog of their own: read i is its
// sample i, and only the shards the reads name come from `files` (the job's shard table),
// so building it costs the group's size, not the table's.
Result<Catalog> catalog_of_reads(const Catalog& files, const std::vector<StorageRead>& reads) {
  std::vector<CatalogEntry> entries;
  entries.reserve(reads.size());
  std::vector<std::string> shards;
  std::map<std::uint32_t, std::uint32_t> renumbered;  // the job's shard index -> this catalog's
  for (const StorageRead& r : reads) {
    if (!r.location) {
      return make_error(StatusCode::kInternal,
                        "cold sample {} has no storage location while others of its batch have theirs", r.sample);
    }
    CatalogEntry e = *r.location;
    if (e.size != r.length) {
      return make_error(StatusCode::kInternal, "cold read of sample {} with length {} at a location of {} bytes",
                        r.sample, r.length, e.size);
    }
    if (files.sharded()) {
      if (e.shard >= files.file_count()) {
        return make_error(StatusCode::kInternal, "cold sample {} is in shard {} of a table of {} shards", r.sample,
                          e.shard, files.file_count());
      }
      auto [it, added] = renumbered.emplace(e.shard, static_cast<std::uint32_t>(shards.size()));
      if (added) shards.emplace_back(files.file_path(e.shard));
      e.shard = it->second;
    }
    entries.push_back(std::move(e));
  }
  return Catalog::of_share(shards, entries, {});
}

}  // namespace

StorageReaderPool::StorageReaderPool(const Catalog& catalog, const DatasetConfig& dataset, std::uint8_t* staging_base,
                                     std::uint32_t threads, Post post, std::chrono::microseconds delay,
                                     ShardFileCache* open_shards)
    : catalog_(catalog),
      dataset_(dataset),
      staging_base_(staging_base),
      post_(std::move(post)),
      delay_(delay),
      open_shards_(open_shards) {
  for (std::uint32_t t = 0; t < std::max<std::uint32_t>(1, threads); ++t) threads_.emplace_back([this] { run(); });
}

StorageReaderPool::~StorageReaderPool() { stop(); }

void StorageReaderPool::fetch(std::vector<StorageRead> reads, std::function<void(const StorageOutcome&)> done) {
  auto group = std::make_shared<Group>();
  group->remaining = reads.size();
  group->done = std::move(done);
  if (reads.empty()) {
    post_([group] { group->done(group->outcome); });
    return;
  }
  if (std::any_of(reads.begin(), reads.end(), [](const StorageRead& r) { return r.location.has_value(); })) {
    auto located = catalog_of_reads(catalog_, reads);
    if (!located.ok()) {
      fail_all(reads, group, located.status());
      return;
    }
    group->located = std::make_shared<const Catalog>(std::move(*located));
  }
  if (is_s3_path(dataset_.path)) {
    fetch_s3(std::move(reads), std::move(group));
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      for (std::size_t i = 0; i < reads.size(); ++i) queue_.push_back({reads[i], i, group, trace::current_key()});
      wake_.notify_all();
      return;
    }
  }
  fail_all(reads, group, make_error(StatusCode::kUnavailable, "the daemon is stopping: cold reads cancelled"));
}

void StorageReaderPool::fail_all(const std::vector<StorageRead>& reads, const std::shared_ptr<Group>& group,
                                 const Status& why) {
  for (std::size_t i = 0; i < reads.size(); ++i) group->outcome.failed.emplace_back(i, why);
  post_([group] { group->done(group->outcome); });
}

std::pair<const Catalog*, SampleId> StorageReaderPool::source_of(const Job& job) const {
  if (job.group->located) return {job.group->located.get(), static_cast<SampleId>(job.index)};
  return {&catalog_, job.read.sample};
}

void StorageReaderPool::fetch_s3(std::vector<StorageRead> reads, std::shared_ptr<Group> group) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      const Status cancelled = make_error(StatusCode::kUnavailable, "the daemon is stopping: cold reads cancelled");
      for (std::size_t i = 0; i < reads.size(); ++i) finish({reads[i], i, group}, cancelled);
      return;
    }
    s3_in_flight_ += reads.size();  // stop() waits for them: the callbacks use this pool
  }
  auto jobs = std::make_shared<std::vector<Job>>();
  auto done_one = [this, jobs](std::size_t i, const Status& s) {
    record(jobs->at(i), s);
    std::lock_guard lock(mutex_);
    if (--s3_in_flight_ == 0) wake_.notify_all();
  };
  std::vector<std::pair<SampleId, std::uint8_t*>> sent;
  std::vector<std::size_t> sent_index;  // sent[k] is jobs[sent_index[k]]
  std::vector<std::pair<std::size_t, Status>> refused;
  for (std::size_t i = 0; i < reads.size(); ++i) {
    jobs->push_back({reads[i], i, group});
    if (Status s = group->located ? Status::ok_status() : check_against_catalog(reads[i]); !s.ok()) {
      refused.emplace_back(i, std::move(s));
    } else {
      sent.emplace_back(source_of(jobs->back()).second, staging_base_ + reads[i].staging_offset);
      sent_index.push_back(i);
    }
  }
  for (const auto& [i, s] : refused) done_one(i, s);
  // The group's catalog lives in `group`, which the jobs hold until the last callback.
  read_samples_s3(group->located ? *group->located : catalog_, dataset_, std::move(sent),
                  [done_one, jobs, sent_index = std::move(sent_index)](std::size_t k, const Status& s) {
                    const std::size_t i = sent_index[k];
                    done_one(i, s.ok() ? s
                                       : s.with_context(fmt::format("reading cold sample {} from storage",
                                                                    (*jobs)[i].read.sample)));
                  });
}

Status StorageReaderPool::check_against_catalog(const StorageRead& r) const {
  if (catalog_.empty()) {
    // Owner-side metadata: only the owner knows where a sample it caches is on storage (a
    // resident sample's read rerouted to storage has no location).
    return make_error(StatusCode::kUnavailable,
                      "cold read of sample {}: this node has no storage location for it (dataset.metadata = "
                      "\"owner\": the location of a sample its owner caches is known only there)",
                      r.sample);
  }
  if (r.sample >= catalog_.size() || catalog_.sample_bytes(r.sample) != r.length) {
    return make_error(StatusCode::kInternal, "cold read of sample {} with length {} does not match the catalog",
                      r.sample, r.length);
  }
  return Status::ok_status();
}

void StorageReaderPool::record(const Job& job, const Status& s) {
  if (s.ok()) {
    reads_completed_.fetch_add(1, std::memory_order_relaxed);
    bytes_read_.fetch_add(job.read.length, std::memory_order_relaxed);
  } else {
    reads_failed_.fetch_add(1, std::memory_order_relaxed);
  }
  finish(job, s);
}

void StorageReaderPool::finish(const Job& job, const Status& status) {
  const std::shared_ptr<Group>& group = job.group;
  if (!status.ok()) {
    std::lock_guard lock(group->mutex);
    group->outcome.failed.emplace_back(job.index, status);
  }
  if (group->remaining.fetch_sub(1) != 1) return;
  post_([group] { group->done(group->outcome); });
}

void StorageReaderPool::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const StorageRead& r = job.read;
    const std::int64_t traced = trace::start();
    Status s = job.group->located ? Status::ok_status() : check_against_catalog(r);
    if (s.ok()) {
      const auto [catalog, id] = source_of(job);
      s = read_sample(*catalog, dataset_, id, staging_base_ + r.staging_offset, open_shards_);
      if (!s.ok()) s = s.with_context(fmt::format("reading cold sample {} from storage", r.sample));
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);  // inject.storage_delay
    }
    const trace::Key& k = job.traced;
    trace::span(trace::What::kStorageRead, 0, traced, k, {r.sample, r.length, k.epoch, k.trainer, k.batch});
    record(job, s);
  }
}

void StorageReaderPool::stop() {
  std::deque<Job> left;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    left.swap(queue_);
    wake_.notify_all();
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  {
    // S3 reads in flight complete (or time out) through callbacks that use this pool.
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [this] { return s3_in_flight_ == 0; });
  }
  // Whoever waits for these groups (a scheduler freeing staging) hears of it.
  const Status cancelled = make_error(StatusCode::kUnavailable, "the daemon is stopping: cold reads cancelled");
  for (const Job& job : left) finish(job, cancelled);
}

StorageReaderStats StorageReaderPool::stats() const {
  return {reads_completed_.load(), bytes_read_.load(), reads_failed_.load()};
}

}  // namespace shardmix
