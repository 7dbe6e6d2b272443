#!/usr/bin/env bash
# Builds qforge and runs all three test tiers (unit, lit, numerics) through ctest.
# GPU tests skip themselves on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${QFORGE_BUILD_DIR:-build}
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure -j"$(nproc)"
