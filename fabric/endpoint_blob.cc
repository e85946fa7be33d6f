#include "fabric/endpoint_blob.h"

#include <cstddef>

namespace shardmix::fabric {
namespace {

template <typename Unsigned>
void put_le(std::vector<std::uint8_t>& out, Unsigned value) {
  for (std::size_t i = 0; i < sizeof(Unsigned); ++i) {
    out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
  }
}

// Reads fixed-size little-endian fields off the front of a span; fails instead of
// reading past the end.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

  template <typename Unsigned>
  bool get(Unsigned& value) {
    if (bytes_.size() - position_ < sizeof(Unsigned)) return false;
    value = 0;
    for (std::size_t i = 0; i < sizeof(Unsigned); ++i) {
      value |= static_cast<Unsigned>(static_cast<Unsigned>(bytes_[position_ + i]) << (8 * i));
    }
    position_ += sizeof(Unsigned);
    return true;
  }

  bool get_bytes(std::size_t count, std::vector<std::uint8_t>& out) {
    if (bytes_.size() - position_ < count) return false;
    out.assign(bytes_.begin() + position_, bytes_.begin() + position_ + count);
    position_ += count;
    return true;
  }

  std::size_t remaining() const { return bytes_.size() - position_; }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t position_ = 0;
};

}  // namespace

std::vector<std::uint8_t> encode_endpoint_blob(const EndpointBlob& blob) {
  std::vector<std::uint8_t> out;
  out.reserve(12 + blob.endpoint_name.size() + 24);
  put_le<std::uint32_t>(out, kEndpointBlobMagic);
  put_le<std::uint16_t>(out, kEndpointBlobVersion);
  put_le<std::uint16_t>(out, 0);
  put_le<std::uint32_t>(out, static_cast<std::uint32_t>(blob.endpoint_name.size()));
  out.insert(out.end(), blob.endpoint_name.begin(), blob.endpoint_name.end());
  put_le<std::uint64_t>(out, blob.region_address);
  put_le<std::uint64_t>(out, blob.region_key);
  put_le<std::uint64_t>(out, blob.region_length);
  return out;
}

Result<EndpointBlob> decode_endpoint_blob(std::span<const std::uint8_t> bytes, int rank) {
  Reader reader(bytes);
  std::uint32_t magic = 0;
  std::uint16_t version = 0;
  std::uint16_t reserved = 0;
  std::uint32_t name_length = 0;
  if (!reader.get(magic) || !reader.get(version) || !reader.get(reserved) || !reader.get(name_length)) {
    return make_error(StatusCode::kCorrupt, "endpoint blob of rank {}: {} bytes, too short for the header",
                      rank, bytes.size());
  }
  if (magic != kEndpointBlobMagic) {
    return make_error(StatusCode::kProtocol, "endpoint blob of rank {}: bad magic {:#010x}", rank, magic);
  }
  if (version != kEndpointBlobVersion) {
    return make_error(StatusCode::kProtocol, "endpoint blob of rank {}: version {}, this build speaks {}",
                      rank, version, kEndpointBlobVersion);
  }
  if (name_length == 0 || name_length > kMaxEndpointNameLength) {
    return make_error(StatusCode::kCorrupt, "endpoint blob of rank {}: endpoint name length {} out of range 1..{}",
                      rank, name_length, kMaxEndpointNameLength);
  }
  EndpointBlob blob;
  if (!reader.get_bytes(name_length, blob.endpoint_name) || !reader.get(blob.region_address) ||
      !reader.get(blob.region_key) || !reader.get(blob.region_length)) {
    return make_error(StatusCode::kCorrupt, "endpoint blob of rank {}: truncated ({} bytes, name length {})",
                      rank, bytes.size(), name_length);
  }
  if (reader.remaining() != 0) {
    return make_error(StatusCode::kCorrupt, "endpoint blob of rank {}: {} trailing bytes", rank,
                      reader.remaining());
  }
  return blob;
}

}  // namespace shardmix::fabric
