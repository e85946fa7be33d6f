#!/usr/bin/env bash
# deploy/test.sh's run_ctest, against a stand-in ctest that prints canned summaries: an
# allowed skip passes and is counted, an unlisted skip fails, a call that ran no test
# fails, and ctest's own failure is kept.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/ctest" <<'FAKE'
#!/usr/bin/env bash
case $1 in
  allowed) printf '100%% tests passed, 0 tests failed out of 3\n\nThe following tests did not run:\n\t 13 - Listed.Test (Skipped)\n' ;;
  unlisted) printf '100%% tests passed, 0 tests failed out of 3\n\nThe following tests did not run:\n\t  7 - Other.Test (Skipped)\n' ;;
  none) printf 'No tests were found!!!\n' ;;
  failing) printf '50%% tests passed, 1 tests failed out of 2\n'; exit 8 ;;
esac
FAKE
chmod +x "$tmp/ctest"
PATH=$tmp:$PATH
cd "$repo"
eval "$(sed -n '/^stage_ran=0$/,/^}$/p' deploy/test.sh)"
allowed_skips="Listed.Test"
fails=0
check() { if [[ $1 != "$2" ]]; then echo "FAIL: $3: got $1, want $2"; fails=1; fi; }
rc=0; run_ctest allowed >/dev/null 2>&1 || rc=$?
check "$rc/$stage_ran/$stage_skipped" "0/2/1" "an allowed skip passes and is counted"
rc=0; run_ctest unlisted >/dev/null 2>&1 || rc=$?
check "$rc" 1 "an unlisted skip fails"
rc=0; run_ctest none >/dev/null 2>&1 || rc=$?
check "$rc" 1 "a call that ran no test fails"
rc=0; run_ctest failing >/dev/null 2>&1 || rc=$?
check "$rc" 8 "ctest's own failure status is kept"
((fails == 0)) && echo "skip policy: 4 of 4 checks passed"
exit "$fails"
