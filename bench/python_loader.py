#!/usr/bin/env python3
"""What the Python layers cost: samples/s of one trainer reading Fashion-MNIST from ShardMix.

    /usr/bin/python3 bench/python_loader.py [--epochs 3] [--nodes 4]

Starts --nodes daemons (examples/fashion_mnist.toml, Q = 1, tcp over loopback) and one
trainer per node running this file with --worker. Every trainer reads --epochs epochs per
mode, modes in turn (epoch numbers continue, so each mode sees fresh permutations):

  cpp        shardmix-consume --touch copy (the C++ client, memcpy of every sample), for
             reference: run as a separate job before the Python one
  views      Python iteration with a memoryview of every sample (no copy, bytes not read)
  copy_into  Batch.copy_into into one reused numpy buffer (the copy alone)
  torch      shardmix.torch.ShardMixDataset via make_loader: a new uint8 tensor and the
             labels tensor per batch (what a training loop gets)

Prints one row per mode: the median over trainers and epochs (first epoch of each mode
left out when there are more) of samples/s per trainer.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import benchlib  # noqa: E402
MODES = ["views", "copy_into", "torch"]


def worker(epochs):
    import numpy as np
    import shardmix
    from shardmix.torch import ShardMixDataset, make_loader
    client = shardmix.Client()
    ds = ShardMixDataset(sample_shape=(1, 28, 28), client=client)
    loader = make_loader(ds)
    buf = np.empty((32, 784), np.uint8)
    epoch = 0
    for mode in MODES:
        for _ in range(epochs):
            n = 0
            t0 = time.monotonic()
            if mode == "torch":
                ds.set_epoch(epoch)
                for x, y in loader:
                    n += len(y)
            else:
                for batch in client.epoch(epoch):
                    if mode == "views":
                        for s in batch:
                            memoryview(s)
                    else:
                        batch.copy_into(buf)
                    n += len(batch)
            dt = time.monotonic() - t0
            print("JSON " + json.dumps({"rank": client.rank, "mode": mode, "epoch": epoch, "samples": n,
                                        "seconds": dt}), flush=True)
            epoch += 1


def median_rate(rows, epochs):
    by_mode = {}
    for r in rows:
        by_mode.setdefault(r["mode"], []).append(r)
    out = {}
    for mode, rs in by_mode.items():
        first = min(r["epoch"] for r in rs)
        keep = [r for r in rs if r["epoch"] != first] if epochs > 1 else rs
        out[mode] = statistics.median(r["samples"] / r["seconds"] for r in keep)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--data", default="/tmp/shardmix-fmnist")
    ap.add_argument("--build", default=os.environ.get("SHARDMIX_BUILD_DIR", os.path.join(REPO, "build")))
    args = ap.parse_args()
    if args.worker:
        return worker(args.epochs)
    sys.path.insert(0, os.path.join(REPO, "examples"))
    from fashion_mnist_to_shardmix import convert
    root, _ = convert(args.data)
    build = os.path.abspath(args.build)
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), SHARDMIX_BUILD_DIR=build,
               SHARDMIX_TRAINER_MPI_ARGS="-x PYTHONPATH")
    base = ["bash", os.path.join(REPO, "deploy/launch.sh"), "--nodes", str(args.nodes), "--trainers-per-node", "1",
            "--config", os.path.join(REPO, "examples/fashion_mnist.toml"), "--set", f"dataset.path={root}",
            "--set", "shuffle.exchange_fraction=1", "--"]
    rates = {}
    out = subprocess.run(base + [os.path.join(build, "tools/shardmix-consume"), "--epochs", str(args.epochs),
                                 "--touch", "copy", "--json"], env=env, capture_output=True, text=True, check=True)
    cpp = benchlib.json_rows(out.stdout.splitlines())
    keep = [r for r in cpp if r["epoch"] > 0] if args.epochs > 1 else cpp
    rates["cpp"] = statistics.median(r["samples"] / r["seconds"] for r in keep)
    out = subprocess.run(base + [sys.executable, os.path.abspath(__file__), "--worker", "--epochs", str(args.epochs)],
                         env=env, capture_output=True, text=True, check=True)
    rows = benchlib.json_rows(out.stdout.splitlines())
    rates.update(median_rate(rows, args.epochs))
    print(f"| mode | samples/s per trainer (median of {args.nodes} trainers x {max(1, args.epochs - 1)} epochs) |")
    print("| --- | --- |")
    for mode in ["cpp"] + MODES:
        print(f"| {mode} | {rates[mode]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
