#include "proto/catalog_exchange.h"

namespace shardmix::proto {

std::vector<std::uint8_t> encode_entry_batch(const EntryBatch& batch) {
  return encode_enveloped(kEntryBatchMagic, kEntryBatchVersion, batch);
}

std::string decode_entry_batch(std::span<const std::uint8_t> bytes, std::string_view from, EntryBatch& out) {
  const std::string what = "catalog entries from " + std::string(from);
  FieldReader r(bytes, what, "message");
  std::string err = decode_enveloped(r, kEntryBatchMagic, kEntryBatchVersion, what, "entry batch", out);
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
