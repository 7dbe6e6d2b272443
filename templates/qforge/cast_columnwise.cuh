// Columnwise streams over one tile: the checked walk of any tile (cast_columnwise), the
// columns' 16-row partial amaxes, and the interior-tile paths: transposed ([K, M]) through a
// staged copy of the tile's output copied out in whole sectors, and same layout ([M, K])
// through one multiplier per (column, block) in shared scratch, then rowwise-style runs.
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_encode.cuh"
#include "qforge/cast_load.cuh"
#include "qforge/cast_scale.cuh"
#include "qforge/cast_schedule.cuh"
#include "qforge/cast_smem.cuh"
#include "qforge/numerics.cuh"

namespace qf {
namespace detail {

// Columnwise stream: runs of kEpt rows of one column, lanes on consecutive columns. Transposed
// ([K, M]): each 16-row chunk is one vector store into the output row of its column; same
// layout ([M, K]): element stores (consecutive lanes fill consecutive bytes of a row).
template <class Cfg, class S>
__device__ float cast_columnwise(const QuantizeArgs& a, const Member& mem, i64 col0, const TileElem<Cfg>* src,
                                 const u32* bamax, i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, L = S::kEpt, N = TC * (TR / L), T = Cfg::kThreads;
  static_assert(TR % L == 0 && L % 16 == 0, "columnwise runs: whole 16-row chunks");
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR, data_base = mem.row_base * a.k;
  float reported = 0.0f;
  for (int j = threadIdx.x; j < N; j += T) {
    const int c = j % TC, r = (j / TC) * L;
    const i64 rl = row0 + r, cg = col0 + c;
    if (cg >= a.k || rl >= mem.rows) continue;
    float amax = 0.0f;  // of the run (one scale block when the stream has 1D blocks)
#pragma unroll 16
    for (int e = 0; e < L; ++e) amax = amax_step(amax, tld(src, tile_off<TC>(r + e, c)));
    if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);
    float block_amax = amax;
    if constexpr (S::kBlock2d) {
      block_amax = f32_from_bits(bamax[(r / S::kBlockRows) * (TC / S::kBlockCols) + c / S::kBlockCols]);
    } else if constexpr (S::kMode == kModeChannel) {
      block_amax = a.amax[S::kLocalAmax][i64(mem.index) * a.k + cg];
    }
    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, ctx, mul, entry);
    const i64 dr = S::kTransposed ? cg : rl, dc = S::kTransposed ? rl : cg;
    maybe_store_entry<S>(out, dr, dc, ctx, scale_base, entry);
    const i64 left = mem.rows - rl;
    if constexpr (S::kTransposed) {
      const i64 line = data_base + cg * mem.rows + rl;  // output row cg, element rl
#pragma unroll 1
      for (int e0 = 0; e0 < L; e0 += 16) {
        if (left <= e0) break;
        float v[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) v[e] = tld(src, tile_off<TC>(r + e0 + e, c));
        encode_store<S, 16>(a, out.data, line + e0, v, mul, left - e0 >= 16 ? 16 : int(left - e0));
      }
    } else {
#pragma unroll 4
      for (int e = 0; e < L; ++e) {
        if (e >= left) break;
        encode_store1<S>(a, out.data, data_base + (rl + e) * a.k + cg, tld(src, tile_off<TC>(r + e, c)), mul);
      }
    }
  }
  return reported;
}

// Partial amaxes of the tile's columns, 16 rows each: part[seg * TC + c] = max |tile[seg*16 .. +15][c]|,
// by row walks: one item is a 16-row segment of one 4-column chunk (16 vector reads, lanes on
// consecutive chunks of the same rows), a quarter of the shared-memory reads of a column walk.
// 16-bit staging reduces the raw words, two columns per packed accumulator (amax16x2_step),
// alternating between two sets of accumulators by row. Returns the max over this thread's
// partials.
template <class Cfg>
__device__ float column_partials(const TileElem<Cfg>* src, float* part) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, CH = TC / 4, N = CH * (TR / 16), T = Cfg::kThreads;
  constexpr int D = kStagedDtype<TileElem<Cfg>>;
  float all = 0.0f;
#pragma unroll 2
  for (int it = 0; it < (N + T - 1) / T; ++it) {
    if (item_past_end<N, T>(it)) break;
    int seg, q;
    item_rc<CH, T>(it, seg, q);
    float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (D != 0) {
      u32 p[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const uint2 w = tld4_raw(src, tile_off<TC>(seg * 16 + e, 4 * q));
        const int k = 2 * (e & 1);
        p[k] = amax16x2_step<D>(p[k], w.x), p[k + 1] = amax16x2_step<D>(p[k + 1], w.y);
      }
      const u32 lo = amax16x2_step<D>(p[0], p[2]), hi = amax16x2_step<D>(p[1], p[3]);
      m[0] = amax16x2_lo<D>(lo), m[1] = amax16x2_hi<D>(lo), m[2] = amax16x2_lo<D>(hi), m[3] = amax16x2_hi<D>(hi);
    } else {
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const float4 f = tld4(src, tile_off<TC>(seg * 16 + e, 4 * q));
        m[0] = amax_step(m[0], f.x), m[1] = amax_step(m[1], f.y), m[2] = amax_step(m[2], f.z), m[3] = amax_step(m[3], f.w);
      }
    }
    *reinterpret_cast<float4*>(part + seg * TC + 4 * q) = make_float4(m[0], m[1], m[2], m[3]);
    all = fmaxf(all, fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3])));
  }
  return all;
}

// The block amax of a columnwise stream for tile column c, rows [r, r + L) of its block (or the
// 2D block / channel holding them), where the caller's own 16-row amax is `own`.
template <class Cfg, class S>
__device__ __forceinline__ float column_block_amax(const QuantizeArgs& a, const Member& mem, i64 col0, int r, int c,
                                                   const u32* bamax, const float* part, float own) {
  constexpr int TC = Cfg::kTileCols, L = S::kEpt;
  if constexpr (S::kBlock2d) {
    return f32_from_bits(bamax[(r / S::kBlockRows) * (TC / S::kBlockCols) + c / S::kBlockCols]);
  } else if constexpr (S::kMode == kModeChannel) {
    return a.amax[S::kLocalAmax][i64(mem.index) * a.k + col0 + c];
  } else if constexpr (L > 16 && (S::kMode == kModeBlock || S::kMode == kModeMx || S::kMode == kModeNvfp4)) {
    float m = 0.0f;
#pragma unroll
    for (int s = 0; s < L / 16; ++s) m = fmaxf(m, part[((r / L) * (L / 16) + s) * TC + c]);
    return m;
  } else {
    return own;
  }
}

// RHT streams whose interior tiles rotate each 16-row group in registers, from the raw tile
// (transposed, one thread per 16 rows); the others read the rotated copy load_tile makes.
template <class S>
constexpr bool kRhtInRegisters = S::kRht && S::kTransposed && S::kEpt == 16 && !S::kBlock2d;

// Interior tile, transposed columnwise stream ([K, M] per member, mem.rows % 16 == 0): one
// thread per 16 rows of a column, read once from shared memory (RHT streams: the raw tile,
// rotated in registers), encoded into the staged output (transposed_stage_stride), which the
// CTA then copies out row by row. Blocks longer than 16 rows read the partials column_partials
// left in `part`.
template <class Cfg, class S>
__device__ float cast_columnwise_transposed_full(const QuantizeArgs& a, const Member& mem, i64 col0, const TileElem<Cfg>* src,
                                                 const u32* bamax, const float* part, u8* stage, i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, N = TC * (TR / 16), T = Cfg::kThreads;
  constexpr int kBits = StoreBits<typename S::Format>::value, RS = transposed_stage_stride(TR, kBits);
  // Byte entries, one per kEntryCols rows of a column (compact or mn_major layout), staged too: EPR per
  // tile column, copied out with the data.
  constexpr bool kStageEntries = kStagedEntries<S> && S::kEntryRows == 1 && S::kEntryCols >= 16 && TR % S::kEntryCols == 0;
  constexpr int EPR = kStageEntries ? TR / S::kEntryCols : 1;
  u8* entries = stage + TC * RS;
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR, tile_lin = mem.row_base * a.k + col0 * mem.rows + row0;
  float reported = 0.0f;
#pragma unroll 2
  for (int it = 0; it < (N + T - 1) / T; ++it) {
    if (item_past_end<N, T>(it)) break;
    int r, c;
    item_rc<TC, T>(it, r, c);
    r *= 16;
    float v[16], amax = 0.0f;
    if constexpr (kRhtInRegisters<S>) rotated_group<Cfg>(src, r, c, v);
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      if constexpr (!kRhtInRegisters<S>) v[e] = tld(src, tile_off<TC>(r + e, c));
      amax = amax_step(amax, v[e]);
    }
    if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);
    const float block_amax = column_block_amax<Cfg, S>(a, mem, col0, r, c, bamax, part, amax);
    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, ctx, mul, entry);
    if constexpr (kStageEntries) {
      if (r % S::kEntryCols == 0) entries[c * EPR + r / S::kEntryCols] = u8(entry);
    } else {
      maybe_store_entry<S>(out, col0 + c, row0 + r, ctx, scale_base, entry);
    }
    float x[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) x[e] = is_identity<typename S::Format>::value ? v[e] : v[e] * mul;
    const RunWords<S, 16> w = pack_run<S, 16>(a, tile_lin + i64(c) * mem.rows + r, x);
    store_words<RunWords<S, 16>::kBytes>(stage + c * RS + r * kBits / 8, w.w);
  }
  __syncthreads();
  // Copy-out: units of U bytes, consecutive lanes on consecutive units of one output row. Every
  // output row of the tile starts at an element offset that is a multiple of 16 (a.k and
  // mem.rows are), so at a multiple of U bytes.
  constexpr int U = transposed_unit_bytes(kBits), UPR = TR * kBits / 8 / U, NU = TC * UPR;
  u8* dst = static_cast<u8*>(out.data) + tile_lin * kBits / 8;
  const i64 row_bytes = mem.rows * kBits / 8;
#pragma unroll 4
  for (int it = 0; it < (NU + T - 1) / T; ++it) {
    if (item_past_end<NU, T>(it)) break;
    int c, u;
    item_rc<UPR, T>(it, c, u);
    const u8* p = stage + c * RS + u * U;
    u8* q = dst + c * row_bytes + u * U;
    if constexpr (U == 16) *reinterpret_cast<uint4*>(q) = *reinterpret_cast<const uint4*>(p);
    else *reinterpret_cast<uint2*>(q) = *reinterpret_cast<const uint2*>(p);
  }
  if constexpr (kStageEntries) copy_staged_entries<S, T>(out.scale_inv, scale_base, ctx, col0, row0 / S::kEntryCols, entries, TC, EPR);
  return reported;
}

// Interior tile, same-layout columnwise stream ([M, K], scale blocks along M): the block
// multipliers first (one per column and block, through the partial amaxes), into `mul_out`;
// then runs of 4 elements of a row, as the rowwise stream, each element with its column's
// multiplier.
template <class Cfg, class S>
__device__ float cast_columnwise_same_full(const QuantizeArgs& a, const Member& mem, i64 col0, const TileElem<Cfg>* src,
                                           const u32* bamax, float* part, float* mul_out, i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads, L = S::kEpt, NB = TC * (TR / L);
  constexpr int CH = TC / 4, N = TR * CH;
  static_assert(TR % L == 0 && L % 16 == 0, "columnwise runs: whole 16-row chunks");
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR;
  float reported = column_partials<Cfg>(src, part);
  __syncthreads();
  for (int it = 0; it < (NB + T - 1) / T; ++it) {
    if (item_past_end<NB, T>(it)) break;
    int r, c;
    item_rc<TC, T>(it, r, c);
    const int j = r * TC + c;
    r *= L;
    float own = 0.0f;  // a 16-row block: its one partial
    if constexpr (L == 16) own = part[(r / 16) * TC + c];
    const float block_amax = column_block_amax<Cfg, S>(a, mem, col0, r, c, bamax, part, own);
    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, ctx, mul, entry);
    mul_out[j] = mul;
    maybe_store_entry<S>(out, row0 + r, col0 + c, ctx, scale_base, entry);
  }
  __syncthreads();
  const i64 tile_lin = (mem.row_base + row0) * a.k + col0;
#pragma unroll 4
  for (int it = 0; it < (N + T - 1) / T; ++it) {
    if (item_past_end<N, T>(it)) break;
    int r, c;
    item_rc<CH, T>(it, r, c);
    c *= 4;
    const float4 f = tld4(src, tile_off<TC>(r, c));
    const float4 m = *reinterpret_cast<const float4*>(mul_out + (r / L) * TC + c);
    const bool id = is_identity<typename S::Format>::value;
    const float x[4] = {id ? f.x : f.x * m.x, id ? f.y : f.y * m.y, id ? f.z : f.z * m.z, id ? f.w : f.w * m.w};
    store_run<S, 4, true>(a, out.data, tile_lin + i64(r) * a.k + c, x, 4);
  }
  return reported;
}

}  // namespace detail
}  // namespace qf
