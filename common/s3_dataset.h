// A dataset in object storage (dataset.path = "s3://BUCKET/PREFIX"): the scan, split among
// the daemons as the directory scan is (docs/s3.md).
//  - folder: rank 0..n-1 list the class "folders" (common prefixes under PREFIX/, one
//    delimited listing each), then each lists its classes i % nranks == rank in full
//    (ListObjectsV2, every page). Sizes come from the listing: no request per object.
//  - webdataset / tfrecord: every rank lists the shard objects under PREFIX/ (or takes the
//    one object PREFIX names), fetches its shards i % nranks == rank whole, with
//    storage.s3.concurrency GETs in flight, and scans them in memory. A shard that cannot be
//    read follows dataset.strict (skipped and counted, or the error naming its key).
//  - filelist: dataset.path names the list object; every rank reads it and lists its
//    "directory" once (sizes for every sample, no request per sample), then takes every
//    nranks-th sample line as the local scan does. Paths are keys relative to the list's
//    prefix; an absolute path or a missing object is an error naming the list line.
// Thread-safety: as scan_partition (no shared state but the process's S3 client).
#pragma once

#include "common/catalog.h"
#include "common/config.h"
#include "common/status.h"

namespace shardmix {

Result<ScanResult> scan_s3_partition(const DatasetConfig& dataset, int rank, int nranks);
// The same with a given client (tests: one over a scripted transport).
class S3Client;
Result<ScanResult> scan_s3_partition(S3Client& client, const DatasetConfig& dataset, int rank, int nranks);

}  // namespace shardmix
