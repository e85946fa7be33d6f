#include "server/sample_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace shardmix {

Status read_whole_file(const std::string& path, std::uint64_t length, std::uint8_t* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error(errno == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                      "{}: cannot open for loading: {} (it was present when the dataset was scanned)", path,
                      std::strerror(errno));
  }
  std::uint64_t done = 0;
  Status status;
  while (done < length) {
    const ssize_t n = ::pread(fd, out + done, length - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      status = make_error(StatusCode::kIoError, "{}: read failed at offset {}: {}", path, done, std::strerror(errno));
      break;
    }
    if (n == 0) {
      status = make_error(StatusCode::kCorrupt, "{}: file shrank since the scan: expected {} bytes, got {} (EOF at offset {})",
                          path, length, done, done);
      break;
    }
    done += static_cast<std::uint64_t>(n);
  }
  if (status.ok()) {
    struct stat st {};
    if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) != length) {
      status = make_error(StatusCode::kCorrupt, "{}: file changed size since the scan: expected {} bytes, now {}", path,
                          length, st.st_size);
    }
  }
  ::close(fd);
  return status;
}

Status read_sample(const Catalog& catalog, const DatasetConfig& dataset, SampleId id, std::uint8_t* out) {
  return read_whole_file(sample_file_path(dataset, catalog.path(id)), catalog.sample_bytes(id), out);
}

}  // namespace shardmix
