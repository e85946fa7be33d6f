#!/usr/bin/python3
"""shardmix-report on a small stats file: prints one summary row per epoch and writes a PNG
of the expected size; refuses a file that is not JSON lines. Skips (77) without matplotlib."""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import matplotlib  # noqa: F401
except ImportError:
    print('python3-matplotlib is not installed: skipped')
    sys.exit(77)

report = sys.argv[1]
line = {"epoch": 0, "complete": True, "nodes": 2, "trainers": 4, "trainers_reporting": 4, "t_start": 1.0,
        "t_end": 2.0, "seconds": 1.0, "batches": 76, "samples": 600, "bytes": 10817444,
        "samples_per_second": 600.0, "gb_per_second": 0.0108, "stall_seconds": 0.24, "stall_seconds_max": 0.09,
        "stall_fraction": 0.06, "fetch_wait_seconds": 0.9, "local_samples": 288, "peer_samples": 312,
        "storage_samples": 0, "peer_bytes": 5664519, "tier_local": 0.48, "tier_peer": 0.52, "tier_storage": 0,
        "exchange_fraction": 1, "window": 0, "substituted_samples": 0, "batches_scored": 76,
        "label_entropy_mean": 0.797, "label_entropy_p5_min": 0.52, "affinity": None, "errors_total": 0,
        "skipped_samples": 0}
with tempfile.TemporaryDirectory() as d:
    stats = os.path.join(d, 'stats.jsonl')
    with open(stats, 'w') as f:
        # A job's first line is its job record (server/telemetry.h JobRecord): skipped here.
        f.write(json.dumps({"job": {"version": 1, "nodes": 2, "trainers_per_node": 1, "samples": 600,
                                    "config": {"batch.size": "8"}}}) + '\n')
        for e in range(3):
            f.write(json.dumps(dict(line, epoch=e, affinity=None if e == 0 else 0.25)) + '\n')
    out = subprocess.run([report, stats], capture_output=True, text=True, check=True).stdout
    rows = [l for l in out.splitlines() if l.split() and l.split()[0].isdigit()]
    assert len(rows) == 3, out
    assert rows[0].split()[13] == '-' and rows[1].split()[13] == '0.250', out  # affinity column
    png = os.path.join(d, 'stats.png')
    with open(png, 'rb') as f:
        head = f.read(24)
    assert head[:8] == b'\x89PNG\r\n\x1a\n', head
    width, height = struct.unpack('>II', head[16:24])
    assert (width, height) == (990, 630), (width, height)  # 11 x 7 in at 90 dpi
    with open(os.path.join(d, 'bad.jsonl'), 'w') as f:
        f.write('not json\n')
    bad = subprocess.run([report, os.path.join(d, 'bad.jsonl')], capture_output=True, text=True)
    assert bad.returncode != 0 and 'not JSON' in bad.stderr, bad
print('shardmix-report: PASS')
