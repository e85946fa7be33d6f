#!/usr/bin/env python3
"""Compares the delivery order of a run with shuffle.window = W against the planned order.

The planned order comes from a reference run with window 0 (which delivers exactly the
plan: docs/configuration.md, shuffle.window) of the same dataset, seed and job shape.
Both are trace dirs of `shardmix-consume --trace` (rank-<R>.csv). Per epoch and rank:

  * the run delivers the same samples as the plan (a window never changes which samples
    a trainer gets);
  * each sample delivered in batch j was planned before batch_begin(j) + size(j) + W;
  * --expect-same-order: the delivery is the plan, sample for sample;
  * --expect-overtake: somewhere a sample was delivered while a sample planned before it
    was still undelivered (it overtook that one). Prints the first such pair.

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

Key = Tuple[int, int]  # (epoch, rank)


def read_orders(trace_dir: str) -> Dict[Key, List[Tuple[int, str]]]:
    """(epoch, rank) -> [(batch, path)] in delivery order (batch, position)."""
    rows: Dict[Key, List[Tuple[int, int, str]]] = collections.defaultdict(list)
    for name in glob.glob(os.path.join(trace_dir, "rank-*.csv")):
        with open(name, newline="", encoding="utf-8", errors="surrogateescape") as f:
            for r in csv.DictReader(f):
                rows[(int(r["epoch"]), int(r["rank"]))].append((int(r["batch"]), int(r["position"]), r["path"]))
    return {k: [(b, p) for b, _, p in sorted(v)] for k, v in rows.items()}


def batch_ends(planned: List[Tuple[int, str]]) -> Dict[int, int]:
    """batch j -> batch_begin(j) + size(j) in the planned order."""
    ends: Dict[int, int] = {}
    for i, (batch, _) in enumerate(planned):
        ends[batch] = i + 1
    return ends


def compare(key: Key, planned: List[Tuple[int, str]], run: List[Tuple[int, str]], window: int,
            problems: List[str]) -> List[str]:
    """Checks one (epoch, rank); returns the overtakes found as readable lines."""
    where = "epoch %d rank %d" % key
    index = {path: i for i, (_, path) in enumerate(planned)}
    if sorted(index) != sorted(p for _, p in run):
        problems.append("%s: the run delivered other samples than the plan (%d planned, %d delivered)"
                        % (where, len(planned), len(run)))
        return []
    ends = batch_ends(planned)
    delivered = [False] * len(planned)
    first_undelivered = 0
    overtakes = []
    for batch, path in run:
        i = index[path]
        if batch not in ends or i >= ends[batch] + window:
            problems.append("%s: %r (planned position %d) delivered in batch %d, outside its window %d"
                            % (where, path, i, batch, window))
        if first_undelivered < i:
            waiting = planned[first_undelivered][1]
            overtakes.append("%s: %r (planned position %d) delivered in batch %d before %r (planned position %d)"
                             % (where, path, i, batch, waiting, first_undelivered))
        delivered[i] = True
        while first_undelivered < len(delivered) and delivered[first_undelivered]:
            first_undelivered += 1
    return overtakes


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("planned", help="trace dir of the window-0 reference run")
    p.add_argument("run", help="trace dir of the run under test")
    p.add_argument("--window", type=int, required=True, help="shuffle.window of the run under test")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--expect-same-order", action="store_true")
    g.add_argument("--expect-overtake", action="store_true")
    a = p.parse_args(argv)
    planned, run = read_orders(a.planned), read_orders(a.run)
    problems: List[str] = []
    if not planned:
        problems.append("no rows in %s" % a.planned)
    if set(planned) != set(run):
        problems.append("the runs have different (epoch, rank) pairs: %s vs %s" % (sorted(planned), sorted(run)))
    overtakes: List[str] = []
    for key in sorted(set(planned) & set(run)):
        overtakes += compare(key, planned[key], run[key], a.window, problems)
    if a.expect_same_order and overtakes:
        problems.append("%d samples overtook an earlier planned one, expected the planned order; first: %s"
                        % (len(overtakes), overtakes[0]))
    if a.expect_same_order and planned != run:
        problems.append("the delivery order differs from the plan")
    if a.expect_overtake and not overtakes:
        problems.append("no sample overtook an earlier planned one (the window had nothing to do?)")
    if problems:
        print("overtake check: FAIL\n  " + "\n  ".join(problems[:10]))
        return 1
    what = ("%d samples overtook an earlier planned one; first: %s" % (len(overtakes), overtakes[0])
            if overtakes else "every sample in its planned place")
    print("overtake check: PASS  %d (epoch, rank) orders compared; %s" % (len(planned), what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
