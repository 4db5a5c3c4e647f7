#!/usr/bin/env bash
# The runtime's kernels call numerics/math.h's exp, sigmoid, erf and tanh from vector loops
# built as target clones (x86-64-v3/v4). GCC inlines a function into a clone of another
# -march only when it is always_inline; otherwise the call stays an out-of-line baseline
# function (scalar, libm's fmaf for every fma), and EfficientNet's SiLU convolutions ran
# 5-20x slower. This checks that the runtime library holds no out-of-line kiln::math
# function, so every call was inlined into the loop that makes it.
# usage: inlined_math.sh LIBKILN_RUNTIME.a
set -euo pipefail
lib=$1
if ! command -v nm >/dev/null; then
  echo "inlined_math: nm not found (binutils)" >&2
  exit 1
fi
symbols=$(nm -C --defined-only "$lib" 2>/dev/null)
found=$(grep -E ' kiln::math::' <<<"$symbols" || true)
if [ -n "$found" ]; then
  echo "inlined_math: $lib defines kiln::math functions out of line (not inlined into their callers):" >&2
  echo "$found" >&2
  exit 1
fi
# The check must see the library's code: the runtime defines its conv epilogue.
if ! grep -q 'kiln::rt::conv_epilogue' <<<"$symbols"; then
  echo "inlined_math: $lib has no kiln::rt::conv_epilogue: not the runtime library?" >&2
  exit 1
fi
echo "inlined_math: no out-of-line kiln::math function in $(basename "$lib")"
