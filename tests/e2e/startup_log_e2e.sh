#!/usr/bin/env bash
# The daemons' "startup:" and "memory:" report lines (server/startup_report.h), which
# bench/startup.sh and bench/cost.sh parse, are emitted by every rank, parse with
# bench/costs_report.py, name every phase, and add up (phases = total, within rounding);
# shardmix-consume --first-batch-only ends the job after the first batch, with its time.
# Checks structure and consistency only, never how long anything took.
#   tests/e2e/startup_log_e2e.sh
set -euo pipefail
SM_PROG=startup_log_e2e
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
e2e_init startup-log
e2e_gen_dataset 300 7 4 5
sm_write_config "$tmp/c.toml" dataset.path="$tmp/data" batch.size=8 fabric.provider=tcp log.level=info
e2e_launch 200 "$tmp/d.log" --nodes 2 --config "$tmp/c.toml" \
  -- "$consume" --first-batch-only --touch none >"$tmp/t.txt" 2>&1 ||
  { cat "$tmp/t.txt"; tail -20 "$tmp/d.log"; sm_die "launch.sh failed" 1; }
PYTHONPATH=$SM_REPO/bench "$python" - "$tmp/d.log" "$tmp/t.txt" <<'PY'
import json, sys
import costs_report as cr
log = open(sys.argv[1]).read()
startup, memory = cr.daemon_reports(log, "startup"), cr.daemon_reports(log, "memory")
assert sorted(startup) == [0, 1], f"startup lines from ranks {sorted(startup)}, want [0, 1]"
assert sorted(memory) == [0, 1], f"memory lines from ranks {sorted(memory)}, want [0, 1]"
for rank, s in startup.items():
    missing = [p for p in cr.PHASES[1:-1] + ["t_begin", "t_end", "total"] if p not in s]
    assert not missing, f"rank {rank}: startup line lacks {missing}"
    parts = sum(s[p] for p in cr.PHASES[1:-1])
    assert abs(parts - s["total"]) <= 0.001 * len(cr.PHASES), f"rank {rank}: phases add to {parts}, total {s['total']}"
    assert abs((s["t_end"] - s["t_begin"]) - s["total"]) <= 0.002, f"rank {rank}: t_end - t_begin != total"
for rank, m in memory.items():
    assert m["samples"] == 300, m
    assert m["catalog_bytes"] > 0 and m["placement_bytes"] > 0, m
    assert m["arena_bytes"] >= m["cached_bytes"] > 0, m
    assert isinstance(m["rss_bytes"], float) and m["rss_bytes"] > m["catalog_bytes"], m
assert sum(m["resident_samples"] for m in memory.values()) == 300, memory
firsts = [json.loads(l[5:]) for l in open(sys.argv[2]) if l.startswith("JSON ")]
assert len(firsts) == 2 and all(f["first_batch_only"] and f["samples"] == 8 for f in firsts), firsts
assert all(f["t_first_batch"] >= f["t_start"] >= startup[0]["t_begin"] for f in firsts), (firsts, startup[0])
run = cr.startup_run(startup[0]["t_begin"] - 0.5, startup, firsts, 1.0)
assert abs(sum(run["phases"].values()) - run["total"]) <= 0.001 * len(cr.PHASES), run  # 3-decimal phases
print("startup_log_e2e: OK (2 ranks, phases:", ", ".join(f"{p} {startup[0][p]:.3f}" for p in cr.PHASES[1:-1]), ")")
PY
