// The catalog: every sample of the dataset with its storage location, size and label.
// Built by scanning (work split across daemons), merged in a canonical order so that
// sample ids do not depend on the number of daemons, and serialised for the allgather.
// Two kinds of location:
//  - whole-file formats (folder, filelist): a sample is one file; per-sample overhead is
//    path bytes + 8 (path offset) + 8 (size) + 4 (label);
//  - shard formats (webdataset, tfrecord): a sample is `size` bytes at `offset` in one of
//    a list of shard files, each path stored once; per-sample overhead is 8 (size) +
//    4 (label) + 4 (shard index) + 8 (offset) = 24 bytes, plus each shard's path once.
// Thread-safety: immutable after construction; safe to share between threads.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace shardmix {

using SampleId = std::uint32_t;

// One scanned sample, before ids are assigned.
struct CatalogEntry {
  std::string path;      // whole-file formats: relative to the dataset root (folder) or as written (filelist);
                         // shard formats: empty (the shard is `shard`)
  std::uint64_t size = 0;
  std::int32_t label = 0;
  std::uint32_t shard = 0;   // shard formats: index into the shard list it comes with
  std::uint64_t offset = 0;  // shard formats: byte offset of the sample's first byte in its shard
};

class Catalog {
 public:
  Catalog() = default;

  // Whole-file formats: sorts entries by (label, path) bytewise and assigns ids 0..n-1 in that order.
  static Result<Catalog> from_entries(std::vector<CatalogEntry> entries,
                                      std::vector<std::string> class_names);
  // Shard formats: entries name their shard by index into `shards` (paths relative to the
  // dataset root). Shards are sorted bytewise and those without samples dropped; ids follow
  // (label, shard path, offset). Two samples at the same place are an error.
  static Result<Catalog> from_shard_entries(std::vector<std::string> shards, std::vector<CatalogEntry> entries,
                                            std::vector<std::string> class_names);

  // One node's share under owner-side metadata (decision 0063), for loading it: sample i is
  // entries[i] (the share's local index), in the order given, not the canonical one, and
  // nothing is checked again (sort_scans did). `shards`: the job's shard table for shard
  // formats (entries index it), empty for whole-file formats (entries carry paths).
  static Catalog of_share(const std::vector<std::string>& shards, std::span<const CatalogEntry> entries,
                          std::vector<std::string> class_names);

  // A catalog without files (the simulator's synthetic dataset): sample i has sizes[i] and
  // labels[i]; labels must be non-negative and ascending (ids in label order, as a scan
  // assigns them). Compact: 12 bytes per sample, no paths; file_count() is 0, path() is
  // empty and location() is "synthetic:<id>". The two vectors must have the same length.
  // `samples_per_shard` > 0 lays the catalog out as a shard format's (sim.samples_per_shard):
  // consecutive ids in shards of that many samples named "synthetic-NNNNNNNN", each sample
  // with its shard index and a byte offset, so that its memory is a real shard job's
  // (24 bytes per sample plus the shard paths) and a simulated job reports the same
  // metadata figure as the daemons of that job.
  static Result<Catalog> synthetic(std::vector<std::uint64_t> sizes, std::vector<std::int32_t> labels,
                                   std::uint64_t samples_per_shard = 0);

  std::size_t size() const { return sizes_.size(); }
  bool empty() const { return sizes_.empty(); }
  // True for shard formats: samples live at offsets inside shard files.
  bool sharded() const { return sharded_; }
  // Files the catalog names: one per sample (whole-file formats) or the shards (sorted).
  std::size_t file_count() const { return path_offsets_.empty() ? 0 : path_offsets_.size() - 1; }
  std::string_view file_path(std::size_t index) const {
    return std::string_view(paths_).substr(path_offsets_[index], path_offsets_[index + 1] - path_offsets_[index]);
  }
  // The file holding sample `id`'s bytes, relative to the dataset (sample_file_path resolves it).
  // Empty for a synthetic catalog (no files).
  std::string_view path(SampleId id) const {
    return path_offsets_.empty() ? std::string_view() : file_path(sharded_ ? shards_[id] : id);
  }
  // Byte offset of the sample in that file (0 for whole-file formats).
  std::uint64_t offset(SampleId id) const { return sharded_ ? offsets_[id] : 0; }
  std::uint32_t shard(SampleId id) const { return sharded_ ? shards_[id] : 0; }
  // How traces and messages name a sample: the path (whole-file formats) or
  // "<shard path>@<offset>" (shard formats; see docs/decisions/0018).
  std::string location(SampleId id) const;
  std::uint64_t sample_bytes(SampleId id) const { return sizes_[id]; }
  std::int32_t label(SampleId id) const { return labels_[id]; }
  const std::vector<std::uint64_t>& sizes() const { return sizes_; }
  const std::vector<std::int32_t>& labels() const { return labels_; }
  const std::vector<std::string>& class_names() const { return class_names_; }
  // What the scan found damaged and left out (shard formats; see ScanResult).
  std::uint64_t invalid_samples() const { return invalid_samples_; }
  std::uint64_t invalid_shards() const { return invalid_shards_; }
  void set_invalid_counts(std::uint64_t samples, std::uint64_t shards) {
    invalid_samples_ = samples;
    invalid_shards_ = shards;
  }
  // C for the label-entropy figures: the number of distinct labels (an empty class folder
  // is not a class anyone can receive; the planner's entropy-aware mode counts the same
  // way). O(n log n); call once.
  std::uint64_t num_classes() const;
  std::uint64_t total_bytes() const { return total_bytes_; }
  std::uint64_t max_sample_bytes() const { return max_sample_bytes_; }
  // Bytes this object holds per sample (for the overhead benchmark).
  std::size_t memory_bytes() const;
  // Of those, the file paths and class names: per file, not per sample, in shard formats
  // (what each node keeps beside its own share under owner-side metadata, decision 0055).
  std::size_t file_table_bytes() const;

  // `prefix_bytes` zero bytes come first: room for a frame header, so that a reply frame
  // is built in one buffer (the daemon serializes per GetCatalog request).
  std::vector<std::uint8_t> serialize(std::size_t prefix_bytes = 0) const;
  static Result<Catalog> deserialize(std::span<const std::uint8_t> bytes);

 private:
  std::string paths_;                       // all file paths back to back (samples' or shards')
  std::vector<std::uint64_t> path_offsets_; // file_count()+1 entries
  bool sharded_ = false;
  std::vector<std::uint32_t> shards_;       // shard formats: per sample, index of its shard
  std::vector<std::uint64_t> offsets_;      // shard formats: per sample, offset in its shard
  std::uint64_t invalid_samples_ = 0;
  std::uint64_t invalid_shards_ = 0;
  std::vector<std::uint64_t> sizes_;
  std::vector<std::int32_t> labels_;
  std::vector<std::string> class_names_;
  std::uint64_t total_bytes_ = 0;
  std::uint64_t max_sample_bytes_ = 0;
};

// The slice of the dataset this rank scans, as entries. `class_names` is filled with the
// full sorted class list (every rank lists the top level; it is cheap) for the folder format.
struct ScanResult {
  std::vector<CatalogEntry> entries;
  std::vector<std::string> class_names;
  // What the scan skipped, for the log (sum over ranks; root-level counts come from rank 0).
  std::uint64_t skipped_root_files = 0;      // folder: files directly under dataset.path
  std::uint64_t skipped_hidden = 0;          // names starting with '.' (files and directories)
  std::uint64_t skipped_symlinked_dirs = 0;  // symlinks to directories are not followed
  std::uint64_t skipped_special = 0;         // fifos, sockets, devices
  // Shard formats: the shards this rank scanned (paths relative to the dataset root; entries
  // refer to them by index), and what it found damaged. Damage is skipped and counted unless
  // dataset.strict, in which case scan_partition fails with the first problem instead.
  std::vector<std::string> shards;
  std::uint64_t invalid_samples = 0;  // samples left out (a lost rest of a shard counts as one)
  std::uint64_t invalid_shards = 0;   // shards that could not be read to their end (or at all)
  // One message per problem, naming the file and byte offset; for this rank's log only
  // (not serialised: each rank logs its own).
  std::vector<std::string> problems;
};
// `threads`: how many class folders of the folder format are scanned at once (the other
// formats scan with one thread); the result is the same for any value.
Result<ScanResult> scan_partition(const DatasetConfig& dataset, int rank, int nranks, unsigned threads = 1);
// Shard formats, after listing: scans shards i % nranks == rank of `names` (sorted, relative
// to the shard directory). A listed shard that cannot be opened any more is a problem
// (skipped and counted) or, with dataset.strict, the error.
Result<ScanResult> scan_shard_list(const DatasetConfig& dataset, const std::vector<std::string>& names, int rank,
                                   int nranks);

// Format "filelist": this rank's lines (every nranks-th sample line) of the list `text`
// (named `file` in messages), each sample's size from `size_of(path, line number)` (a stat
// of the file, or the object's listed size on S3).
Result<ScanResult> parse_file_list(const std::string& text, const std::string& file, int rank, int nranks,
                                   const std::function<Result<std::uint64_t>(std::string_view, std::size_t)>& size_of);

// One shard's scan appended to `out` (its samples, problems and counts; dataset.strict turns
// the first problem into the error). `name` is the shard's path relative to the dataset.
class ByteSource;
Status add_shard_scan(const DatasetConfig& dataset, const ByteSource& source, const std::string& name,
                      ScanResult& out);
// A listed shard that cannot be read any more: a counted problem, or with dataset.strict `why`.
Status add_unreadable_shard(const DatasetConfig& dataset, const Status& why, ScanResult& out);

// Merges the per-rank scans (already allgathered) into the catalog, checking
// dataset.max_sample_bytes. An empty dataset is an error naming dataset.path.
Result<Catalog> merge_scans(const DatasetConfig& dataset, std::vector<ScanResult> parts);

// The errors merge_scans reports, for the owner-side catalog's checks too
// (distributed_catalog.h): no (valid) sample at all, and a sample over
// dataset.max_sample_bytes (`location` as Catalog::location names it).
Status empty_dataset_error(const DatasetConfig& dataset, std::uint64_t invalid_samples, std::uint64_t invalid_shards);
Status sample_too_large_error(const DatasetConfig& dataset, std::string_view location, std::uint64_t bytes);

// Serialisation of one rank's ScanResult for the allgather.
std::vector<std::uint8_t> serialize_scan(const ScanResult& scan);
Result<ScanResult> deserialize_scan(std::span<const std::uint8_t> bytes);

// Absolute path of a catalog file (a sample's file, or a shard) on storage. For shard
// formats dataset.path is one shard when it ends in the format's extension (.tar;
// .tfrecord, .tfrecords), else the directory holding the shards.
std::string sample_file_path(const DatasetConfig& dataset, std::string_view relative_path);

// True for the shard formats (webdataset, tfrecord): samples at offsets inside shard files.
bool is_shard_format(DatasetFormat format);
// How a shard format's sample is named in messages and traces: "<shard path>@<offset>"
// (docs/decisions/0018); Catalog::location uses it.
std::string shard_sample_location(std::string_view shard_path, std::uint64_t offset);

// True when `name` ends in the shard format's extension (.tar; .tfrecord, .tfrecords).
bool has_shard_extension(DatasetFormat format, std::string_view name);

// True when dataset.path names a single shard file (shard formats), by its extension.
bool dataset_is_single_shard(const DatasetConfig& dataset);

}  // namespace shardmix
