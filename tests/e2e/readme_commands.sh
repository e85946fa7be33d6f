#!/usr/bin/env bash
# The README's commands, run as a reader would run them (ctest: docs_readme_commands), so
# that a README command that stops working fails CI.
#
# Which blocks run: those marked runnable with an HTML comment on the line directly above
# the fence, which GitHub renders as nothing (docs/decisions/0047):
#
#   <!-- runnable -->
#   ```bash
#   cmake --build build
#   ```
#
# Marked blocks run in README order, each as one `bash -e -x` script in the checkout's
# root (-x shows every command), so a command that fails stops its block and the test,
# naming the block's line in the README. Unmarked blocks never run: the ones that install
# packages, need a cluster or run the test suite itself (deploy/test.sh, ctest).
# The demo data: the README's run commands use deploy/configs/demo.toml, whose dataset
# deploy/demo.sh generates. Here a small one of the same shape (the demo's 100 classes and
# seed, 400 samples of median 16 KiB instead of 4,096 of 112 KiB) is generated in the temp
# dir, and dataset.path points at it through SHARDMIX_DATASET_PATH, the environment
# override every config key has; nothing else about the commands changes.
#
# Fails, rather than passing with nothing run, when no block is marked, or when a marker
# does not stand directly above a ```bash fence.
#   tests/e2e/readme_commands.sh [--list] README
#     --list: print the marked blocks and run nothing (needs no build)
set -euo pipefail
SM_PROG=readme_commands
# shellcheck source=tests/e2e/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

list_only=0
if [[ ${1:-} == --list ]]; then
  list_only=1
  shift
fi
(($# == 1)) || sm_die "usage: $0 [--list] README" 2
readme=$1
[[ -f $readme ]] || sm_die "$readme: no such file" 2
marker='<!-- runnable -->'

# blocks[k]: the commands of the k-th marked block; block_lines[k]: its fence's line number.
blocks=()
block_lines=()
mapfile -t lines <"$readme"
for ((i = 0; i < ${#lines[@]}; i++)); do
  [[ ${lines[i]} == "$marker" ]] || continue
  fence=$((i + 2))  # 1-based line number of the fence below the marker
  if [[ ${lines[i + 1]:-} != '```bash' && ${lines[i + 1]:-} != '```sh' ]]; then
    sm_die "$readme:$((i + 1)): '$marker' must stand directly above a \`\`\`bash fence" 1
  fi
  body=""
  for ((j = i + 2; j < ${#lines[@]}; j++)); do
    [[ ${lines[j]} == '```' ]] && break
    body+=${lines[j]}$'\n'
  done
  ((j < ${#lines[@]})) || sm_die "$readme:$fence: the runnable block is never closed" 1
  blocks+=("$body")
  block_lines+=("$fence")
  i=$j
done
((${#blocks[@]} > 0)) ||
  sm_die "$readme: no block is marked runnable ('$marker' above a \`\`\`bash fence): nothing would be tested" 1

if ((list_only)); then
  for k in "${!blocks[@]}"; do
    printf '== %s:%s\n%s' "$readme" "${block_lines[k]}" "${blocks[k]}"
  done
  exit 0
fi

e2e_init readme
e2e_gen_dataset 400 100 16 20240611
export SHARDMIX_DATASET_PATH=$tmp/data

for k in "${!blocks[@]}"; do
  where="$readme:${block_lines[k]}"
  sm_section "block $((k + 1)) of ${#blocks[@]} ($where)"
  rc=0
  (cd -- "$SM_REPO" && timeout -s TERM -k 30 500 bash -e -x -o pipefail -c "${blocks[k]}") || rc=$?
  if ((rc != 0)); then
    printf '%s' "${blocks[k]}" | sed 's/^/  | /' >&2
    sm_die "the README block at $where failed (exit $rc); its commands are above" 1
  fi
done
echo "$SM_PROG: PASS (${#blocks[@]} README blocks)"
