#!/usr/bin/env bash
# Data-parallel training on this machine (docs/distributed.md), measured in one run:
# `kiln train` of the MLP and LeNet on Fashion-MNIST at a global batch of 64, one epoch of
# --images images, as
#   1 process x 1 thread, 1 process x T threads, R ranks x 1 thread (mpirun, shared memory),
#   R ranks x 1 thread over TCP on the loopback (as between hosts), R ranks x 1 thread with
#   KILN_DIST_OVERLAP=1 (the sums on the communication thread even without a core to spare
#   for it; the default, auto, decides per machine: docs/distributed.md);
# each the best of --rounds alternated rounds, in training samples per second, with the
# ratios to one process of as many threads and to one thread (the scaling efficiency).
# usage: bench/distributed/run.sh [--kiln PATH] [--ranks R] [--images N] [--rounds K]
set -euo pipefail
cd "$(dirname "$0")/../.."
kiln=build/tools/kiln ranks=2 images=30000 rounds=3
while [ $# -gt 0 ]; do
  case $1 in
    --kiln) kiln=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export KILN_CACHE=1

# Samples per second of one epoch (the line `kiln train` prints when not on a terminal).
rate() {  # THREADS RANKS TCP MODEL
  local env=(KILN_NUM_THREADS=$1) extra=()
  [ "$2" -gt 1 ] && extra=(--ranks "$2")
  [ "$3" = tcp ] && env+=(OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo)
  [ "$3" = ovl ] && env+=(KILN_DIST_OVERLAP=1)
  env "${env[@]}" "$kiln" train "$4" --data fashion-mnist --epochs 1 --batch 64 --train-limit "$images" \
    --test-limit 1000 "${extra[@]}" | cat | grep -o '[0-9.]* samples/s' | tail -1 | cut -d' ' -f1
}

echo "kiln $("$kiln" --version | head -1), $(nproc) cores, $images images an epoch, global batch 64, best of $rounds rounds"
printf "%-6s %-30s %12s %18s %14s\n" model configuration samples/s "vs 1 process x $ranks" "efficiency"
for model in mlp lenet; do
  declare -A best=()
  for _ in $(seq "$rounds"); do
    for cfg in "1 1 shm" "$ranks 1 shm" "1 $ranks shm" "1 $ranks ovl" "1 $ranks tcp"; do
      set -- $cfg
      r=$(rate "$1" "$2" "$3" "$model")
      key="$1x$2$3"
      if [ -z "${best[$key]:-}" ] || awk -v a="$r" -v b="${best[$key]}" 'BEGIN { exit !(a > b) }'; then best[$key]=$r; fi
    done
  done
  one=${best[1x1shm]} threads=${best["${ranks}x1shm"]}
  for key in 1x1shm "${ranks}x1shm" "1x${ranks}shm" "1x${ranks}ovl" "1x${ranks}tcp"; do
    t=${key%%x*} rest=${key#*x} r=${rest%???} net=${rest: -3}
    label="$r rank(s) x $t thread(s)"
    if [ "$net" = tcp ]; then label="$label, TCP"; fi
    if [ "$net" = ovl ]; then label="$label, overlap forced"; fi
    n=$(( t * r ))
    awk -v m="$model" -v l="$label" -v s="${best[$key]}" -v p="$threads" -v o="$one" -v n="$n" \
      'BEGIN { printf "%-6s %-30s %12.0f %17.2fx %13.2f\n", m, l, s, s / p, s / (o * n) }'
  done
  unset best
done
