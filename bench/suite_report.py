#!/usr/bin/env python3
"""Turns bench/run.sh's raw 'JSON' lines into bench/results/latest.json, latest.md and
latest-*.png (docs/decisions/0028).

    python3 bench/suite_report.py --raw RAW.jsonl --out-dir DIR [--command CMD] [--quick 0|1]
        [--samples N] [--small-samples N] [--large-samples N] [--epochs E] [--repo DIR]
        [--part NAME=FILE.json ...] [--part-absent NAME ...] [--part-failed NAME ...] [--no-plots]

Aggregation. An epoch's rate for the ranked systems (ShardMix trainers, DataLoader ranks)
is all ranks' samples (bytes) over the span from the first rank's start to the last
rank's end; the POSIX reader is one process, its epoch is its own span. Epoch 0 of every
run is a warm-up and is left out; the remaining epochs are the repetitions, reported as
median with min and max. memcpy and in-place copying report the median of their passes,
raw fi_read one timed phase per run.

Targets, each a ratio of two figures of the same run, printed met/missed:
  local_vs_memcpy    ShardMix Q=0 (1 node, 1 trainer copying) GB/s >= 0.8 x memcpy 1 thread
  peer_vs_fi_read    ShardMix Q=1 views-only peer GB/s >= 0.9 x raw fi_read, N ranks, N >= 2
  cold_vs_dataloader ShardMix Q=1 (page cache dropped every epoch, epochs >= 1) samples/s
                     >= 10 x the DataLoader's best configuration, dropped, largest N
  warm_vs_dataloader ShardMix Q=1 warm >= 1 x the DataLoader's best, warm, largest N
  warm_vs_overlapping ShardMix Q=1 warm >= 3 x the DataLoader's best with num_workers >= 1
  local_vs_inplace   ShardMix Q=0 GB/s >= 0.8 x N processes copying in place, every N
"""
import argparse
import json
import os
import platform
import subprocess
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import epoch_span, stats, utc_now  # noqa: E402

TARGETS = {
    "local_vs_memcpy": 0.8,
    "peer_vs_fi_read": 0.9,
    "cold_vs_dataloader": 10.0,
    "warm_vs_dataloader": 1.0,
    "warm_vs_overlapping": 3.0,
    "local_vs_inplace": 0.8,
}


def summary(values):
    """stats(values), or None when there is no value."""
    s = stats(values)
    return s if s["n"] else None


def epoch_rates(rows):
    """rows: per-rank epoch records of one run. Returns per-epoch (samples/s, GB/s, peer GB/s), epoch >= 1."""
    by_epoch = defaultdict(list)
    for r in rows:
        by_epoch[r["epoch"]].append(r)
    out = []
    for epoch in sorted(by_epoch):
        if epoch == 0:
            continue
        ranks = by_epoch[epoch]
        span = epoch_span(ranks)
        if span <= 0:
            continue
        out.append((sum(x["samples"] for x in ranks) / span, sum(x["bytes"] for x in ranks) / span / 1e9,
                    sum(x.get("peer_bytes", 0) for x in ranks) / span / 1e9))
    return out


def rate_entry(rows):
    """Epoch rates of every repetition (each rep's epochs are separate runs), pooled."""
    by_rep = defaultdict(list)
    for r in rows:
        by_rep[r.get("rep", 0)].append(r)
    rates = [rate for rep in sorted(by_rep) for rate in epoch_rates(by_rep[rep])]
    if not rates:
        return None
    return {"samples_per_s": summary([r[0] for r in rates]), "gbps": summary([r[1] for r in rates]),
            "peer_gbps": summary([r[2] for r in rates]), "loadavg": sorted({r.get("loadavg", "") for r in rows})}


def aggregate(rows):
    """Nested dict: dataset -> system -> ... -> rate entries (see latest.json)."""
    res = defaultdict(lambda: {"memcpy_1t": None, "inplace": {}, "fi_read": defaultdict(dict), "posix": defaultdict(dict),
                               "dataloader": defaultdict(lambda: defaultdict(dict)),
                               "shardmix": defaultdict(lambda: defaultdict(dict))})
    groups = defaultdict(list)
    limits = defaultdict(list)
    for r in rows:
        ds = r.get("dataset")
        if ds is None:
            continue
        bench = r.get("bench")
        if bench == "memcpy" and r.get("threads") == 1:
            limits[("memcpy", ds)].append(r)
        elif bench == "inplace":
            limits[("inplace", ds, r["processes"])].append(r)
        elif bench == "fabric_read":
            limits[("fi_read", ds, r["provider_run"], r["ranks"])].append(r)
        elif bench == "posix_reader":
            groups[("posix", ds, r["threads"], "dropped" if r["drop_caches"] else "warm")].append(r)
        elif bench == "torch":
            groups[("torch", ds, r["world"], "dropped" if r["drop_caches"] else "warm",
                    f"{r['workers']}:{r['collate']}")].append(r)
        elif bench == "shardmix":
            groups[("shardmix", ds, r["provider"], r["nodes"], f"q{r['q']:g}_{r['touch']}_{r['cache']}")].append(r)
    # The limits: one figure per repetition (memcpy and in-place: the median of its passes;
    # raw fi_read: its timed phase); median, min and max over the repetitions.
    for key, grp in limits.items():
        if key[0] == "fi_read":
            _, ds, provider, ranks = key
            res[ds]["fi_read"][provider][str(ranks)] = {
                "gbps": summary([x["total_gbps"] for x in grp]),
                "ops_per_s": summary([x["total_ops_per_s"] for x in grp])}
            continue
        entry = {"gbps": summary([x["gbps_median"] for x in grp]),
                 "samples_per_s": summary([x["samples_per_s_median"] for x in grp])}
        if key[0] == "memcpy":
            res[key[1]]["memcpy_1t"] = entry
        else:
            res[key[1]]["inplace"][str(key[2])] = entry
    for key, grp in groups.items():
        if key[0] == "posix":
            _, ds, threads, cache = key
            measured = [x for x in grp if x["epoch"] >= 1]
            res[ds]["posix"][str(threads)][cache] = {
                "samples_per_s": summary([x["samples_per_s"] for x in measured]),
                "gbps": summary([x["gbps"] for x in measured]), "loadavg": sorted({x.get("loadavg", "") for x in grp})}
        elif key[0] == "torch":
            _, ds, world, cache, config = key
            res[ds]["dataloader"][str(world)][cache][config] = rate_entry(grp)
        else:
            _, ds, provider, nodes, variant = key
            res[ds]["shardmix"][provider][str(nodes)][variant] = rate_entry(grp)
    # Best DataLoader configuration per (dataset, world, cache), overall and with workers >= 1.
    for ds, d in res.items():
        for world, caches in d["dataloader"].items():
            for cache, configs in list(caches.items()):
                valid = {c: e for c, e in configs.items() if c.count(":") and e}
                if not valid:
                    continue
                best = max(valid, key=lambda c: valid[c]["samples_per_s"]["median"])
                overlapping = {c: e for c, e in valid.items() if int(c.split(":")[0]) >= 1}
                caches[cache] = {"configs": configs, "best": best,
                                 "best_overlapping": max(overlapping, key=lambda c: overlapping[c]["samples_per_s"]["median"])
                                 if overlapping else None}
    return json.loads(json.dumps(res))


def med(entry, field="samples_per_s"):
    if not entry or entry.get(field) is None:
        return None
    v = entry[field]
    return v["median"] if isinstance(v, dict) else v


def verdict(name, measured, reference, what, **where):
    threshold = TARGETS[name]
    ratio = measured / reference if measured is not None and reference else None
    return {"target": name, **where, "what": what, "measured": measured, "reference": reference, "ratio": ratio,
            "threshold": threshold, "met": None if ratio is None else ratio >= threshold}


def evaluate_targets(res):
    out = []
    d = res.get("mixed")
    if not d:
        return out
    memcpy = med(d.get("memcpy_1t"), "gbps")
    for provider, by_nodes in d["shardmix"].items():
        nodes_sorted = sorted(by_nodes, key=int)
        biggest = nodes_sorted[-1]
        if "1" in by_nodes:
            out.append(verdict("local_vs_memcpy", med(by_nodes["1"].get("q0_copy_warm"), "gbps"), memcpy,
                               "ShardMix Q=0, 1 trainer copying, GB/s vs memcpy 1 thread GB/s", provider=provider, nodes=1))
        for n in nodes_sorted:
            v = by_nodes[n]
            out.append(verdict("local_vs_inplace", med(v.get("q0_copy_warm"), "gbps"), med(d["inplace"].get(n), "gbps"),
                               f"ShardMix Q=0 GB/s vs {n} process(es) copying in place GB/s", provider=provider,
                               nodes=int(n)))
            if int(n) >= 2:
                out.append(verdict("peer_vs_fi_read", med(v.get("q1_none_warm"), "peer_gbps"),
                                   med(d["fi_read"].get(provider, {}).get(n), "gbps"),
                                   f"ShardMix Q=1 views-only peer GB/s vs raw fi_read {n} ranks GB/s",
                                   provider=provider, nodes=int(n)))
        v = by_nodes[biggest]
        dl = d["dataloader"].get(biggest, {})
        cold, warm = dl.get("dropped", {}), dl.get("warm", {})
        if cold.get("best"):
            out.append(verdict("cold_vs_dataloader", med(v.get("q1_copy_dropped")),
                               med(cold["configs"][cold["best"]]),
                               f"ShardMix Q=1 samples/s vs DataLoader best ({cold['best']}), page cache dropped",
                               provider=provider, nodes=int(biggest)))
        if warm.get("best"):
            out.append(verdict("warm_vs_dataloader", med(v.get("q1_copy_warm")), med(warm["configs"][warm["best"]]),
                               f"ShardMix Q=1 samples/s vs DataLoader best ({warm['best']}), warm",
                               provider=provider, nodes=int(biggest)))
        if warm.get("best_overlapping"):
            out.append(verdict("warm_vs_overlapping", med(v.get("q1_copy_warm")),
                               med(warm["configs"][warm["best_overlapping"]]),
                               f"ShardMix Q=1 samples/s vs DataLoader best with workers >= 1 "
                               f"({warm['best_overlapping']}), warm", provider=provider, nodes=int(biggest)))
    return out


def machine_info(repo, recorded_commit=None):
    def read(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""
    cpu = next((line.split(":", 1)[1].strip() for line in read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kib = next((int(line.split()[1]) for line in read("/proc/meminfo").splitlines()
                    if line.startswith("MemTotal:")), 0)
    commit = recorded_commit or ""
    if repo and not commit:
        try:
            commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip()
            # The run's own output (bench/results) is written before this report: not a change.
            dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no", "--",
                                    ".", ":(exclude)bench/results"],
                                   capture_output=True, text=True, check=True).stdout.strip()
            commit += " (uncommitted changes)" if dirty else ""
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    return {"nproc": os.cpu_count(), "cpu": cpu, "ram_gib": round(mem_kib / 1048576, 1),
            "kernel": platform.release(), "git_commit": commit}


def fmt_rate(e, unit="samples_per_s"):
    if not e or e.get(unit) is None:
        return "–"
    s = e[unit]
    if unit != "gbps":
        return f"{s['median']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f})"
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def cell(e, unit="samples_per_s"):
    if not e:
        return "–"
    return f"{fmt_rate(e, unit)} · {med(e, 'gbps'):.2f} GB/s"


def markdown(result):
    res, meta = result["results"], result["meta"]
    lines = [f"# ShardMix benchmark suite ({'quick' if meta['quick'] else 'full'} run)", "",
             f"{meta['date']} · {meta['machine']['nproc']} cores ({meta['machine']['cpu']}), "
             f"{meta['machine']['ram_gib']} GiB RAM, kernel {meta['machine']['kernel']} · commit "
             f"{meta['machine']['git_commit']} · `{meta['command']}` · load average at start / end: "
             f"{meta['loadavg_start']} / {meta['loadavg_end']}", "",
             "Cells: samples/s median (min–max) · GB/s median. ShardMix: over the measured epochs (epoch 0 "
             f"excluded) of {meta.get('repetitions', 1)} repetition(s); DataLoader and POSIX reader: over the "
             "measured epochs of one run; memcpy, in-place, raw fi_read: over the repetitions (interleaved with "
             "ShardMix's). Aggregate rates: all ranks' samples over the span from the first rank's start to the "
             "last rank's end.",
             ""]
    d = res.get("mixed")
    if d:
        nodes = sorted({n for p in d["shardmix"].values() for n in p} | set(d["dataloader"]), key=int)
        lines += [f"## Delivered throughput: {meta['samples']:,} samples, median 112 KiB (log-normal σ 0.5)", "",
                  "| system | page cache | " + " | ".join(f"{n} rank(s)" for n in nodes) + " |",
                  "|---|---|" + "---|" * len(nodes)]
        for provider in sorted(d["shardmix"]):
            for variant, label in (("q0_copy", "Q=0 (local), copying"), ("q1_copy", "Q=1 (global), copying"),
                                   ("q1_none", "Q=1 (global), views only")):
                for cache in ("warm", "dropped"):
                    cells = [cell(d["shardmix"][provider].get(n, {}).get(f"{variant}_{cache}")) for n in nodes]
                    if any(c != "–" for c in cells):
                        lines.append(f"| ShardMix {provider}, {label} | {cache} | " + " | ".join(cells) + " |")
        for cache in ("dropped", "warm"):
            cells = []
            for n in nodes:
                e = d["dataloader"].get(n, {}).get(cache)
                cells.append(f"{cell(e['configs'][e['best']])} [{e['best']}]" if e and e.get("best") else "–")
            lines.append(f"| DataLoader, best configuration [workers:collate] | {cache} | " + " | ".join(cells) + " |")
        for threads in sorted(d["posix"], key=int):
            for cache in ("dropped", "warm"):
                e = d["posix"][threads].get(cache)
                lines.append(f"| POSIX reader, {threads} threads (one process) | {cache} | {cell(e)} | "
                             + " | ".join("" for _ in nodes[1:]) + " |")
        if d.get("memcpy_1t"):
            lines.append(f"| memcpy, 1 thread | – | {cell(d['memcpy_1t'])} | " + " | ".join("" for _ in nodes[1:]) + " |")
        lines.append("| in-place copy, N processes | – | " + " | ".join(cell(d["inplace"].get(n)) for n in nodes) + " |")
        for provider in sorted(d["fi_read"]):
            lines.append(f"| raw fi_read {provider}, N ranks, qd 8 (reads/s) | – | " + " | ".join(
                cell(d["fi_read"][provider].get(n), "ops_per_s") for n in nodes) + " |")
        lines += ["", "### Every DataLoader configuration (samples/s, median (min–max))", "",
                  "| workers:collate | page cache | " + " | ".join(f"{n} rank(s)" for n in nodes) + " |",
                  "|---|---|" + "---|" * len(nodes)]
        configs = sorted({c for w in d["dataloader"].values() for e in w.values() for c in e.get("configs", {})})
        for config in configs:
            for cache in ("dropped", "warm"):
                lines.append(f"| {config} | {cache} | " + " | ".join(
                    fmt_rate(d["dataloader"].get(n, {}).get(cache, {}).get("configs", {}).get(config)) for n in nodes)
                    + " |")
        lines.append("")
    lines += ["## Targets (ratios of figures of the same run)", "",
              "| target | provider | N | measured | reference | ratio | needed | verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for t in result["targets"]:
        def num(x):
            return "–" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:.2f}")
        ratio = "–" if t["ratio"] is None else f"{t['ratio']:.2f}"
        status = "not measured" if t["met"] is None else ("met" if t["met"] else "**missed**")
        lines.append(f"| {t['what']} | {t['provider']} | {t['nodes']} | {num(t['measured'])} | {num(t['reference'])} "
                     f"| {ratio} | ≥ {t['threshold']:g} | {status} |")
    lines.append("")
    sizes = [(tag, res[tag]) for tag in ("small", "large") if tag in res]
    if sizes:
        lines += [f"## Small and large samples (warm; {meta['small_samples']:,} x 4 KiB, "
                  f"{meta['large_samples']:,} x 1 MiB)", "",
                  "| system | " + " | ".join(f"{'4 KiB' if t == 'small' else '1 MiB'} samples/s · GB/s"
                                              for t, _ in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        rows = defaultdict(dict)
        for tag, d in sizes:
            for provider, by_nodes in d["shardmix"].items():
                for n, variants in by_nodes.items():
                    for variant, e in variants.items():
                        q = "Q=0 (local)" if variant.startswith("q0") else "Q=1 (global)"
                        rows[f"ShardMix {provider}, {q}, {n} daemons, copying"][tag] = cell(e)
            for n, caches in d["dataloader"].items():
                e = caches.get("warm")
                if e and e.get("best"):
                    rows[f"DataLoader [{e['best']}], {n} ranks"][tag] = cell(e["configs"][e["best"]])
            for threads, caches in d["posix"].items():
                rows[f"POSIX reader, {threads} threads"][tag] = cell(caches.get("warm"))
            if d.get("memcpy_1t"):
                rows["memcpy, 1 thread"][tag] = cell(d["memcpy_1t"])
            for n, e in d["inplace"].items():
                rows[f"in-place copy, {n} processes"][tag] = cell(e)
            for provider, by_n in d["fi_read"].items():
                for n, e in by_n.items():
                    rows[f"raw fi_read {provider}, {n} ranks (reads/s)"][tag] = cell(e, "ops_per_s")
        for name, by_tag in rows.items():
            lines.append(f"| {name} | " + " | ".join(by_tag.get(t, "–") for t, _ in sizes) + " |")
        lines.append("")
    for name, part in result.get("parts", {}).items():
        lines += [f"## {name} (bench/{name}.sh)", ""]
        if part.get("reused_from"):
            lines += [f"Not re-run by this run: the last full result, {part['reused_from']} "
                      f"(measured {part.get('date', 'at an unrecorded time')}).", ""]
        lines += [part.get("markdown", "(no table)"), ""]
    for name, why in result.get("parts_missing", {}).items():
        lines += [f"## {name}: not run ({why})", ""]
    return "\n".join(lines)


def plots(result, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    d = result["results"].get("mixed")
    if d:
        fig, ax = plt.subplots(figsize=(9, 5))
        series = []
        for provider in sorted(d["shardmix"]):
            for variant, label in (("q1_copy_warm", "Q=1 warm"), ("q1_copy_dropped", "Q=1 dropped"),
                                   ("q0_copy_warm", "Q=0 warm")):
                pts = [(int(n), med(v.get(variant))) for n, v in d["shardmix"][provider].items() if v.get(variant)]
                series.append((f"ShardMix {provider} {label}", sorted(pts), "-o"))
        for cache in ("warm", "dropped"):
            pts = [(int(n), med(c[cache]["configs"][c[cache]["best"]])) for n, c in d["dataloader"].items()
                   if c.get(cache, {}).get("best")]
            series.append((f"DataLoader best, {cache}", sorted(pts), "--s"))
        for name, pts, style in series:
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name)
        ax.set_yscale("log")
        ax.set_xlabel("ranks (daemons + one trainer each / DataLoader rank processes)")
        ax.set_ylabel("samples/s (median, log scale)")
        ax.set_xticks(sorted({int(n) for n in d["dataloader"]}))
        ax.set_title(f"Delivered throughput, {result['meta']['samples']:,} samples, median 112 KiB")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, "latest-throughput.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    sizes = [(t, result["results"][t]) for t in ("small", "large") if t in result["results"]]
    if sizes:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for ax, unit, label in ((axes[0], "samples_per_s", "samples/s"), (axes[1], "gbps", "GB/s")):
            names, values, groups = [], [], []
            for tag, d in sizes:
                for provider, by_nodes in sorted(d["shardmix"].items()):
                    for n, variants in by_nodes.items():
                        for variant in sorted(variants):
                            names.append(f"{tag}\nSMX {provider}\n{variant.split('_')[0]}")
                            values.append(med(variants[variant], unit) or 0)
                            groups.append(tag)
                for n, caches in d["dataloader"].items():
                    e = caches.get("warm")
                    if e and e.get("best"):
                        names.append(f"{tag}\nDataLoader")
                        values.append(med(e["configs"][e["best"]], unit) or 0)
                        groups.append(tag)
            colors = ["tab:blue" if g == "small" else "tab:orange" for g in groups]
            ax.bar(range(len(values)), values, color=colors)
            ax.set_xticks(range(len(values)))
            ax.set_xticklabels(names, fontsize=6)
            ax.set_yscale("log")
            ax.set_ylabel(label + " (median, log)")
            ax.set_title(f"{label}: 4 KiB (blue) and 1 MiB (orange) samples, warm")
        fig.tight_layout()
        path = os.path.join(out_dir, "latest-sizes.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--command", default="bash bench/run.sh")
    ap.add_argument("--quick", type=int, default=0)
    ap.add_argument("--samples", type=int, default=16384)
    ap.add_argument("--small-samples", type=int, default=0)
    ap.add_argument("--large-samples", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1, help="repetitions of ShardMix and the limits")
    ap.add_argument("--repo", default="")
    ap.add_argument("--part", action="append", default=[], help="NAME=FILE: a colleague's JSON to merge")
    ap.add_argument("--reused", action="append", default=[],
                    help="NAME: that --part is an earlier run's saved result, not measured now")
    ap.add_argument("--part-absent", action="append", default=[])
    ap.add_argument("--part-failed", action="append", default=[])
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()

    rows = []
    with open(args.raw) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SystemExit(f"suite_report.py: {args.raw}:{number}: not JSON ({e})")
    phases = {r["phase"]: r["phase_loadavg"] for r in rows if "phase" in r}
    start = next((r for r in rows if r.get("phase") == "start"), {})
    res = aggregate(rows)
    result = {
        # The run's start time and commit when run.sh recorded them (a re-render later keeps them).
        "meta": {"date": start.get("utc") or utc_now(),
                 "machine": machine_info(args.repo, start.get("commit")), "command": args.command, "quick": bool(args.quick),
                 "samples": args.samples, "small_samples": args.small_samples, "large_samples": args.large_samples,
                 "epochs_per_run": args.epochs, "repetitions": args.repeat, "loadavg_start": phases.get("start", "?"),
                 "loadavg_end": phases.get("end", "?")},
        "results": res,
    }
    result["targets"] = evaluate_targets(res)
    result["parts"], result["parts_missing"] = {}, {}
    for spec in args.part:
        name, _, path = spec.partition("=")
        try:
            with open(path) as f:
                part = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            result["parts_missing"][name] = f"{path} unreadable: {e}"
            continue
        if not isinstance(part.get("markdown"), str):
            result["parts_missing"][name] = f"{path} has no string field 'markdown'"
            continue
        if name in args.reused:
            part["reused_from"] = os.path.relpath(path, args.repo) if args.repo else path
        result["parts"][name] = part
        result[name] = part
    for name in args.part_absent:
        result["parts_missing"][name] = f"bench/{name}.sh absent on this branch"
    for name in args.part_failed:
        result["parts_missing"][name] = f"bench/{name}.sh failed"
    os.makedirs(args.out_dir, exist_ok=True)
    md = markdown(result)
    result["markdown"] = md
    with open(os.path.join(args.out_dir, "latest.json"), "w") as f:
        json.dump({k: v for k, v in result.items() if k != "parts"}, f, indent=1)
    with open(os.path.join(args.out_dir, "latest.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    if not args.no_plots:
        for path in plots(result, args.out_dir):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
