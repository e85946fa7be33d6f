// A bounded cache of open read-only descriptors of shard files (tar, TFRecord), keyed by
// path, so that reading thousands of samples from the same few shards costs one open() per
// shard instead of one per sample: on a parallel file system an open() is a metadata-server
// round trip, often as slow as the read itself (docs/decisions/0037).
//
// Sharing: a descriptor is handed out as a shared_ptr<const ShardFile>. Readers use
// positionless pread/preadv on it, so any number of threads may read it at once. Eviction
// (least recently used, beyond `capacity`) only drops the cache's reference: a reader that
// holds the descriptor keeps it open until it is done, and the last holder closes it.
//
// Invisible to readers: before a cached descriptor is handed out, stat(path) must still name
// the same file (device and inode). A shard that was deleted, replaced (say by a rename over
// it) or renamed away is dropped and the path opened again, so a read sees what opening the
// path for every read would have seen: the new file, or the error that the shard is gone.
// Comparing inode numbers is sound because the cached descriptor keeps its inode alive, so
// no new file can be given that number meanwhile. stat() rather than open(): clients of NFS and Lustre answer it from their attribute
// caches, while an open() goes to the server by design (close-to-open consistency).
//
// Misses on the same path while its open is in flight wait for that open rather than open
// the shard again.
//
// Thread-safety: every member may be called from any thread. mutex_ guards the table; no
// system call runs under it (an open() on a slow file system must not stall readers of
// other shards).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace shardmix {

// One open read-only descriptor and the identity of the file it was opened on. Closed by
// the destructor, i.e. when its last holder lets go.
class ShardFile {
 public:
  ShardFile(int fd, dev_t device, ino_t inode, std::shared_ptr<std::atomic<std::int64_t>> live);
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  int fd() const { return fd_; }
  dev_t device() const { return device_; }
  ino_t inode() const { return inode_; }

 private:
  int fd_;
  dev_t device_;
  ino_t inode_;
  std::shared_ptr<std::atomic<std::int64_t>> live_;  // the owning cache's count of open descriptors, if any
};

// Opens `path` read-only for one read, without caching (service.open_shard_files = 0).
// Errors: kNotFound when the path names nothing, kIoError otherwise; the message is the
// system's reason only, for the caller to put after the file name and offset.
Result<std::shared_ptr<const ShardFile>> open_shard_file(const std::string& path);

// service.open_shard_files descriptors must fit under the open-files limit next to the
// daemon's own (trainer sockets, memfds, libfabric's; 64 assumed): raises the soft limit up
// to the hard one if needed, else an error naming the key, so that a daemon refuses to start
// rather than fail reads mid-job with "Too many open files". 0 = nothing to reserve.
Status reserve_shard_descriptors(std::uint32_t open_shard_files);

struct ShardFileCacheStats {
  std::uint64_t hits = 0;       // reads served by a cached descriptor
  std::uint64_t opens = 0;      // open() calls (first use, after eviction, after a change)
  std::uint64_t joined = 0;     // misses served by another reader's open of the same shard (waited for, or just done)
  std::uint64_t changed = 0;    // cached descriptors dropped because the path named another file or none
  std::uint64_t evictions = 0;  // descriptors dropped to stay within the capacity
  std::int64_t open_now = 0;    // descriptors open now, evicted ones still in use included
};

class ShardFileCache {
 public:
  explicit ShardFileCache(std::size_t capacity);  // capacity >= 1 (0 = do not build one)
  ShardFileCache(const ShardFileCache&) = delete;
  ShardFileCache& operator=(const ShardFileCache&) = delete;

  // A descriptor of the file `path` names now: the cached one if stat(path) still names its
  // file, else a new one (which enters the cache, evicting the least recently used beyond
  // the capacity). Errors as open_shard_file().
  Result<std::shared_ptr<const ShardFile>> acquire(const std::string& path);

  ShardFileCacheStats stats() const;
  std::size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    std::string path;
    std::shared_ptr<const ShardFile> file;
  };
  using Lru = std::list<Entry>;  // most recently used first

  // Removes `path`'s entry if it still holds `file` (another thread may have replaced it).
  void forget(const std::string& path, const ShardFile* file);
  // Puts `file` first under `path`, evicting beyond the capacity into `dropped`. mutex_ held.
  void insert(const std::string& path, const std::shared_ptr<const ShardFile>& file,
              std::vector<std::shared_ptr<const ShardFile>>& dropped);

  const std::size_t capacity_;
  const std::shared_ptr<std::atomic<std::int64_t>> live_ = std::make_shared<std::atomic<std::int64_t>>(0);
  mutable std::mutex mutex_;  // guards lru_, index_ and pending_
  Lru lru_;
  std::unordered_map<std::string, Lru::iterator> index_;
  // Opens in flight, so that readers missing on the same shard share one.
  std::unordered_map<std::string, std::shared_future<Result<std::shared_ptr<const ShardFile>>>> pending_;
  std::atomic<std::uint64_t> hits_{0}, opens_{0}, joined_{0}, changed_{0}, evictions_{0};
};

}  // namespace shardmix
