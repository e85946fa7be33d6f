#!/usr/bin/env python3
"""Checks the storage tier of an end-to-end run (tests/e2e/run_e2e.sh with
SHARDMIX_E2E_CAPACITY_FACTOR): what the daemons say they keep resident and cold, against
the traces the trainers wrote (whose bytes check_traces.py has checked against the files),
for any format: a shard format's sample is its "<shard>@<offset>" row.

 - every daemon logged its residency split; resident bytes (the arena) fit cache.capacity,
   and first fit left less room than the largest sample (nothing cold would still fit);
 - per epoch, the samples with tier 'storage' are exactly as many as the daemons' cold
   samples, the same ones every epoch (static residency), and their bytes are the cold
   bytes, which the capacity predicts: total - nodes x capacity <= cold bytes <
   total - nodes x capacity + nodes x align(largest sample);
 - the daemons' storage readers read every storage-tier sample, at most the read-ahead of
   an epoch nobody asked for more, and none failed.
With --rotation-epochs K > 0 (cache rotation, docs/decisions/0033) the set read from
storage must instead change from one generation to the next, each epoch's count must stay
within the cold count plus what is read from storage while nodes reload (reported), and
every daemon must have logged its reloads with no unexpected fence message.
With --reuse-rounds R > 0 (slot reuse within an epoch, docs/decisions/0035) the same holds
with a generation per round, except that the storage-tier count has no lower bound: reloads
load samples ahead of their use, so fewer may come from storage on the trainers' path. The
samples read from storage in all (trainers' cold reads plus reloads) are reported.

Exit status 0 PASS, 1 FAIL, 2 usage error. Byte-exactness of every delivered sample is
check_traces.py's job (run before this one).
"""

import argparse
import csv
import glob
import os
import re
import sys

ALIGN = 64


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", required=True)
    p.add_argument("--trace", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--capacity", type=int, required=True, help="cache.capacity per node, bytes")
    p.add_argument("--trainers", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--prefetch", type=int, required=True)
    p.add_argument("--readahead", type=int, required=True)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--rotation-epochs", type=int, default=0)
    p.add_argument("--reuse-rounds", type=int, default=0)
    a = p.parse_args()

    # The dataset as the trainers received it (check_traces.py has checked every sample once
    # per epoch against the files): its samples and their bytes, from epoch 0. For shard
    # formats a sample is "<shard>@<offset>" and its bytes are the sample's, not the shard's.
    rows = []
    for path in glob.glob(os.path.join(a.trace, "rank-*.csv")):
        with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
            rows.extend(csv.DictReader(f))
    sizes = {r["path"]: int(r["bytes"]) for r in rows if int(r["epoch"]) == 0}
    if not sizes:
        print(f"storage check: FAIL\n  no epoch-0 rows in {a.trace}")
        return 1
    total = sum(sizes.values())
    largest = max(sizes.values())
    n = len(sizes)

    text = open(a.log, encoding="utf-8", errors="replace").read()
    problems = []
    cache = re.findall(
        r"\[rank (\d+)\]\[daemon\] cache: (\d+) of (\d+) owned samples resident \((\d+) of (\d+) bytes, "
        r"arena (\d+) bytes; cache.capacity \S+ = (\d+) bytes\); (\d+) cold samples \((\d+) bytes\)", text)
    if len(cache) != a.nodes:
        problems.append(f"{len(cache)} of {a.nodes} daemons logged their residency split")
    cold_count = cold_bytes = owned_total = padding = 0
    for rank, res, owned, res_bytes, owned_bytes, arena, cap, cold, cbytes in (tuple(map(int, m)) for m in cache):
        owned_total += owned
        padding += arena - res_bytes  # each resident sample rounded up to 64 bytes
        cold_count += cold
        cold_bytes += cbytes
        if cap != a.capacity:
            problems.append(f"node {rank}: cache.capacity {cap} bytes, the test set {a.capacity}")
        if arena > cap:
            problems.append(f"node {rank}: arena {arena} bytes > cache.capacity {cap}")
        if res + cold != owned or res_bytes + cbytes != owned_bytes:
            problems.append(f"node {rank}: resident + cold != owned ({res}+{cold} vs {owned}, "
                            f"{res_bytes}+{cbytes} vs {owned_bytes} bytes)")
        if cold > 0 and cap - arena >= align(largest):
            problems.append(f"node {rank}: {cap - arena} bytes of capacity left unused but {cold} samples cold")
    if len(cache) == a.nodes and owned_total != n:
        problems.append(f"daemons own {owned_total} samples, the dataset has {n}")

    storage_sets = [set() for _ in range(a.epochs)]
    for r in rows:
        if r["tier"] == "storage":
            storage_sets[int(r["epoch"])].add(r["path"])
    lo = total - a.nodes * a.capacity
    hi = lo + a.nodes * align(largest) + padding
    reusing = a.reuse_rounds > 0
    rotating = a.rotation_epochs > 0 or reusing
    extra = []  # per epoch, storage-tier samples beyond the cold count (rotation's reload windows)
    for e, paths in enumerate(storage_sets):
        nbytes = sum(sizes.get(q, 0) for q in paths)
        if rotating:
            # Each generation's cold count differs from generation 0's by first fit's slack
            # and the samples that found no hole; reloads add the changing samples read from
            # storage while a node reloads. Bound: no fewer than 95% of the cold count, and
            # the excess at most half of the resident samples.
            extra.append(len(paths) - cold_count)
            if not reusing and len(paths) < 0.95 * cold_count:
                problems.append(f"epoch {e}: {len(paths)} samples came from storage, under 95% of the "
                                f"{cold_count} cold")
            if len(paths) - cold_count > 0.5 * (n - cold_count):
                problems.append(f"epoch {e}: {len(paths)} samples came from storage, more than the {cold_count} "
                                f"cold plus half of the {n - cold_count} resident")
            new_generation = reusing or e // a.rotation_epochs != (e - 1) // a.rotation_epochs
            if e > 0 and new_generation and paths == storage_sets[e - 1]:
                problems.append(f"epoch {e}: a new generation, yet the same samples came from storage as in "
                                f"epoch {e - 1}")
            continue
        if len(paths) != cold_count:
            problems.append(f"epoch {e}: {len(paths)} samples came from storage, the daemons hold {cold_count} cold")
        if nbytes != cold_bytes:
            problems.append(f"epoch {e}: {nbytes} bytes came from storage, the daemons' cold samples are {cold_bytes}")
        if not lo <= nbytes < hi:
            problems.append(f"epoch {e}: {nbytes} storage bytes outside what the capacity predicts [{lo}, {hi})")
        if e > 0 and paths != storage_sets[0]:
            problems.append(f"epoch {e}: a different set of samples came from storage than in epoch 0")

    reads = [tuple(map(int, m)) for m in re.findall(
        r"\]\[daemon\] storage: (\d+) cold reads, (\d+) bytes read from storage, (\d+) failed", text)]
    delivered = sum(len(s) for s in storage_sets)
    ahead = a.trainers * ((a.prefetch + a.readahead) * a.batch_size + a.window)
    if len(reads) != a.nodes:
        problems.append(f"{len(reads)} of {a.nodes} daemons logged their storage reads at a clean exit")
    else:
        done = sum(r[0] for r in reads)
        if not delivered <= done <= delivered + ahead:
            problems.append(f"daemons made {done} cold reads for {delivered} storage-tier deliveries "
                            f"(allowed up to {ahead} more, read ahead for an epoch never asked)")
        if any(r[2] for r in reads):
            problems.append(f"{sum(r[2] for r in reads)} cold reads failed")

    if rotating:
        rot = [tuple(map(int, m)) for m in re.findall(
            r"\]\[daemon\] cache rotation: (\d+) generations loaded here, (\d+) entering samples written, "
            r"(\d+) chosen samples found no hole \(stayed cold\); (\d+) unexpected fence messages", text)]
        if len(rot) != a.nodes:
            problems.append(f"{len(rot)} of {a.nodes} daemons logged their cache rotation at a clean exit")
        elif (reusing or (a.epochs - 1) // a.rotation_epochs > 0) and any(r[0] < 1 for r in rot):
            # At least one reload per daemon: how many fit in the job depends on how long its
            # epochs last against the fence's round trips, which a test must not assume.
            problems.append(f"generations loaded per daemon {[r[0] for r in rot]}: a daemon never reloaded")
        elif any(r[3] for r in rot):
            problems.append(f"unexpected fence messages {[r[3] for r in rot]}")
        changed = [len(storage_sets[e] ^ storage_sets[e - 1]) for e in range(1, a.epochs)]

    fraction = cold_count / n if n else 0.0
    if problems:
        print("storage check: FAIL\n  " + "\n  ".join(problems))
        return 1
    print(f"storage check: PASS  {cold_count} of {n} samples cold ({100 * fraction:.1f}% of samples, "
          f"{cold_bytes} of {total} bytes = {100 * cold_bytes / total:.1f}%; capacity predicts "
          f"{100 * lo / total:.1f}%..{100 * hi / total:.1f}%), served from storage in each of {a.epochs} epochs; "
          f"{sum(r[0] for r in reads)} cold reads, none failed")
    if rotating:
        print(f"rotation: storage-tier samples per epoch beyond the {cold_count} cold: {extra} "
              f"({', '.join(f'{100 * x / cold_count:+.1f}%' for x in extra)}); set changed between epochs by "
              f"{changed} samples (symmetric difference); per daemon (generations, entering samples, unplaced): "
              f"{[r[:3] for r in rot]}")
        loaded = sum(r[1] for r in rot)
        cold_reads = sum(r[0] for r in reads)
        print(f"read from storage in all: {cold_reads} cold reads on the trainers' path + {loaded} by reloads = "
              f"{cold_reads + loaded} for {a.epochs} epochs (the static set: {cold_count} per epoch, "
              f"{cold_count * a.epochs} in all, plus the read-ahead)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
