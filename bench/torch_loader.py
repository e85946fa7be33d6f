#!/usr/bin/env python3
"""The PyTorch DataLoader baseline of bench/run.sh (comparisons 1 and 3).

    /usr/bin/python3 bench/torch_loader.py --root DIR [--world 4] [--configs "0:default 1:concat"]
                                           [--epochs 4] [--batch 32] [--seed 1] [--drop-caches]

For every configuration WORKERS:COLLATE of --configs, --world rank processes (forked from
this one, which has imported torch once) each build a DistributedSampler (shuffle, the
same seed, set_epoch per epoch: the global shuffle ShardMix's exchange_fraction = 1 also
does) and a DataLoader (batch --batch, num_workers WORKERS, persistent workers, default
prefetch) over a map-style dataset whose item i is (raw bytes of sample file i, label):
open, one exact-size pread, close. COLLATE is
  default  torch's default_collate: a list of the bytes objects and a label tensor;
  concat   one uint8 tensor holding the batch's bytes back to back, an offsets tensor and
           a label tensor (what a trainer feeding a device wants; with workers, the one
           tensor crosses the process boundary through shared memory instead of one
           pickled bytes object per sample).
The ranks meet at a barrier before every epoch; with --drop-caches rank 0 drops the page
cache (sync; echo 3 > /proc/sys/vm/drop_caches, root) between two barriers, so every
epoch starts cold and no rank's epoch overlaps the drop. Every rank prints per epoch
    JSON {"bench": "torch", "workers": W, "collate": C, "world": N, "drop_caches": D,
          "rank": R, "epoch": E, "samples": S, "bytes": B, "t_start": T0, "t_end": T1}
with time.monotonic() (CLOCK_MONOTONIC, comparable with shardmix-consume's t_start/t_end).
Needs torch (Debian python3-torch, for /usr/bin/python3).
"""
import argparse
import json
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402  (the map-style dataset of sample files)


def list_sample_files(root):
    """Every file under root's class folders, sorted as the folder dataset format scans them."""
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            continue
        paths.extend(os.path.join(rel, f) for f in sorted(filenames))
    if not paths:
        raise SystemExit(f"torch_loader.py: no sample files under {root} (expected class folders)")
    return paths


def collate_concat(batch):
    import numpy as np
    import torch

    sizes = [len(b) for b, _ in batch]
    data = torch.empty(sum(sizes), dtype=torch.uint8)
    view = data.numpy()
    offset = 0
    for (b, _), n in zip(batch, sizes):
        view[offset:offset + n] = np.frombuffer(b, dtype=np.uint8)
        offset += n
    offsets = torch.tensor([0] + sizes, dtype=torch.int64).cumsum(0)
    labels = torch.tensor([label for _, label in batch], dtype=torch.int64)
    return data, offsets, labels


def batch_bytes(batch, collate):
    if collate == "concat":
        return batch[0].numel(), len(batch[2])
    return sum(len(b) for b in batch[0]), len(batch[0])


def drop_page_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        # A cold-cache figure measured warm would be wrong, not just noisy: stop.
        raise SystemExit(f"torch_loader.py: --drop-caches: cannot write /proc/sys/vm/drop_caches ({e}); needs root")


def run_rank(rank, args, workers, collate, dataset, barrier, out):
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    torch.set_num_threads(1)
    sampler = DistributedSampler(dataset, num_replicas=args.world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=workers,
                        collate_fn=collate_concat if collate == "concat" else None,
                        persistent_workers=workers > 0)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        barrier.wait()
        if args.drop_caches and rank == 0:
            drop_page_cache()
        barrier.wait()
        t_start = time.monotonic()
        samples = nbytes = 0
        for batch in loader:
            b, n = batch_bytes(batch, collate)
            nbytes += b
            samples += n
        t_end = time.monotonic()
        out.put(json.dumps({"bench": "torch", "workers": workers, "collate": collate, "world": args.world,
                            "drop_caches": args.drop_caches, "rank": rank, "epoch": epoch, "samples": samples,
                            "bytes": nbytes, "t_start": t_start, "t_end": t_end}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="folder dataset (class folders of sample files)")
    ap.add_argument("--world", type=int, default=4, help="rank processes")
    ap.add_argument("--configs", default="0:default 0:concat 1:default 1:concat 2:default 2:concat",
                    help="space-separated WORKERS:COLLATE (collate: default or concat)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache before every epoch (root)")
    args = ap.parse_args()
    configs = []
    for c in args.configs.split():
        workers, _, collate = c.partition(":")
        if not workers.isdigit() or collate not in ("default", "concat"):
            raise SystemExit(f"torch_loader.py: --configs entry '{c}': want WORKERS:COLLATE, COLLATE default|concat")
        configs.append((int(workers), collate))

    import torch  # noqa: F401  (imported once here; the forked ranks inherit it)

    dataset = benchlib.SampleFiles(args.root, list_sample_files(args.root))
    ctx = multiprocessing.get_context("fork")
    for workers, collate in configs:
        barrier = ctx.Barrier(args.world)
        out = ctx.Queue()
        ranks = [ctx.Process(target=run_rank, args=(r, args, workers, collate, dataset, barrier, out))
                 for r in range(args.world)]
        for p in ranks:
            p.start()
        lines = []
        while len(lines) < args.world * args.epochs:
            if not any(p.is_alive() for p in ranks) and out.empty():
                break
            try:
                lines.append(out.get(timeout=1))
            except Exception:  # queue.Empty: poll the ranks' liveness again
                continue
        for p in ranks:
            p.join()
        failed = [r for r, p in enumerate(ranks) if p.exitcode != 0]
        if failed or len(lines) < args.world * args.epochs:
            raise SystemExit(f"torch_loader.py: workers {workers} collate {collate}: rank(s) {failed} failed "
                             f"({len(lines)} of {args.world * args.epochs} epoch lines)")
        for line in lines:
            print("JSON " + line)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
