#!/usr/bin/env python3
"""Checks ShardMix telemetry against what the trainers counted (tests/e2e/telemetry_e2e.sh).

Inputs: the trainers' output (shardmix-consume --json: one 'JSON {...}' line per rank and
epoch), rank 0's stats file (JSON lines), every daemon's final Prometheus textfile, and
shardmix-stat's summary and Prometheus text. Exits 1 naming every disagreement.
"""
import argparse
import collections
import json
import math
import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text, where):
    """Prometheus text format 0.0.4 -> [(name, {labels}, value)]; raises on a bad line."""
    out, typed = [], set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        if line.startswith('# TYPE '):
            typed.add(line.split()[2])
            continue
        if line.startswith('#'):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError(f'{where}:{n}: not a Prometheus sample: {line!r}')
        labels = dict(LABEL.findall(m.group(3) or ''))
        if m.group(1) not in typed:
            raise ValueError(f'{where}:{n}: {m.group(1)} has no # TYPE line before it')
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def close(a, b, absolute, relative):
    return abs(a - b) <= absolute + relative * max(abs(a), abs(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--trainers-log', required=True)
    ap.add_argument('--stats', nargs='+', required=True)
    ap.add_argument('--prom', nargs='+', required=True)
    ap.add_argument('--stat-text')
    ap.add_argument('--stat-prom')
    ap.add_argument('--epochs', type=int, required=True)
    ap.add_argument('--trainers', type=int, required=True)
    ap.add_argument('--nodes', type=int, required=True)
    ap.add_argument('--samples', type=int, required=True)
    a = ap.parse_args()
    problems = []

    trainers = collections.defaultdict(list)  # epoch -> consume records
    for line in open(a.trainers_log, encoding='utf-8', errors='replace'):
        if line.startswith('JSON '):
            r = json.loads(line[5:])
            trainers[r['epoch']].append(r)
    if sorted(trainers) != list(range(a.epochs)) or any(len(v) != a.trainers for v in trainers.values()):
        problems.append(f'trainers reported epochs {sorted(trainers)} with counts '
                        f'{[len(v) for v in trainers.values()]}, expected {a.epochs} x {a.trainers}')

    # ---- stats file
    if len(a.stats) != 1:
        problems.append(f'expected one stats file for the job, found {a.stats}')
    lines = [json.loads(l) for l in open(a.stats[0], encoding='utf-8') if l.strip()]
    # The first line is the job record (shardmix-whatif rebuilds the job from it).
    job = lines.pop(0).get('job') if lines else None
    if not isinstance(job, dict):
        problems.append('stats file: the first line is not the job record {"job": {...}}')
    else:
        if job.get('nodes') != a.nodes or job.get('trainers_per_node') * a.nodes != a.trainers \
                or job.get('samples') != a.samples:
            problems.append(f'job record {job} does not match {a.nodes} nodes, {a.trainers} trainers, {a.samples} samples')
        cfg = job.get('config', {})
        for key in ('batch.size', 'cache.capacity', 'shuffle.exchange_fraction', 'service.prefetch'):
            if key not in cfg:
                problems.append(f'job record has no config key {key}: {cfg}')
        if not (0 < job.get('median_sample_bytes', 0) <= job.get('bytes', 0)):
            problems.append(f'job record sample sizes implausible: {job}')
    by_epoch = {l['epoch']: l for l in lines}
    if sorted(by_epoch) != list(range(a.epochs)) or len(lines) != a.epochs:
        problems.append(f'stats file has epochs {[l["epoch"] for l in lines]}, expected 0..{a.epochs - 1} once each')
    total_stall_trainers = 0.0
    for e, rs in sorted(trainers.items()):
        s = by_epoch.get(e)
        if s is None:
            continue
        want = {k: sum(r[k] for r in rs) for k in ('samples', 'bytes', 'local_samples', 'peer_samples', 'peer_bytes')}
        for k, v in want.items():
            if s[k] != v:
                problems.append(f'epoch {e}: stats file {k} = {s[k]}, trainers counted {v}')
        if not (s['complete'] and s['trainers_reporting'] == a.trainers and s['nodes'] == a.nodes):
            problems.append(f'epoch {e}: not complete with {a.trainers} trainers and {a.nodes} nodes: {s}')
        if s['skipped_samples'] != a.samples - want['samples']:
            problems.append(f'epoch {e}: skipped_samples {s["skipped_samples"]}, expected {a.samples - want["samples"]}')
        stall = sum(r['stall_seconds'] for r in rs)
        total_stall_trainers += stall
        # Both sides time the same waits (client library vs the trainer's own clock): they
        # differ by the loop overhead between the two clocks' reads only (microseconds per
        # batch), so 2 ms per trainer + 2% is generous.
        if not close(s['stall_seconds'], stall, 0.002 * a.trainers, 0.02):
            problems.append(f'epoch {e}: stats file stall {s["stall_seconds"]:.4f} s, trainers measured {stall:.4f} s')
        if stall <= 0 or s['stall_seconds'] <= 0:
            problems.append(f'epoch {e}: no stall measured (the slow peer should cause some)')
        fr = s['tier_local'] + s['tier_peer'] + s['tier_storage']
        if not close(fr, 1.0, 1e-6, 0):
            problems.append(f'epoch {e}: tier fractions sum to {fr}')
        if not close(s['samples_per_second'] * s['seconds'], s['samples'], 1e-3 * s['samples'], 0):
            problems.append(f'epoch {e}: samples_per_second x seconds != samples')
        span = max(r['t_end'] for r in rs) - min(r['t_start'] for r in rs)
        # The daemons see an epoch from the first StartEpoch to the last Release: the
        # trainers' own span, give or take the socket hop and the scheduling of 8 busy
        # processes on 2 cores (a sanity bound, not a timing expectation).
        if not (0 < s['seconds'] <= 1.5 * span + 0.25):
            problems.append(f'epoch {e}: daemons measured {s["seconds"]:.3f} s, longer than the trainers\' span {span:.3f} s')
        q = s['label_entropy_mean']
        if q is None or not (0 < q <= 1) or s['label_entropy_p5_min'] is None or s['label_entropy_p5_min'] > q:
            problems.append(f'epoch {e}: label entropy figures implausible: mean {q}, p5 {s["label_entropy_p5_min"]}')
        if e > 0 and s['affinity'] is None:
            problems.append(f'epoch {e}: no affinity')
        if s['errors_total'] != 0:
            problems.append(f'epoch {e}: {s["errors_total"]} errors')

    # ---- Prometheus textfiles (final state of every daemon)
    if len(a.prom) != a.nodes:
        problems.append(f'{len(a.prom)} Prometheus files, expected {a.nodes}')
    totals = collections.Counter()
    for path in a.prom:
        for name, labels, value in parse_prometheus(open(path, encoding='utf-8').read(), path):
            totals[name] += value
            if name == 'shardmix_serving' and value != 0:
                problems.append(f'{path}: shardmix_serving {value} after exit')
    every = [r for rs in trainers.values() for r in rs]
    for metric, want in (('shardmix_samples_total', sum(r['samples'] for r in every)),
                         ('shardmix_bytes_total', sum(r['bytes'] for r in every)),
                         ('shardmix_peer_bytes_total', sum(r['peer_bytes'] for r in every)),
                         ('shardmix_trainer_epochs_total', len(every))):
        if totals[metric] != want:
            problems.append(f'Prometheus {metric} summed over daemons = {totals[metric]:.0f}, trainers: {want}')
    if not close(totals['shardmix_trainer_stall_seconds_total'], total_stall_trainers, 0.002 * len(every), 0.02):
        problems.append(f'Prometheus stall {totals["shardmix_trainer_stall_seconds_total"]:.4f} s, '
                        f'trainers measured {total_stall_trainers:.4f} s')

    # ---- shardmix-stat, asked by trainer rank 0 while its daemon served
    if a.stat_prom:
        got = parse_prometheus(open(a.stat_prom, encoding='utf-8').read(), a.stat_prom)
        if not any(n == 'shardmix_serving' and v == 1 for n, _, v in got):
            problems.append('shardmix-stat --prometheus: daemon not serving')
    if a.stat_text:
        text = open(a.stat_text, encoding='utf-8').read()
        for needle in ('shardmixd node 0 of 2', 'delivered:', 'waiting:'):
            if needle not in text:
                problems.append(f'shardmix-stat summary lacks {needle!r}:\n{text}')

    if problems:
        print('telemetry check: FAIL\n  ' + '\n  '.join(problems))
        return 1
    last = by_epoch[a.epochs - 1]
    print(f'telemetry check: PASS  {a.epochs} epochs; last: {last["samples"]} samples, '
          f'{last["samples_per_second"]:.0f} samples/s, stall {last["stall_seconds"]:.3f} s '
          f'(trainers: {sum(r["stall_seconds"] for r in trainers[a.epochs - 1]):.3f} s); '
          f'Prometheus totals agree over {a.nodes} daemons')
    return 0


if __name__ == '__main__':
    sys.exit(main())
