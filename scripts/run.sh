#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, then compile every kernel
# the shipped recipes can need into the kernel cache (qforge prewarm), printing a summary.
#   scripts/run.sh [extra qforge prewarm options, e.g. --arch sm_90a,sm_100a]
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
BUILD=${QFORGE_BUILD_DIR:-build}
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target qforge
"$BUILD/tools/qforge" check --quiet $(ls recipes/*.json | grep -v recipe.schema.json)
"$BUILD/tools/qforge" prewarm recipes "$@"
