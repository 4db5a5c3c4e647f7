#!/usr/bin/env bash
# Data-parallel training of a real model on this machine (docs/distributed.md): ResNet-18's
# training step (bench/models/train_step_bench: the ONNX export imported for training,
# softmax cross-entropy, SGD momentum) at a global batch of --batch random images, as
#   1 process x R threads at the global batch, 1 process x 1 thread at a rank's share (the
#   compute each rank does: the ideal step of R ranks), R ranks x 1 thread (mpirun, shared
#   memory, KILN_DIST_OVERLAP's default), the same with overlap forced on, and over TCP;
# each the best of --rounds alternated rounds of the median of --reps steps, with samples
# per second, the ratio to one process of R threads, and the scaling efficiency (the
# 1-thread share's step time over the configuration's). Then, from the R-rank step's
# profile, the time its all_reduce nodes took a step (start and wait: with overlap, what was
# left to wait for), with and without overlap. Last, where --peer names a Python with torch
# and torchvision (default: /work/peers-venv's, if there), PyTorch DDP over Gloo in the same
# run (bench/distributed/ddp.py) and Kiln's R-rank step against DDP's.
# usage: bench/distributed/resnet.sh [--model FILE.onnx] [--bench PATH] [--ranks R]
#                                    [--batch N] [--reps K] [--rounds K] [--peer PYTHON]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=/work/models/resnet18_train_b16.onnx bench=build/bench/train_step_bench ranks=2 batch=16 reps=3 rounds=2
peer=/work/peers-venv/bin/python
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --peer) peer=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "resnet.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -f "$model" ] || { echo "resnet.sh: no model $model (bench/models/export.py makes it; --model)" >&2; exit 2; }
[ $((batch % ranks)) = 0 ] || { echo "resnet.sh: --batch $batch is not a multiple of --ranks $ranks" >&2; exit 2; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export KILN_CACHE=1
share=$((batch / ranks))

# The median step in ms of one configuration: THREADS RANKS(1: no mpirun) NET(shm|tcp|ovl)
step_ms() {
  local env=(KILN_NUM_THREADS=$1) launch=() b=$batch extra=()
  if [ "$2" -gt 1 ]; then
    launch=(mpirun -np "$2" --oversubscribe) b=$share extra=(--data-parallel)
  elif [ "$1" = 1 ]; then
    b=$share
  fi
  [ "$3" = tcp ] && env+=(OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo)
  [ "$3" = ovl ] && env+=(KILN_DIST_OVERLAP=1)
  env "${env[@]}" "${launch[@]}" "$bench" "$model" --random-batch "$b" --reps "$reps" "${extra[@]}" |
    grep -o 'median_ms [0-9.]*' | cut -d' ' -f2
}

echo "$(basename "$model"), $(nproc) cores, global batch $batch, $ranks ranks of $share, median of $reps steps, best of $rounds rounds"
declare -A best=()
configs=("$ranks 1 shm" "1 1 shm" "1 $ranks shm" "1 $ranks ovl" "1 $ranks tcp")
for _ in $(seq "$rounds"); do
  for cfg in "${configs[@]}"; do
    set -- $cfg
    ms=$(step_ms "$1" "$2" "$3")
    key="$1x$2$3"
    if [ -z "${best[$key]:-}" ] || awk -v a="$ms" -v b="${best[$key]}" 'BEGIN { exit !(a < b) }'; then best[$key]=$ms; fi
  done
done
printf "%-38s %10s %10s %16s %11s\n" configuration "step ms" samples/s "vs 1 process" efficiency
threads_ms=${best["${ranks}x1shm"]} share_ms=${best[1x1shm]}
for cfg in "${configs[@]}"; do
  set -- $cfg
  key="$1x$2$3" label="$2 rank(s) x $1 thread(s)"
  [ "$2" = 1 ] && [ "$1" = 1 ] && label="1 process x 1 thread, batch $share"
  [ "$3" = tcp ] && label="$label, TCP"
  [ "$3" = ovl ] && label="$label, overlap forced"
  awk -v l="$label" -v ms="${best[$key]}" -v b="$batch" -v t="$threads_ms" -v s="$share_ms" -v one="$([ "$key" = 1x1shm ] && echo 1 || echo 0)" \
    -v r="$ranks" 'BEGIN { n = one ? b / r : b; printf "%-38s %10.1f %10.1f %15.2fx %11.2f\n", l, ms, n * 1000 / ms, (n / ms) / (b / t), s / ms }'
done
# The time the step spends in its all_reduce nodes (each one's start, plus its wait): without
# overlap the whole sum, with it what was left to wait for.
for ov in 0 1; do
  env KILN_NUM_THREADS=1 KILN_DIST_OVERLAP=$ov mpirun -np "$ranks" --oversubscribe "$bench" "$model" \
    --random-batch "$share" --reps "$reps" --data-parallel --profile |
    awk -v ov="$ov" '$2 == "all_reduce" { n++; ms += $4 / $3; if ($4 / $3 > big) big = $4 / $3 }
      END { printf "KILN_DIST_OVERLAP=%s: %d all_reduce nodes, %.1f ms a step in them (the largest %.1f ms)\n", ov, n, ms, big }'
done

if [ -x "$peer" ] && "$peer" -c "import torch, torchvision" 2>/dev/null; then
  "$peer" bench/distributed/ddp.py --ranks "$ranks" --batch "$batch" --reps "$reps" --rounds "$rounds" | tee /dev/stderr |
    awk -v kiln="${best["1x${ranks}shm"]}" -v r="$ranks" '$0 ~ "DDP \\(Gloo\\)" { ddp = $(NF - 3) }
      END { if (ddp) printf "Kiln %d ranks: %.1f ms a step, DDP: %.1f ms: Kiln %.2fx DDP\n", r, kiln, ddp, ddp / kiln }'
else
  echo "no PyTorch peer ($peer: --peer PYTHON with torch and torchvision): DDP not run"
fi
