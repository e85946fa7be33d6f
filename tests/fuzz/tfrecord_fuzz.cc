// Fuzz target: the TFRecord reader and the tf.train.Example wire-format reader
// (common/shard_formats: scan_tfrecord_shard, example_int64_feature), which read dataset
// files nobody vetted.
//
// Checks beyond "no crash, no UB": every sample lies inside the input with both CRCs valid
// at its place (recomputed here) and offsets increasing; problems are reported iff samples
// were skipped; an input without problems re-encodes (append_tfrecord of each sample) to
// exactly the input bytes; an Example label read from a record is the value our Example
// writer encodes for that label (writer and reader agree).
#include <string>

#include "common/shard_formats.h"
#include "tests/fuzz/fuzz.h"

namespace {

using namespace shardmix;
using Span = std::span<const std::uint8_t>;

std::uint32_t le32(Span s) {
  return static_cast<std::uint32_t>(s[0]) | static_cast<std::uint32_t>(s[1]) << 8 |
         static_cast<std::uint32_t>(s[2]) << 16 | static_cast<std::uint32_t>(s[3]) << 24;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Span input(data, size);
  const MemorySource source("fuzz.tfrecord", input);
  for (const TfRecordOptions& options : {TfRecordOptions{"", ~0ull}, TfRecordOptions{"label", 1 << 16}}) {
    auto scan = scan_tfrecord_shard(source, options);
    if (!scan.ok()) {
      FUZZ_CHECK(scan.status().message().find("dataset.max_sample_bytes") != std::string::npos,
                 "tfrecord: unexpected error " + scan.status().to_string());
      continue;
    }
    FUZZ_CHECK((scan->invalid_samples > 0) == !scan->problems.empty(), "tfrecord: problems iff samples were skipped");
    std::uint64_t next = 0;
    std::vector<std::uint8_t> again;
    for (const ShardSample& s : scan->samples) {
      FUZZ_CHECK(s.offset >= next + 12, "tfrecord: samples overlap or go backwards");
      FUZZ_CHECK(s.offset <= size && s.size + 4 <= size - s.offset, "tfrecord: sample beyond the input");
      const Span record = input.subspan(s.offset, s.size);
      Status ok = check_tfrecord_record(input.subspan(s.offset - 12, 12), record, input.subspan(s.offset + s.size, 4),
                                        "fuzz", s.offset);
      FUZZ_CHECK(ok.ok(), "tfrecord: accepted record fails its read-time check: " + ok.to_string());
      FUZZ_CHECK(mask_crc32c(crc32c(record)) == le32(input.subspan(s.offset + s.size, 4)), "tfrecord: bad data CRC accepted");
      FUZZ_CHECK(s.label >= 0, "tfrecord: negative label");
      if (!options.label_feature.empty()) {
        auto label = example_int64_feature(record, options.label_feature);
        FUZZ_CHECK(label.ok() && *label == s.label, "tfrecord: scan label disagrees with the Example reader");
      } else {
        FUZZ_CHECK(s.label == 0, "tfrecord: label without a label feature");
      }
      next = s.offset + s.size + 4;
      append_tfrecord(again, record);
    }
    if (scan->problems.empty()) {
      FUZZ_CHECK(again.size() == size && std::equal(again.begin(), again.end(), input.begin()),
                 "tfrecord: a clean file does not re-encode to itself");
    }
  }
  // The Example reader on raw bytes: a value it returns is what our writer encodes for it.
  for (std::string_view name : {"label", "", "image"}) {
    auto value = example_int64_feature(input, name);
    if (!value.ok()) {
      FUZZ_CHECK(value.status().code() == StatusCode::kCorrupt || value.status().code() == StatusCode::kNotFound,
                 "example: " + value.status().to_string());
      continue;
    }
    if (name.empty()) continue;  // make_example takes "" as "no such feature"
    const auto rebuilt = make_example(name, *value, "", {});
    auto back = example_int64_feature(rebuilt, name);
    FUZZ_CHECK(back.ok() && *back == *value, "example: writer and reader disagree");
  }
  return 0;
}

namespace shardmix::fuzz {

Seeds seeds() {
  Seeds out;
  std::vector<std::uint8_t> file;
  const std::string pixels = "pixels";
  const Span image(reinterpret_cast<const std::uint8_t*>(pixels.data()), pixels.size());
  for (int i = 0; i < 3; ++i) append_tfrecord(file, make_example("label", i * 1000, "image", image));
  append_tfrecord(file, {});
  out.emplace_back("examples", file);
  out.emplace_back("example", make_example("label", 7, "image", image));
  out.emplace_back("negative-label", make_example("label", -5, "", {}));
  std::vector<std::uint8_t> bad_crc = file;
  bad_crc[20] ^= 1;
  out.emplace_back("bad-data-crc", bad_crc);
  std::vector<std::uint8_t> bad_len = file;
  bad_len[1] ^= 1;
  out.emplace_back("bad-length-crc", bad_len);
  out.emplace_back("cut", std::vector<std::uint8_t>(file.begin(), file.begin() + 30));
  return out;
}

}  // namespace shardmix::fuzz
