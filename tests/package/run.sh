#!/usr/bin/env bash
# Kiln as a package, end to end (ctest: package): install the current build into a fresh
# prefix, check the installed headers, configure tests/package/consumer against the prefix
# (find_package(Kiln) + kiln_add_model), build it and run its programs; check that the C
# program, which links only Kiln::runtime and two AOT objects, has nothing of LLVM in it;
# the same with find_package(Kiln COMPONENTS runtime) and no LLVM to be found; and build the
# same C program with plain `cc` and pkg-config's kiln-runtime.
#   run.sh BUILD_DIR WORK_DIR
# The environment gives the tools and flags of Kiln's own build: CMAKE, GENERATOR, CC, CXX,
# KILN_FLAGS (sanitizer flags, which the consumer must use too; may be empty).
set -euo pipefail
build=$1 work=$2
src=$(cd "$(dirname "$0")" && pwd)
prefix=$work/prefix
step() { echo "== $*"; }
fail() { echo "package: $*" >&2; exit 1; }

rm -rf "$work" && mkdir -p "$work"
step "install into $prefix"
"$CMAKE" --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
lib=$(cd "$prefix" && dirname "$(find . -name libkiln_runtime.a | head -1)")  # lib, lib64, lib/<triple>
for f in bin/kiln $lib/libkiln_runtime.a $lib/libkiln_codegen_cpu.a $lib/libkiln_train.a $lib/libkiln_onnx.a \
         include/kiln/train/trainer.h include/kiln/frontend/onnx_import.h \
         include/kiln/frontend/nn.h include/kiln/ir/ops.def \
         include/kiln/runtime/abi.def $lib/cmake/Kiln/KilnConfig.cmake $lib/cmake/Kiln/KilnConfigVersion.cmake \
         $lib/cmake/Kiln/KilnAddModel.cmake $lib/pkgconfig/kiln.pc $lib/pkgconfig/kiln-runtime.pc \
         share/doc/kiln/onnx.md share/doc/kiln/aot.md share/doc/kiln/README.md share/doc/kiln/LICENSE \
         share/doc/kiln/CHANGELOG.md share/doc/kiln/CONTRIBUTING.md; do
  [[ -e $prefix/$f ]] || fail "the install lacks $f"
done
[[ ! -e $prefix/include/kiln/codegen/cpu ]] || fail "the backends' own headers were installed"

step "installed headers: only <kiln/...> includes, clean under -Wall -Wextra -Wshadow -Werror"
if grep -rnE '#[[:space:]]*include[[:space:]]*"' "$prefix/include/kiln" | grep -v '"kiln/'; then
  fail "an installed header includes a path outside include/kiln (above)"
fi
# Every header in one translation unit (one compile keeps this quick); the C header also as C.
(cd "$prefix/include" && find kiln -name '*.h' | sort | sed 's/.*/#include <&>/') >"$work/all_headers.cpp"
"$CXX" -std=c++20 -fsyntax-only -Wall -Wextra -Wshadow -Werror -I"$prefix/include" "$work/all_headers.cpp"
echo '#include <kiln/runtime/aot.h>' >"$work/aot_header.c"
"$CC" -std=c99 -fsyntax-only -Wall -Wextra -Wshadow -Werror -pedantic -I"$prefix/include" "$work/aot_header.c"

step "configure and build tests/package/consumer against the prefix"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
"$CMAKE" -S "$src/consumer" -B "$work/consumer" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" "${launcher[@]}" \
  -DCMAKE_C_FLAGS="$KILN_FLAGS" -DCMAKE_CXX_FLAGS="$KILN_FLAGS" -DCMAKE_EXE_LINKER_FLAGS="$KILN_FLAGS" \
  >"$work/configure.log" || { cat "$work/configure.log"; exit 1; }
"$CMAKE" --build "$work/consumer" -j2

step "run the consumer's programs"
"$work/consumer/models_c" "$work/saved.weights"
"$work/consumer/trace_cpp"
"$work/consumer/import_onnx" "$src/../data/onnx/mlp.onnx"

step "the C program links no LLVM"
if ldd "$work/consumer/models_c" | grep -i llvm; then fail "models_c loads LLVM (above)"; fi
if nm -C "$work/consumer/models_c" | grep -m5 'llvm::'; then fail "models_c contains LLVM code (above)"; fi
echo "models_c: $(stat -c %s "$work/consumer/models_c") bytes"

step "COMPONENTS runtime: the C program configures, builds and runs with no LLVM, fmt or zlib to be found"
"$CMAKE" -S "$src/consumer" -B "$work/runtime_only" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release -DKILN_RUNTIME_ONLY=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_LLVM=ON -DCMAKE_DISABLE_FIND_PACKAGE_fmt=ON -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" "${launcher[@]}" \
  -DCMAKE_C_FLAGS="$KILN_FLAGS" -DCMAKE_CXX_FLAGS="$KILN_FLAGS" -DCMAKE_EXE_LINKER_FLAGS="$KILN_FLAGS" \
  >"$work/runtime_only.log" || { cat "$work/runtime_only.log"; exit 1; }
"$CMAKE" --build "$work/runtime_only" -j2
"$work/runtime_only/models_c" "$work/saved_runtime_only.weights"

step "cc with pkg-config kiln-runtime"
export PKG_CONFIG_PATH=$prefix/$lib/pkgconfig
models=$work/consumer/kiln_models
# shellcheck disable=SC2046 # pkg-config's output is a list of words
"$CC" -std=c99 $KILN_FLAGS "$src/consumer/main.c" "$models/affine/affine.o" "$models/linreg_step/linreg.o" \
  -I"$models/affine" -I"$models/linreg_step" -DLINREG_WEIGHTS_PATH="\"$models/linreg_step/linreg.safetensors\"" \
  $(pkg-config --cflags --libs kiln-runtime) -o "$work/models_pc"
"$work/models_pc" "$work/saved_pc.weights"
step "c++ with pkg-config kiln: the C++ program's object linked again"
obj=$(find "$work/consumer" -name 'main.cpp.o')
# shellcheck disable=SC2046
"$CXX" $KILN_FLAGS "$obj" $(pkg-config --libs kiln) -o "$work/trace_pc"
"$work/trace_pc"
echo "package: ok"
