#!/usr/bin/env python3
"""Aggregates bench/delivery.sh's raw JSON lines into bench/results/delivery-latest.json
and prints the Markdown tables.

    python3 bench/delivery_report.py RAW.jsonl OUT.json SAMPLES MEDIAN_KIB

Primary figures (docs/decisions/0050): trainers run --lockstep, and a run's rate is all
trainers' bytes of the measured epochs (1..E-1) over the whole measured span, from the
first trainer's first batch of epoch 1 to the last trainer's last batch of epoch E-1;
median (min-max) over the runs. Secondary (rows with "mode": "free"): free-running
trainers, the old per-epoch method (first start to last end of each epoch, median over the
runs' measured epochs). Epochs shorter than MIN_EPOCH_SECONDS are flagged: there start-up
and epoch boundaries weigh in the rate.
"""
import datetime
import json
import os
import platform
import statistics
import sys

MIN_EPOCH_SECONDS = 2.0
VARIANTS = (("q0", 0, "copy"), ("q1", 1, "copy"), ("q1_none", 1, "none"))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(gbps, sps, peer_gbps, epoch_secs):
    return {"gbps": med(gbps), "gbps_min": min(gbps, default=float("nan")),
            "gbps_max": max(gbps, default=float("nan")), "samples_per_s": med(sps), "peer_gbps": med(peer_gbps),
            "epoch_seconds": med(epoch_secs), "measured": len(gbps)}


def epoch_span(ranks):
    """An epoch's span over all trainers: first batch in hand to last batch done."""
    return max(x["t_last_batch"] for x in ranks) - min(x["t_first_batch"] for x in ranks)


def whole_span(rows):
    """Lockstep: one figure per run, over the whole measured span of all trainers."""
    runs = {}
    for r in rows:
        runs.setdefault(r["run"], []).append(r)
    gbps, sps, peer, epoch_secs = [], [], [], []
    for ranks in runs.values():
        first = min(x["epoch"] for x in ranks)
        last = max(x["epoch"] for x in ranks)
        secs = (max(x["t_last_batch"] for x in ranks if x["epoch"] == last)
                - min(x["t_first_batch"] for x in ranks if x["epoch"] == first))
        gbps.append(sum(x["bytes"] for x in ranks) / secs / 1e9)
        sps.append(sum(x["samples"] for x in ranks) / secs)
        peer.append(sum(x["peer_bytes"] for x in ranks) / secs / 1e9)
        for e in range(first, last + 1):
            epoch_secs.append(epoch_span([x for x in ranks if x["epoch"] == e]))
    return spread(gbps, sps, peer, epoch_secs)


def per_epoch(rows):
    """Free-running: one figure per epoch, first trainer's start to last trainer's end."""
    epochs = {}
    for r in rows:
        epochs.setdefault((r["run"], r["epoch"]), []).append(r)
    gbps, sps, peer, epoch_secs = [], [], [], []
    for ranks in epochs.values():
        secs = max(x["t_end"] for x in ranks) - min(x["t_start"] for x in ranks)
        gbps.append(sum(x["bytes"] for x in ranks) / secs / 1e9)
        sps.append(sum(x["samples"] for x in ranks) / secs)
        peer.append(sum(x["peer_bytes"] for x in ranks) / secs / 1e9)
        epoch_secs.append(epoch_span(ranks))
    return spread(gbps, sps, peer, epoch_secs)


def summarize(rows, provider, mode, memcpy, fi_gbps):
    entry = {}
    for key, q, touch in VARIANTS:
        mine = [r for r in rows if r.get("bench") == "shardmix" and r.get("mode", "free") == mode
                and r["provider"] == provider and r["q"] == q and r.get("touch") == touch and r["epoch"] > 0]
        entry[key] = (whole_span if mode == "lockstep" else per_epoch)(mine)
    entry["local_vs_memcpy_1t"] = entry["q0"]["gbps"] / memcpy[1]
    entry["local_vs_memcpy_2t"] = entry["q0"]["gbps"] / memcpy[2]
    entry["peer_vs_raw_fi_read"] = entry["q1_none"]["peer_gbps"] / fi_gbps
    entry["peer_copying_vs_raw_fi_read"] = entry["q1"]["peer_gbps"] / fi_gbps
    return entry


def print_table(result, title, entries):
    print(title)
    print()
    print("| provider | Q=0 local, copying GB/s | samples/s | Q=1 global, copying GB/s | peer part | Q=1 global, views only GB/s "
          "| peer part | epoch s (Q=0 / Q=1 / views) | memcpy 1t GB/s | memcpy 2t GB/s | raw fi_read GB/s "
          "| local / memcpy 1t | peer (views only) / raw fi_read | peer (copying) / raw fi_read |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    short = []
    for p, e in entries.items():
        def rng(x):
            return f"{x['gbps']:.2f} ({x['gbps_min']:.2f}-{x['gbps_max']:.2f})"
        secs = " / ".join(f"{e[k]['epoch_seconds']:.2f}" for k, _, _ in VARIANTS)
        short += [f"{p} {k}" for k, _, _ in VARIANTS if not e[k]["epoch_seconds"] >= MIN_EPOCH_SECONDS]
        print(f"| {p} | {rng(e['q0'])} | {e['q0']['samples_per_s']:.0f} | {rng(e['q1'])} | {e['q1']['peer_gbps']:.2f} "
              f"| {rng(e['q1_none'])} | {e['q1_none']['peer_gbps']:.2f} | {secs} "
              f"| {result['memcpy_gbps'][1]:.2f} | {result['memcpy_gbps'][2]:.2f} | {result['providers'][p]['raw_fi_read_gbps']:.2f} "
              f"| {e['local_vs_memcpy_1t']:.0%} | {e['peer_vs_raw_fi_read']:.0%} | {e['peer_copying_vs_raw_fi_read']:.0%} |")
    if short:
        print()
        print(f"Epochs shorter than {MIN_EPOCH_SECONDS:.0f} s (start-up and boundaries weigh in): {', '.join(short)}; "
              "use a larger --samples.")
    print()


def main():
    raw, out, samples, median_kib = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    nodes = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    rows = [json.loads(line) for line in open(raw) if line.strip()]
    memcpy = {r["threads"]: r["gbps_median"] for r in rows if r.get("bench") == "memcpy"}
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{os.cpu_count()} cores, {platform.machine()}",
              "dataset": f"{samples} samples, median {median_kib} KiB (log-normal sigma 0.5)",
              "method": "lockstep trainers (one MPI_Allreduce per batch), rate over the whole measured span",
              "nodes": nodes, "memcpy_gbps": memcpy, "providers": {}}
    shardmix = [r for r in rows if r.get("bench") == "shardmix"]
    modes = {r.get("mode", "free") for r in shardmix}
    for provider in sorted({r["provider"] for r in shardmix}):
        fi = [r for r in rows if r.get("provider_run") == provider]
        fi_gbps = med([r.get("total_gbps", r.get("gbps", float("nan"))) for r in fi])
        entry = {"raw_fi_read_gbps": fi_gbps}
        if "lockstep" in modes:
            entry.update(summarize(rows, provider, "lockstep", memcpy, fi_gbps))
        if "free" in modes:
            entry["free_running"] = summarize(rows, provider, "free", memcpy, fi_gbps)
        result["providers"][provider] = entry
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    print()
    where = f"{result['dataset']}, {nodes} daemons + {nodes} trainers, {result['machine']}, {result['date']}"
    if "lockstep" in modes:
        print_table(result, f"Delivery, trainers in lockstep, rate over the whole measured span: {where}",
                    result["providers"])
    if "free" in modes:
        print_table(result, f"Secondary: free-running trainers, per-epoch spans (first start to last end): {where}",
                    {p: e["free_running"] for p, e in result["providers"].items()})


if __name__ == "__main__":
    main()
