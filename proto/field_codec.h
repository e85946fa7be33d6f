// The one generic codec behind every byte layout in proto/ (docs/decisions/0045).
//
// Each layout (a wire message in proto/wire.h, the checkpoint blob in proto/checkpoint.h)
// lists its fields once, in wire order, in a static member
//   template <typename Self, typename Visit> static void fields(Self& m, Visit&& visit);
// that calls visit(name, field) for each field. Three visitors walk that list:
//   FieldWriter  appends the fields (little-endian, no padding between them),
//   FieldReader  reads them back, bounds-checking each and naming the field and offset of
//                the first that does not fit ("hello frame: field 'pid' needs 4 bytes at
//                offset 8, payload has 3"),
//   FieldSizer   adds up their encoded size (encoded_size(m)),
// so the encoder, the decoder and the size cannot disagree about a layout.
// What a field may be:
//   an integer, an enum or a double   sizeof(T) bytes, as in memory;
//   a bool                            1 byte, 0 or 1 (any other value is refused);
//   ZeroPad<T>{}                      sizeof(T) bytes that are always 0 (alignment);
//   counted(max, array, more...)      u32 count, then count elements of each array in turn
//                                     (std::string, std::vector of trivially copyable T):
//                                     a string, a blob, a list, or parallel lists.
// Semantic checks (rank below world size, ascending lists) stay with each decoder, after
// the walk. Thread-safety: value types; a FieldReader or FieldWriter is used by one thread.
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace shardmix::proto {

static_assert(std::endian::native == std::endian::little, "the byte layouts assume little-endian hosts");

// A fixed-size field that is its bytes in memory (bool is not: it has one encoding per value).
template <typename T>
concept PlainField = std::is_trivially_copyable_v<T> && (std::is_arithmetic_v<T> || std::is_enum_v<T>) &&
                     !std::is_same_v<T, bool>;

template <typename T>
struct ZeroPad {
  static_assert(PlainField<T>);
};

// A u32 count, then that many elements of each array. The first array's size is the
// count; a FieldWriter writes the others cut or padded with zero elements to that count,
// a FieldReader sizes them all to it. max_count bounds what a decoder accepts.
template <typename... Arrays>
struct Counted {
  std::uint64_t max_count;
  std::tuple<Arrays&...> arrays;
};
template <typename... Arrays>
Counted<Arrays...> counted(std::uint64_t max_count, Arrays&... arrays) {
  return {max_count, std::tuple<Arrays&...>(arrays...)};
}

template <typename Array>
using ElementOf = typename std::remove_cvref_t<Array>::value_type;

class FieldWriter {
 public:
  explicit FieldWriter(std::vector<std::uint8_t>& out) : out_(out) {}

  template <PlainField T>
  void operator()(std::string_view, const T& value) {
    put_bytes(&value, sizeof(value));
  }
  void operator()(std::string_view, const bool& value) { put(static_cast<std::uint8_t>(value ? 1 : 0)); }
  template <typename T>
  void operator()(std::string_view, ZeroPad<T>) {
    put(T{});
  }
  template <typename... Arrays>
  void operator()(std::string_view, const Counted<Arrays...>& list) {
    const std::size_t count = std::get<0>(list.arrays).size();
    put(static_cast<std::uint32_t>(count));
    std::apply([&](const auto&... array) { (put_array(array, count), ...); }, list.arrays);
  }

  template <PlainField T>
  void put(T value) {
    put_bytes(&value, sizeof(value));
  }
  void put_bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }

 private:
  template <typename Array>
  void put_array(const Array& array, std::size_t count) {
    using T = ElementOf<Array>;
    static_assert(std::is_trivially_copyable_v<T>);
    const std::size_t have = std::min(array.size(), count);
    put_bytes(array.data(), have * sizeof(T));
    out_.insert(out_.end(), (count - have) * sizeof(T), std::uint8_t{0});
  }
  std::vector<std::uint8_t>& out_;
};

class FieldSizer {
 public:
  template <PlainField T>
  void operator()(std::string_view, const T&) {
    bytes_ += sizeof(T);
  }
  void operator()(std::string_view, const bool&) { bytes_ += 1; }
  template <typename T>
  void operator()(std::string_view, ZeroPad<T>) {
    bytes_ += sizeof(T);
  }
  template <typename... Arrays>
  void operator()(std::string_view, const Counted<Arrays...>& list) {
    bytes_ += sizeof(std::uint32_t) + std::get<0>(list.arrays).size() * (sizeof(ElementOf<Arrays>) + ...);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

// Bounds-checked reads; the first failure sticks and records what, which field and where.
// `what` names the layout ("hello frame", "checkpoint"), `container` what holds the bytes
// ("payload", "blob").
class FieldReader {
 public:
  FieldReader(std::span<const std::uint8_t> bytes, std::string_view what, std::string_view container = "payload")
      : bytes_(bytes), what_(what), container_(container) {}

  template <PlainField T>
  void operator()(std::string_view field, T& value) {
    get(value, field);
  }
  void operator()(std::string_view field, bool& value) {
    const std::size_t at = pos_;
    std::uint8_t byte = 0;
    if (!get(byte, field)) return;
    if (byte > 1) {
      return fail("field '" + std::string(field) + "' at offset " + std::to_string(at) + " is " +
                  std::to_string(byte) + ", not 0 or 1");
    }
    value = byte != 0;
  }
  template <typename T>
  void operator()(std::string_view field, ZeroPad<T>) {
    const std::size_t at = pos_;
    T value{};
    if (get(value, field) && value != T{}) {
      fail("field '" + std::string(field) + "' at offset " + std::to_string(at) + " is padding but not zero");
    }
  }
  template <typename... Arrays>
  void operator()(std::string_view field, const Counted<Arrays...>& list) {
    const std::size_t at = pos_;
    std::uint32_t count = 0;
    if (!get(count, field)) return;
    if (count > list.max_count) {
      return fail("field '" + std::string(field) + "' count " + std::to_string(count) + " at offset " +
                  std::to_string(at) + " exceeds the limit of " + std::to_string(list.max_count));
    }
    // Checked before any array grows, so a count that lies costs no allocation.
    if (!need(std::uint64_t{count} * (sizeof(ElementOf<Arrays>) + ...), field)) return;
    std::apply([&](auto&... array) { (get_array(array, count), ...); }, list.arrays);
  }

  template <PlainField T>
  bool get(T& value, std::string_view field) {
    if (!need(sizeof(T), field)) return false;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // Rejects trailing garbage: a layout is exactly its fields.
  std::string finish() {
    if (error_.empty() && pos_ != bytes_.size()) {
      error_ = std::string(what_) + ": " + std::to_string(bytes_.size() - pos_) +
               " unexpected trailing bytes at offset " + std::to_string(pos_);
    }
    return error_;
  }
  void fail(const std::string& message) {
    if (error_.empty()) error_ = std::string(what_) + ": " + message;
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

 private:
  template <typename Array>
  void get_array(Array& array, std::uint32_t count) {
    using T = ElementOf<Array>;
    static_assert(std::is_trivially_copyable_v<T>);
    array.resize(count);
    if (count > 0) std::memcpy(array.data(), bytes_.data() + pos_, std::size_t{count} * sizeof(T));
    pos_ += std::size_t{count} * sizeof(T);
  }
  bool need(std::uint64_t n, std::string_view field) {
    if (!error_.empty()) return false;
    if (bytes_.size() - pos_ < n) {
      error_ = std::string(what_) + ": field '" + std::string(field) + "' needs " + std::to_string(n) +
               " bytes at offset " + std::to_string(pos_) + ", " + std::string(container_) + " has " +
               std::to_string(bytes_.size() - pos_);
      return false;
    }
    return true;
  }
  std::span<const std::uint8_t> bytes_;
  std::string_view what_;
  std::string_view container_;
  std::size_t pos_ = 0;
  std::string error_;
};

// The encoded size of a layout's fields (for a wire message: its payload).
template <typename Layout>
std::size_t encoded_size(const Layout& m) {
  FieldSizer sizer;
  Layout::fields(m, sizer);
  return sizer.bytes();
}

// A daemon-to-daemon layout's envelope, magic u32 then version u16, followed by the
// layout's fields (the start-up entry batches, the per-plan directory messages).
// Written in place after sizing: appending to an empty vector trips gcc 12's
// -Wstringop-overflow (a false positive of its inlined insert).
template <typename Layout>
std::vector<std::uint8_t> encode_enveloped(std::uint32_t magic, std::uint16_t version, const Layout& m) {
  constexpr std::size_t kHead = sizeof(magic) + sizeof(version);
  std::vector<std::uint8_t> out(kHead);
  std::memcpy(out.data(), &magic, sizeof(magic));
  std::memcpy(out.data() + sizeof(magic), &version, sizeof(version));
  out.reserve(kHead + encoded_size(m));
  FieldWriter w(out);
  Layout::fields(m, w);
  return out;
}

// Reads the envelope and the fields into `m`. Empty on success, else what is wrong, named
// by the reader's `what`: a bad magic ("not a ShardMix <kind>"), another version, a field
// that does not fit, trailing bytes.
template <typename Layout>
std::string decode_enveloped(FieldReader& r, std::uint32_t magic, std::uint16_t version, std::string_view what,
                             std::string_view kind, Layout& m) {
  std::uint32_t got_magic = 0;
  std::uint16_t got_version = 0;
  if (!r.get(got_magic, "magic")) return r.error();
  if (got_magic != magic) return std::string(what) + ": bad magic (not a ShardMix " + std::string(kind) + ")";
  if (!r.get(got_version, "version")) return r.error();
  if (got_version != version) {
    return std::string(what) + ": version " + std::to_string(got_version) + ", this daemon reads version " +
           std::to_string(version);
  }
  Layout::fields(m, r);
  return r.finish();
}

}  // namespace shardmix::proto
