// Fuzz target: common/catalog's byte layouts that cross process boundaries: the catalog
// (the result of the daemons' allgather, and the payload of the client's kCatalog frame)
// and one rank's scan (what each daemon contributes to the allgather). Both decoders run
// on every input.
//
// Checks beyond "no crash, no UB": a decoded catalog or scan serialises back to exactly the
// input bytes (one encoding per value); a decoded catalog keeps the invariants its users
// rely on (ids in strictly increasing (label, path) order, so no duplicate paths, or for
// shard catalogs (label, shard, offset) order over strictly sorted, all-used shards; labels
// >= 0; total and max bytes match the sizes; a shard sample's end does not overflow), and
// Catalog::from_entries / from_shard_entries of its entries builds the very same catalog,
// i.e. the decoder and the builder agree on the canonical order.
#include <algorithm>
#include <span>
#include <string>

#include "common/catalog.h"
#include "tests/fuzz/fuzz.h"

namespace {

using namespace shardmix;
using fuzz::Bytes;
using Span = std::span<const std::uint8_t>;

bool same_bytes(const std::vector<std::uint8_t>& a, Span b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }

void check_catalog(const Catalog& c, Span input) {
  FUZZ_CHECK(same_bytes(c.serialize(), input), "catalog: serialize(deserialize(x)) != x");
  std::uint64_t total = 0, max = 0;
  std::vector<CatalogEntry> entries;
  for (SampleId id = 0; id < c.size(); ++id) {
    FUZZ_CHECK(c.label(id) >= 0, "catalog: negative label accepted");
    if (id > 0) {
      const bool same_label = c.label(id - 1) == c.label(id);
      const bool ordered =
          c.label(id - 1) < c.label(id) ||
          (same_label && (c.sharded() ? (c.shard(id - 1) < c.shard(id) ||
                                         (c.shard(id - 1) == c.shard(id) && c.offset(id - 1) < c.offset(id)))
                                      : c.path(id - 1) < c.path(id)));
      FUZZ_CHECK(ordered, "catalog: sample " + std::to_string(id) + " out of canonical order");
    }
    if (c.sharded()) {
      FUZZ_CHECK(c.shard(id) < c.file_count(), "catalog: shard index out of range");
      FUZZ_CHECK(c.offset(id) + c.sample_bytes(id) >= c.offset(id), "catalog: sample end overflows");
      entries.push_back(CatalogEntry{"", c.sample_bytes(id), c.label(id), c.shard(id), c.offset(id)});
    } else {
      entries.push_back(CatalogEntry{std::string(c.path(id)), c.sample_bytes(id), c.label(id)});
    }
    total += c.sample_bytes(id);
    max = std::max(max, c.sample_bytes(id));
  }
  FUZZ_CHECK(total == c.total_bytes(), "catalog: total_bytes disagrees with the sizes");
  FUZZ_CHECK(max == c.max_sample_bytes(), "catalog: max_sample_bytes disagrees with the sizes");
  Result<Catalog> rebuilt = Status::ok_status();
  if (c.sharded()) {
    std::vector<std::string> shards;
    for (std::size_t i = 0; i < c.file_count(); ++i) shards.emplace_back(c.file_path(i));
    rebuilt = Catalog::from_shard_entries(std::move(shards), std::move(entries), c.class_names());
  } else {
    rebuilt = Catalog::from_entries(std::move(entries), c.class_names());
  }
  FUZZ_CHECK(rebuilt.ok(), "catalog: the builder refuses a decoded catalog: " + rebuilt.status().to_string());
  rebuilt->set_invalid_counts(c.invalid_samples(), c.invalid_shards());
  FUZZ_CHECK(same_bytes(rebuilt->serialize(), input), "catalog: the builder orders the samples differently");
}

void check_scan(const ScanResult& scan, Span input) {
  FUZZ_CHECK(same_bytes(serialize_scan(scan), input), "scan: serialize_scan(deserialize_scan(x)) != x");
  for (const CatalogEntry& e : scan.entries) FUZZ_CHECK(e.label >= 0, "scan: negative label accepted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Span input(data, size);
  auto catalog = Catalog::deserialize(input);
  if (catalog.ok()) {
    check_catalog(*catalog, input);
  } else {
    FUZZ_CHECK(catalog.status().code() == StatusCode::kCorrupt, "catalog: " + catalog.status().to_string());
  }
  auto scan = deserialize_scan(input);
  if (scan.ok()) {
    check_scan(*scan, input);
  } else {
    FUZZ_CHECK(scan.status().code() == StatusCode::kCorrupt, "scan: " + scan.status().to_string());
  }
  return 0;
}

namespace shardmix::fuzz {

Seeds seeds() {
  Seeds out;
  auto catalog = [&](std::string name, std::vector<CatalogEntry> entries, std::vector<std::string> classes) {
    auto c = Catalog::from_entries(std::move(entries), std::move(classes));
    FUZZ_CHECK(c.ok(), "seed catalog " + name + ": " + c.status().to_string());
    out.emplace_back("catalog-" + name, c->serialize());
  };
  catalog("empty", {}, {});
  catalog("folder",
          {{"cat/0001.jpg", 112 * 1024, 0},
           {"cat/0002.jpg", 90000, 0},
           {"dog/a b/ü.jpg", 0, 1},
           {"dog/x", 7, 1},
           {"fish/deep/er/1.png", 1 << 20, 2}},
          {"cat", "dog", "fish"});
  catalog("filelist", {{"/abs/path 1.bin", 5, 3}, {"rel/2.bin", 6, 17}, {"", 1, 40}}, {"3", "17", "40"});

  {
    auto c = Catalog::from_shard_entries({"train/shard-000001.tar", "train/shard-000000.tar", "x y.tfrecord"},
                                         {{"", 100, 3, 0, 512}, {"", 0, 0, 1, 1536}, {"", 7, 3, 2, 12},
                                          {"", 1 << 20, 1, 0, 2048}},
                                         {"0", "1", "3"});
    FUZZ_CHECK(c.ok(), "seed shard catalog: " + c.status().to_string());
    c->set_invalid_counts(5, 2);
    out.emplace_back("catalog-shards", c->serialize());
  }
  ScanResult shard_scan;
  shard_scan.shards = {"b.tar", "a.tar"};
  shard_scan.entries = {{"", 10, 2, 0, 512}, {"", 11, 0, 1, 1024}};
  shard_scan.invalid_samples = 3;
  shard_scan.invalid_shards = 1;
  out.emplace_back("scan-shards", serialize_scan(shard_scan));

  ScanResult scan;
  scan.entries = {{"cat/0002.jpg", 90000, 0}, {"dog/x", 7, 1}, {"new\nline,\"q\".bin", 3, 2}};
  scan.class_names = {"cat", "dog", "fish"};
  scan.skipped_root_files = 1;
  scan.skipped_hidden = 2;
  scan.skipped_symlinked_dirs = 3;
  scan.skipped_special = 4;
  out.emplace_back("scan", serialize_scan(scan));
  out.emplace_back("scan-empty", serialize_scan(ScanResult{}));
  return out;
}

}  // namespace shardmix::fuzz
