#!/usr/bin/env python3
"""Exactly-once oracle for a checkpointed and resumed ShardMix job.

A job's trainers ran part of epoch E, saved checkpoints and died (traces in BEFORE, written
by `shardmix-consume --trace`); a second job resumed and ran epoch E to its end and then
--later further epochs (traces in AFTER), with the same number of trainers (each restored
its own checkpoint) or with another (--redealt: the daemons re-dealt the rest of E).

Checks, from the traces and the dataset on disk only (the dataset walk, labels and XXH64
come from check_traces.py, the project's other referee; nothing from the project itself):
  * epoch E: every sample of the dataset exactly once over BEFORE and AFTER together;
    bytes, xxh64 and label equal to the file; BEFORE covers some but not all of it (else
    the test provoked nothing);
  * same world size: for each rank, BEFORE holds batches 0..k-1 and AFTER k..nb-1, each
    once, and nb is the same for every rank;
  * --redealt: in AFTER every new rank has the same number of batches, numbered 0..;
  * every batch has at most B samples, positions 0..size-1;
  * each later epoch in AFTER: every sample exactly once, equal batch counts numbered 0...
An empty last batch leaves no row in a trace, so run shapes without them (N not leaving
fewer samples than trainers in the last step), as check_traces.py does.
Exit status: 0 PASS, 1 FAIL, 2 usage error.
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import sys
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_traces import HEADER, Row, hash_files, scan_dataset  # noqa: E402


def load(trace_dir: str, trainers: int, problems: List[str]) -> List[Row]:
    rows: List[Row] = []
    for r in range(trainers):
        path = os.path.join(trace_dir, "rank-%d.csv" % r)
        if not os.path.exists(path):
            problems.append("%s: missing (trainer rank %d)" % (path, r))
            continue
        with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
            reader = csv.reader(f)
            if next(reader, None) != HEADER:
                problems.append("%s: bad header" % path)
                continue
            for fields in reader:
                rows.append(Row(fields, "%s:%d" % (path, reader.line_num)))
    for name in os.listdir(trace_dir):
        if name.startswith("rank-") and name.endswith(".csv"):
            stem = name[5:-4]
            if not stem.isdigit() or int(stem) >= trainers:
                problems.append("%s/%s: a trace of a rank outside 0..%d" % (trace_dir, name, trainers - 1))
    return rows


def batches_of(rows: List[Row]) -> Dict[int, Dict[int, List[Row]]]:
    out: Dict[int, Dict[int, List[Row]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        out[r.rank][r.batch].append(r)
    return out


def check_batches(what: str, by_rank: Dict[int, Dict[int, List[Row]]], B: int, problems: List[str]) -> None:
    for rank, batches in by_rank.items():
        for b, members in batches.items():
            positions = sorted(m.position for m in members)
            if positions != list(range(len(members))):
                problems.append("%s rank %d batch %d: positions %s" % (what, rank, b, positions[:20]))
            if len(members) > B:
                problems.append("%s rank %d batch %d: %d samples > batch size %d" % (what, rank, b, len(members), B))


def check_once(what: str, rows: List[Row], files, problems: List[str]) -> None:
    seen = collections.Counter(r.path for r in rows)
    for path, n in seen.items():
        if path not in files:
            problems.append("%s: %r is not a sample of the dataset" % (what, path))
        elif n > 1:
            problems.append("%s: %r delivered %d times" % (what, path, n))
    missing = [p for p in files if p not in seen]
    if missing:
        problems.append("%s: %d samples never delivered, e.g. %r" % (what, len(missing), sorted(missing)[:3]))
    for r in rows:
        info = files.get(r.path)
        if info is None:
            continue
        if r.nbytes != info.size or r.xxh64 != info._xxh or r.label != info.label:
            problems.append("%s %s: %r has %d bytes xxh64 %s label %d, the file %d bytes xxh64 %s label %d"
                            % (what, r.where, r.path, r.nbytes, r.xxh64, r.label, info.size, info._xxh, info.label))


def equal_counts(what: str, by_rank: Dict[int, Dict[int, List[Row]]], trainers: int, problems: List[str]) -> None:
    counts = {rank: len(by_rank.get(rank, {})) for rank in range(trainers)}
    if len(set(counts.values())) > 1:
        problems.append("%s: unequal batch counts per rank %s" % (what, counts))
    for rank in range(trainers):
        nums = sorted(by_rank.get(rank, {}))
        if nums != list(range(len(nums))):
            problems.append("%s rank %d: batches numbered %s, expected 0..%d" % (what, rank, nums[:20], len(nums) - 1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True)
    p.add_argument("--epoch", type=int, required=True, help="the checkpointed epoch E")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--before", required=True, help="trace dir of the job that checkpointed")
    p.add_argument("--before-trainers", type=int, required=True)
    p.add_argument("--after", required=True, help="trace dir of the resumed job")
    p.add_argument("--after-trainers", type=int, required=True)
    p.add_argument("--redealt", action="store_true", help="the resumed job had another number of trainers")
    p.add_argument("--later", type=int, default=0, help="epochs after E in AFTER")
    a = p.parse_args(argv)
    if not a.redealt and a.before_trainers != a.after_trainers:
        print("check_resume: different trainer counts need --redealt", file=sys.stderr)
        return 2
    try:
        _, files = scan_dataset(a.dataset)
    except OSError as e:
        print("check_resume: cannot read the dataset: %s" % e, file=sys.stderr)
        return 2
    hash_files(list(files.values()))
    problems: List[str] = []
    before = load(a.before, a.before_trainers, problems)
    after = load(a.after, a.after_trainers, problems)
    E = a.epoch
    for r in before:
        if r.epoch != E:
            problems.append("%s: epoch %d in the checkpointed job, expected only %d" % (r.where, r.epoch, E))
    before_e = [r for r in before if r.epoch == E]
    after_e = [r for r in after if r.epoch == E]
    if not 0 < len(before_e) < len(files):
        problems.append("the checkpointed job delivered %d of %d samples of epoch %d: nothing was provoked"
                        % (len(before_e), len(files), E))
    check_once("epoch %d (both jobs)" % E, before_e + after_e, files, problems)
    b_before, b_after = batches_of(before_e), batches_of(after_e)
    check_batches("epoch %d before" % E, b_before, a.batch_size, problems)
    check_batches("epoch %d after" % E, b_after, a.batch_size, problems)
    if a.redealt:
        equal_counts("epoch %d after (re-dealt)" % E, b_after, a.after_trainers, problems)
    else:
        totals = {}
        for rank in range(a.after_trainers):
            first, second = sorted(b_before.get(rank, {})), sorted(b_after.get(rank, {}))
            k = len(first)
            if first != list(range(k)):
                problems.append("epoch %d rank %d: the checkpointed job's batches %s are not 0..%d" % (E, rank, first, k - 1))
            if second and second != list(range(k, k + len(second))):
                problems.append("epoch %d rank %d: resumed batches %s do not continue at %d"
                                % (E, rank, second[:10], k))
            totals[rank] = k + len(second)
        if len(set(totals.values())) > 1:
            problems.append("epoch %d: ranks have unequal batch counts over both jobs %s" % (E, totals))
    for e in range(E + 1, E + 1 + a.later):
        rows = [r for r in after if r.epoch == e]
        check_once("epoch %d" % e, rows, files, problems)
        by_rank = batches_of(rows)
        check_batches("epoch %d" % e, by_rank, a.batch_size, problems)
        equal_counts("epoch %d" % e, by_rank, a.after_trainers, problems)
    extra = [r for r in after if not E <= r.epoch <= E + a.later]
    if extra:
        problems.append("%s: epoch %d outside %d..%d" % (extra[0].where, extra[0].epoch, E, E + a.later))
    print("check_resume: epoch %d: %d samples before the checkpoint (%d trainers), %d after (%d trainers%s); "
          "%d later epoch(s)" % (E, len(before_e), a.before_trainers, len(after_e), a.after_trainers,
                                 ", re-dealt" if a.redealt else "", a.later))
    if problems:
        for m in problems[:15]:
            print("  FAIL: " + m)
        print("check_resume: FAIL (%d problems)" % len(problems))
        return 1
    print("check_resume: PASS (every sample of epoch %d exactly once across both jobs)" % E)
    return 0


if __name__ == "__main__":
    sys.exit(main())
