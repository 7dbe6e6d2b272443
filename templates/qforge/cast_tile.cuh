// The cast of one tile by every stream of a plan (cast_tile, the body of cast_kernel and
// fused_kernel), and the path each stream takes over it (cast_stream).
// Interior tiles (inside the member and K, K % 16 == 0) take vector paths without checks:
// 16-byte tile loads; transposed runs of 16 rows read once (RHT streams: rotated in registers),
// encoded into a staged copy of the tile's output in shared memory, which the CTA copies out in
// whole sectors of each output row (blocks longer than 16 rows through per-16-row partial amaxes
// in shared scratch); same-layout columnwise streams through one multiplier per (column, block)
// in shared scratch, then rowwise-style runs; MX / NVFP4 byte scale entries staged and copied
// out a row at a time; rowwise 16-column blocks (NVFP4) one whole block per thread. A plan whose
// one stream is rowwise (inference) casts interior tiles straight from global memory, without
// staging; tensor amaxes after the RHT come from global memory too. A rowwise stream with its
// transposed copy (1x128 + 128x1 blocks, MX 1x32 + 32x1) casts interior tiles from registers,
// staging only the transposed output (cast_pair.cuh). Plans of 16-bit identity copies only move
// the input's bits (cast_copy.cuh). Edge tiles take the checked paths above, element by element
// where needed, in compact loops (their code is in every program for any tiles).
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_columnwise.cuh"
#include "qforge/cast_copy.cuh"
#include "qforge/cast_encode.cuh"
#include "qforge/cast_load.cuh"
#include "qforge/cast_pair.cuh"
#include "qforge/cast_reduce.cuh"
#include "qforge/cast_rowwise.cuh"
#include "qforge/cast_scale.cuh"
#include "qforge/cast_schedule.cuh"
#include "qforge/cast_smem.cuh"

namespace qf {
namespace detail {

// One stream over the tile. `full`: an interior tile with K % 16 == 0 (same for the whole CTA).
template <class Cfg, class S>
__device__ __forceinline__ void cast_stream(const QuantizeArgs& a, const Member& mem, i64 col0, bool full,
                                            const TileElem<Cfg>* tile, const TileElem<Cfg>* rtile, float* scratch, i64 scale_base,
                                            bool report) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols;
  store_tensor_entry<Cfg, S>(a, mem, col0, scale_base);
  const bool transposed_full = S::kTransposed && full && (kInteriorOnly<Cfg> || mem.rows % 16 == 0);
  const TileElem<Cfg>* src = S::kRht && !(kRhtInRegisters<S> && transposed_full) ? rtile : tile;
  const u32* bamax = reinterpret_cast<const u32*>(scratch);
  float* part = scratch + cast_block2d_entries(TR, TC, S::kBlock2d, S::kBlockRows, S::kBlockCols);
  float reported = 0.0f;
  if constexpr (kWholeBlockRows<S>) {
    if (full) cast_rowwise_blocks<Cfg, S>(a, mem, col0, src, bamax, scale_base);
    else reported = cast_rowwise<Cfg, S, false>(a, mem, col0, src, bamax, part, scale_base);
  } else if constexpr (S::kDir == 0) {
    reported = full ? cast_rowwise<Cfg, S, true>(a, mem, col0, src, bamax, part, scale_base)
                    : cast_rowwise<Cfg, S, false>(a, mem, col0, src, bamax, part, scale_base);
  } else if constexpr (S::kTransposed) {
    if (transposed_full) {
      if constexpr (S::kEpt > 16 && !S::kBlock2d) {
        column_partials<Cfg>(src, part);
        __syncthreads();
      }
      u8* stage = reinterpret_cast<u8*>(part + (S::kEpt > 16 ? TC * (TR / 16) : 0));
      reported = cast_columnwise_transposed_full<Cfg, S>(a, mem, col0, src, bamax, part, stage, scale_base);
    } else {
      reported = cast_columnwise<Cfg, S>(a, mem, col0, src, bamax, scale_base);
    }
  } else {
    reported = full ? cast_columnwise_same_full<Cfg, S>(a, mem, col0, src, bamax, part, part + TC * (TR / 16), scale_base)
                    : cast_columnwise<Cfg, S>(a, mem, col0, src, bamax, scale_base);
  }
  if constexpr (S::kMode == kModeTensorDelayed) {
    if (report) block_max_atomic<Cfg::kThreads>(a.amax[S::kTensorAmax] + mem.index, reported);
  }
}

// Which launches a kernel's cast_tile serves: the separate form's cast (cast_kernel), the
// one-launch form (fused_kernel), or either, as the launch's a.one_launch says (cast_fused_kernel).
enum class TileLaunch { kCast, kFused, kEither };

// The cast of one tile, all streams; `fused`: the single-tensor, cooperative form.
template <class Cfg, class Pre, TileLaunch kLaunch, class... S>
__device__ __forceinline__ void cast_tile(const QuantizeArgs& a) {
  const bool fused = kLaunch == TileLaunch::kFused || (kLaunch == TileLaunch::kEither && a.one_launch != 0);
  constexpr bool kMayFuse = kLaunch != TileLaunch::kCast;
  // Fused: CTA 0 zeroes the amax outputs (the separate form's memsets), also on a no-op call,
  // whose amax outputs read zero either way.
  if (fused) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
#pragma unroll
      for (int i = 0; i < kMaxAmaxSlots; ++i)
        if (a.amax[i]) a.amax[i][0] = 0.0f;
    }
  }
  if (a.noop && *a.noop == 1.0f) return;
  const TilePos pos = tile_pos<Cfg>();
  if (a.member_rows && pos.row == i64(gridDim.x) - 1) {
    fill_empty_members<Cfg, S...>(a, pos.col);
    return;
  }
  Member mem;
  i64 scale_base[kMaxStreams];
  if (!resolve_member<Cfg, S...>(a, pos.row, mem, scale_base)) return;
  const i64 col0 = pos.col * Cfg::kTileCols;

  constexpr int kTileFloats = Cfg::kTileRows * Cfg::kTileCols;
  static_assert(kPairOnlySmemBytes<Cfg, S...> != 0 && kLaunch == TileLaunch::kCast ? kPairOnlySmemBytes<Cfg, S...> == Cfg::kSmemBytes :
                cast_smem_bytes(Cfg::kTileRows, Cfg::kTileCols, Cfg::kRht,
                                (0 + ... + cast_scratch_entries(Cfg::kTileRows, Cfg::kTileCols, S::kDir == 1, S::kTransposed,
                                                                S::kEpt, S::kBlock2d, S::kBlockRows, S::kBlockCols,
                                                                StoreBits<typename S::Format>::value,
                                                                S::kMode == kModeChannel, kByteEntries<S>)),
                                Cfg::kStage16) == Cfg::kSmemBytes,
                "shared memory as the host sized it");
  static_assert(!Cfg::kStage16 || Cfg::kInDtype != 0, "16-bit staging of a 16-bit input");
  extern __shared__ float4 smem4[];
  TileElem<Cfg>* tile = reinterpret_cast<TileElem<Cfg>*>(smem4);
  TileElem<Cfg>* rtile = Cfg::kRht ? tile + kTileFloats : tile;
  const i64 row0 = mem.tile_row * Cfg::kTileRows;
  const bool full = kInteriorOnly<Cfg> || (row0 + Cfg::kTileRows <= mem.rows && col0 + Cfg::kTileCols <= a.k && a.k % 16 == 0);
  // The rotated copy, unless every RHT stream rotates in registers on this tile.
  constexpr bool kAllRhtInRegisters = ((!S::kRht || kRhtInRegisters<S>) && ...);
  // The paths of interior tiles other than the staged one below belong to the separate form's own
  // cast kernel (cast_kernel): the kernel that serves both forms stages every tile, as the
  // one-launch form must, because one kernel holding both paths took the registers of both
  // (compiler/codegen.cpp own_fused_kernel; docs/jit.md).
  // Plans of 16-bit identity copies only (cast_copy.cuh): interior tiles move the input's bits.
  if constexpr (kLaunch == TileLaunch::kCast && kCopyPlan<Cfg, S...>) {
    if (full && (CopyPlan<Cfg, S...>::kTransposedStreams == 0 || (kInteriorOnly<Cfg> || mem.rows % 16 == 0))) {
      cast_copy_full<Cfg, S...>(a, mem, col0, reinterpret_cast<u8*>(smem4));
      return;
    }
  }
  // A plan of one rowwise stream with 1D blocks (or none) and no RHT (inference) casts interior
  // tiles straight from global memory: no staging (but mn_major MX entries), no barrier.
  if constexpr (kLaunch == TileLaunch::kCast && sizeof...(S) == 1 &&
                (((kWholeBlockRows<S> && !S::kBlock2d) || kRowwiseDirect<Cfg, S>) && ...)) {
    if (full) {
      (
          [&] {
            if constexpr (kWholeBlockRows<S>) {
              cast_rowwise_blocks<Cfg, S, true>(a, mem, col0, nullptr, nullptr, scale_base[0]);
            } else {
              store_tensor_entry<Cfg, S>(a, mem, col0, scale_base[0]);
              const float reported = cast_rowwise_direct<Cfg, S>(a, mem, col0, scale_base[0]);
              if constexpr (S::kMode == kModeTensorDelayed)
                block_max_atomic<Cfg::kThreads>(a.amax[S::kTensorAmax] + mem.index, reported);
            }
          }(),
          ...);
      return;
    }
  }
  if constexpr (kLaunch == TileLaunch::kCast && sizeof...(S) == 2) {
    if constexpr (kPairRegisters<Cfg, S...>) {
      if (full && (kInteriorOnly<Cfg> || mem.rows % 16 == 0)) {
        cast_pair_registers<Cfg, S...>(a, mem, col0, scale_base[0], scale_base[1]);
        return;
      }
    }
  }
  // Fused: one launch instead of memset(amax / workspace) [+ amax kernel] + cast kernel. CTA 0
  // has zeroed the amax outputs, and the CTAs of tile column 0 / tile row 0 their rows' /
  // columns' channel amaxes, before they arrive at a first grid barrier; every CTA waits there
  // only before its first atomic on them (its tile load and its part of the pre-pass tensor
  // amaxes happen meanwhile). With a pre-pass, a second barrier: after it every CTA reads the
  // amaxes complete.
  u32 ticket = 0;
  if constexpr (kMayFuse) {
    if (fused) {
      Pre::template zero_channels<Cfg>(a, row0, col0);
      ticket = grid_arrive();
    }
  }
  load_tile<Cfg>(a, mem, col0, full, tile, rtile, !(kAllRhtInRegisters && full && (kInteriorOnly<Cfg> || mem.rows % 16 == 0)));
  if constexpr (kMayFuse) {
    if (fused) {
      if constexpr (Pre::kSources > 0) {
        Pre::template reduce<Cfg>(a, tile, row0, col0, ticket);
        grid_wait(grid_arrive());
      } else {
        grid_wait(ticket);
      }
    }
  }

  // Shared scratch, one region per stream (cast_scratch_entries): 2D block amaxes first (all
  // streams), then each stream.
  float* region = reinterpret_cast<float*>(tile + kTileFloats * (Cfg::kRht ? 2 : 1));  // 16-byte aligned
  float* regions[sizeof...(S)];
  int s = 0;
  (
      [&] {
        regions[s++] = region;
        if constexpr (S::kBlock2d) block2d_amax<Cfg, S>(S::kRht ? rtile : tile, reinterpret_cast<u32*>(region));
        region += cast_scratch_entries(Cfg::kTileRows, Cfg::kTileCols, S::kDir == 1, S::kTransposed, S::kEpt, S::kBlock2d,
                                       S::kBlockRows, S::kBlockCols, StoreBits<typename S::Format>::value,
                                       S::kMode == kModeChannel, kByteEntries<S>);
      }(),
      ...);
  __syncthreads();
  // Delayed scaling: the first stream reporting into an amax slot reports (a second one would
  // reduce the same tile again).
  bool reported[kMaxAmaxSlots] = {};
  s = 0;
  (
      [&] {
        bool report = false;
        if constexpr (S::kMode == kModeTensorDelayed) {
          report = !reported[S::kTensorAmax];
          reported[S::kTensorAmax] = true;
        }
        cast_stream<Cfg, S>(a, mem, col0, full, tile, rtile, regions[s], scale_base[s], report);
        ++s;
      }(),
      ...);
}

}  // namespace detail
}  // namespace qf
