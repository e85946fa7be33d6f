// proto/wire.h and proto/checkpoint.h through their field lists (proto/field_codec.h,
// docs/decisions/0045): every message encodes to the pinned bytes below (the layouts of
// protocol version 9 and checkpoint format 1), to exactly its walked size, and every
// truncation of it fails naming the field and offset where the bytes ran out.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "proto/checkpoint.h"
#include "proto/wire.h"
#include "tests/support/sample_checkpoint.h"

namespace shardmix::proto {
namespace wire_test {

using Bytes = std::vector<std::uint8_t>;

std::string hex(std::span<const std::uint8_t> bytes) {
  std::string out;
  char digits[3];
  for (std::uint8_t b : bytes) {
    std::snprintf(digits, sizeof(digits), "%02x", b);
    out += digits;
  }
  return out;
}

using test_support::sample_checkpoint;

Welcome sample_welcome() { return Welcome{1, 4, 2, 3, 1000, 16, 125, 1 << 20, 1 << 16, 0xdeadbeef, 77, 8, 1, 5, 2, 0x1234, 9}; }

BatchFrame sample_batch() {
  // Fewer positions than samples: the missing one travels as 0.
  return BatchFrame{1, 2, 3,
                    {SampleDescriptor{17, 4, 0, 0, 0, 0, 4096, 112 * 1024},
                     SampleDescriptor{8, 3, 1, 1, 2, kSampleSkipped, 0, 0}},
                    {24}};
}

EpochStats sample_epoch_stats() { return EpochStats{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0.25, 13, 14, 1.5, 0.75, 0.125}; }

template <typename Message>
Bytes frame_of(const Message& m) {
  Bytes frame;
  encode(frame, m);
  return frame;
}
// The checkpoint requests share one layout; the frame type says which request it is.
Bytes frame_of(const CheckpointRequest& m) {
  Bytes frame;
  encode(frame, FrameType::kCheckpointLoad, m);
  return frame;
}

// Commit and abandon share one layout too.
Bytes frame_of(const CheckpointCommit& m) {
  Bytes frame;
  encode(frame, FrameType::kCheckpointCommit, m);
  return frame;
}

CheckpointListing sample_listing() { return CheckpointListing{9, {3, 1}, {5, 5}, "rank0model"}; }

TEST(Wire, EveryMessageEncodesToItsPinnedBytes) {
  EXPECT_EQ(hex(frame_of(Hello{3, 8, 4242})), "534d5831090001000c00000000000000030000000800000092100000");
  EXPECT_EQ(hex(frame_of(sample_welcome())),
            "534d5831090002006c0000000000000001000000040000000200000003000000e803000000000000100000000000"
            "00007d0000000000000000001000000000000000010000000000efbeadde000000004d0000000000000008000000"
            "0100000005000000020000000000000034120000000000000900000000000000");
  EXPECT_EQ(hex(frame_of(ErrorFrame{6, "trainer world size 3 does not match"})),
            "534d5831090003002900000000000000060023000000747261696e657220776f726c642073697a65203320646f65"
            "73206e6f74206d61746368");
  EXPECT_EQ(hex(frame_of(StartEpoch{2, 5, {}})), "534d58310900040014000000000000000200000000000000050000000000000000000000");
  EXPECT_EQ(hex(frame_of(sample_batch())),
            "534d5831090005006c000000000000000100000000000000020000000000000003000000000000000200000011000000"
            "040000000000000000000000001000000000000000c00100000000000800000003000000010000000102010000000000"
            "00000000000000000000000018000000000000000000000000000000");
  EXPECT_EQ(hex(frame_of(Release{2, 5, 7, 123})),
            "534d58310900060020000000000000000200000000000000050000000000000007000000000000007b00000000000000");
  EXPECT_EQ(hex(frame_of(sample_epoch_stats())),
            "534d5831090007008c000000000000000100000000000000020000000000000003000000000000000400000000000000"
            "050000000000000006000000000000000700000000000000080000000000000009000000000000000a00000000000000"
            "0b000000000000000c00000000000000000000000000d03f0d0000000e00000000000000000000000000f83f00000000"
            "0000e83f000000000000c03f");
  EXPECT_EQ(hex(encode_checkpoint(sample_checkpoint())),
            "534d584b010001003412000000000000e8030000000000006300000000000000020000000200000008000000010000000"
            "400000003000000040000000200000000000000030000000000000018000000000000000200000019000000000000001e"
            "00000000000000020000001400000000000000170000000000000007c389df4e655ba0");
  // The resume blob travels inside the StartEpoch as it is.
  const Bytes blob = encode_checkpoint(sample_checkpoint());
  EXPECT_EQ(hex(frame_of(StartEpoch{2, 5, blob})),
            "534d58310900040098000000000000000200000000000000050000000000000084000000" + hex(blob));
}

// The encoded size of every message is the size its field list walks to, and the header says so.
template <typename Message>
void expect_walked_size(const Message& m) {
  const Bytes frame = frame_of(m);
  ASSERT_GE(frame.size(), sizeof(FrameHeader));
  FrameHeader h{};
  ASSERT_EQ(decode_header(std::span(frame).first(sizeof(FrameHeader)), h), "");
  EXPECT_EQ(frame.size() - sizeof(FrameHeader), encoded_size(m)) << hex(frame);
  EXPECT_EQ(h.payload_bytes, encoded_size(m)) << hex(frame);
}

TEST(Wire, EncodedSizeIsTheWalkedSize) {
  expect_walked_size(Hello{3, 8, 4242});
  expect_walked_size(sample_welcome());
  expect_walked_size(ErrorFrame{6, "trainer world size 3 does not match"});
  expect_walked_size(ErrorFrame{});
  expect_walked_size(StartEpoch{2, 5, {}});
  expect_walked_size(StartEpoch{2, 5, encode_checkpoint(sample_checkpoint())});
  expect_walked_size(sample_batch());
  expect_walked_size(BatchFrame{});
  expect_walked_size(Release{2, 5, 7, 123});
  expect_walked_size(sample_epoch_stats());
  EXPECT_EQ(encode_checkpoint(sample_checkpoint()).size(), checkpoint_size(sample_checkpoint()));
  EXPECT_EQ(encode_checkpoint(Checkpoint{}).size(), checkpoint_size(Checkpoint{}));
  // The daemon's fixed request sizes are the walked sizes of what clients send.
  EXPECT_EQ(request_payload_bytes(FrameType::kHello), static_cast<std::int64_t>(frame_of(Hello{}).size() - 16));
  EXPECT_EQ(request_payload_bytes(FrameType::kRelease), static_cast<std::int64_t>(frame_of(Release{}).size() - 16));
  EXPECT_EQ(request_payload_bytes(FrameType::kStartEpoch),
            static_cast<std::int64_t>(frame_of(StartEpoch{}).size() - 16));
}

TEST(Wire, CheckpointLimitCoversTheLargestBlob) {
  Checkpoint largest;
  largest.early.assign(kMaxCheckpointExceptions, 0);
  largest.late.assign(kMaxCheckpointExceptions, 0);
  EXPECT_LE(checkpoint_size(largest), kMaxCheckpointBytes);
  EXPECT_EQ(request_payload_max_bytes(FrameType::kStartEpoch),
            request_payload_bytes(FrameType::kStartEpoch) + static_cast<std::int64_t>(kMaxCheckpointBytes));
}

// Where each field starts and how many bytes it needs, from the field list: what a
// truncated payload's error must name.
struct FieldSpan {
  std::string name;
  std::size_t offset;
  std::size_t bytes;
};
class FieldSpans {
 public:
  template <PlainField T>
  void operator()(std::string_view name, const T&) {
    add(name, sizeof(T));
  }
  void operator()(std::string_view name, const bool&) { add(name, 1); }
  template <typename... Arrays>
  void operator()(std::string_view name, const Counted<Arrays...>& list) {
    add(name, sizeof(std::uint32_t));
    add(name, std::get<0>(list.arrays).size() * (sizeof(ElementOf<Arrays>) + ...));
  }
  template <typename T>
  void operator()(std::string_view name, ZeroPad<T>) {
    add(name, sizeof(T));
  }
  std::vector<FieldSpan> spans;

 private:
  void add(std::string_view name, std::size_t bytes) {
    const std::size_t offset = spans.empty() ? 0 : spans.back().offset + spans.back().bytes;
    spans.push_back({std::string(name), offset, bytes});
  }
};

template <typename Message>
void expect_truncations_name_the_field(const Message& m, const std::string& what) {
  const Bytes frame = frame_of(m);
  const std::span<const std::uint8_t> payload = std::span(frame).subspan(sizeof(FrameHeader));
  FieldSpans layout;
  Message::fields(m, layout);
  for (std::size_t cut = 0; cut < payload.size(); ++cut) {
    const FieldSpan* field = nullptr;
    for (const FieldSpan& s : layout.spans) {
      if (s.bytes > 0 && s.offset <= cut && cut < s.offset + s.bytes) field = &s;
    }
    ASSERT_NE(field, nullptr) << what << " cut at " << cut;
    Message back{};
    EXPECT_EQ(decode(payload.first(cut), back),
              what + ": field '" + field->name + "' needs " + std::to_string(field->bytes) + " bytes at offset " +
                  std::to_string(field->offset) + ", payload has " + std::to_string(cut - field->offset));
  }
  Message back{};
  EXPECT_EQ(decode(payload, back), "") << what;
  Bytes longer(payload.begin(), payload.end());
  longer.push_back(0);
  EXPECT_EQ(decode(longer, back),
            what + ": 1 unexpected trailing bytes at offset " + std::to_string(payload.size()));
}

TEST(Wire, TruncatedPayloadsNameTheFieldAndOffset) {
  expect_truncations_name_the_field(Hello{3, 8, 4242}, "hello frame");
  expect_truncations_name_the_field(sample_welcome(), "welcome frame");
  expect_truncations_name_the_field(ErrorFrame{6, "trainer world size 3 does not match"}, "error frame");
  expect_truncations_name_the_field(StartEpoch{2, 5, encode_checkpoint(sample_checkpoint())}, "start-epoch frame");
  expect_truncations_name_the_field(BatchFrame{1, 2, 3, sample_batch().samples, {24, 25}}, "batch frame");
  expect_truncations_name_the_field(Release{2, 5, 7, 123}, "release frame");
  expect_truncations_name_the_field(sample_epoch_stats(), "epoch-end frame");
  // The same errors, spelled out, as an operator reads them.
  const Bytes hello = frame_of(Hello{3, 8, 4242});
  Hello h;
  EXPECT_EQ(decode(std::span(hello).subspan(16, 5), h),
            "hello frame: field 'world_size' needs 4 bytes at offset 4, payload has 1");
  const Bytes welcome = frame_of(sample_welcome());
  Welcome w;
  EXPECT_EQ(decode(std::span(welcome).subspan(16, 83), w),
            "welcome frame: field 'window' needs 4 bytes at offset 80, payload has 3");
  const Bytes error = frame_of(ErrorFrame{6, "trainer world size 3 does not match"});
  ErrorFrame e;
  EXPECT_EQ(decode(std::span(error).subspan(16, 10), e),
            "error frame: field 'message' needs 35 bytes at offset 6, payload has 4");
  FrameHeader header;
  EXPECT_EQ(decode_header(std::span(hello).first(7), header),
            "frame header: field 'type' needs 2 bytes at offset 6, payload has 1");
}

TEST(Wire, CountsOverTheirLimitOrPayloadAreRefused) {
  Bytes frame = frame_of(BatchFrame{});
  const std::uint32_t huge = kMaxBatchSamples + 1;
  std::memcpy(frame.data() + 16 + 24, &huge, sizeof(huge));
  BatchFrame b;
  EXPECT_EQ(decode(std::span(frame).subspan(16), b),
            "batch frame: field 'samples' count 1048577 at offset 24 exceeds the limit of 1048576");
  Bytes start = frame_of(StartEpoch{});
  const std::uint32_t big_blob = static_cast<std::uint32_t>(kMaxCheckpointBytes) + 1;
  std::memcpy(start.data() + 16 + 16, &big_blob, sizeof(big_blob));
  StartEpoch s;
  EXPECT_EQ(decode(std::span(start).subspan(16), s),
            "start-epoch frame: field 'resume' count " + std::to_string(big_blob) +
                " at offset 16 exceeds the limit of " + std::to_string(kMaxCheckpointBytes));
  // A count within the limit but beyond the payload names what it needs.
  const std::uint32_t three = 3;
  std::memcpy(frame.data() + 16 + 24, &three, sizeof(three));
  EXPECT_EQ(decode(std::span(frame).subspan(16), b),
            "batch frame: field 'samples' needs 120 bytes at offset 28, payload has 0");
}

// A checkpoint whose bytes were edited and re-checksummed, as a buggy writer would leave it.
Bytes with_byte(Bytes blob, std::size_t offset, std::uint8_t value) {
  blob[offset] = value;
  const std::uint64_t sum = fnv1a64(std::span(blob).first(blob.size() - 8));
  std::memcpy(blob.data() + blob.size() - 8, &sum, 8);
  return blob;
}

TEST(Wire, CheckpointBoolAndPaddingHaveOneEncoding) {
  const Bytes blob = encode_checkpoint(sample_checkpoint());
  Checkpoint c;
  ASSERT_EQ(decode_checkpoint(blob, c), "");
  EXPECT_EQ(c, sample_checkpoint());
  // magic 4, format 2, flags 2, three u64 24, three u32 12: drop_last at 44, padding at 45..47.
  EXPECT_EQ(decode_checkpoint(with_byte(blob, 44, 2), c), "checkpoint: field 'drop_last' at offset 44 is 2, not 0 or 1");
  EXPECT_EQ(decode_checkpoint(with_byte(blob, 45, 1), c), "checkpoint: field 'pad' at offset 45 is padding but not zero");
  EXPECT_EQ(decode_checkpoint(with_byte(blob, 47, 1), c), "checkpoint: field 'pad' at offset 46 is padding but not zero");
  EXPECT_EQ(decode_checkpoint(with_byte(blob, 6, 2), c), "checkpoint: unknown flags 2");
  // Truncated inside the fields yet checksummed: names the list and where it ran out.
  Bytes cut(blob.begin(), blob.end() - 8 - 8);
  cut.resize(cut.size() + 8);
  const Bytes short_list = with_byte(cut, 0, blob[0]);
  EXPECT_EQ(decode_checkpoint(short_list, c), "checkpoint: field 'late' needs 16 bytes at offset 108, blob has 8");
}

// The checkpoint connection's frames (docs/decisions/0056) follow the same field lists.
TEST(Wire, CheckpointFramesEncodeToTheirPinnedBytesAndNameTruncations) {
  EXPECT_EQ(hex(frame_of(CheckpointSave{4, 4096, "rank0"})),
            "534d583109000f001900000000000000040000000000000000100000000000000500000072616e6b30");
  Bytes hello;
  encode_checkpoint_hello(hello, Hello{3, 8, 4242});
  EXPECT_EQ(hex(hello), "534d583109000d000c00000000000000030000000800000092100000");
  expect_walked_size(CheckpointWelcome{1, 2, 1 << 20, 1});
  expect_walked_size(CheckpointSave{4, 4096, "rank0"});
  expect_walked_size(CheckpointRequest{5, "rank0"});
  expect_walked_size(CheckpointReply{6, 5, 2, 100, "checkpoint 'rank0': no version saved"});
  expect_walked_size(sample_listing());
  expect_truncations_name_the_field(CheckpointWelcome{1, 2, 1 << 20, 1}, "checkpoint-welcome frame");
  expect_truncations_name_the_field(CheckpointSave{4, 4096, "rank0"}, "checkpoint-save frame");
  expect_truncations_name_the_field(CheckpointRequest{5, "rank0"}, "checkpoint request frame");
  expect_truncations_name_the_field(CheckpointReply{6, 5, 2, 100, "no version"}, "checkpoint-reply frame");
  expect_truncations_name_the_field(sample_listing(), "checkpoint-listing frame");
  EXPECT_EQ(request_payload_bytes(FrameType::kCheckpointSave),
            static_cast<std::int64_t>(frame_of(CheckpointSave{}).size() - 16));
  EXPECT_EQ(request_payload_max_bytes(FrameType::kCheckpointLoad),
            static_cast<std::int64_t>(frame_of(CheckpointRequest{}).size() - 16 + kMaxCheckpointNameBytes));
  EXPECT_EQ(request_payload_bytes(FrameType::kCheckpointHello), request_payload_bytes(FrameType::kHello));
  // Replies are not requests.
  EXPECT_EQ(request_payload_bytes(FrameType::kCheckpointReply), -1);
  EXPECT_EQ(request_payload_bytes(FrameType::kCheckpointListing), -1);
}

// A lease (decision 0069): its frames encode to their pinned bytes and follow their field
// lists, and a grant's runs must be whole pages that hold the lease, since the trainer
// writes that many bytes into them.
TEST(Wire, LeaseFramesFollowTheirFieldsAndAGrantsRunsMustHoldTheLease) {
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const CheckpointLeaseGrant grant{7, 0, 3, 3 * page - 10, {0, 8 * page}, {page, 2 * page}, ""};
  if (page == 4096) {  // the pinned bytes hold the page size
    EXPECT_EQ(hex(frame_of(grant)),
            "534d5831090016004200000000000000070000000000000000000300000000000000f62f00000000000002000000000000000000000000800000000000000010000000000000002000000000000000000000");
  }
  EXPECT_EQ(hex(frame_of(CheckpointLeaseGrant{8, 7, 0, 4096, {}, {}, "full"})),
            "534d58310900160026000000000000000800000000000000070000000000000000000010000000000000000000000400000066756c6c");
  EXPECT_EQ(hex(frame_of(CheckpointCommit{8, 3, 100})),
            "534d5831090017001800000000000000080000000000000003000000000000006400000000000000");
  Bytes abandon;
  encode(abandon, FrameType::kCheckpointAbandon, CheckpointCommit{9, 3, 0});
  EXPECT_EQ(hex(abandon),
            "534d5831090018001800000000000000090000000000000003000000000000000000000000000000");
  expect_walked_size(grant);
  expect_truncations_name_the_field(grant, "checkpoint-lease-grant frame");
  expect_walked_size(CheckpointCommit{8, 3, 100});
  expect_truncations_name_the_field(CheckpointCommit{8, 3, 100}, "checkpoint-commit frame");
  const auto decoded = [](const CheckpointLeaseGrant& g) {
    const Bytes frame = frame_of(g);
    CheckpointLeaseGrant back;
    return decode(std::span(frame).subspan(sizeof(FrameHeader)), back);
  };
  EXPECT_EQ(decoded(grant), "");
  CheckpointLeaseGrant short_runs = grant;
  short_runs.size = 3 * page + 1;
  EXPECT_EQ(decoded(short_runs), "checkpoint-lease-grant frame: its runs hold " + std::to_string(3 * page) +
                                     " bytes, the lease " + std::to_string(3 * page + 1));
  CheckpointLeaseGrant torn = grant;
  torn.run_lengths[1] = 100;
  EXPECT_EQ(decoded(torn), "checkpoint-lease-grant frame: run 1 (100 bytes at offset " + std::to_string(8 * page) +
                               ") is not whole pages");
  CheckpointLeaseGrant wrapping = grant;
  wrapping.run_lengths = {page, ~std::uint64_t{0} / page * page};
  EXPECT_EQ(decoded(wrapping), "checkpoint-lease-grant frame: its runs' lengths overflow");
  const CheckpointLeaseGrant refused{7, 7, 0, 4096, {}, {}, "checkpoint 'b': this connection holds a lease already"};
  EXPECT_EQ(decoded(refused), "");  // a refusal has no runs
  Bytes lease;
  encode_checkpoint_lease(lease, CheckpointSave{1, 10, "rank0"});
  FrameHeader h{};
  ASSERT_EQ(decode_header(std::span(lease).first(sizeof(h)), h), "");
  EXPECT_EQ(h.type, static_cast<std::uint16_t>(FrameType::kCheckpointLease));
  EXPECT_EQ(request_payload_bytes(FrameType::kCheckpointLease), request_payload_bytes(FrameType::kCheckpointSave));
  EXPECT_EQ(request_payload_max_bytes(FrameType::kCheckpointLease),
            request_payload_max_bytes(FrameType::kCheckpointSave));
  EXPECT_EQ(request_payload_bytes(FrameType::kCheckpointCommit),
            static_cast<std::int64_t>(frame_of(CheckpointCommit{}).size() - sizeof(FrameHeader)));
  EXPECT_EQ(request_payload_bytes(FrameType::kCheckpointAbandon), request_payload_bytes(FrameType::kCheckpointCommit));
  EXPECT_EQ(request_payload_bytes(FrameType::kCheckpointLeaseGrant), -1);
}

TEST(Wire, CheckpointListingNamesMustAddUp) {
  CheckpointListing listing = sample_listing();
  listing.names += "x";
  const Bytes frame = frame_of(listing);
  CheckpointListing back;
  EXPECT_EQ(decode(std::span(frame).subspan(16), back),
            "checkpoint-listing frame: the name lengths add up to 10 bytes, the names hold 11");
  CheckpointListing empty_name{1, {1}, {0}, ""};
  const Bytes frame2 = frame_of(empty_name);
  EXPECT_EQ(decode(std::span(frame2).subspan(16), back), "checkpoint-listing frame: a name of 0 bytes (1 to 200 allowed)");
  const Bytes good = frame_of(sample_listing());
  ASSERT_EQ(decode(std::span(good).subspan(16), back), "");
  EXPECT_EQ(back.versions, (std::vector<std::uint64_t>{3, 1}));
  EXPECT_EQ(back.names, "rank0model");
}

}  // namespace wire_test
}  // namespace shardmix::proto
