#!/usr/bin/env python3
"""The PyTorch DataLoader side of bench/stall.sh: R ranks, each a DistributedSampler +
DataLoader over the sample files (bench/benchlib.py's map-style dataset: raw bytes,
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
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402  (the same dataset and ranks as bench/storage_torch.py)


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
    dist = benchlib.join_ranks(args)
    compute_s = args.compute_ms / 1000.0
    if args.synthetic_batches:
        per_sample = max(1, args.synthetic_batch_bytes // args.batch)
        batch = [(bytes(per_sample), 0)] * args.batch
        sampler, loader = None, [batch] * args.synthetic_batches
        sink = bytearray(per_sample)
    else:
        ds = benchlib.SampleFiles(args.root, benchlib.read_list(args.list))
        sampler, loader = benchlib.rank_loader(args, ds)
        sink = bytearray(max(ds.sizes))
    benchlib.timed_epochs(args, dist, sampler, loader, "stall_torch", lambda b: train_step(b, sink, compute_s))


def add_arguments(parser):
    parser.add_argument("--root", default="")
    parser.add_argument("--list", default="")
    parser.add_argument("--compute-ms", type=float, default=0.0)
    parser.add_argument("--synthetic-batches", type=int, default=0)
    parser.add_argument("--synthetic-batch-bytes", type=int, default=0)


def check(parser, args):
    if not args.synthetic_batches and not (args.root and args.list):
        parser.error("--root and --list are needed unless --synthetic-batches is given")


if __name__ == "__main__":
    sys.exit(benchlib.rank_main(__file__, __doc__, run_rank, "stall", add_arguments, check))
