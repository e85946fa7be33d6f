// The bytes one rank publishes (via MPI allgather) so peers can fi_read its exposed
// region: the libfabric endpoint name and the region's remote address, key and length.
// Layout (little-endian, version 1):
//   u32 magic "SMFB" | u16 version | u16 reserved (0) | u32 name_length | name bytes
//   | u64 region_address | u64 region_key | u64 region_length
// region_address is what fi_read takes as `addr`: the virtual address when the provider
// returned FI_MR_VIRT_ADDR, else 0 (offset-based). region_length 0 = nothing exposed.
// Thread-safety: value type and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace shardmix::fabric {

struct EndpointBlob {
  std::vector<std::uint8_t> endpoint_name;  // fi_getname
  std::uint64_t region_address = 0;
  std::uint64_t region_key = 0;
  std::uint64_t region_length = 0;

  bool operator==(const EndpointBlob&) const = default;
};

inline constexpr std::uint32_t kEndpointBlobMagic = 0x42464d53;  // "SMFB" read as little-endian
inline constexpr std::uint16_t kEndpointBlobVersion = 1;
// Endpoint names are tens of bytes (sockaddr_in6 for tcp, a path-like name for shm);
// anything beyond this is a corrupt blob, not a real name.
inline constexpr std::uint32_t kMaxEndpointNameLength = 4096;

std::vector<std::uint8_t> encode_endpoint_blob(const EndpointBlob& blob);
// Bounds-checked; errors name `rank` (the rank that published the bytes).
Result<EndpointBlob> decode_endpoint_blob(std::span<const std::uint8_t> bytes, int rank);

}  // namespace shardmix::fabric
