#include "server/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace shardmix {

std::string expand_netns_name(std::string_view pattern, int rank) {
  static constexpr std::string_view kRank = "{rank}";
  const std::string rank_text = std::to_string(rank);
  std::string out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t hit = pattern.find(kRank, pos);
    if (hit == std::string_view::npos) break;
    out.append(pattern.substr(pos, hit - pos));
    out += rank_text;
    pos = hit + kRank.size();
  }
  out.append(pattern.substr(pos));
  return out;
}

std::string netns_path(std::string_view name) {
  if (name.find('/') != std::string_view::npos) return std::string(name);
  return "/run/netns/" + std::string(name);
}

Status join_netns(std::string_view pattern, int rank) {
  if (pattern.empty()) return Status::ok_status();
  const std::string name = expand_netns_name(pattern, rank);
  const std::string path = netns_path(name);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return make_error(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                      "fabric.netns = '{}': cannot open {} for network namespace '{}' (daemon rank {}): {}{}", pattern,
                      path, name, rank, std::strerror(err),
                      err == ENOENT ? "; create it first (deploy/netns-cluster.sh up N, or ip netns add)" : "");
  }
  const int rc = ::setns(fd, CLONE_NEWNET);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    return make_error(err == EPERM ? StatusCode::kPermissionDenied : StatusCode::kIoError,
                      "fabric.netns = '{}': setns({}, CLONE_NEWNET) into network namespace '{}' failed (daemon rank "
                      "{}): {}{}",
                      pattern, path, name, rank, std::strerror(err),
                      err == EPERM ? " (joining a namespace needs CAP_SYS_ADMIN, e.g. root)"
                      : err == EINVAL ? " (is it a network namespace file?)"
                                      : "");
  }
  return Status::ok_status();
}

}  // namespace shardmix
