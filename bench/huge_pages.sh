#!/usr/bin/env bash
# What transparent huge pages for shared memory do for checkpoints: shardmix-bench-mapping
# (the checkpoint pool's own code: prefault, writes through the pool's mapping, and a new
# mapping of the same pages filled as a trainer's lease is) under shmem_enabled = never and
# = advise, alternating --pairs times, then the setting the machine had is put back. The
# pool asks for huge pages with MADV_HUGEPAGE (docs/operations.md, "Huge pages"), which the
# kernel honours for shared memory only under "advise" (or within_size, always).
#
#   bash bench/huge_pages.sh [--mib 1024] [--rounds 3] [--pairs 2]
# Needs root (it writes /sys/kernel/mm/transparent_hugepage/shmem_enabled).
# Env: SHARDMIX_BUILD_DIR (default build/, Release).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

mib=1024 rounds=3 pairs=2
bench_parse_args mib rounds pairs -- "$@"
bench_check_positive_ints mib rounds pairs
bench_require_built bench/shardmix-bench-mapping
sm_before_tmp_cleanup() { bench_shmem_huge_pages_restore; }
bench_workdir huge-pages
bench_shmem_huge_pages never  # remembers the machine's own setting, put back at exit
original=$bench_shmem_huge_pages_original
echo "== shardmix-bench-mapping --mib $mib --rounds $rounds; shmem_enabled was '$original' (put back at exit); load $(bench_loadavg)"
for ((pair = 1; pair <= pairs; pair++)); do
  for setting in never advise; do
    echo "$setting" >"$bench_shmem_huge_pages_knob"
    "$build/bench/shardmix-bench-mapping" --mib "$mib" --rounds "$rounds"
  done
done
echo "== load $(bench_loadavg)"
