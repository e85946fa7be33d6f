#!/usr/bin/env bash
# Runs a command and checks both its exit status and its output, which ctest's
# PASS_REGULAR_EXPRESSION cannot do (it ignores the exit status).
# Usage: expect_output.sh ok|fail EXTENDED_REGEX COMMAND [ARG...]
#   ok:   the command must exit 0;  fail: it must exit non-zero (and not be killed by a
#   signal or a timeout). Either way its stdout+stderr must match EXTENDED_REGEX.
set -uo pipefail
want=$1 regex=$2
shift 2
out=$("$@" 2>&1)
rc=$?
echo "$out"
case $want in
  ok) ((rc == 0)) || { echo "expect_output: exit $rc, expected 0" >&2; exit 1; } ;;
  fail) ((rc != 0 && rc < 124)) || { echo "expect_output: exit $rc, expected a failure exit (1..123)" >&2; exit 1; } ;;
  *) echo "expect_output: first argument must be ok or fail, not '$want'" >&2; exit 2 ;;
esac
grep -qE -- "$regex" <<<"$out" || { echo "expect_output: output does not match: $regex" >&2; exit 1; }
