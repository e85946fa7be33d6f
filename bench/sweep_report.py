#!/usr/bin/env python3
"""Aggregates, tabulates and plots bench/sweep.sh (entropy versus locality).

    python3 bench/sweep_report.py [--json bench/results/sweep-latest.json] [--png OUT.png]
        prints the docs/performance.md block (Markdown tables) from an existing result; with --png,
        redraws the plot too.
    python3 bench/sweep_report.py --raw RAW.jsonl --meta META.json --json OUT.json --png OUT.png
        (what sweep.sh runs) aggregates the raw lines, writes OUT.json, prints the tables
        and draws OUT.png.

Raw lines (one JSON object each, tagged with scenario, q, w, run): kind "trainer" (one per
trainer and epoch, from shardmix-consume --json), "entropy" (one per epoch, from
shardmix-entropy --json), "run" (link and fabric byte counters), "failed".

Per point (scenario, Q, W), over the epochs >= 1 of every run (epoch 0 warms up):
  samples_per_s  all trainers' samples / (last trainer's epoch end - first one's start)
  stall_s        mean over trainers of the seconds spent waiting for batches, per epoch
  stall_max_s    the slowest trainer's stall per epoch (what a synchronous job would feel:
                 its steps wait for the slowest rank; shardmix-consume trainers do not
                 synchronise, so a fast trainer may run ahead)
  stall_fraction all trainers' stall seconds / all trainers' epoch seconds
  metrics        the shardmix-entropy fields, median over (run, epoch)
  wire_bytes_per_sample  bytes the nodes received on their links per delivered sample
                 (all epochs of a run, including TCP/IP headers and read-ahead)
Each figure is reported as median, min and max; per_epoch keeps every measured epoch's
throughput, span and per-trainer stall.
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

METRICS = ["batch_label_entropy_mean", "batch_label_entropy_p5", "order_entropy", "randomization_level",
           "affinity", "local_fraction", "peer_fraction", "storage_fraction", "network_bytes_per_sample",
           "storage_bytes_per_sample", "coverage", "classes", "samples", "distinct_samples"]


def stats(xs):
    """benchlib.stats without NaNs (a metric shardmix-entropy could not compute)."""
    return benchlib.stats([x for x in xs if not (isinstance(x, float) and math.isnan(x))])


def machine():
    """"2 cores, x86_64, Linux 6.1, VM guest, docker container, AMD EPYC ..."."""
    parts = [f"{os.cpu_count()} cores", platform.machine(), f"Linux {platform.release()}"]
    cpuinfo = ""
    try:
        cpuinfo = open("/proc/cpuinfo").read()
    except OSError:
        pass
    if " hypervisor" in cpuinfo:
        parts.append("VM guest")
    try:
        virt = subprocess.run(["systemd-detect-virt", "--container"], capture_output=True, text=True).stdout.strip()
        if virt and virt != "none":
            parts.append(f"{virt} container")
    except OSError:
        pass
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            parts.append(line.split(":", 1)[1].strip())
            break
    return ", ".join(parts)


def aggregate(raw_path, meta):
    rows = [json.loads(line) for line in open(raw_path) if line.strip()]
    keys = []
    for r in rows:
        k = (r["scenario"], r["q"], r["w"])
        if k not in keys:
            keys.append(k)
    points, failed = [], []
    for scenario, q, w in keys:
        mine = [r for r in rows if (r["scenario"], r["q"], r["w"]) == (scenario, q, w)]
        fails = [r for r in mine if r["kind"] == "failed"]
        failed += [{"scenario": scenario, "q": q, "w": w, "run": f["run"], "exit": f["exit"], "error": f["error"]}
                   for f in fails]
        by_epoch = {}
        for r in mine:
            if r["kind"] == "trainer" and r["epoch"] >= 1:
                by_epoch.setdefault((r["run"], r["epoch"]), []).append(r)
        sps, mbps, stall, stall_max, stall_frac, span = [], [], [], [], [], []
        per_epoch = {"run_epoch": [], "samples_per_s": [], "span_s": [], "trainer_stall_s": []}
        for (run, epoch), ranks in sorted(by_epoch.items()):
            ranks = sorted(ranks, key=lambda x: x["rank"])
            secs = benchlib.epoch_span(ranks)
            sps.append(sum(x["samples"] for x in ranks) / secs)
            mbps.append(sum(x["bytes"] for x in ranks) / secs / 1e6)
            stall.append(statistics.mean(x["stall_seconds"] for x in ranks))
            stall_max.append(max(x["stall_seconds"] for x in ranks))
            stall_frac.append(sum(x["stall_seconds"] for x in ranks) / sum(x["seconds"] for x in ranks))
            span.append(secs)
            per_epoch["run_epoch"].append([run, epoch])
            per_epoch["samples_per_s"].append(round(sps[-1], 1))
            per_epoch["span_s"].append(round(secs, 4))
            per_epoch["trainer_stall_s"].append([round(x["stall_seconds"], 4) for x in ranks])
        entropy = [r for r in mine if r["kind"] == "entropy" and r["epoch"] >= 1]
        wire = []
        for run in [r for r in mine if r["kind"] == "run"]:
            delivered = sum(x["samples"] for x in mine if x["kind"] == "trainer" and x["run"] == run["run"])
            if delivered:
                wire.append(run["wire_bytes"] / delivered)
        point = {"scenario": scenario, "q": q, "w": w,
                 "slow_peer_rank": mine[0]["slow_peer_rank"], "slow_peer_delay": mine[0]["slow_peer_delay"],
                 "link_rate": mine[0]["link_rate"],
                 "runs_ok": len({r["run"] for r in mine if r["kind"] == "run"}), "runs_failed": len(fails),
                 "epochs_measured": len(by_epoch),
                 "samples_per_s": stats(sps), "mb_per_s": stats(mbps), "epoch_seconds": stats(span),
                 "stall_s": stats(stall), "stall_max_s": stats(stall_max), "stall_fraction": stats(stall_frac),
                 "wire_bytes_per_sample": stats(wire),
                 "metrics": {m: stats([e.get(m) for e in entropy]) for m in METRICS},
                 "per_epoch": per_epoch}
        points.append(point)
    return {"date": benchlib.utc_now(),
            "machine": machine(), "settings": meta, "command": meta.get("command", ""),
            "points": points, "failed": failed}


def med(p, key, sub=None):
    v = p[key][sub] if sub else p[key]
    return v["median"]


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def fmt_range(s, spec):
    if s["median"] is None:
        return "-"
    return f"{format(s['median'], spec)} ({format(s['min'], spec)}-{format(s['max'], spec)})"


def table(points, title_cols, failed=()):
    lines = ["| " + " | ".join(title_cols) + " |", "|" + "---|" * len(title_cols)]
    for p in points:
        m = p["metrics"]
        cells = [case_name(p) if title_cols[0] == "case" else str(p["q"]), str(p["w"])]
        if p["runs_ok"] == 0:
            cells.append("not run: " + "; ".join(sorted({f["error"] for f in failed
                                                         if (f["scenario"], f["q"], f["w"]) ==
                                                         (p["scenario"], p["q"], p["w"])})).replace("|", "/"))
            cells += ["-"] * (len(title_cols) - len(cells))
            lines.append("| " + " | ".join(cells) + " |")
            continue
        cells += [fmt_range(p["samples_per_s"], ".0f"), fmt(med(p, "mb_per_s"), ".0f"),
                  fmt_range(p["stall_s"], ".2f"), fmt(med(p, "stall_max_s"), ".2f"),
                  fmt(med(p, "stall_fraction") and 100 * med(p, "stall_fraction"), ".0f"),
                  fmt(m["local_fraction"]["median"], ".2f"),
                  fmt(m["network_bytes_per_sample"]["median"] and m["network_bytes_per_sample"]["median"] / 1024, ".0f"),
                  fmt(p["wire_bytes_per_sample"]["median"] and p["wire_bytes_per_sample"]["median"] / 1024, ".0f"),
                  fmt(m["batch_label_entropy_mean"]["median"], ".3f"), fmt(m["batch_label_entropy_p5"]["median"], ".3f"),
                  fmt(m["order_entropy"]["median"], ".3f"), fmt(m["randomization_level"]["median"], ".3f"),
                  fmt(m["affinity"]["median"], ".3f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def case_name(p):
    if p["scenario"] == "reference":
        return "no slow peer"
    return f"rank {p['slow_peer_rank']} +{p['slow_peer_delay']}"


COLS = ["samples/s (min-max)", "MB/s", "stall s/epoch (min-max)", "slowest trainer's stall s", "stall %", "local", "net KiB/sample",
        "wire KiB/sample", "label H mean", "label H p5", "order H", "rand. level", "affinity"]


def print_report(d):
    s = d["settings"]
    grid = [p for p in d["points"] if p["scenario"] == "grid"]
    slow = [p for p in d["points"] if p["scenario"] in ("reference", "slow_peer")]
    print(f"Measured {d['date']} on {d['machine']}; `{d['command']}`. "
          f"{s['samples']} samples ({s['dataset_bytes'] / 2**20:.0f} MiB, median {s['median_kib']} KiB, "
          f"{s['classes']} classes, class-sorted placement), {s['nodes']} daemons in separate network namespaces "
          f"+ {s['nodes'] * s['trainers_per_node']} trainers (one per node), batch {s['batch']}, prefetch "
          f"{s['prefetch']}, {s['compute_ms']} ms of compute per batch, provider {s['provider']}. Medians over "
          f"epochs 1-{s['epochs'] - 1} of {s['repeat']} run(s) (min-max); stall = seconds a trainer waited for "
          "batches per epoch (mean over trainers, and the slowest trainer's); net = peer payload bytes per "
          "delivered sample, wire = bytes the nodes received on their links per delivered sample (TCP/IP "
          "headers included, and the read-ahead into the epoch after the last, which no trainer asks for).")
    print()
    print(f"Q x W, links shaped to {s['link_rate']} each way (tc tbf):")
    print()
    print(table(grid, ["Q", "W"] + COLS, d["failed"]))
    if slow:
        print()
        print(f"Slow peer: Q = 1, links unshaped, daemon rank {s['slow_peer_rank']}'s fetches complete "
              f"{s['slow_peer_delay']} late:")
        print()
        print(table(slow, ["case", "W"] + COLS, d["failed"]))
    if d["failed"]:
        print()
        print("Runs that failed: " + "; ".join(
            f"{f['scenario']} Q={f['q']} W={f['w']} run {f['run']}: {f['error']}" for f in d["failed"]))


def plot(d, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = d["settings"]
    grid = [p for p in d["points"] if p["scenario"] == "grid" and p["runs_ok"] > 0]
    ws = sorted({p["w"] for p in grid})
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    (ax_tp, ax_st), (ax_h, ax_slow) = axes

    def series(ax, w, getter, label, **kw):
        pts = sorted((p for p in grid if p["w"] == w), key=lambda p: p["q"])
        xs = [p["q"] for p in pts]
        ys = [getter(p)["median"] for p in pts]
        lo = [getter(p)["median"] - getter(p)["min"] for p in pts]
        hi = [getter(p)["max"] - getter(p)["median"] for p in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label, **kw)

    for w in ws:
        series(ax_tp, w, lambda p: p["samples_per_s"], f"W = {w}")
        series(ax_st, w, lambda p: p["stall_s"], f"W = {w}")
    ax_tp.set_title(f"Throughput, links at {s['link_rate']}")
    ax_tp.set_ylabel("samples/s (all trainers)")
    ax_st.set_title(f"Trainer stall ({s['compute_ms']} ms compute per batch)")
    ax_st.set_ylabel("s waiting for batches per trainer-epoch")
    for i, w in enumerate(ws):
        series(ax_h, w, lambda p: p["metrics"]["batch_label_entropy_mean"], f"label entropy mean, W = {w}",
               color=f"C{i}")
        series(ax_h, w, lambda p: p["metrics"]["batch_label_entropy_p5"], f"label entropy p5, W = {w}",
               color=f"C{i}", linestyle="--", markersize=3)
    w0 = ws[0] if ws else 0
    series(ax_h, w0, lambda p: p["metrics"]["affinity"], "affinity", color="0.3", linestyle=":")
    series(ax_h, w0, lambda p: p["metrics"]["local_fraction"], "local fraction", color="0.6", linestyle="-.")
    ax_h.set_title("Micro-batch label entropy (16 classes), affinity, locality")
    ax_h.set_ylim(-0.02, 1.02)
    for ax in (ax_tp, ax_st, ax_h):
        ax.set_xlabel("Q = shuffle.exchange_fraction")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    slow = [p for p in d["points"] if p["scenario"] in ("reference", "slow_peer") and p["runs_ok"] > 0]
    if slow:
        labels = [("no delay\nW = 0" if p["scenario"] == "reference" else f"+{p['slow_peer_delay']}\nW = {p['w']}")
                  for p in slow]
        xs = list(range(len(slow)))
        for off, key, color, name in ((-0.2, "stall_s", "C1", "stall, mean trainer"),
                                      (0.2, "stall_max_s", "C4", "stall, slowest trainer")):
            st = [p[key] for p in slow]
            ax_slow.bar([x + off for x in xs], [x["median"] for x in st], width=0.4, color=color, alpha=0.8,
                        yerr=[[x["median"] - x["min"] for x in st], [x["max"] - x["median"] for x in st]],
                        capsize=3, label=name)
        ax_slow.set_xticks(xs, labels, fontsize=8)
        ax_slow.set_ylabel("stall s per epoch")
        ax_slow.legend(fontsize=8, loc="upper left")
        ax2 = ax_slow.twinx()
        ax2.plot(list(xs), [p["samples_per_s"]["median"] for p in slow], "ko-", label="samples/s")
        ax2.set_ylabel("samples/s (all trainers)")
        ax2.set_ylim(bottom=0)
        ax2.legend(fontsize=8, loc="upper center")
        ax_slow.set_title(f"Slow peer (rank {s['slow_peer_rank']}), Q = 1, links unshaped")
        ax_slow.grid(alpha=0.3, axis="y")
    else:
        ax_slow.axis("off")
    fig.suptitle(f"ShardMix entropy versus locality: {s['nodes']} emulated nodes, {s['samples']} samples, "
                 f"{d['date']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"\nwrote {out}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", help="raw JSON lines from sweep.sh")
    ap.add_argument("--meta", help="settings JSON from sweep.sh (with --raw)")
    ap.add_argument("--json", default="bench/results/sweep-latest.json", help="result JSON (written with --raw)")
    ap.add_argument("--png", help="draw the plot here")
    a = ap.parse_args()
    if a.raw:
        d = aggregate(a.raw, json.load(open(a.meta)))
        with open(a.json, "w") as f:
            json.dump(d, f, indent=1)
            f.write("\n")
    else:
        d = json.load(open(a.json))
    print_report(d)
    if a.png:
        plot(d, a.png)


if __name__ == "__main__":
    main()
