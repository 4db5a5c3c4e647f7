#!/usr/bin/env bash
# Data-parallel `kiln train` against one process, on 6,000 Fashion-MNIST images (the MLP,
# global batch 64, two epochs; tolerance below):
#  1. one process, and --ranks 2 and --ranks 4 (oversubscribed): the final weights agree
#     within RTOL and the checkpoints carry the same graph hash and global batch;
#  2. determinism: a second --ranks 2 run gives bitwise the same checkpoint;
#  3. resume across rank counts: epoch 1 of the one-process run resumed with 2 ranks and
#     epoch 1 of the 2-rank run resumed in one process both agree with the others within RTOL;
#  4. a killed rank: a 2-rank run whose rank 1 is killed mid-epoch ends (every process gone)
#     within 30 s with a nonzero status, and resuming it with 2 ranks from its last
#     checkpoint ends bitwise where the uninterrupted 2-rank run ended;
#  5. the TCP transport alone (as between hosts), over the loopback: the 2-rank result;
#  6. overlap: runs 2, 4 and 5 and the killed run force the communication thread
#     (KILN_DIST_OVERLAP=1; on 2 cores the default, auto, leaves it off), so the bitwise
#     checks hold it to the in-place sums' bits; a KILN_DIST_OVERLAP that is not 0, 1 or auto
#     is refused.
# Usage: train.sh KILN COMPARE_CHECKPOINTS WORKDIR
set -euo pipefail
kiln=$1 compare=$2 work=$3
RTOL=1e-5  # float sums in another order: 94-188 steps of SGD momentum stay within ~1e-6 here
rm -rf "$work" && mkdir -p "$work"
cd "$work"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export KILN_DIST_TIMEOUT=60 KILN_CACHE=0
args=(mlp --data fashion-mnist --train-limit 6000 --test-limit 1000 --batch 64 --quiet --checkpoint-every 30 --keep 20)
last=ckpt-0000000188.safetensors   # 94 steps an epoch
first=ckpt-0000000094.safetensors

step() { echo "== $*"; }
step "one process, 2 and 4 ranks"
"$kiln" train "${args[@]}" --epochs 2 --checkpoint one
"$kiln" train "${args[@]}" --epochs 2 --checkpoint two --ranks 2
KILN_DIST_OVERLAP=1 "$kiln" train "${args[@]}" --epochs 2 --checkpoint four --ranks 4
"$compare" one/$last two/$last --rtol $RTOL
"$compare" one/$last four/$last --rtol $RTOL

step "determinism: 2 ranks again, the sums overlapped"
KILN_DIST_OVERLAP=1 "$kiln" train "${args[@]}" --epochs 2 --checkpoint two_again --ranks 2
"$compare" two/$last two_again/$last --bitwise

step "resume across rank counts"
mkdir one_then_two two_then_one
cp one/$first one_then_two/
cp two/$first two_then_one/
"$kiln" train "${args[@]}" --epochs 2 --checkpoint one_then_two --resume --ranks 2
"$kiln" train "${args[@]}" --epochs 2 --checkpoint two_then_one --resume
"$compare" one/$last one_then_two/$last --rtol $RTOL
"$compare" two/$last two_then_one/$last --rtol $RTOL

step "a killed rank ends the job; resuming ends where the uninterrupted run did"
KILN_DIST_OVERLAP=1 "$kiln" train "${args[@]}" --epochs 2 --checkpoint killed --ranks 2 &
launcher=$!
for _ in $(seq 200); do  # until the first checkpoint (step 30) is written
  ls killed/ckpt-* >/dev/null 2>&1 && break
  sleep 0.1
done
victim=$(pgrep -n -f "checkpoint killed")  # the newest: a rank, not mpirun
kill -9 "$victim"
start=$(date +%s)
status=0
wait "$launcher" || status=$?
elapsed=$(( $(date +%s) - start ))
echo "exit status $status after ${elapsed} s"
[ "$status" -ne 0 ] || { echo "FAIL: the job succeeded with a rank killed"; exit 1; }
[ "$elapsed" -le 30 ] || { echo "FAIL: the job took ${elapsed} s to end"; exit 1; }
if pgrep -f "checkpoint killed" >/dev/null; then echo "FAIL: processes of the job are left"; exit 1; fi
ls killed
"$kiln" train "${args[@]}" --epochs 2 --checkpoint killed --resume --ranks 2
"$compare" two/$last killed/$last --bitwise

step "TCP over the loopback"
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo KILN_DIST_OVERLAP=1 \
    "$kiln" train "${args[@]}" --epochs 2 --checkpoint tcp --ranks 2
  "$compare" two/$last tcp/$last --bitwise
else
  echo "not Open MPI: skipped"
fi
step "a bad KILN_DIST_OVERLAP"
status=0
KILN_DIST_OVERLAP=maybe "$kiln" train "${args[@]}" --epochs 1 --checkpoint bad --ranks 2 2>bad.err || status=$?
cat bad.err
[ "$status" -ne 0 ] || { echo "FAIL: KILN_DIST_OVERLAP=maybe was accepted"; exit 1; }
grep -q "KILN_DIST_OVERLAP='maybe' is not 0, 1 or auto" bad.err || { echo "FAIL: no message for KILN_DIST_OVERLAP"; exit 1; }
echo "all data-parallel training checks passed"
