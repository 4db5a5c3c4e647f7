#!/usr/bin/env bash
# A rank that hangs must not leave the job spinning: runs `MPIEXEC... kiln_dist_test
# --timeout-test [COUNT]` (rank 1 sleeps 30 s before its all_reduce) with KILN_DIST_TIMEOUT=2
# and checks that the job ends within LIMIT seconds, fails, and says on stderr which rank
# waited for which ("no message from rank").
# Usage: timeout.sh LIMIT MPIEXEC... PROGRAM --timeout-test [COUNT]
set -uo pipefail
limit=$1
shift
err=$(mktemp)
trap 'rm -f "$err"' EXIT

start=$(date +%s.%N)
KILN_DIST_TIMEOUT=2 "$@" 2>"$err"
rc=$?
elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
cat "$err" >&2
echo "exit status $rc after $elapsed s"

fail=0
if [ "$rc" -eq 0 ]; then echo "FAIL: the job succeeded although rank 1 hung"; fail=1; fi
if ! awk -v e="$elapsed" -v l="$limit" 'BEGIN { exit !(e < l) }'; then
  echo "FAIL: the job took $elapsed s, more than $limit s (KILN_DIST_TIMEOUT=2)"; fail=1
fi
if ! grep -q "kiln: rank [0-9]*: no message from rank 1 within 2 s in all_reduce" "$err"; then
  echo "FAIL: stderr does not say 'kiln: rank R: no message from rank 1 within 2 s in all_reduce'"; fail=1
fi
exit $fail
