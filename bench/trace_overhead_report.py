#!/usr/bin/env python3
"""Tabulates bench/trace_overhead.sh: per pair, the traced and untraced whole-span rates
(delivery_report.whole_span, epochs 1..E-1) and their ratio; then the medians; then the
recording cost measured alone (shardmix-bench-trace-record) as CPU time per second of the
untraced delivery rate: (trainer + daemon ns added per batch) x batches per second.

  trace_overhead_report.py RAW.jsonl OUT.json --samples N --nodes N --provider P --record RECORD.jsonl
"""
import argparse
import json
import statistics

from delivery_report import whole_span


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('raw', help="the runs' JSON lines")
    ap.add_argument('out', help='the summary to write (JSON)')
    for option, kind in (('--samples', int), ('--nodes', int), ('--provider', str)):
        ap.add_argument(option, type=kind, required=True, help='as the script ran')
    ap.add_argument('--record', required=True, help="shardmix-bench-trace-record's JSON line")
    a = ap.parse_args()
    with open(a.record, encoding='utf-8') as f:
        record = json.loads(f.readline())
    with open(a.raw, encoding='utf-8') as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r['epoch'] >= 1]  # epoch 0 includes connection set-up
    pairs = sorted({r['pair'] for r in rows})
    table = []
    for p in pairs:
        on = whole_span([r for r in rows if r['pair'] == p and r['traced'] == 1])
        off = whole_span([r for r in rows if r['pair'] == p and r['traced'] == 0])
        table.append({'pair': p, 'traced_samples_per_s': on['samples_per_s'],
                      'untraced_samples_per_s': off['samples_per_s'],
                      'ratio': on['samples_per_s'] / off['samples_per_s']})
    ratios = [t['ratio'] for t in table]
    result = {'samples': a.samples, 'nodes': a.nodes, 'provider': a.provider, 'pairs': table,
              'median_ratio': statistics.median(ratios), 'min_ratio': min(ratios), 'max_ratio': max(ratios),
              'median_traced_samples_per_s': statistics.median(t['traced_samples_per_s'] for t in table),
              'median_untraced_samples_per_s': statistics.median(t['untraced_samples_per_s'] for t in table)}
    added_ns = (record['trainer_ns_on'] - record['trainer_ns_off']) + (record['daemon_ns_on'] - record['daemon_ns_off'])
    batches_per_s = result['median_untraced_samples_per_s'] / record['batch_size']
    result['record'] = record
    result['recording_ns_per_batch'] = added_ns
    result['recording_core_fraction'] = added_ns * 1e-9 * batches_per_s
    with open(a.out, 'w', encoding='utf-8') as f:
        json.dump(result, f, indent=1)
        f.write('\n')
    print('| pair | traced samples/s | untraced samples/s | traced / untraced |')
    print('|---|---|---|---|')
    for t in table:
        print(f'| {t["pair"] + 1} | {t["traced_samples_per_s"]:,.0f} | {t["untraced_samples_per_s"]:,.0f} '
              f'| {t["ratio"]:.3f} |')
    print(f'\nmedian ratio {result["median_ratio"]:.3f} (min {result["min_ratio"]:.3f}, max {result["max_ratio"]:.3f}); '
          f'median rates: traced {result["median_traced_samples_per_s"]:,.0f}, untraced '
          f'{result["median_untraced_samples_per_s"]:,.0f} samples/s; target: ratio >= 0.97')
    print(f'recording alone: +{added_ns:.0f} ns per batch (trainer {record["trainer_ns_on"] - record["trainer_ns_off"]:.0f}, '
          f'daemon {record["daemon_ns_on"] - record["daemon_ns_off"]:.0f}); at {batches_per_s:,.0f} batches/s that is '
          f'{100 * result["recording_core_fraction"]:.3f}% of one core; writing {record["events"]:,} events took '
          f'{record["write_seconds"]:.2f} s at exit')
    print(f'wrote {a.out}')


if __name__ == '__main__':
    main()
