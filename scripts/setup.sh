#!/usr/bin/env bash
# Installs the Debian packages Kiln needs, idempotently: only what is missing, and
# `apt-get update` only when something is. Installing needs root (or sudo); when every
# package is present it runs as any user and changes nothing.
# Catch2 v3 comes from bookworm-backports; the source is added when absent.
set -euo pipefail

PACKAGES=(cmake ninja-build g++ pkg-config ccache
          llvm-19-dev llvm-19-tools libzstd-dev zlib1g-dev libedit-dev libxml2-dev libffi-dev libcurl4-openssl-dev
          libfmt-dev libcli11-dev libopenblas-dev dataset-fashion-mnist
          nlohmann-json3-dev librsvg2-bin graphviz python3 python3-venv  # python3-venv: scripts/onnx-diff.sh
          python3-dev  # the Python package (python/, pyproject.toml): Python.h
          libopenmpi-dev openmpi-bin procps  # dist/: data-parallel training on MPI (procps: pgrep in tests/dist/train.sh)
          clang-19 libclang-rt-19-dev  # scripts/fuzz.sh: libFuzzer
          libonnx-dev libprotobuf-dev libonnx-testdata)  # ONNX import and its conformance test
BACKPORTS_PACKAGES=(libcatch2-dev)

is_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${PACKAGES[@]}" "${BACKPORTS_PACKAGES[@]}"; do is_installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi

# Installing needs root: only now, so that any user can run the scripts on a machine that
# has everything.
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: not root and no sudo; install these packages by hand: ${missing[*]}" >&2
    exit 1
  fi
fi
echo "setup: installing ${missing[*]}"

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
need_bp=0
for p in "${BACKPORTS_PACKAGES[@]}"; do is_installed "$p" || need_bp=1; done
if [ $need_bp -eq 1 ] && ! grep -rqs "${codename}-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "deb http://deb.debian.org/debian ${codename}-backports main" | $SUDO tee /etc/apt/sources.list.d/kiln-backports.list >/dev/null
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
main_missing=()
for p in "${PACKAGES[@]}"; do is_installed "$p" || main_missing+=("$p"); done
if [ ${#main_missing[@]} -gt 0 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${main_missing[@]}"
fi
if [ $need_bp -eq 1 ]; then
  $SUDO apt-get install -y -qq --no-install-recommends -t "${codename}-backports" "${BACKPORTS_PACKAGES[@]}"
fi
echo "setup: done"
