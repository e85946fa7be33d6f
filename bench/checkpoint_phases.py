#!/usr/bin/env python3
"""The trainer of bench/checkpoint_phases.sh: one rank that saves a --state-mib MiB tensor
through a lease (shardmix.torch's own steps: lease, torch.save into it, save_lease) in
--rounds rounds, all ranks starting each round together (a gloo barrier, as a
data-parallel job checkpoints at the same step), and waits until durable before the next.
Each rank prints one JSON line per round with the wall time of each phase:
    JSON {"rank": R, "round": N, "lease": s, "serialise": s, "commit": s, "save": s,
          "cpu": s}
lease: the daemon allocates the buffer and the client maps it; serialise: torch.save into
the mapping; commit: save_lease, which returns once a peer daemon holds the replica; cpu:
this process's CPU seconds over the three.

    python3 bench/checkpoint_phases.py --store FILE [--rounds 4] [--state-mib 256]
"""
import argparse
import json
import time

import torch
import torch.distributed as dist

import shardmix
import shardmix.torch as smt


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="gloo rendezvous file (shared by the ranks)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--state-mib", type=int, default=256)
    args = parser.parse_args()
    client = shardmix.Client()
    rank = client.rank
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=rank, world_size=client.world_size)
    state = {"weights": torch.ones(args.state_mib << 18)}  # float32
    name = f"rank{rank}"
    want = smt._storage_bytes(state) + (1 << 20)  # what shardmix.torch.save asks for
    for r in range(args.rounds):
        dist.barrier()
        cpu0, t0 = time.process_time(), time.monotonic()
        lease = client.lease_checkpoint(name, want)
        t1 = time.monotonic()
        writer = smt._LeaseWriter(lease)
        torch.save(state, writer)
        t2 = time.monotonic()
        client.save_lease(lease, writer.size)
        t3, cpu1 = time.monotonic(), time.process_time()
        client.wait_durable(name)
        print("JSON " + json.dumps({"rank": rank, "round": r, "lease": t1 - t0, "serialise": t2 - t1,
                                    "commit": t3 - t2, "save": t3 - t0, "cpu": cpu1 - cpu0}), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
