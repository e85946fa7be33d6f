// Fuzz target: the tar parser and the WebDataset grouping (common/shard_formats:
// list_tar, scan_webdataset_shard), which read dataset shards nobody vetted.
//
// Checks beyond "no crash, no UB": every member's data lies inside the input, members come
// in archive order on 512-byte boundaries; a scan's samples are members' data (offset and
// size of some member) with labels >= 0; problems are reported iff something was skipped
// or cut; writing the members back with our tar writer and listing that gives the same
// names and bytes (reader and writer agree).
#include <algorithm>
#include <set>
#include <string>

#include "common/shard_formats.h"
#include "tests/fuzz/fuzz.h"

namespace {

using namespace shardmix;
using Span = std::span<const std::uint8_t>;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Span input(data, size);
  const MemorySource source("fuzz.tar", input);
  const TarListing listing = list_tar(source);
  FUZZ_CHECK(listing.rest_skipped == !listing.problems.empty(), "tar: problems iff the listing stopped early");
  std::uint64_t last = 0;
  std::set<std::uint64_t> data_offsets;
  for (const TarMember& m : listing.members) {
    FUZZ_CHECK(m.data_offset == m.header_offset + 512, "tar: data does not follow its header");
    FUZZ_CHECK(m.header_offset % 512 == 0, "tar: header off a block boundary");
    FUZZ_CHECK(m.data_offset <= size && m.size <= size - m.data_offset, "tar: member data beyond the input");
    FUZZ_CHECK(m.header_offset >= last, "tar: members out of archive order");
    last = m.data_offset + m.size;
    data_offsets.insert(m.data_offset);
  }
  for (const WebDatasetOptions& options :
       {WebDatasetOptions{{"jpg", "bin"}, "cls", ~0ull}, WebDatasetOptions{{"bin"}, "", 64}}) {
    auto scan = scan_webdataset_shard(source, options);
    if (!scan.ok()) {
      FUZZ_CHECK(scan.status().message().find("dataset.max_sample_bytes") != std::string::npos,
                 "tar: unexpected error " + scan.status().to_string());
      continue;
    }
    FUZZ_CHECK(scan->rest_skipped == listing.rest_skipped, "tar: scan and listing disagree on the cut");
    FUZZ_CHECK((scan->invalid_samples > 0) == !scan->problems.empty(), "tar: problems iff samples were skipped");
    for (const ShardSample& s : scan->samples) {
      FUZZ_CHECK(data_offsets.count(s.offset) == 1, "tar: a sample that is no member's data");
      FUZZ_CHECK(s.label >= 0, "tar: negative label");
      FUZZ_CHECK(s.size <= options.max_sample_bytes, "tar: oversized sample accepted");
    }
  }
  // Reader and writer agree: our own archive of the listed members lists back the same.
  // (Names with a NUL byte can come from GNU long names and pax; ustar fields cannot hold
  // them, and our writer is only ever given names without.)
  for (const TarMember& m : listing.members) {
    if (m.name.find('\0') != std::string::npos) return 0;
  }
  std::vector<std::uint8_t> again;
  for (const TarMember& m : listing.members) append_tar_member(again, m.name, input.subspan(m.data_offset, m.size));
  append_tar_end(again);
  const TarListing relisted = list_tar(MemorySource("again.tar", again));
  FUZZ_CHECK(relisted.problems.empty(), "tar: our own archive has problems: " +
                                            (relisted.problems.empty() ? std::string() : relisted.problems[0]));
  FUZZ_CHECK(relisted.members.size() == listing.members.size(), "tar: rewritten archive lists another member count");
  for (std::size_t i = 0; i < relisted.members.size(); ++i) {
    const TarMember& a = listing.members[i];
    const TarMember& b = relisted.members[i];
    FUZZ_CHECK(a.name == b.name, "tar: rewritten member name differs: '" + a.name + "' vs '" + b.name + "'");
    FUZZ_CHECK(std::equal(input.begin() + static_cast<std::ptrdiff_t>(a.data_offset),
                          input.begin() + static_cast<std::ptrdiff_t>(a.data_offset + a.size),
                          again.begin() + static_cast<std::ptrdiff_t>(b.data_offset),
                          again.begin() + static_cast<std::ptrdiff_t>(b.data_offset + b.size)),
               "tar: rewritten member data differs");
  }
  return 0;
}

namespace shardmix::fuzz {

Seeds seeds() {
  Seeds out;
  auto member = [](std::vector<std::uint8_t>& tar, std::string_view name, std::string_view data) {
    append_tar_member(tar, name, std::span(reinterpret_cast<const std::uint8_t*>(data.data()), data.size()));
  };
  std::vector<std::uint8_t> wds;
  member(wds, "a/000.jpg", "JPEG bytes");
  member(wds, "a/000.cls", "3\n");
  member(wds, "a/001.bin", std::string(700, 'x'));
  member(wds, "a/001.cls", "12");
  member(wds, "002.txt", "caption only");
  member(wds, std::string(130, 'l') + ".bin", "GNU long name");
  member(wds, std::string(80, 'p') + "/" + std::string(60, 'q') + ".cls", "1");
  append_tar_end(wds);
  out.emplace_back("webdataset", wds);
  out.emplace_back("cut-in-data", std::vector<std::uint8_t>(wds.begin(), wds.begin() + 1800));
  out.emplace_back("cut-in-header", std::vector<std::uint8_t>(wds.begin(), wds.begin() + 1100));
  std::vector<std::uint8_t> empty;
  append_tar_end(empty);
  out.emplace_back("empty", empty);
  return out;
}

}  // namespace shardmix::fuzz
