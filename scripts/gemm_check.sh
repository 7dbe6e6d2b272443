#!/usr/bin/env bash
# The grouped-GEMM GPU check in one go, for a Hopper machine: configure + build (only the CLI and
# the unit tests), the GEMM GPU tests (bit-exact small-integer cases, random cases against the
# float64 reference), then `qforge gemm --bench` on the goal shape and torch baselines on the
# same shape, and a summary table last. Logs and JSON lines go to $1 (default ./gemm-results).
#   scripts/gemm_check.sh OUT_DIR [quick]
# Build: scripts/gpu_build.sh (QFORGE_BUILD_DIR, QFORGE_BUILD_TYPE, QFORGE_DEPS_PREFIX, .gpudeps/).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gemm-results}
MODE=${2:-full}
mkdir -p "$OUT"
. scripts/gpu_build.sh
LOG="$OUT/log.txt"; RES="$OUT/results.jsonl"; : >"$LOG"; : >"$RES"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader >"$OUT/gpu.txt" 2>&1

# ---- build
gpu_build "$OUT" qforge qforge_unit_tests || exit 1
TESTBIN="$BUILD/tests/qforge_unit_tests"
export QFORGE_CACHE_DIR="$BUILD/gpu-cache"
t1=$(date +%s)
Q="$BUILD/tools/qforge"

# ---- smoke: one small blockwise GEMM through the CLI (a hang traps after 4 s in the kernel)
timeout 60 "$Q" gemm --groups 3 --m 300 --uneven --n 256 --k 512 --check --check-rows 64 >>"$LOG" 2>&1
smoke_rc=$?
echo "smoke rc=$smoke_rc" >>"$LOG"

# ---- GPU tests, one process per test (scripts/gpu_tests.sh)
. scripts/gpu_tests.sh
results=$(run_gpu_tests "$TESTBIN" "${GEMM_TEST_FILTER:-*Gemm*}" "$LOG" 4 120)
pass=$(echo "$results" | grep -c "^P")
fail=$(echo "$results" | grep -c "^F")
skip=$(echo "$results" | grep -c "^S")
t2=$(date +%s)

# ---- benchmarks: 8 groups x 4096 x N 4096 x K 7168 (the goal shape), bf16 out
bench() {  # label, args... (default shape: 8 groups x 4096 rows, N 4096, K 7168)
  local label=$1; shift
  local line
  line=$(timeout 90 "$Q" gemm --groups 8 --m 4096 --n 4096 --k 7168 --bench --iters 20 --json "$RES" "$@" 2>&1 | tee -a "$LOG" |
         grep -E "^bench:|^check:|^persistent|error" | sed -e 's/ over 20 runs//' -e 's/vs the float64 reference //' | tr '\n' ' ')
  printf "%-34s %s\n" "$label" "$line" >>"$OUT/bench.txt"
}
: >"$OUT/bench.txt"
if [ "$MODE" != "quick" ]; then
  bench "blockwise mc1 (unordered) +check" --scaling blockwise --check --check-rows 2
  bench "blockwise mc1 ordered" --scaling blockwise --ordered on
  bench "blockwise mc1 88 CTAs" --scaling blockwise --max-ctas 88
  bench "blockwise mc2 +check" --scaling blockwise --multicast 2 --check --check-rows 2
  bench "blockwise mc1 uneven" --scaling blockwise --uneven
  bench "blockwise mc1 raster16" --scaling blockwise --raster 16
  bench "blockwise 4x8192 N7168 K2048" --scaling blockwise --groups 4 --m 8192 --n 7168 --k 2048
  bench "blockwise 32x512 N2048 K7168" --scaling blockwise --groups 32 --m 512 --n 2048 --k 7168
  bench "rowwise promote mc1 (unordered, 4 st)" --scaling rowwise
  bench "rowwise promote mc1 ordered 5 st" --scaling rowwise --ordered on --stages 5
  bench "rowwise fast 128x128 mc1" --scaling rowwise --fast-accum
  bench "rowwise fast 128x128 mc1 ordered" --scaling rowwise --fast-accum --ordered on
  bench "tensor promote mc1 (unordered, 4 st)" --scaling tensor
  bench "tensor fast 128x128 mc1" --scaling tensor --fast-accum
  bench "tensor fast 128x256 mc1" --scaling tensor --fast-accum --block-n 256
  bench "int8 rowwise (w8a8) +check" --scaling rowwise --a-format int8 --b-format int8 --check --check-rows 2
  bench "int8 rowwise 128x128" --scaling rowwise --a-format int8 --b-format int8 --block-n 128
  bench "int8 tensor" --scaling tensor --a-format int8 --b-format int8
  bench "int8 blockwise (promoted) +check" --scaling blockwise --a-format int8 --b-format int8 --check --check-rows 2
  bench "mxfp8 128x128 +check" --scaling mxfp8 --check --check-rows 2
  bench "mxfp8 128x128 uneven" --scaling mxfp8 --uneven
  bench "mxfp8 64x128 (block_m 64)" --scaling mxfp8 --block-m 64
  bench "mxfp8 4x8192 N7168 K2048" --scaling mxfp8 --groups 4 --m 8192 --n 7168 --k 2048
  bench "blockwise masked 3072/4096 +check" --scaling blockwise --m 3072 --m-max 4096 --check --check-rows 2
  bench "mxfp8 masked 3072/4096" --scaling mxfp8 --m 3072 --m-max 4096
  bench "nvfp4 128x128 +check" --scaling nvfp4 --check --check-rows 2
  bench "nvfp4 uneven" --scaling nvfp4 --uneven
  bench "nvfp4 4x8192 N7168 K2048" --scaling nvfp4 --groups 4 --m 8192 --n 7168 --k 2048
  bench "bf16 (none) 128x256 +check" --scaling none --check --check-rows 2
  bench "bf16 (none) 128x128" --scaling none --block-n 128
  bench "fp16 (none) 128x256" --scaling none --a-format fp16 --b-format fp16
  bench "bf16 (none) 4x8192 N7168 K2048" --scaling none --groups 4 --m 8192 --n 7168 --k 2048
  bench "wgrad k-grouped bf16 (none) +check" --scaling none --k-grouped --m 4096 --n 7168 --k 4096 --check --check-rows 2
  bench "wgrad k-grouped tensor promote +check" --scaling tensor --k-grouped --m 4096 --n 7168 --k 4096 --check --check-rows 2
  bench "wgrad k-grouped tensor fast" --scaling tensor --k-grouped --m 4096 --n 7168 --k 4096 --fast-accum
  bench "wgrad k-grouped tensor fast uneven" --scaling tensor --k-grouped --m 4096 --n 7168 --k 4096 --fast-accum --uneven
  bench "wgrad k-grouped fast fp32 acc" --scaling tensor --k-grouped --m 4096 --n 7168 --k 4096 --fast-accum --out fp32 --accumulate
  bench "wgrad k-grouped fast odd splits +check" --scaling tensor --k-grouped --m 4096 --n 7168 --fast-accum \
    --splits 4001,4100,3999,4200,4096,3900,4003,4469 --check --check-rows 2
  bench "wgrad k-grouped rowwise (per channel) +check" --scaling rowwise --k-grouped --m 4096 --n 7168 --k 4096 --check --check-rows 2
  bench "wgrad k-grouped rowwise fast" --scaling rowwise --k-grouped --m 4096 --n 7168 --k 4096 --fast-accum
  bench "wgrad k-grouped blockwise +check" --scaling blockwise --k-grouped --m 4096 --n 7168 --k 4096 --check --check-rows 2
  bench "wgrad k-grouped blockwise fp32 acc" --scaling blockwise --k-grouped --m 4096 --n 7168 --k 4096 --out fp32 --accumulate
  bench "wgrad k-grouped blockwise odd splits +check" --scaling blockwise --k-grouped --m 4096 --n 7168 \
    --splits 4001,4100,3999,4200,4096,3900,4003,4469 --check --check-rows 2
  bench "wgrad k-grouped mxfp8 +check" --scaling mxfp8 --k-grouped --m 4096 --n 7168 --k 4096 --check --check-rows 2
  bench "wgrad k-grouped nvfp4 +check" --scaling nvfp4 --k-grouped --m 4096 --n 7168 --k 4096 --check --check-rows 2
  bench "wgrad k-grouped nvfp4 fp32 acc odd splits +check" --scaling nvfp4 --k-grouped --m 4096 --n 7168 --out fp32 \
    --accumulate --splits 4001,4100,3999,4200,4096,3900,4003,4469 --check --check-rows 2
  # wgrad on the grouped quantizer's per-member copies (tensor maps built on the device)
  for s in tensor rowwise blockwise mxfp8 nvfp4 none; do
    bench "wgrad members $s +check" --scaling $s --k-grouped --members --m 4096 --n 7168 --k 4096 --check --check-rows 2
    bench "wgrad members $s uneven" --scaling $s --k-grouped --members --m 4096 --n 7168 --k 4096 --uneven
  done
  timeout 120 python3 scripts/gemm_torch_baseline.py --groups 8 --m 4096 --n 4096 --k 7168 --json "$RES" \
    >>"$OUT/bench.txt" 2>&1
fi
t3=$(date +%s)

echo "== qforge GEMM check on $(cat "$OUT/gpu.txt")"
echo "build $((t1 - t0)) s; tests $((t2 - t1)) s; bench $((t3 - t2)) s"
echo "smoke (qforge gemm --check, 3 uneven groups, N 256, K 512): rc=$smoke_rc $(grep -E '^check:' "$LOG" | head -2 | tr '\n' ' ')"
echo "GPU GEMM tests: $pass passed, $fail failed, $skip skipped"
echo "$results" | grep "^F" | head -20
grep -E "measure" "$LOG" | sed 's/.*\] //' | head -12
cat "$OUT/bench.txt"
[ "$fail" -eq 0 ] && [ "$smoke_rc" -eq 0 ]
