#include "server/shard_file_cache.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace shardmix {

ShardFile::ShardFile(int fd, dev_t device, ino_t inode, std::shared_ptr<std::atomic<std::int64_t>> live)
    : fd_(fd), device_(device), inode_(inode), live_(std::move(live)) {
  if (live_) live_->fetch_add(1, std::memory_order_relaxed);
}

ShardFile::~ShardFile() {
  ::close(fd_);
  if (live_) live_->fetch_sub(1, std::memory_order_relaxed);
}

namespace {

Status open_error(int error) {
  return Status(error == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError, std::strerror(error));
}

// `identify`: record the file's device and inode (one fstat), which only the cache needs.
Result<std::shared_ptr<const ShardFile>> open_read_only(const std::string& path, bool identify,
                                                        std::shared_ptr<std::atomic<std::int64_t>> live) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return open_error(errno);
  struct stat st {};
  if (identify && ::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return open_error(error);
  }
  return std::shared_ptr<const ShardFile>(std::make_shared<ShardFile>(fd, st.st_dev, st.st_ino, std::move(live)));
}

}  // namespace

Result<std::shared_ptr<const ShardFile>> open_shard_file(const std::string& path) {
  return open_read_only(path, false, nullptr);
}

ShardFileCache::ShardFileCache(std::size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

void ShardFileCache::forget(const std::string& path, const ShardFile* file) {
  std::shared_ptr<const ShardFile> dropped;  // declared before the lock: closes, if last, after it
  std::lock_guard lock(mutex_);
  const auto it = index_.find(path);
  if (it == index_.end() || it->second->file.get() != file) return;
  dropped = std::move(it->second->file);
  lru_.erase(it->second);
  index_.erase(it);
}

Result<std::shared_ptr<const ShardFile>> ShardFileCache::acquire(const std::string& path) {
  std::shared_ptr<const ShardFile> cached;
  {
    std::lock_guard lock(mutex_);
    if (const auto it = index_.find(path); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      cached = it->second->file;
    }
  }
  if (cached) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && st.st_dev == cached->device() && st.st_ino == cached->inode()) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      return cached;
    }
    // The path names another file now, or none: stop handing this one out (readers that
    // hold it finish with it) and open whatever the path names, as an uncached read would.
    forget(path, cached.get());
    changed_.fetch_add(1, std::memory_order_relaxed);
  }
  // A miss. One open per path at a time: readers that miss while it is in flight wait for
  // it instead of opening the same shard again (a loader's threads reach a shard together).
  std::promise<Result<std::shared_ptr<const ShardFile>>> promise;
  std::shared_future<Result<std::shared_ptr<const ShardFile>>> in_flight;
  bool opener = false;
  {
    std::lock_guard lock(mutex_);
    if (const auto it = index_.find(path); it != index_.end()) {
      // Another reader's open finished since this one looked: that descriptor is as fresh
      // as an open of our own would be (the stale one, if any, was forgotten above).
      joined_.fetch_add(1, std::memory_order_relaxed);
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->file;
    }
    if (const auto it = pending_.find(path); it != pending_.end()) {
      in_flight = it->second;
    } else {
      in_flight = promise.get_future().share();
      pending_.emplace(path, in_flight);
      opener = true;
    }
  }
  if (!opener) {
    joined_.fetch_add(1, std::memory_order_relaxed);
    return in_flight.get();
  }
  Result<std::shared_ptr<const ShardFile>> opened = open_read_only(path, true, live_);
  if (opened.ok()) opens_.fetch_add(1, std::memory_order_relaxed);
  {
    // Descriptors leaving the table are closed (if nobody holds them) after the lock is
    // released: close() can be a round trip too.
    std::vector<std::shared_ptr<const ShardFile>> dropped;
    std::lock_guard lock(mutex_);
    pending_.erase(path);
    if (opened.ok()) insert(path, *opened, dropped);
  }
  promise.set_value(opened);
  return opened;
}

void ShardFileCache::insert(const std::string& path, const std::shared_ptr<const ShardFile>& file,
                            std::vector<std::shared_ptr<const ShardFile>>& dropped) {
  if (const auto it = index_.find(path); it != index_.end()) {
    // An entry put there since this reader's lookup: the newest open wins.
    dropped.push_back(std::exchange(it->second->file, file));
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(Entry{path, file});
  index_.emplace(path, lru_.begin());
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().path);
    dropped.push_back(std::move(lru_.back().file));  // a reader still holding it keeps it open
    lru_.pop_back();
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
}

Status reserve_shard_descriptors(std::uint32_t open_shard_files) {
  constexpr rlim_t kOwnDescriptors = 64;
  rlimit limit{};
  if (open_shard_files == 0 || ::getrlimit(RLIMIT_NOFILE, &limit) != 0) return Status::ok_status();
  const rlim_t needed = open_shard_files + kOwnDescriptors;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return Status::ok_status();
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed) {
    rlimit raised = limit;
    raised.rlim_cur = needed;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) return Status::ok_status();
  }
  return make_error(StatusCode::kInvalidArgument,
                    "config key 'service.open_shard_files' = {} needs about {} open files with the daemon's own, but "
                    "the open-files limit is {} (hard limit {}): lower the key or raise 'ulimit -n'",
                    open_shard_files, needed, limit.rlim_cur, limit.rlim_max);
}

ShardFileCacheStats ShardFileCache::stats() const {
  return {hits_.load(), opens_.load(), joined_.load(), changed_.load(), evictions_.load(), live_->load()};
}

}  // namespace shardmix
