#include "server/sample_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <memory>

#include "common/s3_client.h"
#include "common/shard_formats.h"

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

namespace {

// One preadv of [head][sample][tail] at `offset - head.size()`; head and tail are the
// format's framing around the sample, checked by the caller. Errors name file and offset.
Status read_framed(const std::string& path, std::uint64_t offset, std::uint64_t size, std::span<std::uint8_t> head,
                   std::uint8_t* out, std::span<std::uint8_t> tail, ShardFileCache* open_shards) {
  // Held until this read is done, so an eviction meanwhile cannot close it under us.
  auto file = open_shards != nullptr ? open_shards->acquire(path) : open_shard_file(path);
  if (!file.ok()) {
    return make_error(file.status().code(),
                      "{}: cannot open the shard to read the sample at offset {}: {} (it was present when the "
                      "dataset was scanned)",
                      path, offset, file.status().message());
  }
  const int fd = (*file)->fd();
  const std::uint64_t start = offset - head.size();
  const std::uint64_t total = head.size() + size + tail.size();
  std::uint64_t done = 0;
  Status status;
  while (done < total) {
    // Rebuild the iovecs past what has been read (a short read may stop anywhere).
    iovec iov[3];
    int n_iov = 0;
    std::uint64_t skip = done;
    auto add = [&](std::uint8_t* base, std::uint64_t len) {
      if (skip >= len) {
        skip -= len;
        return;
      }
      iov[n_iov++] = iovec{base + skip, static_cast<std::size_t>(len - skip)};
      skip = 0;
    };
    add(head.data(), head.size());
    add(out, size);
    add(tail.data(), tail.size());
    const ssize_t n = ::preadv(fd, iov, n_iov, static_cast<off_t>(start + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      status = make_error(StatusCode::kIoError, "{}: read failed at offset {} (sample at offset {}): {}", path,
                          start + done, offset, std::strerror(errno));
      break;
    }
    if (n == 0) {
      status = make_error(StatusCode::kCorrupt,
                          "{}: the shard ends at offset {}, inside the sample at offset {} ({} bytes): it changed since "
                          "the scan",
                          path, start + done, offset, size);
      break;
    }
    done += static_cast<std::uint64_t>(n);
  }
  return status;
}

}  // namespace

void read_samples_s3(const Catalog& catalog, const DatasetConfig& dataset,
                     std::vector<std::pair<SampleId, std::uint8_t*>> reads,
                     std::function<void(std::size_t, const Status&)> done) {
  auto client = shared_s3_client(dataset.s3);
  auto root = parse_s3_url(dataset.path, "dataset.path");
  if (!client.ok() || !root.ok()) {
    const Status why = !client.ok() ? client.status() : root.status();
    for (std::size_t i = 0; i < reads.size(); ++i) done(i, why);
    return;
  }
  // The framing around each shard sample, read in the same GET and checked on completion.
  const bool tar = catalog.sharded() && dataset.format == DatasetFormat::kWebDataset;
  const std::size_t head_bytes = !catalog.sharded() ? 0 : tar ? kTarHeaderBytes : kTfRecordHeaderBytes;
  const std::size_t tail_bytes = catalog.sharded() && !tar ? kTfRecordFooterBytes : 0;
  struct Framing {
    std::vector<std::uint8_t> bytes;  // per read: head_bytes, then tail_bytes
    std::vector<std::pair<SampleId, std::uint8_t*>> reads;
  };
  auto framing = std::make_shared<Framing>();
  framing->bytes.resize(reads.size() * (head_bytes + tail_bytes));
  std::vector<S3Read> requests;
  requests.reserve(reads.size());
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const auto [id, out] = reads[i];
    const std::uint64_t size = catalog.sample_bytes(id);
    auto location = parse_s3_url(sample_file_path(dataset, catalog.path(id)), "sample");
    S3Read r;
    r.key = location.ok() ? location->key : "";
    if (!catalog.sharded()) {
      r.expected_size = size;
      r.into = {std::span(out, size)};
    } else {
      const std::uint64_t offset = catalog.offset(id);
      std::uint8_t* frame = framing->bytes.data() + i * (head_bytes + tail_bytes);
      r.offset = offset - std::min<std::uint64_t>(offset, head_bytes);
      r.length = head_bytes + size + tail_bytes;
      r.into = {std::span(frame, head_bytes), std::span(out, size), std::span(frame + head_bytes, tail_bytes)};
    }
    requests.push_back(std::move(r));
  }
  framing->reads = reads;
  const std::string bucket = root->bucket;
  auto finish = [framing, head_bytes, tail_bytes, tar, &catalog, &dataset, done = std::move(done)](
                    std::size_t i, const Status& status) {
    const auto [id, out] = framing->reads[i];
    if (!status.ok() || !catalog.sharded()) {
      done(i, status);
      return;
    }
    const std::string url = sample_file_path(dataset, catalog.path(id));
    const std::uint64_t offset = catalog.offset(id);
    const std::uint64_t size = catalog.sample_bytes(id);
    if (offset < head_bytes) {
      done(i, make_error(StatusCode::kCorrupt, "{}: sample offset {} leaves no room for its header", url, offset));
      return;
    }
    const std::span<const std::uint8_t> frame(framing->bytes.data() + i * (head_bytes + tail_bytes),
                                              head_bytes + tail_bytes);
    done(i, tar ? check_tar_header_before(frame.first(head_bytes), size, url, offset)
                : check_tfrecord_record(frame.first(head_bytes), std::span<const std::uint8_t>(out, size),
                                        frame.subspan(head_bytes, tail_bytes), url, offset));
  };
  (*client)->read_async(bucket, std::move(requests), std::move(finish));
}

Status read_sample(const Catalog& catalog, const DatasetConfig& dataset, SampleId id, std::uint8_t* out,
                   ShardFileCache* open_shards) {
  if (is_s3_path(dataset.path)) {
    std::promise<Status> result;
    read_samples_s3(catalog, dataset, {{id, out}}, [&result](std::size_t, const Status& s) { result.set_value(s); });
    return result.get_future().get();
  }
  const std::string path = sample_file_path(dataset, catalog.path(id));
  const std::uint64_t size = catalog.sample_bytes(id);
  if (!catalog.sharded()) return read_whole_file(path, size, out);
  const std::uint64_t offset = catalog.offset(id);
  if (dataset.format == DatasetFormat::kTfRecord) {
    // Re-check the record's CRCs: cheap next to the read, and a record rewritten since the
    // scan must not be served as if it were the sample.
    std::uint8_t head[kTfRecordHeaderBytes];
    std::uint8_t tail[kTfRecordFooterBytes];
    if (offset < sizeof head) {
      return make_error(StatusCode::kCorrupt, "{}: sample offset {} leaves no room for a TFRecord header", path, offset);
    }
    SHARDMIX_RETURN_IF_ERROR(read_framed(path, offset, size, head, out, tail, open_shards));
    return check_tfrecord_record(head, std::span<const std::uint8_t>(out, size), tail, path, offset);
  }
  if (dataset.format == DatasetFormat::kWebDataset) {
    std::uint8_t head[kTarHeaderBytes];
    if (offset < sizeof head) {
      return make_error(StatusCode::kCorrupt, "{}: sample offset {} leaves no room for a tar header", path, offset);
    }
    SHARDMIX_RETURN_IF_ERROR(read_framed(path, offset, size, head, out, {}, open_shards));
    return check_tar_header_before(head, size, path, offset);
  }
  return make_error(StatusCode::kInvalidArgument,
                    "the catalog holds shard samples but dataset.format = \"{}\" (sample {} at {})",
                    dataset_format_name(dataset.format), id, catalog.location(id));
}

}  // namespace shardmix
