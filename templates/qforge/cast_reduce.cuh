// The amax reductions of the quantize kernels: maxima over a warp, a lane group and a CTA (then
// one atomic), tensor and per-channel amaxes of a staged tile or straight from global memory
// (amax_kernel, the pre-pass of two-pass plans, and row_kernel's chunks), block amaxes of a
// stream's 2D blocks over the staged tile, and the pre-pass sources fused_kernel reduces
// inside its cooperative launch (PrePass).
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_load.cuh"
#include "qforge/cast_schedule.cuh"
#include "qforge/cast_smem.cuh"
#include "qforge/numerics.cuh"

namespace qf {
namespace detail {

// Max of non-negative floats through their bit patterns (NaN never reaches here: amax_step
// ignores it).
__device__ __forceinline__ void atomic_max_nonneg(float* p, float v) {
  atomicMax(reinterpret_cast<u32*>(p), f32_bits(v));
}

template <int G>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int d = 1; d < G; d <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}

__device__ __forceinline__ float warp_max(float v) { return group_max<32>(v); }

// Max over the CTA, then one atomic (every thread of the CTA must call it).
template <int T>
__device__ __forceinline__ void block_max_atomic(float* dst, float v) {
  __shared__ float part[T / 32];
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float m = threadIdx.x < T / 32 ? part[threadIdx.x] : 0.0f;
    m = warp_max(m);
    if (threadIdx.x == 0) atomic_max_nonneg(dst, m);
  }
  __syncthreads();
}

// This thread's part of the max of |x| over a staged tile (zero outside the tensor), for
// block_max_atomic: the raw input, or after the 16-point RHT, each 16-row group of a column
// rotated in registers (M % 16 == 0) without the transform's 1/4 (rht16_unscaled). The 1/4 and
// the rounding to the input dtype are monotone in |x| and keep NaN a NaN, so they apply to the
// max: the same value as the max of the rounded outputs.
template <class Cfg, bool kRht>
__device__ __forceinline__ float staged_tensor_amax(const TileElem<Cfg>* tile) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads;
  float m = 0.0f;
  if constexpr (kRht) {
    for (int i = threadIdx.x; i < (TR / 16) * TC; i += T) {
      const int r = (i / TC) * 16, c = i % TC;
      float v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) v[j] = tld(tile, tile_off<TC>(r + j, c));
      rht16_unscaled(v, Cfg::kRhtMask);
#pragma unroll
      for (int j = 0; j < 16; ++j) m = amax_step(m, v[j]);
    }
    return round_to_dtype(m * 0.25f, Cfg::kInDtype);
  } else {
    for (int i = threadIdx.x; i < TR * TC / 4; i += T) {
      const int r = i / (TC / 4), c = (i % (TC / 4)) * 4;
      const float4 f = tld4(tile, tile_off<TC>(r, c));
      m = amax_step(amax_step(amax_step(amax_step(m, f.x), f.y), f.z), f.w);
    }
    return m;
  }
}

// Per-row amaxes of a staged tile (one warp per row, lanes on consecutive columns), each into
// amax[row0 + r] for the rows below `rows`; the staged tile is zero outside the tensor.
template <class Cfg>
__device__ __forceinline__ void staged_row_amaxes(const TileElem<Cfg>* src, float* amax, i64 row0, i64 rows) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads;
  for (int r = threadIdx.x / 32; r < TR; r += T / 32) {
    float m = 0.0f;
    for (int c = threadIdx.x % 32; c < TC; c += 32) m = amax_step(m, tld(src, tile_off<TC>(r, c)));
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0 && row0 + r < rows) atomic_max_nonneg(amax + row0 + r, m);
  }
}

// Per-column amaxes of a staged tile (one thread per column), each into amax[col0 + c] for the
// columns below k.
template <class Cfg>
__device__ __forceinline__ void staged_col_amaxes(const TileElem<Cfg>* src, float* amax, i64 col0, i64 k) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads;
  for (int c = threadIdx.x; c < TC; c += T) {
    if (col0 + c >= k) continue;
    float m = 0.0f;
    for (int r = 0; r < TR; ++r) m = amax_step(m, tld(src, tile_off<TC>(r, c)));
    atomic_max_nonneg(amax + col0 + c, m);
  }
}

// max |x| over the elements of one 16-byte chunk of the input (4 fp32 or 8 16-bit values; for
// 16-bit inputs packed on pairs, amax16x2_abs_step from +0, whose halves widen without a mask).
// Not amax16x2_step + amax16x2_lo / _hi: same amaxes, other code (sm_90a: the row and amax
// kernels of 24 of the 64 16-bit quantize programs; bf16 4 HMNMX2.XORSIGN + 3 readout ops per
// chunk instead of 4 HFMA2 + 2 VHMNMX + 2, fp16 the readout's mask and f16_to_f32's NaN select),
// not timed.
template <int D>
__device__ __forceinline__ float chunk_amax(const uint4& raw, float m) {
  if constexpr (D == 0) {
    return amax_step(amax_step(amax_step(amax_step(m, f32_from_bits(raw.x)), f32_from_bits(raw.y)), f32_from_bits(raw.z)),
                     f32_from_bits(raw.w));
  } else {
    u32 m2 = 0;
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) m2 = amax16x2_abs_step<D>(m2, w[e]);
    const u16 lo = u16(m2), hi = u16(m2 >> 16);
    return fmaxf(m, D == 1 ? fmaxf(bf16_to_f32(lo), bf16_to_f32(hi)) : fmaxf(h2f(lo), h2f(hi)));
  }
}

// max |x| over an interior tile, straight from global memory: 16-byte loads, and for 16-bit
// inputs packed on pairs as chunk_amax (amax16x2_abs_step).
template <class Cfg>
__device__ __forceinline__ float tile_amax_full(const QuantizeArgs& a, const Member& mem, i64 col0) {
  constexpr int kIters = TileChunks<Cfg>::kIters;
  uint4 raw[kIters];  // zero past the end
  load_chunks_full<Cfg>(a, mem, col0, raw);
  if constexpr (Cfg::kInDtype == 0) {
    float m = 0.0f;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      m = amax_step(m, f32_from_bits(raw[it].x));
      m = amax_step(m, f32_from_bits(raw[it].y));
      m = amax_step(m, f32_from_bits(raw[it].z));
      m = amax_step(m, f32_from_bits(raw[it].w));
    }
    return m;
  } else {
    u32 m2 = 0;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const u32 w[4] = {raw[it].x, raw[it].y, raw[it].z, raw[it].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) m2 = amax16x2_abs_step<Cfg::kInDtype>(m2, w[e]);
    }
    const u16 lo = u16(m2), hi = u16(m2 >> 16);
    return Cfg::kInDtype == 1 ? fmaxf(bf16_to_f32(lo), bf16_to_f32(hi)) : fmaxf(f16_to_f32(lo), f16_to_f32(hi));
  }
}

// Input bytes a lane reads of a row per load in tile_row_col_amaxes_full: 16, or 8 where a row
// of the tile holds fewer than 32 16-byte chunks (128 columns of a 16-bit input: the tiles of the
// per-channel register pair, cast_pair.cuh).
template <class Cfg>
constexpr int kRowColChunkBytes = (Cfg::kTileCols / kElemsPer16<Cfg::kInDtype>) % 32 == 0 ? 16 : 8;
// Whether tile_row_col_amaxes_full reads tiles of Cfg: whole warps of chunks across a row, whole
// rows per warp, at most 128 bytes of loads in flight per thread, its scratch within the kernel's
// shared memory.
template <class Cfg>
constexpr bool kRowColDirect = (Cfg::kTileCols * kInBytes<Cfg::kInDtype> / kRowColChunkBytes<Cfg>) % 32 == 0 &&
                               Cfg::kTileRows % (Cfg::kThreads / 32) == 0 &&
                               Cfg::kTileRows / (Cfg::kThreads / 32) * Cfg::kTileCols * kInBytes<Cfg::kInDtype> / 32 <= 128 &&
                               u32(Cfg::kThreads / 32 * Cfg::kTileCols * 4) <= Cfg::kSmemBytes;

// Folds one chunk of a row (NW 32-bit words of input dtype D: E elements) into a thread's
// column maxima `col` and the row's running maximum m.
template <int D, int NW, int E>
__device__ __forceinline__ void chunk_row_col_max(const u32 (&w)[NW], float (&col)[E], float& m) {
  float v[E];
#pragma unroll
  for (int n = 0; n < NW; ++n) {
    if constexpr (D == 0) v[n] = f32_from_bits(w[n]);
    else unpack2<D>(w[n], v[2 * n], v[2 * n + 1]);
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    col[e] = amax_step(col[e], v[e]);
    m = amax_step(m, v[e]);
  }
}

// Per-row and per-column amaxes of an interior tile straight from global memory, without staging
// (the pre-pass of per-channel plans with a transposed copy: fp8_rowwise, int8_weight_sr
// training). Warp w takes rows w, w + W, ... (W = T / 32 warps), each lane the same chunks
// (kRowColChunkBytes) of every row it reads, so a thread keeps its columns' maxima in registers
// over the rows; a row's maximum is a warp reduction, one atomic per row; the columns' maxima meet
// in shared memory (`scratch`, W * TC floats), one atomic per column. Every load of a thread is in
// flight before the first maximum. row_amax / col_amax: the slots' bases for this member (null:
// that reduction is not wanted).
template <class Cfg>
__device__ __forceinline__ void tile_row_col_amaxes_full(const QuantizeArgs& a, const Member& mem, i64 col0, float* row_amax,
                                                         float* col_amax, float* scratch) {
  constexpr int D = Cfg::kInDtype, B = kInBytes<D>, CB = kRowColChunkBytes<Cfg>, NW = CB / 4, E = CB / B;
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads;
  constexpr int W = T / 32, CH = TC / E, J = CH / 32, R = TR / W;
  static_assert(kRowColDirect<Cfg>, "whole warps of chunks across the tile, whole rows per warp");
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const i64 row0 = mem.tile_row * TR;
  const char* base = static_cast<const char*>(a.x) + ((mem.row_base + row0) * a.k + col0) * B;
  u32 raw[R][J][NW];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const char* src = base + (i64(warp + i * W) * a.k + (lane + 32 * j) * E) * B;
      if constexpr (CB == 16) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(src));
        raw[i][j][0] = q.x, raw[i][j][1] = q.y, raw[i][j][2] = q.z, raw[i][j][3] = q.w;
      } else {
        const uint2 q = __ldg(reinterpret_cast<const uint2*>(src));
        raw[i][j][0] = q.x, raw[i][j][1] = q.y;
      }
    }
  float col[J][E];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < E; ++e) col[j][e] = 0.0f;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < J; ++j) chunk_row_col_max<D>(raw[i][j], col[j], m);
    if (row_amax) {
      m = warp_max(m);
      if (lane == 0) atomic_max_nonneg(row_amax + row0 + warp + i * W, m);
    }
  }
  if (!col_amax) return;
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < E; ++e) scratch[warp * TC + (lane + 32 * j) * E + e] = col[j][e];
  __syncthreads();
  for (int c = int(threadIdx.x); c < TC; c += T) {
    float m = scratch[c];
#pragma unroll
    for (int w = 1; w < W; ++w) m = fmaxf(m, scratch[w * TC + c]);
    atomic_max_nonneg(col_amax + col0 + c, m);
  }
}

// Rows of a warp per batch in group_row_col_amaxes_full: 64 bytes of loads per thread, two
// batches in flight.
template <class Cfg, int F>
constexpr int kGroupBatchRows = 64 / (F * Cfg::kTileCols * kInBytes<Cfg::kInDtype> / 32);
// Whether group_row_col_amaxes_full reads segments of F tiles of Cfg: whole warps of 16-byte
// chunks across a segment, pairs of whole batches of rows per warp (at most one row per lane),
// a segment's column maxima of every warp within the kernel's shared memory. Else (tiles that
// `qforge tune` tries, e.g. 32 x 128 with 512 threads) the pre-pass reads tile by tile.
template <class Cfg, int F, int E = 16 / kInBytes<Cfg::kInDtype>, int W = Cfg::kThreads / 32, int R = Cfg::kTileRows / W,
          int RB = kGroupBatchRows<Cfg, F>>
constexpr bool kGroupDirect = (F * Cfg::kTileCols) % (32 * E) == 0 && Cfg::kTileCols % E == 0 && Cfg::kTileRows % W == 0 &&
                              R <= 32 && RB > 0 && R % RB == 0 && (R / RB) % 2 == 0 &&
                              u32(W * F * Cfg::kTileCols * 4) <= Cfg::kSmemBytes;

// Per-row and per-column amaxes of `tiles` interior tiles side by side in a tile row, from
// column col0, straight from global memory (the pre-pass of the per-channel pairs on 128-column
// tiles: fp8_rowwise training). The tiles go in segments of F, each read as one wide tile: warp w
// takes rows w, w + W, ..., each row's F * TC columns whole (16-byte chunks, lanes on consecutive
// chunks), rows in batches (kGroupBatchRows), the next batch's loads issued before the current one
// is reduced; no barrier within a segment. A row's maximum over a segment is a warp reduction that
// lane (row's index within the warp) keeps over the segments: one atomic per row and call (the
// host gives a CTA one or two segments, quantizer.cpp amax_group_tiles; per-tile row atomics,
// 128 per row of a 16384-column input arriving together from the CTAs of one tile row, took the
// pass from 176 to 397 us on an H200).
// A thread keeps its chunks' column maxima over its rows; they meet in `scratch` (W * F * TC
// floats per segment, two segments' worth where the kernel's shared memory holds them) behind one
// barrier, one atomic per column.
template <class Cfg, int F>
__device__ __forceinline__ void group_row_col_amaxes_full(const QuantizeArgs& a, const Member& mem, i64 col0, int tiles,
                                                          float* row_amax, float* col_amax, float* scratch) {
  constexpr int D = Cfg::kInDtype, B = kInBytes<D>, E = 16 / B, NW = 4;
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, GC = F * TC, T = Cfg::kThreads;
  constexpr int W = T / 32, J = GC / E / 32, R = TR / W, RB = kGroupBatchRows<Cfg, F>, NB = R / RB;
  static_assert(kGroupDirect<Cfg, F>, "segments of Cfg's tiles this function reads");
  constexpr int kBuffers = u32(2 * W * GC * 4) <= Cfg::kSmemBytes ? 2 : 1;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const i64 row0 = mem.tile_row * TR;
  const i64 stride = i64(W) * a.k * B;  // bytes between a warp's consecutive rows
  float row_max = 0.0f;                 // of row `lane` of this warp (lane < R)
#pragma unroll 1
  for (int seg = 0; seg * F < tiles; ++seg) {
    const i64 c0 = col0 + i64(seg) * GC;
    const int live = (tiles - seg * F < F ? tiles - seg * F : F) * (TC / E);  // chunks of a row in the segment's tiles
    const char* base = static_cast<const char*>(a.x) + ((mem.row_base + row0 + warp) * a.k + c0) * B;
    const auto load = [&](int b, uint4(&q)[RB][J]) {
#pragma unroll
      for (int i = 0; i < RB; ++i)
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int ch = lane + 32 * j;
          q[i][j] = ch < live ? __ldg(reinterpret_cast<const uint4*>(base + (b * RB + i) * stride + ch * 16)) : make_uint4(0, 0, 0, 0);
        }
    };
    float col[J][E];
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < E; ++e) col[j][e] = 0.0f;
    const auto reduce = [&](int b, const uint4(&q)[RB][J]) {
#pragma unroll
      for (int i = 0; i < RB; ++i) {
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const u32 w[NW] = {q[i][j].x, q[i][j].y, q[i][j].z, q[i][j].w};
          chunk_row_col_max<D>(w, col[j], m);
        }
        if (row_amax) {
          m = warp_max(m);
          if (lane == b * RB + i) row_max = fmaxf(row_max, m);
        }
      }
    };
    uint4 qa[RB][J], qb[RB][J];
    load(0, qa);
#pragma unroll 1
    for (int b = 0; b < NB; b += 2) {
      load(b + 1, qb);
      reduce(b, qa);
      if (b + 2 < NB) load(b + 2, qa);
      reduce(b + 1, qb);
    }
    if (!col_amax) continue;
    float* buf = scratch + (seg % kBuffers) * (W * GC);
    if (kBuffers == 1 && seg > 0) __syncthreads();  // the segment before has read `scratch`
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < E; ++e) buf[warp * GC + (lane + 32 * j) * E + e] = col[j][e];
    __syncthreads();
    for (int c = int(threadIdx.x); c < live * E; c += T) {
      float m = buf[c];
#pragma unroll
      for (int w = 1; w < W; ++w) m = fmaxf(m, buf[w * GC + c]);
      atomic_max_nonneg(col_amax + c0 + c, m);
    }
  }
  if (row_amax && lane < R) atomic_max_nonneg(row_amax + row0 + warp + lane * W, row_max);
}

// The tensor amaxes of an interior tile straight from global memory, without staging: raw (max
// |x|) and the unscaled RHT max (max |rht16_unscaled| over the tile's 16-row groups of each
// column; staged_tensor_amax's value before its 1/4 and rounding). One item is 16 rows of 8
// bytes (4 16-bit or 2 fp32 elements), lanes on consecutive items of the same rows: every load
// of a thread is in flight before the first butterfly.
template <class Cfg>
__device__ __forceinline__ void tile_tensor_amaxes_full(const QuantizeArgs& a, const Member& mem, i64 col0, float& raw,
                                                        float& rot) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads;
  constexpr int B = kInBytes<Cfg::kInDtype>, E = 8 / B, CW = TC / E, N = CW * (TR / 16), kIters = (N + T - 1) / T;
  static_assert(TR % 16 == 0 && TC % E == 0, "16-row groups of whole 8-byte words");
  const char* base = static_cast<const char*>(a.x) + ((mem.row_base + mem.tile_row * TR) * a.k + col0) * B;
  raw = 0.0f, rot = 0.0f;
#pragma unroll 1
  for (int it = 0; it < kIters; ++it) {
    if (item_past_end<N, T>(it)) break;
    int g, w;
    item_rc<CW, T>(it, g, w);
    const char* group = base + (i64(g) * 16 * a.k + w * E) * B;
    uint2 word[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) word[j] = __ldg(reinterpret_cast<const uint2*>(group + i64(j) * a.k * B));
#pragma unroll
    for (int e = 0; e < E; ++e) {
      float v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const u32 h = e < E / 2 ? word[j].x : word[j].y;
        if constexpr (Cfg::kInDtype == 0) {
          v[j] = f32_from_bits(h);
        } else {
          float lo, hi;
          unpack2<Cfg::kInDtype>(h, lo, hi);
          v[j] = e % 2 == 0 ? lo : hi;
        }
        raw = amax_step(raw, v[j]);
      }
      rht16_unscaled(v, Cfg::kRhtMask);
#pragma unroll
      for (int j = 0; j < 16; ++j) rot = amax_step(rot, v[j]);
    }
  }
}

// max |x| over tile row r, columns [c0, c0 + B) (c0 % B == 0, B % 4 == 0), by 16-byte reads.
// The swizzle permutes chunks only inside aligned groups of 8 (tile_off), so a run of whole
// groups (B >= 32) is read slot by slot: one swizzled offset per slot, its chunk in each group
// at a constant distance (immediate offsets; max ignores the order). Four running maxima; with
// 16-bit staging four packed ones (amax16x2_step: one instruction per two elements, without
// widening them), each chunk's two words into one pair, the pairs taking turns.
template <int TC, int B, class Elem>
__device__ __forceinline__ float row_run_amax(const Elem* src, int r, int c0) {
  constexpr int D = kStagedDtype<Elem>;
  u32 p[4] = {0u, 0u, 0u, 0u};
  float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int n = 0;  // chunks read (constant after unrolling): packed accumulator pair
  auto step = [&](int off) {
    if constexpr (D != 0) {
      const uint2 w = tld4_raw(src, off);
      const int k = 2 * (n++ & 1);
      p[k] = amax16x2_step<D>(p[k], w.x), p[k + 1] = amax16x2_step<D>(p[k + 1], w.y);
    } else {
      const float4 f = tld4(src, off);
      m[0] = amax_step(m[0], f.x), m[1] = amax_step(m[1], f.y), m[2] = amax_step(m[2], f.z), m[3] = amax_step(m[3], f.w);
    }
  };
  if constexpr (B % 32 == 0) {
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int off = tile_off<TC>(r, c0 + 4 * q);
#pragma unroll
      for (int g = 0; g < B / 32; ++g) step(off + 32 * g);
    }
  } else {
#pragma unroll
    for (int q = 0; q < B; q += 4) step(tile_off<TC>(r, c0 + q));
  }
  if constexpr (D != 0) {
    const u32 a = amax16x2_step<D>(amax16x2_step<D>(p[0], p[1]), amax16x2_step<D>(p[2], p[3]));
    return fmaxf(amax16x2_lo<D>(a), amax16x2_hi<D>(a));
  }
  return fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
}

// 2D block amaxes of a stream over the tile (also 1D rowwise blocks wider than 128), into
// shared memory (u32 float bits): one thread per row of a block (its BC / 4 chunks; lanes on
// consecutive rows, which the swizzle keeps apart), G lanes per block reduced with shuffles,
// then one shared atomic per group.
template <class Cfg, class S>
__device__ void block2d_amax(const TileElem<Cfg>* src, u32* out) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, BR = S::kBlockRows, BC = S::kBlockCols, T = Cfg::kThreads;
  constexpr int NBC = TC / BC, NB = (TR / BR) * NBC, N = NB * BR;
  constexpr int G = BR % 32 == 0 ? 32 : 32 % BR == 0 ? BR : 1;  // lanes of one block in a warp
  static_assert(BC % 4 == 0, "2D blocks span whole chunks");
  for (int i = threadIdx.x; i < NB; i += T) out[i] = 0;
  __syncthreads();
  for (int it = 0; it < (N + T - 1) / T; ++it) {  // every lane of a warp runs each iteration (shuffles)
    const int j = it * T + int(threadIdx.x), blk = j / BR, r = (blk / NBC) * BR + j % BR, c0 = (blk % NBC) * BC;
    float m = j < N ? row_run_amax<TC, BC>(src, r, c0) : 0.0f;
    m = group_max<G>(m);
    if (j < N && j % G == 0) atomicMax(&out[blk], f32_bits(m));
  }
}

}  // namespace detail

// The pre-pass amax sources a fused_kernel reduces from its staged tile, a single tensor's: the
// tensor amax (of the raw input or after RHT) into its output, per-row and per-column amaxes
// (raw input) into the workspace.
template <class... A>
struct PrePass {
  static constexpr int kSources = int(sizeof...(A));
  static_assert(((A::kScope == kScopeTensor || !A::kRht) && ...), "per-channel amaxes of the raw input");
  // Before the first grid barrier: the channel amaxes of this tile's rows (the CTAs of tile
  // column 0) and columns (tile row 0) set to zero, the separate form's workspace memset.
  template <class Cfg>
  __device__ static void zero_channels(const QuantizeArgs& a, i64 row0, i64 col0) {
    (
        [&] {
          if constexpr (A::kScope == kScopeChannelRows) {
            if (col0 == 0)
              for (int r = threadIdx.x; r < Cfg::kTileRows && row0 + r < a.m; r += Cfg::kThreads) a.amax[A::kSlot][row0 + r] = 0.0f;
          } else if constexpr (A::kScope == kScopeChannelCols) {
            if (row0 == 0)
              for (int c = threadIdx.x; c < Cfg::kTileCols && col0 + c < a.k; c += Cfg::kThreads) a.amax[A::kSlot][col0 + c] = 0.0f;
          }
        }(),
        ...);
  }
  // Every tensor source's part of this tile first, then (after the zeroing barrier) the atomics.
  template <class Cfg>
  __device__ static void reduce(const QuantizeArgs& a, const detail::TileElem<Cfg>* tile, i64 row0, i64 col0, u32 ticket) {
    float part[sizeof...(A)] = {(A::kScope == kScopeTensor ? detail::staged_tensor_amax<Cfg, A::kRht>(tile) : 0.0f)...};
    detail::grid_wait(ticket);
    int i = 0;
    (
        [&] {
          if constexpr (A::kScope == kScopeTensor) detail::block_max_atomic<Cfg::kThreads>(a.amax[A::kSlot], part[i]);
          else if constexpr (A::kScope == kScopeChannelRows) detail::staged_row_amaxes<Cfg>(tile, a.amax[A::kSlot], row0, a.m);
          else detail::staged_col_amaxes<Cfg>(tile, a.amax[A::kSlot], col0, a.k);
          ++i;
        }(),
        ...);
  }
};

}  // namespace qf
