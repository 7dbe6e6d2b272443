#!/usr/bin/env bash
# The JIT compile-time benchmark, reported and never failed on time (a slow or busy machine only
# gives larger figures; docs/jit.md has the goals): `qforge prewarm` of the shipped recipes for
# sm_90a into an empty cache on every core this process may use (wall seconds and kernel-seconds),
# then the same prewarm over the full cache (every kernel a disk hit, each timed in qforge's debug
# log), then every kernel it compiled compiled again, one at a time, by bench/jit_time.py (CPU ms per
# compile, median / max / sum per kind; a table per kind of kernel: cold compile and warm hit).
# Fails only when a kernel fails to compile.
#   scripts/jit_report.sh [BUILD]     (BUILD: a build with tools/qforge; default $QFORGE_BUILD_DIR or build)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-${QFORGE_BUILD_DIR:-build}}
export PATH="/usr/local/cuda/bin:$PATH"
cache=$(mktemp -d) || exit 1
trap 'rm -rf "$cache"' EXIT
echo "== JIT compile time on $(nproc) CPU(s), $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
t0=$(date +%s.%N)
QFORGE_CACHE_DIR="$cache" "$BUILD/tools/qforge" prewarm recipes --arch sm_90a >"$cache/prewarm.log" 2>&1
rc=$?
t1=$(date +%s.%N)
grep -E '^(time|prewarm):' "$cache/prewarm.log"
awk -v a="$t0" -v b="$t1" 'BEGIN { printf "cold prewarm of the shipped recipes: %.1f s wall (goal: <= 30 s on 2 cores)\n", b - a }'
if [ $rc -ne 0 ]; then cat "$cache/prewarm.log"; echo "jit_report: qforge prewarm failed (rc=$rc)"; exit 1; fi
# A warm start: the same prewarm over the full cache, every kernel a disk hit, each one's time logged.
QFORGE_CACHE_DIR="$cache" QFORGE_LOG_LEVEL=debug "$BUILD/tools/qforge" prewarm recipes --arch sm_90a >"$cache/hits.log" 2>&1
grep -E '^prewarm:' "$cache/hits.log" | sed 's/^/warm: /'
# One compile at a time in this process: CPU ms per kernel, which other load barely moves; last, the
# latency table per kind of kernel (cold compile, warm hit).
python3 bench/jit_time.py --cache "$cache" --hits "$cache/hits.log" >"$cache/jit_time.log" 2>&1
jrc=$?
sed -n '/^CPU ms per compile/,$p' "$cache/jit_time.log"
echo "goals (docs/jit.md): quantize median <= 200 ms and none > 500 ms; GEMM median <= 1000 ms"
if [ $jrc -ne 0 ]; then tail -20 "$cache/jit_time.log"; echo "jit_report: bench/jit_time.py failed (rc=$jrc)"; exit 1; fi
