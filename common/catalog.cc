// Catalog building: scanning (folder, file list, or tar / TFRecord shards through
// common/shard_formats), merging per-rank scans in a canonical order, and the byte layouts
// used for the allgather. Decoding is bounds-checked and never trusts a count before
// checking it against the bytes that remain (fuzzed: tests/fuzz/catalog_fuzz.cc).
#include "common/catalog.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>

#include "common/s3_client.h"
#include "common/s3_dataset.h"
#include "common/shard_formats.h"

namespace shardmix {
namespace {

// ---------------------------------------------------------------- byte layouts

constexpr char kCatalogMagic[8] = {'S', 'M', 'X', 'C', 'A', 'T', 0, 2};  // version 2: shard locations
constexpr char kScanMagic[8] = {'S', 'M', 'X', 'S', 'C', 'N', 0, 2};     // version 2: shard locations

class Writer {
 public:
  void bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void i32(std::int32_t v) { u32(static_cast<std::uint32_t>(v)); }
  void str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void reserve(std::size_t n) { out_.reserve(n); }
  void zeros(std::size_t n) { out_.resize(out_.size() + n, 0); }
  std::vector<std::uint8_t> take() { return std::move(out_); }

 private:
  std::vector<std::uint8_t> out_;
};

// Reads little-endian fields; every failure is kCorrupt naming the byte offset and field.
class Reader {
 public:
  Reader(std::span<const std::uint8_t> in, std::string_view what) : in_(in), what_(what) {}

  std::size_t offset() const { return offset_; }
  std::size_t remaining() const { return in_.size() - offset_; }

  Status need(std::size_t n, std::string_view field) const {
    if (n > remaining()) {
      return make_error(StatusCode::kCorrupt, "{}: truncated at byte offset {}: {} needs {} bytes, {} remain", what_,
                        offset_, field, n, remaining());
    }
    return Status::ok_status();
  }
  Status corrupt(std::size_t at, std::string_view why) const {
    return make_error(StatusCode::kCorrupt, "{}: at byte offset {}: {}", what_, at, why);
  }

  Result<std::uint64_t> u64(std::string_view field) {
    SHARDMIX_RETURN_IF_ERROR(need(8, field));
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(in_[offset_ + i]) << (8 * i);
    offset_ += 8;
    return v;
  }
  Result<std::uint32_t> u32(std::string_view field) {
    SHARDMIX_RETURN_IF_ERROR(need(4, field));
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(in_[offset_ + i]) << (8 * i);
    offset_ += 4;
    return v;
  }
  Result<std::string_view> bytes(std::size_t n, std::string_view field) {
    SHARDMIX_RETURN_IF_ERROR(need(n, field));
    std::string_view v(reinterpret_cast<const char*>(in_.data() + offset_), n);
    offset_ += n;
    return v;
  }
  Result<std::string_view> str(std::string_view field) {
    SHARDMIX_ASSIGN_OR_RETURN(std::uint32_t n, u32(field));
    return bytes(n, field);
  }
  // Checks that `count` items of at least `min_item_bytes` each can still follow.
  Status check_count(std::uint64_t count, std::size_t min_item_bytes, std::string_view field) const {
    if (min_item_bytes != 0 && count > remaining() / min_item_bytes) {
      return make_error(StatusCode::kCorrupt,
                        "{}: at byte offset {}: {} = {} needs at least {} bytes per item, only {} bytes remain", what_,
                        offset_, field, count, min_item_bytes, remaining());
    }
    return Status::ok_status();
  }
  Status expect_magic(const char (&magic)[8]) {
    SHARDMIX_RETURN_IF_ERROR(need(8, "magic"));
    if (std::memcmp(in_.data(), magic, 8) != 0) {
      return corrupt(0, "bad magic or version (not this kind of data, or written by another version)");
    }
    offset_ = 8;
    return Status::ok_status();
  }
  Status expect_end() const {
    if (remaining() != 0) return corrupt(offset_, fmt::format("{} unexpected trailing bytes", remaining()));
    return Status::ok_status();
  }

 private:
  std::span<const std::uint8_t> in_;
  std::string_view what_;
  std::size_t offset_ = 0;
};

// ---------------------------------------------------------------- scanning helpers

std::string join_path(std::string_view dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  std::string out(dir);
  if (out.back() != '/') out += '/';
  out += name;
  return out;
}

std::string errno_text(int err) { return std::strerror(err); }

Status errno_status(int err, std::string_view what, std::string_view path) {
  const StatusCode code = err == ENOENT    ? StatusCode::kNotFound
                          : err == EACCES  ? StatusCode::kPermissionDenied
                          : err == EPERM   ? StatusCode::kPermissionDenied
                                           : StatusCode::kIoError;
  return make_error(code, "{} '{}': {}", what, path, errno_text(err));
}

struct DirEntry {
  std::string name;
  struct stat st;       // lstat: the entry itself
  bool is_link = false;
};

// Lists a directory (without "." and ".."), with lstat of every entry.
Result<std::vector<DirEntry>> list_dir(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return errno_status(errno, "cannot read directory", path);
  std::vector<DirEntry> out;
  Status status;
  const int fd = ::dirfd(dir);
  for (;;) {
    errno = 0;
    const dirent* ent = ::readdir(dir);
    if (ent == nullptr) {
      if (errno != 0) status = errno_status(errno, "cannot read directory", path);
      break;
    }
    const std::string_view name(ent->d_name);
    if (name == "." || name == "..") continue;
    DirEntry entry;
    entry.name = std::string(name);
    if (::fstatat(fd, ent->d_name, &entry.st, AT_SYMLINK_NOFOLLOW) != 0) {
      status = errno_status(errno, "cannot stat", join_path(path, name));
      break;
    }
    entry.is_link = S_ISLNK(entry.st.st_mode);
    out.push_back(std::move(entry));
  }
  ::closedir(dir);
  if (!status.ok()) return status;
  return out;
}

// Collects the samples under one class folder (recursively).
Status scan_class_dir(const std::string& root, const std::string& rel_dir, std::int32_t label, ScanResult& out) {
  const std::string abs_dir = join_path(root, rel_dir);
  SHARDMIX_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, list_dir(abs_dir));
  std::vector<std::string> subdirs;
  for (DirEntry& entry : entries) {
    if (entry.name.starts_with('.')) {
      ++out.skipped_hidden;
      continue;
    }
    const std::string rel = join_path(rel_dir, entry.name);
    struct stat st = entry.st;
    if (entry.is_link) {
      const std::string abs = join_path(root, rel);
      if (::stat(abs.c_str(), &st) != 0) {
        return errno_status(errno, "broken symbolic link in the dataset", abs);
      }
      if (S_ISDIR(st.st_mode)) {
        ++out.skipped_symlinked_dirs;
        continue;
      }
    }
    if (S_ISDIR(st.st_mode)) {
      subdirs.push_back(rel);
    } else if (S_ISREG(st.st_mode)) {
      out.entries.push_back(CatalogEntry{rel, static_cast<std::uint64_t>(st.st_size), label});
    } else {
      ++out.skipped_special;
    }
  }
  for (const std::string& sub : subdirs) SHARDMIX_RETURN_IF_ERROR(scan_class_dir(root, sub, label, out));
  return Status::ok_status();
}

Status check_rank(int rank, int nranks) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return make_error(StatusCode::kInvalidArgument, "scan_partition: rank {} is not in [0, nranks = {})", rank, nranks);
  }
  return Status::ok_status();
}

Result<ScanResult> scan_folder(const DatasetConfig& dataset, int rank, int nranks, unsigned threads) {
  const std::string& root = dataset.path;
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return make_error(StatusCode::kNotFound, "dataset.path '{}' does not exist", root);
    }
    return errno_status(err, "cannot stat dataset.path", root);
  }
  if (!S_ISDIR(st.st_mode)) {
    return make_error(StatusCode::kInvalidArgument,
                      "dataset.path '{}' is not a directory (dataset.format = \"folder\" expects a folder of class "
                      "folders; use dataset.format = \"filelist\" for a list file)",
                      root);
  }
  SHARDMIX_ASSIGN_OR_RETURN(std::vector<DirEntry> top, list_dir(root));
  ScanResult out;
  for (const DirEntry& entry : top) {
    if (entry.name.starts_with('.')) {
      if (rank == 0) ++out.skipped_hidden;
      continue;
    }
    if (entry.is_link) {
      struct stat target;
      if (::stat(join_path(root, entry.name).c_str(), &target) == 0 && S_ISDIR(target.st_mode)) {
        if (rank == 0) ++out.skipped_symlinked_dirs;
        continue;
      }
      if (rank == 0) ++out.skipped_root_files;  // a link to a file (or a broken one) at the top
      continue;
    }
    if (S_ISDIR(entry.st.st_mode)) {
      out.class_names.push_back(entry.name);
    } else if (S_ISREG(entry.st.st_mode)) {
      if (rank == 0) ++out.skipped_root_files;
    } else if (rank == 0) {
      ++out.skipped_special;
    }
  }
  std::sort(out.class_names.begin(), out.class_names.end());  // bytewise (char_traits compares unsigned)
  if (out.class_names.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    return make_error(StatusCode::kInvalidArgument, "dataset.path '{}' has too many class folders ({})", root,
                      out.class_names.size());
  }
  // This rank's classes, scanned by `threads` threads: on a cold cache each stat waits for
  // its inode, and only more requests in flight use a disk's (or a parallel file
  // system's) concurrency (docs/decisions/0029). Each class lands in its own slot, joined
  // in class order, so the result does not depend on the thread count or timing.
  std::vector<std::size_t> mine;
  for (std::size_t i = static_cast<std::size_t>(rank); i < out.class_names.size(); i += static_cast<std::size_t>(nranks)) {
    mine.push_back(i);
  }
  std::vector<ScanResult> per_class(mine.size());
  std::vector<Status> statuses(mine.size());
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (std::size_t k = next.fetch_add(1); k < mine.size() && !failed.load(); k = next.fetch_add(1)) {
      statuses[k] = scan_class_dir(root, out.class_names[mine[k]], static_cast<std::int32_t>(mine[k]), per_class[k]);
      // Sorted here, in parallel and on the scanning rank, so that the merged catalog only
      // needs interleaving by label (Catalog::from_entries' order: label, then path).
      std::sort(per_class[k].entries.begin(), per_class[k].entries.end(),
                [](const CatalogEntry& a, const CatalogEntry& b) { return a.path < b.path; });
      if (!statuses[k].ok()) failed = true;
    }
  };
  const std::size_t n_threads = std::clamp<std::size_t>(threads, 1, std::max<std::size_t>(mine.size(), 1));
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < n_threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  // The first failing class in class order: the same error whatever the thread count
  // (classes after it may not have been scanned).
  for (const Status& st : statuses) SHARDMIX_RETURN_IF_ERROR(st);
  std::size_t total = 0;
  for (const ScanResult& part : per_class) total += part.entries.size();
  out.entries.reserve(total);
  for (ScanResult& part : per_class) {
    std::move(part.entries.begin(), part.entries.end(), std::back_inserter(out.entries));
    out.skipped_hidden += part.skipped_hidden;
    out.skipped_symlinked_dirs += part.skipped_symlinked_dirs;
    out.skipped_special += part.skipped_special;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string list_dir_of(const std::string& list_file) {
  const std::size_t slash = list_file.rfind('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return list_file.substr(0, slash);
}

Result<ScanResult> scan_filelist(const DatasetConfig& dataset, int rank, int nranks) {
  const std::string& file = dataset.path;
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return make_error(StatusCode::kNotFound, "dataset.path '{}' does not exist", file);
    return errno_status(err, "cannot stat dataset.path", file);
  }
  if (!S_ISREG(st.st_mode)) {
    return make_error(StatusCode::kInvalidArgument,
                      "dataset.path '{}' is not a regular file (dataset.format = \"filelist\" expects a text file of "
                      "'path label' lines)",
                      file);
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return errno_status(errno, "cannot open dataset list", file);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return make_error(StatusCode::kIoError, "cannot read dataset list '{}'", file);
  return parse_file_list(buffer.str(), file, rank, nranks,
                         [&](std::string_view path, std::size_t line_no) -> Result<std::uint64_t> {
                           const std::string resolved = sample_file_path(dataset, path);
                           struct stat sample_st;
                           if (::stat(resolved.c_str(), &sample_st) != 0) {
                             const int err = errno;
                             return make_error(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                                               "{}:{}: sample '{}': {}", file, line_no, resolved, errno_text(err));
                           }
                           if (!S_ISREG(sample_st.st_mode)) {
                             return make_error(StatusCode::kInvalidArgument, "{}:{}: sample '{}' is not a regular file",
                                               file, line_no, resolved);
                           }
                           return static_cast<std::uint64_t>(sample_st.st_size);
                         });
}

}  // namespace

Result<ScanResult> parse_file_list(const std::string& text, const std::string& file, int rank, int nranks,
                                   const std::function<Result<std::uint64_t>(std::string_view, std::size_t)>& size_of) {
  ScanResult out;
  std::set<std::int32_t> labels;
  std::size_t line_no = 0;
  std::uint64_t sample_index = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line = trim(std::string_view(text).substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty() || line.front() == '#') continue;
    const std::size_t split = line.find_last_of(" \t");
    if (split == std::string_view::npos) {
      return make_error(StatusCode::kInvalidArgument, "{}:{}: expected 'path label', got '{}'", file, line_no, line);
    }
    const std::string_view path = trim(line.substr(0, split));
    const std::string_view label_text = line.substr(split + 1);
    std::int64_t label = -1;
    auto [ptr, ec] = std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    if (ec != std::errc() || ptr != label_text.data() + label_text.size() || label < 0 ||
        label > std::numeric_limits<std::int32_t>::max()) {
      return make_error(StatusCode::kInvalidArgument,
                        "{}:{}: label '{}' is not an integer in 0..{} (line: '{}')", file, line_no, label_text,
                        std::numeric_limits<std::int32_t>::max(), line);
    }
    if (path.empty()) {
      return make_error(StatusCode::kInvalidArgument, "{}:{}: missing path before label {}", file, line_no, label);
    }
    labels.insert(static_cast<std::int32_t>(label));
    if (sample_index++ % static_cast<std::uint64_t>(nranks) != static_cast<std::uint64_t>(rank)) continue;
    SHARDMIX_ASSIGN_OR_RETURN(const std::uint64_t size, size_of(path, line_no));
    out.entries.push_back(CatalogEntry{std::string(path), size, static_cast<std::int32_t>(label)});
  }
  for (std::int32_t label : labels) out.class_names.push_back(std::to_string(label));
  return out;
}

bool has_shard_extension(DatasetFormat format, std::string_view name) {
  if (format == DatasetFormat::kWebDataset) return name.ends_with(".tar");
  return name.ends_with(".tfrecord") || name.ends_with(".tfrecords");
}

namespace {

std::string_view shard_extensions(DatasetFormat format) {
  return format == DatasetFormat::kWebDataset ? "*.tar" : "*.tfrecord or *.tfrecords";
}

// Shard formats: every rank lists the shards (one directory listing, cheap) and scans
// shards i with i % nranks == rank. Damage is a problem (skip and count) unless strict.
Result<ScanResult> scan_shards(const DatasetConfig& dataset, int rank, int nranks) {
  const std::string& root = dataset.path;
  const std::string_view format = dataset_format_name(dataset.format);
  std::vector<std::string> names;  // relative to the shard directory
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return make_error(StatusCode::kNotFound, "dataset.path '{}' does not exist", root);
    return errno_status(err, "cannot stat dataset.path", root);
  }
  ScanResult out;
  if (dataset_is_single_shard(dataset)) {
    if (!S_ISREG(st.st_mode)) {
      return make_error(StatusCode::kInvalidArgument,
                        "dataset.path '{}' ends in {} but is not a regular file (dataset.format = \"{}\" takes one "
                        "shard or a directory of {})",
                        root, shard_extensions(dataset.format), format, shard_extensions(dataset.format));
    }
    const std::size_t slash = root.rfind('/');
    names.push_back(slash == std::string::npos ? root : root.substr(slash + 1));
  } else {
    if (!S_ISDIR(st.st_mode)) {
      return make_error(StatusCode::kInvalidArgument,
                        "dataset.path '{}' is neither a directory nor a file named {} (dataset.format = \"{}\")", root,
                        shard_extensions(dataset.format), format);
    }
    SHARDMIX_ASSIGN_OR_RETURN(std::vector<DirEntry> listing, list_dir(root));
    for (const DirEntry& entry : listing) {
      if (entry.name.starts_with('.')) {
        if (rank == 0) ++out.skipped_hidden;
        continue;
      }
      struct stat target = entry.st;
      if (entry.is_link && ::stat(join_path(root, entry.name).c_str(), &target) != 0) target.st_mode = 0;
      if (!S_ISREG(target.st_mode) || !has_shard_extension(dataset.format, entry.name)) {
        if (rank == 0) ++out.skipped_root_files;  // other files and subdirectories: not shards
        continue;
      }
      names.push_back(entry.name);
    }
    std::sort(names.begin(), names.end());
  }
  SHARDMIX_ASSIGN_OR_RETURN(ScanResult scanned, scan_shard_list(dataset, names, rank, nranks));
  scanned.skipped_hidden += out.skipped_hidden;
  scanned.skipped_root_files += out.skipped_root_files;
  return scanned;
}

}  // namespace

Result<ScanResult> scan_shard_list(const DatasetConfig& dataset, const std::vector<std::string>& names, int rank,
                                   int nranks) {
  SHARDMIX_RETURN_IF_ERROR(check_rank(rank, nranks));
  ScanResult out;
  for (std::size_t i = static_cast<std::size_t>(rank); i < names.size(); i += static_cast<std::size_t>(nranks)) {
    const std::string file = sample_file_path(dataset, names[i]);
    auto source = FileSource::open(file);
    if (!source.ok()) {
      // Listed a moment ago, gone (or unreadable) now.
      SHARDMIX_RETURN_IF_ERROR(add_unreadable_shard(dataset, source.status(), out));
      continue;
    }
    SHARDMIX_RETURN_IF_ERROR(add_shard_scan(dataset, **source, names[i], out));
  }
  return out;
}

Status add_unreadable_shard(const DatasetConfig& dataset, const Status& why, ScanResult& out) {
  if (dataset.strict) return why.with_context("dataset.strict = true");
  out.problems.push_back(fmt::format("{} (shard skipped)", why.message()));
  ++out.invalid_shards;
  return Status::ok_status();
}

Status add_shard_scan(const DatasetConfig& dataset, const ByteSource& source, const std::string& name,
                      ScanResult& out) {
  std::vector<std::string> sample_exts;
  if (dataset.format == DatasetFormat::kWebDataset) {
    SHARDMIX_ASSIGN_OR_RETURN(sample_exts, parse_extension_list(dataset.sample_ext, "dataset.sample_ext"));
  }
  Result<ShardScan> scan =
      dataset.format == DatasetFormat::kWebDataset
          ? scan_webdataset_shard(source, WebDatasetOptions{sample_exts, dataset.label_ext, dataset.max_sample_bytes})
          : scan_tfrecord_shard(source, TfRecordOptions{dataset.label_feature, dataset.max_sample_bytes});
  if (!scan.ok()) return scan.status();
  if (!scan->problems.empty() && dataset.strict) {
    return make_error(StatusCode::kCorrupt, "{} (dataset.strict = true)", scan->problems.front());
  }
  const auto shard_index = static_cast<std::uint32_t>(out.shards.size());
  out.shards.push_back(name);
  for (const ShardSample& sample : scan->samples) {
    out.entries.push_back(CatalogEntry{"", sample.size, sample.label, shard_index, sample.offset});
  }
  out.invalid_samples += scan->invalid_samples;
  if (scan->rest_skipped) ++out.invalid_shards;
  std::move(scan->problems.begin(), scan->problems.end(), std::back_inserter(out.problems));
  return Status::ok_status();
}

namespace {

bool entry_less(const CatalogEntry& a, const CatalogEntry& b) {
  if (a.label != b.label) return a.label < b.label;
  return a.path < b.path;  // bytewise
}

}  // namespace

// ---------------------------------------------------------------- Catalog

Result<Catalog> Catalog::from_entries(std::vector<CatalogEntry> entries, std::vector<std::string> class_names) {
  if (entries.size() > std::numeric_limits<SampleId>::max()) {
    return make_error(StatusCode::kResourceExhausted, "{} samples do not fit 32-bit sample ids", entries.size());
  }
  for (const CatalogEntry& e : entries) {
    if (e.label < 0) return make_error(StatusCode::kInvalidArgument, "sample '{}' has negative label {}", e.path, e.label);
  }
  // Folder scans arrive sorted (each rank sorts its classes, merge_scans interleaves them
  // by label): checking is linear, sorting 1M paths again was most of the catalog
  // exchange's time (docs/decisions/0029).
  if (!std::is_sorted(entries.begin(), entries.end(), entry_less)) std::sort(entries.begin(), entries.end(), entry_less);
  {
    // Duplicates by path, whatever their labels (a file list may give one path two labels);
    // report the bytewise-first one. A hash set instead of a second sort of every path.
    std::unordered_set<std::string_view> seen;
    seen.reserve(entries.size());
    std::optional<std::string_view> first_dup;
    for (const CatalogEntry& e : entries) {
      if (!seen.insert(e.path).second && (!first_dup || e.path < *first_dup)) first_dup = e.path;
    }
    if (first_dup) return make_error(StatusCode::kInvalidArgument, "duplicate sample path '{}' in the dataset", *first_dup);
  }
  return of_share({}, entries, std::move(class_names));
}

Catalog Catalog::of_share(const std::vector<std::string>& shards, std::span<const CatalogEntry> entries,
                          std::vector<std::string> class_names) {
  Catalog c;
  c.sharded_ = !shards.empty();
  // Sized exactly: memory_bytes() counts capacities (the metadata figure).
  std::size_t path_bytes = 0;
  if (c.sharded_) {
    for (const std::string& shard : shards) path_bytes += shard.size();
    c.shards_.reserve(entries.size());
    c.offsets_.reserve(entries.size());
  } else {
    for (const CatalogEntry& e : entries) path_bytes += e.path.size();
  }
  c.paths_.reserve(path_bytes);
  c.path_offsets_.reserve((c.sharded_ ? shards.size() : entries.size()) + 1);
  c.sizes_.reserve(entries.size());
  c.labels_.reserve(entries.size());
  c.path_offsets_.push_back(0);
  if (c.sharded_) {
    for (const std::string& shard : shards) {
      c.paths_ += shard;
      c.path_offsets_.push_back(c.paths_.size());
    }
  }
  for (const CatalogEntry& e : entries) {
    if (c.sharded_) {
      c.shards_.push_back(e.shard);
      c.offsets_.push_back(e.offset);
    } else {
      c.paths_ += e.path;
      c.path_offsets_.push_back(c.paths_.size());
    }
    c.sizes_.push_back(e.size);
    c.labels_.push_back(e.label);
    c.total_bytes_ += e.size;
    c.max_sample_bytes_ = std::max(c.max_sample_bytes_, e.size);
  }
  c.class_names_ = std::move(class_names);
  return c;
}

Result<Catalog> Catalog::synthetic(std::vector<std::uint64_t> sizes, std::vector<std::int32_t> labels,
                                   std::uint64_t samples_per_shard) {
  if (sizes.size() != labels.size()) {
    return make_error(StatusCode::kInvalidArgument, "synthetic catalog: {} sizes but {} labels", sizes.size(),
                      labels.size());
  }
  if (sizes.size() > std::numeric_limits<SampleId>::max()) {
    return make_error(StatusCode::kResourceExhausted, "{} samples do not fit 32-bit sample ids", sizes.size());
  }
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || (i > 0 && labels[i] < labels[i - 1])) {
      return make_error(StatusCode::kInvalidArgument,
                        "synthetic catalog: label {} of sample {} is negative or below its predecessor's (ids must be "
                        "in label order)",
                        labels[i], i);
    }
  }
  Catalog c;
  for (const std::uint64_t size : sizes) {
    c.total_bytes_ += size;
    c.max_sample_bytes_ = std::max(c.max_sample_bytes_, size);
  }
  if (samples_per_shard > 0 && !sizes.empty()) {
    c.sharded_ = true;
    const std::uint64_t shards = (sizes.size() + samples_per_shard - 1) / samples_per_shard;
    c.path_offsets_.reserve(shards + 1);
    c.path_offsets_.push_back(0);
    for (std::uint64_t k = 0; k < shards; ++k) {
      c.paths_ += fmt::format("synthetic-{:08}", k);
      c.path_offsets_.push_back(c.paths_.size());
    }
    c.shards_.resize(sizes.size());
    c.offsets_.resize(sizes.size());
    std::uint64_t offset = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (i % samples_per_shard == 0) offset = 0;
      c.shards_[i] = static_cast<std::uint32_t>(i / samples_per_shard);
      c.offsets_[i] = offset;
      offset += sizes[i];
    }
  }
  c.sizes_ = std::move(sizes);
  c.labels_ = std::move(labels);
  return c;
}

Result<Catalog> Catalog::from_shard_entries(std::vector<std::string> shards, std::vector<CatalogEntry> entries,
                                            std::vector<std::string> class_names) {
  if (entries.size() > std::numeric_limits<SampleId>::max()) {
    return make_error(StatusCode::kResourceExhausted, "{} samples do not fit 32-bit sample ids", entries.size());
  }
  if (shards.size() > std::numeric_limits<std::uint32_t>::max()) {
    return make_error(StatusCode::kResourceExhausted, "{} shards do not fit 32-bit shard indices", shards.size());
  }
  std::vector<bool> used(shards.size(), false);
  for (const CatalogEntry& e : entries) {
    if (e.shard >= shards.size()) {
      return make_error(StatusCode::kInvalidArgument, "sample at offset {} names shard {} of {}", e.offset, e.shard,
                        shards.size());
    }
    if (e.label < 0) {
      return make_error(StatusCode::kInvalidArgument, "sample '{}@{}' has negative label {}", shards[e.shard], e.offset,
                        e.label);
    }
    if (e.offset + e.size < e.offset) {
      return make_error(StatusCode::kInvalidArgument, "sample '{}@{}' of {} bytes ends beyond 2^64", shards[e.shard],
                        e.offset, e.size);
    }
    used[e.shard] = true;
  }
  // Canonical shard list: the used shards in bytewise order; remap the entries to it.
  std::vector<std::uint32_t> order;
  for (std::uint32_t i = 0; i < shards.size(); ++i) {
    if (used[i]) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return shards[a] < shards[b]; });
  std::vector<std::uint32_t> remap(shards.size(), 0);
  for (std::uint32_t i = 0; i < order.size(); ++i) {
    if (i > 0 && shards[order[i]] == shards[order[i - 1]]) {
      return make_error(StatusCode::kInvalidArgument, "duplicate shard '{}' in the dataset", shards[order[i]]);
    }
    remap[order[i]] = i;
  }
  for (CatalogEntry& e : entries) e.shard = remap[e.shard];
  std::sort(entries.begin(), entries.end(), [](const CatalogEntry& a, const CatalogEntry& b) {
    if (a.label != b.label) return a.label < b.label;
    if (a.shard != b.shard) return a.shard < b.shard;
    return a.offset < b.offset;
  });
  {
    std::vector<std::pair<std::uint32_t, std::uint64_t>> places;
    places.reserve(entries.size());
    for (const CatalogEntry& e : entries) places.emplace_back(e.shard, e.offset);
    std::sort(places.begin(), places.end());
    const auto dup = std::adjacent_find(places.begin(), places.end());
    if (dup != places.end()) {
      return make_error(StatusCode::kInvalidArgument, "two samples at offset {} of shard '{}'", dup->second,
                        shards[order[dup->first]]);
    }
  }
  Catalog c;
  c.sharded_ = true;
  c.path_offsets_.reserve(order.size() + 1);
  c.path_offsets_.push_back(0);
  for (std::uint32_t index : order) {
    c.paths_ += shards[index];
    c.path_offsets_.push_back(c.paths_.size());
  }
  c.sizes_.reserve(entries.size());
  c.labels_.reserve(entries.size());
  c.shards_.reserve(entries.size());
  c.offsets_.reserve(entries.size());
  for (const CatalogEntry& e : entries) {
    c.sizes_.push_back(e.size);
    c.labels_.push_back(e.label);
    c.shards_.push_back(e.shard);
    c.offsets_.push_back(e.offset);
    c.total_bytes_ += e.size;
    c.max_sample_bytes_ = std::max(c.max_sample_bytes_, e.size);
  }
  c.class_names_ = std::move(class_names);
  return c;
}

std::string Catalog::location(SampleId id) const {
  if (path_offsets_.empty()) return fmt::format("synthetic:{}", id);
  if (!sharded_) return std::string(path(id));
  return shard_sample_location(path(id), offsets_[id]);
}

std::size_t Catalog::file_table_bytes() const {
  std::size_t bytes = paths_.capacity() + path_offsets_.capacity() * sizeof(std::uint64_t) +
                      class_names_.capacity() * sizeof(std::string);
  for (const std::string& name : class_names_) {
    if (name.capacity() > 15) bytes += name.capacity() + 1;  // heap buffer beyond the small-string buffer
  }
  return bytes;
}

std::size_t Catalog::memory_bytes() const {
  return sizeof(*this) + file_table_bytes() + sizes_.capacity() * sizeof(std::uint64_t) +
         labels_.capacity() * sizeof(std::int32_t) + shards_.capacity() * sizeof(std::uint32_t) +
         offsets_.capacity() * sizeof(std::uint64_t);
}

// Layout (little-endian): magic[8] "SMXCAT\0\2", u32 kind (0 = whole files, 1 = shards),
// u64 samples, u64 classes, classes x (u32 len, bytes), u64 invalid samples, u64 invalid
// shards, u64 files, u64 path_bytes, path bytes, files x u32 path length, samples x u64 size,
// samples x i32 label, and for shards: samples x u32 shard index, samples x u64 offset.
// Whole files: files == samples, samples sorted by (label, path). Shards: shard paths
// strictly increasing, every shard used, samples sorted by (label, shard, offset).
std::vector<std::uint8_t> Catalog::serialize(std::size_t prefix_bytes) const {
  Writer w;
  w.reserve(prefix_bytes + 64 + paths_.size() + file_count() * 4 + size() * (sharded_ ? 24 : 12));
  w.zeros(prefix_bytes);
  w.bytes(kCatalogMagic, 8);
  w.u32(sharded_ ? 1 : 0);
  w.u64(size());
  w.u64(class_names_.size());
  for (const std::string& name : class_names_) w.str(name);
  w.u64(invalid_samples_);
  w.u64(invalid_shards_);
  w.u64(file_count());
  w.u64(paths_.size());
  w.bytes(paths_.data(), paths_.size());
  for (std::size_t i = 0; i < file_count(); ++i) {
    w.u32(static_cast<std::uint32_t>(path_offsets_[i + 1] - path_offsets_[i]));
  }
  for (std::uint64_t s : sizes_) w.u64(s);
  for (std::int32_t l : labels_) w.i32(l);
  if (sharded_) {
    for (std::uint32_t shard : shards_) w.u32(shard);
    for (std::uint64_t offset : offsets_) w.u64(offset);
  }
  return w.take();
}

Result<Catalog> Catalog::deserialize(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, "catalog");
  SHARDMIX_RETURN_IF_ERROR(r.expect_magic(kCatalogMagic));
  SHARDMIX_ASSIGN_OR_RETURN(std::uint32_t kind, r.u32("kind"));
  if (kind > 1) return r.corrupt(8, fmt::format("kind {} is neither 0 (whole files) nor 1 (shards)", kind));
  const bool sharded = kind == 1;
  SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t n, r.u64("sample count"));
  SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t n_classes, r.u64("class count"));
  if (n > std::numeric_limits<SampleId>::max()) {
    return r.corrupt(12, fmt::format("sample count {} exceeds 32-bit sample ids", n));
  }
  SHARDMIX_RETURN_IF_ERROR(r.check_count(n_classes, 4, "class count"));
  Catalog c;
  c.sharded_ = sharded;
  c.class_names_.reserve(n_classes);
  for (std::uint64_t i = 0; i < n_classes; ++i) {
    SHARDMIX_ASSIGN_OR_RETURN(std::string_view name, r.str("class name"));
    c.class_names_.emplace_back(name);
  }
  SHARDMIX_ASSIGN_OR_RETURN(c.invalid_samples_, r.u64("invalid sample count"));
  SHARDMIX_ASSIGN_OR_RETURN(c.invalid_shards_, r.u64("invalid shard count"));
  const std::size_t files_at = r.offset();
  SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t n_files, r.u64("file count"));
  if (!sharded && n_files != n) {
    return r.corrupt(files_at, fmt::format("{} files for {} whole-file samples", n_files, n));
  }
  if (n_files > std::numeric_limits<std::uint32_t>::max()) {
    return r.corrupt(files_at, fmt::format("file count {} exceeds 32-bit shard indices", n_files));
  }
  SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t path_bytes, r.u64("path byte count"));
  SHARDMIX_ASSIGN_OR_RETURN(std::string_view paths, r.bytes(path_bytes, "paths"));
  SHARDMIX_RETURN_IF_ERROR(r.check_count(n_files, 4, "file count"));
  SHARDMIX_RETURN_IF_ERROR(r.check_count(n, sharded ? 24 : 12, "sample count"));
  const std::uint64_t expected = n_files * 4 + n * (sharded ? 24 : 12);
  if (r.remaining() != expected) {
    return r.corrupt(r.offset(), fmt::format("{} files and {} samples need {} more bytes, {} remain{}", n_files, n,
                                             expected, r.remaining(),
                                             r.remaining() > expected ? " (unexpected trailing bytes)" : ""));
  }
  c.paths_.assign(paths);
  c.path_offsets_.reserve(n_files + 1);
  c.path_offsets_.push_back(0);
  for (std::uint64_t i = 0; i < n_files; ++i) {
    const std::size_t at = r.offset();
    SHARDMIX_ASSIGN_OR_RETURN(std::uint32_t len, r.u32("path length"));
    const std::uint64_t end = c.path_offsets_.back() + len;
    if (end > path_bytes) {
      return r.corrupt(at, fmt::format("path of file {} ends at {}, beyond the {} path bytes", i, end, path_bytes));
    }
    c.path_offsets_.push_back(end);
    if (sharded && i > 0 && c.file_path(i) <= c.file_path(i - 1)) {
      return r.corrupt(at, fmt::format("shard {} is not in strictly increasing path order", i));
    }
  }
  if (c.path_offsets_.back() != path_bytes) {
    return r.corrupt(r.offset(), fmt::format("path lengths sum to {}, not the {} path bytes",
                                             c.path_offsets_.back(), path_bytes));
  }
  c.sizes_.reserve(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t size, r.u64("sample size"));
    c.sizes_.push_back(size);
    if (c.total_bytes_ + size < c.total_bytes_) return r.corrupt(r.offset() - 8, "total bytes overflow");
    c.total_bytes_ += size;
    c.max_sample_bytes_ = std::max(c.max_sample_bytes_, size);
  }
  const std::size_t labels_at = r.offset();
  c.labels_.reserve(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::size_t at = r.offset();
    SHARDMIX_ASSIGN_OR_RETURN(std::uint32_t raw, r.u32("label"));
    const auto label = static_cast<std::int32_t>(raw);
    if (label < 0) return r.corrupt(at, fmt::format("sample {} has negative label {}", i, label));
    if (i > 0 && label < c.labels_.back()) return r.corrupt(at, fmt::format("sample {} is not in label order", i));
    c.labels_.push_back(label);
  }
  if (!sharded) {
    std::unordered_set<std::string_view> seen;
    seen.reserve(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::size_t at = labels_at + 4 * i;
      const std::string_view path = c.path(static_cast<SampleId>(i));
      if (i > 0 && c.labels_[i] == c.labels_[i - 1] && path <= c.path(static_cast<SampleId>(i - 1))) {
        return r.corrupt(at, fmt::format("sample {} is not in (label, path) order", i));
      }
      if (!seen.insert(path).second) return r.corrupt(at, fmt::format("duplicate path of sample {}", i));
    }
  } else {
    std::vector<bool> used(n_files, false);
    c.shards_.reserve(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::size_t at = r.offset();
      SHARDMIX_ASSIGN_OR_RETURN(std::uint32_t shard, r.u32("shard index"));
      if (shard >= n_files) return r.corrupt(at, fmt::format("sample {} names shard {} of {}", i, shard, n_files));
      used[shard] = true;
      c.shards_.push_back(shard);
    }
    if (std::find(used.begin(), used.end(), false) != used.end()) {
      return r.corrupt(r.offset(), "a shard without samples (the canonical catalog lists only used shards)");
    }
    c.offsets_.reserve(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::size_t at = r.offset();
      SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t offset, r.u64("sample offset"));
      if (offset + c.sizes_[i] < offset) return r.corrupt(at, fmt::format("sample {} ends beyond 2^64", i));
      if (i > 0 && c.labels_[i] == c.labels_[i - 1] &&
          (c.shards_[i] < c.shards_[i - 1] || (c.shards_[i] == c.shards_[i - 1] && offset <= c.offsets_.back()))) {
        return r.corrupt(at, fmt::format("sample {} is not in (label, shard, offset) order", i));
      }
      c.offsets_.push_back(offset);
    }
    // (label, shard, offset) strictly increasing means no two samples share a place within a
    // label; across labels they must not either.
    std::vector<std::pair<std::uint32_t, std::uint64_t>> places;
    places.reserve(n);
    for (std::uint64_t i = 0; i < n; ++i) places.emplace_back(c.shards_[i], c.offsets_[i]);
    std::sort(places.begin(), places.end());
    if (std::adjacent_find(places.begin(), places.end()) != places.end()) {
      return r.corrupt(r.offset(), "two samples at the same place of one shard");
    }
  }
  SHARDMIX_RETURN_IF_ERROR(r.expect_end());
  return c;
}

// ---------------------------------------------------------------- scans

Result<ScanResult> scan_partition(const DatasetConfig& dataset, int rank, int nranks, unsigned threads) {
  SHARDMIX_RETURN_IF_ERROR(check_rank(rank, nranks));
  if (dataset.path.empty()) return make_error(StatusCode::kInvalidArgument, "dataset.path is empty");
  if (is_s3_path(dataset.path)) return scan_s3_partition(dataset, rank, nranks);
  switch (dataset.format) {
    case DatasetFormat::kFolder: return scan_folder(dataset, rank, nranks, threads);
    case DatasetFormat::kFileList: return scan_filelist(dataset, rank, nranks);
    case DatasetFormat::kWebDataset:
    case DatasetFormat::kTfRecord: return scan_shards(dataset, rank, nranks);
  }
  return make_error(StatusCode::kInternal, "unknown dataset.format");
}

bool is_shard_format(DatasetFormat format) {
  return format == DatasetFormat::kWebDataset || format == DatasetFormat::kTfRecord;
}

std::string shard_sample_location(std::string_view shard_path, std::uint64_t offset) {
  return fmt::format("{}@{}", shard_path, offset);
}

Status empty_dataset_error(const DatasetConfig& dataset, std::uint64_t invalid_samples, std::uint64_t invalid_shards) {
  return make_error(StatusCode::kNotFound, "dataset.path '{}' holds no {}samples (dataset.format = \"{}\"){}",
                    dataset.path, invalid_samples + invalid_shards > 0 ? "valid " : "",
                    dataset_format_name(dataset.format),
                    invalid_samples + invalid_shards > 0
                        ? fmt::format("; {} invalid samples and {} damaged shards were skipped (see the warnings)",
                                      invalid_samples, invalid_shards)
                        : std::string());
}

Status sample_too_large_error(const DatasetConfig& dataset, std::string_view location, std::uint64_t bytes) {
  return make_error(StatusCode::kInvalidArgument,
                    "sample '{}' is {} bytes, larger than dataset.max_sample_bytes = {} (raise the key or remove the "
                    "file)",
                    sample_file_path(dataset, location), bytes, dataset.max_sample_bytes);
}

Result<Catalog> merge_scans(const DatasetConfig& dataset, std::vector<ScanResult> parts) {
  const bool sharded = is_shard_format(dataset.format);
  std::vector<std::string> class_names;
  std::size_t total = 0;
  std::uint64_t invalid_samples = 0, invalid_shards = 0;
  for (std::size_t rank = 0; rank < parts.size(); ++rank) {
    total += parts[rank].entries.size();
    invalid_samples += parts[rank].invalid_samples;
    invalid_shards += parts[rank].invalid_shards;
    if (sharded) continue;  // labels come from inside the shards: classes are computed below
    if (rank == 0) {
      class_names = parts[0].class_names;
    } else if (parts[rank].class_names != class_names) {
      return make_error(StatusCode::kInvalidArgument,
                        "ranks 0 and {} found different classes under dataset.path '{}' ({} vs {} classes); did the "
                        "dataset change during the scan?",
                        rank, dataset.path, class_names.size(), parts[rank].class_names.size());
    }
  }
  if (total == 0) return empty_dataset_error(dataset, invalid_samples, invalid_shards);
  std::vector<CatalogEntry> entries;
  entries.reserve(total);
  Result<Catalog> built = Status::ok_status();
  if (!sharded) {
    for (ScanResult& part : parts) {
      std::move(part.entries.begin(), part.entries.end(), std::back_inserter(entries));
      part.entries = {};
    }
    // Each rank's part is sorted by (label, path) and a class is scanned by one rank, so a
    // stable sort by label alone gives the catalog's order (from_entries checks it).
    std::stable_sort(entries.begin(), entries.end(),
                     [](const CatalogEntry& a, const CatalogEntry& b) { return a.label < b.label; });
    built = Catalog::from_entries(std::move(entries), std::move(class_names));
  } else {
    std::vector<std::string> shards;
    std::set<std::int32_t> labels;
    for (ScanResult& part : parts) {
      const auto base = static_cast<std::uint32_t>(shards.size());
      for (CatalogEntry& e : part.entries) {
        if (e.shard >= part.shards.size()) {
          return make_error(StatusCode::kInternal, "a scan names shard {} of {}", e.shard, part.shards.size());
        }
        e.shard += base;
        labels.insert(e.label);
        entries.push_back(std::move(e));
      }
      std::move(part.shards.begin(), part.shards.end(), std::back_inserter(shards));
      part.entries = {};
    }
    for (std::int32_t label : labels) class_names.push_back(std::to_string(label));
    built = Catalog::from_shard_entries(std::move(shards), std::move(entries), std::move(class_names));
  }
  if (!built.ok()) return built.status();
  Catalog catalog = std::move(*built);
  catalog.set_invalid_counts(invalid_samples, invalid_shards);
  if (catalog.max_sample_bytes() > dataset.max_sample_bytes) {
    for (SampleId id = 0; id < catalog.size(); ++id) {
      if (catalog.sample_bytes(id) > dataset.max_sample_bytes) {
        return sample_too_large_error(dataset, catalog.location(id), catalog.sample_bytes(id));
      }
    }
  }
  return catalog;
}

// Layout (little-endian): magic[8] "SMXSCN\0\2", u64 x4 skip counters (root files, hidden,
// symlinked dirs, special), u64 invalid samples, u64 invalid shards, u64 classes,
// classes x (u32 len, bytes), u64 shards, shards x (u32 len, bytes), u64 entries,
// entries x (u32 len, path bytes, u64 size, i32 label, u32 shard, u64 offset).
// Problems are not carried: each rank logs its own.
std::vector<std::uint8_t> serialize_scan(const ScanResult& scan) {
  Writer w;
  std::size_t bytes = 96;
  for (const CatalogEntry& e : scan.entries) bytes += 28 + e.path.size();
  for (const std::string& shard : scan.shards) bytes += 4 + shard.size();
  w.reserve(bytes);
  w.bytes(kScanMagic, 8);
  w.u64(scan.skipped_root_files);
  w.u64(scan.skipped_hidden);
  w.u64(scan.skipped_symlinked_dirs);
  w.u64(scan.skipped_special);
  w.u64(scan.invalid_samples);
  w.u64(scan.invalid_shards);
  w.u64(scan.class_names.size());
  for (const std::string& name : scan.class_names) w.str(name);
  w.u64(scan.shards.size());
  for (const std::string& shard : scan.shards) w.str(shard);
  w.u64(scan.entries.size());
  for (const CatalogEntry& e : scan.entries) {
    w.str(e.path);
    w.u64(e.size);
    w.i32(e.label);
    w.u32(e.shard);
    w.u64(e.offset);
  }
  return w.take();
}

Result<ScanResult> deserialize_scan(std::span<const std::uint8_t> bytes) {
  Reader r(bytes, "scan");
  SHARDMIX_RETURN_IF_ERROR(r.expect_magic(kScanMagic));
  ScanResult scan;
  SHARDMIX_ASSIGN_OR_RETURN(scan.skipped_root_files, r.u64("skipped root files"));
  SHARDMIX_ASSIGN_OR_RETURN(scan.skipped_hidden, r.u64("skipped hidden"));
  SHARDMIX_ASSIGN_OR_RETURN(scan.skipped_symlinked_dirs, r.u64("skipped symlinked dirs"));
  SHARDMIX_ASSIGN_OR_RETURN(scan.skipped_special, r.u64("skipped special"));
  SHARDMIX_ASSIGN_OR_RETURN(scan.invalid_samples, r.u64("invalid samples"));
  SHARDMIX_ASSIGN_OR_RETURN(scan.invalid_shards, r.u64("invalid shards"));
  SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t n_classes, r.u64("class count"));
  SHARDMIX_RETURN_IF_ERROR(r.check_count(n_classes, 4, "class count"));
  scan.class_names.reserve(n_classes);
  for (std::uint64_t i = 0; i < n_classes; ++i) {
    SHARDMIX_ASSIGN_OR_RETURN(std::string_view name, r.str("class name"));
    scan.class_names.emplace_back(name);
  }
  SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t n_shards, r.u64("shard count"));
  SHARDMIX_RETURN_IF_ERROR(r.check_count(n_shards, 4, "shard count"));
  scan.shards.reserve(n_shards);
  for (std::uint64_t i = 0; i < n_shards; ++i) {
    SHARDMIX_ASSIGN_OR_RETURN(std::string_view shard, r.str("shard path"));
    scan.shards.emplace_back(shard);
  }
  SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t n, r.u64("entry count"));
  SHARDMIX_RETURN_IF_ERROR(r.check_count(n, 28, "entry count"));
  scan.entries.reserve(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    CatalogEntry e;
    SHARDMIX_ASSIGN_OR_RETURN(std::string_view path, r.str("entry path"));
    e.path.assign(path);
    SHARDMIX_ASSIGN_OR_RETURN(e.size, r.u64("entry size"));
    const std::size_t at = r.offset();
    SHARDMIX_ASSIGN_OR_RETURN(std::uint32_t raw, r.u32("entry label"));
    e.label = static_cast<std::int32_t>(raw);
    if (e.label < 0) return r.corrupt(at, fmt::format("entry {} has negative label {}", i, e.label));
    const std::size_t shard_at = r.offset();
    SHARDMIX_ASSIGN_OR_RETURN(e.shard, r.u32("entry shard"));
    SHARDMIX_ASSIGN_OR_RETURN(e.offset, r.u64("entry offset"));
    // Whole-file entries have a path and no place in a shard; shard entries the reverse.
    if (n_shards == 0 ? (e.shard != 0 || e.offset != 0) : (!e.path.empty() || e.shard >= n_shards)) {
      return r.corrupt(shard_at, fmt::format("entry {} names shard {} at offset {} (scan has {} shards{})", i, e.shard,
                                             e.offset, n_shards, e.path.empty() ? "" : " and the entry a path"));
    }
    scan.entries.push_back(std::move(e));
  }
  SHARDMIX_RETURN_IF_ERROR(r.expect_end());
  return scan;
}

bool dataset_is_single_shard(const DatasetConfig& dataset) {
  switch (dataset.format) {
    case DatasetFormat::kWebDataset:
    case DatasetFormat::kTfRecord: return has_shard_extension(dataset.format, dataset.path);
    default: return false;
  }
}

std::string sample_file_path(const DatasetConfig& dataset, std::string_view relative_path) {
  if (dataset.format == DatasetFormat::kFileList) {
    if (relative_path.starts_with('/')) return std::string(relative_path);
    return join_path(list_dir_of(dataset.path), relative_path);
  }
  if (dataset_is_single_shard(dataset)) return join_path(list_dir_of(dataset.path), relative_path);
  return join_path(dataset.path, relative_path);
}

std::uint64_t Catalog::num_classes() const {
  std::vector<std::int32_t> labels = labels_;
  std::sort(labels.begin(), labels.end());
  return static_cast<std::uint64_t>(std::unique(labels.begin(), labels.end()) - labels.begin());
}

}  // namespace shardmix
