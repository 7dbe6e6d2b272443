#!/usr/bin/env bash
# Installs the build and test dependencies a fresh Debian/Ubuntu machine with the CUDA toolkit
# lacks (idempotent; skips what is present). Needs root for apt-get.
set -euo pipefail

need_apt=()
[ -f /usr/include/nlohmann/json.hpp ] || need_apt+=(nlohmann-json3-dev)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
if ! command -v FileCheck >/dev/null && ! ls /usr/lib/llvm-*/bin/FileCheck >/dev/null 2>&1 \
   && ! command -v FileCheck-14 >/dev/null; then
  need_apt+=(llvm)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

py_missing=()
for mod in numpy ml_dtypes lit pytest; do
  python3 -c "import $mod" 2>/dev/null || py_missing+=("$mod")
done
if [ ${#py_missing[@]} -gt 0 ]; then
  echo "setup: pip install ${py_missing[*]}"
  python3 -m pip install -q "${py_missing[@]}"
fi

if ! command -v nvcc >/dev/null && [ ! -f /usr/local/cuda/include/nvrtc.h ]; then
  echo "setup: the CUDA toolkit (NVRTC) is required: install cuda-toolkit 12.8+ (13.0 tested)" >&2
  exit 1
fi
echo "setup: ok"
