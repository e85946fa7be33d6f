#!/usr/bin/env python3
"""The PyTorch DataLoader baseline of bench/storage.sh: R ranks (processes), each with a
DistributedSampler over the same map-style dataset of sample files and a DataLoader with
--workers worker processes, read the files as raw bytes for --epochs epochs.

    /usr/bin/python3 bench/storage_torch.py --root DIR --list FILES [--world 4] [--workers 2]
                                            [--epochs 3] [--batch 32] [--seed 1]

--list: paths relative to --root, one per line; a sample's label is the number in its
class folder name (class_00012/... -> 12). Each item is read as a reader of sample files
does: open, one exact-size pread (size from the attribute-cached stat at start), close.
The batch is the list of (bytes, label) pairs (no tensor conversion). The ranks meet at a
gloo barrier before every epoch, as DDP ranks would; every rank prints one line per epoch:
    JSON {"bench": "torch", "rank": R, "epoch": E, "samples": N, "bytes": B, "t_start": T0, "t_end": T1}
with time.monotonic() (CLOCK_MONOTONIC, comparable with shardmix-consume's t_start/t_end).
Without --rank the script starts the --world ranks itself and relays their lines.
Needs torch (Debian python3-torch, for /usr/bin/python3).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def run_rank(args):
    dist = benchlib.join_ranks(args)
    sampler, loader = benchlib.rank_loader(args, benchlib.SampleFiles(args.root, benchlib.read_list(args.list)))
    benchlib.timed_epochs(args, dist, sampler, loader, "torch", lambda batch: sum(len(data) for data, _ in batch))


def add_arguments(parser):
    parser.add_argument("--root", required=True)
    parser.add_argument("--list", required=True)


if __name__ == "__main__":
    sys.exit(benchlib.rank_main(__file__, __doc__, run_rank, "torch", add_arguments))
