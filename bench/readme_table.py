#!/usr/bin/env python3
"""Prints the delivery results block of docs/performance.md from bench/results/delivery-latest.json.

    python3 bench/readme_table.py [bench/results/delivery-latest.json]

docs/performance.md embeds this output verbatim (the script kept its old name), so its figures are the ones the benchmark wrote.
"""
import json
import sys


def fmt_range(entry):
    return f"{entry['gbps']:.2f} ({entry['gbps_min']:.2f}-{entry['gbps_max']:.2f})"


def method_sentence(d):
    """How the ShardMix figures were taken: a result written before decision 0050 has no
    "method" and used free-running trainers with per-epoch spans."""
    if "method" not in d:
        return ("GB/s, median over 3 runs x 3 epochs (min-max); free-running trainers, an epoch's rate is all "
                "trainers' bytes over the wall-clock span from the first trainer's start to the last one's end.")
    return ("GB/s, median over the runs (min-max); trainers in lockstep (one MPI_Allreduce per batch), a run's "
            "rate is all trainers' bytes of the measured epochs over the whole span from the first trainer's "
            "first batch of epoch 1 to the last trainer's last batch.")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/delivery-latest.json"
    d = json.load(open(path))
    memcpy = d["memcpy_gbps"]
    providers = d["providers"]
    print(f"Measured {d['date']} on this development machine ({d['machine']}, KVM guest): "
          f"{d['dataset']}, 4 daemons + 4 trainer processes, batch 32, prefetch 8. "
          "Baselines measured in the same run. " + method_sentence(d))
    print()
    print("| provider | Q = 0, all local, trainers copy | Q = 1, global, trainers copy | Q = 1, global, views only "
          "| of which peer (views only) | memcpy 1 thread | memcpy 2 threads | raw `fi_read` (4 ranks, qd 8) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, e in providers.items():
        print(f"| {name} | {fmt_range(e['q0'])} | {fmt_range(e['q1'])} | {fmt_range(e['q1_none'])} "
              f"| {e['q1_none']['peer_gbps']:.2f} | {memcpy['1']:.2f} | {memcpy['2']:.2f} "
              f"| {e['raw_fi_read_gbps']:.2f} |")
    print()
    print("| target (first working version) | " + " | ".join(providers) + " |")
    print("|---|" + "---|" * len(providers))
    print("| local-cache delivery >= 50% of single-thread memcpy of the same bytes | "
          + " | ".join(f"{e['local_vs_memcpy_1t']:.0%}" for e in providers.values()) + " |")
    print("| peer delivery >= 70% of raw `fi_read` of the same sizes (views only, like the baseline) | "
          + " | ".join(f"{e['peer_vs_raw_fi_read']:.0%}" for e in providers.values()) + " |")
    print("| for reference: peer bytes/s while trainers also copy every byte, / raw `fi_read` | "
          + " | ".join(f"{e['peer_copying_vs_raw_fi_read']:.0%}" for e in providers.values()) + " |")


if __name__ == "__main__":
    main()
