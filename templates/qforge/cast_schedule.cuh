// Where a CTA of the quantize kernels works: the member of a (possibly grouped) input its tile
// row lies in and each stream's scale-grid base for that member, the order in which CTAs take
// tiles (tile_pos), and the grid-wide barrier of a cooperative launch (fused_kernel).
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_smem.cuh"
#include "qforge/layout.cuh"

namespace qf {
namespace detail {

// Where one member of the (possibly grouped) input lives.
struct Member {
  int index;      // member number (0 for a single tensor)
  i64 row_base;   // first row of x
  i64 rows;       // rows of this member
  i64 tile_row;   // this CTA's tile row within the member
};

// A program compiled for calls whose every tile is interior (codegen Tiles::Interior: a single
// tensor, M and K multiples of the tile and of 16, which the host checks before it picks one)
// defines Cfg::kInteriorOnly = true: the kernels' interior-tile and whole-16-row tests are then
// constants and the edge paths are not compiled. Other programs do not define it (their source
// is unchanged). Each test is written `kInteriorOnly<Cfg> || (its expression)` in place: a helper
// function, or a non-const flag set under `if constexpr`, moved other programs' SASS.
template <class Cfg, class = void>
struct InteriorOnly {
  static constexpr bool value = false;
};
template <class Cfg>
struct InteriorOnly<Cfg, decltype(void(Cfg::kInteriorOnly))> {
  static constexpr bool value = Cfg::kInteriorOnly;
};
template <class Cfg>
constexpr bool kInteriorOnly = InteriorOnly<Cfg>::value;

// Tiles of a tile row (consecutive columns) the amax pre-pass reads as one segment:
// Cfg::kAmaxTiles where codegen defines it (per-channel row + transposed pairs on 128-column
// tiles, whose pre-pass CTAs take several segments of a tile row, so that a row takes one atomic
// per CTA: KernelSource::amax_tiles), else 1 (one tile per CTA).
template <class Cfg, class = void>
struct AmaxTiles {
  static constexpr int value = 1;
};
template <class Cfg>
struct AmaxTiles<Cfg, decltype(void(Cfg::kAmaxTiles))> {
  static constexpr int value = int(Cfg::kAmaxTiles);
};
template <class Cfg>
constexpr int kAmaxTiles = AmaxTiles<Cfg>::value;

// Scale grid of a stream for a member whose data is [R, C] (data-layout coordinates).
template <class S>
__device__ __forceinline__ void scale_grid(i64 R, i64 C, i64& rows, i64& cols, i64& prows, i64& pcols) {
  rows = S::kEntryRows ? i64(ceil_div(u64(R), u64(S::kEntryRows))) : 1;
  cols = S::kEntryCols ? i64(ceil_div(u64(C), u64(S::kEntryCols))) : 1;
  prows = S::kSwizzled ? i64(round_up(u64(rows), 128)) : S::kMnMajor ? i64(mn_major_rows(u64(rows))) : rows;
  pcols = S::kSwizzled ? i64(round_up(u64(cols), 4)) : cols;
}

template <class S>
__device__ __forceinline__ i64 scale_grid_size(i64 member_rows, i64 k) {
  if (S::kMode == kModeNone) return 0;
  i64 r, c, pr, pc;
  scale_grid<S>(S::kTransposed ? k : member_rows, S::kTransposed ? member_rows : k, r, c, pr, pc);
  return pr * pc;
}

// This CTA's tile: its row (over all members, plus the extra row of grouped launches) and
// column in the launch grid (x: tile rows, y: tile columns), numbered column-fastest in the order
// the hardware dispatches CTAs (x fastest). CTAs that run at the same time then cover whole rows
// of the input: rowwise scale entries (8 bytes of a 32-byte sector per tile) have their sectors
// completed while still in L2, where row-fastest order left a sector's pieces a whole column
// sweep apart (at 65536 x 7168 more than L2 holds). H100, bf16: MXFP8 rowwise 81 -> 100 % of
// copy bandwidth at 65536 x 7168 and 93 -> 99.5 % at 16384^2, MXFP8 row + columnwise 87 -> 96 %,
// per-tensor delayed rowwise 96 -> 99 %. Plans with Cfg::kRowFastest (codegen: a transposed copy
// of 16-bit or wider elements) keep the grid's own row-fastest order: their bf16 passthrough +
// transpose measured 592 us row-fastest against 872 us column-fastest at 16384^2.
struct TilePos {
  i64 row, col;
};
//
// kReversed walks the same tiles last to first: the amax pre-pass of a two-pass plan takes them
// so, and the cast kernel after it starts on the tiles the pre-pass read last, which are still in
// L2 (up to its 50 MB on an H100) instead of the ones read first, long evicted.
template <class Cfg, bool kReversed = false>
__device__ __forceinline__ TilePos tile_pos() {
  // Forward row-fastest is the grid's own order: no division (one made ptxas spill in a cast).
  if constexpr (Cfg::kRowFastest && !kReversed) return TilePos{i64(blockIdx.x), i64(blockIdx.y)};
  const TileRc t = cta_tile(u64(blockIdx.y) * gridDim.x + blockIdx.x, gridDim.x, gridDim.y, Cfg::kRowFastest, kReversed);
  return TilePos{i64(t.row), i64(t.col)};
}

// Resolves the member of tile row `tile` (tile_pos); computes each stream's scale-grid base (in
// entries) for it.
template <class Cfg, class... S>
__device__ bool resolve_member(const QuantizeArgs& a, i64 tile, Member& mem, i64 (&scale_base)[kMaxStreams]) {
  __shared__ i64 sh[4 + kMaxStreams];
  if (!a.member_rows) {
    mem = Member{0, 0, a.m, tile};
    for (int s = 0; s < kMaxStreams; ++s) scale_base[s] = 0;
    return tile * Cfg::kTileRows < a.m;
  }
  if (threadIdx.x == 0) {
    i64 tiles = 0, bases[kMaxStreams] = {};
    sh[0] = -1;
    for (int g = 0; g < a.num_members; ++g) {
      const i64 r0 = a.member_rows[g], mg = a.member_rows[g + 1] - r0;
      const i64 t = i64(ceil_div(u64(mg), u64(Cfg::kTileRows)));
      if (tile < tiles + t) {
        sh[0] = g, sh[1] = r0, sh[2] = mg;
        sh[3] = tile - tiles;
        for (int s = 0; s < kMaxStreams; ++s) sh[4 + s] = bases[s];
        break;
      }
      tiles += t;
      int s = 0;
      ((bases[s] += scale_grid_size<S>(mg, a.k), ++s), ...);
    }
  }
  __syncthreads();
  if (sh[0] < 0) return false;
  mem = Member{int(sh[0]), sh[1], sh[2], sh[3]};
  for (int s = 0; s < kMaxStreams; ++s) scale_base[s] = sh[4 + s];
  return true;
}

// Grid-wide barrier of a cooperative launch (fused_kernel), in two halves so that a CTA can
// arrive early and wait late. The driver gives every cooperative launch a workspace whose address
// is in %envreg1 (high half) and %envreg2 (low half): a u32 size, then a u32 barrier word that
// starts at zero. Each CTA adds 1, except CTA 0, which adds 2^31 - (CTAs - 1): once all have
// arrived the word has grown by exactly 2^31, so its top bit has flipped (and its low bits are
// back where they were, ready for the next barrier). Arrival is a release, the polling load an
// acquire, both at GPU scope: what any CTA wrote before arriving is visible to every CTA after
// its wait. Thread 0 arrives and waits; the value grid_arrive returns is its ticket.
__device__ __forceinline__ u32* grid_barrier_word() {
  u32 hi, lo;
  asm volatile("mov.u32 %0, %%envreg1;" : "=r"(hi));
  asm volatile("mov.u32 %0, %%envreg2;" : "=r"(lo));
  return reinterpret_cast<u32*>((u64(hi) << 32) | lo) + 1;
}

__device__ __forceinline__ u32 grid_arrive() {
  __syncthreads();
  u32 old = 0;
  if (threadIdx.x == 0) {
    u32* word = grid_barrier_word();
    const u32 ctas = gridDim.x * gridDim.y * gridDim.z;
    const u32 add = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 ? 0x80000000u - (ctas - 1) : 1u;
    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(word), "r"(add) : "memory");
  }
  return old;
}

__device__ __forceinline__ void grid_wait(u32 ticket) {
  if (threadIdx.x == 0) {
    const u32* word = grid_barrier_word();
    u32 now;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(word) : "memory");
    } while (((ticket ^ now) & 0x80000000u) == 0);
    __threadfence();
  }
  __syncthreads();
}

}  // namespace detail
}  // namespace qf
