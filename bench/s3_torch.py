#!/usr/bin/env python3
"""bench/s3.sh's baseline: PyTorch's DataLoader over objects in S3, read with boto3.

Lists s3://BUCKET/PREFIX (every object), then reads each object once through a DataLoader
with --workers worker processes, each with its own boto3 client (what a training script
that reads from S3 itself does), batch size 16, one pass. Endpoint and credentials from
the AWS_* environment or --endpoint. Prints one line:
JSON {"workers":W,"objects":N,"bytes":B,"seconds":T,"objects_per_s":R}
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import collate_list, print_json_line  # noqa: E402


class S3Objects:
    def __init__(self, endpoint, bucket, keys):
        self.endpoint, self.bucket, self.keys = endpoint, bucket, keys
        self.client = None  # one per worker process: boto3 clients are not fork-safe

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        if self.client is None:
            self.client = make_client(self.endpoint)
        return self.client.get_object(Bucket=self.bucket, Key=self.keys[i])["Body"].read(), 0


def make_client(endpoint):
    import boto3
    import botocore.config
    return boto3.client("s3", endpoint_url=endpoint,
                        config=botocore.config.Config(s3={"addressing_style": "path"},
                                                      retries={"max_attempts": 6, "mode": "standard"}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="s3://BUCKET/PREFIX")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--endpoint", default=os.environ.get("AWS_ENDPOINT_URL"))
    args = p.parse_args()
    import torch.utils.data
    bucket, _, prefix = args.url[len("s3://"):].partition("/")
    client = make_client(args.endpoint)
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    loader = torch.utils.data.DataLoader(S3Objects(args.endpoint, bucket, keys), batch_size=16,
                                         num_workers=args.workers, collate_fn=collate_list)
    start = time.perf_counter()
    objects = nbytes = 0
    for batch in loader:
        objects += len(batch)
        nbytes += sum(len(data) for data, _ in batch)
    seconds = time.perf_counter() - start
    print_json_line({"workers": args.workers, "objects": objects, "bytes": nbytes, "seconds": round(seconds, 4),
                     "objects_per_s": round(objects / seconds, 1)})


if __name__ == "__main__":
    main()
