// The fused quantize kernels. Generated code (compiler/codegen.cpp) defines one config struct
// for the plan and one per stream / per amax reduction, with named constants, and names the
// kernel templates below; everything else is in the headers this one includes, as ordinary CUDA.
//
//   amax_kernel<Cfg, A...>  - phase 0 when the plan needs global reductions first: the tensor
//                             amax (raw or after RHT) and per-channel amaxes.
//   cast_kernel<Cfg, S...>  - the cast: one read of each input tile into shared memory, then
//                             every stream S (rowwise / columnwise, any format) written from it.
//   fused_kernel, row_kernel - cast_kernel with its pre-pass inside one cooperative launch; the
//                             one-pass form of rowwise per-channel plans (below).
//   cast_fused_kernel       - cast_kernel and fused_kernel in one (plans whose cast stages every tile).
//
// A tile is kTileRows x kTileCols of the input, staged once in shared memory (rows of 4-element
// chunks, XOR-swizzled by row so that both row and column walks are free of bank conflicts), as
// fp32, or, with Cfg::kStage16, as the 16-bit input's own bits (half the shared memory: more
// CTAs per SM where fp32 staging would limit them; codegen decides). A stream walks the tile in
// "runs":
//   rowwise      - kEpt (= 4) consecutive elements of one row per thread, one 16-byte smem read
//                  and one vector store; kGroup consecutive lanes whose runs share one scale
//                  block reduce its amax with shuffles;
//   columnwise   - kEpt consecutive rows of one column per thread (one scale block along M, or
//                  16 rows without blocks), lanes on consecutive columns; a transposed stream
//                  writes each 16-row chunk of the run as one vector store into its output row.
// Interior tiles take vector paths without checks, edge tiles the checked ones (cast_tile.cuh
// lists them); CTAs take tiles column-fastest, most plans (tile_pos). Encoders: cast_encode.cuh.
// Scales come from docs/numerics.md through numerics.cuh, the same functions the CPU reference
// runs.
//
// This header is the entry point: the parts of the kernels are the headers below, one idea
// each, in the order they build on each other, and the kernels themselves are at the end.
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_smem.cuh"  // (host and device) scaling modes, identity formats, shared-memory sizes
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

#if defined(__CUDACC__)
#include "qforge/cast_schedule.cuh"    // members, the CTA -> tile order, the cooperative grid barrier
#include "qforge/cast_load.cuh"        // the staged tile's layout, input loads and unpacking, tile staging
#include "qforge/cast_encode.cuh"      // element encoders (RN / SR fast paths), packing, NaN fix-ups, run stores
#include "qforge/cast_reduce.cuh"      // amax reductions: warp / CTA maxima, block amaxes, the pre-pass pieces
#include "qforge/cast_scale.cuh"       // per-stream scale rules (block_scale), scale entries and their stores
#include "qforge/cast_rowwise.cuh"     // rowwise streams: staged runs, whole 16-column blocks, from global memory
#include "qforge/cast_columnwise.cuh"  // columnwise streams: same layout and transposed, column partials
#include "qforge/cast_pair.cuh"        // rowwise + transposed pairs cast from registers: 1x128 + 128x1, MX 1x32 + 32x1
#include "qforge/cast_copy.cuh"        // 16-bit identity copies of interior tiles: the input's bits, transposed by byte permutes
#include "qforge/cast_tile.cuh"        // one tile, every stream: the path each stream takes, staging, barriers
#endif

namespace qf {

#if defined(__CUDACC__)

template <class Cfg, class... S>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    cast_kernel(const QuantizeArgs a) {
  detail::cast_tile<Cfg, PrePass<>, detail::TileLaunch::kCast, S...>(a);
}

// cast_kernel for a single tensor whose grid fits on the GPU at once, launched cooperatively:
// the pre-pass amaxes (Pre, tensor scope) and the zeroing of every amax output happen inside,
// around grid barriers, so a call is one launch and reads its input once.
template <class Cfg, class Pre, class... S>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    fused_kernel(const QuantizeArgs a) {
  detail::cast_tile<Cfg, Pre, detail::TileLaunch::kFused, S...>(a);
}

// cast_kernel and fused_kernel in one, for plans whose cast kernel stages every tile as the fused
// kernel does (compiler/codegen.cpp own_fused_kernel): a.one_launch picks the form. The fused
// kernel compiled as long as the cast kernel, its tile work inlined again (docs/jit.md, step 10).
template <class Cfg, class Pre, class... S>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    cast_fused_kernel(const QuantizeArgs a) {
  detail::cast_tile<Cfg, Pre, detail::TileLaunch::kEither, S...>(a);
}

namespace detail {

// Warps that own one row in row_kernel: the fewest (1, 2, 4 or 8) whose threads hold the row's
// 16-byte chunks in Cfg::kRowChunks registers each. The host's row_pass_warps is the same rule.
template <class Cfg>
__device__ __forceinline__ int row_warps(i64 k) {
  const i64 chunks = k / kElemsPer16<Cfg::kInDtype>;
  int w = 1;
  while (w < Cfg::kThreads / 32 && i64(32 * w) * Cfg::kRowChunks < chunks) w *= 2;
  return w;
}

}  // namespace detail

// The one-pass form of plans whose every stream is rowwise with one scale per row (per-channel
// int8 / fp8 of tokens or output channels) and whose only global reductions are those rows'
// amaxes: a group of warps owns a whole row, holds it in registers (16-byte loads, every load of
// a thread in flight at once), reduces its amax, and writes the row's scale entries and data,
// so the input is read once where the two-pass form (amax_kernel, then cast_kernel) reads it
// twice. Single tensors whose K is a multiple of the 16-byte chunk and fits the group's
// registers (the host checks: Quantizer::row_pass); Cfg is the plan's with kThreads and
// kRowChunks of this kernel. One CTA takes kThreads / 32 / row_warps rows.
template <class Cfg, class... S>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) row_kernel(const QuantizeArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  constexpr int D = Cfg::kInDtype, E = detail::kElemsPer16<D>, C = Cfg::kRowChunks, W = Cfg::kThreads / 32;
  static_assert(((S::kMode == kModeChannel && S::kDir == 0 && !S::kTransposed) && ...), "rowwise per-channel streams");
  __shared__ float warp_amax[W];
  const int warps = detail::row_warps<Cfg>(a.k), warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int group = warp / warps, t = (warp % warps) * 32 + lane, group_threads = 32 * warps;
  const i64 row = i64(blockIdx.x) * (W / warps) + group;
  const bool live = row < a.m;
  const i64 chunks = a.k / E;
  const char* src = static_cast<const char*>(a.x) + (live ? row : 0) * a.k * detail::kInBytes<D>;
  uint4 raw[C];
#pragma unroll
  for (int j = 0; j < C; ++j)
    if (live && t + i64(j) * group_threads < chunks)
      raw[j] = __ldg(reinterpret_cast<const uint4*>(src) + t + i64(j) * group_threads);
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < C; ++j)
    if (live && t + i64(j) * group_threads < chunks) m = detail::chunk_amax<D>(raw[j], m);
  m = detail::warp_max(m);
  if (lane == 0) warp_amax[warp] = m;
  __syncthreads();
  if (!live) return;
  for (int w = 1; w < warps; ++w) m = fmaxf(m, warp_amax[group * warps + (warp % warps + w) % warps]);
  const detail::Member mem{0, 0, a.m, 0};
  (
      [&] {
        const StreamArgs& out = a.streams[S::kIndex];
        const detail::StreamCtx<S> ctx = detail::stream_ctx<Cfg, S>(a, mem);
        float mul;
        u32 entry;
        detail::block_scale<Cfg, S>(m, ctx, mul, entry);
        if (t == 0) detail::maybe_store_entry<S>(out, row, 0, ctx, 0, entry);
#pragma unroll
        for (int j = 0; j < C; ++j) {
          const i64 c = t + i64(j) * group_threads;
          if (c >= chunks) break;
          float v[E];
          detail::unpack16<D>(raw[j], v);
          detail::encode_store<S, E, true>(a, out.data, row * a.k + c * E, v, mul, E);
        }
      }(),
      ...);
}

namespace detail {

// The per-row and per-column amax slots' bases of the pre-pass sources A for this member (null:
// no such source).
template <class... A>
__device__ __forceinline__ void channel_slots(const QuantizeArgs& a, const Member& mem, float*& rows, float*& cols) {
  rows = nullptr, cols = nullptr;
  ((A::kScope == kScopeChannelRows ? rows = a.amax[A::kSlot] + mem.row_base : cols = a.amax[A::kSlot] + i64(mem.index) * a.k),
   ...);
}

// Per-row and per-column amaxes only (no RHT), whose interior tiles the pre-pass reads straight
// from global memory, one read (H200, 16384^2 bf16, fp8_rowwise training: the staged form's
// pre-pass took 329 us, 1.64 TB/s).
template <class Cfg, class... A>
constexpr bool kRowsColsDirect = ((!A::kRht && A::kScope != kScopeTensor) && ...) &&
                                 ((A::kScope == kScopeChannelCols) || ...) && kRowColDirect<Cfg>;

// The global reductions of one tile of the member's tile row mem.tile_row, at column col0.
template <class Cfg, class... A>
__device__ __forceinline__ void amax_tile(const QuantizeArgs& a, const Member& mem, i64 col0) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads;
  const i64 row0 = mem.tile_row * TR;
  // The staged tile serves RHT'd reductions and column walks; raw tensor and row amaxes read
  // global memory directly.
  constexpr bool kNeedsTile = ((A::kRht || A::kScope == kScopeChannelCols) || ...);
  extern __shared__ float4 smem4[];
  detail::TileElem<Cfg>* tile = reinterpret_cast<detail::TileElem<Cfg>*>(smem4);
  detail::TileElem<Cfg>* rtile = Cfg::kRht ? tile + TR * TC : tile;
  const bool full = detail::kInteriorOnly<Cfg> || (row0 + TR <= mem.rows && col0 + TC <= a.k && a.k % 16 == 0);
  if constexpr (kRowsColsDirect<Cfg, A...>) {
    if (full) {
      float *rows, *cols;
      channel_slots<A...>(a, mem, rows, cols);
      tile_row_col_amaxes_full<Cfg>(a, mem, col0, rows, cols, reinterpret_cast<float*>(smem4));
      return;
    }
  }
  // Only tensor amaxes, some after the RHT: interior tiles rotate from global memory in
  // registers (no staging: the pass stays at the memory floor).
  if constexpr (kNeedsTile && ((A::kScope == kScopeTensor) && ...)) {
    if (full) {
      float raw, rot;
      detail::tile_tensor_amaxes_full<Cfg>(a, mem, col0, raw, rot);
      rot = detail::round_to_dtype(rot * 0.25f, Cfg::kInDtype);
      (detail::block_max_atomic<Cfg::kThreads>(a.amax[A::kSlot] + mem.index, A::kRht ? rot : raw), ...);
      return;
    }
  }
  // RHT'd tensor amaxes rotate in registers; only RHT'd channel amaxes read a rotated copy.
  constexpr bool kRotate = ((A::kRht && A::kScope != kScopeTensor) || ...);
  if constexpr (kNeedsTile) detail::load_tile<Cfg>(a, mem, col0, full, tile, rtile, kRotate);
  (
      [&] {
        if constexpr (A::kScope == kScopeTensor && !A::kRht && !kNeedsTile) {
          // Raw tensor amax: vector loads straight from global memory.
          if (full) {
            detail::block_max_atomic<Cfg::kThreads>(a.amax[A::kSlot] + mem.index, detail::tile_amax_full<Cfg>(a, mem, col0));
            return;
          }
          constexpr int CH = TC / 4, N = TR * CH;
          float m = 0.0f;
          const bool vec = a.k % 4 == 0;
#pragma unroll 4
          for (int i = threadIdx.x; i < N; i += T) {
            const int r = i / CH, c = (i % CH) * 4;
            const i64 rl = row0 + r, cg = col0 + c;
            if (rl >= mem.rows || cg >= a.k) continue;
            const i64 idx = (mem.row_base + rl) * a.k + cg;
            if (vec && cg + 4 <= a.k) {
              const float4 f = detail::load4<Cfg::kInDtype>(a.x, idx);
              m = amax_step(amax_step(amax_step(amax_step(m, f.x), f.y), f.z), f.w);
            } else {
              for (int e = 0; e < 4 && cg + e < a.k; ++e) m = amax_step(m, detail::load1<Cfg::kInDtype>(a.x, idx + e));
            }
          }
          detail::block_max_atomic<Cfg::kThreads>(a.amax[A::kSlot] + mem.index, m);
        } else if constexpr (A::kScope == kScopeTensor) {
          // After RHT (rotated in registers from the staged tile), or raw from the staged tile
          // when another reduction of this launch needed the tile anyway.
          detail::block_max_atomic<Cfg::kThreads>(a.amax[A::kSlot] + mem.index, detail::staged_tensor_amax<Cfg, A::kRht>(tile));
        } else if constexpr (A::kScope == kScopeChannelRows && !A::kRht) {
          // One warp per row, straight from global memory: 16-byte loads on interior tiles
          // (lanes on consecutive chunks), checked element loads on edge tiles.
          constexpr int E = detail::kElemsPer16<Cfg::kInDtype>;
          const int lane = int(threadIdx.x % 32);
          for (int r = int(threadIdx.x / 32); r < TR; r += T / 32) {
            const i64 rl = row0 + r;
            if (rl >= mem.rows) break;  // warp-uniform
            const i64 idx = (mem.row_base + rl) * a.k + col0;
            float m = 0.0f;
            if (full) {
              const char* row = static_cast<const char*>(a.x) + idx * detail::kInBytes<Cfg::kInDtype>;
#pragma unroll 4
              for (int c = lane * E; c < TC; c += 32 * E)
                m = detail::chunk_amax<Cfg::kInDtype>(__ldg(reinterpret_cast<const uint4*>(row + c * detail::kInBytes<Cfg::kInDtype>)), m);
            } else {
              for (int c = lane; c < TC && col0 + c < a.k; c += 32) m = amax_step(m, detail::load1<Cfg::kInDtype>(a.x, idx + c));
            }
            m = detail::warp_max(m);
            if (lane == 0) detail::atomic_max_nonneg(a.amax[A::kSlot] + mem.row_base + rl, m);
          }
        } else if constexpr (A::kScope == kScopeChannelRows) {
          detail::staged_row_amaxes<Cfg>(rtile, a.amax[A::kSlot] + mem.row_base, row0, mem.rows);
        } else {
          detail::staged_col_amaxes<Cfg>(A::kRht ? rtile : tile, a.amax[A::kSlot] + i64(mem.index) * a.k, col0, a.k);
        }
      }(),
      ...);
}

}  // namespace detail

// Global reductions before the cast: the tensor amax (raw: straight from global memory with
// vector loads; after RHT: through the rotated tile) and per-channel amaxes. Where codegen groups
// tiles (kAmaxTiles > 1), a CTA reduces as many consecutive tiles of its tile row as the host's
// grid has fewer columns than the input has tiles: the leading interior ones in one pass where
// the tile allows (kRowsColsDirect, segments of kAmaxTiles tiles), the others one at a time.
template <class Cfg, class... A>
__global__ void __launch_bounds__(Cfg::kThreads) amax_kernel(const QuantizeArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  detail::Member mem;
  i64 unused[kMaxStreams];
  const detail::TilePos pos = detail::tile_pos<Cfg, true>();
  if (!detail::resolve_member<Cfg>(a, pos.row, mem, unused)) return;
  constexpr int F = detail::kAmaxTiles<Cfg>, TR = Cfg::kTileRows, TC = Cfg::kTileCols;
  if constexpr (F == 1) {
    detail::amax_tile<Cfg, A...>(a, mem, pos.col * TC);
  } else {
    // `per` tiles per CTA, from the host's grid (runtime/quantizer.cpp amax_group_tiles: one
    // each for inputs of one wave of tiles, where grouping would only lengthen each CTA). With
    // the host's grids (ceil(tiles / per) columns) every CTA's first tile starts within K.
    const int per = int(ceil_div(ceil_div(u64(a.k), u64(TC)), u64(gridDim.y)));
    const i64 col0 = pos.col * per * TC;
    int n = 0;  // the leading tiles reduced in one pass
    if constexpr (detail::kRowsColsDirect<Cfg, A...> && detail::kGroupDirect<Cfg, F>) {
      const bool rows_full = detail::kInteriorOnly<Cfg> || (mem.tile_row * TR + TR <= mem.rows && a.k % 16 == 0);
      const i64 whole = (a.k - col0) / TC;  // tiles of the group that end within K
      // Segments only where the host groups tiles (a single tile reads best as a tile: 8-byte
      // chunks, every lane).
      n = rows_full && per >= F ? int(whole < per ? whole : per) : 0;
      if (n > 0) {
        extern __shared__ float4 smem4[];
        float *rows, *cols;
        detail::channel_slots<A...>(a, mem, rows, cols);
        detail::group_row_col_amaxes_full<Cfg, F>(a, mem, col0, n, rows, cols, reinterpret_cast<float*>(smem4));
      }
    }
    for (int t = n; t < per && col0 + i64(t) * TC < a.k; ++t) {
      if (t > 0) __syncthreads();  // shared memory of the tile before
      detail::amax_tile<Cfg, A...>(a, mem, col0 + i64(t) * TC);
    }
  }
}

#endif  // __CUDACC__

}  // namespace qf
