#!/usr/bin/env python3
"""Summaries and Markdown for bench/stall.sh, bench/cost.sh and bench/startup.sh
(stall, cost, start-up). The shell scripts run the programs and collect raw JSON lines; this file
turns them into figures, so that the arithmetic is tested on fixtures
(tests/e2e/costs_report_test.py) instead of only trusted.

    python3 bench/costs_report.py {stall|cost|startup} RAW.jsonl OUT.json

RAW.jsonl holds one JSON object per line, each with a "kind" field (see the summaries).
Writes OUT.json (with a "markdown" field) and prints the Markdown.
"""
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import epoch_span, machine, stats, utc_now  # noqa: E402,F401  (stats: callers use cr.stats)

PHASES = ["launch", "setup", "scan", "catalog_exchange", "placement", "regions", "fabric", "load", "serve_setup",
          "trainers"]
PHASE_NOTES = {
    "launch": "mpirun to the daemon's run_daemon (process start, MPI_Init)",
    "setup": "run dir, job token",
    "scan": "this rank's share of the directory walk (stat of every file)",
    "catalog_exchange": "allgather of the scans, decode, merge and sort (includes waiting for the slowest scanner)",
    "placement": "plan shape, placement, planner, checks",
    "regions": "shared memory arena and staging",
    "fabric": "open the provider, expose memory, exchange addresses, connect",
    "load": "read the owned samples into the arena, then agree (the slowest node)",
    "serve_setup": "trainer socket, ready file",
    "trainers": "launch.sh sees the ready file, trainers' mpirun, connect, first batch",
}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def rng(s, fmt="{:.2f}", scale=1.0):
    if s["median"] is None:
        return "n/a"
    m, lo, hi = (fmt.format(s[k] * scale) for k in ("median", "min", "max"))
    return m if s["n"] == 1 else f"{m} ({lo}-{hi})"


def header(extra=None):
    out = {"date": utc_now(), "machine": machine()}
    out.update(extra or {})
    return out


def parse_report_line(line, tag):
    """The fields of a shardmixd "<tag>: k=v ..." line (server/startup_report.h), or None."""
    m = re.search(r"(?:^|[^a-z0-9_])" + re.escape(tag) + r":( |$)(.*)$", line)
    if not m:
        return None
    fields = {}
    for token in m.group(2).split():
        key, eq, value = token.partition("=")
        if not eq or not re.fullmatch(r"[a-z0-9_]+", key) or not value:
            raise ValueError(f"{tag} line: malformed field {token!r} in {line.strip()!r}")
        fields[key] = value
    return fields


def daemon_reports(log_text, tag):
    """Every rank's "<tag>:" line of a daemon log, by rank, values as floats where they parse."""
    out = {}
    for line in log_text.splitlines():
        f = parse_report_line(line, tag)
        if f is None:
            continue
        conv = {}
        for k, v in f.items():
            try:
                conv[k] = float(v)
            except ValueError:
                conv[k] = v
        out[int(conv["rank"])] = conv
    return out


# ----------------------------------------------------------------------------- start-up
def startup_run(t0, startup_by_rank, first_batches, catalog_bytes):
    """One start-up run: phases (rank 0's timeline, whose boundaries are the collectives
    every rank meets at) plus the launch before the daemons and the trainers after them."""
    r0 = startup_by_rank[0]
    phases = {"launch": r0["t_begin"] - t0}
    for p in PHASES[1:-1]:
        phases[p] = r0.get(p, 0.0)
    t_first = max(fb["t_first_batch"] for fb in first_batches)
    phases["trainers"] = t_first - r0["t_end"]
    return {"phases": phases, "total": t_first - t0,
            "scan_max_rank": max(s.get("scan", 0.0) for s in startup_by_rank.values()),
            "load_rate_mbps": catalog_bytes / phases["load"] / 1e6 if phases["load"] > 0 else None}


def summarize_startup(rows):
    runs = [r for r in rows if r["kind"] == "startup"]
    disks = [r for r in rows if r["kind"] == "disk_read"]
    result = header({"sizes": {}})
    lines = []
    for n in sorted({r["samples"] for r in runs}):
        rs = [r for r in runs if r["samples"] == n]
        ds = [d for d in disks if d["samples"] == n]
        total_bytes = rs[0]["bytes"]
        disk_mbps = stats([d["mbps"] for d in ds])
        read_s = total_bytes / (disk_mbps["median"] * 1e6) if disk_mbps["median"] else None
        entry = {"samples": n, "bytes": total_bytes, "median_kib": rs[0].get("median_kib"),
                 "total_s": stats([r["total"] for r in rs]),
                 "phases_s": {p: stats([r["phases"][p] for r in rs]) for p in PHASES},
                 "load_mbps": stats([r["load_rate_mbps"] for r in rs]),
                 "disk_read_mbps": disk_mbps, "disk_read_threads": ds[0]["threads"] if ds else None,
                 "bytes_read_time_s": read_s,
                 "load_vs_disk": (stats([r["load_rate_mbps"] for r in rs])["median"] / disk_mbps["median"]
                                  if disk_mbps["median"] else None),
                 "loadavg": [r.get("loadavg") for r in rs]}
        if n >= 1_000_000 and read_s is not None:
            entry["target_s"] = 10.0 + read_s
            entry["target_met"] = entry["total_s"]["median"] < entry["target_s"]
        result["sizes"][str(n)] = entry
    sizes = list(result["sizes"].values())
    lines.append(f"Start-up, mpirun to every trainer's first batch, 4 daemons (tcp) + 4 trainers, page cache dropped "
                 f"before each run; {result['machine']}, {result['date']}. Seconds, median (min-max).")
    lines.append("")
    lines.append("| phase | what | " + " | ".join(f"{e['samples']:,} samples" for e in sizes) + " |")
    lines.append("|---|---|" + "---|" * len(sizes))
    for p in PHASES:
        lines.append(f"| {p} | {PHASE_NOTES[p]} | " + " | ".join(rng(e["phases_s"][p], "{:.2f}") for e in sizes) + " |")
    lines.append("| **total** | mpirun to first batch | " + " | ".join(f"**{rng(e['total_s'])}**" for e in sizes) + " |")
    lines.append("| dataset | | " + " | ".join(
        f"{e['bytes'] / 1e6:.0f} MB, median {e['median_kib']} KiB" for e in sizes) + " |")
    lines.append("| loading rate MB/s | all nodes' bytes / load phase | " + " | ".join(rng(e["load_mbps"], "{:.0f}") for e in sizes) + " |")
    lines.append("| disk read rate MB/s | same files, parallel open+pread | " + " | ".join(
        rng(e["disk_read_mbps"], "{:.0f}") + (f" ({e['disk_read_threads']} thr.)" if e["disk_read_threads"] else "")
        for e in sizes) + " |")
    lines.append("| loading / disk | | " + " | ".join(
        f"{e['load_vs_disk']:.0%}" if e["load_vs_disk"] else "n/a" for e in sizes) + " |")
    lines.append("")
    lines.append("Load average at each run's start: " + "; ".join(
        f"{e['samples']:,}: " + ", ".join(str(x) for x in e["loadavg"]) for e in sizes) + ".")
    lines.append("")
    for e in sizes:
        if "target_s" in e:
            verdict = "met" if e["target_met"] else "MISSED"
            lines.append(f"Target (1,000,000 samples under 10 s plus the time to read the bytes, "
                         f"{e['bytes_read_time_s']:.1f} s at the disk's rate): {e['target_s']:.1f} s; measured "
                         f"{e['total_s']['median']:.1f} s: **{verdict}**.")
    result["markdown"] = "\n".join(lines) + "\n"
    return result


# ----------------------------------------------------------------------------- cost
def summarize_cost(rows):
    runs = [r for r in rows if r["kind"] == "cost"]
    result = header()
    cpu_per_gb, rss_per_gb, cat_per_sample, book_per_sample, parts_all = [], [], [], [], []
    for r in runs:
        delivered_gb = r["delivered_bytes"] / 1e9
        cpu = r["cpu_after"] - r["cpu_before"]
        cpu_per_gb.append(cpu / delivered_gb)
        mem = r["memory"]  # rank -> memory line
        cached = sum(m["cached_bytes"] for m in mem.values())
        rss = sum(r["rss_end"].values())
        rss_per_gb.append(rss / (cached / 1e9))
        samples = next(iter(mem.values()))["samples"]
        nodes = len(mem)
        catalog = statistics.mean(m["catalog_bytes"] for m in mem.values())
        # Daemons before 2026-11-24 kept a serialized catalog copy for trainers
        # (catalog_copy_bytes); now it is serialized per request and the field is gone.
        copy = statistics.mean(m.get("catalog_copy_bytes", 0) for m in mem.values())
        book = copy + statistics.mean(m["placement_bytes"] for m in mem.values())
        cat_per_sample.append(catalog / samples)
        book_per_sample.append(book / samples)
        # Per daemon: what its resident set is made of at the end of the run.
        parts = {"arena": statistics.mean(m["arena_bytes"] for m in mem.values()),
                 "staging_resident": statistics.mean(r["rss_shmem_end"][k] - mem[k]["arena_bytes"] for k in mem),
                 "catalog": catalog, "placement": statistics.mean(m["placement_bytes"] for m in mem.values()),
                 "rss": rss / nodes}
        if any("catalog_copy_bytes" in m for m in mem.values()):
            parts["catalog_copy"] = copy
        parts["other"] = parts["rss"] - parts["arena"] - max(parts["staging_resident"], 0) - parts["catalog"] - \
            parts.get("catalog_copy", 0) - parts["placement"]
        parts_all.append(parts)
    result.update({
        "dataset": runs[0]["dataset"], "runs": len(runs), "epochs_measured": runs[0]["epochs"],
        "cpu_source": "utime+stime of the shardmixd processes from /proc/PID/stat, from the trainers' start "
                      "(daemons loaded and serving) to the last trainer's end",
        "cpu_s_per_gb": stats(cpu_per_gb), "rss_bytes_per_cached_gb": stats(rss_per_gb),
        "catalog_bytes_per_sample": stats(cat_per_sample), "bookkeeping_bytes_per_sample": stats(book_per_sample),
        "rss_parts_bytes_per_daemon": {k: stats([p[k] for p in parts_all]) for k in parts_all[0]},
        "staging_bytes_per_daemon": runs[0]["memory"][next(iter(runs[0]["memory"]))]["staging_bytes"],
        "loadavg": [r.get("loadavg") for r in runs]})
    result["catalog_target_met"] = result["catalog_bytes_per_sample"]["median"] <= 64
    md = [f"Cost, {result['dataset']}, 4 daemons (tcp) + 4 trainers, Q = 1, {result['epochs_measured']} epochs per run "
          f"after loading, {len(runs)} runs; {result['machine']}, {result['date']}. Median (min-max).", "",
          "| figure | value |", "|---|---|",
          f"| daemon CPU s per GB delivered (all 4 daemons, /proc utime+stime) | {rng(result['cpu_s_per_gb'])} |",
          f"| daemon RSS per cached GB (sum of 4 daemons' VmRSS / cached bytes) | {rng(result['rss_bytes_per_cached_gb'], '{:.2f}', 1e-9)} GB |",
          f"| catalog bytes per sample (in memory, each daemon) | {rng(result['catalog_bytes_per_sample'], '{:.1f}')} |",
          f"| bookkeeping bytes per sample (placement tables, plus the serialized catalog copy daemons kept before 2026-11-24) | "
          f"{rng(result['bookkeeping_bytes_per_sample'], '{:.1f}')} |",
          f"| load average at each run's start | {'; '.join(str(x) for x in result['loadavg'])} |", "",
          "Resident set of one daemon at the end of the run, MB (mean over daemons):", "",
          "| part | MB |", "|---|---|"]
    for k, s in result["rss_parts_bytes_per_daemon"].items():
        md.append(f"| {k} | {rng(s, '{:.1f}', 1e-6)} |")
    md += ["", f"staging is {result['staging_bytes_per_daemon'] / 1e6:.0f} MB allocated per daemon; "
               "'staging_resident' is the part of the shared pages (RssShmem) beyond the arena, i.e. staging "
               "pages touched so far. 'other' is the rest of VmRSS: libraries, MPI and libfabric buffers, "
               "thread stacks, the allocator's heap.", "",
           f"Target (catalog <= 64 B/sample): {result['catalog_bytes_per_sample']['median']:.1f} B/sample: "
           f"**{'met' if result['catalog_target_met'] else 'MISSED'}**."]
    result["markdown"] = "\n".join(md) + "\n"
    return result


# ----------------------------------------------------------------------------- stall
def epoch_spans(rows):
    """(run, epoch) -> wall-clock span from the first rank's start to the last one's end."""
    groups = {}
    for r in rows:
        groups.setdefault((r["run"], r["epoch"]), []).append(r)
    return {k: epoch_span(v) for k, v in groups.items()}


def summarize_stall(rows):
    result = header({"loaders": {}})
    conditions = [r for r in rows if r["kind"] == "conditions"]
    if conditions:
        result["conditions"] = {k: v for k, v in conditions[-1].items() if k != "kind"}
    peak = [r for r in rows if r["kind"] == "peak"]
    peak_rates = []
    for (run, epoch), span in epoch_spans(peak).items():
        if epoch == 0:
            continue  # epoch 0 of a ShardMix run includes connection set-up
        samples = sum(x["samples"] for x in peak if x["run"] == run and x["epoch"] == epoch)
        peak_rates.append(samples / span)
    result["shardmix_peak_samples_per_s"] = stats(peak_rates)
    # The DataLoader's worker counts at no compute, which picked its best configuration.
    probes = {}
    probe_rows = [r for r in rows if r["kind"] == "torch_probe"]
    for (run, epoch), span in epoch_spans(probe_rows).items():
        if epoch == 0:
            continue
        ranks = [x for x in probe_rows if x["run"] == run and x["epoch"] == epoch]
        probes.setdefault(ranks[0]["config"], []).append(sum(x["samples"] for x in ranks) / span)
    result["dataloader_no_compute_samples_per_s"] = {k: stats(v) for k, v in probes.items()}
    result["compute"] = {}
    for r in rows:
        if r["kind"] == "compute":
            result["compute"][str(r["fraction"])] = {"compute_ms": r["compute_ms"], "fraction": r["fraction"]}
    fractions = sorted({r["fraction"] for r in rows if r["kind"] in ("fed", "synthetic")})
    for loader in sorted({r["loader"] for r in rows if r["kind"] == "fed"}):
        per = {}
        for f in fractions:
            fed = [r for r in rows if r["kind"] == "fed" and r["loader"] == loader and r["fraction"] == f]
            syn = [r for r in rows if r["kind"] == "synthetic" and r["loader"] == loader and r["fraction"] == f]
            fed_spans = epoch_spans(fed)
            syn_spans = epoch_spans(syn)
            syn_med = med(list(syn_spans.values()))
            stalls, rates, waits = [], [], []
            for (run, epoch), span in fed_spans.items():
                if epoch == 0:
                    continue  # ShardMix: connection set-up; DataLoader: its persistent workers start
                stalls.append(max(span - syn_med, 0.0) / span)
                ranks = [x for x in fed if x["run"] == run and x["epoch"] == epoch]
                rates.append(sum(x["samples"] for x in ranks) / span)
                # What shardmix-consume itself saw: time waiting for a batch (the rest of
                # the stall is the trainer's own work running slower while sharing the CPU).
                if all("stall_seconds" in x for x in ranks):
                    waits.append(statistics.mean(x["stall_seconds"] for x in ranks) / span)
            per[str(f)] = {"stall_fraction": stats(stalls), "samples_per_s": stats(rates),
                           "trainer_wait_fraction": stats(waits),
                           "synthetic_epoch_s": syn_med, "fed_epoch_s": stats(list(fed_spans.values())),
                           "config": fed[0].get("config") if fed else None}
        result["loaders"][loader] = per
    md = [f"Data stall (DS-Analyzer method: fed epoch time minus the same trainer fed from memory, over the fed time), "
          f"4 trainers, batch 32, compute per batch as sleep; ShardMix peak "
          f"{rng(result['shardmix_peak_samples_per_s'], '{:.0f}')} samples/s (4 daemons, tcp, Q = 1); "
          f"{result['machine']}, {result['date']}. Stall fraction per epoch, median (min-max).", "",
          "| loader | " + " | ".join(f"compute needs {float(f):.0%} of peak" for f in fractions) + " |",
          "|---|" + "---|" * len(fractions)]
    for loader, per in result["loaders"].items():
        cfg = next((v["config"] for v in per.values() if v["config"]), "")
        md.append(f"| {loader}{' (' + cfg + ')' if cfg else ''} | " + " | ".join(
            f"{rng(per[str(f)]['stall_fraction'], '{:.1%}')} at {rng(per[str(f)]['samples_per_s'], '{:.0f}')} samples/s"
            for f in fractions) + " |")
    for loader, per in result["loaders"].items():
        if any(per[str(f)]["trainer_wait_fraction"]["n"] for f in fractions):
            md.append(f"| {loader}: time the trainer waited for a batch, as a fraction of the epoch | " + " | ".join(
                rng(per[str(f)]["trainer_wait_fraction"], "{:.1%}") for f in fractions) + " |")
    md.append("")
    md.append("| compute needs | " + " | ".join(f"{float(f):.0%}" for f in fractions) + " |")
    md.append("|---|" + "---|" * len(fractions))
    md.append("| ms per batch per trainer | " + " | ".join(
        f"{result['compute'][str(f)]['compute_ms']:.2f}" for f in fractions) + " |")
    if probes:
        md.append("")
        md.append("DataLoader at no compute (page cache warm), samples/s: " + ", ".join(
            f"{k}: {rng(v, '{:.0f}')}" for k, v in result["dataloader_no_compute_samples_per_s"].items()) + ".")
    if conditions:
        c = result["conditions"]
        md.append("")
        md.append(f"Dataset {c.get('dataset')}; {c.get('epochs')} epochs per run (epoch 0 left out); load average "
                  f"{c.get('loadavg_start')} at the start, {c.get('loadavg_end')} at the end.")
    md.append("")
    sm = result["loaders"].get("shardmix", {}).get("0.8")
    if sm and sm["stall_fraction"]["median"] is not None:
        result["target_met"] = sm["stall_fraction"]["median"] < 0.01
        md.append(f"Target (ShardMix stall < 1% when compute needs 80% of its peak): "
                  f"{sm['stall_fraction']['median']:.2%}: **{'met' if result['target_met'] else 'MISSED'}**.")
    result["markdown"] = "\n".join(md) + "\n"
    return result


def main(argv):
    if len(argv) != 4 or argv[1] not in ("stall", "cost", "startup"):
        print(__doc__, file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in open(argv[2]) if line.strip()]
    result = {"stall": summarize_stall, "cost": summarize_cost, "startup": summarize_startup}[argv[1]](rows)
    os.makedirs(os.path.dirname(os.path.abspath(argv[3])), exist_ok=True)
    with open(argv[3], "w") as f:
        json.dump(result, f, indent=2)
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
