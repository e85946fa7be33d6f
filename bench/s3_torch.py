#!/usr/bin/env python3
"""bench/s3.sh's baseline: PyTorch's DataLoader over objects in S3, read with boto3.

Lists s3://BUCKET/PREFIX (every object), then reads the dataset once through a DataLoader
with --workers worker processes, each with its own boto3 client (what a training script
that reads from S3 itself does), batch size 16, one pass:
  --format folder      one GET per object (map-style dataset, an object a sample);
  --format webdataset  each worker streams whole .tar shard objects, one GET each, and
                       splits them into samples (the data member of each key; tarfile),
                       as the webdataset library reads shards: the fewest requests.
The clock starts once every worker has made its client and opened a connection (a
barrier), so start-up is excluded, as bench/s3.sh excludes the daemons'; it stops at the
last batch. Endpoint and credentials from the AWS_* environment or --endpoint. Prints:
JSON {"workers":W,"format":F,"objects":O,"samples":N,"bytes":B,"seconds":T,"samples_per_s":R}
"""
import argparse
import io
import multiprocessing
import os
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import collate_list, print_json_line  # noqa: E402

import torch.utils.data  # noqa: E402

DATA_EXTENSIONS = (".bin", ".jpg", ".jpeg", ".png", ".webp")
CLIENT = None  # one per worker process, made in worker_init: boto3 clients are not fork-safe


def make_client(endpoint):
    import boto3
    import botocore.config
    return boto3.client("s3", endpoint_url=endpoint,
                        config=botocore.config.Config(s3={"addressing_style": "path"},
                                                      retries={"max_attempts": 6, "mode": "standard"},
                                                      max_pool_connections=1))


def worker_init(endpoint, bucket, barrier):
    def init(_worker_id):
        global CLIENT
        CLIENT = make_client(endpoint)
        CLIENT.head_bucket(Bucket=bucket)  # the connection is open before the clock starts
        barrier.wait()
    return init


class S3Objects(torch.utils.data.Dataset):
    """folder: sample i is object i."""

    def __init__(self, bucket, keys):
        self.bucket, self.keys = bucket, keys

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        return CLIENT.get_object(Bucket=self.bucket, Key=self.keys[i])["Body"].read(), 0


class S3Shards(torch.utils.data.IterableDataset):
    """webdataset: worker w streams shards w, w + W, ... whole and yields their samples."""

    def __init__(self, bucket, keys):
        self.bucket, self.keys = bucket, keys

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        mine = self.keys[info.id::info.num_workers] if info else self.keys
        for key in mine:
            body = CLIENT.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as tar:
                for member in tar:
                    if member.isfile() and member.name.endswith(DATA_EXTENSIONS):
                        yield tar.extractfile(member).read(), 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="s3://BUCKET/PREFIX")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--format", choices=("folder", "webdataset"), default="folder")
    p.add_argument("--endpoint", default=os.environ.get("AWS_ENDPOINT_URL"))
    args = p.parse_args()
    if args.workers < 1:
        p.error("--workers must be at least 1 (the clock waits for the workers' barrier)")
    bucket, _, prefix = args.url[len("s3://"):].partition("/")
    client = make_client(args.endpoint)
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    if args.format == "webdataset":
        keys = sorted(k for k in keys if k.endswith(".tar"))
        dataset = S3Shards(bucket, keys)
    else:
        dataset = S3Objects(bucket, keys)
    barrier = multiprocessing.Barrier(args.workers + 1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, num_workers=args.workers, collate_fn=collate_list,
                                         worker_init_fn=worker_init(args.endpoint, bucket, barrier))
    batches = iter(loader)  # starts the workers
    barrier.wait()
    start = time.perf_counter()
    samples = nbytes = 0
    for batch in batches:
        samples += len(batch)
        nbytes += sum(len(data) for data, _ in batch)
    seconds = time.perf_counter() - start
    print_json_line({"workers": args.workers, "format": args.format, "objects": len(keys), "samples": samples,
                     "bytes": nbytes, "seconds": round(seconds, 4), "samples_per_s": round(samples / seconds, 1)})


if __name__ == "__main__":
    main()
