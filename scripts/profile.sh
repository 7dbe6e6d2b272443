#!/usr/bin/env bash
# Nsight Compute profile of the quantize kernels (amax, cast, one-pass row) of a few plans at one size (for the
# bandwidth work of bench/): speed of light, occupancy, warp stalls, memory workload.
#   scripts/profile.sh BUILD_DIR OUT_DIR [SIZE] [FILTER...]
# SOURCE=1 also exports each cast kernel's per-SASS-instruction counts (executed instructions,
# warp-stall samples: ncu's source page) to OUT_DIR/src_*.csv and summarizes them with
# bench/sass_hotspots.py into OUT_DIR/src_*.txt (opcode mix, hottest basic blocks).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=$1; OUT=$2; SIZE=${3:-16384x16384}; shift 3 || true
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -z "$NCU" ] && { echo "profile: ncu not found"; exit 0; }
mkdir -p "$OUT"
for f in "${@:-mxfp8 linear:input training}"; do
  tag=$(echo "$f" | tr ' :' '__')
  "$NCU" --launch-skip 6 --launch-count 2 -k regex:'cast_kernel|cast_fused_kernel|amax_kernel|row_kernel' \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section LaunchStats --section SchedulerStats \
    "$BUILD/bench/qforge_bench" --sizes "$SIZE" --filter "$f" --iters-ms 1 --out "$OUT/ncu_$tag.json" \
    >"$OUT/ncu_$tag.txt" 2>&1
  echo "== $f"
  if [ "${SOURCE:-0}" = 1 ]; then
    "$NCU" --launch-skip 6 --launch-count 1 -k regex:'cast_kernel|cast_fused_kernel' --section SourceCounters --page source \
      --print-source sass --csv "$BUILD/bench/qforge_bench" --sizes "$SIZE" --filter "$f" --iters-ms 1 \
      --out /dev/null >"$OUT/src_$tag.csv" 2>"$OUT/src_$tag.err"
    python3 bench/sass_hotspots.py "$OUT/src_$tag.csv" >"$OUT/src_$tag.txt" 2>&1 && head -24 "$OUT/src_$tag.txt"
  fi
  grep -E "DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Registers Per|Theoretical Occupancy|Compute \(SM\) Throughput|Block Limit|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Issued Warp|No Eligible|Bank" "$OUT/ncu_$tag.txt" | head -40
done
