#!/usr/bin/env bash
# Training with qforge.torch on a Hopper machine with torch, in one go: build (libqforge, the CLI,
# qforge._C), the modules' GPU tests (tests/python/test_torch_modules.py), then bench/train.py
# (bf16 twice, every shipped training recipe once; the table, JSON and loss-curve PNG in OUT_DIR).
#   scripts/gpu_train.sh OUT_DIR [extra bench/train.py arguments]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-results}
shift || true
mkdir -p "$OUT"
. scripts/gpu_build.sh
gpu_build "$OUT" qforge qforge_shared qforge_ext || exit 1
export QFORGE_CACHE_DIR="$BUILD/binding-cache"
export QFORGE_LIBRARY="$BUILD/runtime/libqforge.so" QFORGE_BIN="$BUILD/tools/qforge"
export QFORGE_EXTENSION=$(ls "$BUILD"/python/qforge/_C*.so | head -1)
export PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider tests/python/test_torch_modules.py 2>&1 | tee "$OUT/pytest_modules.log" | tail -30
rc=${PIPESTATUS[0]}
python3 bench/train.py --out "$OUT" "$@" 2>&1 | tee "$OUT/train.log" | tail -30
echo "pytest rc=$rc"
exit $rc
