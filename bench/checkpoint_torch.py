#!/usr/bin/env python3
"""The trainer of bench/checkpoint.sh: one rank of a data-parallel job that trains on
ShardMix-delivered batches and checkpoints its state every --every batches.

Each rank (launched by deploy/launch.sh under mpirun; rank and world from the launcher's
environment) joins a gloo group (--store) and all-reduces one float after every batch, as
DDP's gradient all-reduce holds real ranks in step. A step copies the batch's bytes out
(Batch.copy_into, as staging for a GPU would) and then "computes" for --compute-ms (a
sleep: a GPU's compute does not use the host CPU). The state is one float32 tensor of
--state-mib MiB, saved every --every batches (all ranks at the same batch) with
    --mode shardmix   shardmix.torch.save(state, "rank<R>") into the node's daemon;
    --mode torch      torch.save(state, "<--dir>/rank<R>.pt"), straight to the file system;
    --mode none       no checkpoint (the stall reference).
Data stall is the time spent waiting in the batch iterator; the time in save is apart.
After the last epoch:
    shardmix  every rank waits until its last training checkpoint is durable, then all
              save one more version at once (a barrier first) and wait_durable it: the
              span from the first save's start to the last durable is the drain's rate;
    torch     every rank writes --state-mib MiB to "<--dir>/raw<R>" with write + fsync at
              once (a barrier first): the file system's own rate for the same load.
Every rank prints one JSON line per epoch and one for the after-phase:
    JSON {"bench": "checkpoint", "mode": M, "rank": R, "epoch": E, "batches": B, "samples": S,
          "t_start": T0, "t_end": T1, "wait_s": W, "save_s": X, "saves": N,
          "save_each_s": [X1, ...]}   (each save's time, in order)
    JSON {"bench": "checkpoint", "mode": M, "rank": R, "phase": "drain"|"fs_write",
          "bytes": B, "t_start": T0, "t_end": T1}
(time.monotonic(): CLOCK_MONOTONIC, one clock for every process of the machine.)

    /usr/bin/python3 bench/checkpoint_torch.py --mode shardmix --store FILE [--state-mib 1024]
        [--every 40] [--compute-ms 20] [--epochs 3] [--dir DIR]
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import shardmix
import shardmix.torch


def emit(record):
    # One write per line: mpirun merges the ranks' output, and print()'s separate newline
    # let another rank's line land in between.
    sys.stdout.write("JSON " + json.dumps(record) + "\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("none", "shardmix", "torch"), required=True)
    parser.add_argument("--store", required=True, help="gloo rendezvous file (shared by the ranks)")
    parser.add_argument("--state-mib", type=int, default=1024)
    parser.add_argument("--every", type=int, default=40, help="batches between checkpoints")
    parser.add_argument("--compute-ms", type=float, default=20.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dir", default="", help="the file system's directory (torch mode, fs_write)")
    args = parser.parse_args()
    if args.mode == "torch" and not args.dir:
        parser.error("--mode torch needs --dir")

    place = shardmix.detect_launcher_rank()  # what shardmix.Client() reads too
    rank, world = place["rank"], place["world_size"]
    if rank < 0 or world <= 0:
        sys.exit(f"checkpoint_torch.py: run it under a launcher (deploy/launch.sh): {place['description']}")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=rank, world_size=world)
    client = shardmix.Client()
    # The model's state: one tensor, written once so that its pages are resident (a real
    # model's parameters are), and changed a little before every save.
    state = {"weights": torch.ones(args.state_mib * (1 << 20) // 4, dtype=torch.float32)}
    state_bytes = state["weights"].numel() * 4
    tick = torch.zeros(1)
    sink = None
    step = 0
    name = f"rank{rank}"

    def save():
        state["weights"][step % state["weights"].numel()] = float(step)
        if args.mode == "shardmix":
            shardmix.torch.save(state, name, client=client)
        else:
            torch.save(state, os.path.join(args.dir, f"{name}.pt"))

    for epoch in range(args.epochs):
        dist.barrier()
        t_start = time.monotonic()
        wait_s = save_s = 0.0
        batches = samples = saves = 0
        save_each_s = []
        it = iter(client.epoch(epoch))
        while True:
            t0 = time.monotonic()
            batch = next(it, None)
            wait_s += time.monotonic() - t0
            if batch is None:
                break
            stride = max((s.nbytes for s in batch), default=0)
            if sink is None or len(sink) < stride * len(batch):
                sink = bytearray(max(stride * len(batch), 1))
            batch.copy_into(memoryview(sink)[:stride * len(batch)], stride=stride)
            if args.compute_ms > 0:
                time.sleep(args.compute_ms / 1000.0)
            dist.all_reduce(tick)
            batches += 1
            samples += len(batch)
            step += 1
            if args.mode != "none" and step % args.every == 0:
                t0 = time.monotonic()
                save()
                save_each_s.append(time.monotonic() - t0)
                save_s += save_each_s[-1]
                saves += 1
        emit({"bench": "checkpoint", "mode": args.mode, "rank": rank, "epoch": epoch, "batches": batches,
              "samples": samples, "t_start": t_start, "t_end": time.monotonic(), "wait_s": wait_s,
              "save_s": save_s, "saves": saves, "save_each_s": save_each_s, "state_bytes": state_bytes})

    if args.mode == "shardmix":
        if step >= args.every:
            client.wait_durable(name)  # the training run's last version: the drain is idle after
        dist.barrier()
        t0 = time.monotonic()
        save()
        t_saved = time.monotonic()
        client.wait_durable(name)
        emit({"bench": "checkpoint", "mode": args.mode, "rank": rank, "phase": "drain", "bytes": state_bytes,
              "t_start": t0, "t_saved": t_saved, "t_end": time.monotonic()})
    elif args.mode == "torch":
        raw = memoryview(state["weights"].numpy()).cast("B")
        path = os.path.join(args.dir, f"raw{rank}")
        dist.barrier()
        t0 = time.monotonic()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            done = 0
            while done < len(raw):
                done += os.write(fd, raw[done:done + (8 << 20)])
            os.fsync(fd)
        finally:
            os.close(fd)
        emit({"bench": "checkpoint", "mode": args.mode, "rank": rank, "phase": "fs_write", "bytes": len(raw),
              "t_start": t0, "t_end": time.monotonic()})
        os.unlink(path)
    client.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0



if __name__ == "__main__":
    sys.exit(main())
