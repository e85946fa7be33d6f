#include "common/checkpoint_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "common/shard_formats.h"

namespace shardmix {
namespace {

namespace fs = std::filesystem;

constexpr std::array<std::uint8_t, 8> kMagic = {'S', 'M', 'X', 'C', 'K', 'P', 'T', '1'};
constexpr std::string_view kSuffix = ".smxckpt";

void put_u64(std::uint8_t* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put_u32(std::uint8_t* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint64_t get_u64(const std::uint8_t* in) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | in[i];
  return v;
}
std::uint32_t get_u32(const std::uint8_t* in) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | in[i];
  return v;
}

std::string errno_text(int err) { return std::generic_category().message(err); }

// Closes the descriptor on every path out of a function.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { close(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int close() {
    const int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

Status write_all(int fd, const std::uint8_t* data, std::size_t length) {
  while (length > 0) {
    const ssize_t n = ::write(fd, data, length);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status(StatusCode::kIoError, errno_text(errno));
    }
    data += n;
    length -= static_cast<std::size_t>(n);
  }
  return Status::ok_status();
}

// "v12.smxckpt" -> 12; anything else (temporary files, strays) -> 0.
std::uint64_t version_of_file_name(const std::string& file) {
  if (file.size() <= 1 + kSuffix.size() || file[0] != 'v' || !file.ends_with(kSuffix)) return 0;
  std::uint64_t version = 0;
  const char* first = file.data() + 1;
  const char* last = file.data() + file.size() - kSuffix.size();
  const auto [end, ec] = std::from_chars(first, last, version);
  return ec == std::errc() && end == last ? version : 0;
}

}  // namespace

Status validate_checkpoint_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxCheckpointNameBytes) {
    return make_error(StatusCode::kInvalidArgument, "checkpoint name '{}': must be 1 to {} bytes", name,
                      kMaxCheckpointNameBytes);
  }
  if (name.front() == '.') {
    return make_error(StatusCode::kInvalidArgument, "checkpoint name '{}': must not start with '.'", name);
  }
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) {
      return make_error(StatusCode::kInvalidArgument,
                        "checkpoint name '{}': only letters, digits, '.', '_' and '-' are allowed", name);
    }
  }
  return Status::ok_status();
}

fs::path checkpoint_file_path(const fs::path& dir, const CheckpointId& id) {
  return dir / id.name / fmt::format("v{}{}", id.version, kSuffix);
}

Status write_checkpoint_file(const fs::path& dir, const CheckpointId& id, std::span<const std::uint8_t> bytes) {
  const auto fail = [&](std::string_view step, const fs::path& what, const std::string& why) {
    return make_error(StatusCode::kIoError, "writing checkpoint {} to {}: {} {}: {}", to_string(id), dir.string(),
                      step, what.string(), why);
  };
  const fs::path final_path = checkpoint_file_path(dir, id);
  const fs::path name_dir = final_path.parent_path();
  std::error_code ec;
  fs::create_directories(name_dir, ec);
  if (ec) return fail("create directory", name_dir, ec.message());
  const fs::path temp_path = name_dir / fmt::format(".v{}{}.tmp-{}", id.version, kSuffix, ::getpid());

  std::array<std::uint8_t, kCheckpointFileHeaderBytes> header{};
  std::copy(kMagic.begin(), kMagic.end(), header.begin());
  put_u64(header.data() + 8, bytes.size());
  put_u32(header.data() + 16, crc32c(bytes));

  Fd fd(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return fail("create", temp_path, errno_text(errno));
  const auto abandon = [&](std::string_view step, const std::string& why) {
    fd.close();
    std::error_code ignored;
    fs::remove(temp_path, ignored);
    return fail(step, temp_path, why);
  };
  if (Status s = write_all(fd.get(), header.data(), header.size()); !s.ok()) return abandon("write", s.message());
  if (Status s = write_all(fd.get(), bytes.data(), bytes.size()); !s.ok()) return abandon("write", s.message());
  if (::fsync(fd.get()) != 0) return abandon("fsync", errno_text(errno));
  if (fd.close() != 0) return abandon("close", errno_text(errno));
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) return abandon("rename to " + final_path.string() + ":", errno_text(errno));
  // The rename is durable only once the directory entry is.
  Fd dir_fd(::open(name_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0) return fail("open directory", name_dir, errno_text(errno));
  if (::fsync(dir_fd.get()) != 0) return fail("fsync directory", name_dir, errno_text(errno));
  return Status::ok_status();
}

Result<std::vector<std::uint8_t>> read_checkpoint_file(const fs::path& dir, const CheckpointId& id) {
  const fs::path path = checkpoint_file_path(dir, id);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    return make_error(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError, "checkpoint {}: open {}: {}",
                      to_string(id), path.string(), errno_text(err));
  }
  const auto read_exact = [&](std::uint8_t* out, std::size_t length, std::uint64_t offset) -> Status {
    while (length > 0) {
      const ssize_t n = ::pread(fd.get(), out, length, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return make_error(StatusCode::kIoError, "checkpoint {}: read {}: {}", to_string(id), path.string(), errno_text(errno));
      if (n == 0) {
        return make_error(StatusCode::kCorrupt, "checkpoint {}: {} is truncated at offset {}", to_string(id),
                          path.string(), offset);
      }
      out += n;
      length -= static_cast<std::size_t>(n);
      offset += static_cast<std::uint64_t>(n);
    }
    return Status::ok_status();
  };
  std::array<std::uint8_t, kCheckpointFileHeaderBytes> header{};
  if (Status s = read_exact(header.data(), header.size(), 0); !s.ok()) return s;
  if (!std::equal(kMagic.begin(), kMagic.end(), header.begin())) {
    return make_error(StatusCode::kCorrupt, "checkpoint {}: {} is not a ShardMix checkpoint file (bad magic)",
                      to_string(id), path.string());
  }
  const std::uint64_t size = get_u64(header.data() + 8);
  std::error_code ec;
  const std::uintmax_t file_size = fs::file_size(path, ec);
  if (ec || file_size != kCheckpointFileHeaderBytes + size) {
    return make_error(StatusCode::kCorrupt, "checkpoint {}: {} holds {} bytes, its header says {}", to_string(id),
                      path.string(), ec ? 0 : file_size, kCheckpointFileHeaderBytes + size);
  }
  std::vector<std::uint8_t> bytes(size);
  if (Status s = read_exact(bytes.data(), bytes.size(), kCheckpointFileHeaderBytes); !s.ok()) return s;
  if (crc32c(bytes) != get_u32(header.data() + 16)) {
    return make_error(StatusCode::kCorrupt, "checkpoint {}: {} fails its CRC32C check", to_string(id), path.string());
  }
  return bytes;
}

Result<std::vector<CheckpointId>> list_checkpoint_files(const fs::path& dir) {
  std::vector<CheckpointId> out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  for (fs::directory_iterator names(dir, ec), end; !ec && names != end; names.increment(ec)) {
    const std::string name = names->path().filename().string();
    if (!names->is_directory(ec) || !validate_checkpoint_name(name).ok()) continue;
    std::error_code inner;
    for (fs::directory_iterator files(names->path(), inner), fend; !inner && files != fend; files.increment(inner)) {
      const std::uint64_t version = version_of_file_name(files->path().filename().string());
      if (version != 0) out.push_back(CheckpointId{name, version});
    }
    if (inner) return make_error(StatusCode::kIoError, "listing checkpoints in {}: {}", names->path().string(), inner.message());
  }
  if (ec) return make_error(StatusCode::kIoError, "listing checkpoint.dir {}: {}", dir.string(), ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::vector<CheckpointId>> remove_superseded_checkpoint_files(const fs::path& dir, std::string_view name,
                                                                     std::uint32_t retain) {
  Result<std::vector<CheckpointId>> all = list_checkpoint_files(dir);
  if (!all.ok()) return all.status();
  std::vector<CheckpointId> versions;
  for (const CheckpointId& id : *all) {
    if (id.name == name) versions.push_back(id);
  }
  std::vector<CheckpointId> removed;
  const std::size_t keep = std::max<std::uint32_t>(retain, 1);
  if (versions.size() <= keep) return removed;
  for (std::size_t i = 0; i + keep < versions.size(); ++i) {  // ascending: the oldest first
    const fs::path path = checkpoint_file_path(dir, versions[i]);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return make_error(StatusCode::kIoError, "removing superseded checkpoint {}: {}", path.string(), errno_text(errno));
    }
    removed.push_back(versions[i]);
  }
  return removed;
}

}  // namespace shardmix
