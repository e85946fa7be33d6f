#include "common/job_token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shardmix {

std::uint32_t job_token_from_text(std::string_view text) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : text) {
    h ^= c;
    h *= 16777619u;
  }
  return h == 0 ? 1 : h;
}

std::optional<std::uint32_t> job_token_from_env() {
  const char* v = std::getenv(kJobTokenEnv);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return job_token_from_text(v);
}

std::uint32_t random_job_token() {
  std::uint32_t token = 0;
  while (token == 0) {
    if (::getrandom(&token, sizeof(token), 0) != static_cast<ssize_t>(sizeof(token))) {
      // No entropy source at all (never seen on Linux >= 3.17): fall back to time and pid.
      token = static_cast<std::uint32_t>(::getpid()) * 2654435761u ^ static_cast<std::uint32_t>(::time(nullptr));
    }
  }
  return token;
}

Status write_job_token_file(const std::string& path, std::uint32_t token) {
  // Per process: daemons sharing a run dir (on a shared file system) write at once.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return make_error(StatusCode::kIoError, "cannot create job token file {}: {}", tmp, std::strerror(errno));
  char text[16];
  const int n = std::snprintf(text, sizeof(text), "%08x\n", token);
  const bool written = ::write(fd, text, static_cast<std::size_t>(n)) == n;
  ::close(fd);
  if (!written) return make_error(StatusCode::kIoError, "cannot write job token file {}", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return make_error(StatusCode::kIoError, "cannot rename {} to {}: {}", tmp, path, std::strerror(errno));
  }
  return Status::ok_status();
}

Result<std::uint32_t> read_job_token_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return make_error(errno == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                      "cannot open job token file {}: {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & 0077) != 0) {
    ::close(fd);
    return make_error(StatusCode::kPermissionDenied,
                      "job token file {} is not private to uid {} (owner uid {}, mode {:o}); not using it", path,
                      ::geteuid(), st.st_uid, st.st_mode & 0777);
  }
  char text[32] = {};
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  char* end = nullptr;
  const unsigned long value = n > 0 ? std::strtoul(text, &end, 16) : 0;
  if (n <= 0 || end == text || (*end != '\n' && *end != '\0') || value == 0 || value > 0xffffffffUL) {
    return make_error(StatusCode::kCorrupt, "job token file {} does not hold a token (8 hex digits)", path);
  }
  return static_cast<std::uint32_t>(value);
}

}  // namespace shardmix
