#!/usr/bin/env python3
"""Audits a merged sample-journey trace (shardmix-trace merge) against the trainers' own
record of what they received (shardmix-consume --trace CSVs).

  check_timeline.py MERGED.json CSV_DIR --epochs E --trainers T --nodes N [--sample-fraction F]

Checks, exiting 1 with every failure listed:
  - each trainer's holds carry exactly the sample ids its CSV lists for that epoch and
    batch; with --sample-fraction 1 every batch is there, with less, exactly the batches
    the sampling hash keeps (the same rule as common/trace.cc) and no other;
  - so every delivered sample appears exactly once per epoch in the trace;
  - each hold is preceded by its own wait, and a trainer's waits and holds never overlap;
  - every peer read ends no earlier than it was posted, reads another daemon, carries
    bytes and samples, and per epoch the peer reads carry as many samples as the trainers
    received from peers (tier peer in the CSVs), daemon by daemon, and as many storage reads
    as they received samples from storage; with less than 1, reads only of kept batches;
  - storage reads and staging waits have non-negative durations (--expect-staging-waits:
    every daemon has some); a daemon's staging waits
    of one trainer slot never overlap; counters are never negative and (unsampled) every
    peer's reads in flight end at 0;
  - every process is named, as is every track that has events.
"""
import argparse
import collections
import csv
import glob
import json
import os
import sys

EPS_US = 0.002  # timestamps are written with nanosecond digits; allow float rounding


def mix(x):
    """splitmix64's finaliser, as common/trace.cc's mix()."""
    m = (1 << 64) - 1
    x = (x + 0x9e3779b97f4a7c15) & m
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & m
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & m
    return x ^ (x >> 31)


def keep(epoch, trainer, batch, fraction):
    """common/trace.cc's keep(): the batches a trace with this sample fraction records."""
    if fraction >= 1.0:
        return True
    if fraction <= 0.0:
        return False
    h = mix(mix(mix(epoch) ^ trainer) ^ batch)
    return float(h >> 11) < fraction * 9007199254740992.0


def read_csvs(csv_dir):
    """{(epoch, rank, batch): [sample ids in order]} and [(epoch, rank, tier)] of every delivered sample."""
    batches = collections.defaultdict(list)
    tier_rows = []  # (epoch, rank, tier) per delivered sample
    files = sorted(glob.glob(os.path.join(csv_dir, 'rank-*.csv')))
    if not files:
        sys.exit(f'check_timeline: no rank-*.csv in {csv_dir}')
    for path in files:
        with open(path, newline='', encoding='utf-8') as f:
            for row in csv.DictReader(f):
                key = (int(row['epoch']), int(row['rank']), int(row['batch']))
                batches[key].append(int(row['sample_id']))
                tier_rows.append((int(row['epoch']), int(row['rank']), row['tier']))
    return batches, tier_rows


def check(trace, csv_dir, epochs, trainers, nodes, per_node, fraction, expect_staging_waits=False):
    failures = []
    fail = failures.append
    events = trace['traceEvents']
    process = {}
    threads = set()
    for e in events:
        if e.get('ph') == 'M' and e.get('name') == 'process_name':
            process[e['pid']] = e['args']['name']
        if e.get('ph') == 'M' and e.get('name') == 'thread_name':
            threads.add((e['pid'], e['tid']))
    trainer_pid = {1_000_000 + r: r for r in range(trainers)}
    daemon_pid = {1 + n: n for n in range(nodes)}
    for pid in list(trainer_pid) + list(daemon_pid):
        if pid not in process:
            fail(f'no process_name for pid {pid} (a missing trace file?)')
    for e in events:
        if e.get('ph') in ('X', 'b', 'e', 'i') and (e['pid'], e['tid']) not in threads:
            fail(f'event {e.get("name")} on pid {e["pid"]} tid {e["tid"]}, a track with no thread_name')
            break

    # ---- trainers: waits and holds
    holds = {}   # (epoch, rank, batch) -> ids
    spans = collections.defaultdict(list)  # rank -> [(ts, end, kind, epoch, batch)]
    for e in events:
        if e.get('ph') != 'X' or e['pid'] not in trainer_pid or e['name'] not in ('wait for batch', 'hold batch'):
            continue  # (a trainer's checkpoint saves have a track of their own)
        rank = trainer_pid[e['pid']]
        a = e['args']
        key = (a['epoch'], rank, a['batch'])
        if e['dur'] < 0:
            fail(f'trainer {rank} {e["name"]} of epoch {key[0]} batch {key[2]} has negative duration')
        spans[rank].append((e['ts'], e['ts'] + e['dur'], e['name'], a['epoch'], a['batch']))
        if e['name'] == 'hold batch':
            if key in holds:
                fail(f'trainer {rank} holds epoch {key[0]} batch {key[2]} twice')
            holds[key] = a['samples']
            if len(a['samples']) != a['size']:
                fail(f'trainer {rank} epoch {key[0]} batch {key[2]}: {len(a["samples"])} ids for {a["size"]} samples')
    for rank, items in spans.items():
        items.sort()
        waited = set()
        for (t0, t1, name, ep, b), nxt in zip(items, items[1:] + [None]):
            if nxt is not None and t1 > nxt[0] + EPS_US:
                fail(f'trainer {rank}: {name} (epoch {ep} batch {b}, ends {t1}) overlaps {nxt[2]} '
                     f'(epoch {nxt[3]} batch {nxt[4]}, starts {nxt[0]})')
            if name == 'wait for batch':
                waited.add((ep, b))
            elif (ep, b) not in waited:
                fail(f'trainer {rank}: hold of epoch {ep} batch {b} with no wait for it before')

    batches, tier_rows = read_csvs(csv_dir)
    for key, ids in batches.items():
        epoch, rank, batch = key
        if epoch >= epochs:
            continue
        kept = keep(epoch, rank, batch, fraction)
        if kept and key not in holds:
            fail(f'trainer {rank} epoch {epoch} batch {batch}: delivered ({len(ids)} samples) but not in the trace')
        elif not kept and key in holds:
            fail(f'trainer {rank} epoch {epoch} batch {batch}: in the trace although the sampling drops it')
        elif kept and holds[key] != ids:
            missing = sorted(set(ids) - set(holds[key]))[:5]
            extra = sorted(set(holds[key]) - set(ids))[:5]
            fail(f'trainer {rank} epoch {epoch} batch {batch}: the trace holds {len(holds[key])} ids, the trainer '
                 f'received {len(ids)}; missing {missing}, extra {extra}'
                 + ('' if missing or extra else ', order differs'))
    for key in holds:
        if key not in batches:
            fail(f'trainer {key[1]} epoch {key[0]} batch {key[2]}: in the trace but the trainer lists no such batch')
    for epoch in range(epochs):
        seen = collections.Counter(i for (ep, _, _), ids in holds.items() if ep == epoch for i in ids)
        twice = [i for i, c in seen.items() if c > 1]
        if twice:
            fail(f'epoch {epoch}: {len(twice)} samples held more than once, e.g. {twice[:5]}')
        if fraction >= 1.0:
            delivered = sum(len(ids) for (ep, _, _), ids in batches.items() if ep == epoch)
            if sum(seen.values()) != delivered:
                fail(f'epoch {epoch}: the trace holds {sum(seen.values())} samples, the trainers received {delivered}')

    # ---- daemons: peer reads, storage reads, staging waits, counters
    begins = {}
    peer_samples = collections.Counter()  # (epoch, node) -> samples read from peers for its trainers
    kept_peer_rows = collections.Counter()
    kept_storage_rows = collections.Counter()
    storage_samples = collections.Counter()
    for epoch, rank, tier in tier_rows:
        if tier == 'peer':
            kept_peer_rows[(epoch, rank // per_node)] += 1
        elif tier == 'storage':
            kept_storage_rows[(epoch, rank // per_node)] += 1
    staging = collections.defaultdict(list)
    counters = collections.defaultdict(list)
    for e in events:
        ph, pid = e.get('ph'), e['pid']
        if pid not in daemon_pid:
            continue
        node = daemon_pid[pid]
        if ph == 'b':
            a = e['args']
            begins[(pid, e['id'])] = e
            if a['peer'] == node or not 0 <= a['peer'] < nodes:
                fail(f'daemon {node}: a peer read of node {a["peer"]}')
            if a['bytes'] <= 0 or a['samples'] <= 0:
                fail(f'daemon {node}: a peer read of {a["bytes"]} bytes, {a["samples"]} samples')
        elif ph == 'e':
            b = begins.pop((pid, e['id']), None)
            if b is None:
                fail(f'daemon {node}: read completion {e["id"]} without its post')
                continue
            if e['ts'] + EPS_US < b['ts']:
                fail(f'daemon {node}: read {e["id"]} completed at {e["ts"]} before its post at {b["ts"]}')
            a = b['args']
            if a['epoch'] < epochs:
                peer_samples[(a['epoch'], node)] += a['samples']
            if not keep(a['epoch'], a['trainer'], a['batch'], fraction):
                fail(f'daemon {node}: a peer read of epoch {a["epoch"]} trainer {a["trainer"]} batch {a["batch"]}, '
                     'a batch the sampling drops')
        elif ph == 'X':
            if e['dur'] < 0:
                fail(f'daemon {node}: {e["name"]} with negative duration')
            if e['name'] == 'wait for staging space':
                staging[(node, e['tid'])].append((e['ts'], e['ts'] + e['dur']))
            if e['name'] == 'storage read':
                a = e['args']
                if a['epoch'] < epochs:
                    storage_samples[(a['epoch'], node)] += 1
                if not keep(a['epoch'], a['trainer'], a['batch'], fraction):
                    fail(f'daemon {node}: a storage read of a batch the sampling drops')
        elif ph == 'C':
            value = next(iter(e['args'].values()))
            counters[(node, e['name'])].append((e['ts'], value))
            if value < 0:
                fail(f'daemon {node}: counter {e["name"]} is {value} at {e["ts"]}')
    for key, b in begins.items():
        fail(f'daemon {daemon_pid[key[0]]}: peer read {key[1]} posted at {b["ts"]} never completed')
    if expect_staging_waits:
        for node in range(nodes):
            if not any(n == node for n, _ in staging):
                fail(f'daemon {node}: no staging wait traced, although staging cannot hold what is staged ahead')
    for (node, tid), items in staging.items():
        items.sort()
        for (t0, t1), (u0, _) in zip(items, items[1:]):
            if t1 > u0 + EPS_US:
                fail(f'daemon {node} track {tid}: staging waits overlap ({t0}..{t1} and {u0}..)')
    for (node, name), values in counters.items():
        values.sort()
        # Sampled, a counter is recorded only at kept batches' events: its last point need not be the end.
        if fraction >= 1.0 and name.startswith('reads in flight') and values[-1][1] != 0:
            fail(f'daemon {node}: {name} ends at {values[-1][1]}, not 0')
    if fraction >= 1.0:
        for key in sorted(set(peer_samples) | set(kept_peer_rows)):
            if peer_samples[key] != kept_peer_rows[key]:
                fail(f'epoch {key[0]} node {key[1]}: peer reads carried {peer_samples[key]} samples, its trainers '
                     f'received {kept_peer_rows[key]} from peers')
        for key in sorted(set(storage_samples) | set(kept_storage_rows)):
            if storage_samples[key] != kept_storage_rows[key]:
                fail(f'epoch {key[0]} node {key[1]}: {storage_samples[key]} storage reads traced, its trainers '
                     f'received {kept_storage_rows[key]} samples from storage')
    return failures, len(holds), sum(peer_samples.values()), sum(storage_samples.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('merged')
    ap.add_argument('csv_dir')
    ap.add_argument('--epochs', type=int, required=True)
    ap.add_argument('--trainers', type=int, required=True)
    ap.add_argument('--nodes', type=int, required=True)
    ap.add_argument('--sample-fraction', type=float, default=1.0)
    ap.add_argument('--expect-staging-waits', action='store_true',
                    help='fail unless every daemon traced a wait for staging space')
    a = ap.parse_args()
    with open(a.merged, encoding='utf-8') as f:
        trace = json.load(f)
    failures, holds, peer, storage = check(trace, a.csv_dir, a.epochs, a.trainers, a.nodes, a.trainers // a.nodes,
                                  a.sample_fraction, a.expect_staging_waits)
    if failures:
        for line in failures[:40]:
            print(f'FAIL: {line}')
        if len(failures) > 40:
            print(f'FAIL: ... and {len(failures) - 40} more')
        sys.exit(1)
    print(f'check_timeline: OK: {holds} batches held, {peer} samples in peer reads, {storage} storage reads; every '
          f'delivered sample of a kept batch traced exactly once per epoch')


if __name__ == '__main__':
    main()
