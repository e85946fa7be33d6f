// shardmix-slowfs: a read-only FUSE passthrough that behaves like a slow shared (parallel)
// file system, for benchmarks (bench/storage.sh, docs/decisions/0027).
//
//   shardmix-slowfs [--latency-ms 2] [--bandwidth-mbps 200] [--burst-kib 1024]
//                   [--open-latency-ms 0] [--writable] [--stats FILE] SOURCE MOUNTPOINT [FUSE options]
//   e.g. shardmix-slowfs --latency-ms 2 --bandwidth-mbps 200 /data /tmp/slow -f -o max_threads=64
//   unmount: fusermount3 -u /tmp/slow
//
// Every read request that returns bytes completes no sooner than --latency-ms after it
// arrived (the delay is per request and overlaps between concurrent requests, like a PFS
// round trip), and then waits for its bytes in one token bucket shared by all requests
// (--bandwidth-mbps, 1 MB = 10^6 bytes; bucket depth --burst-kib): the aggregate rate over
// any interval is at most the cap plus one burst. A read at or past the end of the file
// returns 0 at once (a PFS client knows the size). Files are opened with direct_io, so the
// kernel caches no data and every application read reaches this process; attributes and
// directory entries are cached for an hour (the tree is read-only). Multi-threaded
// (libfuse's default loop; raise -o max_threads=N above the expected concurrency).
// --writable (bench/checkpoint.sh): files can also be created, written, fsync'ed, renamed
// and removed. Written bytes take their turn in the same token bucket as read bytes (one
// link), without the per-request latency: a PFS client's write-back cache pipelines
// writes, so their cost is the link's bandwidth, and fsync waits for what is queued.
// --stats FILE: at unmount, one JSON line with the request count, bytes, mean request
// size and the highest number of reads in flight at once.
#define FUSE_USE_VERSION 35
#include <fuse.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  std::string source;
  std::string stats_file;
  double latency_s = 0.002;
  double open_latency_s = 0;
  double rate_bps = 200e6;  // 0 = no cap
  double burst_bytes = 1024.0 * 1024.0;
  bool writable = false;
};

// A token bucket by reservation: a request takes its bytes at once, possibly driving the
// bucket negative, and sleeps until the deficit has refilled. Requests are thus served at
// the cap in arrival order, however many threads wait. Thread-safe (mutex_).
class TokenBucket {
 public:
  TokenBucket(double rate, double burst) : rate_(rate), burst_(burst), tokens_(burst), last_(Clock::now()) {}
  // Seconds the caller must wait before its `bytes` may be delivered.
  double reserve(double bytes) {
    if (rate_ <= 0) return 0;
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    tokens_ = std::min(burst_, tokens_ + std::chrono::duration<double>(now - last_).count() * rate_);
    last_ = now;
    tokens_ -= bytes;
    return tokens_ >= 0 ? 0 : -tokens_ / rate_;
  }

 private:
  const double rate_;
  const double burst_;
  std::mutex mutex_;
  double tokens_;
  Clock::time_point last_;
};

Settings g_settings;
TokenBucket* g_bucket = nullptr;
std::atomic<unsigned long long> g_reads{0}, g_bytes{0}, g_opens{0}, g_eof_reads{0};
std::atomic<int> g_in_flight{0}, g_max_in_flight{0};
std::atomic<unsigned long long> g_max_request{0};
std::atomic<unsigned long long> g_wait_us{0};  // total bucket wait, all requests
std::atomic<unsigned long long> g_writes{0}, g_written_bytes{0};

std::string real_path(const char* path) { return g_settings.source + path; }

// Sleeps until `seconds` after t0.
void sleep_until(Clock::time_point t0, double seconds) {
  std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
}

int sfs_getattr(const char* path, struct stat* st, struct fuse_file_info* fi) {
  const int rc = fi != nullptr ? ::fstat(static_cast<int>(fi->fh), st) : ::lstat(real_path(path).c_str(), st);
  if (rc != 0) return -errno;
  if (!g_settings.writable) st->st_mode &= ~static_cast<mode_t>(0222);  // read-only
  return 0;
}

int sfs_readdir(const char* path, void* buf, fuse_fill_dir_t filler, off_t, struct fuse_file_info*,
                enum fuse_readdir_flags) {
  DIR* dir = ::opendir(real_path(path).c_str());
  if (dir == nullptr) return -errno;
  while (struct dirent* e = ::readdir(dir)) {
    struct stat st {};
    st.st_ino = e->d_ino;
    st.st_mode = static_cast<mode_t>(e->d_type) << 12;
    if (filler(buf, e->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0)) != 0) break;
  }
  ::closedir(dir);
  return 0;
}

// Opens (or, with O_CREAT from create(), creates) the real file; direct I/O both ways.
int open_real(const char* path, struct fuse_file_info* fi, mode_t mode) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY && !g_settings.writable) return -EROFS;
  const auto t0 = Clock::now();
  const int fd = ::open(real_path(path).c_str(), fi->flags | O_CLOEXEC, mode);
  if (fd < 0) return -errno;
  fi->fh = static_cast<std::uint64_t>(fd);
  fi->direct_io = 1;    // no kernel data cache: every read comes here
  fi->keep_cache = 0;
  ++g_opens;
  if (g_settings.open_latency_s > 0) sleep_until(t0, g_settings.open_latency_s);
  return 0;
}

int sfs_open(const char* path, struct fuse_file_info* fi) { return open_real(path, fi, 0); }

int sfs_read(const char*, char* buf, size_t size, off_t offset, struct fuse_file_info* fi) {
  const auto t0 = Clock::now();
  const int fd = static_cast<int>(fi->fh);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, buf + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  if (done == 0) {  // at or past the end: answered locally, no round trip
    ++g_eof_reads;
    return 0;
  }
  const int now_in_flight = ++g_in_flight;
  int seen = g_max_in_flight.load();
  while (now_in_flight > seen && !g_max_in_flight.compare_exchange_weak(seen, now_in_flight)) {
  }
  unsigned long long big = g_max_request.load();
  while (done > big && !g_max_request.compare_exchange_weak(big, done)) {
  }
  // The round trip, overlapping the (real) read above; then the bytes take their turn on
  // the shared link.
  sleep_until(t0, g_settings.latency_s);
  const double wait = g_bucket->reserve(static_cast<double>(done));
  if (wait > 0) {
    g_wait_us += static_cast<unsigned long long>(wait * 1e6);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  --g_in_flight;
  ++g_reads;
  g_bytes += done;
  return static_cast<int>(done);
}

// --writable only (the read-only mount refuses writers at open and the kernel at mount).
int sfs_create(const char* path, mode_t mode, struct fuse_file_info* fi) {
  fi->flags |= O_CREAT;
  return open_real(path, fi, mode);
}

int sfs_write(const char*, const char* buf, size_t size, off_t offset, struct fuse_file_info* fi) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(static_cast<int>(fi->fh), buf + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    done += static_cast<size_t>(n);
  }
  const double wait = g_bucket->reserve(static_cast<double>(done));
  if (wait > 0) {
    g_wait_us += static_cast<unsigned long long>(wait * 1e6);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  ++g_writes;
  g_written_bytes += done;
  return static_cast<int>(done);
}

int sfs_fsync(const char*, int datasync, struct fuse_file_info* fi) {
  const int fd = static_cast<int>(fi->fh);
  return (datasync != 0 ? ::fdatasync(fd) : ::fsync(fd)) == 0 ? 0 : -errno;
}

int sfs_fsyncdir(const char* path, int, struct fuse_file_info*) {
  const int fd = ::open(real_path(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  const int rc = ::fsync(fd) == 0 ? 0 : -errno;
  ::close(fd);
  return rc;
}

int sfs_mkdir(const char* path, mode_t mode) { return ::mkdir(real_path(path).c_str(), mode) == 0 ? 0 : -errno; }
int sfs_unlink(const char* path) { return ::unlink(real_path(path).c_str()) == 0 ? 0 : -errno; }
int sfs_rmdir(const char* path) { return ::rmdir(real_path(path).c_str()) == 0 ? 0 : -errno; }
int sfs_chmod(const char* path, mode_t mode, struct fuse_file_info*) {
  return ::chmod(real_path(path).c_str(), mode) == 0 ? 0 : -errno;
}
int sfs_utimens(const char* path, const struct timespec tv[2], struct fuse_file_info*) {
  return ::utimensat(AT_FDCWD, real_path(path).c_str(), tv, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : -errno;
}
int sfs_truncate(const char* path, off_t size, struct fuse_file_info* fi) {
  const int rc = fi != nullptr ? ::ftruncate(static_cast<int>(fi->fh), size) : ::truncate(real_path(path).c_str(), size);
  return rc == 0 ? 0 : -errno;
}
int sfs_rename(const char* from, const char* to, unsigned int flags) {
  if (flags != 0) return -EINVAL;  // RENAME_NOREPLACE/EXCHANGE: nothing here asks for them
  return ::rename(real_path(from).c_str(), real_path(to).c_str()) == 0 ? 0 : -errno;
}

int sfs_release(const char*, struct fuse_file_info* fi) {
  ::close(static_cast<int>(fi->fh));
  return 0;
}

int sfs_statfs(const char* path, struct statvfs* st) {
  return ::statvfs(real_path(path).c_str(), st) == 0 ? 0 : -errno;
}

int sfs_access(const char* path, int mask) {
  if ((mask & W_OK) != 0 && !g_settings.writable) return -EROFS;
  return ::access(real_path(path).c_str(), mask) == 0 ? 0 : -errno;
}

void* sfs_init(struct fuse_conn_info* conn, struct fuse_config* cfg) {
  // 1 MiB write requests (the kernel's default is 128 KiB), as a PFS client sends them.
  if (g_settings.writable) conn->max_write = 1u << 20;
  cfg->direct_io = 1;
  cfg->kernel_cache = 0;
  cfg->entry_timeout = 3600;
  cfg->attr_timeout = 3600;
  cfg->negative_timeout = 3600;
  return nullptr;
}

void sfs_destroy(void*) {
  if (g_settings.stats_file.empty()) return;
  std::FILE* f = std::fopen(g_settings.stats_file.c_str(), "a");
  if (f == nullptr) return;
  const unsigned long long reads = g_reads.load();
  std::fprintf(f,
               "{\"latency_ms\": %.3f, \"bandwidth_mbps\": %.1f, \"opens\": %llu, \"reads\": %llu, \"bytes\": %llu, "
               "\"mean_request_bytes\": %.0f, \"max_request_bytes\": %llu, \"max_reads_in_flight\": %d, "
               "\"eof_reads\": %llu, \"bucket_wait_s\": %.3f, \"writes\": %llu, \"written_bytes\": %llu}\n",
               g_settings.latency_s * 1e3, g_settings.rate_bps / 1e6, g_opens.load(), reads, g_bytes.load(),
               reads ? static_cast<double>(g_bytes.load()) / static_cast<double>(reads) : 0.0, g_max_request.load(),
               g_max_in_flight.load(), g_eof_reads.load(), static_cast<double>(g_wait_us.load()) / 1e6,
               g_writes.load(), g_written_bytes.load());
  std::fclose(f);
}

void usage(std::FILE* out) {
  std::fputs(
      "Usage: shardmix-slowfs [--latency-ms MS] [--bandwidth-mbps MBPS] [--burst-kib KIB]\n"
      "                       [--open-latency-ms MS] [--writable] [--stats FILE] SOURCE MOUNTPOINT [FUSE options]\n"
      "Serves SOURCE read-only at MOUNTPOINT; every read request takes at least --latency-ms\n"
      "(default 2) and all reads share one token bucket of --bandwidth-mbps (default 200 MB/s,\n"
      "0 = no cap; depth --burst-kib, default 1024). --open-latency-ms (default 0) delays opens.\n"
      "--writable: also writable; written bytes share the reads' bucket (no per-request latency).\n"
      "FUSE options, e.g. -f (foreground), -o allow_other,max_threads=64. Unmount: fusermount3 -u MOUNTPOINT.\n",
      out);
}

bool parse_number(const char* text, double& out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || v < 0) return false;
  out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> fuse_args{argv[0]};
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto number = [&](double& out, double scale) {
      double v = 0;
      if (i + 1 >= argc || !parse_number(argv[i + 1], v)) {
        std::fprintf(stderr, "shardmix-slowfs: %s needs a non-negative number\n", a.c_str());
        std::exit(2);
      }
      out = v * scale;
      ++i;
    };
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "--latency-ms") {
      number(g_settings.latency_s, 1e-3);
    } else if (a == "--open-latency-ms") {
      number(g_settings.open_latency_s, 1e-3);
    } else if (a == "--bandwidth-mbps") {
      number(g_settings.rate_bps, 1e6);
    } else if (a == "--burst-kib") {
      number(g_settings.burst_bytes, 1024.0);
    } else if (a == "--writable") {
      g_settings.writable = true;
    } else if (a == "--stats") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "shardmix-slowfs: --stats needs a file\n");
        return 2;
      }
      g_settings.stats_file = argv[++i];
    } else if (a == "-o") {  // a FUSE option and its value
      fuse_args.push_back(argv[i]);
      if (i + 1 < argc) fuse_args.push_back(argv[++i]);
    } else if (!a.empty() && a[0] == '-') {
      fuse_args.push_back(argv[i]);
    } else {
      positional.push_back(a);
      if (positional.size() == 2) fuse_args.push_back(argv[i]);  // the mount point
    }
  }
  if (positional.size() != 2) {
    usage(stderr);
    return 2;
  }
  char resolved[PATH_MAX];
  if (::realpath(positional[0].c_str(), resolved) == nullptr) {
    std::fprintf(stderr, "shardmix-slowfs: source '%s': %s\n", positional[0].c_str(), std::strerror(errno));
    return 2;
  }
  g_settings.source = resolved;
  if (g_settings.source == "/") g_settings.source.clear();
  if (!g_settings.stats_file.empty() && g_settings.stats_file[0] != '/') {  // fuse_main may chdir("/")
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof cwd) != nullptr) g_settings.stats_file = std::string(cwd) + "/" + g_settings.stats_file;
  }
  TokenBucket bucket(g_settings.rate_bps, std::max(g_settings.burst_bytes, 1.0));
  g_bucket = &bucket;

  struct fuse_operations ops {};
  ops.getattr = sfs_getattr;
  ops.readdir = sfs_readdir;
  ops.open = sfs_open;
  ops.read = sfs_read;
  ops.release = sfs_release;
  ops.statfs = sfs_statfs;
  ops.access = sfs_access;
  ops.init = sfs_init;
  ops.destroy = sfs_destroy;
  if (g_settings.writable) {
    ops.create = sfs_create;
    ops.write = sfs_write;
    ops.fsync = sfs_fsync;
    ops.fsyncdir = sfs_fsyncdir;
    ops.mkdir = sfs_mkdir;
    ops.unlink = sfs_unlink;
    ops.rmdir = sfs_rmdir;
    ops.chmod = sfs_chmod;
    ops.utimens = sfs_utimens;
    ops.truncate = sfs_truncate;
    ops.rename = sfs_rename;
  }
  fuse_args.push_back(const_cast<char*>("-o"));
  fuse_args.push_back(const_cast<char*>(g_settings.writable ? "default_permissions,fsname=shardmix-slowfs"
                                                            : "ro,default_permissions,fsname=shardmix-slowfs"));
  return fuse_main(static_cast<int>(fuse_args.size()), fuse_args.data(), &ops, nullptr);
}
