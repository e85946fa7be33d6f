// The owner-side catalog over the real control plane (decision 0061): MpiSession::alltoall
// moves messages of any size (empty ones too) to the right ranks, and sort_scans +
// route_to_owners over MpiCollectives give every rank exactly the global catalog's slice
// and every node exactly its share, for a folder and a webdataset dataset whose scan is
// split across the ranks as a scan would split it. Every rank builds the same datasets, so
// each checks its result against merge_scans of all the parts.
// Prints PASS/FAIL on rank 0; exits non-zero on every rank on failure.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/catalog.h"
#include "common/distributed_catalog.h"
#include "common/ownership.h"
#include "control/mpi_comm.h"
#include "tests/mpi/mpi_check.h"

namespace shardmix {
namespace {

using mpi_check::Checker;
using mpi_check::mix;

// The same dataset on every rank, split into one scan per rank: files (folder) or whole
// shards (webdataset) dealt by a hash.
std::vector<ScanResult> make_parts(bool sharded, int ranks, std::uint64_t samples) {
  std::vector<ScanResult> parts(static_cast<std::size_t>(ranks));
  const std::vector<std::string> classes = {"ant", "bee", "cat", "dog", "emu"};
  for (ScanResult& p : parts) {
    if (!sharded) p.class_names = classes;
  }
  if (!sharded) {
    for (std::uint64_t i = 0; i < samples; ++i) {
      CatalogEntry e;
      e.label = static_cast<std::int32_t>(mix(i) % classes.size());
      e.path = fmt::format("{}/{:08x}.jpg", classes[static_cast<std::size_t>(e.label)], mix(i + 7) & 0xffffffff);
      e.size = 1 + mix(i + 11) % 200000;
      parts[mix(i + 13) % static_cast<std::uint64_t>(ranks)].entries.push_back(std::move(e));
    }
    return parts;
  }
  constexpr std::uint64_t kPerShard = 97;
  for (std::uint64_t s = 0; s * kPerShard < samples; ++s) {
    ScanResult& p = parts[mix(s + 3) % static_cast<std::uint64_t>(ranks)];
    const auto local = static_cast<std::uint32_t>(p.shards.size());
    p.shards.push_back(fmt::format("train-{:05}.tar", s));
    std::uint64_t offset = 512;
    for (std::uint64_t i = s * kPerShard; i < std::min(samples, (s + 1) * kPerShard); ++i) {
      CatalogEntry e;
      e.label = static_cast<std::int32_t>(mix(i) % 1000);
      e.size = 1 + mix(i + 5) % 100000;
      e.shard = local;
      e.offset = offset;
      offset += 512 + (e.size + 511) / 512 * 512;
      p.entries.push_back(std::move(e));
    }
  }
  return parts;
}

void check_alltoall(Checker& c) {
  const int me = c.mpi.rank(), n = c.mpi.size();
  std::vector<std::vector<std::uint8_t>> out(static_cast<std::size_t>(n));
  for (int to = 0; to < n; ++to) {
    // (me + to) % 3 bytes: some messages are empty.
    out[static_cast<std::size_t>(to)].assign(static_cast<std::size_t>((me + to) % 3), static_cast<std::uint8_t>(me));
  }
  auto in = c.mpi.alltoall(out);
  c.check(in.ok(), "alltoall: " + (in.ok() ? std::string() : in.status().to_string()));
  if (!in.ok()) return;
  for (int from = 0; from < n; ++from) {
    const auto& got = (*in)[static_cast<std::size_t>(from)];
    c.check(got == std::vector<std::uint8_t>(static_cast<std::size_t>((from + me) % 3), static_cast<std::uint8_t>(from)),
            fmt::format("alltoall: {} bytes from rank {}, expected {} bytes of value {}", got.size(), from,
                        (from + me) % 3, from));
  }
}

void check_catalog(Checker& c, bool sharded, std::uint64_t samples) {
  DatasetConfig dataset;
  dataset.path = "/data";
  dataset.format = sharded ? DatasetFormat::kWebDataset : DatasetFormat::kFolder;
  const std::vector<ScanResult> parts = make_parts(sharded, c.mpi.size(), samples);
  auto global = merge_scans(dataset, parts);
  c.check(global.ok(), "merge_scans: " + (global.ok() ? std::string() : global.status().to_string()));
  if (!global.ok()) return;
  const Catalog& catalog = *global;
  MpiCollectives group(c.mpi);
  auto slice = sort_scans(dataset, parts[static_cast<std::size_t>(c.mpi.rank())], group);
  c.check(slice.ok(), "sort_scans: " + (slice.ok() ? std::string() : slice.status().to_string()));
  if (!slice.ok()) return;
  const std::string format = sharded ? "webdataset" : "folder";
  c.check(slice->tables.samples == catalog.size(), format + ": sample count");
  for (std::size_t i = 0; i < slice->entries.size(); ++i) {
    const auto id = static_cast<SampleId>(slice->first + i);
    const CatalogEntry& e = slice->entries[i];
    const std::string where = sharded ? slice->tables.shards[e.shard] + "@" + std::to_string(e.offset) : e.path;
    if (id >= catalog.size() || e.label != catalog.label(id) || e.size != catalog.sample_bytes(id) ||
        where != catalog.location(id)) {
      c.check(false, fmt::format("{}: slice entry {} (id {}) is {} / {}, the catalog has {}", format, i, id, where,
                                 e.label, id < catalog.size() ? catalog.location(id) : "nothing"));
      return;
    }
  }
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(c.mpi.size()), catalog.size() / c.mpi.size());
  counts[0] += catalog.size() % c.mpi.size();
  const Ownership ownership = Ownership::spread(catalog.size(), counts, 42);
  auto owned = route_to_owners(std::move(*slice), ownership, group);
  c.check(owned.ok(), "route_to_owners: " + (owned.ok() ? std::string() : owned.status().to_string()));
  if (!owned.ok()) return;
  const auto me = static_cast<std::uint32_t>(c.mpi.rank());
  c.check(owned->entries.size() == ownership.owned_count(me), format + ": share size");
  for (std::size_t i = 0; i < owned->entries.size(); ++i) {
    const SampleId id = ownership.owned_at(me, i);
    const CatalogEntry& e = owned->entries[i];
    const std::string where = sharded ? owned->tables.shards[e.shard] + "@" + std::to_string(e.offset) : e.path;
    if (owned->ids[i] != id || e.size != catalog.sample_bytes(id) || where != catalog.location(id)) {
      c.check(false, fmt::format("{}: share entry {} is {}, sample {} is {}", format, i, where, id,
                                 catalog.location(id)));
      return;
    }
  }
}

}  // namespace
}  // namespace shardmix

int main(int argc, char** argv) {
  using namespace shardmix;
  MpiSession mpi(&argc, &argv);
  Checker c{mpi};
  check_alltoall(c);
  check_catalog(c, /*sharded=*/false, 20000);
  check_catalog(c, /*sharded=*/true, 20000);
  return mpi_check::verdict(c, "catalog_mpitest");
}
