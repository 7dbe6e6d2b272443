#!/usr/bin/env bash
# Where the dequant route overtakes the fused kernels (MXFP8, NVFP4), on a Hopper GPU: both routes
# timed (`qforge gemm --bench`, medians) over tokens per group at several expert shapes, M-grouped
# (fprop / dgrad) and K-grouped (wgrad), in one process per case, fused, dequant and auto in turn.
# The table it prints is what `GemmRoute::Auto`'s rule (compiler/gemm_codegen.cpp,
# choose_gemm_route) was set from, with the route auto takes and its time against the faster
# route's; rerun it on another GPU to check the rule there.
#   scripts/gemm_route_sweep.sh OUT_DIR [ROUNDS]
# SCALINGS="mxfp8" sweeps one format (default "mxfp8 nvfp4"); SWEEP_ARGS adds `qforge gemm`
# arguments to every case (e.g. "--scale-layout mn_major", the shipped mxfp8_hopper's grids).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gemm_route_sweep.sh OUT_DIR [ROUNDS]}
ROUNDS=${2:-1}
SCALINGS=${SCALINGS:-mxfp8 nvfp4}
read -r -a EXTRA <<<"${SWEEP_ARGS:-}"
mkdir -p "$OUT"
: >"$OUT/sweep.jsonl"
. scripts/gpu_build.sh
gpu_build "$OUT" qforge || exit 1
Q=$BUILD/tools/qforge
export QFORGE_CACHE_DIR=${QFORGE_CACHE_DIR:-$BUILD/gpu-cache}
# layout groups n k tokens-per-group... (k_grouped: --m is the output rows, --k the tokens per group)
CASES=(
  "m 8 4096 7168 128 256 512 768 1024 1536 2048 4096"
  "m 4 7168 2048 256 512 1024 2048 8192"
  "m 32 2048 7168 64 128 256 512 1024"
  "m 8 2048 2048 256 512 1024 2048"
  "k 8 7168 4096 256 512 1024 4096"
  "k 8 2048 2048 256 1024 4096"
)
for ((r = 1; r <= ROUNDS; ++r)); do
  for c in "${CASES[@]}"; do
    read -r layout g n k tokens <<<"$c"
    for t in $tokens; do
      for sc in $SCALINGS; do
        for route in fused dequant auto; do
          if [ "$layout" = m ]; then
            args=(--groups "$g" --m "$t" --n "$n" --k "$k")
          else
            args=(--k-grouped --groups "$g" --m "$k" --n "$n" --k "$t")
          fi
          $Q gemm --scaling "$sc" --route "$route" "${args[@]}" "${EXTRA[@]}" --bench --iters 30 --json "$OUT/sweep.jsonl" \
            >>"$OUT/sweep.log" 2>&1 || echo "failed: $sc --route $route ${args[*]} (see $OUT/sweep.log)"
        done
      done
    done
  done
done
# Each record names the route asked for ("route_asked") and the one run ("route").
python3 - "$OUT/sweep.jsonl" <<'PY' | tee "$OUT/sweep.md"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
best = {}
for r in recs:
    if "bench" not in r: continue
    kg = r["layout"] == "k_grouped"
    key = ("K-grouped" if kg else "M-grouped", r["scaling"], r["num_groups"], r["n"], r["m"] if kg else r["k"], r["groups"][0])
    which = r["route_asked"]
    ms = r["bench"]["median_ms"]
    e = best.setdefault(key, {})
    if which not in e or ms < e[which][0]: e[which] = (ms, r["route"])
print("| layout | scaling | G | N | K (k_grouped: M) | tokens per group | fused ms | dequant ms | dequant / fused | auto takes | auto / faster |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
worst = 1.0
for key in sorted(best):
    e = best[key]
    if not {"fused", "dequant"} <= e.keys(): continue
    f, d = e["fused"][0], e["dequant"][0]
    auto = e.get("auto")
    took = auto[1] if auto else "-"
    ratio = (e[took][0] if auto else 0) / min(f, d)  # the chosen route's time against the faster one (same-process medians)
    if auto: worst = max(worst, ratio)
    print("| " + " | ".join(str(x) for x in key) + f" | {f:.4f} | {d:.4f} | {d / f:.2f} | {took} | {ratio:.2f} |")
print(f"\nauto's route at most {worst:.2f}x the faster route's time (both routes' medians)")
PY
