#!/usr/bin/env python3
"""bench/checkpoint.sh's figures from its raw rows (bench/checkpoint_torch.py's JSON lines
plus one "conditions" row): prints a Markdown table and writes OUT (JSON).

    python3 bench/checkpoint_report.py RAW.jsonl OUT.json

Per mode and run, over the measured epochs (1.. when there are at least 2: epoch 0 holds the
connections' set-up and the first touch of every page):
  save_s_per_save   a rank's time in one save (mean over ranks and saves);
  save_s_first, save_s_later, save_s_max
                    each rank's first measured save (mean over ranks), the saves after it
                    (mean), the slowest one: where a mean hides a slow start;
  stall_fraction    time waiting for batches over the time not spent saving, per rank,
                    averaged over ranks: the data stall a checkpoint's drain could raise;
  rate              the after-phase's bytes over the span from the first rank's start to
                    the last one's end (drain: saved until durable; fs_write: write + fsync).
Targets: torch's save time / ShardMix's >= 10; ShardMix's stall fraction minus the
no-checkpoint run's <= 0.01; drain rate / file system rate >= 0.8. Medians over runs.
"""
import json
import statistics
import sys


def load(path):
    rows, conditions = [], {}
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if row.get("kind") == "conditions":
                    conditions = row
                else:
                    rows.append(row)
    return rows, conditions


def epoch_figures(rows):
    epochs = sorted({r["epoch"] for r in rows})
    measured = [e for e in epochs if e >= 1] or epochs
    per_rank = {}
    each = {}  # rank -> its saves' times in order (rows without save_each_s: none)
    for r in sorted(rows, key=lambda r: r["epoch"]):
        if r["epoch"] in measured:
            each.setdefault(r["rank"], []).extend(r.get("save_each_s", []))
            acc = per_rank.setdefault(r["rank"], {"wait": 0.0, "save": 0.0, "span": 0.0, "saves": 0, "samples": 0})
            acc["wait"] += r["wait_s"]
            acc["save"] += r["save_s"]
            acc["span"] += r["t_end"] - r["t_start"]
            acc["saves"] += r["saves"]
            acc["samples"] += r["samples"]
    stall = statistics.mean(a["wait"] / max(a["span"] - a["save"], 1e-9) for a in per_rank.values())
    saves = sum(a["saves"] for a in per_rank.values())
    save_s = sum(a["save"] for a in per_rank.values()) / saves if saves else None
    span = max(a["span"] for a in per_rank.values())
    firsts = [times[0] for times in each.values() if times]
    laters = [t for times in each.values() for t in times[1:]]
    return {"stall_fraction": stall, "save_s_per_save": save_s, "saves": saves, "measured_epochs": measured,
            "save_s_first": statistics.mean(firsts) if firsts else None,
            "save_s_later": statistics.mean(laters) if laters else None,
            "save_s_max": max(firsts + laters) if firsts else None,
            "samples_per_s": sum(a["samples"] for a in per_rank.values()) / span if span > 0 else None}


def phase_rate(rows):
    if not rows:
        return None
    total = sum(r["bytes"] for r in rows)
    span = max(r["t_end"] for r in rows) - min(r["t_start"] for r in rows)
    return total / span if span > 0 else None


def summarize(rows):
    runs = {}
    for r in rows:
        key = (r["mode"], r["run"])
        runs.setdefault(key, {"epochs": [], "phase": []})["phase" if "phase" in r else "epochs"].append(r)
    out = {}
    for (mode, run), parts in sorted(runs.items()):
        fig = epoch_figures(parts["epochs"])
        fig["after_phase_bytes_per_s"] = phase_rate(parts["phase"])
        out.setdefault(mode, []).append(fig)
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def span_text(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def main():
    raw, out_path = sys.argv[1], sys.argv[2]
    rows, conditions = load(raw)
    modes = summarize(rows)
    need = {"none", "shardmix", "torch"}
    if not need <= modes.keys():
        sys.exit(f"checkpoint_report.py: {raw} lacks the runs of {sorted(need - modes.keys())}")
    m = {mode: {k: median([f[k] for f in figs]) for k in figs[0] if k != "measured_epochs"}
         for mode, figs in modes.items()}
    save_ratio = m["torch"]["save_s_per_save"] / m["shardmix"]["save_s_per_save"]
    stall_rise = m["shardmix"]["stall_fraction"] - m["none"]["stall_fraction"]
    drain_ratio = m["shardmix"]["after_phase_bytes_per_s"] / m["torch"]["after_phase_bytes_per_s"]
    result = {
        "bench": "checkpoint",
        "conditions": conditions,
        "runs": modes,
        "save_s_per_save": {"shardmix": m["shardmix"]["save_s_per_save"], "torch": m["torch"]["save_s_per_save"],
                            "torch_over_shardmix": save_ratio, "target": 10.0, "met": save_ratio >= 10.0},
        "stall_fraction": {"none": m["none"]["stall_fraction"], "shardmix": m["shardmix"]["stall_fraction"],
                           "torch": m["torch"]["stall_fraction"], "shardmix_rise": stall_rise, "target": 0.01,
                           "met": stall_rise <= 0.01},
        "drain": {"drain_bytes_per_s": m["shardmix"]["after_phase_bytes_per_s"],
                  "fs_write_bytes_per_s": m["torch"]["after_phase_bytes_per_s"], "ratio": drain_ratio,
                  "target": 0.8, "met": drain_ratio >= 0.8},
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    mib = conditions.get("state_mib", "?")
    print(f"\nCheckpoints of {mib} MiB per rank, 4 ranks ({conditions.get('command', '')}); "
          f"load {conditions.get('loadavg_start', '?')} -> {conditions.get('loadavg_end', '?')}; "
          f"shmem_enabled {conditions.get('shmem_huge_pages') or 'unknown'}\n")
    print("| figure | ShardMix | torch.save to the file system | no checkpoint | ratio | target | met |")
    print("|---|---|---|---|---|---|---|")
    sec = lambda v: f"{v:.3f} s"  # noqa: E731
    pct = lambda v: f"{100 * v:.2f}%"  # noqa: E731
    rate = lambda v: f"{v / 1e6:.0f} MB/s"  # noqa: E731
    print(f"| time in one save | {span_text([f['save_s_per_save'] for f in modes['shardmix']], sec)} | "
          f"{span_text([f['save_s_per_save'] for f in modes['torch']], sec)} | - | {save_ratio:.1f}x shorter | "
          f">= 10x | {'yes' if save_ratio >= 10 else 'NO'} |")
    print(f"| data stall fraction | {span_text([f['stall_fraction'] for f in modes['shardmix']], pct)} | "
          f"{span_text([f['stall_fraction'] for f in modes['torch']], pct)} | "
          f"{span_text([f['stall_fraction'] for f in modes['none']], pct)} | {100 * stall_rise:+.2f} points | "
          f"<= +1 point | {'yes' if stall_rise <= 0.01 else 'NO'} |")
    print(f"| drain rate / file system write rate | "
          f"{span_text([f['after_phase_bytes_per_s'] for f in modes['shardmix']], rate)} | "
          f"{span_text([f['after_phase_bytes_per_s'] for f in modes['torch']], rate)} (raw write + fsync) | - | "
          f"{drain_ratio:.2f} | >= 0.8 | {'yes' if drain_ratio >= 0.8 else 'NO'} |")
    sm = m["shardmix"]
    if sm.get("save_s_first") is not None:
        later = f"{sm['save_s_later']:.2f} s" if sm.get("save_s_later") is not None else "-"
        print(f"\nShardMix's saves: each rank's first {sm['save_s_first']:.2f} s (mean), the later ones {later} "
              f"(mean), the slowest {sm['save_s_max']:.2f} s")
    print(f"\nwritten {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
