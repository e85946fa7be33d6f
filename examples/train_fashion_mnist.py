#!/usr/bin/env python3
"""Trains a small CNN on Fashion-MNIST served by ShardMix, data-parallel (DDP, gloo).

Run it as the trainer ranks of a ShardMix job, one per daemon's trainer slot:

    /usr/bin/python3 examples/fashion_mnist_to_shardmix.py /tmp/fmnist      # once
    deploy/launch.sh --nodes 4 --config examples/fashion_mnist.toml \\
        --set dataset.path=/tmp/fmnist/train -- \\
        /usr/bin/python3 examples/train_fashion_mnist.py --epochs 3 --json /tmp/run.json

What ShardMix replaces: the Dataset + DistributedSampler + DataLoader of a usual DDP
script (see "ShardMix" comments below). Rank and world size come from the launcher's
environment (mpirun here; torchrun's RANK/WORLD_SIZE and Slurm work too), for both
ShardMix and torch.distributed. The per-trainer batch size is the daemons' batch.size.

Model: two 3x3 conv layers (16, 32 channels) with BatchNorm, ReLU and 2x2 max-pooling,
then one linear layer (~25k parameters). No augmentation (inputs are only scaled). SGD
with momentum. BatchNorm statistics are per trainer, as in any DDP job (DDP broadcasts
rank 0's running statistics with every forward, so all replicas evaluate alike).
At the end (and after each epoch) rank 0 evaluates on the 10,000 test images, read
directly from Debian's dataset-fashion-mnist (not through ShardMix).

--json FILE: rank 0 writes one JSON object: config, per-epoch loss, test accuracy,
samples/s (all trainers' samples over the slowest trainer's epoch time) and the shuffle
figures ShardMix reported for every trainer (label entropy mean and p5, affinity, Q,
local/peer fractions).
"""
import argparse
import json
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fashion_mnist_to_shardmix import SOURCE, load_split  # noqa: E402

import shardmix  # noqa: E402
from shardmix.torch import ShardMixDataset, make_loader  # noqa: E402

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training set pixel mean and std (of x / 255)


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


def to_input(x, y):
    # uint8 [B, 1, 28, 28] (copied out of ShardMix's shared memory) -> normalised float
    return x.float().div_(255).sub_(MEAN).div_(STD), y


def evaluate(model, images, labels):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(images), 1000):
            x, _ = to_input(torch.from_numpy(images[i:i + 1000].copy()).unsqueeze(1), None)
            correct += (model(x).argmax(1) == torch.from_numpy(labels[i:i + 1000].astype(np.int64))).sum().item()
    model.train()
    return correct / len(images)


def bn_recalibrated_accuracy(model, source, test_images, test_labels, n=2000):
    """Diagnostic, after training: the test accuracy of a copy of the model whose BatchNorm
    running statistics are re-estimated on n training images drawn from all classes (a fixed
    numpy seed; the model's weights and the training run are untouched). Separates what
    non-iid per-trainer batches did to the BatchNorm statistics from what they did to the
    weights."""
    import copy
    images, _ = load_split(source, "train")
    pick = np.random.default_rng(12345).choice(len(images), n, replace=False)
    m = copy.deepcopy(model)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.reset_running_stats()
            mod.momentum = None  # cumulative average over the calibration batches
    m.train()
    with torch.no_grad():
        for i in range(0, n, 100):
            x, _ = to_input(torch.from_numpy(images[pick[i:i + 100]].copy()).unsqueeze(1), None)
            m(x)
    return evaluate(m, test_images, test_labels)


def init_distributed(rank, world):
    """gloo over TCP; the address from MASTER_ADDR/MASTER_PORT (the study script sets them)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--init-seed", type=int, default=0, help="seed of the model's initial weights")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per trainer")
    ap.add_argument("--source", default=SOURCE, help="where the Fashion-MNIST .gz files are")
    ap.add_argument("--eval-every-epoch", action="store_true")
    ap.add_argument("--json", help="rank 0 writes the run's figures here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.init_seed)

    # ---- ShardMix: instead of Dataset + DistributedSampler + DataLoader(batch_size=...)
    where = shardmix.detect_launcher_rank()            # the same env the client reads
    rank, world = where["rank"], where["world_size"]
    init_distributed(rank, world)
    dataset = ShardMixDataset(sample_shape=(1, 28, 28), transform=to_input)
    loader = make_loader(dataset)
    # ----

    model = nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    test_images, test_labels = load_split(args.source, "test") if rank == 0 else (None, None)

    history = []
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)                       # ShardMix: as DistributedSampler.set_epoch
        t0 = time.monotonic()
        loss_sum, n = 0.0, 0
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(y)
            n += len(y)
        seconds = time.monotonic() - t0
        stats = dict(dataset.last_stats or {})
        stats.update(trainer_samples=n, trainer_seconds=seconds, trainer_loss=loss_sum / max(n, 1), rank=rank,
                     host=socket.gethostname())
        everyone = [None] * world
        dist.all_gather_object(everyone, stats)
        row = {
            "epoch": epoch,
            "train_loss": sum(s["trainer_loss"] * s["trainer_samples"] for s in everyone)
                          / max(1, sum(s["trainer_samples"] for s in everyone)),
            "samples": sum(s["trainer_samples"] for s in everyone),
            "seconds": max(s["trainer_seconds"] for s in everyone),
            "trainers": everyone,
        }
        row["samples_per_s"] = row["samples"] / row["seconds"]
        if rank == 0 and (args.eval_every_epoch or epoch == args.epochs - 1):
            row["test_accuracy"] = evaluate(model.module, test_images, test_labels)
        if rank == 0 and epoch == args.epochs - 1:
            row["test_accuracy_bn_recalibrated"] = bn_recalibrated_accuracy(model.module, args.source, test_images,
                                                                            test_labels)
        history.append(row)
        dist.barrier()  # rank 0's evaluation stays out of the next epoch's time on the other ranks
        if rank == 0:
            ent = [s.get("label_entropy_mean", float("nan")) for s in everyone]
            print(f"epoch {epoch}: loss {row['train_loss']:.4f}, {row['samples_per_s']:.0f} samples/s, "
                  f"label entropy per trainer {' '.join(f'{e:.3f}' for e in ent)}"
                  + (f", test accuracy {row['test_accuracy']:.4f}" if "test_accuracy" in row else "")
                  + (f" ({row['test_accuracy_bn_recalibrated']:.4f} with BatchNorm statistics re-estimated)"
                     if "test_accuracy_bn_recalibrated" in row else ""), flush=True)

    if rank == 0 and args.json:
        out = {"args": vars(args), "world_size": world, "epochs": history,
               "final_test_accuracy": history[-1].get("test_accuracy"),
               "final_test_accuracy_bn_recalibrated": history[-1].get("test_accuracy_bn_recalibrated"),
               "torch": torch.__version__}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, allow_nan=True)
    dist.barrier()
    # Exit without tearing down the process group: with torch 1.13 the DDP reducer's
    # destructor can deadlock at interpreter exit (~ProcessGroupGloo joins a gloo worker
    # thread that waits for the GIL the joining thread holds; seen here as one rank hanging
    # forever after the run's JSON was written). Everything is written; the daemon sees the
    # socket close when the process ends.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
