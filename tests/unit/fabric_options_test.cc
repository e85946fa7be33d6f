// Provider-name mapping, CQ wait choice and endpoint-blob encoding: the parts of the
// fabric adapter that need no network.
#include <gtest/gtest.h>

#include "fabric/endpoint_blob.h"
#include "fabric/provider.h"

namespace shardmix::fabric {
namespace fabric_options_test {

std::string resolved(std::string_view requested, int rdma_devices) {
  Result<std::string> name = resolve_provider_name(requested, rdma_devices);
  EXPECT_TRUE(name.ok()) << name.status().to_string();
  return name.ok() ? *name : std::string();
}

TEST(FabricProvider, AutoPicksVerbsOnlyWhenAnRdmaDeviceExists) {
  EXPECT_EQ(resolved("auto", 0), "tcp;ofi_rxm");
  EXPECT_EQ(resolved("auto", 1), "verbs;ofi_rxm");
  EXPECT_EQ(resolved("auto", 4), "verbs;ofi_rxm");
}

TEST(FabricProvider, ShortNamesGetTheRdmLayer) {
  EXPECT_EQ(resolved("tcp", 1), "tcp;ofi_rxm");
  EXPECT_EQ(resolved("verbs", 0), "verbs;ofi_rxm");
}

TEST(FabricProvider, OtherNamesPassThrough) {
  EXPECT_EQ(resolved("shm", 0), "shm");
  EXPECT_EQ(resolved("efa", 1), "efa");
  EXPECT_EQ(resolved("tcp;ofi_rxm", 0), "tcp;ofi_rxm");
}

TEST(FabricProvider, EmptyNameIsRejected) {
  Result<std::string> name = resolve_provider_name("", 0);
  ASSERT_FALSE(name.ok());
  EXPECT_EQ(name.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(name.status().message().find("fabric.provider"), std::string::npos);
}

// A fake fi_getinfo verdict: which prov_names it was asked about, and what it answers.
struct FakeGetinfo {
  bool verbs_usable = true;
  std::vector<std::string> asked;
  ProviderUsable usable() {
    return [this](const std::string& prov_name) {
      asked.push_back(prov_name);
      return prov_name != "verbs;ofi_rxm" || verbs_usable;
    };
  }
};

ProviderChoice chosen(std::string_view requested, int rdma_devices, FakeGetinfo& getinfo) {
  Result<ProviderChoice> choice = choose_provider(requested, rdma_devices, getinfo.usable());
  EXPECT_TRUE(choice.ok()) << choice.status().to_string();
  return choice.ok() ? *choice : ProviderChoice{};
}

TEST(FabricProviderChoice, AutoKeepsAUsableVerbs) {
  FakeGetinfo getinfo;
  const ProviderChoice choice = chosen("auto", 2, getinfo);
  EXPECT_EQ(choice.prov_name, "verbs;ofi_rxm");
  EXPECT_TRUE(choice.warning.empty()) << choice.warning;
  EXPECT_NE(choice.reason.find("2 RDMA device"), std::string::npos) << choice.reason;
}

TEST(FabricProviderChoice, AutoFallsBackToTcpWithAWarningWhenVerbsIsUnusable) {
  FakeGetinfo getinfo{.verbs_usable = false};
  const ProviderChoice choice = chosen("auto", 1, getinfo);
  EXPECT_EQ(choice.prov_name, "tcp;ofi_rxm");
  EXPECT_NE(choice.warning.find("verbs;ofi_rxm is unusable"), std::string::npos) << choice.warning;
  EXPECT_NE(choice.warning.find("falling back to tcp;ofi_rxm"), std::string::npos) << choice.warning;
  EXPECT_EQ(getinfo.asked, std::vector<std::string>{"verbs;ofi_rxm"});
}

TEST(FabricProviderChoice, NamedVerbsNeverFallsBack) {
  FakeGetinfo getinfo{.verbs_usable = false};
  const ProviderChoice choice = chosen("verbs", 1, getinfo);
  EXPECT_EQ(choice.prov_name, "verbs;ofi_rxm");
  EXPECT_TRUE(choice.warning.empty());
  EXPECT_TRUE(getinfo.asked.empty()) << "a named provider is not probed for a fallback";
}

TEST(FabricProviderChoice, AutoWithoutDevicesIsTcpWithoutAsking) {
  FakeGetinfo getinfo;
  const ProviderChoice choice = chosen("auto", 0, getinfo);
  EXPECT_EQ(choice.prov_name, "tcp;ofi_rxm");
  EXPECT_NE(choice.reason.find("no RDMA device"), std::string::npos) << choice.reason;
  EXPECT_TRUE(getinfo.asked.empty());
}

TEST(FabricProviderChoice, EmptyNameIsRejected) {
  FakeGetinfo getinfo;
  EXPECT_EQ(choose_provider("", 1, getinfo.usable()).status().code(), StatusCode::kInvalidArgument);
}

TEST(FabricProvider, ShmPollsBecauseItsSreadNeverReturns) {
  EXPECT_EQ(cq_wait_mode_for("shm"), CqWaitMode::kPollWithBackoff);
  EXPECT_EQ(cq_wait_mode_for("tcp;ofi_rxm"), CqWaitMode::kBlockingSread);
  EXPECT_EQ(cq_wait_mode_for("net"), CqWaitMode::kBlockingSread);
  EXPECT_EQ(cq_wait_mode_for("verbs;ofi_rxm"), CqWaitMode::kBlockingSread);
  EXPECT_EQ(cq_wait_mode_for("sockets"), CqWaitMode::kPollWithBackoff);
}

EndpointBlob sample_blob() {
  EndpointBlob blob;
  blob.endpoint_name = {0x02, 0x00, 0x1f, 0x90, 127, 0, 0, 1};
  blob.region_address = 0x7f00'1234'5000;
  blob.region_key = 0xdead'beef'cafe;
  blob.region_length = 112 * 1024;
  return blob;
}

TEST(FabricProvider, ReadSegmentsAreTheSmallestLimitAndOneOnShm) {
  EXPECT_EQ(read_segments_for("tcp;ofi_rxm", 4, 4, 4, 4), 4u);
  EXPECT_EQ(read_segments_for("tcp;ofi_rxm", 2, 4, 4, 4), 2u);   // fabric.max_read_segments
  EXPECT_EQ(read_segments_for("verbs;ofi_rxm", 4, 4, 30, 1), 1u);  // the remote iov limit
  EXPECT_EQ(read_segments_for("tcp;ofi_rxm", 4, 4, 3, 4), 3u);    // the local iov limit
  EXPECT_EQ(read_segments_for("efa", 4, 4, 0, 0), 1u);            // a provider reporting 0
  EXPECT_EQ(read_segments_for("shm", 4, 4, 4, 4), 1u);            // only 1 remote segment is fast
}

TEST(EndpointBlob, RoundTrips) {
  const EndpointBlob blob = sample_blob();
  Result<EndpointBlob> decoded = decode_endpoint_blob(encode_endpoint_blob(blob), 3);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  EXPECT_EQ(*decoded, blob);
}

TEST(EndpointBlob, EncodingIsLittleEndianAndVersioned) {
  const std::vector<std::uint8_t> bytes = encode_endpoint_blob(sample_blob());
  ASSERT_EQ(bytes.size(), 12u + 8u + 24u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "SMFB");
  EXPECT_EQ(bytes[4], kEndpointBlobVersion);
  EXPECT_EQ(bytes[8], 8);  // name length
  EXPECT_EQ(bytes[12 + 8 + 16], 0x00);  // region_length 0x1c000, least significant byte first
  EXPECT_EQ(bytes[12 + 8 + 17], 0xc0);
}

TEST(EndpointBlob, ZeroLengthRegionSurvives) {
  EndpointBlob blob = sample_blob();
  blob.region_address = 0;
  blob.region_key = 0;
  blob.region_length = 0;
  Result<EndpointBlob> decoded = decode_endpoint_blob(encode_endpoint_blob(blob), 0);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->region_length, 0u);
}

TEST(EndpointBlob, EveryTruncationIsRejectedAndNamesTheRank) {
  const std::vector<std::uint8_t> bytes = encode_endpoint_blob(sample_blob());
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    Result<EndpointBlob> decoded = decode_endpoint_blob(std::span(bytes.data(), size), 7);
    ASSERT_FALSE(decoded.ok()) << "accepted a blob cut to " << size << " bytes";
    EXPECT_NE(decoded.status().message().find("rank 7"), std::string::npos) << decoded.status().message();
  }
}

TEST(EndpointBlob, TrailingBytesBadMagicAndVersionAreRejected) {
  std::vector<std::uint8_t> bytes = encode_endpoint_blob(sample_blob());

  std::vector<std::uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_EQ(decode_endpoint_blob(longer, 1).status().code(), StatusCode::kCorrupt);

  std::vector<std::uint8_t> bad_magic = bytes;
  bad_magic[0] ^= 0xff;
  EXPECT_EQ(decode_endpoint_blob(bad_magic, 1).status().code(), StatusCode::kProtocol);

  std::vector<std::uint8_t> other_version = bytes;
  other_version[4] = kEndpointBlobVersion + 1;
  EXPECT_EQ(decode_endpoint_blob(other_version, 1).status().code(), StatusCode::kProtocol);

  std::vector<std::uint8_t> huge_name = bytes;
  huge_name[8] = 0xff;
  huge_name[9] = 0xff;
  huge_name[10] = 0xff;
  EXPECT_EQ(decode_endpoint_blob(huge_name, 1).status().code(), StatusCode::kCorrupt);
}

}  // namespace fabric_options_test
}  // namespace shardmix::fabric
