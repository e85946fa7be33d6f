// Fuzz target: the filelist parser (dataset.format = "filelist": "path label" lines),
// reached the way the daemons reach it, through scan_partition().
//
// Setup: a temp dir with a few sample files (names with spaces and UTF-8, an empty file,
// a subfolder, a directory that is not a sample); the input becomes its list.txt.
// Relative paths in the list resolve against that dir; absolute ones (e.g. /proc/self/exe)
// are taken as they are. Only stat() is called on listed paths, never open().
//
// Checks beyond "no crash, no UB": the scan splits across ranks without changing the
// result: scanning as 1 rank succeeds exactly when scanning as each of 3 ranks does,
// the 3 parts hold the 1-rank entries, and merging them gives the same catalog (or the
// same failure) as merging the 1-rank scan; every entry has a non-empty trimmed path, a
// label in 0..2^31-1 and the size stat() reports; a scan survives its allgather encoding
// (serialize_scan / deserialize_scan); failures name a cause and are never kInternal.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/catalog.h"
#include "tests/fuzz/fuzz.h"

namespace {

using namespace shardmix;
namespace fs = std::filesystem;

class SampleDir {
 public:
  SampleDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/shardmix-fuzz-filelist-XXXXXX";
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr, "mkdtemp " + pattern);
    dir_ = pattern;
    put("a.jpg", "aaaaa");
    put("d e.jpg", "ddd");
    put("\xc3\xbc.bin", "u");  // ü.bin
    put("b/c.jpg", "");
    put("b/deeper/x.png", std::string(1000, 'x'));
    fs::create_directories(dir_ / "dir");
  }
  ~SampleDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string list(std::string_view text) const {
    const fs::path path = dir_ / "list.txt";
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    FUZZ_CHECK(!out.fail(), "writing " + path.string());
    return path.string();
  }

 private:
  void put(const std::string& rel, const std::string& bytes) {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel, std::ios::binary) << bytes;
  }
  fs::path dir_;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

void check_entries(const DatasetConfig& dataset, const ScanResult& scan) {
  for (const CatalogEntry& e : scan.entries) {
    FUZZ_CHECK(!e.path.empty(), "entry with an empty path");
    FUZZ_CHECK(!is_space(e.path.front()) && !is_space(e.path.back()), "path '" + e.path + "' is not trimmed");
    FUZZ_CHECK(e.path.find('\n') == std::string::npos, "path '" + e.path + "' spans lines");
    FUZZ_CHECK(e.label >= 0, "negative label accepted");
    struct stat st;
    const std::string file = sample_file_path(dataset, e.path);
    FUZZ_CHECK(::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
                   static_cast<std::uint64_t>(st.st_size) == e.size,
               "entry '" + e.path + "' is not the regular file of " + std::to_string(e.size) + " bytes at " + file);
  }
  auto decoded = deserialize_scan(serialize_scan(scan));
  FUZZ_CHECK(decoded.ok() && serialize_scan(*decoded) == serialize_scan(scan), "scan does not survive its encoding");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static SampleDir samples;
  DatasetConfig dataset;
  dataset.format = DatasetFormat::kFileList;
  dataset.path = samples.list(std::string_view(reinterpret_cast<const char*>(data), size));

  constexpr int kRanks = 3;
  auto whole = scan_partition(dataset, 0, 1);
  std::vector<ScanResult> parts;
  std::string part_error;
  for (int rank = 0; rank < kRanks; ++rank) {
    auto part = scan_partition(dataset, rank, kRanks);
    if (!part.ok()) {
      FUZZ_CHECK(part.status().code() != StatusCode::kInternal, part.status().to_string());
      if (part_error.empty()) part_error = part.status().to_string();
      continue;
    }
    check_entries(dataset, *part);
    parts.push_back(std::move(*part));
  }
  if (!whole.ok()) {
    FUZZ_CHECK(whole.status().code() != StatusCode::kInternal && !whole.status().message().empty(),
               whole.status().to_string());
    FUZZ_CHECK(!part_error.empty(), "1 rank fails (" + whole.status().to_string() + ") but 3 ranks all succeed");
    return 0;
  }
  FUZZ_CHECK(part_error.empty(), "1 rank succeeds but one of 3 fails: " + part_error);
  check_entries(dataset, *whole);
  std::size_t part_entries = 0;
  for (const ScanResult& p : parts) {
    part_entries += p.entries.size();
    FUZZ_CHECK(p.class_names == whole->class_names, "ranks see different labels");
  }
  FUZZ_CHECK(part_entries == whole->entries.size(), "3 ranks scan " + std::to_string(part_entries) +
                                                        " entries, 1 rank " + std::to_string(whole->entries.size()));

  auto merged_whole = merge_scans(dataset, {*whole});
  auto merged_parts = merge_scans(dataset, std::move(parts));
  FUZZ_CHECK(merged_whole.ok() == merged_parts.ok(),
             "merging 1 vs 3 rank scans: " + merged_whole.status().to_string() + " vs " +
                 merged_parts.status().to_string());
  if (merged_whole.ok()) {
    FUZZ_CHECK(merged_whole->serialize() == merged_parts->serialize(), "1 vs 3 ranks give different catalogs");
  } else {
    FUZZ_CHECK(merged_whole.status().code() == merged_parts.status().code(),
               "merging fails differently: " + merged_whole.status().to_string() + " vs " +
                   merged_parts.status().to_string());
  }
  return 0;
}

namespace shardmix::fuzz {

Seeds seeds() {
  return {
      {"valid", to_bytes("# path label\na.jpg 0\nb/c.jpg 1\nd e.jpg 2\n\xc3\xbc.bin 2147483647\nb/deeper/x.png 1\n")},
      {"crlf-tabs", to_bytes("a.jpg\t3\r\n  b/c.jpg   3  \r\n\r\n#x 1\n/proc/self/exe 9")},
      {"duplicate", to_bytes("a.jpg 0\nb/../a.jpg 1\na.jpg 2\n")},
      {"missing", to_bytes("a.jpg 0\nnot-there.jpg 1\n")},
      {"directory", to_bytes("dir 0\n")},
      {"bad-label", to_bytes("a.jpg -1\n")},
      {"big-label", to_bytes("a.jpg 2147483648\n")},
      {"no-label", to_bytes("a.jpg\n")},
      {"only-label", to_bytes("  7\n")},
      {"empty", {}},
  };
}

}  // namespace shardmix::fuzz
