#!/usr/bin/env bash
# The quantize benchmark in one command, on a machine with an NVIDIA GPU:
#   scripts/bench.sh OUT_DIR [--quick] [--sizes MxK,MxK,...] [--no-gemm]
# builds qforge (Release), compiles the shipped recipes into a cache, then writes to OUT_DIR:
#   qforge_bench.json     every shipped recipe x role x direction set x size, bf16 input: time,
#                         minimal bytes, GB/s and the ratio to the copy bandwidth measured in
#                         the same run (bench/qforge_bench.cpp)
#   torch_baselines.json  torch eager / torch.compile on the cases torch can express, checked
#                         against qforge's outputs first (bench/torch_baselines.py; skipped
#                         without torch)
#   gemm.jsonl            on sm_90 GPUs: `qforge gemm --bench` for every scaling (MXFP8 and NVFP4
#                         by both routes) on the goal table's grouped-GEMM shapes plus wgrad, and the
#                         torch baselines on the same
#                         shapes (scripts/gemm_torch_baseline.py; skipped without torch)
#   report.md, bandwidth.png  tables (quantize bandwidth; grouped GEMM TFLOP/s) and the
#                         bandwidth-vs-size plot (bench/report.py; the PNG needs matplotlib)
# --quick: sizes 1024^2 and 16384^2, one GEMM shape. --sizes: these sizes only, for qforge_bench
# and the torch baselines (qforge_bench then leaves the grouped cases out). --no-gemm: the
# quantize part only (the README's quantize table: --sizes 1024x1024,16384x16384,65536x7168).
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/bench.sh OUT_DIR [--quick] [--sizes MxK,MxK,...] [--no-gemm]"
OUT=${1:?$usage}
shift
QUICK=; SIZES=(); GEMM=1
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=--quick ;;
    --sizes) [ $# -ge 2 ] || { echo "--sizes: expected MxK,MxK,... after it" >&2; exit 2; }
             SIZES=(--sizes "$2"); shift ;;
    --no-gemm) GEMM=0 ;;
    *) echo "scripts/bench.sh: unknown argument '$1' ($usage)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
. scripts/gpu_build.sh
gpu_build "$OUT" qforge qforge_bench || exit 1
export QFORGE_CACHE_DIR=${QFORGE_CACHE_DIR:-$BUILD/gpu-cache}
"$BUILD/tools/qforge" prewarm recipes --dtype bf16 --quiet >"$OUT/prewarm.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.memory --format=csv,noheader >"$OUT/gpu.txt" 2>&1
"$BUILD/bench/qforge_bench" --recipes recipes --out "$OUT/qforge_bench.json" $QUICK "${SIZES[@]}" 2>"$OUT/qforge_bench.log"
rc=$?
tail -3 "$OUT/qforge_bench.log"
if python3 -c "import torch" 2>/dev/null && [ -f bench/torch_baselines.py ]; then
  python3 bench/torch_baselines.py --qforge "$BUILD/tools/qforge" --out "$OUT" $QUICK "${SIZES[@]}" >"$OUT/torch_baselines.log" 2>&1 \
    || echo "torch baselines failed (see $OUT/torch_baselines.log)"
fi
# Grouped GEMM (sm_90a kernels): qforge and torch on identical shapes, JSON lines in gemm.jsonl.
if [ "$GEMM" = 1 ] && [ "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)" = "9.0" ]; then
  : >"$OUT/gemm.jsonl"
  GEMM_SHAPES="8:4096:4096:7168 4:8192:7168:2048 32:512:2048:7168"
  [ "$QUICK" = "--quick" ] && GEMM_SHAPES="8:4096:4096:7168"
  for shape in $GEMM_SHAPES; do
    IFS=: read -r g m n k <<<"$shape"
    for sc in "blockwise" "mxfp8" "nvfp4" "mxfp8 --route dequant" "nvfp4 --route dequant" "rowwise" "rowwise --fast-accum" \
              "tensor --fast-accum"; do
      timeout 120 "$BUILD/tools/qforge" gemm --scaling $sc --groups "$g" --m "$m" --n "$n" --k "$k" --bench \
        --json "$OUT/gemm.jsonl" >>"$OUT/gemm.log" 2>&1 || echo "qforge gemm $sc $shape failed (see $OUT/gemm.log)"
    done
    if python3 -c "import torch" 2>/dev/null; then
      timeout 300 python3 scripts/gemm_torch_baseline.py --groups "$g" --m "$m" --n "$n" --k "$k" \
        --json "$OUT/gemm.jsonl" >>"$OUT/gemm.log" 2>&1 || echo "torch GEMM baselines failed (see $OUT/gemm.log)"
    fi
  done
  # wgrad of the first shape's expert weight (K-grouped over 8 x 4096 tokens, M 4096, N 7168).
  # The same on per-member copies (the grouped quantizer's layout, --members). Blockwise and MXFP8
  # on both scale layouts (the shipped float8_block_scaling / mxfp8_hopper recipes: mn_major).
  for sc in "tensor" "tensor --fast-accum" "blockwise" "blockwise --scale-layout mn_major" "mxfp8" \
            "mxfp8 --scale-layout mn_major" "nvfp4" "mxfp8 --route dequant" "nvfp4 --route dequant"; do
    for layout in "" "--members"; do
      [[ $sc == *dequant* && -n $layout ]] && continue  # the dequant route takes one tensor's copies
      timeout 120 "$BUILD/tools/qforge" gemm --scaling $sc --k-grouped $layout --groups 8 --m 4096 --n 7168 --k 4096 --bench \
        --json "$OUT/gemm.jsonl" >>"$OUT/gemm.log" 2>&1 || echo "qforge gemm wgrad $sc $layout failed (see $OUT/gemm.log)"
    done
  done
fi
if [ -f bench/report.py ]; then
  python3 bench/report.py --in "$OUT" --out "$OUT" >"$OUT/report.log" 2>&1 || echo "report failed (see $OUT/report.log)"
  [ -f "$OUT/report.md" ] && head -60 "$OUT/report.md"
fi
exit $rc
