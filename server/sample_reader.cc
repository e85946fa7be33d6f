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
  const std::string bucket = root->bucket;
  if (!catalog.sharded()) {  // one object per sample: a whole GET each, length and ETag checked
    std::vector<S3Read> requests;
    requests.reserve(reads.size());
    for (const auto& [id, out] : reads) {
      auto location = parse_s3_url(sample_file_path(dataset, catalog.path(id)), "sample");
      const std::uint64_t size = catalog.sample_bytes(id);
      requests.push_back(S3Read{location.ok() ? location->key : "", 0, std::nullopt, size, {std::span(out, size)}});
    }
    (*client)->read_async(bucket, std::move(requests), std::move(done));
    return;
  }
  // Shard formats: each sample's range covers its framing (read in the same GET and checked
  // on completion); samples near each other in one shard share a GET (merge_nearby_ranges).
  const bool tar = dataset.format == DatasetFormat::kWebDataset;
  const std::size_t head_bytes = tar ? kTarHeaderBytes : kTfRecordHeaderBytes;
  const std::size_t tail_bytes = tar ? 0 : kTfRecordFooterBytes;
  struct Shared {
    std::vector<std::uint8_t> framing;  // per read: head_bytes, then tail_bytes
    std::vector<std::uint8_t> skipped;  // the gaps between merged samples land here, unread
    std::vector<std::pair<SampleId, std::uint8_t*>> reads;
    std::vector<std::vector<std::size_t>> groups;  // GET g carries reads groups[g]
  };
  auto shared = std::make_shared<Shared>();
  shared->framing.resize(reads.size() * (head_bytes + tail_bytes));
  std::vector<ObjectRange> ranges(reads.size());
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const SampleId id = reads[i].first;
    const std::uint64_t offset = catalog.offset(id);
    ranges[i] = ObjectRange{catalog.shard(id), offset - std::min<std::uint64_t>(offset, head_bytes),
                            offset + catalog.sample_bytes(id) + tail_bytes};
  }
  shared->groups = merge_nearby_ranges(ranges, dataset.s3.merge_gap, dataset.s3.merge_max);
  std::uint64_t widest_gap = 0;
  for (const auto& group : shared->groups) {
    for (std::size_t k = 1; k < group.size(); ++k) {
      widest_gap = std::max(widest_gap, ranges[group[k]].begin - ranges[group[k - 1]].end);
    }
  }
  shared->skipped.resize(widest_gap);
  std::vector<S3Read> requests;
  requests.reserve(shared->groups.size());
  for (const auto& group : shared->groups) {
    const SampleId first = reads[group.front()].first;
    auto location = parse_s3_url(sample_file_path(dataset, catalog.path(first)), "sample");
    S3Read r;
    r.key = location.ok() ? location->key : "";
    r.offset = ranges[group.front()].begin;
    r.length = ranges[group.back()].end - r.offset;
    for (std::size_t k = 0; k < group.size(); ++k) {
      const std::size_t i = group[k];
      if (k > 0 && ranges[i].begin > ranges[group[k - 1]].end) {
        r.into.emplace_back(shared->skipped.data(), ranges[i].begin - ranges[group[k - 1]].end);
      }
      const auto [id, out] = reads[i];
      std::uint8_t* frame = shared->framing.data() + i * (head_bytes + tail_bytes);
      // A sample at an offset too small for its header: the range starts at 0 and the
      // completion reports it (below) instead of reading the header's bytes.
      const std::uint64_t head = std::min<std::uint64_t>(catalog.offset(id), head_bytes);
      r.into.emplace_back(frame + head_bytes - head, head);
      r.into.emplace_back(out, catalog.sample_bytes(id));
      r.into.emplace_back(frame + head_bytes, tail_bytes);
    }
    requests.push_back(std::move(r));
  }
  shared->reads = std::move(reads);
  auto finish = [shared, head_bytes, tail_bytes, tar, &catalog, &dataset, done = std::move(done)](
                    std::size_t g, const Status& status) {
    for (const std::size_t i : shared->groups[g]) {
      const auto [id, out] = shared->reads[i];
      if (!status.ok()) {
        done(i, status);
        continue;
      }
      const std::string url = sample_file_path(dataset, catalog.path(id));
      const std::uint64_t offset = catalog.offset(id);
      const std::uint64_t size = catalog.sample_bytes(id);
      if (offset < head_bytes) {
        done(i, make_error(StatusCode::kCorrupt, "{}: sample offset {} leaves no room for its header", url, offset));
        continue;
      }
      const std::span<const std::uint8_t> frame(shared->framing.data() + i * (head_bytes + tail_bytes),
                                                head_bytes + tail_bytes);
      done(i, tar ? check_tar_header_before(frame.first(head_bytes), size, url, offset)
                  : check_tfrecord_record(frame.first(head_bytes), std::span<const std::uint8_t>(out, size),
                                          frame.subspan(head_bytes, tail_bytes), url, offset));
    }
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
