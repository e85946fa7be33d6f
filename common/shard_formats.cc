// Tar (WebDataset) and TFRecord parsing. Every length and offset read from a shard is
// checked against the shard's size before it is used; nothing is allocated from a length
// that has not been checked against max_sample_bytes or a fixed cap.
#include "common/shard_formats.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <isa-l/crc.h>

namespace shardmix {

// ---------------------------------------------------------------- CRC32C

std::uint32_t crc32c_update(std::uint32_t state, std::span<const std::uint8_t> data) {
  // ISA-L takes an int length; feed it in chunks so records above 2 GiB are fine too.
  constexpr std::size_t kChunk = 1u << 30;
  while (!data.empty()) {
    const std::size_t n = std::min(data.size(), kChunk);
    state = crc32_iscsi(const_cast<unsigned char*>(data.data()), static_cast<int>(n), state);
    data = data.subspan(n);
  }
  return state;
}

std::uint32_t crc32c(std::span<const std::uint8_t> data) { return crc32c_finish(crc32c_update(kCrc32cInit, data)); }

std::uint32_t mask_crc32c(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// ---------------------------------------------------------------- sources

Status MemorySource::read(std::uint64_t offset, std::span<std::uint8_t> out) const {
  if (offset > bytes_.size() || out.size() > bytes_.size() - offset) {
    return make_error(StatusCode::kCorrupt, "{}: cannot read {} bytes at offset {}: the data ends at {}", name_,
                      out.size(), offset, bytes_.size());
  }
  if (!out.empty()) std::memcpy(out.data(), bytes_.data() + offset, out.size());
  return Status::ok_status();
}

Result<std::unique_ptr<FileSource>> FileSource::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return make_error(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError, "{}: cannot open (offset 0): {}",
                      path, std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(StatusCode::kIoError, "{}: cannot stat (offset 0): {}", path, std::strerror(err));
  }
  return std::unique_ptr<FileSource>(new FileSource(path, fd, static_cast<std::uint64_t>(st.st_size)));
}

FileSource::~FileSource() {
  if (fd_ >= 0) ::close(fd_);
}

Status FileSource::read(std::uint64_t offset, std::span<std::uint8_t> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(StatusCode::kIoError, "{}: read failed at offset {}: {}", path_, offset + done,
                        std::strerror(errno));
    }
    if (n == 0) {
      return make_error(StatusCode::kCorrupt, "{}: unexpected end of file at offset {} (reading {} bytes at offset {})",
                        path_, offset + done, out.size(), offset);
    }
    done += static_cast<std::size_t>(n);
  }
  return Status::ok_status();
}

// ---------------------------------------------------------------- tar

namespace {

constexpr std::size_t kBlock = 512;
constexpr std::uint64_t kMaxLongName = 64 * 1024;      // GNU 'L' member: a path, never this long
constexpr std::uint64_t kMaxPaxHeader = 1024 * 1024;   // pax 'x' records
constexpr std::uint64_t kMaxLabelMember = 64;          // an ASCII integer with some whitespace

std::uint64_t round_up_block(std::uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// NUL-terminated (or full-width) text field.
std::string_view field_text(const std::uint8_t* h, std::size_t at, std::size_t width) {
  const char* p = reinterpret_cast<const char*>(h + at);
  std::size_t n = 0;
  while (n < width && p[n] != '\0') ++n;
  return std::string_view(p, n);
}

// A numeric field: octal ASCII (leading spaces, terminated by space or NUL), or GNU base-256
// (first byte 0x80: big-endian binary in the remaining bytes). false if malformed or too big.
bool numeric_field(const std::uint8_t* h, std::size_t at, std::size_t width, std::uint64_t& value) {
  value = 0;
  if (h[at] == 0x80) {
    for (std::size_t i = 1; i < width; ++i) {
      if (value > (std::numeric_limits<std::uint64_t>::max() >> 8)) return false;
      value = (value << 8) | h[at + i];
    }
    return true;
  }
  if (h[at] & 0x80) return false;  // negative base-256 (0xff): never a valid size
  std::size_t i = 0;
  while (i < width && h[at + i] == ' ') ++i;
  bool digits = false;
  for (; i < width; ++i) {
    const std::uint8_t c = h[at + i];
    if (c == ' ' || c == '\0') break;
    if (c < '0' || c > '7') return false;
    if (value > (std::numeric_limits<std::uint64_t>::max() >> 3)) return false;
    value = (value << 3) | static_cast<std::uint64_t>(c - '0');
    digits = true;
  }
  for (; i < width; ++i) {
    if (h[at + i] != ' ' && h[at + i] != '\0') return false;
  }
  (void)digits;  // an all-blank field reads as 0 (old tars write them)
  return true;
}

bool checksum_ok(const std::uint8_t* h) {
  std::uint64_t stored = 0;
  if (!numeric_field(h, 148, 8, stored)) return false;
  std::uint64_t unsigned_sum = 0;
  std::int64_t signed_sum = 0;
  for (std::size_t i = 0; i < kBlock; ++i) {
    const std::uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
    unsigned_sum += c;
    signed_sum += static_cast<std::int8_t>(c);
  }
  return stored == unsigned_sum || static_cast<std::int64_t>(stored) == signed_sum;
}

bool all_zero(const std::uint8_t* h) {
  return std::all_of(h, h + kBlock, [](std::uint8_t c) { return c == 0; });
}

// pax extended header records: "<len> <key>=<value>\n". Only path and size matter here.
bool parse_pax(std::string_view text, std::string& path, std::optional<std::uint64_t>& size) {
  while (!text.empty()) {
    std::uint64_t len = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), len);
    if (ec != std::errc() || p == text.data() || len == 0 || len > text.size()) return false;
    const std::string_view record = text.substr(0, len);
    text.remove_prefix(len);
    const std::size_t space = record.find(' ');
    if (space == std::string_view::npos || record.back() != '\n') return false;
    const std::string_view kv = record.substr(space + 1, record.size() - space - 2);
    const std::size_t eq = kv.find('=');
    if (eq == std::string_view::npos) return false;
    const std::string_view key = kv.substr(0, eq);
    const std::string_view value = kv.substr(eq + 1);
    if (key == "path") {
      path.assign(value);
    } else if (key == "size") {
      std::uint64_t v = 0;
      auto [q, ec2] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec2 != std::errc() || q != value.data() + value.size() || value.empty()) return false;
      size = v;
    }
  }
  return true;
}

}  // namespace

TarListing list_tar(const ByteSource& source) {
  TarListing out;
  const std::uint64_t file_size = source.size();
  const std::string& file = source.name();
  std::uint8_t h[kBlock];
  std::string long_name;                    // GNU 'L' for the next member
  std::string pax_path;                     // pax 'x' for the next member
  std::optional<std::uint64_t> pax_size;
  auto stop = [&](std::string message) {
    out.problems.push_back(std::move(message));
    out.rest_skipped = true;
  };
  std::uint64_t offset = 0;
  while (offset < file_size) {
    if (file_size - offset < kBlock) {
      stop(fmt::format("{}: truncated tar: header at offset {} needs {} bytes, the file ends at {}", file, offset, kBlock,
                       file_size));
      break;
    }
    if (Status s = source.read(offset, std::span<std::uint8_t>(h, kBlock)); !s.ok()) {
      stop(s.message());
      break;
    }
    if (all_zero(h)) break;  // end-of-archive (the second zero block is not required)
    if (!checksum_ok(h)) {
      stop(fmt::format("{}: corrupt tar header at offset {}: bad header checksum", file, offset));
      break;
    }
    std::uint64_t size = 0;
    if (!numeric_field(h, 124, 12, size)) {
      stop(fmt::format("{}: corrupt tar header at offset {}: bad size field", file, offset));
      break;
    }
    const char type = static_cast<char>(h[156]);
    if (pax_size && type != 'x' && type != 'g' && type != 'L' && type != 'K') size = *pax_size;
    const std::uint64_t data_offset = offset + kBlock;
    std::string name;
    if (!long_name.empty()) {
      name = long_name;
    } else if (!pax_path.empty()) {
      name = pax_path;
    } else {
      const std::string_view prefix = field_text(h, 345, 155);
      const bool ustar = std::memcmp(h + 257, "ustar", 5) == 0;
      name = ustar && !prefix.empty() ? std::string(prefix) + "/" + std::string(field_text(h, 0, 100))
                                      : std::string(field_text(h, 0, 100));
    }
    if (size > file_size - data_offset) {
      out.cut_member = name;
      stop(fmt::format("{}: truncated tar: member '{}' (header at offset {}) has {} bytes of data at offset {}, the "
                       "file ends at {}",
                       file, name, offset, size, data_offset, file_size));
      break;
    }
    const std::uint64_t next = data_offset + round_up_block(size);
    if (type == 'L' || type == 'x') {
      const std::uint64_t cap = type == 'L' ? kMaxLongName : kMaxPaxHeader;
      if (size > cap) {
        stop(fmt::format("{}: corrupt tar header at offset {}: {} header of {} bytes (at most {} accepted)", file,
                         offset, type == 'L' ? "GNU long-name" : "pax", size, cap));
        break;
      }
      std::string text(size, '\0');
      if (Status s = source.read(data_offset, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(text.data()),
                                                                        text.size()));
          !s.ok()) {
        stop(s.message());
        break;
      }
      if (type == 'L') {
        while (!text.empty() && text.back() == '\0') text.pop_back();
        long_name = std::move(text);
      } else {
        std::string path;
        std::optional<std::uint64_t> psize;
        if (!parse_pax(text, path, psize)) {
          stop(fmt::format("{}: corrupt tar header at offset {}: malformed pax extended header", file, offset));
          break;
        }
        if (!path.empty()) pax_path = std::move(path);
        if (psize) pax_size = psize;
      }
      offset = next;
      continue;
    }
    if (type == 'K' || type == 'g') {  // long link name, global pax header: not needed
      offset = next;
      continue;
    }
    const bool regular = type == '0' || type == '\0' || type == '7';
    if (regular && !name.empty() && name.back() != '/') {
      out.members.push_back(TarMember{std::move(name), offset, data_offset, size});
    }
    long_name.clear();
    pax_path.clear();
    pax_size.reset();
    offset = next;
  }
  return out;
}

void webdataset_key(std::string_view member, std::string_view& key, std::string_view& ext) {
  const std::size_t slash = member.rfind('/');
  const std::size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const std::size_t dot = member.find('.', base);
  if (dot == std::string_view::npos) {
    key = member;
    ext = {};
  } else {
    key = member.substr(0, dot);
    ext = member.substr(dot + 1);
  }
}

Result<std::vector<std::string>> parse_extension_list(std::string_view text, std::string_view key) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty() || item.front() == '.' || item.find('/') != std::string_view::npos) {
      return make_error(StatusCode::kInvalidArgument,
                        "config key '{}': '{}' is not a list of extensions such as \"jpg,png\" (no dots in front, none "
                        "empty)",
                        key, text);
    }
    out.emplace_back(item);
    pos = comma + 1;
  }
  return out;
}

namespace {

// ASCII integer label, surrounding whitespace allowed (WebDataset writes "3" or "3\n").
bool parse_ascii_label(std::string_view text, std::int32_t& label) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  std::int64_t v = -1;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty() || v < 0 ||
      v > std::numeric_limits<std::int32_t>::max()) {
    return false;
  }
  label = static_cast<std::int32_t>(v);
  return true;
}

}  // namespace

Result<ShardScan> scan_webdataset_shard(const ByteSource& source, const WebDatasetOptions& options) {
  TarListing listing = list_tar(source);
  ShardScan out;
  out.problems = std::move(listing.problems);
  out.rest_skipped = listing.rest_skipped;
  const std::string& file = source.name();
  const auto& members = listing.members;
  std::size_t i = 0;
  while (i < members.size()) {
    std::string_view key, ext;
    webdataset_key(members[i].name, key, ext);
    std::size_t end = i + 1;
    for (; end < members.size(); ++end) {
      std::string_view k2, e2;
      webdataset_key(members[end].name, k2, e2);
      if (k2 != key) break;
    }
    // The group [i, end) is one sample. In a shard cut short, the last group is lost with
    // the rest (counted with the cut below) when it may be incomplete: when the cut member
    // has its key, or when the cut is in a header, so that which member it was is unknown.
    if (end == members.size() && listing.rest_skipped) {
      std::string_view cut_key, cut_ext;
      webdataset_key(listing.cut_member, cut_key, cut_ext);
      if (listing.cut_member.empty() || cut_key == key) break;
    }
    const TarMember* data = nullptr;
    for (const std::string& want : options.sample_exts) {
      for (std::size_t m = i; m < end && data == nullptr; ++m) {
        std::string_view k, e;
        webdataset_key(members[m].name, k, e);
        if (e == want) data = &members[m];
      }
      if (data != nullptr) break;
    }
    const TarMember* label_member = nullptr;
    if (!options.label_ext.empty()) {
      for (std::size_t m = i; m < end && label_member == nullptr; ++m) {
        std::string_view k, e;
        webdataset_key(members[m].name, k, e);
        if (e == options.label_ext) label_member = &members[m];
      }
    }
    const std::uint64_t at = members[i].header_offset;
    i = end;
    if (data == nullptr) {
      out.problems.push_back(fmt::format("{}: sample '{}' (header at offset {}) has no member with an extension in "
                                         "dataset.sample_ext",
                                         file, key, at));
      ++out.invalid_samples;
      continue;
    }
    std::int32_t label = 0;
    if (!options.label_ext.empty()) {
      if (label_member == nullptr) {
        out.problems.push_back(fmt::format("{}: sample '{}' (header at offset {}) has no '.{}' label member", file, key,
                                           at, options.label_ext));
        ++out.invalid_samples;
        continue;
      }
      bool ok = label_member->size <= kMaxLabelMember;
      if (ok) {
        std::string text(label_member->size, '\0');
        Status s = source.read(label_member->data_offset,
                               std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(text.data()), text.size()));
        if (!s.ok()) {
          out.problems.push_back(s.message());
          ++out.invalid_samples;
          continue;
        }
        ok = parse_ascii_label(text, label);
      }
      if (!ok) {
        out.problems.push_back(fmt::format("{}: label member '{}' (data at offset {}) is not an ASCII integer in "
                                           "0..2147483647",
                                           file, label_member->name, label_member->data_offset));
        ++out.invalid_samples;
        continue;
      }
    }
    if (data->size > options.max_sample_bytes) {
      return make_error(StatusCode::kInvalidArgument,
                        "{}: sample '{}' at offset {} is {} bytes, larger than dataset.max_sample_bytes = {}", file,
                        data->name, data->data_offset, data->size, options.max_sample_bytes);
    }
    out.samples.push_back(ShardSample{data->data_offset, data->size, label});
  }
  if (listing.rest_skipped) ++out.invalid_samples;
  return out;
}

// ---------------------------------------------------------------- protobuf wire format

namespace {

// A bounds-checked protobuf wire-format reader over one message's bytes.
class WireReader {
 public:
  explicit WireReader(std::span<const std::uint8_t> in) : in_(in) {}
  bool done() const { return pos_ == in_.size(); }

  bool varint(std::uint64_t& v) {
    v = 0;
    for (int i = 0; i < 10; ++i) {
      if (pos_ >= in_.size()) return false;
      const std::uint8_t b = in_[pos_++];
      if (i == 9 && b > 1) return false;  // more than 64 bits
      v |= static_cast<std::uint64_t>(b & 0x7f) << (7 * i);
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Reads a tag; false at a malformed tag.
  bool tag(std::uint32_t& field, std::uint32_t& wire) {
    std::uint64_t t = 0;
    if (!varint(t)) return false;
    field = static_cast<std::uint32_t>(t >> 3);
    wire = static_cast<std::uint32_t>(t & 7);
    return field != 0 && (t >> 3) <= 0x1fffffff;
  }
  bool bytes(std::span<const std::uint8_t>& out) {
    std::uint64_t n = 0;
    if (!varint(n) || n > in_.size() - pos_) return false;
    out = in_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return true;
  }
  bool skip(std::uint32_t wire) {
    std::uint64_t v = 0;
    std::span<const std::uint8_t> s;
    switch (wire) {
      case 0: return varint(v);
      case 1: return advance(8);
      case 2: return bytes(s);
      case 5: return advance(4);
      default: return false;  // groups (3, 4) and 6, 7 do not occur in an Example
    }
  }

 private:
  bool advance(std::size_t n) {
    if (n > in_.size() - pos_) return false;
    pos_ += n;
    return true;
  }
  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
};

Status not_example(std::string_view why) {
  return make_error(StatusCode::kCorrupt, "not a tf.train.Example: {}", why);
}

// Feature { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
Result<std::int64_t> feature_int64(std::span<const std::uint8_t> feature_bytes, std::string_view name) {
  WireReader r(feature_bytes);
  std::optional<std::span<const std::uint8_t>> list;
  std::string_view other;
  while (!r.done()) {
    std::uint32_t field = 0, wire = 0;
    if (!r.tag(field, wire)) return not_example(fmt::format("malformed tag in feature '{}'", name));
    if (field >= 1 && field <= 3 && wire == 2) {
      std::span<const std::uint8_t> s;
      if (!r.bytes(s)) return not_example(fmt::format("feature '{}' runs past its end", name));
      if (field == 3) {
        list = s;
        other = {};
      } else {
        list.reset();
        other = field == 1 ? "bytes_list" : "float_list";
      }
    } else if (!r.skip(wire)) {
      return not_example(fmt::format("malformed field {} in feature '{}'", field, name));
    }
  }
  if (!list) {
    return make_error(StatusCode::kCorrupt, "feature '{}' is {}, not an int64_list", name,
                      other.empty() ? std::string_view("empty") : other);
  }
  // Int64List { repeated int64 value = 1 [packed]; } (unpacked values are accepted too)
  std::vector<std::int64_t> values;
  WireReader l(*list);
  while (!l.done()) {
    std::uint32_t field = 0, wire = 0;
    if (!l.tag(field, wire)) return not_example(fmt::format("malformed tag in int64_list '{}'", name));
    if (field == 1 && wire == 2) {
      std::span<const std::uint8_t> packed;
      if (!l.bytes(packed)) return not_example(fmt::format("int64_list '{}' runs past its end", name));
      WireReader p(packed);
      while (!p.done()) {
        std::uint64_t v = 0;
        if (!p.varint(v)) return not_example(fmt::format("malformed varint in int64_list '{}'", name));
        values.push_back(static_cast<std::int64_t>(v));
        if (values.size() > 1) break;  // more than one value is an error anyway
      }
    } else if (field == 1 && wire == 0) {
      std::uint64_t v = 0;
      if (!l.varint(v)) return not_example(fmt::format("malformed varint in int64_list '{}'", name));
      values.push_back(static_cast<std::int64_t>(v));
    } else if (!l.skip(wire)) {
      return not_example(fmt::format("malformed field {} in int64_list '{}'", field, name));
    }
    if (values.size() > 1) break;
  }
  if (values.size() != 1) {
    return make_error(StatusCode::kCorrupt, "int64_list feature '{}' has {} values, expected exactly 1", name,
                      values.size() > 1 ? std::string("more than 1") : std::string("0"));
  }
  return values[0];
}

}  // namespace

Result<std::int64_t> example_int64_feature(std::span<const std::uint8_t> record, std::string_view feature) {
  // Example { Features features = 1; }  Features { map<string, Feature> feature = 1; }
  // map entries are messages { string key = 1; Feature value = 2; }; the last entry for a key wins.
  std::optional<std::span<const std::uint8_t>> found;
  WireReader ex(record);
  while (!ex.done()) {
    std::uint32_t field = 0, wire = 0;
    if (!ex.tag(field, wire)) return not_example("malformed tag");
    if (field != 1 || wire != 2) {
      if (!ex.skip(wire)) return not_example(fmt::format("malformed field {}", field));
      continue;
    }
    std::span<const std::uint8_t> features;
    if (!ex.bytes(features)) return not_example("features run past the end of the record");
    WireReader fs(features);
    while (!fs.done()) {
      std::uint32_t f2 = 0, w2 = 0;
      if (!fs.tag(f2, w2)) return not_example("malformed tag in features");
      if (f2 != 1 || w2 != 2) {
        if (!fs.skip(w2)) return not_example(fmt::format("malformed field {} in features", f2));
        continue;
      }
      std::span<const std::uint8_t> entry;
      if (!fs.bytes(entry)) return not_example("feature map entry runs past its end");
      WireReader en(entry);
      std::string_view key;
      std::span<const std::uint8_t> value;
      bool has_value = false;
      while (!en.done()) {
        std::uint32_t f3 = 0, w3 = 0;
        if (!en.tag(f3, w3)) return not_example("malformed tag in a feature map entry");
        if ((f3 == 1 || f3 == 2) && w3 == 2) {
          std::span<const std::uint8_t> s;
          if (!en.bytes(s)) return not_example("feature map entry field runs past its end");
          if (f3 == 1) {
            key = std::string_view(reinterpret_cast<const char*>(s.data()), s.size());
          } else {
            value = s;
            has_value = true;
          }
        } else if (!en.skip(w3)) {
          return not_example(fmt::format("malformed field {} in a feature map entry", f3));
        }
      }
      if (key == feature) found = has_value ? value : std::span<const std::uint8_t>();
    }
  }
  if (!found) return make_error(StatusCode::kNotFound, "tf.train.Example has no feature '{}'", feature);
  return feature_int64(*found, feature);
}

// ---------------------------------------------------------------- TFRecord

Result<ShardScan> scan_tfrecord_shard(const ByteSource& source, const TfRecordOptions& options) {
  ShardScan out;
  const std::uint64_t file_size = source.size();
  const std::string& file = source.name();
  std::vector<std::uint8_t> data;
  auto stop = [&](std::string message) {
    out.problems.push_back(std::move(message));
    out.rest_skipped = true;
    ++out.invalid_samples;
  };
  std::uint64_t offset = 0;
  while (offset < file_size) {
    std::uint8_t header[12];
    if (file_size - offset < sizeof header) {
      stop(fmt::format("{}: truncated TFRecord: record header at offset {} needs 12 bytes, the file ends at {}", file,
                       offset, file_size));
      break;
    }
    if (Status s = source.read(offset, header); !s.ok()) {
      stop(s.message());
      break;
    }
    std::uint64_t length = 0;
    std::uint32_t length_crc = 0;
    for (int i = 0; i < 8; ++i) length |= static_cast<std::uint64_t>(header[i]) << (8 * i);
    for (int i = 0; i < 4; ++i) length_crc |= static_cast<std::uint32_t>(header[8 + i]) << (8 * i);
    if (mask_crc32c(crc32c(std::span<const std::uint8_t>(header, 8))) != length_crc) {
      stop(fmt::format("{}: TFRecord record at offset {}: bad length CRC (the rest of the file is skipped)", file,
                       offset));
      break;
    }
    const std::uint64_t data_offset = offset + 12;
    if (length > file_size - data_offset || file_size - data_offset - length < 4) {
      stop(fmt::format("{}: truncated TFRecord: record at offset {} has {} bytes of data at offset {} plus a 4-byte "
                       "CRC, the file ends at {}",
                       file, offset, length, data_offset, file_size));
      break;
    }
    if (length > options.max_sample_bytes) {
      return make_error(StatusCode::kInvalidArgument,
                        "{}: TFRecord record at offset {} is {} bytes, larger than dataset.max_sample_bytes = {}", file,
                        offset, length, options.max_sample_bytes);
    }
    data.resize(static_cast<std::size_t>(length) + 4);
    if (Status s = source.read(data_offset, data); !s.ok()) {
      stop(s.message());
      break;
    }
    const std::span<const std::uint8_t> record(data.data(), static_cast<std::size_t>(length));
    std::uint32_t data_crc = 0;
    for (int i = 0; i < 4; ++i) data_crc |= static_cast<std::uint32_t>(data[length + i]) << (8 * i);
    const std::uint64_t next = data_offset + length + 4;
    if (mask_crc32c(crc32c(record)) != data_crc) {
      out.problems.push_back(fmt::format("{}: TFRecord record at offset {}: bad data CRC (record skipped)", file, offset));
      ++out.invalid_samples;
      offset = next;
      continue;
    }
    std::int32_t label = 0;
    if (!options.label_feature.empty()) {
      auto value = example_int64_feature(record, options.label_feature);
      Status bad = value.ok() ? Status::ok_status() : value.status();
      if (value.ok() && (*value < 0 || *value > std::numeric_limits<std::int32_t>::max())) {
        bad = make_error(StatusCode::kCorrupt, "label {} is not in 0..2147483647", *value);
      }
      if (!bad.ok()) {
        out.problems.push_back(fmt::format("{}: TFRecord record at offset {}: dataset.label_feature '{}': {} (record "
                                           "skipped)",
                                           file, offset, options.label_feature, bad.message()));
        ++out.invalid_samples;
        offset = next;
        continue;
      }
      label = static_cast<std::int32_t>(*value);
    }
    out.samples.push_back(ShardSample{data_offset, length, label});
    offset = next;
  }
  return out;
}

// ---------------------------------------------------------------- read-time checks

Status check_tar_header_before(std::span<const std::uint8_t> header, std::uint64_t size, const std::string& file,
                               std::uint64_t data_offset) {
  const std::uint64_t at = data_offset - kBlock;
  if (header.size() != kBlock || data_offset < kBlock) {
    return make_error(StatusCode::kInternal, "{}: no tar header before offset {}", file, data_offset);
  }
  const std::uint8_t* h = header.data();
  const char type = static_cast<char>(h[156]);
  if (all_zero(h) || !checksum_ok(h) || !(type == '0' || type == '\0' || type == '7')) {
    return make_error(StatusCode::kCorrupt,
                      "{}: no valid tar header at offset {} before the sample at offset {}: the shard changed since "
                      "the scan",
                      file, at, data_offset);
  }
  std::uint64_t stored = 0;
  // A size in a pax header leaves the ustar field 0 (or, from 8 GiB on, unable to hold it);
  // otherwise the field must agree.
  if (numeric_field(h, 124, 12, stored) && size < (1ull << 33) && stored != 0 && stored != size) {
    return make_error(StatusCode::kCorrupt,
                      "{}: the tar member at offset {} now has {} bytes, the catalog {}: the shard changed since the "
                      "scan",
                      file, at, stored, size);
  }
  return Status::ok_status();
}

Status check_tfrecord_record(std::span<const std::uint8_t> header, std::span<const std::uint8_t> data,
                             std::span<const std::uint8_t> footer, const std::string& file, std::uint64_t data_offset) {
  const std::uint64_t at = data_offset - 12;
  std::uint64_t length = 0;
  std::uint32_t length_crc = 0, data_crc = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<std::uint64_t>(header[i]) << (8 * i);
  for (int i = 0; i < 4; ++i) length_crc |= static_cast<std::uint32_t>(header[8 + i]) << (8 * i);
  for (int i = 0; i < 4; ++i) data_crc |= static_cast<std::uint32_t>(footer[i]) << (8 * i);
  if (mask_crc32c(crc32c(header.first(8))) != length_crc || length != data.size()) {
    return make_error(StatusCode::kCorrupt,
                      "{}: TFRecord record at offset {}: the length header no longer matches ({} bytes, catalog {}): "
                      "the file changed since the scan",
                      file, at, length, data.size());
  }
  if (mask_crc32c(crc32c(data)) != data_crc) {
    return make_error(StatusCode::kCorrupt,
                      "{}: TFRecord record at offset {}: bad data CRC: the file changed since the scan", file, at);
  }
  return Status::ok_status();
}

// ---------------------------------------------------------------- writers

namespace {

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_varint(std::vector<std::uint8_t>& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::uint8_t>(v));
}
void put_len_field(std::vector<std::uint8_t>& out, std::uint32_t field, std::span<const std::uint8_t> bytes) {
  put_varint(out, (static_cast<std::uint64_t>(field) << 3) | 2);
  put_varint(out, bytes.size());
  out.insert(out.end(), bytes.begin(), bytes.end());
}
std::span<const std::uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

void write_octal(std::uint8_t* h, std::size_t at, std::size_t width, std::uint64_t value) {
  // width-1 octal digits and a NUL; sizes beyond that use GNU base-256.
  const std::string text = fmt::format("{:0{}o}", value, width - 1);
  if (text.size() > width - 1) {
    std::memset(h + at, 0, width);
    h[at] = 0x80;
    for (std::size_t i = 0; i < 8 && i < width - 1; ++i) h[at + width - 1 - i] = static_cast<std::uint8_t>(value >> (8 * i));
    return;
  }
  std::memcpy(h + at, text.data(), text.size());
  h[at + width - 1] = 0;
}

void append_header(std::vector<std::uint8_t>& out, std::string_view name, std::string_view prefix, char type,
                   std::uint64_t size) {
  std::uint8_t h[kBlock] = {};
  // (empty views may have a null data(), which memcpy must not be given)
  if (!name.empty()) std::memcpy(h, name.data(), std::min<std::size_t>(name.size(), 100));
  write_octal(h, 100, 8, 0644);
  write_octal(h, 108, 8, 0);
  write_octal(h, 116, 8, 0);
  write_octal(h, 124, 12, size);
  write_octal(h, 136, 12, 0);
  h[156] = static_cast<std::uint8_t>(type);
  std::memcpy(h + 257, "ustar\0" "00", 8);
  if (!prefix.empty()) std::memcpy(h + 345, prefix.data(), std::min<std::size_t>(prefix.size(), 155));
  std::memset(h + 148, ' ', 8);
  std::uint32_t sum = 0;
  for (std::uint8_t c : h) sum += c;
  write_octal(h, 148, 7, sum);
  h[155] = ' ';
  out.insert(out.end(), h, h + kBlock);
}

void append_padded(std::vector<std::uint8_t>& out, std::span<const std::uint8_t> data) {
  out.insert(out.end(), data.begin(), data.end());
  out.resize(out.size() + (round_up_block(data.size()) - data.size()), 0);
}

}  // namespace

void append_tfrecord(std::vector<std::uint8_t>& out, std::span<const std::uint8_t> data) {
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(data.size()) >> (8 * i));
  out.insert(out.end(), len, len + 8);
  put_u32(out, mask_crc32c(crc32c(len)));
  out.insert(out.end(), data.begin(), data.end());
  put_u32(out, mask_crc32c(crc32c(data)));
}

std::vector<std::uint8_t> make_example(std::string_view int64_feature, std::int64_t value,
                                       std::string_view bytes_feature, std::span<const std::uint8_t> bytes) {
  auto entry = [](std::string_view key, const std::vector<std::uint8_t>& feature) {
    std::vector<std::uint8_t> e;
    put_len_field(e, 1, as_bytes(key));
    put_len_field(e, 2, feature);
    return e;
  };
  std::vector<std::uint8_t> features;
  if (!bytes_feature.empty()) {
    std::vector<std::uint8_t> list, feature;
    put_len_field(list, 1, bytes);                 // BytesList.value
    put_len_field(feature, 1, list);               // Feature.bytes_list
    put_len_field(features, 1, entry(bytes_feature, feature));
  }
  if (!int64_feature.empty()) {
    std::vector<std::uint8_t> packed, list, feature;
    put_varint(packed, static_cast<std::uint64_t>(value));
    put_len_field(list, 1, packed);                // Int64List.value, packed
    put_len_field(feature, 3, list);               // Feature.int64_list
    put_len_field(features, 1, entry(int64_feature, feature));
  }
  std::vector<std::uint8_t> example;
  put_len_field(example, 1, features);             // Example.features
  return example;
}

std::uint64_t append_tar_member(std::vector<std::uint8_t>& out, std::string_view name,
                                std::span<const std::uint8_t> data) {
  std::string_view prefix, base = name;
  if (name.size() > 100) {
    // ustar: split at a slash so that prefix <= 155 and name <= 100.
    std::size_t split = name.rfind('/', 155);
    while (split != std::string_view::npos && name.size() - split - 1 > 100) split = std::string_view::npos;
    if (split != std::string_view::npos && split > 0) {
      prefix = name.substr(0, split);
      base = name.substr(split + 1);
    } else {
      std::string long_name(name);
      long_name.push_back('\0');
      append_header(out, "././@LongLink", "", 'L', long_name.size());
      append_padded(out, as_bytes(long_name));
      base = name.substr(0, 100);
    }
  }
  append_header(out, base, prefix, '0', data.size());
  const std::uint64_t data_offset = out.size();
  append_padded(out, data);
  return data_offset;
}

void append_tar_end(std::vector<std::uint8_t>& out) { out.resize(out.size() + 2 * kBlock, 0); }

}  // namespace shardmix
