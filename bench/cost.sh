#!/usr/bin/env bash
# Cost benchmark: 4 daemons (tcp on lo) + 4 trainers, global shuffle
# (shuffle.exchange_fraction = 1), trainers copying every sample (--touch copy).
#  - daemon CPU seconds per GB delivered: utime + stime of the 4 shardmixd processes, read
#    from /proc/PID/stat by trainer rank 0 just before the trainers start (the daemons have
#    loaded and serve) and after the last trainer's last epoch; over the bytes the trainers
#    report. Loading is not in it (bench/startup.sh covers it).
#  - resident memory per cached GB: the daemons' VmRSS (/proc/PID/status) at the end over
#    the bytes they cache, and its parts from the daemons' "memory:" log line (arena,
#    staging, catalog, placement tables).
#  - catalog and bookkeeping bytes per sample. Target: catalog <= 64 B/sample.
#
#   bash bench/cost.sh [--quick] [--out FILE.json] [--repeat 3] [--epochs 3]
# Dataset: 16,384 samples, median 112 KiB (--quick: 4,096 samples, 1 run, 2 epochs).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

samples=16384 median_kib=112 epochs=3 repeat=3 out=$repo/bench/results/cost-latest.json
quick_sizes() { samples=4096 epochs=2 repeat=1; }
bench_parse_args quick:quick_sizes out repeat epochs -- "$@"
bench_check_positive_ints repeat epochs
bench_require_built server/shardmixd tools/shardmix-consume tools/shardmix-gen
data=$(bench_sample_dataset "$samples" "$median_kib")
bench_workdir cost
raw=$work/raw.jsonl
: >"$raw"

# The daemons' CPU and memory, from /proc, by the pids in the run dir's ready file.
cat >"$work/snapshot.py" <<'PY'
import json, os, sys
ready = dict(l.strip().split("=", 1) for l in open(os.path.join(sys.argv[1], "ready")) if "=" in l)
tick = os.sysconf("SC_CLK_TCK")
out = {"cpu": 0.0, "rss": {}, "rss_shmem": {}}
for k, v in ready.items():
    if not k.startswith("pid."):
        continue
    rank, pid = k[4:], int(v)
    stat = open(f"/proc/{pid}/stat").read()
    fields = stat[stat.rindex(")") + 2:].split()
    out["cpu"] += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15 of stat)
    status = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status") if ":" in l)
    out["rss"][rank] = int(status["VmRSS"].split()[0]) * 1024
    out["rss_shmem"][rank] = int(status["RssShmem"].split()[0]) * 1024
print(json.dumps(out))
PY
# The trainer: rank 0 takes the daemons' figures before any trainer starts and after all
# have finished (done files in the shared work dir; every rank is on this machine).
cat >"$work/trainer.sh" <<'SH'
#!/usr/bin/env bash
set -euo pipefail
work=$1; shift
rank=${OMPI_COMM_WORLD_RANK:?}
if ((rank == 0)); then
  python3 "$work/snapshot.py" "$SHARDMIX_RUN_DIR" >"$work/before.json"
  touch "$work/go"
else
  while [[ ! -f $work/go ]]; do sleep 0.01; done
fi
"$@"
touch "$work/done.$rank"
if ((rank == 0)); then
  while (($(ls "$work"/done.* | wc -l) < 4)); do sleep 0.01; done
  python3 "$work/snapshot.py" "$SHARDMIX_RUN_DIR" >"$work/after.json"
fi
SH
sm_write_config "$work/c.toml" dataset.path="$data" batch.size=32 shuffle.exchange_fraction=1 fabric.provider=tcp \
  service.prefetch=8 log.level=info
for ((r = 0; r < repeat; r++)); do
  echo "== cost, $samples samples, 4 daemons + 4 trainers, Q = 1, $epochs epochs (run $((r + 1))/$repeat)"
  rm -f "$work"/go "$work"/done.* "$work"/before.json "$work"/after.json
  loadavg=$(bench_loadavg)
  mkdir -p "$work/run"
  SHARDMIX_RUN_DIR=$work/run bench_launch_or_die "$work/s.txt" "$work/d.log" --nodes 4 --config "$work/c.toml" \
    --set shuffle.seed=$((r + 1)) -- \
    bash "$work/trainer.sh" "$work" "$build/tools/shardmix-consume" --epochs "$epochs" --touch copy --json
  grep -v '^JSON ' "$work/s.txt" | grep ' epoch ' | tail -4 || true
  PYTHONPATH=$bench_dir python3 - "$work" "$samples" "$median_kib" "$epochs" "$loadavg" >>"$raw" <<'PY'
import json, sys
import benchlib
import costs_report as cr
work = sys.argv[1]
before, after = json.load(open(f"{work}/before.json")), json.load(open(f"{work}/after.json"))
epochs = benchlib.json_lines(f"{work}/s.txt")
memory = {str(k): v for k, v in cr.daemon_reports(open(f"{work}/d.log").read(), "memory").items()}
if len(memory) != 4:
    sys.exit(f"cost.sh: expected 4 'memory:' lines in the daemon log, got {len(memory)}")
print(json.dumps({"kind": "cost", "dataset": f"{sys.argv[2]} samples, median {sys.argv[3]} KiB",
                  "epochs": int(sys.argv[4]), "loadavg": sys.argv[5],
                  "delivered_bytes": sum(e["bytes"] for e in epochs), "cpu_before": before["cpu"],
                  "cpu_after": after["cpu"], "rss_end": after["rss"], "rss_shmem_end": after["rss_shmem"],
                  "memory": memory}))
PY
done
PYTHONPATH=$bench_dir python3 "$bench_dir/costs_report.py" cost "$raw" "$out"
