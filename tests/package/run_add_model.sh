#!/usr/bin/env bash
# kiln_add_model (cmake/KilnAddModel.cmake) with a stand-in for `kiln compile`
# (ctest: package_add_model): the arguments it passes, the library it makes, what re-runs
# the command, and a clear configure error for each bad call.
#   run_add_model.sh SOURCE_DIR WORK_DIR     (environment: CMAKE, GENERATOR, CC, CXX)
set -euo pipefail
kiln_src=$1 work=$2
src=$(cd "$(dirname "$0")" && pwd)/add_model
fail() { echo "package_add_model: $*" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work/src"
cp -r "$src/." "$work/src/"  # a copy: the test touches the state files
b=$work/build
configure() {
  "$CMAKE" -S "$work/src" -B "$b" -G "$GENERATOR" -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
    -DKILN_SOURCE_DIR="$kiln_src" "$@"
}

configure -DCASE=ok >/dev/null
"$CMAKE" --build "$b" >/dev/null
models=$b/kiln_models
out=$("$b/app")
[[ $out == "answers 42 42, weights $models/lin/linreg.safetensors" ]] || fail "app printed '$out'"
[[ -e $models/lin/linreg.safetensors ]] || fail "no weights file"
want_affine="compile $work/src/model.kir -o $models/affine/affine.o --header $models/affine/affine.h --name affine --weights embed --state-dir $work/src/state"
want_lin="compile $work/src/model.kir -o $models/lin/linreg.o --header $models/lin/linreg.h --name linreg --weights file --weights-file $models/lin/linreg.safetensors --train --cpu haswell --features +avx2 --zero-state --lr 0.5 --optimizer adam"
want_gen="compile $work/src/model.kir -o $models/gen/gen.o --header $models/gen/gen.h --name gen --weights embed --state-dir $b/made_at_build_time"
[[ $(grep -c . "$b/calls.log") == 3 ]] || fail "kiln ran other than three times: $(cat "$b/calls.log")"
grep -qxF -- "$want_affine" "$b/calls.log" || fail "affine: got $(cat "$b/calls.log"), want $want_affine"
grep -qxF -- "$want_lin" "$b/calls.log" || fail "lin: got $(cat "$b/calls.log"), want $want_lin"
grep -qxF -- "$want_gen" "$b/calls.log" || fail "gen: got $(cat "$b/calls.log"), want $want_gen"

# Up to date: nothing runs. A changed state file, .kir or kiln binary re-runs the models'
# commands that depend on it, and only those.
reruns() {
  : >"$b/calls.log"
  "$CMAKE" --build "$b" >/dev/null
  grep -o -- '--name [a-z]*' "$b/calls.log" | sort | tr '\n' ' '
}
[[ $(reruns) == "" ]] || fail "a second build re-ran kiln"
touch "$work/src/state/w.npy"
[[ $(reruns) == "--name affine " ]] || fail "a changed state file did not re-run affine alone"
touch "$work/src/model.kir"
[[ $(reruns) == "--name affine --name gen --name linreg " ]] || fail "a changed .kir did not re-run every model"
touch "$work/src/fake_kiln.c"
[[ $(reruns) == "--name affine --name gen --name linreg " ]] || fail "a new kiln binary did not re-run every model"

check_error() {  # CASE, a part of the message
  local log
  if log=$(configure -DCASE="$1" 2>&1); then fail "CASE=$1 configured"; fi
  grep -qF -- "$2" <<<"$(tr -s ' \n' '  ' <<<"$log")" || fail "CASE=$1: no '$2' in: $log"
}
check_error bad_name "NAME 'my-model' is not a C identifier"
check_error bad_weights "WEIGHTS is 'embed' or 'file', not 'disk'"
check_error both_states "give STATE_DIR or ZERO_STATE, not both"
check_error no_state_dir "STATE_DIR '$work/src/nowhere' is not a folder (only a folder of the build tree"
check_error unknown_arg "unknown arguments 'WEIGHT;file'"
echo "package_add_model: ok"
