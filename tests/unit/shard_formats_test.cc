// Tar (WebDataset) and TFRecord parsing, scanning shard datasets into the catalog, reading
// shard samples by offset, and what each kind of damage does (exact messages: file, offset).
#include "common/shard_formats.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "common/catalog.h"
#include "tests/support/temp_dir.h"
#include "tests/unit/catalog_support.h"
#include "server/sample_reader.h"

namespace shardmix {
namespace shard_formats_test {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

Bytes bytes_of(std::string_view s) { return Bytes(s.begin(), s.end()); }

// An independent ustar header writer (not the one in shard_formats.cc), for hand-made
// archives: pax headers, bad checksums.
Bytes ustar_header(std::string_view name, char type, std::uint64_t size, bool break_checksum = false) {
  Bytes h(512, 0);
  std::copy(name.begin(), name.end(), h.begin());
  auto octal = [&](std::size_t at, std::size_t width, std::uint64_t v) {
    const std::string t = fmt::format("{:0{}o}", v, width - 1);
    std::copy(t.begin(), t.end(), h.begin() + static_cast<std::ptrdiff_t>(at));
  };
  octal(100, 8, 0644);
  octal(124, 12, size);
  h[156] = static_cast<std::uint8_t>(type);
  std::memcpy(h.data() + 257, "ustar\0" "00", 8);
  std::fill(h.begin() + 148, h.begin() + 156, ' ');
  unsigned sum = 0;
  for (std::uint8_t c : h) sum += c;
  if (break_checksum) sum += 1;
  octal(148, 7, sum);
  return h;
}
void append(Bytes& out, const Bytes& more) { out.insert(out.end(), more.begin(), more.end()); }

// `prefix`, then a length-delimited protobuf field `tag` holding `inner` (short: one length byte).
Bytes delimited(std::uint8_t tag, const Bytes& inner, Bytes prefix = {}) {
  prefix.push_back(tag);
  prefix.push_back(static_cast<std::uint8_t>(inner.size()));
  append(prefix, inner);
  return prefix;
}

// A tf.train.Example whose one feature `name` is the Int64List with the bytes `list`, wrapped by
// hand: Example { Features { map entry { key, Feature { int64_list } } } }.
Bytes example_with_int64_list(const std::string& name, const Bytes& list) {
  Bytes key = {0x0a, static_cast<std::uint8_t>(name.size())};
  key.insert(key.end(), name.begin(), name.end());
  return delimited(0x0a, delimited(0x0a, delimited(0x12, delimited(0x1a, list), key)));
}
void pad(Bytes& out) { out.resize((out.size() + 511) / 512 * 512, 0); }

TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xe3069283u);  // the CRC-32C check value
  EXPECT_EQ(crc32c({}), 0u);
  const Bytes data = bytes_of("The quick brown fox jumps over the lazy dog");
  const std::uint32_t state = crc32c_update(crc32c_update(kCrc32cInit, std::span(data).first(10)),
                                            std::span(data).subspan(10));
  EXPECT_EQ(crc32c_finish(state), crc32c(data));
  // TFRecord's mask, by its definition.
  const std::uint32_t c = 0x12345678u;
  EXPECT_EQ(mask_crc32c(c), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TarTest, ListsUstarGnuLongNameAndPaxMembers) {
  Bytes tar;
  const Bytes a = bytes_of("alpha");
  const std::uint64_t a_at = append_tar_member(tar, "dir/a.jpg", a);
  const std::string long_name = std::string(120, 'x') + ".jpg";  // no slash: GNU 'L'
  const std::uint64_t b_at = append_tar_member(tar, long_name, bytes_of("bravo!"));
  const std::string split_name = std::string(60, 'p') + "/" + std::string(70, 'q') + ".cls";  // ustar prefix
  const std::uint64_t c_at = append_tar_member(tar, split_name, bytes_of("7"));
  // pax: path and size override the ustar fields
  const std::string pax_record = "29 path=pax/named.sample.png\n";
  ASSERT_EQ(pax_record.size(), 29u);
  append(tar, ustar_header("PaxHeader", 'x', pax_record.size()));
  append(tar, bytes_of(pax_record));
  pad(tar);
  append(tar, ustar_header("truncated-name", '0', 3));
  const std::uint64_t d_at = tar.size();
  append(tar, bytes_of("png"));
  pad(tar);
  append(tar, ustar_header("somedir/", '5', 0));  // a directory: passed over
  append_tar_end(tar);

  const TarListing listing = list_tar(MemorySource("t.tar", tar));
  EXPECT_TRUE(listing.problems.empty()) << listing.problems.front();
  ASSERT_EQ(listing.members.size(), 4u);
  EXPECT_EQ(listing.members[0].name, "dir/a.jpg");
  EXPECT_EQ(listing.members[0].data_offset, a_at);
  EXPECT_EQ(listing.members[0].size, 5u);
  EXPECT_EQ(listing.members[1].name, long_name);
  EXPECT_EQ(listing.members[1].data_offset, b_at);
  EXPECT_EQ(listing.members[2].name, split_name);
  EXPECT_EQ(listing.members[2].data_offset, c_at);
  EXPECT_EQ(listing.members[3].name, "pax/named.sample.png");
  EXPECT_EQ(listing.members[3].data_offset, d_at);
  EXPECT_EQ(listing.members[3].size, 3u);
}

TEST(TarTest, WebDatasetKeys) {
  std::string_view key, ext;
  webdataset_key("a/b.c/d.seg.png", key, ext);
  EXPECT_EQ(key, "a/b.c/d");  // a dot in a directory name is not the key's end
  EXPECT_EQ(ext, "seg.png");
  webdataset_key("noext", key, ext);
  EXPECT_EQ(key, "noext");
  EXPECT_EQ(ext, "");
}

// A WebDataset shard: each sample as (key, {ext: bytes}).
Bytes wds_shard(const std::vector<std::pair<std::string, std::map<std::string, std::string>>>& samples,
                std::map<std::string, std::uint64_t>* offsets = nullptr) {
  Bytes tar;
  for (const auto& [key, members] : samples) {
    for (const auto& [ext, data] : members) {
      const std::uint64_t at = append_tar_member(tar, key + "." + ext, bytes_of(data));
      if (offsets) (*offsets)[key + "." + ext] = at;
    }
  }
  append_tar_end(tar);
  return tar;
}

WebDatasetOptions wds_options() { return WebDatasetOptions{{"jpg", "png"}, "cls", 1 << 20}; }

TEST(WebDatasetTest, GroupsByKeyPicksTheDataMemberByPreferenceAndParsesLabels) {
  std::map<std::string, std::uint64_t> at;
  const Bytes tar = wds_shard({{"s0", {{"cls", "3\n"}, {"jpg", "JPEG0"}, {"json", "{}"}}},
                               {"s1", {{"cls", " 12 "}, {"jpg", "JPEG1"}, {"png", "PNG1"}}},
                               {"d/s2", {{"cls", "0"}, {"png", "PNG2"}}}},
                              &at);
  auto scan = scan_webdataset_shard(MemorySource("s.tar", tar), wds_options());
  ASSERT_TRUE(scan.ok()) << scan.status().to_string();
  EXPECT_TRUE(scan->problems.empty());
  EXPECT_EQ(scan->invalid_samples, 0u);
  ASSERT_EQ(scan->samples.size(), 3u);
  EXPECT_EQ(scan->samples[0], (ShardSample{at["s0.jpg"], 5, 3}));
  EXPECT_EQ(scan->samples[1], (ShardSample{at["s1.jpg"], 5, 12}));  // jpg before png
  EXPECT_EQ(scan->samples[2], (ShardSample{at["d/s2.png"], 4, 0}));

  WebDatasetOptions unlabelled = wds_options();
  unlabelled.label_ext = "";
  auto scan0 = scan_webdataset_shard(MemorySource("s.tar", tar), unlabelled);
  ASSERT_TRUE(scan0.ok());
  for (const ShardSample& s : scan0->samples) EXPECT_EQ(s.label, 0);
}

TEST(WebDatasetTest, SamplesWithoutDataOrLabelAreSkippedAndNamed) {
  std::map<std::string, std::uint64_t> at;
  const Bytes tar = wds_shard({{"ok", {{"cls", "1"}, {"jpg", "x"}}},
                               {"nodata", {{"cls", "1"}, {"txt", "caption"}}},
                               {"nolabel", {{"jpg", "y"}}},
                               {"badlabel", {{"cls", "cat"}, {"jpg", "z"}}},
                               {"neg", {{"cls", "-1"}, {"jpg", "w"}}}},
                              &at);
  auto scan = scan_webdataset_shard(MemorySource("/d/s.tar", tar), wds_options());
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->samples.size(), 1u);
  EXPECT_EQ(scan->invalid_samples, 4u);
  EXPECT_FALSE(scan->rest_skipped);
  ASSERT_EQ(scan->problems.size(), 4u);
  EXPECT_EQ(scan->problems[0], fmt::format("/d/s.tar: sample 'nodata' (header at offset {}) has no member with an "
                                           "extension in dataset.sample_ext",
                                           at["nodata.cls"] - 512));
  EXPECT_EQ(scan->problems[1],
            fmt::format("/d/s.tar: sample 'nolabel' (header at offset {}) has no '.cls' label member", at["nolabel.jpg"] - 512));
  EXPECT_EQ(scan->problems[2], fmt::format("/d/s.tar: label member 'badlabel.cls' (data at offset {}) is not an ASCII "
                                           "integer in 0..2147483647",
                                           at["badlabel.cls"]));
  EXPECT_NE(scan->problems[3].find("'neg.cls'"), std::string::npos);
}

TEST(WebDatasetTest, TruncatedTarKeepsTheSamplesBeforeTheCutAndCountsTheRestAsOne) {
  std::map<std::string, std::uint64_t> at;
  const Bytes full = wds_shard({{"a", {{"cls", "0"}, {"jpg", std::string(700, 'a')}}},
                                {"b", {{"cls", "1"}, {"jpg", std::string(700, 'b')}}},
                                {"c", {{"cls", "2"}, {"jpg", std::string(700, 'c')}}}},
                               &at);
  // Cut inside c.jpg's data: a and b survive; c (the group at the cut) is lost.
  const Bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(at["c.jpg"] + 100));
  auto scan = scan_webdataset_shard(MemorySource("/d/s.tar", cut), wds_options());
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->samples.size(), 2u);
  EXPECT_EQ(scan->samples[1].label, 1);
  EXPECT_TRUE(scan->rest_skipped);
  EXPECT_EQ(scan->invalid_samples, 1u);
  ASSERT_EQ(scan->problems.size(), 1u);
  EXPECT_EQ(scan->problems[0], fmt::format("/d/s.tar: truncated tar: member 'c.jpg' (header at offset {}) has 700 "
                                           "bytes of data at offset {}, the file ends at {}",
                                           at["c.jpg"] - 512, at["c.jpg"], at["c.jpg"] + 100));
  // Cut inside the first member of a new key (b.cls): a is complete and kept.
  const Bytes cut_new_key(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(at["b.cls"]));
  auto scan1 = scan_webdataset_shard(MemorySource("/d/s.tar", cut_new_key), wds_options());
  ASSERT_TRUE(scan1.ok());
  ASSERT_EQ(scan1->samples.size(), 1u);
  EXPECT_EQ(scan1->samples[0].label, 0);
  EXPECT_EQ(scan1->invalid_samples, 1u);
  // Cut inside a header: the member is unknown, so the group before it (a) may be
  // incomplete and is lost too.
  const Bytes cut_header(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(at["b.cls"] - 512 + 100));
  auto scan2 = scan_webdataset_shard(MemorySource("/d/s.tar", cut_header), wds_options());
  ASSERT_TRUE(scan2.ok());
  EXPECT_TRUE(scan2->samples.empty());
  EXPECT_EQ(scan2->problems.at(0), fmt::format("/d/s.tar: truncated tar: header at offset {} needs 512 bytes, the file "
                                               "ends at {}",
                                               at["b.cls"] - 512, at["b.cls"] - 412));
}

TEST(WebDatasetTest, CorruptHeaderStopsTheShardWithItsOffset) {
  Bytes tar;
  append_tar_member(tar, "a.jpg", bytes_of("1"));
  append_tar_member(tar, "a.cls", bytes_of("1"));
  const std::size_t bad_at = tar.size();
  append(tar, ustar_header("b.jpg", '0', 1, /*break_checksum=*/true));
  append(tar, Bytes(512, 'b'));
  append_tar_end(tar);
  auto scan = scan_webdataset_shard(MemorySource("s.tar", tar), wds_options());
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(scan->problems.at(0), fmt::format("s.tar: corrupt tar header at offset {}: bad header checksum", bad_at));
  EXPECT_TRUE(scan->rest_skipped);
}

TEST(WebDatasetTest, OversizedSampleIsAnErrorNamingTheKey) {
  const Bytes tar = wds_shard({{"big", {{"cls", "0"}, {"jpg", std::string(100, 'x')}}}});
  WebDatasetOptions o = wds_options();
  o.max_sample_bytes = 99;
  auto scan = scan_webdataset_shard(MemorySource("s.tar", tar), o);
  ASSERT_FALSE(scan.ok());
  EXPECT_NE(scan.status().message().find("big.jpg"), std::string::npos) << scan.status().message();
  EXPECT_NE(scan.status().message().find("dataset.max_sample_bytes = 99"), std::string::npos);
}

TEST(ExtensionListTest, Parses) {
  auto ok = parse_extension_list("jpg, png,seg.png", "k");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (std::vector<std::string>{"jpg", "png", "seg.png"}));
  for (std::string_view bad : {"", "jpg,", ".jpg", "a/b", ",,"}) {
    auto r = parse_extension_list(bad, "dataset.sample_ext");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("dataset.sample_ext"), std::string::npos);
  }
}

// ---------------------------------------------------------------- TFRecord and Example

TEST(ExampleTest, ReadsTheInt64FeaturePackedOrNot) {
  const Bytes ex = make_example("label", 42, "image", bytes_of("pixels"));
  EXPECT_EQ(*example_int64_feature(ex, "label"), 42);
  auto missing = example_int64_feature(ex, "class");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto wrong_kind = example_int64_feature(ex, "image");
  ASSERT_FALSE(wrong_kind.ok());
  EXPECT_NE(wrong_kind.status().message().find("bytes_list, not an int64_list"), std::string::npos);
  // Unpacked: Int64List { value: 7 (varint field 1) }, built by hand.
  EXPECT_EQ(*example_int64_feature(example_with_int64_list("y", {0x08, 0x07}), "y"), 7);
  // Two values (packed): refused.
  auto r2 = example_int64_feature(example_with_int64_list("y", {0x0a, 0x02, 0x01, 0x02}), "y");
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("more than 1"), std::string::npos) << r2.status().message();
}

TEST(ExampleTest, EveryTruncationIsRefusedNotCrashed) {
  const Bytes ex = make_example("label", 300, "image", bytes_of("pixels and more pixels"));
  for (std::size_t n = 1; n < ex.size(); ++n) {
    auto r = example_int64_feature(std::span(ex).first(n), "label");
    // A prefix can still parse as a shorter valid message only if it ends on a field boundary
    // that leaves out the label: then the feature is missing, never a wrong value.
    if (r.ok()) {
      EXPECT_EQ(*r, 300) << n;
    }
  }
}

TfRecordOptions tfr_options() { return TfRecordOptions{"label", 1 << 20}; }

TEST(TfRecordTest, ScansRecordsAndLabels) {
  Bytes file;
  std::vector<std::uint64_t> at;
  for (int i = 0; i < 4; ++i) {
    const Bytes ex = make_example("label", i * 10, "image", Bytes(static_cast<std::size_t>(i * 100), 'p'));
    at.push_back(file.size() + 12);
    append_tfrecord(file, ex);
  }
  auto scan = scan_tfrecord_shard(MemorySource("r.tfrecord", file), tfr_options());
  ASSERT_TRUE(scan.ok());
  EXPECT_TRUE(scan->problems.empty());
  ASSERT_EQ(scan->samples.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(scan->samples[i].offset, at[i]);
    EXPECT_EQ(scan->samples[i].label, i * 10);
  }
  // Opaque records: no label feature, every label 0; any bytes are a record.
  Bytes raw;
  append_tfrecord(raw, bytes_of("not an example"));
  append_tfrecord(raw, {});
  auto opaque = scan_tfrecord_shard(MemorySource("r.tfrecord", raw), TfRecordOptions{"", 1 << 20});
  ASSERT_TRUE(opaque.ok());
  ASSERT_EQ(opaque->samples.size(), 2u);
  EXPECT_EQ(opaque->samples[1], (ShardSample{raw.size() - 4, 0, 0}));
}

TEST(TfRecordTest, DamageIsNamedWithFileAndOffset) {
  Bytes file;
  std::vector<std::uint64_t> start;
  for (int i = 0; i < 4; ++i) {
    start.push_back(file.size());
    append_tfrecord(file, make_example("label", i, "image", Bytes(50, static_cast<std::uint8_t>(i))));
  }
  const std::string name = "/data/x.tfrecord";
  {  // a data byte flipped: that record only
    Bytes bad = file;
    bad[start[1] + 12 + 20] ^= 1;
    auto scan = scan_tfrecord_shard(MemorySource(name, bad), tfr_options());
    ASSERT_TRUE(scan.ok());
    EXPECT_EQ(scan->samples.size(), 3u);
    EXPECT_EQ(scan->invalid_samples, 1u);
    EXPECT_FALSE(scan->rest_skipped);
    EXPECT_EQ(scan->problems.at(0),
              fmt::format("{}: TFRecord record at offset {}: bad data CRC (record skipped)", name, start[1]));
  }
  {  // a length byte flipped: the rest of the file cannot be trusted
    Bytes bad = file;
    bad[start[2] + 1] ^= 1;
    auto scan = scan_tfrecord_shard(MemorySource(name, bad), tfr_options());
    ASSERT_TRUE(scan.ok());
    EXPECT_EQ(scan->samples.size(), 2u);
    EXPECT_TRUE(scan->rest_skipped);
    EXPECT_EQ(scan->problems.at(0), fmt::format("{}: TFRecord record at offset {}: bad length CRC (the rest of the file "
                                                "is skipped)",
                                                name, start[2]));
  }
  {  // cut inside the last record's data
    const Bytes cut(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(start[3] + 30));
    auto scan = scan_tfrecord_shard(MemorySource(name, cut), tfr_options());
    ASSERT_TRUE(scan.ok());
    EXPECT_EQ(scan->samples.size(), 3u);
    const std::uint64_t length = start[3] == 0 ? 0 : (file.size() - start[3] - 16);
    EXPECT_EQ(scan->problems.at(0), fmt::format("{}: truncated TFRecord: record at offset {} has {} bytes of data at "
                                                "offset {} plus a 4-byte CRC, the file ends at {}",
                                                name, start[3], length, start[3] + 12, start[3] + 30));
  }
  {  // cut inside a header
    const Bytes cut(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(start[3] + 5));
    auto scan = scan_tfrecord_shard(MemorySource(name, cut), tfr_options());
    ASSERT_TRUE(scan.ok());
    EXPECT_EQ(scan->problems.at(0), fmt::format("{}: truncated TFRecord: record header at offset {} needs 12 bytes, the "
                                                "file ends at {}",
                                                name, start[3], start[3] + 5));
  }
  {  // a record that is not an Example with the label
    Bytes other = file;
    append_tfrecord(other, bytes_of("\xff\xff"));
    auto scan = scan_tfrecord_shard(MemorySource(name, other), tfr_options());
    ASSERT_TRUE(scan.ok());
    EXPECT_EQ(scan->samples.size(), 4u);
    EXPECT_EQ(scan->problems.at(0).rfind(fmt::format("{}: TFRecord record at offset {}: dataset.label_feature 'label': ",
                                                     name, file.size()),
                                         0),
              0u)
        << scan->problems.at(0);
  }
}

// ---------------------------------------------------------------- datasets on disk

class ShardDatasetTest : public test_support::TempDirTest {
 protected:
  ShardDatasetTest() : TempDirTest("shards") {}
  DatasetConfig dataset(DatasetFormat format, const std::string& rel) const {
    DatasetConfig d;
    d.path = (dir_ / rel).string();
    d.format = format;
    d.sample_ext = "jpg,png";
    d.label_feature = "label";
    return d;
  }
};

using test_support::scan_all;

std::vector<std::pair<std::string, std::int32_t>> read_all(const Catalog& c, const DatasetConfig& d) {
  std::vector<std::pair<std::string, std::int32_t>> out;
  for (SampleId id = 0; id < c.size(); ++id) {
    std::string bytes(c.sample_bytes(id), '\0');
    Status s = read_sample(c, d, id, reinterpret_cast<std::uint8_t*>(bytes.data()));
    EXPECT_TRUE(s.ok()) << s.to_string();
    out.emplace_back(std::move(bytes), c.label(id));
  }
  return out;
}

TEST_F(ShardDatasetTest, WebDatasetDirectoryScannedByAnyNumberOfRanksGivesTheSameCatalog) {
  for (int s = 0; s < 5; ++s) {
    std::vector<std::pair<std::string, std::map<std::string, std::string>>> samples;
    for (int i = 0; i < 3; ++i) {
      samples.push_back({fmt::format("k{}_{}", s, i), {{"cls", std::to_string((s + i) % 4)}, {"jpg", fmt::format("s{}i{}", s, i)}}});
    }
    write(fmt::format("wds/shard-{}.tar", s), wds_shard(samples));
  }
  write("wds/README.md", bytes_of("not a shard"));
  write("wds/.hidden.tar", bytes_of("hidden"));
  const DatasetConfig d = dataset(DatasetFormat::kWebDataset, "wds");
  auto one = scan_all(d, 1);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(one->size(), 15u);
  EXPECT_TRUE(one->sharded());
  EXPECT_EQ(one->file_count(), 5u);
  EXPECT_EQ(one->class_names(), (std::vector<std::string>{"0", "1", "2", "3"}));
  for (int n : {2, 3, 7}) {
    auto many = scan_all(d, n);
    ASSERT_TRUE(many.ok());
    EXPECT_EQ(many->serialize(), one->serialize()) << n << " ranks";
  }
  // Ids follow (label, shard, offset); the trace name is shard@offset.
  for (SampleId id = 1; id < one->size(); ++id) EXPECT_LE(one->label(id - 1), one->label(id));
  EXPECT_EQ(one->location(0), fmt::format("{}@{}", one->path(0), one->offset(0)));
  const auto got = read_all(*one, d);
  EXPECT_EQ(got[0].first.substr(0, 1), "s");
  // A single shard as dataset.path.
  const DatasetConfig single = dataset(DatasetFormat::kWebDataset, "wds/shard-2.tar");
  auto just = scan_all(single, 2);
  ASSERT_TRUE(just.ok()) << just.status().to_string();
  EXPECT_EQ(just->size(), 3u);
  EXPECT_EQ(just->path(0), "shard-2.tar");
  EXPECT_EQ(read_all(*just, single).size(), 3u);
}

TEST_F(ShardDatasetTest, DamagedShardsAreSkippedAndCountedOrFatalWhenStrict) {
  write("t/a.tfrecord", [] {
    Bytes f;
    for (int i = 0; i < 3; ++i) append_tfrecord(f, make_example("label", i, "image", Bytes(10, 'x')));
    return f;
  }());
  Bytes bad;
  append_tfrecord(bad, make_example("label", 1, "image", Bytes(10, 'y')));
  append_tfrecord(bad, make_example("label", 2, "image", Bytes(10, 'z')));
  bad[bad.size() - 8] ^= 0x10;  // inside the second record's data
  const std::string bad_path = write("t/b.tfrecord", bad);
  DatasetConfig d = dataset(DatasetFormat::kTfRecord, "t");
  auto c = scan_all(d, 2);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->size(), 4u);
  EXPECT_EQ(c->invalid_samples(), 1u);
  EXPECT_EQ(c->invalid_shards(), 0u);
  auto part = scan_partition(d, 1, 2);  // rank 1 scans b.tfrecord
  ASSERT_TRUE(part.ok());
  ASSERT_EQ(part->problems.size(), 1u);
  EXPECT_EQ(part->problems[0],
            fmt::format("{}: TFRecord record at offset {}: bad data CRC (record skipped)", bad_path, bad.size() / 2));

  d.strict = true;
  auto strict = scan_partition(d, 1, 2);
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(strict.status().message(), fmt::format("{}: TFRecord record at offset {}: bad data CRC (record skipped) "
                                                   "(dataset.strict = true)",
                                                   bad_path, bad.size() / 2));
}

TEST_F(ShardDatasetTest, AShardThatDisappearsBetweenListingAndScan) {
  Bytes f;
  append_tfrecord(f, make_example("label", 0, "image", Bytes(3, 'x')));
  write("t/a.tfrecord", f);
  DatasetConfig d = dataset(DatasetFormat::kTfRecord, "t");
  auto scan = scan_shard_list(d, {"a.tfrecord", "gone.tfrecord"}, 0, 1);
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(scan->entries.size(), 1u);
  EXPECT_EQ(scan->invalid_shards, 1u);
  ASSERT_EQ(scan->problems.size(), 1u);
  EXPECT_EQ(scan->problems[0], fmt::format("{}/gone.tfrecord: cannot open (offset 0): No such file or directory "
                                           "(shard skipped)",
                                           d.path));
  d.strict = true;
  auto strict = scan_shard_list(d, {"a.tfrecord", "gone.tfrecord"}, 0, 1);
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.status().code(), StatusCode::kNotFound);
  EXPECT_NE(strict.status().to_string().find("gone.tfrecord: cannot open (offset 0)"), std::string::npos);
}

TEST_F(ShardDatasetTest, ReadingAShardThatChangedOrVanishedAfterTheScanNamesFileAndOffset) {
  Bytes f;
  for (int i = 0; i < 3; ++i) append_tfrecord(f, make_example("label", i, "image", Bytes(40, 'a')));
  const std::string path = write("t/a.tfrecord", f);
  const DatasetConfig d = dataset(DatasetFormat::kTfRecord, "t");
  auto c = scan_all(d, 1);
  ASSERT_TRUE(c.ok());
  const SampleId id = 1;
  std::vector<std::uint8_t> out(c->sample_bytes(id));
  ASSERT_TRUE(read_sample(*c, d, id, out.data()).ok());
  const std::uint64_t record = c->offset(id) - 12;

  Bytes changed = f;
  changed[c->offset(id) + 3] ^= 1;
  write("t/a.tfrecord", changed);
  Status s = read_sample(*c, d, id, out.data());
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_EQ(s.message(),
            fmt::format("{}: TFRecord record at offset {}: bad data CRC: the file changed since the scan", path, record));

  fs::resize_file(path, c->offset(id) + 5);
  s = read_sample(*c, d, id, out.data());
  EXPECT_EQ(s.message(), fmt::format("{}: the shard ends at offset {}, inside the sample at offset {} ({} bytes): it "
                                     "changed since the scan",
                                     path, c->offset(id) + 5, c->offset(id), c->sample_bytes(id)));
  fs::remove(path);
  s = read_sample(*c, d, id, out.data());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), fmt::format("{}: cannot open the shard to read the sample at offset {}: No such file or "
                                     "directory (it was present when the dataset was scanned)",
                                     path, c->offset(id)));
}

TEST_F(ShardDatasetTest, ReadingATarMemberWhoseHeaderChangedIsAnError) {
  std::map<std::string, std::uint64_t> at;
  const Bytes tar = wds_shard({{"a", {{"cls", "0"}, {"jpg", "AAAA"}}}, {"b", {{"cls", "1"}, {"jpg", "BBBB"}}}}, &at);
  const std::string path = write("w/s.tar", tar);
  const DatasetConfig d = dataset(DatasetFormat::kWebDataset, "w");
  auto c = scan_all(d, 1);
  ASSERT_TRUE(c.ok());
  std::string out(4, '\0');
  ASSERT_TRUE(read_sample(*c, d, 1, reinterpret_cast<std::uint8_t*>(out.data())).ok());
  EXPECT_EQ(out, "BBBB");
  Bytes changed = tar;
  changed[at["b.jpg"] - 512 + 3] ^= 1;  // the member's header: its checksum no longer holds
  write("w/s.tar", changed);
  Status s = read_sample(*c, d, 1, reinterpret_cast<std::uint8_t*>(out.data()));
  EXPECT_EQ(s.message(), fmt::format("{}: no valid tar header at offset {} before the sample at offset {}: the shard "
                                     "changed since the scan",
                                     path, at["b.jpg"] - 512, at["b.jpg"]));
}

TEST_F(ShardDatasetTest, APaxSizedMemberIsReadByOffset) {
  // pax "size" with the ustar size field 0, as writers do for members they size in pax.
  Bytes tar;
  const std::string rec = "11 size=11\n";  // the length counts itself
  append(tar, ustar_header("PaxHeader", 'x', rec.size()));
  append(tar, bytes_of(rec));
  pad(tar);
  append(tar, ustar_header("k.jpg", '0', 0));
  append(tar, bytes_of("hello world"));
  pad(tar);
  append_tar_member(tar, "k.cls", bytes_of("5"));
  append_tar_end(tar);
  write("p/s.tar", tar);
  const DatasetConfig d = dataset(DatasetFormat::kWebDataset, "p");
  auto c = scan_all(d, 1);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->size(), 1u);
  EXPECT_EQ(c->label(0), 5);
  const auto got = read_all(*c, d);
  EXPECT_EQ(got[0].first, "hello world");
}

TEST(ShardCatalogTest, OverheadPerSampleIsAtMost64Bytes) {
  std::vector<std::string> shards;
  for (int s = 0; s < 100; ++s) shards.push_back(fmt::format("train/shard-{:06d}.tar", s));
  std::vector<CatalogEntry> entries;
  for (std::uint32_t i = 0; i < 100000; ++i) {
    entries.push_back(CatalogEntry{"", 100000 + i, static_cast<std::int32_t>(i % 1000), i % 100, 512ull * (i / 100 + 1) * 300});
  }
  auto c = Catalog::from_shard_entries(shards, std::move(entries), {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const double per_sample = static_cast<double>(c->memory_bytes()) / static_cast<double>(c->size());
  EXPECT_LE(per_sample, 64.0);
  EXPECT_LE(c->serialize().size(), 24u * c->size() + 200 * 30);  // serialised: 24 bytes a sample + shard paths
  auto back = Catalog::deserialize(c->serialize());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->serialize(), c->serialize());
  EXPECT_EQ(back->location(5), c->location(5));
}

TEST(ShardCatalogTest, CanonicalOrderAndRefusals) {
  // Shards given in any order, one unused: the catalog sorts them and drops the unused one.
  auto c = Catalog::from_shard_entries({"b.tar", "unused.tar", "a.tar"},
                                       {{"", 5, 1, 0, 512}, {"", 6, 0, 2, 1024}, {"", 7, 0, 0, 2048}, {"", 8, 0, 2, 512}},
                                       {"0", "1"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->file_count(), 2u);
  ASSERT_EQ(c->size(), 4u);
  EXPECT_EQ(c->location(0), "a.tar@512");
  EXPECT_EQ(c->location(1), "a.tar@1024");
  EXPECT_EQ(c->location(2), "b.tar@2048");
  EXPECT_EQ(c->location(3), "b.tar@512");
  auto dup = Catalog::from_shard_entries({"a.tar"}, {{"", 5, 1, 0, 512}, {"", 6, 0, 0, 512}}, {});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("two samples at offset 512 of shard 'a.tar'"), std::string::npos);
  // Every truncation of a serialised shard catalog is an error naming an offset.
  const auto bytes = c->serialize();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto r = Catalog::deserialize(std::span(bytes).first(n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_NE(r.status().message().find("offset"), std::string::npos);
  }
}

// ---------------------------------------------------------------- property: formats agree

// The same samples as a folder dataset, tar shards and TFRecord files give the same
// (bytes, label) multiset, whatever the shard split and the number of scanning ranks.
// Each sample's bytes are a tf.train.Example (so the TFRecord version can carry the label
// inside the record, as the record bytes are the sample).
RC_GTEST_PROP(ShardFormatsProperty, FolderTarAndTfRecordVersionsYieldTheSameSamples, ()) {
  const auto n = *rc::gen::inRange<int>(1, 40);
  const auto classes = *rc::gen::inRange<int>(1, 6);
  const auto per_shard = *rc::gen::inRange<int>(1, 12);
  const auto ranks = *rc::gen::inRange<int>(1, 5);
  std::vector<std::pair<Bytes, std::int32_t>> samples;
  for (int i = 0; i < n; ++i) {
    const auto label = *rc::gen::inRange<std::int32_t>(0, classes);
    const auto payload = *rc::gen::container<std::vector<std::uint8_t>>(rc::gen::arbitrary<std::uint8_t>());
    samples.emplace_back(make_example("label", label, "image", payload), label);
  }
  const test_support::TempDir dir("prop");  // emptied for each generated case
  auto put = [&](const fs::path& rel, const Bytes& b) { dir.write(rel, b); };
  for (int c = 0; c < classes; ++c) fs::create_directories(dir / "folder" / fmt::format("c{:03d}", c));
  Bytes tar, tfr;
  int shard = 0;
  auto flush = [&] {
    append_tar_end(tar);
    put(fs::path("wds") / fmt::format("s{:04d}.tar", shard), tar);
    put(fs::path("tfr") / fmt::format("s{:04d}.tfrecord", shard), tfr);
    tar.clear();
    tfr.clear();
    ++shard;
  };
  for (int i = 0; i < n; ++i) {
    const auto& [bytes, label] = samples[static_cast<std::size_t>(i)];
    put(fs::path("folder") / fmt::format("c{:03d}", label) / fmt::format("{}.bin", i), bytes);
    append_tar_member(tar, fmt::format("{:05d}.bin", i), bytes);
    const std::string cls = std::to_string(label);
    append_tar_member(tar, fmt::format("{:05d}.cls", i), bytes_of(cls));
    append_tfrecord(tfr, bytes);
    if ((i + 1) % per_shard == 0) flush();
  }
  if (n % per_shard != 0) flush();

  auto multiset = [&](DatasetFormat format, const std::string& sub) {
    DatasetConfig d;
    d.path = (dir / sub).string();
    d.format = format;
    d.sample_ext = "bin";
    d.label_feature = "label";
    auto c = scan_all(d, ranks);
    RC_ASSERT(c.ok());
    RC_ASSERT(c->invalid_samples() == 0u);
    auto all = read_all(*c, d);
    std::sort(all.begin(), all.end());
    return all;
  };
  const auto folder = multiset(DatasetFormat::kFolder, "folder");
  const auto wds = multiset(DatasetFormat::kWebDataset, "wds");
  const auto tfrecord = multiset(DatasetFormat::kTfRecord, "tfr");
  RC_ASSERT(folder.size() == static_cast<std::size_t>(n));
  RC_ASSERT(wds == folder);
  RC_ASSERT(tfrecord == folder);
}

}  // namespace shard_formats_test
}  // namespace shardmix
