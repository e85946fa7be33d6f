// Fuzz target: fabric/endpoint_blob, the bytes each daemon publishes to its peers
// over MPI (libfabric endpoint name, region address, key and length).
//
// Checks beyond "no crash, no UB": a decoded blob has a name of 1..kMaxEndpointNameLength
// bytes and re-encodes to exactly the input (but for the reserved field, which the decoder
// ignores and the encoder writes as 0); a failure is kCorrupt or kProtocol and names
// the publishing rank.
#include <string>

#include "fabric/endpoint_blob.h"
#include "tests/fuzz/fuzz.h"

using namespace shardmix;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> input(data, size);
  auto blob = fabric::decode_endpoint_blob(input, 7);
  if (!blob.ok()) {
    const Status& s = blob.status();
    FUZZ_CHECK(s.code() == StatusCode::kCorrupt || s.code() == StatusCode::kProtocol, s.to_string());
    FUZZ_CHECK(s.message().find("rank 7") != std::string::npos, "error does not name the rank: " + s.message());
    return 0;
  }
  FUZZ_CHECK(!blob->endpoint_name.empty() && blob->endpoint_name.size() <= fabric::kMaxEndpointNameLength,
             "name of " + std::to_string(blob->endpoint_name.size()) + " bytes accepted");
  // The reserved u16 at offset 6 is not checked on read and written as 0.
  std::vector<std::uint8_t> expected(input.begin(), input.end());
  expected[6] = expected[7] = 0;
  FUZZ_CHECK(fabric::encode_endpoint_blob(*blob) == expected, "encode(decode(x)) != x (reserved bytes zeroed)");
  return 0;
}

namespace shardmix::fuzz {

Seeds seeds() {
  fabric::EndpointBlob tcp;  // a sockaddr_in-sized name, offset-based region
  tcp.endpoint_name.assign(16, 0x7f);
  tcp.region_key = 42;
  tcp.region_length = 1ull << 30;
  fabric::EndpointBlob shm;  // a path-like name, virtual-address region
  const std::string name = "fi_shm://12345:0";
  shm.endpoint_name.assign(name.begin(), name.end());
  shm.region_address = 0x7f0000001000ull;
  shm.region_key = 1;
  shm.region_length = 4096;
  return {{"tcp", fabric::encode_endpoint_blob(tcp)}, {"shm", fabric::encode_endpoint_blob(shm)}};
}

}  // namespace shardmix::fuzz
