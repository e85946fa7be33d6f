// The storage tier's readers: a bounded pool of threads that read cold samples (cached on
// no node) from the shared file system into a trainer's staging area, through
// read_sample(), the one function that maps a catalog entry to bytes on storage.
//
// A group of reads (one staged batch's cold samples) is spread over the pool sample by
// sample, so `threads` reads are in flight at once and storage runs at its bandwidth
// rather than one small read at a time; the group completes once, through `post` (the
// daemon posts to its Asio thread), with the first error, which names the sample, the file
// and the offset. Reads are served in the order they were posted (FIFO), which is the
// order of the plan, so the reads a trainer needs first are done first.
//
// Thread-safety: fetch() and stats() may be called from any thread (the queue is guarded
// by mutex_); stop() and the destructor by the owner's thread only. `done` callbacks run
// wherever `post` runs them, never on the caller's stack.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/catalog.h"
#include "common/config.h"
#include "common/trace.h"
#include "common/trainer_scheduler.h"
#include "server/shard_file_cache.h"

namespace shardmix {

struct StorageReaderStats {
  std::uint64_t reads_completed = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t reads_failed = 0;
};

class StorageReaderPool : public StorageFetcher {
 public:
  using Post = std::function<void(std::function<void()>)>;

  // Reads land at `staging_base + StorageRead::staging_offset`; the region, the catalog
  // and the dataset config must outlive the pool. `threads` >= 1. Under owner-side
  // metadata `catalog` holds only the job's shard table (Catalog::of_share with no
  // entries) and every read carries its location (StorageRead::location), shard formats'
  // as an index into that table.
  // `delay` (inject.storage_delay) holds each reader that much longer per read, emulating
  // a parallel file system's latency. `open_shards` (null = open per read) supplies shard
  // descriptors and must outlive the pool.
  StorageReaderPool(const Catalog& catalog, const DatasetConfig& dataset, std::uint8_t* staging_base,
                    std::uint32_t threads, Post post, std::chrono::microseconds delay = {},
                    ShardFileCache* open_shards = nullptr);
  ~StorageReaderPool() override;  // stop()
  StorageReaderPool(const StorageReaderPool&) = delete;
  StorageReaderPool& operator=(const StorageReaderPool&) = delete;

  void fetch(std::vector<StorageRead> reads, std::function<void(const StorageOutcome&)> done) override;
  // Joins the readers. Reads of groups not finished by then fail (through `post`) with an
  // error saying the daemon is stopping; later fetches fail with it at once.
  void stop();
  StorageReaderStats stats() const;

 private:
  struct Group {
    std::atomic<std::size_t> remaining{0};
    std::mutex mutex;  // guards outcome
    StorageOutcome outcome;
    std::function<void(const StorageOutcome&)> done;
    // Reads that carry their locations: read i is sample i of this catalog of their own.
    std::shared_ptr<const Catalog> located;
  };
  struct Job {
    StorageRead read;
    std::size_t index = 0;  // in its group's reads
    std::shared_ptr<Group> group;
    trace::Key traced{};  // the batch it belongs to (the trace's sampling key)
  };
  void run();
  // S3 datasets: the group's reads go to the S3 client at once (storage.s3.concurrency in
  // flight, driven by its one thread) instead of to the reader threads.
  void fetch_s3(std::vector<StorageRead> reads, std::shared_ptr<Group> group);
  // kInternal unless the read's length is its sample's in the catalog.
  Status check_against_catalog(const StorageRead& r) const;
  // What job reads: its group's catalog and id there (located reads) or the pool's.
  std::pair<const Catalog*, SampleId> source_of(const Job& job) const;
  // Fails every read of `group` with `why` (posted like any completion).
  void fail_all(const std::vector<StorageRead>& reads, const std::shared_ptr<Group>& group, const Status& why);
  // Counts one finished read and records it in its group.
  void record(const Job& job, const Status& s);
  // Records one finished read of `group`; the last one posts the group's completion.
  void finish(const Job& job, const Status& status);

  const Catalog& catalog_;
  const DatasetConfig& dataset_;
  std::uint8_t* staging_base_;
  Post post_;
  std::chrono::microseconds delay_;
  ShardFileCache* open_shards_;
  std::mutex mutex_;  // guards queue_ and stopping_
  std::condition_variable wake_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::size_t s3_in_flight_ = 0;  // S3 reads whose callbacks have not run yet
  std::atomic<std::uint64_t> reads_completed_{0}, bytes_read_{0}, reads_failed_{0};
  std::vector<std::thread> threads_;  // last: started once everything above exists
};

}  // namespace shardmix
