// The fused quantize kernels. Generated code (compiler/codegen.cpp) defines one config struct
// for the plan and one per stream / per amax reduction, with named constants, and names the
// kernel templates below; everything else is here, as ordinary CUDA.
//
//   amax_kernel<Cfg, A...>  - phase 0 when the plan needs global reductions first: the tensor
//                             amax (raw or after RHT) and per-channel amaxes.
//   cast_kernel<Cfg, S...>  - the cast: one read of each input tile into shared memory, then
//                             every stream S (rowwise / columnwise, any format) written from it.
//
// A tile is kTileRows x kTileCols of the input, staged once in shared memory as fp32 (rows of
// 16-byte chunks, XOR-swizzled by row so that both row and column walks are free of bank
// conflicts). A stream walks the tile in "runs":
//   rowwise      - kEpt (= 4) consecutive elements of one row per thread, one 16-byte smem read
//                  and one vector store; kGroup consecutive lanes whose runs share one scale
//                  block reduce its amax with shuffles;
//   columnwise   - kEpt consecutive rows of one column per thread (one scale block along M, or
//                  16 rows without blocks), lanes on consecutive columns; a transposed stream
//                  writes each 16-row chunk of the run as one vector store into its output row.
// Inputs are read with 8- or 16-byte loads, fp8 is encoded with the hardware cvt on sm_89+
// (bit-identical to the software encoder, checked exhaustively by the GPU tests), stochastic
// rounding draws one Philox call per 4 elements. Scales come from docs/numerics.md through
// numerics.cuh, the same functions the CPU reference runs.
#pragma once
#include "qforge/args.cuh"
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

namespace qf {

// Scaling modes, in the order of the Scaling variant of compiler/formats.h.
enum ScaleMode : int {
  kModeNone = 0,
  kModeTensorCurrent = 1,
  kModeTensorDelayed = 2,
  kModeChannel = 3,
  kModeBlock = 4,
  kModeMx = 5,
  kModeNvfp4 = 6,
};

enum AmaxScopeCode : int { kScopeTensor = 0, kScopeChannelRows = 1, kScopeChannelCols = 2 };

// Identity (high-precision passthrough) "format": D is the output dtype code (numerics.cuh:
// 0 fp32, 1 bf16, 2 fp16).
template <int D>
struct Identity {
  static constexpr int kBits = D == 0 ? 32 : 16;
  static constexpr int kDtype = D;
};
template <class F> struct is_identity { static constexpr bool value = false; };
template <int D> struct is_identity<Identity<D>> { static constexpr bool value = true; };

// Shared-memory bytes of cast_kernel (also computed by the host code generator).
QF_HD constexpr u32 cast_smem_bytes(int tile_rows, int tile_cols, bool rht, int block2d_entries) {
  return 4u * u32(tile_rows) * u32(tile_cols) * (rht ? 2u : 1u) + 4u * u32(block2d_entries);
}

#if defined(__CUDACC__)

namespace detail {

// --------------------------------------------------------------------------------- tile layout

// Float offset of tile element (r, c): rows of TC floats, 16-byte chunks XOR-swizzled by r % 8.
// Row walks (16-byte reads of consecutive chunks) and column walks (lanes on 32 consecutive
// columns) both hit 32 distinct banks.
template <int TC>
__device__ __forceinline__ int tile_off(int r, int c) {
  static_assert(TC % 32 == 0, "a tile row holds a multiple of 8 chunks");
  return r * TC + ((((c >> 2) ^ (r & 7))) << 2) + (c & 3);
}

__device__ __forceinline__ float round_to_dtype(float v, int dtype) {
  if (dtype == 1) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == 2) return f16_to_f32(f32_to_f16(v));
  return v;
}

// Four consecutive input elements; idx is 4-aligned (8- or 16-byte load).
template <int D>
__device__ __forceinline__ float4 load4(const void* x, i64 idx) {
  if constexpr (D == 0) {
    return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(x) + idx));
  } else {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(static_cast<const u16*>(x) + idx));
    const u16 h[4] = {u16(u.x), u16(u.x >> 16), u16(u.y), u16(u.y >> 16)};
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = D == 1 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
    return make_float4(f[0], f[1], f[2], f[3]);
  }
}

template <int D>
__device__ __forceinline__ float load1(const void* x, i64 idx) {
  if constexpr (D == 0) return static_cast<const float*>(x)[idx];
  const u16 h = static_cast<const u16*>(x)[idx];
  return D == 1 ? bf16_to_f32(h) : f16_to_f32(h);
}

// ---------------------------------------------------------------------------------- encoders

// fp32 -> format, round to nearest even: the same bits as encode_rn<F> (numerics.cuh), with the
// hardware conversion where one exists. cvt.rn.satfinite gives +-max for +-Inf and for values
// above max; NaN is forced to the documented 0x7F.
template <class F>
__device__ __forceinline__ u32 enc_rn(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (F::kBits == 8 && !F::kIsInt && F::kExpBits == 4) {
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    return f32_is_nan(x) ? u32(F::kNanBits) : u32(r & 0xFF);
  } else if constexpr (F::kBits == 8 && !F::kIsInt && F::kExpBits == 5) {
    u16 r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
    return f32_is_nan(x) ? u32(F::kNanBits) : u32(r & 0xFF);
  }
#endif
  if constexpr (F::kBits == 4 && F::kExpBits == 2 && F::kManBits == 1) {
    // e2m1: 8 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; the comparisons place |x| between the
    // midpoints, ties going to the even code. NaN -> +max (no sign), as encode_rn.
    const u32 b = f32_bits(x), ab = b & kF32AbsMask;
    if (ab > kF32InfBits) return F::kNanBits;
    const float a = f32_from_bits(ab);
    const u32 m = u32(a > 0.25f) + u32(a >= 0.75f) + u32(a > 1.25f) + u32(a >= 1.75f) + u32(a > 2.5f) +
                  u32(a >= 3.5f) + u32(a > 5.0f);
    return ((b >> 28) & 0x8u) | m;
  } else {
    return encode_rn<F>(x);
  }
}

// Stochastic rounding, fast paths with the exact result of encode_sr<F> (numerics.cuh): for
// e2m1 and int8 the grid step is a power of two, so q = |x| / step, its floor and fraction are
// exact in fp32 and "fraction > u" with u = (r >> 8) * 2^-24 is the same comparison as the
// integer one of grid_round_sr. Other formats use the generic encoder.
template <class F>
__device__ __forceinline__ u32 enc_sr(float x, u32 r) {
  if constexpr (F::kBits == 4 && F::kExpBits == 2 && F::kManBits == 1) {
    const u32 b = f32_bits(x), ab = b & kF32AbsMask;
    if (ab > kF32InfBits) return F::kNanBits;
    const float a = f32_from_bits(ab), u = float(r >> 8) * 0x1p-24f;
    u32 m;
    if (!(a < 6.0f)) {
      m = 7;  // max, or Inf (saturated)
    } else {
      // Step 0.5 below 2 (codes 0..4 = q), 1 in [2, 4) (code = q + 2), 2 in [4, 6) (code = q + 4).
      const float inv_step = a < 2.0f ? 2.0f : a < 4.0f ? 1.0f : 0.5f;
      const float q = a * inv_step, lo = floorf(q);
      m = u32(lo) + (a < 2.0f ? 0u : a < 4.0f ? 2u : 4u) + ((q - lo) > u ? 1u : 0u);
    }
    return ((b >> 28) & 0x8u) | m;
  } else if constexpr (F::kIsInt && F::kBits == 8) {
    if (f32_is_nan(x)) return F::kNanBits;
    if (x >= 127.0f) return 127u;
    if (x <= -128.0f) return 0x80u;
    const float a = fabsf(x), lo = floorf(a), u = float(r >> 8) * 0x1p-24f;
    u32 q = u32(lo) + ((a - lo) > u ? 1u : 0u);
    if (x < 0.0f) return (0u - q) & 0xFFu;
    return q > 127u ? 127u : q;
  } else {
    return encode_sr<F>(x, r);
  }
}

// Encodes and stores N consecutive elements of one output row, x already multiplied by their
// scale (identity formats: the raw values). `lin` is the first element's offset in the
// stream's data buffer, which is also its stochastic-rounding index; the first `valid` are
// stored. Full, aligned runs take one vector store of N * bits / 8 bytes.
template <class S, int N>
__device__ __forceinline__ void encode_store(const QuantizeArgs& a, void* data, i64 lin, const float (&x)[N], int valid) {
  using F = typename S::Format;
  static_assert(N % 4 == 0 && N <= 16, "runs of 4, 8 or 16");
  if constexpr (is_identity<F>::value) {
    if constexpr (F::kDtype == 0) {
      float* o = static_cast<float*>(data) + lin;
      if (valid == N && lin % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) *reinterpret_cast<float4*>(o + i) = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i)
          if (i < valid) o[i] = x[i];
      }
    } else {
      u16* o = static_cast<u16*>(data) + lin;
      u32 h[N];
#pragma unroll
      for (int i = 0; i < N; ++i) h[i] = F::kDtype == 1 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
      if (valid == N && lin % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) *reinterpret_cast<uint2*>(o + i) = make_uint2(h[i] | (h[i + 1] << 16), h[i + 2] | (h[i + 3] << 16));
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i)
          if (i < valid) o[i] = u16(h[i]);
      }
    }
  } else {
    u32 q[N];
    if constexpr (S::kStochastic) {
      if (lin % 4 == 0) {
#pragma unroll
        for (int g = 0; g < N; g += 4) {
          u32 w[4];
          sr_random_group(a.seed, a.offset, u32(S::kDir), u64(lin + g) >> 2, w);
#pragma unroll
          for (int i = 0; i < 4; ++i) q[g + i] = enc_sr<F>(x[g + i], w[i]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i)
          q[i] = i < valid ? enc_sr<F>(x[i], sr_random_bits(a.seed, a.offset, u32(S::kDir), u64(lin + i))) : 0u;
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) q[i] = enc_rn<F>(x[i]);
    }
    constexpr int kPerByte = F::kBits == 4 ? 2 : 1, NB = N / kPerByte;
    u32 bytes[NB];
#pragma unroll
    for (int i = 0; i < NB; ++i) {
      if constexpr (kPerByte == 2) {
        // Element 2i in the low nibble. lin is even (check_shape: packed rows are even), so
        // the pairs are this run's own.
        bytes[i] = (q[2 * i] & 0xFu) | ((2 * i + 1 < valid ? q[2 * i + 1] & 0xFu : 0u) << 4);
      } else {
        bytes[i] = q[i] & 0xFFu;
      }
    }
    u8* o = static_cast<u8*>(data) + lin / kPerByte;
    if (valid == N && lin % N == 0) {
      u32 w[(NB + 3) / 4] = {};
#pragma unroll
      for (int i = 0; i < NB; ++i) w[i / 4] |= bytes[i] << (8 * (i % 4));
      if constexpr (NB == 2) *reinterpret_cast<u16*>(o) = u16(w[0]);
      else if constexpr (NB == 4) *reinterpret_cast<u32*>(o) = w[0];
      else if constexpr (NB == 8) *reinterpret_cast<uint2*>(o) = make_uint2(w[0], w[1]);
      else *reinterpret_cast<uint4*>(o) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
      for (int i = 0; i < NB; ++i)
        if (kPerByte * i < valid) o[i] = u8(bytes[i]);
    }
  }
}

// ------------------------------------------------------------------------------- reductions

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

// ---------------------------------------------------------------------------------- members

// Where one member of the (possibly grouped) input lives.
struct Member {
  int index;      // member number (0 for a single tensor)
  i64 row_base;   // first row of x
  i64 rows;       // rows of this member
  i64 tile_row;   // this CTA's tile row within the member
};

// Scale grid of a stream for a member whose data is [R, C] (data-layout coordinates).
template <class S>
__device__ __forceinline__ void scale_grid(i64 R, i64 C, i64& rows, i64& cols, i64& prows, i64& pcols) {
  rows = S::kEntryRows ? i64(ceil_div(u64(R), u64(S::kEntryRows))) : 1;
  cols = S::kEntryCols ? i64(ceil_div(u64(C), u64(S::kEntryCols))) : 1;
  prows = S::kSwizzled ? i64(round_up(u64(rows), 128)) : rows;
  pcols = S::kSwizzled ? i64(round_up(u64(cols), 4)) : cols;
}

template <class S>
__device__ __forceinline__ i64 scale_grid_size(i64 member_rows, i64 k) {
  if (S::kMode == kModeNone) return 0;
  i64 r, c, pr, pc;
  scale_grid<S>(S::kTransposed ? k : member_rows, S::kTransposed ? member_rows : k, r, c, pr, pc);
  return pr * pc;
}

// Tile order: tiles are visited in bands of kBandRows tile rows, column by column inside a
// band, so the CTAs resident at one time cover a few hundred consecutive input rows (long
// contiguous reads) and, for a transposed output, a band of kBandRows * kTileRows consecutive
// elements of many output rows. Walk index t -> band t / (kBandRows * tiles_c) by the host's
// precomputed divisor (QuantizeArgs::band_div), then shifts; tile rows past the last one
// (the last band is padded to kBandRows) are skipped by the walk.
__device__ __forceinline__ void tile_coords(u32 t, const FastDiv& band_div, u32& tr, u32& tc) {
  const u32 band = band_div.div(t), in_band = t - band * band_div.d;
  tr = band * kBandRows + (in_band % kBandRows);
  tc = in_band / kBandRows;
}

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

// Resolves this CTA's member; computes each stream's scale-grid base (in entries) for it.
template <class Cfg, class... S>
__device__ bool resolve_member(const QuantizeArgs& a, i64 tile_row, Member& mem, i64 (&scale_base)[kMaxStreams]) {
  __shared__ i64 sh[4 + kMaxStreams];
  if (!a.member_rows) {
    mem = Member{0, 0, a.m, tile_row};
    for (int s = 0; s < kMaxStreams; ++s) scale_base[s] = 0;
    return tile_row * Cfg::kTileRows < a.m;
  }
  if (threadIdx.x == 0) {
    i64 tiles = 0, bases[kMaxStreams] = {};
    sh[0] = -1;
    for (int g = 0; g < a.num_members; ++g) {
      const i64 r0 = a.member_rows[g], mg = a.member_rows[g + 1] - r0;
      const i64 t = i64(ceil_div(u64(mg), u64(Cfg::kTileRows)));
      if (tile_row < tiles + t) {
        sh[0] = g, sh[1] = r0, sh[2] = mg;
        sh[3] = tile_row - tiles;
        for (int s = 0; s < kMaxStreams; ++s) sh[4 + s] = bases[s];
        break;
      }
      tiles += t;
      int s = 0;
      ((bases[s] += scale_grid_size<S>(mg, a.k), ++s), ...);
    }
  }
  __syncthreads();
  const bool found = sh[0] >= 0;
  if (found) {
    mem = Member{int(sh[0]), sh[1], sh[2], sh[3]};
    for (int s = 0; s < kMaxStreams; ++s) scale_base[s] = sh[4 + s];
  }
  __syncthreads();  // sh is rewritten by the next call
  return found;
}

// ------------------------------------------------------------------------------------ tiles

// A tile is loaded in two steps so that a persistent CTA can keep the next tile's loads in
// flight while it works on the current one: load_regs issues every global load of this thread
// (16-byte chunks of 4 elements, zero outside the member / K) into registers, store_tile writes
// them to shared memory (fp32) and, with RHT, the rotated copy (16-row groups per column,
// rounded to the input dtype).
template <class Cfg>
struct TileRegs {
  static constexpr int kChunks = Cfg::kTileRows * Cfg::kTileCols / 4;
  static constexpr int kIters = (kChunks + Cfg::kThreads - 1) / Cfg::kThreads;
  float4 v[kIters];
};

template <class Cfg>
__device__ __forceinline__ void load_regs(const QuantizeArgs& a, const Member& mem, i64 col0, TileRegs<Cfg>& regs) {
  constexpr int TC = Cfg::kTileCols, CH = TC / 4, N = TileRegs<Cfg>::kChunks, T = Cfg::kThreads;
  const i64 row0 = mem.tile_row * Cfg::kTileRows;
  const bool vec = a.k % 4 == 0;
#pragma unroll
  for (int it = 0; it < TileRegs<Cfg>::kIters; ++it) {
    const int i = it * T + int(threadIdx.x);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const int r = i / CH, c = (i % CH) * 4;
    const i64 rl = row0 + r, cg = col0 + c;
    if ((N % T == 0 || i < N) && rl < mem.rows) {
      const i64 idx = (mem.row_base + rl) * a.k + cg;
      if (vec && cg + 4 <= a.k) {
        v = load4<Cfg::kInDtype>(a.x, idx);
      } else {
        if (cg + 0 < a.k) v.x = load1<Cfg::kInDtype>(a.x, idx + 0);
        if (cg + 1 < a.k) v.y = load1<Cfg::kInDtype>(a.x, idx + 1);
        if (cg + 2 < a.k) v.z = load1<Cfg::kInDtype>(a.x, idx + 2);
        if (cg + 3 < a.k) v.w = load1<Cfg::kInDtype>(a.x, idx + 3);
      }
    }
    regs.v[it] = v;
  }
}

// Ends with a barrier: the tile (and rotated tile) are readable by every thread.
template <class Cfg>
__device__ __forceinline__ void store_tile(const TileRegs<Cfg>& regs, float* tile, float* rtile) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, CH = TC / 4, N = TileRegs<Cfg>::kChunks, T = Cfg::kThreads;
#pragma unroll
  for (int it = 0; it < TileRegs<Cfg>::kIters; ++it) {
    const int i = it * T + int(threadIdx.x);
    if (N % T == 0 || i < N) *reinterpret_cast<float4*>(tile + tile_off<TC>(i / CH, (i % CH) * 4)) = regs.v[it];
  }
  if constexpr (Cfg::kRht) {
    __syncthreads();
    for (int i = threadIdx.x; i < (TR / 16) * TC; i += T) {
      const int grp = i / TC, c = i % TC;
      float v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) v[j] = tile[tile_off<TC>(grp * 16 + j, c)];
      rht16(v, Cfg::kRhtMask);
#pragma unroll
      for (int j = 0; j < 16; ++j) rtile[tile_off<TC>(grp * 16 + j, c)] = round_to_dtype(v[j], Cfg::kInDtype);
    }
  }
  __syncthreads();
}

// The persistent walk over tiles: CTA b takes walk indices b, b + gridDim.x, ... (tile_coords
// order), skipping padding rows and grouped tiles past the end of their member. Every thread
// calls next() together.
template <class Cfg, class... S>
struct TileWalk {
  u32 t, total;
  __device__ TileWalk(const QuantizeArgs& a) : t(blockIdx.x - gridDim.x), total(u32(a.walk_tiles)) {}
  // Advances to the next tile of this CTA; false at the end.
  __device__ bool next(const QuantizeArgs& a, Member& mem, i64& col0, i64 (&scale_base)[kMaxStreams]) {
    for (t += gridDim.x; t < total; t += gridDim.x) {
      u32 tr, tc;
      tile_coords(t, a.band_div, tr, tc);
      if (tr < a.tile_rows && resolve_member<Cfg, S...>(a, i64(tr), mem, scale_base)) {
        col0 = i64(tc) * Cfg::kTileCols;
        return true;
      }
    }
    return false;
  }
};

// The scale of one block: the element multiplier and the stored scale entry (fp32 bits or a
// byte), from the amaxes the mode depends on.
template <class Cfg, class S>
__device__ __forceinline__ void block_scale(float block_amax, float tensor_amax, float delayed_scale,
                                            float& mul, u32& entry) {
  using F = typename S::Format;
  if constexpr (S::kMode == kModeTensorCurrent || S::kMode == kModeBlock) {
    const float inf_value = S::kMode == kModeBlock ? Cfg::kInMaxFinite : kFltMax;
    const float amax = S::kMode == kModeBlock ? block_amax : tensor_amax;
    const float scale = compute_scale(amax, F::kMaxFinite, S::kEpsilon, S::kPow2, inf_value);
    mul = scale;
    entry = f32_bits(1.0f / scale);
  } else if constexpr (S::kMode == kModeTensorDelayed) {
    mul = delayed_scale;
    entry = f32_bits(1.0f / delayed_scale);
  } else if constexpr (S::kMode == kModeChannel) {
    const float scale = int8_channel_scale(block_amax, Cfg::kInDtype);
    mul = int8_channel_multiplier(scale);
    entry = f32_bits(scale);
  } else if constexpr (S::kMode == kModeMx) {
    const u8 e = S::kMxFloor ? e8m0_floor(block_amax, F::kEmax)
                             : e8m0_rceil(block_amax * (1.0f / F::kMaxFinite));
    mul = mx_multiplier(e);
    entry = e;
  } else if constexpr (S::kMode == kModeNvfp4) {
    const float s_enc = nvfp4_global_encode_scale(tensor_amax);
    const float s_dec = nvfp4_global_decode_scale(s_enc);
    const u8 sb = nvfp4_block_scale(block_amax, s_enc);
    mul = nvfp4_element_multiplier(sb, s_dec);
    entry = sb;
  } else {
    mul = 1.0f;
    entry = 0;
  }
}

template <class S>
__device__ __forceinline__ void store_entry(void* base, i64 off, u32 entry) {
  if constexpr (S::kMode == kModeMx || S::kMode == kModeNvfp4)
    static_cast<u8*>(base)[off] = u8(entry);
  else
    static_cast<u32*>(base)[off] = entry;
}

// Writes the scale entry of the block whose first element is at data-layout (dr, dc), if that
// element starts an entry.
template <class S>
__device__ __forceinline__ void maybe_store_entry(const StreamArgs& out, i64 dr, i64 dc, i64 grid_pcols, i64 scale_base,
                                                  u32 entry) {
  if constexpr (S::kMode != kModeNone) {
    const bool starts = (S::kEntryRows ? dr % S::kEntryRows == 0 : dr == 0) &&
                        (S::kEntryCols ? dc % S::kEntryCols == 0 : dc == 0);
    if (starts) {
      const i64 er = S::kEntryRows ? dr / S::kEntryRows : 0, ec = S::kEntryCols ? dc / S::kEntryCols : 0;
      const i64 off = S::kSwizzled ? i64(swizzled_scale_offset(u64(er), u64(ec), u64(grid_pcols))) : er * grid_pcols + ec;
      store_entry<S>(out.scale_inv, scale_base + off, entry);
    }
  }
}

// 2D block amaxes of a stream over the tile, into shared memory (u32 float bits): per block,
// a strided register reduction, a warp reduction and one shared atomic per warp.
template <class Cfg, class S>
__device__ void block2d_amax(const float* src, u32* out) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, BR = S::kBlockRows, BC = S::kBlockCols;
  constexpr int NBC = TC / BC, NB = (TR / BR) * NBC;
  static_assert(BC % 4 == 0, "2D blocks span whole chunks");
  for (int i = threadIdx.x; i < NB; i += Cfg::kThreads) out[i] = 0;
  __syncthreads();
  for (int b = 0; b < NB; ++b) {
    const int br = (b / NBC) * BR, bc = (b % NBC) * BC;
    float m = 0.0f;
    for (int i = threadIdx.x; i < BR * BC / 4; i += Cfg::kThreads) {
      const int r = br + i / (BC / 4), c = bc + (i % (BC / 4)) * 4;
      const float4 f = *reinterpret_cast<const float4*>(src + tile_off<TC>(r, c));
      m = amax_step(amax_step(amax_step(amax_step(m, f.x), f.y), f.z), f.w);
    }
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) atomicMax(&out[b], f32_bits(m));
  }
}

// -------------------------------------------------------------------------------- streams

// Per-stream values that do not change over the tile.
template <class S>
struct StreamCtx {
  float tensor_amax = 0.0f, delayed_scale = 1.0f;
  i64 grid_pcols = 0;
};

template <class Cfg, class S>
__device__ __forceinline__ StreamCtx<S> stream_ctx(const QuantizeArgs& a, const Member& mem) {
  StreamCtx<S> c;
  if constexpr (S::kTensorAmax >= 0 && S::kMode != kModeTensorDelayed) c.tensor_amax = a.amax[S::kTensorAmax][mem.index];
  if constexpr (S::kMode == kModeTensorDelayed) c.delayed_scale = *a.streams[S::kIndex].scale_in;
  i64 gr, gc, gpr;
  scale_grid<S>(S::kTransposed ? a.k : mem.rows, S::kTransposed ? mem.rows : a.k, gr, gc, gpr, c.grid_pcols);
  return c;
}

template <class S>
struct ModeTraits {
  // Block amax computed by the stream itself (1D blocks along its direction).
  static constexpr bool kOwnBlocks = !S::kBlock2d && (S::kMode == kModeBlock || S::kMode == kModeMx || S::kMode == kModeNvfp4);
  static constexpr bool kIdentity = is_identity<typename S::Format>::value;
};

// Rowwise stream ([M, K] layout): runs of 4 elements of a row (one 16-byte shared read, one
// vector store), kGroup lanes per 1D scale block.
template <class Cfg, class S>
__device__ float cast_rowwise(const QuantizeArgs& a, const Member& mem, i64 col0, const float* src, const u32* bamax,
                              i64 scale_base) {
  constexpr int TC = Cfg::kTileCols, CH = TC / 4, N = Cfg::kTileRows * CH, T = Cfg::kThreads, G = S::kGroup;
  static_assert(S::kEpt == 4 && CH % G == 0 && 32 % G == 0, "rowwise runs: 4 elements, groups within a warp row");
  static_assert(N % 32 == 0, "whole warps of runs");
  using M = ModeTraits<S>;
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * Cfg::kTileRows, data_base = mem.row_base * a.k;
  // Per-tensor and unscaled streams: one multiplier for the whole tile.
  float tile_mul = 1.0f;
  u32 tile_entry = 0;
  if constexpr (!M::kOwnBlocks && !S::kBlock2d && S::kMode != kModeChannel)
    block_scale<Cfg, S>(0.0f, ctx.tensor_amax, ctx.delayed_scale, tile_mul, tile_entry);
  float reported = 0.0f;
  for (int j = threadIdx.x; j < N; j += T) {  // N % 32 == 0: whole warps take part in shuffles
    const int r = j / CH, c = (j % CH) * 4;
    const float4 f = *reinterpret_cast<const float4*>(src + tile_off<TC>(r, c));
    const float v[4] = {f.x, f.y, f.z, f.w};
    const i64 rl = row0 + r, cg = col0 + c;
    const i64 left = a.k - cg;
    const int valid = rl < mem.rows && left > 0 ? int(left < 4 ? left : 4) : 0;
    float mul = tile_mul;
    u32 entry = tile_entry;
    if constexpr (M::kOwnBlocks || S::kBlock2d || S::kMode == kModeChannel || S::kMode == kModeTensorDelayed) {
      const float amax = amax_step(amax_step(amax_step(amax_step(0.0f, v[0]), v[1]), v[2]), v[3]);  // zero padding
      if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);
      float block_amax = amax;
      if constexpr (S::kBlock2d) {
        block_amax = f32_from_bits(bamax[(r / S::kBlockRows) * (TC / S::kBlockCols) + c / S::kBlockCols]);
      } else if constexpr (S::kMode == kModeChannel) {
        block_amax = rl < mem.rows ? a.amax[S::kLocalAmax][mem.row_base + rl] : 0.0f;
      } else if constexpr (G > 1) {
        block_amax = group_max<G>(amax);
      }
      if constexpr (S::kMode != kModeTensorDelayed) block_scale<Cfg, S>(block_amax, ctx.tensor_amax, ctx.delayed_scale, mul, entry);
    }
    if (valid == 0) continue;
    maybe_store_entry<S>(out, rl, cg, ctx.grid_pcols, scale_base, entry);
    float x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = M::kIdentity ? v[i] : v[i] * mul;
    encode_store<S, 4>(a, out.data, data_base + rl * a.k + cg, x, valid);
  }
  return reported;
}

// Columnwise stream: a thread takes one 16-byte chunk (4 adjacent columns) over kEpt rows (one
// 1D scale block along M, or 16 rows), lanes on consecutive chunks, so every shared-memory
// read is a conflict-free 16-byte row read. 1D blocks: a first pass over the rows gives the 4
// column amaxes. Same layout ([M, K]): one 4-element store per row. Transposed ([K, M]): 8-row
// steps, each column's 8 elements one vector store into its output row.
template <class Cfg, class S>
__device__ float cast_columnwise(const QuantizeArgs& a, const Member& mem, i64 col0, const float* src,
                                 const u32* bamax, i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, CH = TC / 4, L = S::kEpt, N = CH * (TR / L), T = Cfg::kThreads;
  static_assert(TR % L == 0 && L % 16 == 0, "columnwise runs: whole 16-row groups");
  using M = ModeTraits<S>;
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR, data_base = mem.row_base * a.k;
  float tile_mul = 1.0f;
  u32 tile_entry = 0;
  if constexpr (!M::kOwnBlocks && !S::kBlock2d && S::kMode != kModeChannel)
    block_scale<Cfg, S>(0.0f, ctx.tensor_amax, ctx.delayed_scale, tile_mul, tile_entry);
  float reported = 0.0f;
  for (int j = threadIdx.x; j < N; j += T) {
    const int cc = j % CH, r = (j / CH) * L, c = cc * 4;
    const i64 rl = row0 + r, cg = col0 + c;
    if (cg >= a.k || rl >= mem.rows) continue;
    const float* base = src + r * TC + (c & 3);  // + swizzled chunk per row: ((cc ^ (row & 7)) << 2)
    auto row4 = [&](int e) {  // r % 8 == 0: the swizzle phase of row r + e is e % 8
      return *reinterpret_cast<const float4*>(base + e * TC + ((cc ^ (e & 7)) << 2));
    };
    float mul[4] = {tile_mul, tile_mul, tile_mul, tile_mul};
    u32 entry[4] = {tile_entry, tile_entry, tile_entry, tile_entry};
    if constexpr (M::kOwnBlocks || S::kBlock2d || S::kMode == kModeChannel) {
      float am[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (M::kOwnBlocks) {
#pragma unroll 16
        for (int e = 0; e < L; ++e) {
          const float4 f = row4(e);
          am[0] = amax_step(am[0], f.x), am[1] = amax_step(am[1], f.y), am[2] = amax_step(am[2], f.z), am[3] = amax_step(am[3], f.w);
        }
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float block_amax = am[q];
        if constexpr (S::kBlock2d)
          block_amax = f32_from_bits(bamax[(r / S::kBlockRows) * (TC / S::kBlockCols) + c / S::kBlockCols]);
        else if constexpr (S::kMode == kModeChannel)
          block_amax = cg + q < a.k ? a.amax[S::kLocalAmax][i64(mem.index) * a.k + cg + q] : 0.0f;
        block_scale<Cfg, S>(block_amax, ctx.tensor_amax, ctx.delayed_scale, mul[q], entry[q]);
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (cg + q >= a.k) break;
      if constexpr (S::kTransposed) maybe_store_entry<S>(out, cg + q, rl, ctx.grid_pcols, scale_base, entry[q]);
      else maybe_store_entry<S>(out, rl, cg + q, ctx.grid_pcols, scale_base, entry[q]);
    }
    const i64 left = mem.rows - rl;
    const int cols = a.k - cg < 4 ? int(a.k - cg) : 4;
    if constexpr (S::kTransposed) {
      // Output row cg + q holds column cg + q of the member: element rl at cg_q * rows + rl.
#pragma unroll 1
      for (int e0 = 0; e0 < L; e0 += 8) {
        if (left <= e0) break;
        float x[4][8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float4 f = row4(e0 + e);
          const float v[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if constexpr (S::kMode == kModeTensorDelayed) reported = amax_step(reported, v[q]);
            x[q][e] = M::kIdentity ? v[q] : v[q] * mul[q];
          }
        }
        const int valid = left - e0 >= 8 ? 8 : int(left - e0);
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (q < cols) encode_store<S, 8>(a, out.data, data_base + (cg + q) * mem.rows + rl + e0, x[q], valid);
      }
    } else {
      i64 lin = data_base + rl * a.k + cg;
#pragma unroll 4
      for (int e = 0; e < L; ++e) {
        if (e >= left) break;
        const float4 f = row4(e);
        const float v[4] = {f.x, f.y, f.z, f.w};
        float x[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if constexpr (S::kMode == kModeTensorDelayed) reported = amax_step(reported, v[q]);
          x[q] = M::kIdentity ? v[q] : v[q] * mul[q];
        }
        encode_store<S, 4>(a, out.data, lin, x, cols);
        lin += a.k;
      }
    }
  }
  return reported;
}

// Casts one stream of the tile; returns this thread's amax of it (delayed scaling reports the
// tensor's amax).
template <class Cfg, class S>
__device__ __forceinline__ float cast_stream(const QuantizeArgs& a, const Member& mem, i64 col0, const float* tile,
                                             const float* rtile, const u32* bamax, i64 scale_base) {
  const float* src = S::kRht ? rtile : tile;
  if constexpr (S::kDir == 0) return cast_rowwise<Cfg, S>(a, mem, col0, src, bamax, scale_base);
  else return cast_columnwise<Cfg, S>(a, mem, col0, src, bamax, scale_base);
}

// Delayed scaling: the amax a CTA saw of one member, flushed with one atomic when the member
// changes and at the end.
template <class Cfg, class... S>
__device__ __forceinline__ void flush_reported(const QuantizeArgs& a, int member, float (&rep)[kMaxStreams]) {
  int s = 0;
  (
      [&] {
        if constexpr (S::kMode == kModeTensorDelayed) block_max_atomic<Cfg::kThreads>(a.amax[S::kTensorAmax] + member, rep[s]);
        rep[s++] = 0.0f;
      }(),
      ...);
}

// Grouped launches get one extra tile row; its first CTA writes the per-tensor scale entry of
// every empty member (no tile of theirs exists): the scale an all-zero tensor gets.
template <class Cfg, class... S>
__device__ void fill_empty_members(const QuantizeArgs& a) {
  if (threadIdx.x != 0) return;
  i64 bases[kMaxStreams] = {};
  for (int g = 0; g < a.num_members; ++g) {
    const i64 mg = a.member_rows[g + 1] - a.member_rows[g];
    int s = 0;
    (
        [&] {
          if constexpr (S::kMode == kModeTensorCurrent || S::kMode == kModeTensorDelayed) {
            if (mg == 0) {
              float mul;
              u32 entry;
              const float scale_in = S::kMode == kModeTensorDelayed ? *a.streams[S::kIndex].scale_in : 1.0f;
              block_scale<Cfg, S>(0.0f, 0.0f, scale_in, mul, entry);
              store_entry<S>(a.streams[S::kIndex].scale_inv, bases[s], entry);
            }
          }
          bases[s] += scale_grid_size<S>(mg, a.k);
          ++s;
        }(),
        ...);
  }
}

}  // namespace detail

// Persistent: the grid is sized to what the GPU holds at once; each CTA walks its tiles,
// issuing the next tile's loads before it casts the current one.
template <class Cfg, class... S>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) cast_kernel(const QuantizeArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  // Grouped launches: CTA 0 also writes the scales of empty members (they have no tile).
  if (a.member_rows && blockIdx.x == 0) detail::fill_empty_members<Cfg, S...>(a);

  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  constexpr int kTileFloats = Cfg::kTileRows * Cfg::kTileCols;
  float* tile = smem;
  float* rtile = Cfg::kRht ? smem + kTileFloats : smem;
  u32* bamax = reinterpret_cast<u32*>(smem + kTileFloats * (Cfg::kRht ? 2 : 1));

  detail::TileWalk<Cfg, S...> walk(a);
  detail::Member mem, next_mem;
  i64 col0 = 0, next_col0 = 0, base[kMaxStreams], next_base[kMaxStreams];
  detail::TileRegs<Cfg> regs;
  bool have = walk.next(a, mem, col0, base);
  if (have) detail::load_regs<Cfg>(a, mem, col0, regs);
  float rep[kMaxStreams] = {};
  int rep_member = have ? mem.index : 0;
  while (have) {
    detail::store_tile<Cfg>(regs, tile, rtile);
    const bool more = walk.next(a, next_mem, next_col0, next_base);
    if (more) detail::load_regs<Cfg>(a, next_mem, next_col0, regs);  // in flight during the cast

    if (mem.index != rep_member) {
      detail::flush_reported<Cfg, S...>(a, rep_member, rep);
      rep_member = mem.index;
    }
    // 2D block amaxes first (one region per stream that has them), then each stream.
    u32* region = bamax;
    u32* regions[sizeof...(S)];
    int s = 0;
    (
        [&] {
          regions[s++] = region;
          if constexpr (S::kBlock2d) {
            detail::block2d_amax<Cfg, S>(S::kRht ? rtile : tile, region);
            region += (Cfg::kTileRows / S::kBlockRows) * (Cfg::kTileCols / S::kBlockCols);
          }
        }(),
        ...);
    __syncthreads();
    s = 0;
    ((rep[s] = fmaxf(rep[s], detail::cast_stream<Cfg, S>(a, mem, col0, tile, rtile, regions[s], base[s])), ++s), ...);
    __syncthreads();  // the tile is free for the next store

    have = more;
    mem = next_mem;
    col0 = next_col0;
    for (int i = 0; i < kMaxStreams; ++i) base[i] = next_base[i];
  }
  detail::flush_reported<Cfg, S...>(a, rep_member, rep);
}

// Global reductions before the cast: the tensor amax (raw: straight from global memory with
// vector loads; after RHT: through the rotated tile) and per-channel amaxes.
template <class Cfg, class... A>
__global__ void __launch_bounds__(Cfg::kThreads) amax_kernel(const QuantizeArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads, NA = sizeof...(A);
  constexpr bool kNeedsTile = ((A::kRht || A::kScope != kScopeTensor) || ...);
  extern __shared__ float4 smem4[];
  float* tile = reinterpret_cast<float*>(smem4);
  float* rtile = Cfg::kRht ? tile + TR * TC : tile;
  detail::TileWalk<Cfg> walk(a);
  detail::Member mem;
  i64 col0 = 0, unused[kMaxStreams];
  float acc[NA] = {};  // tensor-scope amaxes of the current member, flushed on change / at the end
  int acc_member = -1;
  auto flush = [&] {
    int i = 0;
    (
        [&] {
          if constexpr (A::kScope == kScopeTensor)
            if (acc_member >= 0) detail::block_max_atomic<T>(a.amax[A::kSlot] + acc_member, acc[i]);
          acc[i++] = 0.0f;
        }(),
        ...);
  };
  while (walk.next(a, mem, col0, unused)) {
    if (mem.index != acc_member) {
      flush();
      acc_member = mem.index;
    }
    const i64 row0 = mem.tile_row * TR;
    if constexpr (kNeedsTile) {
      detail::TileRegs<Cfg> regs;
      detail::load_regs<Cfg>(a, mem, col0, regs);
      detail::store_tile<Cfg>(regs, tile, rtile);
    }
    int i = 0;
    (
        [&] {
          float& m = acc[i++];
          if constexpr (A::kScope == kScopeTensor && !A::kRht) {
            // Raw tensor amax: vector loads straight from global memory.
            constexpr int CH = TC / 4, N = TR * CH;
            const bool vec = a.k % 4 == 0;
#pragma unroll 4
            for (int j = threadIdx.x; j < N; j += T) {
              const int r = j / CH, c = (j % CH) * 4;
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
          } else if constexpr (A::kScope == kScopeTensor) {
            for (int j = threadIdx.x; j < TR * TC / 4; j += T) {
              const int r = j / (TC / 4), c = (j % (TC / 4)) * 4;
              const float4 f = *reinterpret_cast<const float4*>(rtile + detail::tile_off<TC>(r, c));
              m = amax_step(amax_step(amax_step(amax_step(m, f.x), f.y), f.z), f.w);
            }
          } else if constexpr (A::kScope == kScopeChannelRows) {
            // One warp per row: lanes read consecutive columns.
            const float* src = A::kRht ? rtile : tile;
            for (int r = threadIdx.x / 32; r < TR; r += T / 32) {
              float v = 0.0f;
              for (int c = threadIdx.x % 32; c < TC; c += 32) v = amax_step(v, src[detail::tile_off<TC>(r, c)]);
              v = detail::warp_max(v);
              if ((threadIdx.x & 31) == 0 && row0 + r < mem.rows)
                detail::atomic_max_nonneg(a.amax[A::kSlot] + mem.row_base + row0 + r, v);
            }
          } else {
            const float* src = A::kRht ? rtile : tile;
            for (int c = threadIdx.x; c < TC; c += T) {
              if (col0 + c >= a.k) continue;
              float v = 0.0f;
              for (int r = 0; r < TR; ++r) v = amax_step(v, src[detail::tile_off<TC>(r, c)]);
              detail::atomic_max_nonneg(a.amax[A::kSlot] + i64(mem.index) * a.k + col0 + c, v);
            }
          }
        }(),
        ...);
    if constexpr (kNeedsTile) __syncthreads();  // the tile is free for the next store
  }
  flush();
}

#endif  // __CUDACC__

}  // namespace qf
