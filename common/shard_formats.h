// Sharded dataset formats: tar shards in the WebDataset convention and TFRecord files.
// Everything here decodes bytes from outside (the dataset), so every field is checked
// against the bytes that exist before it is used; the parsers are fuzzed
// (tests/fuzz/tar_fuzz.cc, tests/fuzz/tfrecord_fuzz.cc).
//
// A scan walks one shard and returns where each valid sample's bytes are (offset of the
// first byte, length) and its label. A damaged part of a shard is a *problem*: a message
// naming the file and the byte offset, and a count of the samples lost. What the caller
// does with problems (skip and count, or fail with dataset.strict) is its choice.
// Reading a sample later is by offset (server/sample_reader.cc), never by scanning.
//
// Thread-safety: free functions without shared state; a ByteSource is safe to read from
// several threads (pread / const memory).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace shardmix {

// CRC32C (Castagnoli) as TFRecord uses it, computed by ISA-L (hardware-accelerated).
// crc32c(data) is the standard CRC32C ("123456789" -> 0xe3069283).
std::uint32_t crc32c(std::span<const std::uint8_t> data);
// Incremental form: state starts at kCrc32cInit; crc32c_finish(state) is the CRC.
inline constexpr std::uint32_t kCrc32cInit = 0xffffffffu;
std::uint32_t crc32c_update(std::uint32_t state, std::span<const std::uint8_t> data);
inline std::uint32_t crc32c_finish(std::uint32_t state) { return state ^ 0xffffffffu; }
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
std::uint32_t mask_crc32c(std::uint32_t crc);

// Random access to a shard's bytes.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Shown in every message (the shard's path).
  virtual const std::string& name() const = 0;
  virtual std::uint64_t size() const = 0;
  // Reads exactly out.size() bytes at `offset`; an error names the file and the offset.
  virtual Status read(std::uint64_t offset, std::span<std::uint8_t> out) const = 0;
};

// Bytes in memory (tests, fuzz targets).
class MemorySource final : public ByteSource {
 public:
  MemorySource(std::string name, std::span<const std::uint8_t> bytes) : name_(std::move(name)), bytes_(bytes) {}
  const std::string& name() const override { return name_; }
  std::uint64_t size() const override { return bytes_.size(); }
  Status read(std::uint64_t offset, std::span<std::uint8_t> out) const override;

 private:
  std::string name_;
  std::span<const std::uint8_t> bytes_;
};

// A file read with pread; its size is taken once, at open.
class FileSource final : public ByteSource {
 public:
  static Result<std::unique_ptr<FileSource>> open(const std::string& path);
  ~FileSource() override;
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;
  const std::string& name() const override { return path_; }
  std::uint64_t size() const override { return size_; }
  Status read(std::uint64_t offset, std::span<std::uint8_t> out) const override;

 private:
  FileSource(std::string path, int fd, std::uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// One valid sample of a shard.
struct ShardSample {
  std::uint64_t offset = 0;  // of the sample's first byte in the shard
  std::uint64_t size = 0;
  std::int32_t label = 0;
  bool operator==(const ShardSample&) const = default;
};

struct ShardScan {
  std::vector<ShardSample> samples;   // in shard order
  // One message per damaged place, naming the file and the byte offset.
  std::vector<std::string> problems;
  // Samples lost to those problems. Where the rest of a shard cannot be read (a truncated
  // tar, a corrupt tar header, a TFRecord length that fails its CRC), the unknown number of
  // samples after that point counts as one.
  std::uint64_t invalid_samples = 0;
  bool rest_skipped = false;          // a problem ended the scan of this shard early
};

// ---------------------------------------------------------------- tar (WebDataset)

struct TarMember {
  std::string name;          // full path inside the archive (ustar prefix, GNU long name or pax path applied)
  std::uint64_t header_offset = 0;
  std::uint64_t data_offset = 0;
  std::uint64_t size = 0;
};

struct TarListing {
  std::vector<TarMember> members;  // regular files only, in archive order
  std::vector<std::string> problems;
  bool rest_skipped = false;       // the listing stopped at a truncation or a corrupt header
  // The member whose data the file cuts short, when its header was readable ("" if the cut or
  // the corruption is in a header: then the member is unknown).
  std::string cut_member;
};

// Lists the regular-file members of a tar (ustar, GNU long names 'L', pax 'x' headers with
// path and size; other entry types are passed over). Stops at the end-of-archive block or
// at the end of the file.
TarListing list_tar(const ByteSource& source);

struct WebDatasetOptions {
  std::vector<std::string> sample_exts;  // the data member: the first of these a key has
  std::string label_ext;                 // member with the ASCII label; "" = every label 0
  std::uint64_t max_sample_bytes = ~0ull;
};

// Splits a member name into its WebDataset key (path up to the first dot of the basename)
// and extension (the rest of the basename after that dot, "" if none).
void webdataset_key(std::string_view member, std::string_view& key, std::string_view& ext);

// Groups the members by key (adjacent members with the same key form one sample, as in
// WebDataset) and picks each sample's data member and label.
// An error (not a problem) only when a sample exceeds max_sample_bytes.
Result<ShardScan> scan_webdataset_shard(const ByteSource& source, const WebDatasetOptions& options);

// Parses "sample_ext" text: comma-separated extensions, no dots, none empty.
Result<std::vector<std::string>> parse_extension_list(std::string_view text, std::string_view key);

// ---------------------------------------------------------------- TFRecord

struct TfRecordOptions {
  std::string label_feature;             // int64_list feature of a tf.train.Example; "" = every label 0
  std::uint64_t max_sample_bytes = ~0ull;
};

// Walks the records: u64 length, u32 masked CRC32C of the length, data, u32 masked CRC32C
// of the data; both CRCs are verified.
Result<ShardScan> scan_tfrecord_shard(const ByteSource& source, const TfRecordOptions& options);

// The first and only value of int64_list feature `feature` of a serialized
// tf.train.Example (proto3 wire format, read with a bounds-checked reader; no TensorFlow).
// kNotFound if the feature is absent; kCorrupt for bytes that are not an Example or a
// feature of another kind or with other than one value. Messages say what, not where:
// the caller adds file and offset.
Result<std::int64_t> example_int64_feature(std::span<const std::uint8_t> record, std::string_view feature);

// ---------------------------------------------------------------- read-time checks

// A sample read by offset is checked against what surrounds it, so a shard replaced or
// rewritten since the scan gives an error naming the file and offset instead of wrong bytes.
inline constexpr std::size_t kTarHeaderBytes = 512;
// The tar header right before a member's data: checksum, regular-file type, size.
Status check_tar_header_before(std::span<const std::uint8_t> header, std::uint64_t size, const std::string& file,
                               std::uint64_t data_offset);
inline constexpr std::size_t kTfRecordHeaderBytes = 12;
inline constexpr std::size_t kTfRecordFooterBytes = 4;
// A TFRecord record's length, both masked CRCs.
Status check_tfrecord_record(std::span<const std::uint8_t> header, std::span<const std::uint8_t> data,
                             std::span<const std::uint8_t> footer, const std::string& file, std::uint64_t data_offset);

// ---------------------------------------------------------------- writers (tools, tests)

// Appends one TFRecord record holding `data`.
void append_tfrecord(std::vector<std::uint8_t>& out, std::span<const std::uint8_t> data);
// A serialized tf.train.Example with an int64_list feature and a bytes_list feature.
std::vector<std::uint8_t> make_example(std::string_view int64_feature, std::int64_t value,
                                       std::string_view bytes_feature, std::span<const std::uint8_t> bytes);

// Appends a regular-file member (ustar; a GNU 'L' long-name member first when the name does
// not fit ustar's name/prefix fields). Returns the offset of the member's data in `out`.
std::uint64_t append_tar_member(std::vector<std::uint8_t>& out, std::string_view name,
                                std::span<const std::uint8_t> data);
// Appends the end-of-archive marker (two zero blocks).
void append_tar_end(std::vector<std::uint8_t>& out);

}  // namespace shardmix
