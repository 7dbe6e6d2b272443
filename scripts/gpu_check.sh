#!/usr/bin/env bash
# The whole GPU check in one go, for a Hopper machine: configure + build, NVRTC compile of every
# shipped kernel for the device's arch (qforge prewarm), the GPU test suites (bit-exact against
# the CPU reference), then a summary table. Logs and results go to $1 (default ./gpu-results).
#   scripts/gpu_check.sh OUT_DIR [extra ctest -R regex]
# Build: scripts/gpu_build.sh (QFORGE_BUILD_DIR, QFORGE_DEPS_PREFIX, .gpudeps/).
# QFORGE_CHECK_PARTS="tests python sanitize" (default) runs all three parts, or a list of some:
# tests (prewarm, one CLI process cold and warm, the GPU ctest suites), python (the CLI's device
# pytest and tests/python with the compiled extension), sanitize (compute-sanitizer). On an H200
# (2026-11-29, 2218 GPU ctest cases): tests about 9.5 minutes (ctest 7.5; the regex argument
# splits it), python about 2.5, sanitize about 2, after a build of about 1.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-results}
FILTER=${2:-}
PARTS=${QFORGE_CHECK_PARTS:-tests python sanitize}
for p in $PARTS; do
  case $p in tests|python|sanitize) ;; *) echo "QFORGE_CHECK_PARTS: expected some of tests, python, sanitize, got '$p'" >&2; exit 2 ;; esac
done
[ -n "${PARTS// /}" ] || { echo "QFORGE_CHECK_PARTS: expected some of tests, python, sanitize, got nothing" >&2; exit 2; }
part() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT"
t0=$(date +%s)
. scripts/gpu_build.sh
gpu_build "$OUT" || exit 1
t1=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
export QFORGE_CACHE_DIR="$BUILD/gpu-cache"
prewarm_rc=-1; cold=-; warm=-; gpu_rc=0; dev_rc=-1; py_rc=-1; t2=$t1; t3=$t1
if part tests; then
"$BUILD/tools/qforge" prewarm recipes >"$OUT/prewarm.log" 2>&1; prewarm_rc=$?
"$BUILD/tools/qforge" prewarm recipes >"$OUT/prewarm_warm.log" 2>&1
t2=$(date +%s)
# End-to-end latency of one `qforge quantize --device cuda` process (4096x4096 fp32, nvfp4
# input role: amax + fused RHT cast): cold cache (NVRTC compile) vs warm (disk hit + load).
python3 -c "import numpy as np; np.save('$OUT/x.npy', np.random.default_rng(0).standard_normal((4096, 4096), dtype=np.float32))"
e2e() { local s e; s=$(date +%s%N); "$BUILD/tools/qforge" quantize --recipe recipes/nvfp4.json --role linear:input \
  --input "$OUT/x.npy" --out "$OUT/q" --device cuda >/dev/null 2>>"$OUT/e2e.log"; e=$(date +%s%N); echo "$(( (e - s) / 1000000 ))"; }
cold=$(QFORGE_CACHE_DIR="$OUT/cold-cache" e2e); warm=$(QFORGE_CACHE_DIR="$OUT/cold-cache" e2e)
rm -rf "$OUT/cold-cache" "$OUT/q" "$OUT/x.npy"
ctest --test-dir "$BUILD" -j"$(nproc)" --timeout 600 -R "${FILTER:-Gpu|Driver|Cuda|GemmExact|GemmRandom|GemmEdge}" \
  --output-on-failure >"$OUT/ctest_gpu.log" 2>&1; gpu_rc=$?
t3=$(date +%s)
fi
if part python; then
# CLI on the GPU: qforge quantize --device cuda vs the CPU path, bit for bit.
python3 -m pytest -q -p no:cacheprovider tests/numerics/test_quantize_device.py --qforge-bin="$BUILD" \
  >"$OUT/pytest_device.log" 2>&1; dev_rc=$?
# The Python package on the GPU (torch): bit-exact quantize, grouped, delayed-scaling step, a fresh
# thread, an exact GEMM, and with the compiled extension (built with the rest when nanobind and
# torch are there) the binding and modules (tests/python; without torch its GPU cases skip).
ext=$(ls "$BUILD"/python/qforge/_C*.so 2>/dev/null | head -1)
env QFORGE_LIBRARY="$BUILD/runtime/libqforge.so" QFORGE_BIN="$BUILD/tools/qforge" ${ext:+QFORGE_EXTENSION=$ext} \
  python3 -m pytest -q -p no:cacheprovider -rs tests/python >"$OUT/pytest_python.log" 2>&1; py_rc=$?
fi
# Memory, race and initialization checks of fused kernels covering every kernel path: edge tiles
# (hybrid 32x64: RHT, fp8 31x33 fp32), interior tiles with transposed runs and the rowwise block-scale pass
# (blockwise 1x128 / 128x1, 2D 128x128; nvfp4 grouped with SR + RHT), the same-layout
# columnwise path (mxfp8), 2D 16x16 blocks in ragged rows (nvfp4 weight 200x320), delayed-scaling
# amax reporting, per-channel int8 SR, grouped, rowwise-only plans cast straight from global memory
# (mxfp8 / 1x128 fp32 / delayed inference); and GEMM cases (below). QFORGE_SANITIZE_ALL=1 or
# =gemm: whole suites (below; slow).
san_filter='*hybrid*_linear_input__training__bf16__32x64:*hybrid*_linear_input__training__bf16__128x4224:*current*_linear_grad_output__training__fp32__31x33:*nvfp4*grad_output*grouped*:*float8_block*weight__training__bf16__128x4224'
san_filter+=':*float8_block*_linear_input__training__bf16__128x4224:*mxfp8__linear_input__training__bf16__200x320'
san_filter+=':*float8_block*weight__training__fp16__300x384:*nvfp4__linear_weight__training__bf16__200x320:*delayed*input__training__bf16__128x4224:*int8_weight_sr*weight*grouped*'
san_filter+=':*mxfp8__linear_input__inference__bf16__128x4224:*float8_block*_linear_input__inference__fp32__128x4224:*delayed*input__inference__bf16__200x320'
# The one-launch form of per-channel plans (25be0da): the workspace zeroed by the kernel, row and
# column amaxes reduced from the staged tiles between the grid barriers.
san_filter+=':*fp8_rowwise__linear_input__training__bf16__200x320:*int8_weight_sr__linear_weight__training__bf16__200x320:GpuQuantizeGraph.*'
# The cast kernel that serves both forms (cast_fused_kernel: NVFP4, the hybrid, int8 SR weights and
# fp32 per-tensor training casts), one launch on interior tiles only; the cases above take it too.
san_filter+=':*nvfp4__linear_input__training__bf16__256x1024__interior'
# The one-pass row kernel of rowwise per-channel plans (single, grouped, fp32 rows of 8 warps) and
# the per-channel row + column pre-pass straight from global memory (interior tiles).
san_filter+=':*w8a8_int8_inference__linear_input__inference__bf16__128x4224:*w8a8_int8_inference__linear_input__inference__bf16__1072x256__grouped*'
san_filter+=':*int8_weight_sr__linear_weight__inference__fp32__200x320:*fp8_rowwise__linear_input__training__bf16__128x4224'
# Grouped GEMM: blockwise (scales in registers), MXFP8 (scale writers, per-32 promotion), NVFP4, K-grouped
# (shared-memory zeroing), masked, multicast, several tiles per CTA; all three tools take every
# kind (every consumer lane releases a stage: docs/gemm.md; NVFP4 raced clean 2026-11-24).
gemm_cases='*GemmExact*tensor_promote_bf16:*GemmExact*rowwise_promote_bf16:*GemmExact*kgrouped_tensor_bf16:*GemmExact*tensor_many_groups_fast_mc2'
gemm_cases+=':*GemmExact*block_e4m3_bf16:*GemmExact*mxfp8_e4m3_bf16:*GemmExact*masked_block_bf16:*GemmExact*block_many_groups_mc2:*GemmExact*mxfp8_many_groups'
# NVFP4 (A and raw B in load slots of their own, freed by the consumers' A reads and the producers'
# B dequantization into the stages; A into registers): 3 stages + 6 slots, fp32 out 3 + 5, 2 + 5;
# K-grouped 4 + 5 (the members' map ring wrapping on 3 CTAs).
gemm_cases+=':*GemmExact*nvfp4_bf16:*GemmExact*nvfp4_many_groups:*GemmExact*nvfp4_fp32_acc_noalpha'
gemm_cases+=':*GemmExact*nvfp4_two_stages_3ctas:*GemmExact*members_nvfp4_ring'
# K-grouped blockwise and MXFP8 (scale writers, tiles from 128-token boundaries: wider zeroing).
gemm_cases+=':*GemmExact*kgrouped_block_bf16:*GemmExact*kgrouped_mxfp8_bf16'
# K-grouped members: tensor maps written by the producer warp into the workspace ring, then read by TMA.
gemm_cases+=':*GemmExact*members_block_ring:*GemmExact*members_nvfp4_bf16'
# mn_major blockwise scale grids (a27b244, f0f1cb1): the quantize side's padding zeroed by the last
# row's writer (both directions), the K-grouped writers' coalesced loads (one tensor, members on 3
# CTAs), the M-grouped consumers' per-group A grids on 3 CTAs and in masked slots.
gemm_cases+=':*float8_block_scaling_mn_major__linear_input__training__bf16__200x320'
gemm_cases+=':*GemmExact*kgrouped_block_mn_major_bf16:*GemmExact*members_block_mn_major_ring'
gemm_cases+=':*GemmExact*block_mn_major_many_groups_3ctas:*GemmExact*masked_block_mn_major_fp32'
# mn_major e8m0 grids (91a55cd, the shipped mxfp8_hopper): the cast's staged copy-out (row +
# transposed, and the rowwise-only direct path), the MXFP8 writers' word-per-4-rows loads (M-grouped
# per group on 3 CTAs, K-grouped members on 3 CTAs).
gemm_cases+=':*mxfp8_hopper__linear_input__training__bf16__200x320:*mxfp8_hopper__linear_input__inference__bf16__128x4224'
# mxfp8_hopper's training cast from registers on interior tiles (cast_mx_pair_direct: warp shuffles,
# the transposed output staged and copied out), its fp16 edge values, and grouped members.
gemm_cases+=':*mxfp8_hopper__linear_input__training__bf16__128x4224:*mxfp8_hopper__linear_input__training__fp16__256x512__edge'
gemm_cases+=':*mxfp8_hopper__linear_input__training__bf16__1072x256__grouped8'
# The same path for 128x128 weight blocks (the tile's amax by shuffles) and per-tensor scales
# (delayed scaling's amax report after the staging barrier): programs for interior tiles, grouped
# members, current scaling's cast after its amax kernel.
gemm_cases+=':*float8_block_scaling__linear_weight__training__bf16__256x1024__interior'
gemm_cases+=':*delayed_scaling__linear_input__training__bf16__256x1024__interior:*delayed_scaling__linear_input__training__bf16__1072x256__grouped8'
gemm_cases+=':*current_scaling__linear_input__training__bf16__256x1024__separate__interior'
# Per-channel scales (fp8_rowwise): the pre-pass's 8-byte reads of 128-column tiles, then the cast
# reading the workspace; grouped members; past one wave of tiles, the pre-pass's 512-column
# segments (a last one of 3 tiles) and edge rows.
gemm_cases+=':*fp8_rowwise__linear_input__training__bf16__256x1024__separate__interior:*fp8_rowwise__linear_input__training__bf16__1072x256__grouped8'
gemm_cases+=':*fp8_rowwise__linear_input__training__bf16__4000x4480'
gemm_cases+=':*GemmExact*mxfp8_mn_major_many_groups_3ctas:*GemmExact*members_mxfp8_mn_major_ring'
# K-grouped per channel (the TMA epilogue's column factors, restaged per tile) and int8 (s32 sums).
gemm_cases+=':*GemmExact*kgrouped_rowwise_3ctas_fp32:*GemmExact*int8_block_bf16:*GemmExact*int8_rowwise_bf16'
# bf16 operands (64 of K per stage) and weight-only int8 (B converted in place in its stage by the
# producer warpgroup, behind a named barrier; two stages: the next load waits for the MMAs before).
gemm_cases+=':*GemmExact*bf16_bf16:*GemmExact*kgrouped_bf16:*GemmExact*members_bf16'
gemm_cases+=':*GemmExact*channel_bf16:*GemmExact*channel_many_groups_3ctas:*GemmExact*channel_two_stages'
# The dequant route (92bfd71, c9235c2, a23c4b1): the MXFP8 kernel's per-thread group cursor over 40 groups'
# mn_major A grids, the K-grouped copies, and the members' copies (the cursor over members, the
# prep kernel's prefix, starts and NaN alpha of a member the fused kernel cannot load); the
# *members_*_ring and *members_nvfp4_bf16 patterns above take their dequant cases too.
gemm_cases+=':*GemmExact*dequant_mxfp8_mn_major_many_groups:*GemmExact*dequant_kgrouped_nvfp4_bf16'
gemm_cases+=':*GemmExact*dequant_members_mxfp8_odd_grid_start:*GemmExact*dequant_members_nvfp4_odd_grid_start'
san_filter_all="$san_filter:$gemm_cases"
san_filter_race="$san_filter_all"
# QFORGE_SANITIZE_ALL=1: the whole quantize and GEMM suites; racecheck on every quantize case but
# the 4096x4096 and 8192x5120 ones (the kernel paths of the smaller shapes on larger grids; hours
# under racecheck) and on the exact GEMM cases.
[ "${QFORGE_SANITIZE_ALL:-0}" = 1 ] && san_filter_all='*Quantize*:*Gemm*' &&
  san_filter_race='*GpuQuantize*:*GemmExact*-*4096x4096*:*8192x5120*'
# QFORGE_SANITIZE_ALL=gemm: the whole GEMM suites only (racecheck: the exact GEMM cases).
[ "${QFORGE_SANITIZE_ALL:-0}" = gemm ] && san_filter_all='*Gemm*' && san_filter_race='*GemmExact*'
mc_rc=-1; rc_rc=-1; ic_rc=-1
if part sanitize && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/qforge_unit_tests" --gtest_filter="$san_filter_all" \
    >"$OUT/memcheck.log" 2>&1; mc_rc=$?
  compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/qforge_unit_tests" --gtest_filter="$san_filter_race" \
    >"$OUT/racecheck.log" 2>&1; rc_rc=$?
  compute-sanitizer --tool initcheck --error-exitcode 9 "$BUILD/tests/qforge_unit_tests" --gtest_filter="$san_filter_all" \
    >"$OUT/initcheck.log" 2>&1; ic_rc=$?
fi
t4=$(date +%s)
echo "== qforge GPU check on $(cat "$OUT/gpu.txt")"
echo "build $((t1 - t0)) s; prewarm rc=$prewarm_rc ($((t2 - t1)) s): $(tail -1 "$OUT/prewarm.log" 2>/dev/null)"
grep -E "tests passed|tests failed" "$OUT/ctest_gpu.log" 2>/dev/null
grep -E "\*\*\*Failed|Failed  " "$OUT/ctest_gpu.log" 2>/dev/null | head -30
echo "second prewarm (all hits): $(tail -1 "$OUT/prewarm_warm.log" 2>/dev/null)"
echo "qforge quantize --device cuda, 4096x4096 nvfp4 input, whole process: cold cache ${cold} ms, warm cache ${warm} ms"
echo "gpu tests: $((t3 - t2)) s, rc=$gpu_rc"
echo "quantize --device cuda pytest: $(tail -1 "$OUT/pytest_device.log" 2>/dev/null) (rc=$dev_rc)"
echo "python package pytest: $(tail -1 "$OUT/pytest_python.log" 2>/dev/null) (rc=$py_rc)"
echo "compute-sanitizer memcheck: rc=$mc_rc; $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" 2>/dev/null | tr '\n' ' ' | cut -c1-300)"
echo "compute-sanitizer racecheck: rc=$rc_rc; $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/racecheck.log" 2>/dev/null | tr '\n' ' ' | cut -c1-200)"
echo "compute-sanitizer initcheck: rc=$ic_rc; $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/initcheck.log" 2>/dev/null | tr '\n' ' ' | cut -c1-200)"
echo "extra checks: $((t4 - t3)) s"
rc=$gpu_rc  # any failed part fails the check (-1: did not run)
for v in $prewarm_rc $dev_rc $py_rc $mc_rc $rc_rc $ic_rc; do [ "$v" -gt 0 ] && rc=1; done
exit $rc
