// Reading one sample's bytes from storage: the only place that knows how a catalog entry
// maps to bytes on the (shared) file system. Used by the start-up loader (cache arena)
// and by the cold-sample storage readers (samples cached nowhere, read into staging).
// Formats whose samples live inside shard files (tar, TFRecord) read by offset here,
// never by scanning a shard at read time: one preadv of the sample and its framing (the
// tar member header before it; the TFRecord length header and data CRC, re-verified), so a
// shard changed since the scan is an error, not other bytes.
// Errors name the file and the byte offset. A shard is opened for every read unless the
// caller passes a ShardFileCache (service.open_shard_files), which reuses one descriptor per
// shard and is invisible to the result (docs/decisions/0037). Whole-file formats (folder,
// filelist) always open the file per read: each file is one sample, read once per epoch.
// Thread-safety: stateless but for the cache, which is thread-safe; safe to call from any
// number of threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/catalog.h"
#include "common/config.h"
#include "common/status.h"
#include "server/shard_file_cache.h"

namespace shardmix {

// Reads sample `id` (catalog.sample_bytes(id) bytes) into `out`. `open_shards`, when given,
// supplies shard descriptors; null = open the shard for this read only.
Status read_sample(const Catalog& catalog, const DatasetConfig& dataset, SampleId id, std::uint8_t* out,
                   ShardFileCache* open_shards = nullptr);

// S3 datasets (dataset.path = "s3://..."): reads each (sample, destination) of `reads` with
// the process's S3 client, storage.s3.concurrency requests in flight: for folder a whole GET
// per sample, length and ETag checked; for shard formats a ranged GET of the sample and its
// framing, checked as above, shared by the samples of `reads` near it in the same shard
// (storage.s3.merge_gap, merge_max: the initial load costs about a GET per shard). `done(i, status)` once per read, on the
// client's thread, in any order; it must not block. read_sample() on an S3 dataset is this
// for one sample, waited for.
void read_samples_s3(const Catalog& catalog, const DatasetConfig& dataset,
                     std::vector<std::pair<SampleId, std::uint8_t*>> reads,
                     std::function<void(std::size_t, const Status&)> done);

// Reads exactly `length` bytes of `path` into `out`, failing if the file is shorter or longer.
Status read_whole_file(const std::string& path, std::uint64_t length, std::uint8_t* out);

}  // namespace shardmix
