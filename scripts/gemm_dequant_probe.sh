#!/usr/bin/env bash
# The dequant route of MXFP8 and NVFP4 (docs/gemm.md, "What is left for the grouped GEMM") against its parts, on a
# Hopper GPU: the fused kernels, the route itself (`--route dequant`), the bf16 / fp16 `none` GEMM
# on the same problem and the device copy bandwidth (torch), then the route's floor: the 16-bit
# GEMM plus one pass that reads each operand's quantized bytes and writes 2 bytes per element at
# the copy bandwidth. The gap between the route and its floor is its dequantization kernels'.
#   scripts/gemm_dequant_probe.sh OUT_DIR [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gemm_dequant_probe.sh OUT_DIR [ROUNDS]}
ROUNDS=${2:-2}
mkdir -p "$OUT"
. scripts/gpu_build.sh
gpu_build "$OUT" qforge || exit 1
Q=$BUILD/tools/qforge
export QFORGE_CACHE_DIR=${QFORGE_CACHE_DIR:-$BUILD/gpu-cache}
: >"$OUT/gemm.jsonl"
for ((r = 1; r <= ROUNDS; ++r)); do
  for sc in blockwise mxfp8 nvfp4 "mxfp8 --route dequant" "nvfp4 --route dequant" "none" "none --a-format fp16"; do
    $Q gemm --scaling $sc --groups 8 --m 4096 --n 4096 --k 7168 --bench --json "$OUT/gemm.jsonl" >>"$OUT/gemm.log" 2>&1 ||
      echo "qforge gemm $sc failed (see $OUT/gemm.log)"
  done
done
python3 - "$OUT/gemm.jsonl" <<'PY'
import json, sys
import torch
x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize(); s.record()
for _ in range(20): y.copy_(x)
e.record(); torch.cuda.synchronize()
copy = 2 * x.numel() / (s.elapsed_time(e) / 20 / 1e3)
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def ms(pred):
    t = [r["bench"]["median_ms"] for r in rows if "bench" in r and pred(r)]
    return min(t) if t else None
key = lambda sc, dt=None, route=False: (lambda r: r.get("scaling") == sc and ("dequant route" in r["gemm"]) == route and
                                       (dt is None or r["gemm"].split()[0] == dt))
block, mx, nv = ms(key("blockwise")), ms(key("mxfp8")), ms(key("nvfp4"))
routes = {"mxfp8": ms(key("mxfp8", route=True)), "nvfp4": ms(key("nvfp4", route=True))}
bf16, fp16 = ms(key("none", "bf16")), ms(key("none", "fp16"))
flops = 2 * 8 * 4096 * 4096 * 7168
elems = 8 * 4096 * 7168 * 2  # A [32768, 7168] and B [8, 4096, 7168]
print(f"copy bandwidth {copy / 1e9:.0f} GB/s; best medians (ms): blockwise {block}, mxfp8 {mx}, nvfp4 {nv}, bf16 {bf16}, fp16 {fp16}")
for name, fused, g16, read in (("mxfp8", mx, bf16, 1 + 1 / 32), ("nvfp4", nv, fp16, 0.5 + 1 / 16)):
    if None in (fused, g16, block): continue
    t = g16 + (read + 2) * elems / copy * 1e3
    print(f"{name}: fused {flops / fused / 1e9:.0f} TFLOP/s; route floor (16-bit GEMM + dequantization at the copy "
          f"bandwidth) {t:.3f} ms = {flops / t / 1e9:.0f} TFLOP/s, {block / t * 100:.0f} % of blockwise")
    if routes[name]:
        r = routes[name]
        print(f"{name}: route measured {r:.3f} ms = {flops / r / 1e9:.0f} TFLOP/s, {block / r * 100:.0f} % of blockwise, "
              f"{fused / r:.2f}x the fused kernel; route minus the 16-bit GEMM on random values: the dequantization at "
              f"about {(read + 2) * elems / ((r - g16) * 1e-3) / copy * 100:.0f} % of the copy bandwidth (approximate: the "
              f"GEMM's clocks depend on its values)")
PY
