// Reading one sample's bytes from storage: the only place that knows how a catalog entry
// maps to bytes on the (shared) file system. Used by the start-up loader (cache arena)
// and by the cold-sample storage readers (samples cached nowhere, read into staging).
// Formats whose samples live inside shard files (tar, TFRecord) read by offset here,
// never by scanning a shard at read time: one preadv of the sample and its framing (the
// tar member header before it; the TFRecord length header and data CRC, re-verified), so a
// shard changed since the scan is an error, not other bytes.
// Errors name the file and the byte offset. The shard is opened on every call (no
// descriptor cache).
// Thread-safety: stateless; safe to call from any number of threads.
#pragma once

#include <cstdint>
#include <string>

#include "common/catalog.h"
#include "common/config.h"
#include "common/status.h"

namespace shardmix {

// Reads sample `id` (catalog.sample_bytes(id) bytes) into `out`.
Status read_sample(const Catalog& catalog, const DatasetConfig& dataset, SampleId id, std::uint8_t* out);

// Reads exactly `length` bytes of `path` into `out`, failing if the file is shorter or longer.
Status read_whole_file(const std::string& path, std::uint64_t length, std::uint8_t* out);

}  // namespace shardmix
