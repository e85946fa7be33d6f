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
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time


class SampleFiles:
    """Map-style dataset: item i is (bytes of file i, label)."""

    def __init__(self, root, paths):
        self.root = root
        self.paths = paths
        self.sizes = [os.stat(os.path.join(root, p)).st_size for p in paths]
        self.labels = [int(m.group(1)) if (m := re.search(r"class_(\d+)", p)) else 0 for p in paths]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        fd = os.open(os.path.join(self.root, self.paths[i]), os.O_RDONLY)
        try:
            data = os.pread(fd, self.sizes[i], 0)
            while len(data) < self.sizes[i]:  # short reads are legal
                more = os.pread(fd, self.sizes[i] - len(data), len(data))
                if not more:
                    raise IOError(f"{self.paths[i]}: file shrank to {len(data)} bytes")
                data += more
        finally:
            os.close(fd)
        return data, self.labels[i]


def collate_list(batch):
    return batch


def run_rank(args):
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=args.rank, world_size=args.world)
    paths = [line.split()[0] for line in open(args.list) if line.strip()]
    ds = SampleFiles(args.root, paths)
    sampler = DistributedSampler(ds, num_replicas=args.world, rank=args.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                        collate_fn=collate_list, persistent_workers=args.workers > 0,
                        prefetch_factor=args.prefetch if args.workers > 0 else None)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        dist.barrier()
        t0 = time.monotonic()
        samples = nbytes = 0
        for batch in loader:
            for data, _label in batch:
                samples += 1
                nbytes += len(data)
        t1 = time.monotonic()
        print("JSON " + json.dumps({"bench": "torch", "rank": args.rank, "epoch": epoch, "samples": samples,
                                    "bytes": nbytes, "workers": args.workers, "t_start": t0, "t_end": t1}),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True)
    p.add_argument("--list", required=True)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=2, help="DataLoader prefetch_factor (batches per worker)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        run_rank(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="smx-torch.") as tmp:
        store = os.path.join(tmp, "store")
        base = [sys.executable, os.path.abspath(__file__), "--root", args.root, "--list", args.list,
                "--world", str(args.world), "--workers", str(args.workers), "--prefetch", str(args.prefetch),
                "--epochs", str(args.epochs), "--batch", str(args.batch), "--seed", str(args.seed),
                "--store", store]
        procs = [subprocess.Popen(base + ["--rank", str(r)]) for r in range(args.world)]
        rc = 0
        for proc in procs:
            rc = proc.wait() or rc
        return rc


if __name__ == "__main__":
    sys.exit(main())
