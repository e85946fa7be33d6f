#!/usr/bin/env python3
"""Draws the planning-scaling figure from shardmix-bench-plan-scaling's table.

    build/bench/shardmix-bench-plan-scaling --nodes-measured 7 | tee plan.txt
    /usr/bin/python3 bench/plan_scaling_plot.py plan.txt --png docs/images/plan-scaling.png

Two panels, plan CPU seconds per node per epoch against the node count P, both axes
logarithmic: weak scaling (fixed samples per node: flat is ideal) and strong scaling
(fixed N: falling as 1/P is ideal), each with the current planner (reading the placement's
lists, and reading spread ownership, a function of the id) next to the algorithm it replaced (old_x_T: what the old scheduler spent per node, once per trainer), measured
in the same run. Reads the table rows only ("weak" / "strong" lines); anything else the
bench prints is ignored, so its stdout can be piped in whole ("-" reads stdin).
"""
import argparse
import sys


def read_rows(stream):
    rows = {"weak": [], "strong": []}
    for line in stream:
        f = line.split()
        if len(f) >= 9 and f[0] in rows and f[1].isdigit():
            rows[f[0]].append({"P": int(f[1]), "N": int(f[2]), "new": float(f[4]), "spread": float(f[5]),
                               "old_x_T": float(f[7])})
    if not rows["weak"] and not rows["strong"]:
        sys.exit("plan_scaling_plot.py: no 'weak' or 'strong' rows in the input "
                 "(expected shardmix-bench-plan-scaling's table)")
    return rows


def plot(rows, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, series, ideal in ((axes[0], "weak", "flat"), (axes[1], "strong", "1/P")):
        r = rows[series]
        if not r:
            ax.set_visible(False)
            continue
        p = [x["P"] for x in r]
        ax.loglog(p, [x["new"] for x in r], "o-", label="seeded bijections, listed ownership")
        ax.loglog(p, [x["spread"] for x in r], "^-", label="seeded bijections, spread ownership")
        ax.loglog(p, [x["old_x_T"] for x in r], "s--", label="replaced algorithm, once per trainer")
        first = r[0]["new"]
        ref = [first] * len(p) if ideal == "flat" else [first * p[0] / q for q in p]
        ax.loglog(p, ref, ":", color="grey", label=f"ideal ({ideal})")
        n = r[0]["N"] // r[0]["P"] if series == "weak" else r[0]["N"]
        what = f"{n:,} samples per node" if series == "weak" else f"N = {n:,} samples"
        ax.set_title(f"{series} scaling, {what}")
        ax.set_xlabel("nodes P")
        ax.set_ylabel("plan CPU s per node per epoch")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", help="the bench's output ('-' for stdin)")
    ap.add_argument("--png", required=True, help="PNG to write")
    ap.add_argument("--title", default="ShardMix epoch planning, 8 trainers per node")
    a = ap.parse_args()
    with (sys.stdin if a.table == "-" else open(a.table)) as f:
        rows = read_rows(f)
    plot(rows, a.png, a.title)
    for series in ("weak", "strong"):
        r = rows[series]
        if len(r) >= 2:
            print(f"{series}: P = {r[0]['P']} -> {r[-1]['P']}: new planner x{r[-1]['new'] / r[0]['new']:.3g}, "
                  f"spread x{r[-1]['spread'] / r[0]['spread']:.3g}")
    print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
