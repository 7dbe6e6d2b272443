#!/usr/bin/env bash
# The JIT compile-time benchmark, reported and never failed on time (a slow or busy machine only
# gives larger figures; docs/jit.md has the goals): `qforge prewarm` of the shipped recipes for
# sm_90a into an empty cache on every core this process may use (wall seconds and kernel-seconds),
# then the same prewarm over the full cache (every kernel a disk hit, each timed in qforge's debug
# log), then every kernel it compiled compiled again, one at a time, by bench/jit_time.py (CPU ms per
# compile, median / max / sum per kind; a table per kind of kernel: cold compile and warm hit).
# On a GPU host (nvidia-smi lists one) with BUILD/bench/qforge_first_call built, also the first
# quantize call of each shipped plan in a fresh process (bench/first_call.py, the full cache as the
# shipped root): through the C++ API for a shape of whole tiles (4096 x 4096) and one with edge tiles
# (4000 x 4000), from the shipped root, a warm cache and an empty one; through qforge.torch too
# (4096 x 4096, shipped root and empty cache) where torch imports and QFORGE_EXTENSION names
# qforge._C (scripts/gpu_binding.sh's environment). Their medians become the table's first-call
# column, so the whole latency table comes from this one command.
# Fails only when a kernel fails to compile or a first call fails.
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
# First calls, where there is a GPU: the full cache plays the wheel's bundle.
first=()
if [ -x "$BUILD/bench/qforge_first_call" ] && nvidia-smi -L >/dev/null 2>&1; then
  python3 bench/first_call.py --qforge "$BUILD/tools/qforge" --bundle "$cache" --cpp "$BUILD/bench/qforge_first_call" \
    --no-torch --shapes 4096x4096,4000x4000 --json "$cache/first_cpp.json" >"$cache/first_cpp.log" 2>&1 ||
    { cat "$cache/first_cpp.log"; echo "jit_report: bench/first_call.py (C++) failed"; exit 1; }
  sed -n '/^First quantize call/,$p' "$cache/first_cpp.log"
  first+=(--first-call "$cache/first_cpp.json")
  if [ -n "${QFORGE_EXTENSION:-}" ] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    python3 bench/first_call.py --qforge "$BUILD/tools/qforge" --bundle "$cache" --shapes 4096x4096 \
      --states shipped,cold --json "$cache/first_torch.json" >"$cache/first_torch.log" 2>&1 ||
      { cat "$cache/first_torch.log"; echo "jit_report: bench/first_call.py (torch) failed"; exit 1; }
    sed -n '/^First quantize call/,$p' "$cache/first_torch.log"
    first+=(--first-call "$cache/first_torch.json")
  else
    echo "first calls through qforge.torch: not measured (needs torch with CUDA and QFORGE_EXTENSION)"
  fi
else
  echo "first calls: not measured (no GPU, or no $BUILD/bench/qforge_first_call)"
fi
# One compile at a time in this process: CPU ms per kernel, which other load barely moves; last, the
# latency table per kind of kernel (cold compile, warm hit, first call).
python3 bench/jit_time.py --cache "$cache" --hits "$cache/hits.log" "${first[@]}" >"$cache/jit_time.log" 2>&1
jrc=$?
sed -n '/^CPU ms per compile/,$p' "$cache/jit_time.log"
echo "goals (docs/jit.md): quantize median <= 200 ms and none > 500 ms; GEMM median <= 1000 ms"
if [ $jrc -ne 0 ]; then tail -20 "$cache/jit_time.log"; echo "jit_report: bench/jit_time.py failed (rc=$jrc)"; exit 1; fi
