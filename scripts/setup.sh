#!/usr/bin/env bash
# Installs the build and test dependencies a fresh Debian/Ubuntu machine with the CUDA toolkit
# lacks (idempotent; skips what is present). Needs root for apt-get.
set -euo pipefail

need_apt=()
[ -f /usr/include/nlohmann/json.hpp ] || need_apt+=(nlohmann-json3-dev)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
# tests/tools/install_test.sh builds a consumer with `pkg-config --cflags --libs qforge`.
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
if ! command -v FileCheck >/dev/null && ! ls /usr/lib/llvm-*/bin/FileCheck >/dev/null 2>&1 \
   && ! command -v FileCheck-14 >/dev/null; then
  need_apt+=(llvm)
fi
# The recipe fuzzer (scripts/fuzz.sh) needs clang with libFuzzer. Debian 12 ships
# libclang_rt.fuzzer in libclang-rt-14-dev, which `clang` only recommends: checked below.
command -v clang++ >/dev/null || need_apt+=(clang)
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
# tests/tools/wheel_test.sh installs the wheel into a fresh venv (Debian's python3 needs python3-venv).
python3 -c "import ensurepip, venv" 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
links_libfuzzer() {
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null
}
if ! links_libfuzzer; then
  echo "setup: apt-get install libclang-rt-dev (libFuzzer)"
  [ ${#need_apt[@]} -gt 0 ] || $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libclang-rt-dev >/dev/null || true
  if ! links_libfuzzer; then
    echo "setup: clang++ cannot link -fsanitize=fuzzer: install libFuzzer (Debian 12: libclang-rt-14-dev)" >&2
    exit 1
  fi
fi

py_missing=()
# scikit_build_core (with nanobind): tests/tools/wheel_test.sh builds the pip wheel without build isolation.
for mod in numpy ml_dtypes lit pytest jsonschema setuptools wheel nanobind scikit_build_core; do
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
