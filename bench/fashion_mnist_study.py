#!/usr/bin/env python3
"""Entropy knob vs accuracy: Fashion-MNIST, class-sorted placement, 4 daemons, 4 DDP trainers.

    /usr/bin/python3 bench/fashion_mnist_study.py [--seeds 1 2 3] [--qs 0 0.01 0.1 1]
        [--epochs 3] [--out bench/results/fashion-mnist-study] [--quick]

For every seed and every exchange fraction Q (shuffle.exchange_fraction), runs one job with
deploy/launch.sh: 4 shardmixd daemons (tcp over loopback, dataset.placement = "sorted",
examples/fashion_mnist.toml) and 4 trainer ranks of examples/train_fashion_mnist.py (a small
CNN with BatchNorm, DDP over gloo, augmentation off, batch 32 per trainer). The seed is both
shuffle.seed and the model's initial-weights seed. Qs run interleaved within each seed, so
machine load drifts over all of them alike.

Writes OUT.json (every run's per-epoch figures and the summary), OUT.png (final test
accuracy and per-trainer batch label entropy against Q, test accuracy per epoch) and prints
the summary as a Markdown table (docs/shuffle-quality.md). Raw per-run JSON and logs: under
--work (default /tmp/shardmix-fmnist-study). --quick: 1 seed, 1 epoch, Q in {0, 1}.
Needs the build (cmake --build build: shardmixd and the Python module), python3-torch,
python3-matplotlib and dataset-fashion-mnist (deploy/install-deps.sh).
Exit status: 0 every run succeeded, 1 some failed (the others are still summarised).
"""
import argparse
import datetime
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))
from fashion_mnist_to_shardmix import convert  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(args, build, data_root, q, seed, work):
    tag = f"q{q:g}-seed{seed}"
    out_json = os.path.join(work, f"{tag}.json")
    log = os.path.join(work, f"{tag}.log")
    env = dict(os.environ)
    env.update(PYTHONPATH=os.path.join(build, "python") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
               SHARDMIX_BUILD_DIR=build,
               SHARDMIX_TRAINER_MPI_ARGS="-x PYTHONPATH -x MASTER_ADDR -x MASTER_PORT -x OMP_NUM_THREADS")
    for k in [k for k in env if k.startswith("SHARDMIX_") and k not in ("SHARDMIX_BUILD_DIR", "SHARDMIX_TRAINER_MPI_ARGS",
                                                                       "SHARDMIX_MPIRUN", "SHARDMIX_MPIRUN_FLAGS")]:
        del env[k]  # a stray config override in the caller's shell must not change the study
    # timeout(1) sends SIGTERM to launch.sh, whose traps stop the daemons and trainers.
    cmd = ["timeout", "-s", "TERM", "-k", "30", str(int(args.run_timeout)), "bash", os.path.join(REPO, "deploy/launch.sh"), "--nodes", "4", "--trainers-per-node", "1",
           "--config", os.path.join(REPO, "examples/fashion_mnist.toml"),
           "--set", f"dataset.path={data_root}", "--set", f"shuffle.seed={seed}",
           "--set", f"shuffle.exchange_fraction={q}", "--daemon-log", log + ".daemons", "--",
           sys.executable, os.path.join(REPO, "examples/train_fashion_mnist.py"), "--epochs", str(args.epochs),
           "--init-seed", str(seed), "--eval-every-epoch", "--json", out_json]
    if os.path.exists(out_json):
        os.unlink(out_json)
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    wall = time.monotonic() - t0
    if rc != 0 or not os.path.exists(out_json):
        print(f"  {tag}: FAILED (exit {rc}); see {log}", flush=True)
        return None
    with open(out_json) as f:
        run = json.load(f)
    run.update(q=q, seed=seed, wall_seconds=wall)
    print(f"  {tag}: test accuracy {run['final_test_accuracy']:.4f}, {wall:.0f} s", flush=True)
    return run


def mean_sd(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarise(runs, qs):
    rows = []
    for q in qs:
        rs = [r for r in runs if r["q"] == q]
        if not rs:
            continue
        acc = [r["final_test_accuracy"] for r in rs]
        # Per-trainer batch label entropy as ShardMix reported it (EpochStats), every trainer
        # and epoch of every run; p5 = the worst trainer's 5th percentile, averaged over runs.
        ent = [t["label_entropy_mean"] for r in rs for e in r["epochs"] for t in e["trainers"]]
        p5 = [min(t["label_entropy_p5"] for e in r["epochs"] for t in e["trainers"]) for r in rs]
        peer = [t["peer_samples"] / max(1, t["samples"]) for r in rs for e in r["epochs"] for t in e["trainers"]]
        qused = sorted({t["exchange_fraction"] for r in rs for e in r["epochs"] for t in e["trainers"]})
        # samples/s: all trainers' samples / the slowest trainer's epoch time; epoch 0 is
        # left out when there are more (it pays the first-touch and warm-up costs).
        sps = [e["samples_per_s"] for r in rs for e in r["epochs"] if e["epoch"] > 0 or len(r["epochs"]) == 1]
        per_epoch = []
        for k in range(max(len(r["epochs"]) for r in rs)):
            per_epoch.append(mean_sd([r["epochs"][k].get("test_accuracy") for r in rs if len(r["epochs"]) > k]))
        bn = [r["final_test_accuracy_bn_recalibrated"] for r in rs
              if r.get("final_test_accuracy_bn_recalibrated") is not None]
        rows.append({
            "q": q, "runs": len(rs), "seeds": [r["seed"] for r in rs],
            "accuracy_mean": mean_sd(acc)[0], "accuracy_sd": mean_sd(acc)[1],
            "accuracy_min": min(acc), "accuracy_max": max(acc), "accuracies": acc,
            "label_entropy_mean": statistics.fmean(ent), "label_entropy_min": min(ent),
            "label_entropy_p5_worst_mean": statistics.fmean(p5),
            "peer_fraction": statistics.fmean(peer), "exchange_fraction_reported": qused,
            "samples_per_s_median": statistics.median(sps), "samples_per_s_min": min(sps),
            "samples_per_s_max": max(sps),
            "test_accuracy_per_epoch": [m for m, _ in per_epoch],
            "test_accuracy_per_epoch_sd": [s for _, s in per_epoch],
            # Diagnostic (examples/train_fashion_mnist.py): BatchNorm statistics re-estimated
            # on 2,000 training images of all classes after training, weights unchanged.
            "bn_recalibrated_runs": len(bn), "bn_recalibrated_mean": mean_sd(bn)[0],
            "bn_recalibrated_sd": mean_sd(bn)[1],
            "train_loss_last_epoch": statistics.fmean(r["epochs"][-1]["train_loss"] for r in rs),
        })
    return rows


def markdown(rows):
    lines = ["| Q | runs | final test accuracy, mean ± sd (min..max) | label entropy per trainer, mean (worst p5) "
             "| peer fraction | samples/s, median (min..max) | accuracy with BatchNorm re-estimated (runs) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        bn = (f"{100 * r['bn_recalibrated_mean']:.2f} % ± {100 * r['bn_recalibrated_sd']:.2f} "
              f"({r['bn_recalibrated_runs']})" if r.get("bn_recalibrated_runs") else "-")
        lines.append(
            f"| {r['q']:g} | {r['runs']} | {100 * r['accuracy_mean']:.2f} % ± {100 * r['accuracy_sd']:.2f} "
            f"({100 * r['accuracy_min']:.2f}..{100 * r['accuracy_max']:.2f}) "
            f"| {r['label_entropy_mean']:.3f} ({r['label_entropy_p5_worst_mean']:.3f}) | {r['peer_fraction']:.3f} "
            f"| {r['samples_per_s_median']:.0f} ({r['samples_per_s_min']:.0f}..{r['samples_per_s_max']:.0f}) "
            f"| {bn} |")
    return "\n".join(lines)


def plot(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [max(r["q"], 1e-3) for r in rows]  # Q = 0 drawn at 0.001 on the log axis
    a1.errorbar(xs, [100 * r["accuracy_mean"] for r in rows], yerr=[100 * r["accuracy_sd"] for r in rows],
                marker="o", capsize=4, color="C0", label="final test accuracy (mean ± sd over seeds)")
    for r, x in zip(rows, xs):
        a1.scatter([x] * len(r["accuracies"]), [100 * a for a in r["accuracies"]], color="C0", alpha=0.35, s=12)
    bnr = [(x, r) for x, r in zip(xs, rows) if r.get("bn_recalibrated_runs")]
    if bnr:
        a1.plot([x for x, _ in bnr], [100 * r["bn_recalibrated_mean"] for _, r in bnr], marker="^", linestyle="--",
                color="C2", label="same models, BatchNorm statistics re-estimated")
        a1.legend(loc="lower right", fontsize=8)
    a1.set_xscale("log")
    a1.set_xticks(xs)
    a1.set_xticklabels([f"{r['q']:g}" for r in rows])
    a1.set_xlabel("exchange fraction Q (shuffle.exchange_fraction)")
    a1.set_ylabel("test accuracy (%)", color="C0")
    b1 = a1.twinx()
    b1.plot(xs, [r["label_entropy_mean"] for r in rows], marker="s", color="C1", label="label entropy per trainer")
    b1.set_ylim(0, 1)
    b1.set_ylabel("per-trainer batch label entropy (ShardMix)", color="C1")
    a1.set_title("accuracy and entropy vs Q")
    for r in rows:
        acc = r["test_accuracy_per_epoch"]
        a2.plot(range(1, len(acc) + 1), [100 * a for a in acc], marker="o", label=f"Q = {r['q']:g}")
    a2.set_xlabel("epoch")
    a2.set_ylabel("test accuracy (%), mean over seeds")
    a2.set_title("test accuracy per epoch")
    a2.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--qs", type=float, nargs="+", default=[0, 0.01, 0.1, 1])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(REPO, "bench/results/fashion-mnist-study"))
    ap.add_argument("--work", default="/tmp/shardmix-fmnist-study")
    ap.add_argument("--data", default="/tmp/shardmix-fmnist", help="converted dataset (made if missing)")
    ap.add_argument("--build", default=os.environ.get("SHARDMIX_BUILD_DIR", os.path.join(REPO, "build")))
    ap.add_argument("--run-timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--summarise", metavar="JSON", help="only re-summarise an earlier OUT.json (table, PNG)")
    args = ap.parse_args()
    if args.summarise:
        with open(args.summarise) as f:
            result = json.load(f)
        result["summary"] = rows = summarise(result["runs"], result["qs"])
        with open(args.summarise, "w") as f:
            json.dump(result, f, indent=1)
        plot(rows, args.summarise[:-5] + ".png",
             f"Fashion-MNIST, class-sorted placement, 4 daemons x 1 DDP trainer, batch 32, {result['epochs']} epochs, "
             f"seeds {result['seeds']} ({result['started_utc'][:10]} UTC)")
        print(markdown(rows))
        return 0
    if args.quick:
        args.seeds, args.qs, args.epochs = args.seeds[:1], [0.0, 1.0], 1
        if args.out.endswith("fashion-mnist-study"):
            args.out += "-quick"
    build = os.path.abspath(args.build)
    if not os.path.isdir(os.path.join(build, "python", "shardmix")):
        sys.exit(f"{build}/python/shardmix is missing: build first (cmake --build {build})")
    os.makedirs(args.work, exist_ok=True)
    root, n = convert(args.data)
    started = datetime.datetime.now(datetime.timezone.utc)
    print(f"fashion-mnist study: {n} training images in {root}; seeds {args.seeds}, Q {args.qs}, "
          f"{args.epochs} epochs; started {started:%Y-%m-%d %H:%M} UTC", flush=True)
    runs, failed = [], 0
    for seed in args.seeds:
        for q in args.qs:
            r = run_one(args, build, root, q, seed, args.work)
            if r is None:
                failed += 1
            else:
                runs.append(r)
    rows = summarise(runs, args.qs)
    command = "/usr/bin/python3 bench/fashion_mnist_study.py " + " ".join(sys.argv[1:])
    finished = datetime.datetime.now(datetime.timezone.utc)
    result = {"command": command.strip(), "started_utc": started.isoformat(timespec="seconds"),
              "finished_utc": finished.isoformat(timespec="seconds"), "seeds": args.seeds, "qs": args.qs,
              "epochs": args.epochs, "failed_runs": failed, "host": socket.gethostname(),
              "cpus": os.cpu_count(), "summary": rows, "runs": runs}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    if rows:
        plot(rows, args.out + ".png",
             f"Fashion-MNIST, class-sorted placement, 4 daemons x 1 DDP trainer, batch 32, {args.epochs} epochs, "
             f"seeds {args.seeds} ({started:%Y-%m-%d} UTC)")
    print()
    print(markdown(rows))
    print(f"\nwrote {args.out}.json and {args.out}.png ({failed} failed runs)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
