#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs missing packages, configures, builds
# (warnings are errors) and runs every test (Catch2 unit tests, lit golden tests and the
# Python package's pytest suite), then installs the Python package with pip from the same
# build folder into a venv and runs its tests again against the installed copy.
# Usage: scripts/test.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bash scripts/setup.sh

# The Python side: a venv in the build folder with the build requirements (nanobind,
# scikit-build-core) and the test tools (numpy, pytest) from PyPI, made and filled once.
venv="$build/pyenv"
if ! "$venv/bin/python" -c 'import nanobind, scikit_build_core, numpy, pytest' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check nanobind scikit-build-core numpy pytest
fi
py=$(cd "$venv/bin" && pwd)/python

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON \
  -DKILN_PYTHON=ON -DPython_EXECUTABLE="$py"
cmake --build "$build"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"

# `pip install .` as a user runs it, reusing this build folder (nothing is rebuilt), then
# the package's tests against the installed copy, from outside the source tree.
"$py" -m pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps \
  -Cbuild-dir="$build" -Ccmake.define.KILN_BUILD_TESTS=ON -Ccmake.define.KILN_WERROR=ON .
(cd "$build" && KILN_CACHE=0 KILN_SOURCE_DIR="$OLDPWD" KILN_CLI="$PWD/tools/kiln" "$py" -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests")
