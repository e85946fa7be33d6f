#include "server/shard_file_cache.h"

#include <fcntl.h>
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
  auto opened = open_read_only(path, true, live_);
  if (!opened.ok()) return opened.status();
  opens_.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<const ShardFile> file = std::move(*opened);
  // Descriptors leaving the table are closed (if nobody holds them) after the lock is
  // released: close() can be a round trip too.
  std::vector<std::shared_ptr<const ShardFile>> dropped;
  std::lock_guard lock(mutex_);
  if (const auto it = index_.find(path); it != index_.end()) {
    // Another reader opened the same path meanwhile. The same file: share its descriptor
    // (ours closes on return). Another file: ours is at least as new, so it replaces it.
    if (it->second->file->device() == file->device() && it->second->file->inode() == file->inode()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->file;
    }
    dropped.push_back(std::exchange(it->second->file, file));
    lru_.splice(lru_.begin(), lru_, it->second);
    return file;
  }
  lru_.push_front(Entry{path, file});
  index_.emplace(path, lru_.begin());
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().path);
    dropped.push_back(std::move(lru_.back().file));  // a reader still holding it keeps it open
    lru_.pop_back();
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
  return file;
}

ShardFileCacheStats ShardFileCache::stats() const {
  return {hits_.load(), opens_.load(), changed_.load(), evictions_.load(), live_->load()};
}

}  // namespace shardmix
