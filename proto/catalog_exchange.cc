#include "proto/catalog_exchange.h"

#include <cstring>

namespace shardmix::proto {

std::vector<std::uint8_t> encode_entry_batch(const EntryBatch& batch) {
  // Sized first and written in place: appending to an empty vector here trips gcc 12's
  // -Wstringop-overflow (a false positive of its inlined insert).
  constexpr std::size_t kHead = sizeof(kEntryBatchMagic) + sizeof(kEntryBatchVersion);
  std::vector<std::uint8_t> out(kHead);
  std::memcpy(out.data(), &kEntryBatchMagic, sizeof(kEntryBatchMagic));
  std::memcpy(out.data() + sizeof(kEntryBatchMagic), &kEntryBatchVersion, sizeof(kEntryBatchVersion));
  out.reserve(kHead + encoded_size(batch));
  FieldWriter w(out);
  EntryBatch::fields(batch, w);
  return out;
}

std::string decode_entry_batch(std::span<const std::uint8_t> bytes, std::string_view from, EntryBatch& out) {
  const std::string what = "catalog entries from " + std::string(from);
  FieldReader r(bytes, what, "message");
  std::uint32_t magic = 0;
  std::uint16_t version = 0;
  if (!r.get(magic, "magic")) return r.error();
  if (magic != kEntryBatchMagic) return what + ": bad magic (not a ShardMix entry batch)";
  if (!r.get(version, "version")) return r.error();
  if (version != kEntryBatchVersion) {
    return what + ": version " + std::to_string(version) + ", this daemon reads version " +
           std::to_string(kEntryBatchVersion);
  }
  EntryBatch::fields(out, r);
  std::string err = r.finish();
  if (!err.empty()) return err;
  std::uint64_t path_bytes = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out.labels[i] < 0) return what + ": entry " + std::to_string(i) + " has negative label " + std::to_string(out.labels[i]);
    path_bytes += out.path_bytes[i];
  }
  if (path_bytes != out.paths.size()) {
    return what + ": the entries' path lengths add up to " + std::to_string(path_bytes) + " bytes, the paths hold " +
           std::to_string(out.paths.size());
  }
  return {};
}

}  // namespace shardmix::proto
