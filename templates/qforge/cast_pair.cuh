// A plan of a rowwise stream and its transposed copy cast from registers on interior tiles,
// without staging the input: 1x128 + 128x1 blocks on 128 x 128 tiles (cast_pair_direct), MX
// 1x32 + 32x1 blocks on 64 x 128 tiles (cast_mx_pair_direct).
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_encode.cuh"
#include "qforge/cast_load.cuh"
#include "qforge/cast_reduce.cuh"
#include "qforge/cast_scale.cuh"
#include "qforge/cast_schedule.cuh"
#include "qforge/cast_smem.cuh"
#include "qforge/numerics.cuh"

namespace qf {
namespace detail {

// A plan of a rowwise stream with 1x128 blocks and its transposed copy with 128x1 blocks (1x128
// blockwise row + transposed; 8-bit formats, round to nearest, no RHT, 16-bit input) casts
// interior 128 x 128 tiles from registers: no staged input. Warp w holds rows [16w, 16w + 16) of
// the tile, lane l columns [4l, 4l + 4) (one 8-byte load per row); a row's amax is a warp
// reduction by halving exchanges, a column's the maximum of the warps' 16-row partials (one
// exchange through shared memory). Only the transposed output is staged, so that it is copied
// out in whole 128-byte output rows. Edge tiles take the staged path (whose shared memory the
// kernel keeps). H100, 16384^2: 429 -> 411 us, 84 -> 88 % of copy (docs/quantize.md, "Row +
// transposed cast from registers").
// The same path casts a pair whose streams both have 128x128 blocks (the 128x128 blockwise
// weight): a tile is one block, whose amax is the maximum of the column amaxes above across the
// warp (5 shuffles), and both streams encode with that block's scales. And a pair of per-tensor
// scales (delayed or current scaling: the scales known before the tile is read): no amax
// exchange; delayed scaling's tensor amax goes out as the staged path reports it (a maximum per
// warp, then one atomic per CTA after the barrier the staged output needs anyway). And a pair of
// per-channel scales (fp8 per channel of the rows and of the columns): their amaxes come from the
// pre-pass's workspace, a lane reading its 16 rows' (by pairs of lanes, as the 1D blocks) and its
// 4 columns'; no amax exchange either.
template <class R, class C>
constexpr bool kPairBlocks1d = R::kMode == kModeBlock && C::kMode == kModeBlock && !R::kBlock2d && !C::kBlock2d &&
                               R::kBlockCols == 128 && C::kEpt == 128;
template <class R, class C>
constexpr bool kPairBlocks2d = R::kMode == kModeBlock && C::kMode == kModeBlock && R::kBlock2d && C::kBlock2d &&
                               R::kBlockRows == 128 && R::kBlockCols == 128 && C::kBlockRows == 128 && C::kBlockCols == 128;
template <class R, class C>
constexpr bool kPairTensorScales = (R::kMode == kModeTensorDelayed || R::kMode == kModeTensorCurrent) && C::kMode == R::kMode;
template <class R, class C>
constexpr bool kPairChannelScales = R::kMode == kModeChannel && C::kMode == kModeChannel;
template <class Cfg, class R, class C>
constexpr bool kPairDirect =
    R::kDir == 0 && C::kDir == 1 && C::kTransposed &&
    (kPairBlocks1d<R, C> || kPairBlocks2d<R, C> || kPairTensorScales<R, C> || kPairChannelScales<R, C>) && !R::kRht && !C::kRht && !R::kStochastic && !C::kStochastic &&
    !Cfg::kRht && StoreBits<typename R::Format>::value == 8 && StoreBits<typename C::Format>::value == 8 &&
    !is_identity<typename R::Format>::value && !is_identity<typename C::Format>::value && Cfg::kInDtype != 0 &&
    Cfg::kTileRows == 128 && Cfg::kTileCols == 128 && Cfg::kThreads == 256;

// Element j (0..3) of four 16-bit inputs packed in two words. (Not through unpack2, which converts
// both halves: that changed the fp16-input kernel's SASS.)
template <int D>
__device__ __forceinline__ float pair_elem(const uint2& w, int j) {
  const u32 x = j < 2 ? w.x : w.y;
  if constexpr (D == 1) return f32_from_bits(j % 2 == 0 ? x << 16 : x & 0xFFFF0000u);
  else return f16_to_f32(u16(j % 2 == 0 ? x : x >> 16));
}

// One halving of cast_pair_direct's row reduction: lanes whose bit 2 * span is clear keep rows
// [0, span) of their m and take their partner's, the others keep (and move down) rows
// [span, 2 span); both reduce with the partner's copy.
template <int span>
__device__ __forceinline__ void halve_rows(float (&m)[16], int l) {
  constexpr int bit = 2 * span;
  const bool up = (l & bit) != 0;
#pragma unroll
  for (int i = 0; i < span; ++i) {
    const float send = up ? m[i] : m[i + span], keep = up ? m[i + span] : m[i];
    m[i] = fmaxf(keep, __shfl_xor_sync(0xFFFFFFFFu, send, bit));
  }
}

// An empty asm over the 16 packed words (no instruction): the compiler no longer knows them for
// the values it unpacked before, so it unpacks them again instead of keeping 64 floats live from
// the rowwise stream to the transposed one (the per-channel pair spilled 120 B at 80 registers
// with them kept; the other pairs' reductions between the two streams happen to prevent it).
__device__ __forceinline__ void hide_words(uint2 (&v)[16]) {
#pragma unroll
  for (int e = 0; e < 16; ++e) asm volatile("" : "+r"(v[e].x), "+r"(v[e].y));
}

// cast_pair_direct's rowwise stream: the scale of block amax `amax` (lane-held: 1D blocks, lane
// src_step e holding row e's; 2D: every lane the tile's, src_step 0), its entry stored where
// `store_entry` (row `entry_row`, the tile's column col0), and the lane's 16 rows of 4 elements
// (rowwise offset lin_r) encoded and stored.
template <class Cfg, class R>
__device__ __forceinline__ void pair_rows(const QuantizeArgs& a, const Member& mem, const uint2 (&v)[16], float amax,
                                          i64 lin_r, i64 col0, i64 base_r, i64 entry_row, bool store_entry,
                                          int src_step) {
  constexpr int D = Cfg::kInDtype;
  const StreamArgs& out = a.streams[R::kIndex];
  const StreamCtx<R> ctx = stream_ctx<Cfg, R>(a, mem);
  float mul;
  u32 entry;
  block_scale<Cfg, R>(amax, ctx, mul, entry);
  if (store_entry) maybe_store_entry<R>(out, entry_row, col0, ctx, base_r, entry);
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const float me = src_step ? __shfl_sync(0xFFFFFFFFu, mul, src_step * e) : mul;
    float x[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = pair_elem<D>(v[e], j);
    encode_store<R, 4, true>(a, out.data, lin_r + i64(e) * a.k, x, me, 4);
  }
}

template <class Cfg, class R, class C>
__device__ void cast_pair_direct(const QuantizeArgs& a, const Member& mem, i64 col0, i64 base_r, i64 base_c) {
  constexpr int D = Cfg::kInDtype, TR = 128;
  static_assert(TR == 128 && cast_pair_smem_bytes(false) <= Cfg::kSmemBytes, "the kernel's shared memory holds this path's");
  extern __shared__ float4 smem4[];
  float4* part = smem4;                                   // [8 warps][32 lanes]: 16-row column amaxes
  u8* stage = reinterpret_cast<u8*>(smem4 + 8 * 32);     // [128 columns][128 rows] of output bytes
  const int w = int(threadIdx.x) / 32, l = int(threadIdx.x) % 32;
  const i64 row0 = mem.tile_row * TR;
  const i64 lin_r = (mem.row_base + row0 + w * 16) * a.k + col0 + 4 * l;  // rowwise: row 16w, column 4l
  uint2 v[16];
#pragma unroll
  for (int e = 0; e < 16; ++e)
    v[e] = __ldg(reinterpret_cast<const uint2*>(static_cast<const u16*>(a.x) + lin_r + i64(e) * a.k));

  // Rowwise, 1D blocks: the 16 rows' amaxes, reduced across the warp by halving exchanges (16
  // shuffles); lane l ends with row l / 2's. (Written as one loop over the halvings, ptxas kept
  // the array in local memory: 488 us instead of 411.) Per channel: lane l reads row l / 2's.
  constexpr bool k2d = kPairBlocks2d<R, C>, kTensor = kPairTensorScales<R, C>, kChannel = kPairChannelScales<R, C>;
  const i64 entry_row = row0 + w * 16 + l / 2;
  if constexpr (kChannel) {
    const float m = a.amax[R::kLocalAmax][mem.row_base + entry_row];
    pair_rows<Cfg, R>(a, mem, v, m, lin_r, col0, base_r, entry_row, l % 2 == 0, 2);
    hide_words(v);
  } else if constexpr (!k2d && !kTensor) {
    float m[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      m[e] = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) m[e] = amax_step(m[e], pair_elem<D>(v[e], j));
    }
    halve_rows<8>(m, l);
    halve_rows<4>(m, l);
    halve_rows<2>(m, l);
    halve_rows<1>(m, l);
    m[0] = fmaxf(m[0], __shfl_xor_sync(0xFFFFFFFFu, m[0], 1));
    pair_rows<Cfg, R>(a, mem, v, m[0], lin_r, col0, base_r, entry_row, l % 2 == 0, 2);
  }

  // Columnwise: this warp's 16-row amax of each of the lane's 4 columns, then all 8 warps'; per
  // channel the columns' amaxes from the workspace.
  float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (kChannel) {
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = a.amax[C::kLocalAmax][i64(mem.index) * a.k + col0 + 4 * l + j];
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e)
#pragma unroll
      for (int j = 0; j < 4; ++j) p[j] = amax_step(p[j], pair_elem<D>(v[e], j));
  }
  if constexpr (kTensor) {
    // Per-tensor scales: this warp's part of delayed scaling's tensor amax (read after the barrier
    // below), and the per-tensor entries (tile (0, 0)).
    if constexpr (R::kMode == kModeTensorDelayed) {
      const float t = warp_max(fmaxf(fmaxf(p[0], p[1]), fmaxf(p[2], p[3])));
      if (l == 0) reinterpret_cast<float*>(part)[w] = t;
    }
    store_tensor_entry<Cfg, R>(a, mem, col0, base_r);
    store_tensor_entry<Cfg, C>(a, mem, col0, base_c);
  } else if constexpr (!kChannel) {
    part[w * 32 + l] = make_float4(p[0], p[1], p[2], p[3]);
    __syncthreads();
#pragma unroll
    for (int o = 0; o < 8; ++o) {
      const float4 q = part[o * 32 + l];
      p[0] = fmaxf(p[0], q.x), p[1] = fmaxf(p[1], q.y), p[2] = fmaxf(p[2], q.z), p[3] = fmaxf(p[3], q.w);
    }
  }
  const StreamArgs& out = a.streams[C::kIndex];
  const StreamCtx<C> ctx = stream_ctx<Cfg, C>(a, mem);
  const i64 tile_c = mem.row_base * a.k + col0 * mem.rows + row0;  // transposed: output row col0, element row0
  // One scale per stream: 2D blocks the tile's amax, the rowwise stream as the 1D blocks' (its
  // entry stored by thread 0), and the transposed stream's; per-tensor scales from no amax.
  float mul1 = 0.0f;
  if constexpr (k2d) {
    float t = fmaxf(fmaxf(p[0], p[1]), fmaxf(p[2], p[3]));
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) t = fmaxf(t, __shfl_xor_sync(0xFFFFFFFFu, t, o));
    pair_rows<Cfg, R>(a, mem, v, t, lin_r, col0, base_r, row0, threadIdx.x == 0, 0);
    u32 entry;
    block_scale<Cfg, C>(t, ctx, mul1, entry);
    if (threadIdx.x == 0) maybe_store_entry<C>(out, col0, row0, ctx, base_c, entry);
  } else if constexpr (kTensor) {
    pair_rows<Cfg, R>(a, mem, v, 0.0f, lin_r, col0, base_r, row0, false, 0);
    u32 entry;
    block_scale<Cfg, C>(0.0f, ctx, mul1, entry);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = 4 * l + j;
    float mul = mul1;
    if constexpr (!k2d && !kTensor) {
      u32 entry;
      block_scale<Cfg, C>(p[j], ctx, mul, entry);
      if (w == 0) maybe_store_entry<C>(out, col0 + c, row0, ctx, base_c, entry);
    }
    float x[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) x[e] = pair_elem<D>(v[e], j) * mul;
    const RunWords<C, 16> rw = pack_run<C, 16>(a, tile_c + i64(c) * mem.rows + w * 16, x);
    // Output row c, bytes [16w, 16w + 16): 16-byte chunk w of the staged row, its position
    // swizzled by the lane (l % 8), so that a quarter warp's stores hit 8 distinct chunks.
    store_words<16>(stage + c * TR + ((w ^ (l & 7)) * 16), rw.w);
  }
  __syncthreads();
  if constexpr (kTensor && R::kMode == kModeTensorDelayed) {
    // The first stream reporting into an amax slot reports (cast_tile's rule).
    if (threadIdx.x == 0) {
      const float* wm = reinterpret_cast<const float*>(part);
      float t = wm[0];
#pragma unroll
      for (int o = 1; o < 8; ++o) t = fmaxf(t, wm[o]);
      atomic_max_nonneg(a.amax[R::kTensorAmax] + mem.index, t);
      if constexpr (C::kTensorAmax != R::kTensorAmax) atomic_max_nonneg(a.amax[C::kTensorAmax] + mem.index, t);
    }
  }
  u8* dst = static_cast<u8*>(out.data) + tile_c;
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const int u = it * 256 + int(threadIdx.x), c = u / 8, k = u % 8;
    *reinterpret_cast<uint4*>(dst + i64(c) * mem.rows + k * 16) =
        *reinterpret_cast<const uint4*>(stage + c * TR + ((k ^ ((c >> 2) & 7)) * 16));
  }
}

// A plan of a rowwise MX stream with 1x32 blocks and its transposed copy with 32x1 blocks
// (`mxfp8_hopper`: 8-bit formats, round to nearest, no RHT, 16-bit input, byte entries in the
// compact or mn_major layout) casts interior 64 x 128 tiles from registers too
// (cast_mx_pair_direct). The staged path stages such a tile as fp32 and reads it five times (the
// rowwise block amaxes, the rowwise runs, the columns' 16-row partials, the transposed column
// walk): 0.2 shared-memory wavefronts per element, which held that cast's shared-memory pipe 91 %
// busy at 49 % of DRAM throughput on an H200 at 16384^2. This path moves 0.02 (docs/quantize.md,
// "MXFP8 row + transposed cast from registers").
template <class Cfg, class R, class C>
constexpr bool kMxPairDirect =
    R::kDir == 0 && C::kDir == 1 && C::kTransposed && R::kMode == kModeMx && C::kMode == kModeMx && !R::kBlock2d &&
    !C::kBlock2d && !R::kRht && !C::kRht && !R::kStochastic && !C::kStochastic && !Cfg::kRht &&
    StoreBits<typename R::Format>::value == 8 && StoreBits<typename C::Format>::value == 8 && Cfg::kInDtype != 0 &&
    Cfg::kTileRows == 64 && Cfg::kTileCols == 128 && Cfg::kThreads == 256 && R::kBlockCols == 32 && C::kEpt == 32 &&
    kStagedEntries<R> && kStagedEntries<C> && R::kEntryRows == 1 && R::kEntryCols == 32 && C::kEntryRows == 1 &&
    C::kEntryCols == 32;

// cast_mx_pair_direct reduces its block amaxes on magnitude words (numerics.cuh abs16x2,
// max16x2). Its chains start at a magnitude, so an all-NaN chain can end NaN; max_halves folds
// that to 0 (amax_step from 0 ignores NaN). Maxima of exact values in any order: the same amaxes
// as amax_step over the elements. The magnitudes come from the mask, not from abs.bf16x2 /
// abs.f16x2 as in amax16x2_abs_step: same amaxes, other code (sm_90a: bf16 an HFMA2 in place of
// each of the 16 LOP3s; fp16 the 16 LOP3s folded into the maxima as |.| operands), not timed.
// One 16-bit input as fp32: exact; an fp16 NaN by the hardware conversion, whose payload may
// differ from f16_to_f32's (no output depends on it: the encoders map every NaN to one code,
// amaxes skip NaN), in fewer instructions and registers (f16_to_f32 made ptxas spill here).
template <int D>
__device__ __forceinline__ float half_value(u32 w, bool hi) {
  if constexpr (D == 1) return f32_from_bits(hi ? w & 0xFFFF0000u : w << 16);
  else return h2f(u16(hi ? w >> 16 : w));
}
template <int D>
__device__ __forceinline__ float mx_pair_elem(const uint2& w, int j) {
  return half_value<D>(j < 2 ? w.x : w.y, j % 2 != 0);
}
template <int D>
__device__ __forceinline__ float max_halves(u32 w) {
  return amax_step(amax_step(0.0f, half_value<D>(w, false)), half_value<D>(w, true));
}

// One halving exchange of cast_mx_pair_direct's packed block amaxes: lanes whose `bit` is set
// keep (and move down) entries [span, 2 span) of m, the others [0, span); both reduce with the
// partner's copy of the same entries.
template <int D, int span, int bit, int N>
__device__ __forceinline__ void halve_in_lanes(u32 (&m)[N], int l) {
  const bool up = (l & bit) != 0;
#pragma unroll
  for (int i = 0; i < span; ++i) {
    const u32 send = up ? m[i] : m[i + span], keep = up ? m[i + span] : m[i];
    m[i] = max16x2<D>(keep, __shfl_xor_sync(0xFFFFFFFFu, send, bit));
  }
}

// Byte offset of the 8-byte piece k (tile rows [8k, 8k + 8)) of transposed output row c in
// cast_mx_pair_direct's staged output: output rows c and c ^ 1 share a 128-byte line, in halves
// swapped by bit 2 of c, and the pieces are XOR-swizzled by bits 3 and 4 of c. A half warp's
// stores (lanes on columns 4 (l % 8) + j, pieces l / 8) and its copy-out loads (2 rows, 8
// pieces each) then touch 16 distinct 8-byte bank pairs: 2 wavefronts per warp, the minimum.
__device__ __forceinline__ int mx_stage_off(int c, int k) {
  return (c >> 1) * 128 + (((c ^ (c >> 2)) & 1) << 6) + ((k ^ ((c >> 1) & 4) ^ ((c >> 3) & 2)) << 3);
}

// The scale of one of cast_mx_pair_direct's blocks, as block_scale gives it, from a block amax
// in [0, Inf] (a maximum of magnitudes from +0, NaN skipped: never NaN nor negative): the rule
// `rceil` without branches (e8m0_rceil_nonneg, mx_multiplier_bits: 8 instructions per block
// instead of about 20 and 4 branches), the rule `floor` as block_scale.
template <class Cfg, class S>
__device__ __forceinline__ void mx_pair_scale(float block_amax, const StreamCtx<S>& ctx, float& mul, u32& entry) {
  if constexpr (S::kMxFloor) {
    block_scale<Cfg, S>(block_amax, ctx, mul, entry);
  } else {
    entry = e8m0_rceil_nonneg(block_amax * (1.0f / S::Format::kMaxFinite));
    mul = f32_from_bits(mx_multiplier_bits(entry));
  }
}

// A tile's staged byte entries ([rows][per_row], src 4-byte aligned) into the stream's grid, as
// copy_staged_entries writes them, where the grid is mn_major and its runs allow 4-byte stores
// (the interior tiles' common case): thread t (counted from the caller's first; t >= rows *
// per_row / 4 stores nothing) stores 4 rows of one entry column. Returns false, having stored
// nothing, for other grids and alignments (the same answer in every thread): the caller then
// calls copy_staged_entries in every thread.
template <class S, int T, int rows, int per_row>
__device__ __forceinline__ bool copy_mx_pair_entries_fast(void* scale_inv, i64 scale_base, const StreamCtx<S>& ctx,
                                                          i64 er, i64 ec, const u8* src, u32 t) {
  if constexpr (S::kMnMajor) {
    constexpr int quads = rows / 4;
    static_assert(rows % 4 == 0 && per_row * quads <= T, "one store per thread");
    u8* dst = static_cast<u8*>(scale_inv) + scale_base + ec * ctx.grid_prows + er;
    if (((reinterpret_cast<u64>(dst) | u64(ctx.grid_prows)) & 3) != 0) return false;
    if (t < u32(per_row * quads)) {
      const u32 b = t / quads, q = t % quads;
      const u8* e = src + 4 * q * per_row + b;
      *reinterpret_cast<u32*>(dst + i64(b) * ctx.grid_prows + 4 * q) =
          u32(e[0]) | u32(e[per_row]) << 8 | u32(e[2 * per_row]) << 16 | u32(e[3 * per_row]) << 24;
    }
    return true;
  } else {
    return false;
  }
}

// A shuffle from lane (l & keep) | (src & ~keep), l the caller's lane: shfl.idx with segment mask
// `keep` (c[12:8]) and clamp 31 reads lane minLane | (b & ~mask), minLane = l & mask, which the
// clamp maxLane = minLane | (31 & ~mask) always admits (keep 24 is __shfl_sync's width 8). keep
// and src are constants after unrolling, which ptxas folds into the shuffle's immediates: no lane
// arithmetic per shuffle (a computed lane index took a LOP3 each, 11 per lane here).
template <u32 keep>
__device__ __forceinline__ float shfl_keep_bits(float v, u32 src) {
  float r;
  asm volatile("shfl.sync.idx.b32 %0, %1, %2, %3, -1;" : "=f"(r) : "f"(v), "r"(src & ~keep), "n"((keep << 8) | 0x1F));
  return r;
}

// cast_mx_pair_direct encodes fp8 with the hardware conversion (pack4's) and leaves out pack4's
// NaN fix-up (fix_nan_bytes, 3 instructions per word, 48 per lane) unless an input of its warp
// is a NaN: a scaled element x * 2^(127 - E) is a NaN only where x is (the multiplier is a
// finite power of two; Inf stays Inf), and cvt.satfinite gives a NaN code for a NaN only, so a
// word of a warp without NaN inputs is the same with or without the fix-up. Whether the lane
// holds a NaN: its 16 packed magnitudes reduced by maxima that keep NaN (max.NaN; 8 three-input
// instructions), whose halves are then above Inf's bits exactly where a NaN went in.
// N scaled elements as pack_run packs them; fp8 (kHwFp8Cvt) without the NaN fix-up, which
// mx_pair_fix_nan applies.
template <class S, int N>
__device__ __forceinline__ RunWords<S, N> mx_pair_pack(const QuantizeArgs& a, i64 lin, const float (&x)[N]) {
  using F = typename S::Format;
  if constexpr (kHwFp8Cvt<F>) {
    RunWords<S, N> r;
#pragma unroll
    for (int g = 0; g < N / 4; ++g) r.w[g] = cvt4_fp8_raw<F>(x + 4 * g);
    return r;
  } else {
    return pack_run<S, N>(a, lin, x);
  }
}
template <class S, int N>
__device__ __forceinline__ void mx_pair_fix_nan(RunWords<S, N>& r) {
  using F = typename S::Format;
  if constexpr (kHwFp8Cvt<F>) {
#pragma unroll
    for (int g = 0; g < N / 4; ++g) r.w[g] = fix_nan_fp8<F>(r.w[g]);
  }
}

// Warp w holds the 32 x 32 block of the tile at rows 32 (w % 2), columns 32 (w / 2); lane l rows
// 8 (l / 8) .. + 8 of it and columns 4 (l % 8) .. + 4 (8 8-byte loads, issued together). So a
// row's 1x32 block is 8 lanes (l / 8 equal) and a column's 32x1 block 4 (l % 8 equal): each
// block amax is reduced on packed pairs of magnitudes by halving exchanges (7 shuffles for a
// lane's 8 rows, 2 for its 4 columns), after which each lane computes the scale of one row
// block and of one column block and stages their entry bytes, and the multipliers go back by
// shuffles (8 rowwise, 4 columnwise).
// The rowwise data goes straight to global memory (4 bytes per lane, 32 per row and block); the
// transposed output is staged (8 KB, mx_stage_off) and copied out 8 bytes per lane after the one
// barrier, whole 64-byte output rows; the entries of both streams as the staged path's
// (copy_staged_entries).
// Addresses are formed once per lane and stepped by constants: thread indices unsigned (no
// signed division), the rowwise stores one pointer stepped by K, the lane's 4 staged pieces at
// mx_stage_off(c0, k) with bit 6 flipped (odd columns) plus 128 (columns 2, 3; c0 % 4 == 0),
// the copy-out's 4 rounds at mx_stage_off(tid / 8, tid % 8) + 2048 it and 32 output rows apart;
// the multipliers' shuffles with immediate lanes (shfl_keep_bits); the rule `rceil` without
// branches (mx_pair_scale); pack4's NaN fix-up only in a warp that holds a NaN (mx_pair_pack);
// the entries of mn_major grids one 4-byte store per thread of warps 0-3 (copy_mx_pair_entries_fast).
// Static SASS instructions from the path's entry to its barrier, bf16 / fp16 input: 610 / 603
// -> 438 / 437; executed on a tile without NaN: about 596 / 589 -> 359 / 358.
template <class Cfg, class R, class C>
__device__ void cast_mx_pair_direct(const QuantizeArgs& a, const Member& mem, i64 col0, i64 base_r, i64 base_c) {
  constexpr int D = Cfg::kInDtype, TR = 64, TC = 128, T = 256;
  constexpr int kStageBytes = TC * TR, kEntryBytes = TR * (TC / 32);
  static_assert(kStageBytes + 2 * kEntryBytes == int(cast_pair_smem_bytes(true)) && cast_pair_smem_bytes(true) <= Cfg::kSmemBytes,
                "the kernel's shared memory holds this path's");
  extern __shared__ float4 smem4[];
  u8* stage = reinterpret_cast<u8*>(smem4);  // [128 columns][64 rows] of output bytes (mx_stage_off)
  u8* rent = stage + kStageBytes;            // rowwise entries [64 rows][4 blocks]
  u8* cent = rent + kEntryBytes;             // transposed entries [128 columns][2 blocks]
  const u32 tid = threadIdx.x, w = tid / 32, l = tid % 32;
  const u32 r0 = 32 * (w % 2) + 8 * (l / 8), c0 = 32 * (w / 2) + 4 * (l % 8);  // the lane's first row and column
  const i64 row0 = mem.tile_row * TR;
  const i64 lin_r = (mem.row_base + row0 + r0) * a.k + col0 + c0;
  uint2 v[8];
#pragma unroll
  for (int e = 0; e < 8; ++e)
    v[e] = __ldg(reinterpret_cast<const uint2*>(static_cast<const u16*>(a.x) + lin_r + i64(e) * a.k));

  // Packed amaxes of the lane's 8 row pieces (both halves of m[e]: columns {0, 2} and {1, 3})
  // and of its columns (p[0]: columns 0, 1; p[1]: 2, 3).
  constexpr bool kRawCvt = kHwFp8Cvt<typename R::Format> || kHwFp8Cvt<typename C::Format>;
  u32 m[8], p[2], nan = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const u32 x = abs16x2(v[e].x), y = abs16x2(v[e].y);
    m[e] = max16x2<D>(x, y);
    p[0] = e == 0 ? x : max16x2<D>(p[0], x);
    p[1] = e == 0 ? y : max16x2<D>(p[1], y);
    if constexpr (kRawCvt)
      nan = e == 0 ? max16x2_nan<D>(x, y) : max16x2_nan<D>(nan, max16x2_nan<D>(x, y));
  }
  const bool any_nan =
      kRawCvt && __any_sync(0xFFFFFFFFu, has_nan16x2<D>(nan));
  // Lane l ends with row r0 + own_r's block amax (bits 0..2 of l reversed) and column c0 +
  // own_c's (bit 3 of l picks the column pair, bit 4 the column in it).
  halve_in_lanes<D, 4, 1>(m, int(l));
  halve_in_lanes<D, 2, 2>(m, int(l));
  halve_in_lanes<D, 1, 4>(m, int(l));
  halve_in_lanes<D, 1, 8>(p, int(l));
  p[0] = max16x2<D>(p[0], __shfl_xor_sync(0xFFFFFFFFu, p[0], 16));
  const u32 own_r = 4 * (l & 1) + (l & 2) + ((l >> 2) & 1), own_c = ((l >> 2) & 2) + ((l >> 4) & 1);
  const float row_amax = max_halves<D>(m[0]), col_amax = amax_step(0.0f, half_value<D>(p[0], (l & 16) != 0));

  const StreamArgs& rout = a.streams[R::kIndex];
  const StreamCtx<R> rctx = stream_ctx<Cfg, R>(a, mem);
  RunWords<R, 4> rw[8];  // the lane's rowwise words, then its transposed words, stored after the fix-up
  RunWords<C, 8> cw[4];
  {
    float mul;
    u32 entry;
    mx_pair_scale<Cfg, R>(row_amax, rctx, mul, entry);
    rent[(r0 + own_r) * 4 + w / 2] = u8(entry);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      // The lane of this row's 8 that holds row e: own_r's bits reversed.
      const float me = shfl_keep_bits<24>(mul, ((e & 1) << 2) | (e & 2) | ((e >> 2) & 1));
      float x[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = mx_pair_elem<D>(v[e], j) * me;
      rw[e] = mx_pair_pack<R, 4>(a, lin_r + i64(e) * a.k, x);
    }
  }

  const StreamArgs& tout = a.streams[C::kIndex];
  const StreamCtx<C> cctx = stream_ctx<Cfg, C>(a, mem);
  const i64 tile_c = mem.row_base * a.k + col0 * mem.rows + row0;  // transposed: output row col0, element row0
  {
    float mul;
    u32 entry;
    mx_pair_scale<Cfg, C>(col_amax, cctx, mul, entry);
    cent[(c0 + own_c) * 2 + w % 2] = u8(entry);
    // Columns c0 + j (c0 % 4 == 0) share mx_stage_off(c0, r0 / 8)'s bits but bit 6 (the half of
    // the line: bit 0 of c) and the line (c / 2).
    const u32 so = u32(mx_stage_off(int(c0), int(r0 / 8)));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // The lane of this column's 4 that holds column j: own_c's bits reversed.
      const float mj = shfl_keep_bits<7>(mul, ((j & 1) << 4) | ((j & 2) << 2));
      float x[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = mx_pair_elem<D>(v[e], j) * mj;
      cw[j] = mx_pair_pack<C, 8>(a, tile_c + i64(c0 + j) * mem.rows + r0, x);
    }
    // The stores in both branches: joined before them, ptxas moved the words between registers.
    const auto store = [&] {
      u8* rp = static_cast<u8*>(rout.data) + lin_r;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        store_words<4>(rp, rw[e].w);
        rp += a.k;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) store_words<8>(stage + ((so ^ ((j & 1) << 6)) + (j >> 1) * 128), cw[j].w);
    };
    if (any_nan) {
#pragma unroll
      for (int e = 0; e < 8; ++e) mx_pair_fix_nan<R, 4>(rw[e]);
#pragma unroll
      for (int j = 0; j < 4; ++j) mx_pair_fix_nan<C, 8>(cw[j]);
      store();
    } else {
      store();
    }
  }
  __syncthreads();
  // Round it copies output rows 32 it + tid / 8, piece tid % 8: staged 2048 it bytes further.
  {
    const u8* src = stage + mx_stage_off(int(tid / 8), int(tid % 8));
    u8* dst = static_cast<u8*>(tout.data) + tile_c + i64(tid / 8) * mem.rows + (tid % 8) * 8;
    const i64 step = 32 * mem.rows;
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src + it * 2048);
      dst += step;
    }
  }
  // The entries: threads [0, 64) the rowwise stream's (64 rows x 4 blocks), [64, 128) the
  // transposed stream's (128 columns x 2 blocks), where both grids allow it.
  const bool fast_r = copy_mx_pair_entries_fast<R, T, TR, TC / 32>(rout.scale_inv, base_r, rctx, row0, col0 / 32, rent, tid);
  const bool fast_c = copy_mx_pair_entries_fast<C, T, TC, TR / 32>(tout.scale_inv, base_c, cctx, col0, row0 / 32, cent, tid - 64);
  if (!fast_r) copy_staged_entries<R, T>(rout.scale_inv, base_r, rctx, row0, col0 / 32, rent, TR, TC / 32);
  if (!fast_c) copy_staged_entries<C, T>(tout.scale_inv, base_c, cctx, col0, row0 / 32, cent, TC, TR / 32);
}

// A row + transposed pair cast from registers on interior tiles whose member's rows are a
// multiple of 16: 1x128 blocks (cast_pair_direct) or MX 1x32 blocks (cast_mx_pair_direct).
template <class Cfg, class R, class C>
constexpr bool kPairRegisters = kPairDirect<Cfg, R, C> || kMxPairDirect<Cfg, R, C>;
// A program for interior tiles only (kInteriorOnly) of a kPairRegisters plan casts every tile
// from registers, so it asks only that path's shared memory (cast_pair_smem_bytes; 0: not such a
// program). compiler/codegen.cpp (register_pair) decides the same on the host. Not the pairs of
// per-tensor or per-channel scales, whose programs hold a fused kernel that stages its tiles.
template <class Cfg, class... S>
constexpr u32 kPairOnlySmemBytes = 0;
template <class Cfg, class R, class C>
constexpr u32 kPairOnlySmemBytes<Cfg, R, C> = kInteriorOnly<Cfg> && kPairRegisters<Cfg, R, C> && !kPairTensorScales<R, C> &&
                                                      !kPairChannelScales<R, C>
                                                  ? cast_pair_smem_bytes(kMxPairDirect<Cfg, R, C>)
                                                  : 0;
template <class Cfg, class R, class C>
__device__ __forceinline__ void cast_pair_registers(const QuantizeArgs& a, const Member& mem, i64 col0, i64 base_r, i64 base_c) {
  if constexpr (kPairDirect<Cfg, R, C>) cast_pair_direct<Cfg, R, C>(a, mem, col0, base_r, base_c);
  else cast_mx_pair_direct<Cfg, R, C>(a, mem, col0, base_r, base_c);
}

}  // namespace detail
}  // namespace qf
