// What the host (compiler/gemm_codegen.cpp, runtime/gemm.cpp) and the grouped GEMM kernels agree
// on, compiled for both: the scaling kinds' codes, K per stage, the epilogue's passes and staging
// pitch, and the shared-memory layout (gemm_smem), NVFP4's TMA load slots and the K-grouped
// members' tensor-map ring included.
#pragma once
#include "qforge/types.cuh"

namespace qf {

// Scaling kinds, in the order of GemmScaling in compiler/gemm_codegen.h.
// kGemmBlock128K has no GemmScaling of its own: it is blockwise scaling in the K-grouped layout
// (wgrad), where both operands carry 1x128 blocks along the tokens (Block128KScaling).
enum GemmScalingCode : int {
  kGemmPerTensor = 0, kGemmRowChannel = 1, kGemmBlock128 = 2, kGemmMx32 = 3, kGemmNvfp4 = 4, kGemmNone = 5,
  kGemmChannel = 6, kGemmBlock128K = 7
};

constexpr int kGemmMmasPerStage = 4;       // MMAs per stage from shared memory: 32 bytes of K each
constexpr int kGemmBlockK = 128;           // K per stage: one 128-byte swizzle row of fp8 (16-bit
                                           // operands: 64, gemm::stage_k; packed e2m1: 64 bytes)
constexpr u32 kGemmSmemLimit = 232448;     // sm_90 opt-in dynamic shared memory per block
constexpr u32 kGemmSmemAlignSlack = 1024;  // the dynamic window is aligned up to 1024 in-kernel

// K-grouped kernels store their output through the tensor engine (epilogue_tma): a pass's
// staging is boxes of 64 rows x 128 bytes in the 128-byte swizzle, each 1024-byte aligned.
constexpr int kGemmEpiBoxBytes = 128;

// Output columns per epilogue pass (bf16: the whole tile; fp32, NVFP4 and weight-only int8: 64, to
// bound the staging memory: NVFP4 needs the room for its load slots, int8 B for a fourth stage)
// and the staging row pitch in 32-bit words. Pitches are chosen so that fragment stores hit 32 distinct banks: fp32 pairs (8-byte stores, half-warps of
// 4 rows x 4 lanes) need pitch = 8 (mod 32), packed bf16 pairs (4-byte stores, 8 rows x 4 lanes)
// need pitch = 4 (mod 32).
QF_HD constexpr int gemm_epi_cols(int block_n, int out_bytes, int scaling) {
  return out_bytes == 4 || scaling == kGemmNvfp4 || scaling == kGemmChannel ? 64 : block_n;
}
QF_HD constexpr int gemm_staging_pitch(int epi_cols, int out_bytes) {
  return out_bytes == 4 ? epi_cols + 8 : epi_cols / 2 + 4;
}

// Shared-memory layout (byte offsets from the 1024-aligned base), host and device.
struct GemmSmem {
  u32 a_off, a_stage;      // A stages: block_m rows x 128 bytes each (NVFP4: x 64 bytes, packed e2m1,
                           // one per load slot)
  u32 b_off, b_stage;      // B stages: block_n rows x 128 bytes each (NVFP4: the dequantized fp16
                           // B, two 128-byte-swizzled halves of block_n rows x 64 K each)
  u32 braw_off, braw_stage;  // NVFP4: B as loaded, block_n rows x 64 bytes (64-byte swizzle), one per load
                             // slot. (Weight-only int8 B lands unswizzled in the upper half of its B
                             // stage, converted in place.)
  u32 sc_off, sc_stage;    // per-stage scales (gemm_stage_scale_bytes)
  u32 staging_off, staging_wg;  // epilogue staging, one region per consumer warpgroup
  u32 col_off;             // per-column scales, block_n floats per consumer warpgroup
  u32 maps_off;            // K-grouped members: the producer's A and B tensor maps being built (2 x 128 bytes)
  u32 bar_off;             // full[stages], empty[stages], turn[2] mbarriers; then weight-only int8:
                           // loaded[stages]; NVFP4: loaded[load slots], free[load slots]
  u32 load_slots;          // TMA load slots: NVFP4's ring of A and raw B (gemm_smem), else the stages
  u32 total;               // dynamic shared memory to request (includes the alignment slack)
};

QF_HD constexpr u32 gemm_align_up(u32 v, u32 a) { return (v + a - 1) / a * a; }

// Bytes of one stage's scale slot: MX: the fp32 factors of the stage's four 32-wide k-steps,
// [4][block_m] for A then [4][block_n] for B; K-grouped blockwise: the k-block's, [block_m] then
// [block_n]; none for the other kinds (M-grouped 1x128 blocks: the consumers load their scales
// into registers).
QF_HD constexpr u32 gemm_stage_scale_bytes(int scaling, int block_m, int block_n) {
  return scaling == kGemmMx32 ? 4u * u32(block_m + block_n) * 4u
         : scaling == kGemmBlock128K ? u32(block_m + block_n) * 4u
                                     : 0u;
}

// The layout with `loads` TMA load slots (the stages' own count but for NVFP4; gemm_smem).
QF_HD constexpr GemmSmem gemm_smem_with(int block_m, int block_n, int stages, int loads, int consumers, int scaling,
                                        bool col_scales, int out_bytes, bool tma_epilogue, bool member_maps) {
  GemmSmem s{};
  const bool fp4 = scaling == kGemmNvfp4;
  s.load_slots = u32(loads);
  s.a_stage = u32(block_m) * (fp4 ? 64u : 128u);
  s.b_stage = u32(block_n) * (fp4 ? 256u : 128u);
  s.braw_stage = fp4 ? u32(block_n) * 64u : 0u;
  s.a_off = 0;
  s.b_off = s.a_off + s.load_slots * s.a_stage;  // 1024-aligned: the swizzle pattern repeats every 1024 bytes
  s.braw_off = s.b_off + u32(stages) * s.b_stage;
  s.sc_stage = gemm_stage_scale_bytes(scaling, block_m, block_n);
  s.sc_off = s.braw_off + s.load_slots * s.braw_stage;
  const int epi = gemm_epi_cols(block_n, out_bytes, scaling);
  s.staging_wg = tma_epilogue ? gemm_align_up(64u * u32(epi * out_bytes), 1024)
                              : 64u * u32(gemm_staging_pitch(epi, out_bytes)) * 4u;
  s.staging_off = gemm_align_up(s.sc_off + u32(stages) * s.sc_stage, tma_epilogue ? 1024 : 16);
  s.col_off = s.staging_off + u32(consumers) * s.staging_wg;
  s.maps_off = gemm_align_up(s.col_off + (col_scales ? u32(consumers * block_n) * 4u : 0u), member_maps ? 128 : 8);
  s.bar_off = s.maps_off + (member_maps ? 2u * 128u : 0u);
  const u32 bars = 2u * u32(stages) + 2u + (fp4 ? 2u * s.load_slots : scaling == kGemmChannel ? u32(stages) : 0u);
  s.total = s.bar_off + bars * 8u + kGemmSmemAlignSlack;
  return s;
}

// NVFP4 loads A and raw B into a ring of TMA load slots of its own, deeper than the stages that
// hold the dequantized fp16 B: a load slot is free once the consumers have read its A and the
// producers have dequantized its B, long before the MMAs that read the stage are done, so the
// loads run further ahead than the stages would let them. Slots: stages + 3 where they fit (the
// loads run four k-blocks ahead of the dequantization), down to stages + 1 (two ahead); measured
// on an H100 at 8 x 4096 x 4096 x 7168, 3 stages: 6 slots 485-496 TFLOP/s against 5 slots
// 467-477 (bf16 out); with fp32 out (whose staging leaves room for 5), 3 stages and 5 slots
// 481-484 against 2 stages and 5 slots 465. The K-grouped kernels' smaller staging (the tensor
// engine's boxes) fits 4 stages and 5 slots with bf16 out (3 + 6 with fp32): wgrad 453-454
// against 443-449 with 3 + 6, members 462-467 against 457-462. The other kinds load into their
// stages.
QF_HD constexpr GemmSmem gemm_smem(int block_m, int block_n, int stages, int consumers, int scaling, bool col_scales,
                                   int out_bytes, bool tma_epilogue = false, bool member_maps = false) {
  const bool fp4 = scaling == kGemmNvfp4;
  int loads = fp4 ? stages + 3 : stages;
  while (fp4 && loads > stages + 1 &&
         gemm_smem_with(block_m, block_n, stages, loads, consumers, scaling, col_scales, out_bytes, tma_epilogue,
                        member_maps).total > kGemmSmemLimit)
    --loads;
  return gemm_smem_with(block_m, block_n, stages, loads, consumers, scaling, col_scales, out_bytes, tma_epilogue,
                        member_maps);
}

// K-grouped members: tensor-map pairs {A, B} per persistent CTA in the workspace, a ring the
// producer reuses once every load that read a slot is complete (MemberMaps): one more than the
// load slots (GemmSmem::load_slots).
QF_HD constexpr int gemm_member_map_slots(int load_slots) { return load_slots + 1; }

}  // namespace qf
