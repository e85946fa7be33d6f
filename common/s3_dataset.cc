#include "common/s3_dataset.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "common/s3_client.h"
#include "common/shard_formats.h"

namespace shardmix {
namespace {

// Whole shards held in memory at once while scanning: enough to keep the requests in
// flight, bounded so that a rank's scan does not hold its whole share of the dataset.
constexpr std::uint64_t kScanBatchBytes = 1ull << 30;

bool hidden(std::string_view relative) {
  for (std::size_t at = 0; at < relative.size();) {
    if (relative[at] == '.') return true;
    const std::size_t slash = relative.find('/', at);
    if (slash == std::string_view::npos) break;
    at = slash + 1;
  }
  return false;
}

std::string with_slash(const std::string& prefix) { return prefix.empty() ? prefix : prefix + "/"; }

Result<ScanResult> scan_s3_folder(S3Client& client, const DatasetConfig& dataset, const S3Location& where, int rank,
                                  int nranks) {
  const std::string root = with_slash(where.key);
  std::vector<std::string> class_prefixes;
  SHARDMIX_ASSIGN_OR_RETURN(std::vector<S3Object> top, client.list(where.bucket, root, &class_prefixes, "/"));
  ScanResult out;
  if (rank == 0) out.skipped_root_files = top.size();  // objects directly under the prefix: no class
  for (const std::string& p : class_prefixes) {
    std::string name = p.substr(root.size());
    if (!name.empty() && name.back() == '/') name.pop_back();
    if (name.empty()) continue;
    if (name.starts_with('.')) {
      if (rank == 0) ++out.skipped_hidden;
      continue;
    }
    out.class_names.push_back(std::move(name));
  }
  std::sort(out.class_names.begin(), out.class_names.end());
  for (std::size_t c = static_cast<std::size_t>(rank); c < out.class_names.size(); c += static_cast<std::size_t>(nranks)) {
    SHARDMIX_ASSIGN_OR_RETURN(std::vector<S3Object> objects,
                              client.list(where.bucket, root + out.class_names[c] + "/"));
    std::vector<CatalogEntry> entries;
    for (S3Object& o : objects) {
      std::string relative = o.key.substr(root.size());
      if (relative.ends_with('/')) continue;  // a "folder" marker object, no sample
      if (hidden(relative)) {
        ++out.skipped_hidden;
        continue;
      }
      entries.push_back(CatalogEntry{std::move(relative), o.size, static_cast<std::int32_t>(c)});
    }
    // Sorted per class, as the file scan does, so the merge only interleaves by label.
    std::sort(entries.begin(), entries.end(), [](const CatalogEntry& a, const CatalogEntry& b) { return a.path < b.path; });
    std::move(entries.begin(), entries.end(), std::back_inserter(out.entries));
  }
  return out;
}

Result<ScanResult> scan_s3_shards(S3Client& client, const DatasetConfig& dataset, const S3Location& where, int rank,
                                  int nranks) {
  ScanResult out;
  std::vector<S3Object> shards;  // keys relative to the shard "directory"
  std::string directory;
  if (dataset_is_single_shard(dataset)) {
    const std::size_t slash = where.key.rfind('/');
    directory = slash == std::string::npos ? "" : where.key.substr(0, slash + 1);
    SHARDMIX_ASSIGN_OR_RETURN(std::vector<S3Object> found, client.list(where.bucket, where.key));
    for (S3Object& o : found) {
      if (o.key == where.key) shards.push_back(std::move(o));
    }
    if (shards.empty()) return make_error(StatusCode::kNotFound, "dataset.path '{}': no such object", dataset.path);
  } else {
    directory = with_slash(where.key);
    std::vector<std::string> subfolders;
    SHARDMIX_ASSIGN_OR_RETURN(std::vector<S3Object> listed, client.list(where.bucket, directory, &subfolders, "/"));
    if (rank == 0) out.skipped_root_files += subfolders.size();
    for (S3Object& o : listed) {
      const std::string name = o.key.substr(directory.size());
      if (name.starts_with('.')) {
        if (rank == 0) ++out.skipped_hidden;
      } else if (!has_shard_extension(dataset.format, name)) {
        if (rank == 0) ++out.skipped_root_files;
      } else {
        shards.push_back(std::move(o));
      }
    }
    std::sort(shards.begin(), shards.end(), [](const S3Object& a, const S3Object& b) { return a.key < b.key; });
  }
  std::vector<const S3Object*> mine;
  for (std::size_t i = static_cast<std::size_t>(rank); i < shards.size(); i += static_cast<std::size_t>(nranks)) {
    mine.push_back(&shards[i]);
  }
  // Batches of whole shards: fetched concurrently, then scanned in shard order (the result
  // does not depend on which GET finished first).
  for (std::size_t begin = 0; begin < mine.size();) {
    std::size_t end = begin;
    std::uint64_t bytes = 0;
    while (end < mine.size() && (end == begin || (end - begin < client.settings().concurrency &&
                                                  bytes + mine[end]->size <= kScanBatchBytes))) {
      bytes += mine[end++]->size;
    }
    std::vector<std::vector<std::uint8_t>> buffers(end - begin);
    std::vector<S3Read> reads;
    for (std::size_t i = begin; i < end; ++i) {
      buffers[i - begin].resize(mine[i]->size);
      reads.push_back(S3Read{mine[i]->key, 0, std::nullopt, mine[i]->size, {buffers[i - begin]}});
    }
    const std::vector<Status> got = client.read_all(where.bucket, std::move(reads));
    for (std::size_t i = begin; i < end; ++i) {
      const std::string name = mine[i]->key.substr(directory.size());
      if (!got[i - begin].ok()) {
        SHARDMIX_RETURN_IF_ERROR(add_unreadable_shard(dataset, got[i - begin], out));
        continue;
      }
      const std::string url = fmt::format("s3://{}/{}", where.bucket, mine[i]->key);
      SHARDMIX_RETURN_IF_ERROR(add_shard_scan(dataset, MemorySource(url, buffers[i - begin]), name, out));
    }
    begin = end;
  }
  return out;
}

// The list object, then one listing of its "directory" for every sample's size (no
// request per sample). Paths are keys relative to the list's directory.
Result<ScanResult> scan_s3_filelist(S3Client& client, const DatasetConfig& dataset, const S3Location& where,
                                    int rank, int nranks) {
  const std::size_t slash = where.key.rfind('/');
  const std::string directory = slash == std::string::npos ? "" : where.key.substr(0, slash + 1);
  SHARDMIX_ASSIGN_OR_RETURN(std::vector<S3Object> objects, client.list(where.bucket, directory));
  std::unordered_map<std::string, std::uint64_t> sizes;
  std::optional<std::uint64_t> list_size;
  for (const S3Object& o : objects) {
    if (o.key == where.key) list_size = o.size;
    sizes.emplace(o.key.substr(directory.size()), o.size);
  }
  if (!list_size) return make_error(StatusCode::kNotFound, "dataset.path '{}': no such object", dataset.path);
  std::string text(*list_size, '\0');
  const std::vector<Status> got = client.read_all(
      where.bucket, {S3Read{where.key, 0, std::nullopt, *list_size,
                            {std::span(reinterpret_cast<std::uint8_t*>(text.data()), text.size())}}});
  SHARDMIX_RETURN_IF_ERROR(got.front());
  return parse_file_list(text, dataset.path, rank, nranks,
                         [&](std::string_view path, std::size_t line_no) -> Result<std::uint64_t> {
                           if (path.starts_with('/')) {
                             return make_error(StatusCode::kInvalidArgument,
                                               "{}:{}: sample '{}': an absolute path in a list on S3 (paths are keys "
                                               "relative to the list's prefix)",
                                               dataset.path, line_no, path);
                           }
                           auto it = sizes.find(std::string(path));
                           if (it == sizes.end()) {
                             return make_error(StatusCode::kNotFound, "{}:{}: sample '{}': no such object", dataset.path,
                                               line_no, s3_join(fmt::format("s3://{}/{}", where.bucket, directory), path));
                           }
                           return it->second;
                         });
}

}  // namespace

Result<ScanResult> scan_s3_partition(const DatasetConfig& dataset, int rank, int nranks) {
  SHARDMIX_ASSIGN_OR_RETURN(std::shared_ptr<S3Client> client, shared_s3_client(dataset.s3));
  return scan_s3_partition(*client, dataset, rank, nranks);
}

Result<ScanResult> scan_s3_partition(S3Client& client, const DatasetConfig& dataset, int rank, int nranks) {
  SHARDMIX_ASSIGN_OR_RETURN(S3Location where, parse_s3_url(dataset.path, "dataset.path"));
  switch (dataset.format) {
    case DatasetFormat::kFolder: return scan_s3_folder(client, dataset, where, rank, nranks);
    case DatasetFormat::kWebDataset:
    case DatasetFormat::kTfRecord: return scan_s3_shards(client, dataset, where, rank, nranks);
    case DatasetFormat::kFileList: return scan_s3_filelist(client, dataset, where, rank, nranks);
  }
  return make_error(StatusCode::kInternal, "unknown dataset.format");
}

}  // namespace shardmix
