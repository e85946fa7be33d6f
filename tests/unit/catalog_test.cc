#include "common/catalog.h"
#include "tests/support/temp_dir.h"
#include "tests/unit/catalog_support.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "common/rng.h"

namespace shardmix {
namespace catalog_test {

namespace fs = std::filesystem;

class CatalogTest : public test_support::TempDirTest {
 protected:
  CatalogTest() : TempDirTest("catalog") {}

  // Creates dir_/rel with `size` bytes (parents too) and returns the absolute path.
  std::string file(const std::string& rel, std::size_t size) { return write(rel, std::string(size, 'x')); }

  DatasetConfig folder(const std::string& rel = "data") const {
    DatasetConfig d;
    d.path = (dir_ / rel).string();
    d.format = DatasetFormat::kFolder;
    return d;
  }
  DatasetConfig filelist(const std::string& list) const {
    DatasetConfig d;
    d.path = list;
    d.format = DatasetFormat::kFileList;
    return d;
  }
};

using test_support::scan_all;

std::vector<std::string> paths_of(const Catalog& c) {
  std::vector<std::string> out;
  for (SampleId id = 0; id < c.size(); ++id) out.emplace_back(c.path(id));
  return out;
}

TEST_F(CatalogTest, FolderScanHandlesOddNamesNestingHiddenAndEmptyFiles) {
  file("data/a/x.jpg", 10);
  file("data/a/sub/deeper/y.jpg", 20);
  file("data/a/.hidden", 5);
  file("data/a/.hiddendir/z.jpg", 5);
  file("data/b class/file with spaces.jpg", 30);
  file("data/\xc3\xbcn\xc3\xaf" "code/\xe3\x83\x95\xe3\x82\xa1\xe3\x82\xa4\xe3\x83\xab.jpg", 40);  // ünïcode/ファイル.jpg
  file("data/Z/empty", 0);
  file("data/Z/new\nline", 3);
  file("data/README", 100);  // directly under the root: ignored
  file("data/.git/config", 1);
  fs::create_directory_symlink(dir_ / "data" / "b class", dir_ / "data" / "a" / "linked_dir");  // not followed
  fs::create_symlink(dir_ / "data" / "a" / "x.jpg", dir_ / "data" / "a" / "linked.jpg");       // followed
  fs::create_directories(dir_ / "data" / "empty_class");

  auto scan = scan_partition(folder(), 0, 1);
  ASSERT_TRUE(scan.ok()) << scan.status().to_string();
  EXPECT_EQ(scan->skipped_root_files, 1u);
  EXPECT_EQ(scan->skipped_hidden, 3u);  // .git, a/.hidden, a/.hiddendir
  EXPECT_EQ(scan->skipped_symlinked_dirs, 1u);

  auto catalog = scan_all(folder(), 1);
  ASSERT_TRUE(catalog.ok()) << catalog.status().to_string();
  // Class folders sorted bytewise: 'Z' < 'a' < 'b class' < 'empty_class' < 0xC3...
  EXPECT_EQ(catalog->class_names(),
            (std::vector<std::string>{"Z", "a", "b class", "empty_class", "\xc3\xbcn\xc3\xaf" "code"}));
  EXPECT_EQ(paths_of(*catalog),
            (std::vector<std::string>{"Z/empty", "Z/new\nline", "a/linked.jpg", "a/sub/deeper/y.jpg", "a/x.jpg",
                                      "b class/file with spaces.jpg",
                                      "\xc3\xbcn\xc3\xaf" "code/\xe3\x83\x95\xe3\x82\xa1\xe3\x82\xa4\xe3\x83\xab.jpg"}));
  EXPECT_EQ(catalog->labels(), (std::vector<std::int32_t>{0, 0, 1, 1, 1, 2, 4}));
  EXPECT_EQ(catalog->sizes(), (std::vector<std::uint64_t>{0, 3, 10, 20, 10, 30, 40}));
  EXPECT_EQ(catalog->total_bytes(), 113u);
  EXPECT_EQ(catalog->max_sample_bytes(), 40u);
  EXPECT_EQ(sample_file_path(folder(), catalog->path(5)), (dir_ / "data" / "b class" / "file with spaces.jpg").string());
  EXPECT_GE(catalog->memory_bytes(), 7u * 20u + 60u);
}

// The threaded folder scan (docs/decisions/0029) returns exactly the single-threaded
// result, entries in the same order, skip counts summed, for any thread count and split.
TEST_F(CatalogTest, ThreadedFolderScanEqualsTheSingleThreadedOne) {
  for (int c = 0; c < 11; ++c) {
    for (int i = 0; i < 2 + (c * 5) % 7; ++i) file(fmt::format("data/class_{:02}/{}/s{}.bin", c, i % 3, i), i * 3 + c);
    file(fmt::format("data/class_{:02}/.hidden{}", c, c), 1);
  }
  fs::create_directories(dir_ / "data" / "class_99_empty");
  for (int nranks = 1; nranks <= 3; ++nranks) {
    for (int rank = 0; rank < nranks; ++rank) {
      auto serial = scan_partition(folder(), rank, nranks, 1);
      ASSERT_TRUE(serial.ok()) << serial.status().to_string();
      for (unsigned threads : {2u, 3u, 8u, 64u}) {
        auto threaded = scan_partition(folder(), rank, nranks, threads);
        ASSERT_TRUE(threaded.ok()) << threaded.status().to_string();
        EXPECT_EQ(serialize_scan(*threaded), serialize_scan(*serial))
            << "rank " << rank << " of " << nranks << ", " << threads << " threads";
        EXPECT_EQ(threaded->skipped_hidden, serial->skipped_hidden);
      }
    }
  }
}

TEST_F(CatalogTest, ThreadedFolderScanReportsTheFirstFailingClassInClassOrder) {
  for (int c = 0; c < 6; ++c) file(fmt::format("data/c{}/s.bin", c), 4);
  // Two broken links: whatever finishes first, the error names the one in the earlier class.
  fs::create_symlink(dir_ / "missing_one", dir_ / "data" / "c2" / "broken.bin");
  fs::create_symlink(dir_ / "missing_two", dir_ / "data" / "c4" / "broken.bin");
  for (unsigned threads : {1u, 2u, 6u}) {
    auto scan = scan_partition(folder(), 0, 1, threads);
    ASSERT_FALSE(scan.ok());
    EXPECT_NE(scan.status().message().find("c2/broken.bin"), std::string::npos) << scan.status().message();
  }
}

TEST_F(CatalogTest, SplitAcrossRanksGivesTheSameCatalog) {
  for (int c = 0; c < 7; ++c) {
    for (int i = 0; i < 3 + c; ++i) file(fmt::format("data/class_{}/{}/s{}.bin", c, i % 2, i), i * 7);
  }
  auto one = scan_all(folder(), 1);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  for (int nranks = 2; nranks <= 5; ++nranks) {
    auto many = scan_all(folder(), nranks);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    EXPECT_EQ(many->serialize(), one->serialize()) << "nranks = " << nranks;
  }
  // Rank r scans classes i with i % nranks == r.
  auto part = scan_partition(folder(), 1, 3);
  ASSERT_TRUE(part.ok());
  std::set<std::int32_t> labels;
  for (const CatalogEntry& e : part->entries) labels.insert(e.label);
  EXPECT_EQ(labels, (std::set<std::int32_t>{1, 4}));
  EXPECT_EQ(part->class_names.size(), 7u);
}

TEST_F(CatalogTest, PropertyRandomTreesAnyRankCountSameCatalog) {
  for (std::uint64_t trial = 0; trial < 12; ++trial) {
    Rng rng = Rng::for_stream(1234, {trial});
    const std::string root = fmt::format("tree{}", trial);
    const int classes = 1 + static_cast<int>(rng.below(9));
    std::size_t files = 0;
    for (int c = 0; c < classes; ++c) {
      const std::string cls = rng.below(2) ? fmt::format("c{}", rng.next() % 1000) : fmt::format("C {}", c);
      fs::create_directories(dir_ / root / cls);
      const int n = static_cast<int>(rng.below(6));
      for (int i = 0; i < n; ++i) {
        std::string rel = cls;
        for (std::uint64_t depth = rng.below(3); depth > 0; --depth) rel += fmt::format("/d{}", rng.below(3));
        rel += fmt::format("/f{}_{}", i, rng.below(100));
        if (fs::exists(dir_ / root / rel)) continue;
        file(root + "/" + rel, rng.below(50));
        ++files;
      }
    }
    if (files == 0) file(root + "/only/one", 1);
    auto reference = scan_all(folder(root), 1);
    ASSERT_TRUE(reference.ok()) << reference.status().to_string();
    for (int nranks = 2; nranks <= 7; ++nranks) {
      auto c = scan_all(folder(root), nranks);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      ASSERT_EQ(c->serialize(), reference->serialize()) << "trial " << trial << " nranks " << nranks;
    }
    // Ids follow (label, path) bytewise order.
    for (SampleId id = 1; id < reference->size(); ++id) {
      const auto prev = std::make_pair(reference->label(id - 1), reference->path(id - 1));
      const auto cur = std::make_pair(reference->label(id), reference->path(id));
      ASSERT_LT(prev, cur);
    }
  }
}

TEST_F(CatalogTest, FolderErrorsNameThePath) {
  auto missing = scan_partition(folder("nope"), 0, 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find((dir_ / "nope").string()), std::string::npos);

  file("plain", 3);
  auto not_dir = scan_partition(folder("plain"), 0, 1);
  ASSERT_FALSE(not_dir.ok());
  EXPECT_NE(not_dir.status().message().find("is not a directory"), std::string::npos);
  EXPECT_NE(not_dir.status().message().find((dir_ / "plain").string()), std::string::npos);

  fs::create_directories(dir_ / "empty" / "class_a");
  file("empty/stray.txt", 4);
  auto empty = scan_all(folder("empty"), 2);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find((dir_ / "empty").string()), std::string::npos)
      << empty.status().to_string();
  EXPECT_NE(empty.status().message().find("no samples"), std::string::npos);

  auto bad_rank = scan_partition(folder(), 3, 3);
  EXPECT_FALSE(bad_rank.ok());
  auto bad_nranks = scan_partition(folder(), 0, 0);
  EXPECT_FALSE(bad_nranks.ok());
}

TEST_F(CatalogTest, UnreadableDirectoryIsAnErrorNamingIt) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  file("data/a/x", 1);
  file("data/b/locked/y", 1);
  fs::permissions(dir_ / "data" / "b" / "locked", fs::perms::none);
  auto c = scan_all(folder(), 1);
  fs::permissions(dir_ / "data" / "b" / "locked", fs::perms::owner_all);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(c.status().message().find("locked"), std::string::npos);
}

TEST_F(CatalogTest, BrokenSymlinkIsAnError) {
  file("data/a/x", 1);
  fs::create_symlink(dir_ / "nowhere", dir_ / "data" / "a" / "dangling");
  auto c = scan_all(folder(), 1);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("dangling"), std::string::npos) << c.status().to_string();
}

TEST_F(CatalogTest, OversizeSampleNamesFileSizeAndKey) {
  file("data/a/small", 10);
  file("data/b/big", 1000);
  DatasetConfig d = folder();
  d.max_sample_bytes = 999;
  auto c = scan_all(d, 2);
  ASSERT_FALSE(c.ok());
  const std::string& msg = c.status().message();
  EXPECT_NE(msg.find((dir_ / "data" / "b" / "big").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("1000 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dataset.max_sample_bytes = 999"), std::string::npos) << msg;
  d.max_sample_bytes = 1000;
  EXPECT_TRUE(scan_all(d, 2).ok());
}

TEST_F(CatalogTest, FileListParsesPathsWithSpacesCommentsAndAbsolutePaths) {
  file("lists/img/a b.jpg", 11);
  file("lists/img/c.jpg", 0);
  const std::string abs = file("elsewhere/d.jpg", 33);
  const std::string list = write("lists/train.txt",
                                     "# comment line\n"
                                     "\n"
                                     "img/a b.jpg 3\r\n"
                                     "   \n"
                                     "img/c.jpg\t0\n" +
                                         abs + "   3\n" + "  # indented comment\n");
  auto one = scan_all(filelist(list), 1);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(paths_of(*one), (std::vector<std::string>{"img/c.jpg", abs, "img/a b.jpg"}));
  EXPECT_EQ(one->labels(), (std::vector<std::int32_t>{0, 3, 3}));
  EXPECT_EQ(one->sizes(), (std::vector<std::uint64_t>{0, 33, 11}));
  EXPECT_EQ(one->class_names(), (std::vector<std::string>{"0", "3"}));
  EXPECT_EQ(sample_file_path(filelist(list), "img/c.jpg"), (dir_ / "lists" / "img" / "c.jpg").string());
  EXPECT_EQ(sample_file_path(filelist(list), abs), abs);
  for (int nranks = 2; nranks <= 4; ++nranks) {
    auto many = scan_all(filelist(list), nranks);
    ASSERT_TRUE(many.ok()) << many.status().to_string();
    EXPECT_EQ(many->serialize(), one->serialize());
  }
  // A list file named without a directory resolves against the working directory.
  DatasetConfig bare = filelist("train.txt");
  EXPECT_EQ(sample_file_path(bare, "img/x.jpg"), "img/x.jpg");
}

TEST_F(CatalogTest, FileListBadLinesNameFileAndLine) {
  file("img/x.jpg", 1);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"img/x.jpg 0\nnolabel\n", ":2: expected 'path label'"},
      {"# c\nimg/x.jpg abc\n", ":2: label 'abc'"},
      {"img/x.jpg -1\n", ":1: label '-1'"},
      {"img/x.jpg 99999999999\n", ":1: label '99999999999'"},
      {"img/x.jpg 1.5\n", ":1: label '1.5'"},
      {"\n\nimg/missing.jpg 2\n", ":3: sample"},
      {"img 2\n", ":1: sample"},  // a directory, not a file
  };
  for (const auto& [text, expected] : cases) {
    const std::string list = write("list.txt", text);
    auto c = scan_all(filelist(list), 1);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(list + expected), std::string::npos) << c.status().message();
  }
  auto missing = scan_all(filelist((dir_ / "none.txt").string()), 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto empty = scan_all(filelist(write("empty.txt", "# nothing\n")), 1);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty.txt"), std::string::npos);
}

TEST_F(CatalogTest, DuplicatesAreRejectedNamingThePath) {
  file("img/x.jpg", 1);
  file("img/y.jpg", 1);
  for (const std::string text : {"img/x.jpg 0\nimg/y.jpg 0\nimg/x.jpg 0\n", "img/x.jpg 0\nimg/y.jpg 1\nimg/x.jpg 2\n"}) {
    for (int nranks = 1; nranks <= 3; ++nranks) {
      auto c = scan_all(filelist(write("dup.txt", text)), nranks);
      ASSERT_FALSE(c.ok());
      EXPECT_NE(c.status().message().find("duplicate sample path 'img/x.jpg'"), std::string::npos)
          << c.status().message();
    }
  }
  // Merging the same part twice is caught too.
  file("data/a/s", 1);
  auto part = scan_partition(folder(), 0, 1);
  ASSERT_TRUE(part.ok());
  auto twice = merge_scans(folder(), {*part, *part});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("'a/s'"), std::string::npos);
}

TEST_F(CatalogTest, MergeRejectsDisagreeingClassLists) {
  ScanResult a, b;
  a.class_names = {"x", "y"};
  a.entries = {{"x/1", 1, 0}};
  b.class_names = {"x"};
  auto c = merge_scans(folder(), {a, b});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("different classes"), std::string::npos);
}

Catalog sample_catalog() {
  std::vector<CatalogEntry> entries = {
      {"b/2.jpg", 200, 1}, {"a/1.jpg", 100, 0}, {"b/1 space.jpg", 0, 1}, {"c/\xc3\xa9\n.jpg", 7, 2}, {"a/0.jpg", 5, 0}};
  auto c = Catalog::from_entries(std::move(entries), {"a", "b", "c"});
  EXPECT_TRUE(c.ok());
  return std::move(c).value();
}

TEST(CatalogSerializeTest, RoundTrip) {
  const Catalog c = sample_catalog();
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c.path(0), "a/0.jpg");
  EXPECT_EQ(c.path(2), "b/1 space.jpg");
  EXPECT_EQ(c.total_bytes(), 312u);
  const auto bytes = c.serialize();
  auto back = Catalog::deserialize(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(paths_of(*back), paths_of(c));
  EXPECT_EQ(back->sizes(), c.sizes());
  EXPECT_EQ(back->labels(), c.labels());
  EXPECT_EQ(back->class_names(), c.class_names());
  EXPECT_EQ(back->total_bytes(), c.total_bytes());
  EXPECT_EQ(back->max_sample_bytes(), 200u);
  EXPECT_EQ(back->serialize(), bytes);

  auto empty = Catalog::deserialize(Catalog().serialize());
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  EXPECT_TRUE(empty->empty());
}

TEST(CatalogSerializeTest, EveryTruncationIsAnErrorWithAnOffset) {
  const auto bytes = sample_catalog().serialize();
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    auto r = Catalog::deserialize(std::span<const std::uint8_t>(bytes.data(), len));
    ASSERT_FALSE(r.ok()) << "length " << len;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(r.status().message().find("offset"), std::string::npos) << r.status().message();
  }
  auto longer = bytes;
  longer.push_back(0);
  auto r = Catalog::deserialize(longer);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trailing"), std::string::npos) << r.status().message();
}

TEST(CatalogSerializeTest, CorruptedBytesNeverCrash) {
  const auto bytes = sample_catalog().serialize();
  Rng rng(31337);
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    auto mutated = bytes;
    for (std::uint64_t flips = 1 + rng.below(4); flips > 0; --flips) {
      mutated[rng.below(mutated.size())] = static_cast<std::uint8_t>(rng.next());
    }
    auto r = Catalog::deserialize(mutated);
    if (r.ok()) {
      ++accepted;
      // Whatever is accepted is internally consistent.
      std::uint64_t total = 0;
      for (SampleId id = 0; id < r->size(); ++id) {
        total += r->sample_bytes(id);
        ASSERT_GE(r->label(id), 0);
        ASSERT_LE(r->path(id).size(), mutated.size());
        if (id > 0) {
          ASSERT_LT(std::make_pair(r->label(id - 1), r->path(id - 1)), std::make_pair(r->label(id), r->path(id)));
        }
      }
      ASSERT_EQ(total, r->total_bytes());
    }
  }
  EXPECT_LT(accepted, 20000);
}

TEST(CatalogSerializeTest, InconsistentInputIsCorrupt) {
  // Swap two samples' labels so (label, path) order breaks.
  std::vector<CatalogEntry> entries = {{"a", 1, 0}, {"b", 1, 1}};
  auto c = Catalog::from_entries(entries, {"0", "1"});
  ASSERT_TRUE(c.ok());
  auto bytes = c->serialize();
  // Labels are the last 8 bytes: set both to 1 and the first to... make order (1,"a"),(0,"b").
  bytes[bytes.size() - 8] = 1;
  bytes[bytes.size() - 4] = 0;
  auto r = Catalog::deserialize(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("order"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(fmt::format("offset {}", bytes.size() - 4)), std::string::npos)
      << r.status().message();

  auto bad_magic = c->serialize();
  bad_magic[0] = 'X';
  EXPECT_FALSE(Catalog::deserialize(bad_magic).ok());

  // A huge sample count does not allocate: it is checked against the remaining bytes.
  auto huge = c->serialize();
  for (int i = 0; i < 4; ++i) huge[8 + i] = 0xff;
  auto h = Catalog::deserialize(huge);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kCorrupt);
}

TEST(CatalogSerializeTest, ScanRoundTripAndTruncation) {
  ScanResult scan;
  scan.class_names = {"a", "b c"};
  scan.entries = {{"b c/x", 5, 1}, {"a/\n", 0, 0}};
  scan.skipped_root_files = 2;
  scan.skipped_hidden = 3;
  scan.skipped_symlinked_dirs = 4;
  scan.skipped_special = 5;
  const auto bytes = serialize_scan(scan);
  auto back = deserialize_scan(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->class_names, scan.class_names);
  ASSERT_EQ(back->entries.size(), 2u);
  EXPECT_EQ(back->entries[0].path, "b c/x");
  EXPECT_EQ(back->entries[1].path, "a/\n");
  EXPECT_EQ(back->entries[0].size, 5u);
  EXPECT_EQ(back->entries[0].label, 1);
  EXPECT_EQ(back->skipped_root_files, 2u);
  EXPECT_EQ(back->skipped_special, 5u);
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    auto r = deserialize_scan(std::span<const std::uint8_t>(bytes.data(), len));
    ASSERT_FALSE(r.ok()) << "length " << len;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  }
  Rng rng(5);
  for (int trial = 0; trial < 20000; ++trial) {
    auto mutated = bytes;
    mutated[rng.below(mutated.size())] = static_cast<std::uint8_t>(rng.next());
    auto r = deserialize_scan(mutated);
    if (r.ok()) {
      for (const CatalogEntry& e : r->entries) ASSERT_GE(e.label, 0);
    }
  }
}

TEST(CatalogFromEntriesTest, RejectsNegativeLabels) {
  auto c = Catalog::from_entries({{"x", 1, -1}}, {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'x'"), std::string::npos);
}

}  // namespace catalog_test
}  // namespace shardmix
