// The grouped GEMM's epilogues: a consumer warpgroup's finished tile -> D, times the scaling
// policy's row and column factors. M-grouped: padded, conflict-free shared-memory staging, then
// 16-byte coalesced stores (rows clipped to the group and m_total, columns to N; optional fp32
// accumulate). K-grouped: swizzled boxes stored or reduce-added by the tensor engine.
#pragma once
#include "qforge/gemm_schedule.cuh"
#include "qforge/gemm_smem.cuh"
#include "qforge/gemm_traits.cuh"
#include "qforge/numerics.cuh"
#include "qforge/sm90.cuh"

namespace qf {
namespace gemm {

// A fragment's four outputs of columns c, c + 1 in rows r, r + 8 (acc4: d[4j .. 4j + 3]): times the
// rows' factors, then, with per-column scales, times the columns' factors staged at col_c.
template <class S>
__device__ __forceinline__ void epilogue_values(const float* acc4, float rf0, float rf1, const float* col_c, float& v0,
                                                float& v1, float& v2, float& v3) {
  v0 = acc4[0] * rf0, v1 = acc4[1] * rf0, v2 = acc4[2] * rf1, v3 = acc4[3] * rf1;
  if constexpr (S::kColScales) {
    const float c0 = col_c[0], c1 = col_c[1];
    v0 = v0 * c0, v1 = v1 * c1, v2 = v2 * c0, v3 = v3 * c1;
  }
}

// K-grouped: D[g] is a whole [kM, N] matrix per group, so every tile goes out through the tensor
// engine (a.d_map, D as [G][kM][N]; rows past kM and columns past N are clipped by the map): each
// pass, the warpgroup writes its 64 rows into boxes of [64][128 bytes] (128-byte swizzle), makes
// them visible to the async proxy, and one thread stores them, or with accumulation reduce-adds
// them (D += v in fp32 at L2, the same rounding as the load-add-store form). The warpgroup goes on
// to its next tile while the engine reads the staging; the next pass first waits for those reads.
template <class Cfg>
__device__ __forceinline__ void epilogue_tma(const GemmArgs& a, const TileInfo& t, const Frag& f, u8* smem,
                                             u32 base, float* acc, const typename Traits<Cfg>::Scaling::Tile& ts) {
  using T = Traits<Cfg>;
  using S = typename T::Scaling;
  constexpr int kBoxCols = kGemmEpiBoxBytes / T::kOutBytes;
  constexpr int kBoxes = T::kEpiCols / kBoxCols;
  static_assert(T::kEpiCols % kBoxCols == 0, "whole boxes per pass");
  const u32 bar_id = 1u + u32(f.wg);
  const u32 staging_off = T::kSmem.staging_off + u32(f.wg) * T::kSmem.staging_wg;
  u8* staging = smem + staging_off;
  float* cols = reinterpret_cast<float*>(smem + T::kSmem.col_off) + f.wg * T::kBN;
  if constexpr (S::kColScales) S::template store_cols<Cfg>(ts, cols, f);  // read after the pass barrier
  float rf0 = S::template row_factor<Cfg>(ts, 0), rf1 = S::template row_factor<Cfg>(ts, 1);
  if constexpr (Cfg::kMembers) {
    if (t.bad) rf0 = rf1 = __int_as_float(0x7FC00000);  // a member the kernel cannot read: D[g] is NaN
  }
  const int quad = f.lane & 3;
  // Byte of column c (within the pass) of row r in the boxes: box c / kBoxCols, 16-byte chunk
  // ((c % kBoxCols) * bytes / 16) ^ (r % 8) of the box's row r. The fragment's rows r and r + 8
  // share r % 8; the quad's 2 * quad columns sit at byte (2 * quad * bytes) % 16 of their chunk.
  const int r0 = f.row - f.wg * 64;  // the first fragment row within the warpgroup's 64
  u8* row0 = staging + r0 * kGemmEpiBoxBytes + ((2 * quad * T::kOutBytes) & 15);
  u8* row1 = row0 + 8 * kGemmEpiBoxBytes;
  const int swz = (r0 & 7) << 4;
  auto off = [&](int c) {  // c: the quad's first column, 8 * jj + 2 * quad
    const int cb = (c % kBoxCols) * T::kOutBytes;
    return (c / kBoxCols) * (64 * kGemmEpiBoxBytes) + ((cb & ~15) ^ swz);
  };
#pragma unroll
  for (int pass = 0; pass < T::kBN / T::kEpiCols; ++pass) {
    if (f.tid == 0) sm90::bulk_wait_read_all();  // the previous pass's (or tile's) boxes are read
    sm90::named_barrier(bar_id, 128);
#pragma unroll
    for (int i = 0; i < T::kEpiCols / 2; ++i) sm90::fence_reg(acc[pass * (T::kEpiCols / 2) + i]);
#pragma unroll
    for (int jj = 0; jj < T::kEpiCols / 8; ++jj) {
      const int j = pass * (T::kEpiCols / 8) + jj;
      const int c = 8 * jj + 2 * quad;
      float v0, v1, v2, v3;
      epilogue_values<S>(acc + 4 * j, rf0, rf1, cols + pass * T::kEpiCols + c, v0, v1, v2, v3);
      if constexpr (T::kOutBytes == 4) {
        *reinterpret_cast<float2*>(row0 + off(c)) = make_float2(v0, v1);
        *reinterpret_cast<float2*>(row1 + off(c)) = make_float2(v2, v3);
      } else {
        *reinterpret_cast<u32*>(row0 + off(c)) = u32(f32_to_bf16(v0)) | (u32(f32_to_bf16(v1)) << 16);
        *reinterpret_cast<u32*>(row1 + off(c)) = u32(f32_to_bf16(v2)) | (u32(f32_to_bf16(v3)) << 16);
      }
    }
    sm90::fence_proxy_async_shared();  // this thread's writes, visible to the tensor engine
    sm90::named_barrier(bar_id, 128);
    if (f.tid == 0) {
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
        const int col = t.n0 + pass * T::kEpiCols + b * kBoxCols;
        if (col < int(Cfg::kN))
          sm90::tma_store_3d<Cfg::kAccumulate>(&a.d_map, base + staging_off + u32(b * 64 * kGemmEpiBoxBytes), col,
                                               t.row0 + f.wg * 64, t.group);
      }
      sm90::bulk_commit();
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void epilogue(const GemmArgs& a, const TileInfo& t, const Frag& f, u8* smem,
                                         float* acc, const typename Traits<Cfg>::Scaling::Tile& ts) {
  using T = Traits<Cfg>;
  using S = typename T::Scaling;
  const u32 bar_id = 1u + u32(f.wg);
  float* cols = reinterpret_cast<float*>(smem + T::kSmem.col_off) + f.wg * T::kBN;
  u32* staging = reinterpret_cast<u32*>(smem + T::kSmem.staging_off + u32(f.wg) * T::kSmem.staging_wg);
  if constexpr (S::kColScales) S::template store_cols<Cfg>(ts, cols, f);
  const float rf0 = S::template row_factor<Cfg>(ts, 0), rf1 = S::template row_factor<Cfg>(ts, 1);
  const int frag_row = f.row - f.wg * 64;  // row within the warpgroup's 64
  const int quad = f.lane & 3;
  const int wg_row0 = t.row0 + f.wg * 64;         // rows of the group (K-grouped) or of D
  const int out_shift = t.out_row0 - t.row0;      // D row = tile row + out_shift
  constexpr int kChunkElems = 16 / T::kOutBytes;
  constexpr int kChunksPerRow = T::kEpiCols / kChunkElems;

#pragma unroll
  for (int pass = 0; pass < T::kBN / T::kEpiCols; ++pass) {
    sm90::named_barrier(bar_id, 128);  // staging free (and column scales visible)
    // Keep this pass's conversions after the barrier (hoisting them raises register pressure).
#pragma unroll
    for (int i = 0; i < T::kEpiCols / 2; ++i) sm90::fence_reg(acc[pass * (T::kEpiCols / 2) + i]);
#pragma unroll
    for (int jj = 0; jj < T::kEpiCols / 8; ++jj) {
      const int j = pass * (T::kEpiCols / 8) + jj;
      const int c = 8 * jj + 2 * quad;  // column within the pass
      float v0, v1, v2, v3;
      epilogue_values<S>(acc + 4 * j, rf0, rf1, cols + pass * T::kEpiCols + c, v0, v1, v2, v3);
      if constexpr (T::kOutBytes == 4) {
        *reinterpret_cast<float2*>(staging + frag_row * T::kPitch + c) = make_float2(v0, v1);
        *reinterpret_cast<float2*>(staging + (frag_row + 8) * T::kPitch + c) = make_float2(v2, v3);
      } else {
        staging[frag_row * T::kPitch + c / 2] = u32(f32_to_bf16(v0)) | (u32(f32_to_bf16(v1)) << 16);
        staging[(frag_row + 8) * T::kPitch + c / 2] = u32(f32_to_bf16(v2)) | (u32(f32_to_bf16(v3)) << 16);
      }
    }
    sm90::named_barrier(bar_id, 128);  // staging written
#pragma unroll 4
    for (int ch = f.tid; ch < 64 * kChunksPerRow; ch += 128) {
      const int r = ch / kChunksPerRow, cc = ch % kChunksPerRow;
      const int grow = wg_row0 + r;
      const int gcol = t.n0 + pass * T::kEpiCols + cc * kChunkElems;
      if (grow >= t.row_end || gcol >= int(Cfg::kN)) continue;
      const int drow = grow + out_shift;
      uint4 v = *reinterpret_cast<const uint4*>(staging + r * T::kPitch + cc * 4);
      u8* dst = static_cast<u8*>(a.d) + (i64(drow) * Cfg::kN + gcol) * T::kOutBytes;
      if constexpr (Cfg::kAccumulate) {
        const float4 old = *reinterpret_cast<const float4*>(dst);
        v.x = f32_bits(old.x + __uint_as_float(v.x));
        v.y = f32_bits(old.y + __uint_as_float(v.y));
        v.z = f32_bits(old.z + __uint_as_float(v.z));
        v.w = f32_bits(old.w + __uint_as_float(v.w));
      }
      *reinterpret_cast<uint4*>(dst) = v;
    }
  }
}

// A finished tile of a consumer warpgroup -> D.
template <class Cfg>
__device__ __forceinline__ void store_tile(const GemmArgs& a, const TileInfo& t, const Frag& f, u8* smem, u32 base,
                                           float* acc, const typename Traits<Cfg>::Scaling::Tile& ts) {
  if constexpr (Cfg::kKGrouped) epilogue_tma<Cfg>(a, t, f, smem, base, acc, ts);
  else epilogue<Cfg>(a, t, f, smem, acc, ts);
}

}  // namespace gemm
}  // namespace qf
