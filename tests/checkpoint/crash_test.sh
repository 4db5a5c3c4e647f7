#!/usr/bin/env bash
# The kill -9 test of checkpoints: 20 rounds of starting crash_writer (which saves ~4 MB
# checkpoints in a loop), killing it with SIGKILL after a random 0-150 ms (most often in the
# middle of a write) and checking that the latest checkpoint is complete, passes its
# checksums and holds its step's content. A writer that wrote in place (no temporary file +
# rename) fails it. Usage: crash_test.sh CRASH_WRITER [ROUNDS]
set -euo pipefail
writer=$1
rounds=${2:-20}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mid_write=0
for ((round = 1; round <= rounds; round++)); do
  "$writer" write "$dir/ckpt" &
  pid=$!
  sleep "0.$(printf '%03d' $((RANDOM % 150)))"
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null || true
  if ! out=$("$writer" check "$dir/ckpt"); then
    echo "crash_test: round $round: the checkpoint folder is broken after kill -9:" >&2
    ls -la "$dir/ckpt" >&2
    exit 1
  fi
  echo "round $round: $out"
  case "$out" in *", 0 temporary files") ;; *) mid_write=$((mid_write + 1)) ;; esac
done
# On a loaded machine every kill may come before the first save: then one more round lets
# the writer run until a checkpoint exists (at most 60 s) before killing it.
if [[ $out == "no checkpoint yet"* ]]; then
  "$writer" write "$dir/ckpt" &
  pid=$!
  for ((i = 0; i < 600; i++)); do
    out=$("$writer" check "$dir/ckpt") || { kill -KILL "$pid"; exit 1; }
    [[ $out == "no checkpoint yet"* ]] || break
    sleep 0.1
  done
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null || true
  out=$("$writer" check "$dir/ckpt") || { ls -la "$dir/ckpt" >&2; exit 1; }
  echo "extra round: $out"
fi
case "$out" in "no checkpoint yet"*) echo "crash_test: no checkpoint was ever written" >&2; exit 1 ;; esac
echo "crash_test: $rounds rounds, $mid_write killed in the middle of a write"
