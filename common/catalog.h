// The catalog: every sample of the dataset with its storage location, size and label.
// Built by scanning (work split across daemons), merged in a canonical order so that
// sample ids do not depend on the number of daemons, and serialised for the allgather.
// Per-sample overhead: path bytes + 8 (path offset) + 8 (size) + 4 (label).
// Thread-safety: immutable after construction; safe to share between threads.
#pragma once

#include <cstdint>
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
  std::string path;      // relative to the dataset root (folder) or as written (filelist)
  std::uint64_t size = 0;
  std::int32_t label = 0;
};

class Catalog {
 public:
  Catalog() = default;

  // Sorts entries by (label, path) bytewise and assigns ids 0..n-1 in that order.
  static Result<Catalog> from_entries(std::vector<CatalogEntry> entries,
                                      std::vector<std::string> class_names);

  std::size_t size() const { return sizes_.size(); }
  bool empty() const { return sizes_.empty(); }
  std::string_view path(SampleId id) const {
    return std::string_view(paths_).substr(path_offsets_[id], path_offsets_[id + 1] - path_offsets_[id]);
  }
  std::uint64_t sample_bytes(SampleId id) const { return sizes_[id]; }
  std::int32_t label(SampleId id) const { return labels_[id]; }
  const std::vector<std::uint64_t>& sizes() const { return sizes_; }
  const std::vector<std::int32_t>& labels() const { return labels_; }
  const std::vector<std::string>& class_names() const { return class_names_; }
  // C for the label-entropy figures: the number of distinct labels (an empty class folder
  // is not a class anyone can receive; the planner's entropy-aware mode counts the same
  // way). O(n log n); call once.
  std::uint64_t num_classes() const;
  std::uint64_t total_bytes() const { return total_bytes_; }
  std::uint64_t max_sample_bytes() const { return max_sample_bytes_; }
  // Bytes this object holds per sample (for the overhead benchmark).
  std::size_t memory_bytes() const;

  std::vector<std::uint8_t> serialize() const;
  static Result<Catalog> deserialize(std::span<const std::uint8_t> bytes);

 private:
  std::string paths_;                       // all paths back to back
  std::vector<std::uint64_t> path_offsets_; // size()+1 entries
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
};
Result<ScanResult> scan_partition(const DatasetConfig& dataset, int rank, int nranks);

// Merges the per-rank scans (already allgathered) into the catalog, checking
// dataset.max_sample_bytes. An empty dataset is an error naming dataset.path.
Result<Catalog> merge_scans(const DatasetConfig& dataset, std::vector<ScanResult> parts);

// Serialisation of one rank's ScanResult for the allgather.
std::vector<std::uint8_t> serialize_scan(const ScanResult& scan);
Result<ScanResult> deserialize_scan(std::span<const std::uint8_t> bytes);

// Absolute path of a sample on storage.
std::string sample_file_path(const DatasetConfig& dataset, std::string_view relative_path);

}  // namespace shardmix
