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

// Encodes N consecutive elements of one output row, starting at element `lin` (the element's
// offset in the stream's data buffer, which is also its stochastic-rounding index), and stores
// the first `valid` of them. N is 4 or 16. Full, aligned runs take one vector store.
template <class S, int N>
__device__ __forceinline__ void encode_store(const QuantizeArgs& a, void* data, i64 lin, const float (&v)[N],
                                             float mul, int valid) {
  using F = typename S::Format;
  if constexpr (is_identity<F>::value) {
    if constexpr (F::kDtype == 0) {
      float* o = static_cast<float*>(data) + lin;
      if (valid == N && lin % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) *reinterpret_cast<float4*>(o + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
      } else {
        for (int i = 0; i < valid; ++i) o[i] = v[i];
      }
    } else {
      u16* o = static_cast<u16*>(data) + lin;
      u32 h[N];
#pragma unroll
      for (int i = 0; i < N; ++i) h[i] = F::kDtype == 1 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      if (valid == N && lin % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) *reinterpret_cast<uint2*>(o + i) = make_uint2(h[i] | (h[i + 1] << 16), h[i + 2] | (h[i + 3] << 16));
      } else {
        for (int i = 0; i < valid; ++i) o[i] = u16(h[i]);
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
          for (int i = 0; i < 4; ++i) q[g + i] = enc_sr<F>(v[g + i] * mul, w[i]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i)
          q[i] = i < valid ? enc_sr<F>(v[i] * mul, sr_random_bits(a.seed, a.offset, u32(S::kDir), u64(lin + i))) : 0u;
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) q[i] = enc_rn<F>(v[i] * mul);
    }
    if constexpr (F::kBits == 4) {
      // Two per byte, element 2i in the low nibble. lin is even (check_shape: packed rows are
      // even), so the pairs are this run's own.
      u32 p[N / 2];
#pragma unroll
      for (int i = 0; i < N / 2; ++i) p[i] = (q[2 * i] & 0xFu) | ((2 * i + 1 < valid ? q[2 * i + 1] & 0xFu : 0u) << 4);
      u8* o = static_cast<u8*>(data) + lin / 2;
      if (valid == N && lin % N == 0) {
        if constexpr (N == 4) {
          *reinterpret_cast<u16*>(o) = u16(p[0] | (p[1] << 8));
        } else {
          *reinterpret_cast<uint2*>(o) = make_uint2(p[0] | (p[1] << 8) | (p[2] << 16) | (p[3] << 24),
                                                    p[4] | (p[5] << 8) | (p[6] << 16) | (p[7] << 24));
        }
      } else {
        for (int i = 0; 2 * i < valid; ++i) o[i] = u8(p[i]);
      }
    } else {
      u8* o = static_cast<u8*>(data) + lin;
      if (valid == N && lin % N == 0) {
        u32 w[N / 4];
#pragma unroll
        for (int i = 0; i < N / 4; ++i)
          w[i] = (q[4 * i] & 0xFFu) | ((q[4 * i + 1] & 0xFFu) << 8) | ((q[4 * i + 2] & 0xFFu) << 16) | (q[4 * i + 3] << 24);
        if constexpr (N == 4) *reinterpret_cast<u32*>(o) = w[0];
        else *reinterpret_cast<uint4*>(o) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        for (int i = 0; i < valid; ++i) o[i] = u8(q[i]);
      }
    }
  }
}

// One element (column walks of a same-layout columnwise stream).
template <class S>
__device__ __forceinline__ void encode_store1(const QuantizeArgs& a, void* data, i64 lin, float v, float mul) {
  using F = typename S::Format;
  if constexpr (is_identity<F>::value) {
    if constexpr (F::kDtype == 0) static_cast<float*>(data)[lin] = v;
    else static_cast<u16*>(data)[lin] = F::kDtype == 1 ? f32_to_bf16(v) : f32_to_f16(v);
  } else {
    static_assert(F::kBits != 4, "packed formats are never written one element at a time");
    u32 q;
    if constexpr (S::kStochastic) q = enc_sr<F>(v * mul, sr_random_bits(a.seed, a.offset, u32(S::kDir), u64(lin)));
    else q = enc_rn<F>(v * mul);
    static_cast<u8*>(data)[lin] = u8(q);
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
__device__ bool resolve_member(const QuantizeArgs& a, Member& mem, i64 (&scale_base)[kMaxStreams]) {
  __shared__ i64 sh[4 + kMaxStreams];
  if (!a.member_rows) {
    mem = Member{0, 0, a.m, i64(blockIdx.x)};
    for (int s = 0; s < kMaxStreams; ++s) scale_base[s] = 0;
    return i64(blockIdx.x) * Cfg::kTileRows < a.m;
  }
  if (threadIdx.x == 0) {
    i64 tiles = 0, bases[kMaxStreams] = {};
    sh[0] = -1;
    for (int g = 0; g < a.num_members; ++g) {
      const i64 r0 = a.member_rows[g], mg = a.member_rows[g + 1] - r0;
      const i64 t = i64(ceil_div(u64(mg), u64(Cfg::kTileRows)));
      if (i64(blockIdx.x) < tiles + t) {
        sh[0] = g, sh[1] = r0, sh[2] = mg;
        sh[3] = i64(blockIdx.x) - tiles;
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

// ------------------------------------------------------------------------------------ tiles

// Loads the tile (fp32, zero outside the member / K): every load of a thread is issued before
// the first shared-memory store. With RHT, also the rotated copy (16-row groups per column,
// rounded to the input dtype).
template <class Cfg>
__device__ void load_tile(const QuantizeArgs& a, const Member& mem, i64 col0, float* tile, float* rtile) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, CH = TC / 4, N = TR * CH, T = Cfg::kThreads;
  constexpr int kIters = (N + T - 1) / T;
  const i64 row0 = mem.tile_row * TR;
  const bool vec = a.k % 4 == 0;
  float4 val[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
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
    val[it] = v;
  }
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = it * T + int(threadIdx.x);
    if (N % T == 0 || i < N) *reinterpret_cast<float4*>(tile + tile_off<TC>(i / CH, (i % CH) * 4)) = val[it];
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

// Rowwise stream ([M, K] layout): runs of 4 elements of a row, kGroup lanes per scale block.
template <class Cfg, class S>
__device__ float cast_rowwise(const QuantizeArgs& a, const Member& mem, i64 col0, const float* src, const u32* bamax,
                              i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, CH = TC / 4, N = TR * CH, T = Cfg::kThreads, G = S::kGroup;
  static_assert(S::kEpt == 4 && CH % G == 0 && 32 % G == 0, "rowwise runs: 4 elements, groups within a warp row");
  static_assert(N % 32 == 0, "whole warps of runs");
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR, data_base = mem.row_base * a.k;
  float reported = 0.0f;
  for (int j = threadIdx.x; j < N; j += T) {  // N % 32 == 0: whole warps take part in shuffles
    const int r = j / CH, c = (j % CH) * 4;
    const float4 f = *reinterpret_cast<const float4*>(src + tile_off<TC>(r, c));
    const float v[4] = {f.x, f.y, f.z, f.w};
    const i64 rl = row0 + r, cg = col0 + c;
    const int valid = rl < mem.rows ? int(a.k - cg < 4 ? (a.k - cg > 0 ? a.k - cg : 0) : 4) : 0;
    float amax = amax_step(amax_step(amax_step(amax_step(0.0f, v[0]), v[1]), v[2]), v[3]);  // zero padding
    if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);
    float block_amax = amax;
    if constexpr (S::kBlock2d) {
      block_amax = f32_from_bits(bamax[(r / S::kBlockRows) * (TC / S::kBlockCols) + c / S::kBlockCols]);
    } else if constexpr (S::kMode == kModeChannel) {
      block_amax = rl < mem.rows ? a.amax[S::kLocalAmax][mem.row_base + rl] : 0.0f;
    } else if constexpr (G > 1) {
      block_amax = group_max<G>(amax);
    }
    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, ctx.tensor_amax, ctx.delayed_scale, mul, entry);
    if (valid == 0) continue;
    maybe_store_entry<S>(out, rl, cg, ctx.grid_pcols, scale_base, entry);
    encode_store<S, 4>(a, out.data, data_base + rl * a.k + cg, v, mul, valid);
  }
  return reported;
}

// Columnwise stream: runs of kEpt rows of one column, lanes on consecutive columns. Transposed
// ([K, M]): each 16-row chunk is one vector store into the output row of its column; same
// layout ([M, K]): element stores (consecutive lanes fill consecutive bytes of a row).
template <class Cfg, class S>
__device__ float cast_columnwise(const QuantizeArgs& a, const Member& mem, i64 col0, const float* src,
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
    for (int e = 0; e < L; ++e) amax = amax_step(amax, src[tile_off<TC>(r + e, c)]);
    if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);
    float block_amax = amax;
    if constexpr (S::kBlock2d) {
      block_amax = f32_from_bits(bamax[(r / S::kBlockRows) * (TC / S::kBlockCols) + c / S::kBlockCols]);
    } else if constexpr (S::kMode == kModeChannel) {
      block_amax = a.amax[S::kLocalAmax][i64(mem.index) * a.k + cg];
    }
    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, ctx.tensor_amax, ctx.delayed_scale, mul, entry);
    const i64 dr = S::kTransposed ? cg : rl, dc = S::kTransposed ? rl : cg;
    maybe_store_entry<S>(out, dr, dc, ctx.grid_pcols, scale_base, entry);
    const i64 left = mem.rows - rl;
    if constexpr (S::kTransposed) {
      const i64 line = data_base + cg * mem.rows + rl;  // output row cg, element rl
#pragma unroll 1
      for (int e0 = 0; e0 < L; e0 += 16) {
        if (left <= e0) break;
        float v[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) v[e] = src[tile_off<TC>(r + e0 + e, c)];
        encode_store<S, 16>(a, out.data, line + e0, v, mul, left - e0 >= 16 ? 16 : int(left - e0));
      }
    } else {
#pragma unroll 4
      for (int e = 0; e < L; ++e) {
        if (e >= left) break;
        encode_store1<S>(a, out.data, data_base + (rl + e) * a.k + cg, src[tile_off<TC>(r + e, c)], mul);
      }
    }
  }
  return reported;
}

template <class Cfg, class S>
__device__ __forceinline__ void cast_stream(const QuantizeArgs& a, const Member& mem, i64 col0, const float* tile,
                                            const float* rtile, const u32* bamax, i64 scale_base) {
  const float* src = S::kRht ? rtile : tile;
  float reported;
  if constexpr (S::kDir == 0) reported = cast_rowwise<Cfg, S>(a, mem, col0, src, bamax, scale_base);
  else reported = cast_columnwise<Cfg, S>(a, mem, col0, src, bamax, scale_base);
  if constexpr (S::kMode == kModeTensorDelayed) {
    block_max_atomic<Cfg::kThreads>(a.amax[S::kTensorAmax] + mem.index, reported);
  }
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

template <class Cfg, class... S>
__global__ void __launch_bounds__(Cfg::kThreads) cast_kernel(const QuantizeArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  if (a.member_rows && blockIdx.x == gridDim.x - 1) {
    if (blockIdx.y == 0) detail::fill_empty_members<Cfg, S...>(a);
    return;
  }
  detail::Member mem;
  i64 scale_base[kMaxStreams];
  if (!detail::resolve_member<Cfg, S...>(a, mem, scale_base)) return;
  const i64 col0 = i64(blockIdx.y) * Cfg::kTileCols;

  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  constexpr int kTileFloats = Cfg::kTileRows * Cfg::kTileCols;
  float* tile = smem;
  float* rtile = Cfg::kRht ? smem + kTileFloats : smem;
  u32* bamax = reinterpret_cast<u32*>(smem + kTileFloats * (Cfg::kRht ? 2 : 1));
  detail::load_tile<Cfg>(a, mem, col0, tile, rtile);

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
  ((detail::cast_stream<Cfg, S>(a, mem, col0, tile, rtile, regions[s], scale_base[s]), ++s), ...);
}

// Global reductions before the cast: the tensor amax (raw: straight from global memory with
// vector loads; after RHT: through the rotated tile) and per-channel amaxes.
template <class Cfg, class... A>
__global__ void __launch_bounds__(Cfg::kThreads) amax_kernel(const QuantizeArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  detail::Member mem;
  i64 unused[kMaxStreams];
  if (!detail::resolve_member<Cfg>(a, mem, unused)) return;
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads;
  const i64 col0 = i64(blockIdx.y) * TC, row0 = mem.tile_row * TR;
  constexpr bool kNeedsTile = ((A::kRht || A::kScope != kScopeTensor) || ...);
  extern __shared__ float4 smem4[];
  float* tile = reinterpret_cast<float*>(smem4);
  float* rtile = Cfg::kRht ? tile + TR * TC : tile;
  if constexpr (kNeedsTile) detail::load_tile<Cfg>(a, mem, col0, tile, rtile);
  (
      [&] {
        if constexpr (A::kScope == kScopeTensor && !A::kRht) {
          // Raw tensor amax: vector loads straight from global memory.
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
          float m = 0.0f;
          for (int i = threadIdx.x; i < TR * TC / 4; i += T) {
            const int r = i / (TC / 4), c = (i % (TC / 4)) * 4;
            const float4 f = *reinterpret_cast<const float4*>(rtile + detail::tile_off<TC>(r, c));
            m = amax_step(amax_step(amax_step(amax_step(m, f.x), f.y), f.z), f.w);
          }
          detail::block_max_atomic<Cfg::kThreads>(a.amax[A::kSlot] + mem.index, m);
        } else if constexpr (A::kScope == kScopeChannelRows) {
          // One warp per row: lanes read consecutive columns.
          const float* src = A::kRht ? rtile : tile;
          for (int r = threadIdx.x / 32; r < TR; r += T / 32) {
            float m = 0.0f;
            for (int c = threadIdx.x % 32; c < TC; c += 32) m = amax_step(m, src[detail::tile_off<TC>(r, c)]);
            m = detail::warp_max(m);
            if ((threadIdx.x & 31) == 0 && row0 + r < mem.rows)
              detail::atomic_max_nonneg(a.amax[A::kSlot] + mem.row_base + row0 + r, m);
          }
        } else {
          const float* src = A::kRht ? rtile : tile;
          for (int c = threadIdx.x; c < TC; c += T) {
            if (col0 + c >= a.k) continue;
            float m = 0.0f;
            for (int r = 0; r < TR; ++r) m = amax_step(m, src[detail::tile_off<TC>(r, c)]);
            detail::atomic_max_nonneg(a.amax[A::kSlot] + i64(mem.index) * a.k + col0 + c, m);
          }
        }
      }(),
      ...);
}

#endif  // __CUDACC__

}  // namespace qf
