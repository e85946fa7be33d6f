#!/usr/bin/env python3
"""Per-thread CPU time and context switches of a benchmark's processes, over a time window.

  thread_cpu.py sample OUT PATTERN MARK   # every 0.1 s until OUT.stop exists
  thread_cpu.py window OUT T0 T1          # table for CLOCK_MONOTONIC seconds [T0, T1]

`sample` snapshots /proc/PID/task/TID/{stat,status} of every process whose comm matches
the regex PATTERN and whose command line contains MARK (so that other people's daemons
on a shared machine are not counted), one line per thread and snapshot. It is one Python
process and forks nothing: a shell loop of cat/awk per thread would itself steal the CPU
being measured. `window` subtracts, per thread, the last snapshot before T0 from the
last one inside the window, and sums by (process name, thread name).

Timestamps are /proc/uptime, which on a machine that never suspends equals
CLOCK_MONOTONIC (what shardmix-consume's t_start/t_end and steady_clock use).
"""
import collections
import os
import re
import sys
import time


def sample(out, pattern, mark):
    wanted = re.compile(pattern)
    with open(out + ".raw", "w") as f:
        while not os.path.exists(out + ".stop"):
            now = open("/proc/uptime").read().split()[0]
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    comm = open(f"/proc/{pid}/comm").read().strip()
                    if not wanted.search(comm) or mark not in open(f"/proc/{pid}/cmdline").read():
                        continue
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        stat = open(f"/proc/{pid}/task/{tid}/stat").read().strip()
                        voluntary = involuntary = "0"
                        for line in open(f"/proc/{pid}/task/{tid}/status"):
                            if line.startswith("voluntary_ctxt_switches"):
                                voluntary = line.split()[1]
                            elif line.startswith("nonvoluntary_ctxt_switches"):
                                involuntary = line.split()[1]
                        f.write(f"{now} {pid} {tid} {comm.replace(' ', '_')} {voluntary} {involuntary} {stat}\n")
                except OSError:
                    pass  # the process or thread exited between listdir and open
            f.flush()
            time.sleep(0.1)


def window(out, t0, t1):
    ticks = os.sysconf("SC_CLK_TCK")
    before, inside = {}, {}
    for line in open(out + ".raw"):
        fields = line.split()
        at = float(fields[0])
        process, voluntary, involuntary = fields[3], int(fields[4]), int(fields[5])
        stat = " ".join(fields[6:])
        thread = stat[stat.index("(") + 1:stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2:].split()
        utime, stime = int(rest[11]), int(rest[12])  # stat fields 14 and 15
        row = (process, thread, voluntary, involuntary, utime, stime)
        tid = fields[2]
        if at < t0:
            before[tid] = row
        elif at <= t1:
            inside[tid] = row
    totals = collections.defaultdict(lambda: [0, 0, 0, 0, 0])
    for tid, row in inside.items():
        base = before.get(tid, (row[0], row[1], 0, 0, 0, 0))
        acc = totals[(row[0], row[1])]
        acc[0] += 1
        for i in range(4):
            acc[i + 1] += row[i + 2] - base[i + 2]
    seconds = t1 - t0
    print(f"window {seconds:.2f} s")
    print(f"{'process':18} {'thread':16} {'n':>3} {'user_s':>7} {'sys_s':>7} {'cores':>6} {'vol_cs/s':>9} {'invol_cs/s':>10}")
    cpu_total = 0.0
    for (process, thread), (n, vol, invol, ut, st) in sorted(totals.items(), key=lambda kv: -(kv[1][3] + kv[1][4])):
        if ut + st + vol + invol == 0:
            continue
        cpu = (ut + st) / ticks
        cpu_total += cpu
        print(f"{process:18} {thread:16} {n:3d} {ut / ticks:7.2f} {st / ticks:7.2f} {cpu / seconds:6.2f} "
              f"{vol / seconds:9.0f} {invol / seconds:10.0f}")
    print(f"total cpu {cpu_total:.2f} s = {cpu_total / seconds:.2f} cores")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "sample":
        sample(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 5 and sys.argv[1] == "window":
        window(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit(__doc__)
