#!/usr/bin/env bash
# Runs the unit tests that a root run skips (they need an ordinary user, e.g. to check
# that directory permissions are honoured) as uid/gid 65534, so that CI, which runs as
# root, runs them too. The binary is copied to a fresh world-readable directory first:
# the build tree may sit under a directory that uid 65534 cannot enter.
# Exit 77 (ctest: skipped; tests/skip-allowlist.txt says why) when not root: the suite
# itself then runs these tests directly. A test that still skips as uid 65534 fails here.
# Usage: run_as_unprivileged.sh UNIT_TEST_BINARY GTEST_FILTER
set -euo pipefail
binary=$1 filter=$2
if (($(id -u) != 0)); then
  echo "not root: the tests matching '$filter' run directly in the unit suite"
  exit 77
fi
command -v setpriv >/dev/null || { echo "setpriv (util-linux) not found: cannot run '$filter' as uid 65534" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$binary" "$dir/unit_tests"
chmod 755 "$dir" "$dir/unit_tests"
out=$(cd "$dir" && setpriv --reuid=65534 --regid=65534 --clear-groups -- \
  env -i PATH=/usr/bin:/bin TMPDIR=/tmp ./unit_tests --gtest_filter="$filter" 2>&1) || {
  echo "$out"
  exit 1
}
echo "$out"
if grep -q '^\[  SKIPPED \]' <<<"$out"; then
  echo "a test skipped even as uid 65534" >&2
  exit 1
fi
grep -qE '^\[  PASSED  \] [1-9][0-9]* test' <<<"$out" || { echo "no test matched '$filter'" >&2; exit 1; }
