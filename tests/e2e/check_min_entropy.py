#!/usr/bin/env python3
"""Checks shuffle.min_entropy end to end: the daemons' per-epoch choice (their log) against
the label entropy measured here on the delivered batches (trace dir of shardmix-consume).

The figure is docs/shuffle-quality.md section 1, computed independently: per (rank,
batch) with n >= 2 samples, H = -sum (c_k/n) ln(c_k/n) over the label counts, divided by
ln(min(n, C)) (C = --classes); the epoch's figure is the mean over those batches.

  reachable (default): every daemon logs "shuffle.min_entropy chose exchange_fraction Q"
      for every epoch, all with the same Q, below --ceiling; the measured figure is at
      least --floor and equals the planned mean the daemons logged (3 decimals; with
      window 0 the delivery is the plan);
  --unreachable: every daemon warns that no exchange_fraction up to the ceiling reaches
      the floor and uses the ceiling; the measured figure is below the floor and equals
      the logged one (the unmet floor is reported, not hidden).

Exit status: 0 PASS, 1 FAIL, 2 usage error. Imports nothing from the project.
"""

from __future__ import annotations

import argparse
import collections
import csv
import glob
import math
import os
import re
import sys
from typing import Dict, List, Tuple

CHOSE = re.compile(r"\[rank (\d+)\]\S* .*epoch (\d+): shuffle\.min_entropy chose exchange_fraction (\S+) "
                   r"\(planned label entropy mean ([0-9.]+)")
UNMET = re.compile(r"\[rank (\d+)\]\S* .*epoch (\d+): no exchange_fraction up to the configured ceiling reaches "
                   r"shuffle\.min_entropy; using (\S+) \(planned label entropy mean ([0-9.]+)\)")


def measured_entropy(trace_dir: str, classes: int) -> Dict[int, float]:
    """epoch -> mean normalised label entropy over the delivered (rank, batch) pairs."""
    labels: Dict[Tuple[int, int, int], List[int]] = collections.defaultdict(list)
    for name in glob.glob(os.path.join(trace_dir, "rank-*.csv")):
        with open(name, newline="", encoding="utf-8", errors="surrogateescape") as f:
            for r in csv.DictReader(f):
                labels[(int(r["epoch"]), int(r["rank"]), int(r["batch"]))].append(int(r["label"]))
    scores: Dict[int, List[float]] = collections.defaultdict(list)
    for (epoch, _, _), batch in labels.items():
        n = len(batch)
        if n < 2 or min(n, classes) < 2:
            continue
        h = -sum(c / n * math.log(c / n) for c in collections.Counter(batch).values())
        scores[epoch].append(h / math.log(min(n, classes)))
    return {e: sum(v) / len(v) for e, v in scores.items()}


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace_dir")
    p.add_argument("--log", required=True, help="the daemons' log")
    p.add_argument("--daemons", type=int, required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--classes", type=int, required=True, help="distinct labels in the dataset (C)")
    p.add_argument("--floor", type=float, required=True, help="shuffle.min_entropy")
    p.add_argument("--ceiling", type=float, required=True, help="shuffle.exchange_fraction")
    p.add_argument("--unreachable", action="store_true", help="the floor is above what the ceiling gives")
    a = p.parse_args(argv)
    with open(a.log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    pattern = UNMET if a.unreachable else CHOSE
    logged: Dict[int, Dict[int, Tuple[float, float]]] = collections.defaultdict(dict)
    for rank, epoch, q, mean in pattern.findall(text):
        logged[int(epoch)][int(rank)] = (float(q), float(mean))
    measured = measured_entropy(a.trace_dir, a.classes)
    problems: List[str] = []
    lines = []
    for e in range(a.epochs):
        choices = set(logged[e].values())
        if len(logged[e]) != a.daemons or len(choices) != 1:
            problems.append("epoch %d: %d of %d daemons logged %s, all alike expected: %s"
                            % (e, len(logged[e]), a.daemons, "that the floor is unreachable" if a.unreachable
                               else "the exchange_fraction the floor chose", sorted(choices)))
            continue
        ((q, planned),) = choices
        got = measured.get(e, float("nan"))
        if a.unreachable:
            if q != a.ceiling:
                problems.append("epoch %d: an unreachable floor used Q = %g, expected the ceiling %g" % (e, q, a.ceiling))
            if not got < a.floor:
                problems.append("epoch %d: delivered entropy %.4f reaches the floor %g said to be unreachable"
                                % (e, got, a.floor))
        else:
            if not q < a.ceiling:
                problems.append("epoch %d: chose Q = %g, not below the ceiling %g (the floor decided nothing)"
                                % (e, q, a.ceiling))
            if not got >= a.floor:
                problems.append("epoch %d: delivered label entropy %.4f is below shuffle.min_entropy %g"
                                % (e, got, a.floor))
        if not abs(got - planned) <= 0.0005 + 1e-9:
            problems.append("epoch %d: delivered label entropy %.4f, the daemons logged %.3f" % (e, got, planned))
        lines.append("epoch %d: Q %g, delivered entropy %.4f (logged %.3f)" % (e, q, got, planned))
    if problems:
        print("min_entropy check: FAIL\n  " + "\n  ".join(problems))
        return 1
    print("min_entropy check: PASS  floor %g%s; %s" % (a.floor, " (unreachable)" if a.unreachable else "",
                                                       "; ".join(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
