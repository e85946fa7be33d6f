#include "common/atomic_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace shardmix {

Status write_file_atomically(const std::string& path, std::string_view text, bool private_file) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!out.flush()) return make_error(StatusCode::kIoError, "cannot write {}", tmp);
  }
  if (private_file && ::chmod(tmp.c_str(), 0600) != 0) {
    return make_error(StatusCode::kIoError, "cannot make {} private (chmod 0600): {}", tmp, std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return make_error(StatusCode::kIoError, "cannot rename {} to {}: {}", tmp, path, std::strerror(errno));
  }
  return Status::ok_status();
}

}  // namespace shardmix
