#!/usr/bin/env python3
"""The PyTorch DataLoader side of bench/stall.sh: R ranks, each a DistributedSampler +
DataLoader over the sample files (bench/storage_torch.py's map-style dataset: raw bytes,
open + exact-size pread), and a trainer that copies every sample's bytes into one
preallocated buffer (as staging for a GPU would; shardmix-consume --touch copy does the
same) and then "computes" for --compute-ms per batch as a sleep. With --synthetic the same
trainer is fed --synthetic-batches in-memory batches instead: DS-Analyzer's stall-free
reference. Every rank prints one line per epoch:
    JSON {"bench": "stall_torch", "rank": R, "epoch": E, "samples": N, "bytes": B, "t_start": T0, "t_end": T1}
(time.monotonic(), the clock shardmix-consume uses).

    /usr/bin/python3 bench/stall_torch.py --root DIR --list FILES [--workers 2] [--compute-ms 5]
                                          [--epochs 3] [--synthetic-batches N --synthetic-batch-bytes B]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storage_torch import SampleFiles, collate_list  # noqa: E402  (the same dataset as bench/storage.sh)


def train_step(batch, sink, compute_s):
    """Copy every sample into the staging buffer, then the model's compute (a sleep: on
    this 2-core machine a busy loop would take the loader's CPU, which a GPU does not)."""
    n = 0
    for data, _label in batch:
        sink[:len(data)] = data
        n += len(data)
    if compute_s > 0:
        time.sleep(compute_s)
    return n


def run_rank(args):
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=args.rank, world_size=args.world)
    compute_s = args.compute_ms / 1000.0
    if args.synthetic_batches:
        per_sample = max(1, args.synthetic_batch_bytes // args.batch)
        batch = [(bytes(per_sample), 0)] * args.batch
        batches = [batch] * args.synthetic_batches
        sink = bytearray(per_sample)
        loader = batches
    else:
        paths = [line.split()[0] for line in open(args.list) if line.strip()]
        ds = SampleFiles(args.root, paths)
        sampler = DistributedSampler(ds, num_replicas=args.world, rank=args.rank, shuffle=True, seed=args.seed)
        loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                            collate_fn=collate_list, persistent_workers=args.workers > 0,
                            prefetch_factor=args.prefetch if args.workers > 0 else None)
        sink = bytearray(max(ds.sizes))
    for epoch in range(args.epochs):
        if not args.synthetic_batches:
            sampler.set_epoch(epoch)
        dist.barrier()
        t0 = time.monotonic()
        samples = nbytes = 0
        for b in loader:
            nbytes += train_step(b, sink, compute_s)
            samples += len(b)
        t1 = time.monotonic()
        line = "JSON " + json.dumps({"bench": "stall_torch", "rank": args.rank, "epoch": epoch, "samples": samples,
                                     "bytes": nbytes, "workers": args.workers, "t_start": t0, "t_end": t1})
        # One write(2) per line: the ranks share stdout, and print() under PYTHONUNBUFFERED
        # writes the text and the newline apart, so lines of two ranks could interleave.
        os.write(1, (line + "\n").encode())
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="")
    p.add_argument("--list", default="")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--compute-ms", type=float, default=0.0)
    p.add_argument("--synthetic-batches", type=int, default=0)
    p.add_argument("--synthetic-batch-bytes", type=int, default=0)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if not args.synthetic_batches and not (args.root and args.list):
        p.error("--root and --list are needed unless --synthetic-batches is given")
    if args.rank is not None:
        run_rank(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="smx-stall.") as tmp:
        store = os.path.join(tmp, "store")
        base = [sys.executable, os.path.abspath(__file__), "--store", store] + \
            [a for a in sys.argv[1:]]
        procs = [subprocess.Popen(base + ["--rank", str(r)]) for r in range(args.world)]
        rc = 0
        for proc in procs:
            rc = proc.wait() or rc
        return rc


if __name__ == "__main__":
    sys.exit(main())
