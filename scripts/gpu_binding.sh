#!/usr/bin/env bash
# The PyTorch binding's GPU check and benchmark in one go, for a Hopper machine with torch:
# build (libqforge, the CLI, qforge._C), the binding's host-side tests, its GPU tests (bit-exact
# quantize and dequantize against the CPU reference, state_dict round trips, member views, GEMMs
# incl. the mixed-format route, CUDA-graph capture, torch.compile fullgraph, bad arguments),
# the modules' GPU tests (tests/python/test_torch_modules.py), the launch path's
# (tests/python/test_launch_path.py: the tensor-map cache, rebased calls), then
# bench/binding_bench.py (host us per call against one torch op; eager vs CUDA graph), then
# compute-sanitizer memcheck over the dequantize cases.
#   scripts/gpu_binding.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-results}
mkdir -p "$OUT"
. scripts/gpu_build.sh
gpu_build "$OUT" qforge qforge_shared qforge_ext || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
export QFORGE_CACHE_DIR="$BUILD/binding-cache"
export QFORGE_LIBRARY="$BUILD/runtime/libqforge.so" QFORGE_BIN="$BUILD/tools/qforge"
export QFORGE_EXTENSION=$(ls "$BUILD"/python/qforge/_C*.so | head -1)
export PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider tests/python/test_ext.py tests/python/test_torch_binding.py tests/python/test_torch_modules.py \
  tests/python/test_plan_cache.py tests/python/test_launch_path.py \
  2>&1 | tee "$OUT/pytest_binding.log" | tail -40; rc=${PIPESTATUS[0]}
python3 bench/binding_bench.py --json "$OUT/binding_bench.json" 2>&1 | tee "$OUT/binding_bench.md" | tail -20
echo "pytest rc=$rc"
# compute-sanitizer memcheck over the dequantize kernels (every shipped stream, fp32 / bf16 / fp16
# out, the 200x320 edge tiles: pytest ids test_quantize_bit_exact's shapes shape0 / shape1, so
# "shape1" selects them) and the quantize kernels under them, with torch's caching allocator off
# so that every tensor is its own allocation and an access past one is caught.
# QFORGE_BINDING_SANITIZE=0 skips it.
san_rc=-1
if [ "${QFORGE_BINDING_SANITIZE:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider tests/python/test_torch_binding.py -k "test_quantize_bit_exact and shape1" \
    >"$OUT/memcheck_dequantize.log" 2>&1; san_rc=$?
  echo "compute-sanitizer memcheck, dequantize: rc=$san_rc; $(grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck_dequantize.log" | tr '\n' ' ' | cut -c1-200)"
fi
[ "$san_rc" -gt 0 ] && rc=1
exit $rc
