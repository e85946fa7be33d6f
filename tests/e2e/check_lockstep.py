#!/usr/bin/env python3
"""Judges whether the trainers of a run stayed in step, batch by batch.

Reads DIR/batch-rank-<R>.csv of `shardmix-consume --trace DIR` (epoch,rank,batch,
t_request,t_received: monotonic seconds when the trainer began waiting for the batch and
when it had it; comparable between processes of one machine). A run is in step when, in
every epoch, every rank received the same batch numbers and no rank began waiting for
batch k+1 before every rank had received batch k, as DDP's per-batch all-reduce enforces.

Prints the epochs, batches and violations found (the worst one named: the rank that ran
ahead, the batch, and by how much). --expect-in-step makes any violation a failure; without
it the figures are only reported (a free-running run may or may not drift).

Exit status: 0 PASS, 1 FAIL, 2 usage error. Imports nothing from the project.
"""

from __future__ import annotations

import argparse
import collections
import csv
import glob
import os
import sys
from typing import Dict, List, Tuple

Times = Dict[int, Dict[int, Tuple[float, float]]]  # rank -> batch -> (t_request, t_received)


def read_batch_times(trace_dir: str) -> Dict[int, Times]:
    """epoch -> rank -> batch -> (t_request, t_received)."""
    epochs: Dict[int, Times] = collections.defaultdict(lambda: collections.defaultdict(dict))
    names = glob.glob(os.path.join(trace_dir, "batch-rank-*.csv"))
    if not names:
        raise SystemExit(f"check_lockstep: no batch-rank-*.csv in {trace_dir} (run shardmix-consume with --trace)")
    for name in names:
        with open(name, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                epochs[int(r["epoch"])][int(r["rank"])][int(r["batch"])] = (float(r["t_request"]),
                                                                            float(r["t_received"]))
    return epochs


def judge(epochs: Dict[int, Times], trainers: int) -> Tuple[List[str], List[str], int]:
    """(problems, violations, batches checked): problems are missing or mismatched batches;
    a violation is a batch k+1 some rank began waiting for before another rank had batch k."""
    problems: List[str] = []
    violations: List[Tuple[float, str]] = []
    checked = 0
    for epoch in sorted(epochs):
        ranks = epochs[epoch]
        if sorted(ranks) != list(range(trainers)):
            problems.append(f"epoch {epoch}: batch times from ranks {sorted(ranks)}, expected 0..{trainers - 1}")
            continue
        numbers = {r: sorted(b) for r, b in ranks.items()}
        if any(n != numbers[0] for n in numbers.values()):
            counts = {r: len(n) for r, n in numbers.items()}
            problems.append(f"epoch {epoch}: the ranks received different batch numbers (counts {counts})")
            continue
        for k, nxt in zip(numbers[0], numbers[0][1:]):
            last_received = max(ranks[r][k][1] for r in ranks)
            slowest = max(ranks, key=lambda r: ranks[r][k][1])
            for r in ranks:
                ahead = last_received - ranks[r][nxt][0]
                if ahead > 0:
                    violations.append((ahead, f"epoch {epoch}: rank {r} began waiting for batch {nxt} "
                                              f"{ahead * 1e3:.3f} ms before rank {slowest} had batch {k}"))
            checked += 1
    violations.sort(reverse=True)
    return problems, [text for _, text in violations], checked


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace_dir", help="directory with batch-rank-<R>.csv files")
    p.add_argument("--trainers", type=int, required=True, help="number of trainer ranks T")
    p.add_argument("--expect-in-step", action="store_true", help="fail on any batch that ran ahead")
    args = p.parse_args(argv)
    problems, violations, checked = judge(read_batch_times(args.trace_dir), args.trainers)
    if checked == 0 and not problems:
        problems.append("no pair of consecutive batches to compare")
    summary = f"{checked} batch boundaries checked, {len(violations)} where a rank ran ahead"
    if violations:
        summary += f" (worst: {violations[0]})"
    if args.expect_in_step and violations:
        problems.append(summary)
    if problems:
        print("check_lockstep: FAIL\n  " + "\n  ".join(problems))
        return 1
    print(f"check_lockstep: PASS  {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
