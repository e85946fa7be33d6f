#!/usr/bin/env python3
"""Figures and tables of bench/storage.sh (slow shared storage).

    python3 bench/storage_report.py [bench/results/storage-latest.json]     # tables again
    python3 bench/storage_report.py --raw RAW.jsonl --out OUT.json --meta '{...}'  # (storage.sh)

An epoch's rate is all ranks' samples over the wall-clock span from the first rank's start
to the last one's end; figures are medians over the middle epochs (1 .. E-2) of every run,
with min-max (epoch_rates says why the first and the last are left out).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import epoch_span, machine, stats, utc_now  # noqa: E402


def med(xs):
    return statistics.median(xs) if xs else None


def epoch_rates(rows):
    """Rates of the middle epochs (1 .. E-2) of every run, and of the first and last apart.

    Epoch 0 warms up (start-up, connections). The last epoch is left out too: a storage
    tier that reads ahead across the epoch boundary can have part of the last epoch's cold
    reads done during the one before it, and the run ends before it pays for the next
    epoch's read-ahead, so the last epoch can look faster than storage allows (measured:
    4,446 samples/s against a bound of 2,922 with service.cold_readahead_batches = 24).
    """
    groups = {}
    for r in rows:
        groups.setdefault((r["run"], r["epoch"]), []).append(r)
    last_of = {}
    for run, epoch in groups:
        last_of[run] = max(last_of.get(run, 0), epoch)
    sps, mbps, first, last, stall, per_epoch = [], [], [], [], [], []
    for (run, epoch), ranks in sorted(groups.items()):
        span = epoch_span(ranks)
        s = sum(x["samples"] for x in ranks) / span
        b = sum(x["bytes"] for x in ranks) / span / 1e6
        per_epoch.append({"run": run, "epoch": epoch, "samples_per_s": s, "mb_per_s": b, "seconds": span})
        if epoch == 0:
            first.append(s)
            continue
        if epoch == last_of[run]:
            last.append(s)
            continue
        sps.append(s)
        mbps.append(b)
        if all("stall_seconds" in x for x in ranks):
            stall.append(statistics.mean(x["stall_seconds"] for x in ranks) / span)
    samples = statistics.median([sum(x["samples"] for x in g) for g in groups.values()]) if groups else None
    # Per run, the middle epochs taken together (their samples over the span from the first
    # one's start to the last one's end): evens out read-ahead moving work between epochs.
    runs = []
    for run, last_epoch in sorted(last_of.items()):
        mid = [x for (r, e), g in groups.items() if r == run and 1 <= e < last_epoch for x in g]
        if mid:
            runs.append(sum(x["samples"] for x in mid) / epoch_span(mid))
    return {"samples_per_s": stats(sps), "mb_per_s": stats(mbps), "run_samples_per_s": stats(runs),
            "epoch0_samples_per_s": med(first),
            "last_epoch_samples_per_s": med(last), "stall_fraction": med(stall), "samples_per_epoch": samples,
            "per_epoch": per_epoch, "loads": sorted({x.get("load", "") for x in rows})}


def cold_bytes_of(cold_rows, epochs):
    """Cold bytes per epoch as the daemons report them: the sum of their cold samples' bytes
    (logged at start; the resident set is static), and the bytes their storage readers read
    over the run divided by the epochs (logged at exit), if every daemon reported."""
    exact = [r["cold_bytes"] for r in cold_rows if r["daemons_reporting"] > 0]
    read = [r["storage_read_bytes"] / epochs for r in cold_rows if r["daemons_reporting_reads"] > 0]
    return (med(exact), med(read), med([r["cold_samples"] for r in cold_rows if r["daemons_reporting"] > 0]))


def build(raw_path, meta):
    rows = [json.loads(l) for l in open(raw_path) if l.strip()]
    res = {"date": utc_now(), "machine": machine(), **meta}  # meta's date: the run's end
    lat = [r for r in rows if r["kind"] == "check_latency"]
    bw = [r for r in rows if r["kind"] == "check_bandwidth"]
    check = {}
    # "applied": never faster than set (the emulator's promise); a slower figure is the
    # machine (2 shared cores), reported as achieved.
    if lat:
        check["latency_ms_median"] = lat[0]["latency_ms_median"]
        check["latency_ms_min"] = lat[0]["latency_ms_min"]
        check["latency_applied"] = lat[0]["latency_ms_min"] >= 0.99 * meta["latency_ms"]
        check["latency_median_within_25pct"] = lat[0]["latency_ms_median"] <= 1.25 * meta["latency_ms"] + 0.25
    if bw:
        check["bandwidth_mbps"] = bw[0]["mbps"]
        check["bandwidth_cap_applied"] = bw[0]["mbps"] <= 1.05 * meta["bandwidth_mbps"]
        check["bandwidth_achieved_fraction"] = bw[0]["mbps"] / meta["bandwidth_mbps"]
    res["slowfs_check"] = check
    res["slowfs_stats"] = [r for r in rows if r["kind"] == "slowfs"]
    res["failed"] = [r for r in rows if r["kind"] == "failed"]

    bound_rows = [r for r in rows if r["kind"] == "bound"]
    res["bound_read"] = {"mb_per_s": stats([r["mbps"] for r in bound_rows]),
                         "threads": meta["readers"], "bytes": med([r["bytes"] for r in bound_rows]),
                         "files": med([r["files"] for r in bound_rows]),
                         "loads": [r["load"] for r in bound_rows]}

    epochs = [r for r in rows if r["kind"] == "epoch"]
    telemetry = [r for r in rows if r["kind"] == "telemetry"]
    sm = {}
    for mode in ("ordered", "opportunistic"):
        mine = [r for r in epochs if r.get("bench") == "shardmix" and r["mode"] == mode]
        if mine:
            sm[mode] = epoch_rates(mine)
            sm[mode]["window"] = mine[0]["window"]
            cb, read, cs = cold_bytes_of([r for r in rows if r["kind"] == "shardmix_cold" and r["mode"] == mode],
                                         meta["epochs"])
            sm[mode]["cold_bytes_reported"] = cb
            sm[mode]["cold_samples_reported"] = cs
            sm[mode]["storage_read_bytes_per_epoch"] = read
            tel = [t for t in telemetry if t["mode"] == mode and t.get("epoch", 0) >= 1]
            sm[mode]["telemetry_tier_storage"] = med([t["tier_storage"] for t in tel if t.get("tier_storage") is not None])
            sm[mode]["telemetry_stall_fraction"] = med([t["stall_fraction"] for t in tel if t.get("stall_fraction") is not None])
    res["shardmix"] = sm
    torch = {}
    for w in sorted({r["workers"] for r in epochs if r.get("bench") == "torch"}):
        torch[str(w)] = epoch_rates([r for r in epochs if r.get("bench") == "torch" and r["workers"] == w])
    res["torch"] = torch
    best = max(torch, key=lambda k: torch[k]["samples_per_s"]["median"] or 0) if torch else None
    res["torch_best_workers"] = int(best) if best else None

    # The bound: the cold bytes ShardMix reported (else the expected ones) at the measured rate.
    reported = [v["cold_bytes_reported"] for v in sm.values() if v.get("cold_bytes_reported")]
    cold = med(reported) if reported else meta["cold_bytes_expected"]
    res["cold_bytes"] = cold
    res["cold_bytes_source"] = ("the daemons' cold samples (their start-up log)" if reported
                                else "expected: total - nodes x cache.capacity (ShardMix not measured)")
    total = meta["total_bytes"]
    res["total_to_cold"] = total / cold
    b = res["bound_read"]["mb_per_s"]
    n = meta["samples"]
    if b["median"]:
        res["bound_samples_per_s"] = {k: n / (cold / (b[k] * 1e6)) for k in ("median", "min", "max")}
        res["bound_seconds_per_epoch"] = cold / (b["median"] * 1e6)
        res["all_from_storage_samples_per_s"] = n / (total / (b["median"] * 1e6))
    ratios = {}
    for mode, v in sm.items():
        s = v["samples_per_s"]["median"]
        if s and b["median"]:
            ratios[f"{mode}_vs_bound"] = s / res["bound_samples_per_s"]["median"]
        if s and best:
            ratios[f"{mode}_vs_torch"] = s / torch[best]["samples_per_s"]["median"]
        rs = v.get("run_samples_per_s", {}).get("median")
        if rs and b["median"]:
            ratios[f"{mode}_run_span_vs_bound"] = rs / res["bound_samples_per_s"]["median"]
        if rs and best and torch[best]["run_samples_per_s"]["median"]:
            ratios[f"{mode}_run_span_vs_torch"] = rs / torch[best]["run_samples_per_s"]["median"]
    if best and b["median"]:
        ratios["torch_vs_all_from_storage"] = torch[best]["samples_per_s"]["median"] / res["all_from_storage_samples_per_s"]
        # The ceiling of the DataLoader ratio: what a reader of only the cold bytes scores at
        # 100% of the bound. When the DataLoader itself runs at its own bound (every byte at the
        # storage's rate), this equals total / cold, so the target can at most be tied.
        ratios["bound_vs_torch"] = res["bound_samples_per_s"]["median"] / torch[best]["samples_per_s"]["median"]
        trs = torch[best].get("run_samples_per_s", {}).get("median")
        if trs:
            ratios["bound_vs_torch_run_span"] = res["bound_samples_per_s"]["median"] / trs
    res["ratios"] = ratios
    res["targets"] = {"shardmix_vs_bound": 0.8, "shardmix_vs_torch": res["total_to_cold"]}
    return res


def fmt_r(x, digits=0):
    if not x or x.get("median") is None:
        return "not measured"
    f = f"{{:.{digits}f}}"
    return f"{f.format(x['median'])} ({f.format(x['min'])}-{f.format(x['max'])})"


def print_tables(res):
    print(f"Slow storage (bench/storage.sh), {res['date']}, {res['machine']}: {res['samples']} samples, "
          f"median {res['median_kib']} KiB, {res['total_bytes'] / 1e9:.2f} GB; {res['nodes']} nodes x cache.capacity "
          f"{res['capacity_per_node'] / 1e6:.0f} MB = half the dataset; slowfs {res['latency_ms']} ms per read, "
          f"{res['bandwidth_mbps']} MB/s cap; {res['epochs']} epochs x {res['repeat']} run(s), medians of the middle epochs "
          f"1..{res['epochs'] - 2} of every run (min-max; epoch 0 warms up, the last drains). Command: `{res['command']}`.")
    c = res.get("slowfs_check", {})
    if c:
        print()
        print(f"slowfs check: 1 thread, 4 KiB reads: latency min {c.get('latency_ms_min', float('nan')):.2f} ms, "
              f"median {c.get('latency_ms_median', float('nan')):.2f} ms (set {res['latency_ms']} ms: "
              f"{'applied' if c.get('latency_applied') else 'NOT APPLIED'}); 16 threads, whole files: "
              f"{c.get('bandwidth_mbps', float('nan')):.0f} MB/s (cap {res['bandwidth_mbps']} MB/s: "
              f"{'applied' if c.get('bandwidth_cap_applied') else 'EXCEEDED'}, "
              f"{c.get('bandwidth_achieved_fraction', float('nan')):.0%} of it reached).")
    print()
    print("| what | samples/s | MB/s | epoch 0 samples/s | last epoch samples/s | load average at the phase's start |")
    print("|---|---|---|---|---|---|")
    br = res["bound_read"]
    if res.get("bound_samples_per_s"):
        bs = res["bound_samples_per_s"]
        print(f"| storage bound: {res['cold_bytes'] / 1e6:.0f} MB cold per epoch at the rate of {br['threads']} "
              f"threads ({fmt_r(br['mb_per_s'])} MB/s) | {bs['median']:.0f} ({bs['min']:.0f}-{bs['max']:.0f}) "
              f"| - | - | - | {'; '.join(br['loads'])} |")
    for mode, v in res["shardmix"].items():
        print(f"| ShardMix, {mode} (W = {v['window']}) | {fmt_r(v['samples_per_s'])} | {fmt_r(v['mb_per_s'])} "
              f"| {v['epoch0_samples_per_s'] or 0:.0f} | {v['last_epoch_samples_per_s'] or 0:.0f} | {'; '.join(v['loads'])} |")
    if not res["shardmix"]:
        print("| ShardMix | not measured | | | | |")
    notes = []
    for mode, v in res["shardmix"].items():
        def mb(x):
            return f"{x / 1e6:.0f} MB" if x else "?"
        def pc(x):
            return f"{x:.0%}" if x is not None else "?"
        notes.append(f"ShardMix {mode}: {v.get('cold_samples_reported') or '?'} cold samples, "
                     f"{mb(v.get('cold_bytes_reported'))} per epoch (the daemons' logs); their storage readers read "
                     f"{mb(v.get('storage_read_bytes_per_epoch'))} per epoch on average (epoch 0 included); "
                     f"storage tier {pc(v.get('telemetry_tier_storage'))} of the samples; trainers stalled "
                     f"{pc(v.get('stall_fraction'))} of the epoch.")
    for w, v in res["torch"].items():
        best = " (best)" if int(w) == res.get("torch_best_workers") else ""
        print(f"| PyTorch DataLoader, {res['nodes']} ranks x {w} workers{best} | {fmt_r(v['samples_per_s'])} "
              f"| {fmt_r(v['mb_per_s'])} | {v['epoch0_samples_per_s'] or 0:.0f} | {v['last_epoch_samples_per_s'] or 0:.0f} "
              f"| {'; '.join(v['loads'])} |")
    if res.get("all_from_storage_samples_per_s"):
        print(f"| for reference: every byte from storage at the bound's rate | "
              f"{res['all_from_storage_samples_per_s']:.0f} | - | - | - | |")
    spans = [f"{name} {fmt_r(v['run_samples_per_s'])}" for name, v in
             [(f"ShardMix {m}", v) for m, v in res["shardmix"].items()] +
             [(f"DataLoader x{w}", v) for w, v in res["torch"].items()] if v.get("run_samples_per_s")]
    if spans:
        notes.append("Per run, the middle epochs together (samples/s, median over runs (min-max)): " + "; ".join(spans) + ".")
    for n in notes:
        print()
        print(n)
    print()
    r, t = dict(res["ratios"]), res["targets"]
    bw = res.get("torch_best_workers")
    if "bound_vs_torch" not in r and bw and res.get("bound_samples_per_s"):  # a JSON written before it existed
        tb = res["torch"][str(bw)]
        r["bound_vs_torch"] = res["bound_samples_per_s"]["median"] / tb["samples_per_s"]["median"]
        if tb.get("run_samples_per_s", {}).get("median"):
            r["bound_vs_torch_run_span"] = res["bound_samples_per_s"]["median"] / tb["run_samples_per_s"]["median"]
    print(f"| target | {' | '.join(res['shardmix']) or 'ShardMix'} |")
    print("|---|" + "---|" * max(1, len(res["shardmix"])))
    def cell(key, target):
        return " | ".join((f"{r[f'{m}_{key}']:.2f} ({'met' if r[f'{m}_{key}'] >= target else 'missed'})"
                           if f"{m}_{key}" in r else "not measured") for m in res["shardmix"]) or "not measured"
    print(f"| ShardMix / storage bound >= {t['shardmix_vs_bound']:.2f} | {cell('vs_bound', t['shardmix_vs_bound'])} |")
    print(f"| ShardMix / DataLoader >= total / cold bytes = {t['shardmix_vs_torch']:.2f} "
          f"| {cell('vs_torch', t['shardmix_vs_torch'])} |")
    if any(k.endswith("run_span_vs_bound") for k in r):
        print(f"| the same per run, middle epochs together: / bound | {cell('run_span_vs_bound', t['shardmix_vs_bound'])} |")
        print(f"| the same per run, middle epochs together: / DataLoader | {cell('run_span_vs_torch', t['shardmix_vs_torch'])} |")
    if "torch_vs_all_from_storage" in r:
        print(f"| for reference: DataLoader / (every byte from storage at the bound's rate) "
              f"| {r['torch_vs_all_from_storage']:.2f} |")
    if "bound_vs_torch" in r:
        span = (f"; middle epochs together {r['bound_vs_torch_run_span']:.3f}"
                if "bound_vs_torch_run_span" in r else "")
        need = t["shardmix_vs_torch"] / r["bound_vs_torch"]
        print(f"| for reference: the most ShardMix / DataLoader can be here, storage bound / DataLoader "
              f"(so the target {t['shardmix_vs_torch']:.3f} needs ShardMix at {need:.3f} of the bound) "
              f"| {r['bound_vs_torch']:.3f}{span} |")
    if res.get("failed"):
        print()
        for f in res["failed"]:
            print(f"FAILED: {json.dumps(f)}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("json", nargs="?", default="bench/results/storage-latest.json")
    p.add_argument("--raw")
    p.add_argument("--out")
    p.add_argument("--meta")
    a = p.parse_args()
    if a.raw:
        res = build(a.raw, json.loads(a.meta))
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
        print(f"\nwrote {a.out}\n")
    else:
        res = json.load(open(a.json))
    print_tables(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
