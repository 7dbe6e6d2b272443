// Launch arguments of the grouped GEMM kernels (gemm.cuh). Included by the generated kernels
// (NVRTC) and by the host runtime (runtime/gemm.cpp), so the struct the host fills is the struct
// the kernel reads; passed by value as the kernel's only (__grid_constant__) parameter.
#pragma once
#include "qforge/types.cuh"

namespace qf {

// The bytes of a CUtensorMap (128 bytes, 64-byte aligned in cuda.h). NVRTC code has no cuda.h;
// the host encodes the map with cuTensorMapEncodeTiled and copies it here.
struct alignas(64) TmaDescriptor {
  u64 opaque[16];
};

// M-grouped GEMM: for every group g with rows [offsets[g], offsets[g+1]) (contiguous layout) or
// [g * m_max, g * m_max + counts[g]) (masked layout),
//   D[rows, :] (+)= alpha[g] * dequant(A[rows, :]) * dequant(B[g])^T
// K-grouped GEMM (wgrad): for every group g with K range ks = [offsets[g], offsets[g+1]),
//   D[g] (+)= alpha[g] * dequant(A[:, ks]) * dequant(B[:, ks])^T, A [kM, k_total], B [N, k_total].
// K-grouped members (the grouped quantizer's per-member transposed copies): group g's operands
// are their own matrices A_g [kM, M_g] and B_g [N, M_g], M_g = offsets[g+1] - offsets[g], stored
// back to back (A_g at byte kM * offsets[g], packed e2m1: half that), their scale grids likewise
// after the grids of groups 0..g-1; a_map / b_map are templates the kernel rewrites per group.
// A is [m_total, K] and B is [G, N, K], both K-major (the quantize kernels' rowwise layout, or
// their transposed columnwise copies); D is [m_total, N] row-major.
struct GemmArgs {
  TmaDescriptor a_map;       // A, box [block_m / multicast rows, 128 bytes], 128-byte swizzle
                             // (NVFP4: packed [m_total, K/2] or K-grouped [kM, k_total/2], box
                             // [block_m, 64 bytes], no swizzle)
  TmaDescriptor b_map;       // B as [G][N][K], box [1, block_n, 128 bytes], 128-byte swizzle
                             // (NVFP4: packed [G][N][K/2], box [1, block_n, 64 bytes], 64-byte swizzle;
                             // K-grouped: [N, k_total/2], box [block_n, 64 bytes])
  TmaDescriptor d_map;       // K-grouped: D as [G][kM][N], box [1, 64 rows, 128 bytes], 128-byte swizzle
                             // (the epilogue's tensor stores or fp32 reduce-adds); unused otherwise
  void* d;                   // output, bf16 or fp32
  // Scales (compiler/gemm_codegen.cpp lists the shapes): fp32 per tensor [G], per token
  // [m_total], 1x128 blocks [m_total, ceil(K/128)]; e8m0 bytes per 1x32 MX block [m_total, K/32].
  const void* a_scale;
  // fp32 per tensor [G], per channel [G, N], 128x128 blocks [G, ceil(N/128), ceil(K/128)]; e8m0
  // per 1x32 MX block [G, N, K/32].
  const void* b_scale;
  const float* alpha;        // optional per-group multiplier [G] (null: 1)
  // NVFP4: the per-tensor amax of each group's A rows and of B[g] (fp32 [G] each), from which the
  // kernel recomputes the global decode scales amax / (6 * 448) as the quantize kernels do.
  const float* a_amax;
  const float* b_amax;
  const i64* group_offsets;  // contiguous layout: device [G + 1]; rows outside [0, m_total) are never touched
  const i64* group_counts;   // masked layout (m_max > 0): device [G]; group g owns rows
                             // [g * m_max, g * m_max + clamp(counts[g], 0, m_max))
  i64 m_max;                 // masked layout: rows per group slot (A [G, m_max, K], D [G, m_max, N]); 0: contiguous
  i64 m_total;               // rows of the A and D allocations (G * m_max when masked)
  i64 k_total;               // K-grouped layout: the shared token dimension of A [kM, k_total] and
                             // B [N, k_total]; group g reduces over [offsets[g], offsets[g+1])
  i32 num_groups;
  // K-grouped members: device workspace of (load slots + 1) x {A, B} tensor maps per CTA (128 bytes
  // each; GemmSmem::load_slots), the ring the producer writes each group's maps into (null otherwise).
  TmaDescriptor* member_maps;
  const u8* a_data;  // K-grouped members: A and B (the members' matrices back to back)
  const u8* b_data;
};

}  // namespace qf
