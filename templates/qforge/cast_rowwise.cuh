// Rowwise streams ([M, K] layout) over one tile: block scales of interior tiles first where a
// block is wider than a run; runs of 4 elements of a row from the staged tile (cast_rowwise);
// whole 16-column blocks per thread (NVFP4: cast_rowwise_blocks); and the one-stream plans'
// interior tiles straight from global memory, without staging (cast_rowwise_direct).
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_encode.cuh"
#include "qforge/cast_load.cuh"
#include "qforge/cast_reduce.cuh"
#include "qforge/cast_scale.cuh"
#include "qforge/cast_schedule.cuh"
#include "qforge/numerics.cuh"

namespace qf {
namespace detail {

// Interior tiles, rowwise 1D blocks wider than one run (1x16, 1x32, 1x128): the scale of each
// (row, block) once, by one thread (lanes on consecutive rows: the swizzle keeps their 16-byte
// reads apart), into mul_out[r * (TC / B) + block]; its scale entry goes to global memory, or,
// for staged byte entries, to the bytes after mul_out (the caller copies them out).
template <class Cfg, class S>
__device__ void row_block_scales(const QuantizeArgs& a, const Member& mem, i64 col0, const TileElem<Cfg>* src,
                                 const StreamCtx<S>& ctx, float* mul_out, i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, B = S::kBlockCols, NBC = TC / B, N = TR * NBC;
  constexpr int T = Cfg::kThreads;
  const StreamArgs& out = a.streams[S::kIndex];
  const i64 row0 = mem.tile_row * TR;
  for (int it = 0; it < (N + T - 1) / T; ++it) {
    if (item_past_end<N, T>(it)) break;
    int b, r;
    item_rc<TR, T>(it, b, r);
    const float m = row_run_amax<TC, B>(src, r, b * B);
    float mul;
    u32 entry;
    block_scale<Cfg, S>(m, ctx, mul, entry);
    mul_out[r * NBC + b] = mul;
    if constexpr (kStagedEntries<S>) reinterpret_cast<u8*>(mul_out + N)[r * NBC + b] = u8(entry);
    else maybe_store_entry<S>(out, row0 + r, col0 + b * B, ctx, scale_base, entry);
  }
}

// Rowwise stream ([M, K] layout): runs of 4 elements of a row, kGroup lanes per scale block.
// kFull: an interior tile (no bounds, aligned vector stores).
template <class Cfg, class S, bool kFull>
__device__ float cast_rowwise(const QuantizeArgs& a, const Member& mem, i64 col0, const TileElem<Cfg>* src, const u32* bamax,
                              float* scratch, i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, CH = TC / 4, N = TR * CH, T = Cfg::kThreads, G = S::kGroup;
  static_assert(S::kEpt == 4 && CH % G == 0 && 32 % G == 0, "rowwise runs: 4 elements, groups within a warp row");
  static_assert(N % 32 == 0, "whole warps of runs");
  // Interior tiles with 1D blocks wider than a run: block scales first (row_block_scales).
  constexpr bool kRowScales = kFull && !S::kBlock2d && G > 1;
  // Interior tiles per channel: each row's scale once (its amax from the pre-pass, a division and
  // a reciprocal), not once per run of 4 (ablation no-channel-scale: 61 of 764 us of fp8_rowwise
  // training at 16384^2 on an H100).
  constexpr bool kChannelRows = kFull && S::kMode == kModeChannel;
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR, tile_lin = (mem.row_base + row0) * a.k + col0;
  if constexpr (kRowScales) {
    row_block_scales<Cfg, S>(a, mem, col0, src, ctx, scratch, scale_base);
    __syncthreads();
    if constexpr (kStagedEntries<S>) {
      constexpr int NBC = TC / S::kBlockCols;
      copy_staged_entries<S, T>(out.scale_inv, scale_base, ctx, row0, col0 / S::kBlockCols,
                                reinterpret_cast<const u8*>(scratch + TR * NBC), TR, NBC);
    }
  }
  if constexpr (kChannelRows) {
    for (int r = int(threadIdx.x); r < TR; r += T) {
      float mul;
      u32 entry;
      block_scale<Cfg, S>(a.amax[S::kLocalAmax][mem.row_base + row0 + r], ctx, mul, entry);
      scratch[r] = mul;
      maybe_store_entry<S>(out, row0 + r, col0, ctx, scale_base, entry);
    }
    __syncthreads();
  }
  float reported = 0.0f;
#pragma unroll (kFull ? 4 : 1)  // edge tiles: compact code (cast_load.cuh load_tile)
  for (int it = 0; it < (N + T - 1) / T; ++it) {
    if (item_past_end<N, T>(it)) break;  // N % 32 == 0: whole warps take part in shuffles
    int r, c;
    item_rc<CH, T>(it, r, c);
    c *= 4;
    const float4 f = tld4(src, tile_off<TC>(r, c));
    const float v[4] = {f.x, f.y, f.z, f.w};
    if constexpr (kChannelRows) {
      encode_store<S, 4, true>(a, out.data, tile_lin + i64(r) * a.k + c, v, scratch[r], 4);
      continue;
    }
    if constexpr (kRowScales) {
      encode_store<S, 4, true>(a, out.data, tile_lin + i64(r) * a.k + c, v, scratch[r * (TC / S::kBlockCols) + c / S::kBlockCols], 4);
      continue;
    }
    const i64 rl = row0 + r, cg = col0 + c;
    const int valid = kFull ? 4 : rl < mem.rows ? int(a.k - cg < 4 ? (a.k - cg > 0 ? a.k - cg : 0) : 4) : 0;
    float amax = amax_step(amax_step(amax_step(amax_step(0.0f, v[0]), v[1]), v[2]), v[3]);  // zero padding
    if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);
    float block_amax = amax;
    if constexpr (S::kBlock2d) {
      block_amax = f32_from_bits(bamax[(r / S::kBlockRows) * (TC / S::kBlockCols) + c / S::kBlockCols]);
    } else if constexpr (S::kMode == kModeChannel) {
      block_amax = kFull || rl < mem.rows ? a.amax[S::kLocalAmax][mem.row_base + rl] : 0.0f;
    } else if constexpr (G > 1) {
      block_amax = group_max<G>(amax);
    }
    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, ctx, mul, entry);
    if (!kFull && valid == 0) continue;
    maybe_store_entry<S>(out, rl, cg, ctx, scale_base, entry);
    encode_store<S, 4, kFull>(a, out.data, tile_lin + i64(r) * a.k + c, v, mul, valid);
  }
  return reported;
}

// Rowwise streams whose blocks are 16 columns (NVFP4, 1D or 16x16): on interior tiles one thread
// takes a whole block row (its amax, or the 2D block's from block2d_amax, scale, entry and one
// 8-byte store for fp4), lanes on consecutive blocks of a row; the chunk swizzle keeps the reads
// of the warp's four rows apart. (MXFP8's 32-column blocks measured slower this way, 518 against
// 414 us at 16384^2 on an H100: they keep the 4-element runs.)
template <class S>
constexpr bool kWholeBlockRows = S::kDir == 0 && (S::kBlock2d || S::kGroup > 1) && S::kBlockCols == 16 &&
                                 S::kEntryRows == 1 && S::kEntryCols == S::kBlockCols;

// kDirect: the block's elements come straight from global memory (16-byte loads; plans whose one
// stream this is do not stage the tile).
template <class Cfg, class S, bool kDirect = false>
__device__ void cast_rowwise_blocks(const QuantizeArgs& a, const Member& mem, i64 col0, const TileElem<Cfg>* src,
                                    const u32* bamax, i64 scale_base) {
  static_assert(!(kDirect && S::kBlock2d), "2D block amaxes come from the staged tile");
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, BC = S::kBlockCols, NBC = TC / BC, N = TR * NBC;
  constexpr int T = Cfg::kThreads;
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR, tile_lin = (mem.row_base + row0) * a.k + col0;
#pragma unroll 2
  for (int it = 0; it < (N + T - 1) / T; ++it) {
    if (item_past_end<N, T>(it)) break;
    int r, b;
    item_rc<NBC, T>(it, r, b);
    float v[BC], amax = 0.0f;
    const i64 lin = tile_lin + i64(r) * a.k + b * BC;
    if constexpr (kDirect) {
      constexpr int E = kElemsPer16<Cfg::kInDtype>;
      uint4 raw[BC / E];
#pragma unroll
      for (int q = 0; q < BC / E; ++q) raw[q] = load16<Cfg::kInDtype>(a.x, lin + q * E);
#pragma unroll
      for (int q = 0; q < BC / E; ++q) unpack16<Cfg::kInDtype>(raw[q], v + q * E);
    } else {
#pragma unroll
      for (int q = 0; q < BC; q += 4) {
        const float4 f = tld4(src, tile_off<TC>(r, b * BC + q));
        v[q] = f.x, v[q + 1] = f.y, v[q + 2] = f.z, v[q + 3] = f.w;
      }
    }
    if constexpr (S::kBlock2d) {
      amax = f32_from_bits(bamax[(r / S::kBlockRows) * NBC + b]);
    } else {
#pragma unroll
      for (int q = 0; q < BC; ++q) amax = amax_step(amax, v[q]);
    }
    float mul;
    u32 entry;
    block_scale<Cfg, S>(amax, ctx, mul, entry);
    maybe_store_entry<S>(out, row0 + r, col0 + b * BC, ctx, scale_base, entry);
    encode_store<S, BC, true>(a, out.data, lin, v, mul, BC);
  }
}

// Rowwise streams that a plan of that one stream casts straight from global memory on interior
// tiles (no staging, no barrier; mn_major MX entries excepted: staged for one copy-out after a
// barrier): 1D blocks (or none), no RHT, and the whole-block form above not taken. One 16-byte piece of the input (E elements) per thread and item, lanes on
// consecutive pieces of a row, every piece of the thread loaded before the first is encoded;
// the BC / E lanes of a block reduce its amax with shuffles. (H100, 16384^2, bf16, 16 x 256
// tiles, both in row-fastest tile order: delayed 298 -> 279 us, MXFP8 298 -> 290, 1x128 297 ->
// 292 against the staged form.)
// A rowwise stream's 1D scale blocks (kBlockCols is 1 for per-tensor and per-channel scales).
template <class S>
constexpr bool kRowBlocks = S::kBlockCols > 1;
template <class Cfg, class S>
constexpr bool kRowwiseDirect =
    S::kDir == 0 && !S::kBlock2d && !S::kRht && !kWholeBlockRows<S> &&
    (Cfg::kTileRows * Cfg::kTileCols / kElemsPer16<Cfg::kInDtype>) % Cfg::kThreads == 0 &&
    (!kRowBlocks<S> || (S::kBlockCols % kElemsPer16<Cfg::kInDtype> == 0 && S::kBlockCols / kElemsPer16<Cfg::kInDtype> <= 32));

template <class Cfg, class S>
__device__ float cast_rowwise_direct(const QuantizeArgs& a, const Member& mem, i64 col0, i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads, E = kElemsPer16<Cfg::kInDtype>;
  constexpr int W = TC / E, K = TR * W / T;                // pieces per tile row, items per thread
  constexpr int L = kRowBlocks<S> ? S::kBlockCols / E : 1;  // lanes of one block
  static_assert(kRowwiseDirect<Cfg, S> && TC % E == 0 && W % L == 0 && 32 % L == 0, "blocks within a warp row");
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR, tile_lin = (mem.row_base + row0) * a.k + col0;
  constexpr int KB = K % 8 == 0 ? 8 : K % 4 == 0 ? 4 : K % 2 == 0 ? 2 : 1;  // items loaded together
  // mn_major byte entries (MX): staged in the otherwise unused shared memory, then copied out a
  // block column's run at a time (stored one by one they lie a grid column apart: `mxfp8_hopper`'s
  // rowwise-only cast measured 91 % of copy against 99.6 % compact).
  constexpr bool kStageMn = kByteEntries<S> && S::kMnMajor;
  constexpr int NBC = kRowBlocks<S> ? TC / S::kBlockCols : 1;
  static_assert(!kStageMn || (TC % S::kBlockCols == 0 && TR * NBC <= int(Cfg::kSmemBytes)), "staged entries fit");
  extern __shared__ float4 smem4[];
  u8* staged = reinterpret_cast<u8*>(smem4);
  float reported = 0.0f;
#pragma unroll 1
  for (int it0 = 0; it0 < K; it0 += KB) {
    uint4 raw[KB];
#pragma unroll
    for (int i = 0; i < KB; ++i) {
      int r, c;
      item_rc<W, T>(it0 + i, r, c);
      raw[i] = load16<Cfg::kInDtype>(a.x, tile_lin + i64(r) * a.k + c * E);
    }
#pragma unroll
    for (int i = 0; i < KB; ++i) {
      const int it = it0 + i;
      int r, c;
      item_rc<W, T>(it, r, c);
      c *= E;
      float v[E], amax = 0.0f;
      unpack16<Cfg::kInDtype>(raw[i], v);
#pragma unroll
      for (int e = 0; e < E; ++e) amax = amax_step(amax, v[e]);
      if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);
      float block_amax = amax;
      if constexpr (S::kMode == kModeChannel) block_amax = a.amax[S::kLocalAmax][mem.row_base + row0 + r];
      else if constexpr (L > 1) block_amax = group_max<L>(amax);
      float mul;
      u32 entry;
      block_scale<Cfg, S>(block_amax, ctx, mul, entry);
      if constexpr (kStageMn) {
        if (c % S::kBlockCols == 0) staged[r * NBC + c / S::kBlockCols] = u8(entry);
      } else {
        maybe_store_entry<S>(out, row0 + r, col0 + c, ctx, scale_base, entry);
      }
      encode_store<S, E, true>(a, out.data, tile_lin + i64(r) * a.k + c, v, mul, E);
    }
  }
  if constexpr (kStageMn) {
    __syncthreads();
    copy_staged_entries<S, T>(out.scale_inv, scale_base, ctx, row0, col0 / S::kBlockCols, staged, TR, NBC);
  }
  return reported;
}

}  // namespace detail
}  // namespace qf
