// Interior tiles of plans whose every stream is an identity copy in the input's own 16-bit dtype
// (bf16 -> bf16, fp16 -> fp16; int8_weight_sr's activations and gradients): the copies move the
// input's bits, never widened to fp32 and narrowed back (docs/numerics.md: the same bits, a NaN
// becoming sign | 0x7FC0 / sign | 0x7E00). Per thread: its 16-byte input chunks loaded together;
// one NaN test over them (a NaN-propagating 16x2 max per word), and only where it finds one the
// word-wise fix (identity16x2); rowwise and same-layout copies stored from those registers; a
// transposed copy through the staged tile: one 32-bit read gives two columns of one row, two
// rows' words regroup into one word of each column with a byte permute, written to the staged
// output and copied out in whole 16-byte units of each output row, as the transposed streams do
// (cast_columnwise.cuh). Edge tiles take the generic paths (cast_tile.cuh), element by element.
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_load.cuh"
#include "qforge/cast_schedule.cuh"
#include "qforge/cast_smem.cuh"
#include "qforge/numerics.cuh"

namespace qf {
namespace detail {

// The output dtype of an identity format, -1 for the other formats.
template <class F>
struct IdentityDtype {
  static constexpr int value = -1;
};
template <int D>
struct IdentityDtype<Identity<D>> {
  static constexpr int value = D;
};

// A stream that copies the 16-bit input as it is (up to the NaN rule).
template <class Cfg, class S>
constexpr bool kRawCopy16 = IdentityDtype<typename S::Format>::value == int(Cfg::kInDtype) && Cfg::kInDtype != 0 &&
                            S::kMode == kModeNone && !S::kRht;

template <class Cfg, class... S>
struct CopyPlan {
  static constexpr int kTransposedStreams = (0 + ... + int(S::kTransposed));
  static constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads, RS = transposed_stage_stride(TR, 16);
  // The staged tile (16 bits an element) and, after it, the staged transposed output.
  static constexpr u32 kSmemUsed = kTransposedStreams ? u32(2 * TR * TC + TC * RS) : 0u;
  static constexpr bool value = (kRawCopy16<Cfg, S> && ...) && kTransposedStreams <= 1 && kSmemUsed <= Cfg::kSmemBytes &&
                                (kTransposedStreams == 0 || (TR % 16 == 0 && TC % 64 == 0 && T % (TC / 2) == 0 &&
                                                             ((TC / 2) * (TR / 16)) % T == 0 && (TC * TR / 8) % T == 0));
};
template <class Cfg, class... S>
constexpr bool kCopyPlan = CopyPlan<Cfg, S...>::value;

// Running NaN test of 16x2 words: a NaN-propagating max (one instruction per word on sm_80+);
// elsewhere the OR of identity16x2_nan_bits. copy_has_nan says whether any word had a NaN.
template <int D>
__device__ __forceinline__ u32 copy_nan_step(u32 acc, u32 w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u32 r;
  if constexpr (D == 1) asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(acc), "r"(w));
  else asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(acc), "r"(w));
  return r;
#else
  return acc | identity16x2_nan_bits<D>(w);
#endif
}
template <int D>
__device__ __forceinline__ bool copy_has_nan(u32 acc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return identity16x2_nan_bits<D>(acc) != 0;
#else
  return acc != 0;
#endif
}

// The transposed copy of the staged tile (16-bit, tile_off's swizzle): one item is two adjacent
// columns (2p, 2p + 1) of one 16-row group, lanes on consecutive column pairs of the same rows
// (32-bit reads of one half row: 32 banks). Rows 2j and 2j + 1 of the item's words give column
// 2p's word (bytes 0, 1 of each: 0x5410) and column 2p + 1's (0x7632). Every fourth group of
// four lanes writes its two staged rows in the other order (2p + 1 first), so that the 16-byte
// stores of eight consecutive lanes fall on eight distinct bank groups (a staged row is 68
// words: 4 mod 32).
template <class Cfg, class S>
__device__ __forceinline__ void copy_transposed_full(const QuantizeArgs& a, const Member& mem, i64 col0, const u16* tile,
                                                     u8* stage) {
  using CP = CopyPlan<Cfg, S>;
  constexpr int TR = CP::TR, TC = CP::TC, T = CP::T, RS = CP::RS, P = TC / 2, N = P * (TR / 16);
  const int p = int(threadIdx.x % P), g0 = int(threadIdx.x / P);
  const int swap = (p >> 2) & 1;
  const u32 sel_first = swap ? 0x7632u : 0x5410u, sel_second = swap ? 0x5410u : 0x7632u;
  u8* first_row = stage + (2 * p + swap) * RS;
  u8* second_row = stage + (2 * p + 1 - swap) * RS;
  int xo[8];  // the column pair's offset in a row r with r % 8 == e (tile_off)
#pragma unroll
  for (int e = 0; e < 8; ++e) xo[e] = tile_off<TC>(e, 2 * p) - e * TC;
#pragma unroll
  for (int it = 0; it < N / T; ++it) {
    const int r0 = 16 * (it * (T / P) + g0);
    u32 w[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) w[e] = *reinterpret_cast<const u32*>(tile + (r0 + e) * TC + xo[e % 8]);
    u32 f[8], s[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      f[j] = __byte_perm(w[2 * j], w[2 * j + 1], sel_first);
      s[j] = __byte_perm(w[2 * j], w[2 * j + 1], sel_second);
    }
    uint4* fd = reinterpret_cast<uint4*>(first_row + r0 * 2);
    uint4* sd = reinterpret_cast<uint4*>(second_row + r0 * 2);
    fd[0] = make_uint4(f[0], f[1], f[2], f[3]);
    fd[1] = make_uint4(f[4], f[5], f[6], f[7]);
    sd[0] = make_uint4(s[0], s[1], s[2], s[3]);
    sd[1] = make_uint4(s[4], s[5], s[6], s[7]);
  }
  __syncthreads();
  // Copy-out: 16-byte units, consecutive lanes on consecutive units of one output row (every
  // output row of the tile starts at a multiple of 16 elements: mem.rows % 16 == 0).
  constexpr int UPR = TR * 2 / 16, NU = TC * UPR;
  const i64 tile_lin = mem.row_base * a.k + col0 * mem.rows + mem.tile_row * TR;
  u8* dst = static_cast<u8*>(a.streams[S::kIndex].data) + tile_lin * 2;
  const i64 row_bytes = mem.rows * 2;
#pragma unroll
  for (int it = 0; it < NU / T; ++it) {
    int c, u;
    item_rc<UPR, T>(it, c, u);
    *reinterpret_cast<uint4*>(dst + c * row_bytes + u * 16) = *reinterpret_cast<const uint4*>(stage + c * RS + u * 16);
  }
}

// One interior tile of a copy plan (kCopyPlan; mem.rows % 16 == 0 when a stream is transposed).
// `smem`: the kernel's shared memory; the staged tile at its start, the staged transposed output
// after it (CopyPlan::kSmemUsed).
template <class Cfg, class... S>
__device__ void cast_copy_full(const QuantizeArgs& a, const Member& mem, i64 col0, u8* smem) {
  using TCh = TileChunks<Cfg>;
  using CP = CopyPlan<Cfg, S...>;
  constexpr int D = Cfg::kInDtype, TC = Cfg::kTileCols, T = Cfg::kThreads, E = TCh::E, CH = TCh::CH, N = TCh::N;
  constexpr int kIters = TCh::kIters;
  uint4 raw[kIters];
  load_chunks_full<Cfg>(a, mem, col0, raw);
  u32 acc = 0;  // chunks past the tile's end are zeros
#pragma unroll
  for (int it = 0; it < kIters; ++it)
    acc = copy_nan_step<D>(copy_nan_step<D>(copy_nan_step<D>(copy_nan_step<D>(acc, raw[it].x), raw[it].y), raw[it].z), raw[it].w);
  if (copy_has_nan<D>(acc)) {
#pragma unroll
    for (int it = 0; it < kIters; ++it)
      raw[it] = make_uint4(identity16x2<D>(raw[it].x), identity16x2<D>(raw[it].y), identity16x2<D>(raw[it].z),
                           identity16x2<D>(raw[it].w));
  }
  int r0, c0;
  item_rc<CH, T>(0, r0, c0);
  const i64 first = (mem.row_base + mem.tile_row * Cfg::kTileRows + r0) * a.k + col0 + c0 * E;  // element of item 0
  // Rowwise and same-layout columnwise copies ([M, K]): the chunks as they were loaded.
  (
      [&] {
        if constexpr (!S::kTransposed) {
          char* out = static_cast<char*>(a.streams[S::kIndex].data) + first * 2;
#pragma unroll
          for (int it = 0; it < kIters; ++it) {
            int r, c;
            item_rc<CH, T>(it, r, c);
            if (!item_past_end<N, T>(it)) *reinterpret_cast<uint4*>(out + (i64(r - r0) * a.k + (c - c0) * E) * 2) = raw[it];
          }
        }
      }(),
      ...);
  if constexpr (CP::kTransposedStreams > 0) {
    u16* tile = reinterpret_cast<u16*>(smem);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      int r, c;
      item_rc<CH, T>(it, r, c);
      c *= E;
      if (!item_past_end<N, T>(it)) {  // two chunks of four
        *reinterpret_cast<uint2*>(tile + tile_off<TC>(r, c)) = make_uint2(raw[it].x, raw[it].y);
        *reinterpret_cast<uint2*>(tile + tile_off<TC>(r, c + 4)) = make_uint2(raw[it].z, raw[it].w);
      }
    }
    __syncthreads();
    u8* stage = smem + 2 * CP::TR * CP::TC;
    (
        [&] {
          if constexpr (S::kTransposed) copy_transposed_full<Cfg, S>(a, mem, col0, tile, stage);
        }(),
        ...);
  }
}

}  // namespace detail
}  // namespace qf
