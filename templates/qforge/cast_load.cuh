// The input side of the quantize kernels: the staged tile's swizzled layout and element types
// (fp32, or the 16-bit input's bits), rounding to the input dtype, input loads and unpacking
// (fp32, bf16, fp16), the CTA-wide item loop (item_rc), and the staging of a tile into shared
// memory (interior tiles with 16-byte loads, the RHT's rotated copy).
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_schedule.cuh"
#include "qforge/numerics.cuh"

namespace qf {
namespace detail {

// Float offset of tile element (r, c): rows of TC floats, 16-byte chunks XOR-swizzled by r % 8.
// Row walks (16-byte reads of consecutive chunks) and column walks (lanes on 32 consecutive
// columns) both hit 32 distinct banks.
template <int TC>
__device__ __forceinline__ int tile_off(int r, int c) {
  static_assert(TC % 32 == 0, "a tile row holds a multiple of 8 chunks");
  return r * TC + ((((c >> 2) ^ (r & 7))) << 2) + (c & 3);
}

// Staged-tile elements. fp32 staging holds floats; 16-bit staging (Cfg::kStage16) holds the
// input's bits, tagged by type so that every read converts the right way. Every value staged is
// an input value, zero, or an RHT output already rounded to the input dtype, so 16 bits hold it
// exactly (a NaN may come back with another payload, which no output depends on).
struct Bf16Bits {
  u16 bits;
};
struct F16Bits {
  u16 bits;
};
template <bool k16, int D>
struct TileElemOf {
  using type = float;
};
template <>
struct TileElemOf<true, 1> {
  using type = Bf16Bits;
};
template <>
struct TileElemOf<true, 2> {
  using type = F16Bits;
};
template <class Cfg>
using TileElem = typename TileElemOf<Cfg::kStage16, int(Cfg::kInDtype)>::type;

__device__ __forceinline__ float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 f2h(float f) {  // exact for the staged values
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

__device__ __forceinline__ float tld(const float* t, int off) { return t[off]; }
__device__ __forceinline__ float tld(const Bf16Bits* t, int off) { return f32_from_bits(u32(t[off].bits) << 16); }
__device__ __forceinline__ float tld(const F16Bits* t, int off) { return h2f(t[off].bits); }
// Four elements of one chunk (off % 4 == 0).
__device__ __forceinline__ float4 tld4(const float* t, int off) { return *reinterpret_cast<const float4*>(t + off); }
__device__ __forceinline__ float4 tld4(const Bf16Bits* t, int off) {
  const uint2 w = *reinterpret_cast<const uint2*>(t + off);
  return make_float4(f32_from_bits(w.x << 16), f32_from_bits(w.x & 0xFFFF0000u), f32_from_bits(w.y << 16),
                     f32_from_bits(w.y & 0xFFFF0000u));
}
__device__ __forceinline__ float4 tld4(const F16Bits* t, int off) {
  const uint2 w = *reinterpret_cast<const uint2*>(t + off);
  return make_float4(h2f(u16(w.x)), h2f(u16(w.x >> 16)), h2f(u16(w.y)), h2f(u16(w.y >> 16)));
}
// The input dtype whose bits a staged element holds (1 bf16, 2 fp16), 0 for fp32 staging; and
// the raw 8 bytes of a 16-bit staged chunk (off % 4 == 0), element 0 in the low half of .x.
template <class Elem>
constexpr int kStagedDtype = 0;
template <>
constexpr int kStagedDtype<Bf16Bits> = 1;
template <>
constexpr int kStagedDtype<F16Bits> = 2;
template <class Elem>
__device__ __forceinline__ uint2 tld4_raw(const Elem* t, int off) {
  static_assert(kStagedDtype<Elem> != 0, "16-bit staging");
  return *reinterpret_cast<const uint2*>(t + off);
}
__device__ __forceinline__ void tst4(float* t, int off, float4 v) { *reinterpret_cast<float4*>(t + off) = v; }
__device__ __forceinline__ void tst4(Bf16Bits* t, int off, float4 v) {  // the high halves: exact for bf16 values
  *reinterpret_cast<uint2*>(t + off) =
      make_uint2(__byte_perm(f32_bits(v.x), f32_bits(v.y), 0x7632), __byte_perm(f32_bits(v.z), f32_bits(v.w), 0x7632));
}
__device__ __forceinline__ void tst4(F16Bits* t, int off, float4 v) {
  *reinterpret_cast<uint2*>(t + off) = make_uint2(u32(f2h(v.x)) | (u32(f2h(v.y)) << 16), u32(f2h(v.z)) | (u32(f2h(v.w)) << 16));
}
__device__ __forceinline__ void tst1(float* t, int off, float v) { t[off] = v; }
__device__ __forceinline__ void tst1(Bf16Bits* t, int off, float v) { t[off].bits = u16(f32_bits(v) >> 16); }
__device__ __forceinline__ void tst1(F16Bits* t, int off, float v) { t[off].bits = f2h(v); }

// v rounded (RNE) to the input dtype and back (the RHT output, as the reference rounds it).
// The hardware conversions give the same value for every non-NaN v; a NaN stays a NaN (its
// payload may differ, which no output depends on: encoders map any NaN to one code and amaxes
// skip NaN).
__device__ __forceinline__ float round_to_dtype(float v, int dtype) {
#if defined(__CUDA_ARCH__)
  if (dtype == 1) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return bf16_to_f32(h);
  }
  if (dtype == 2) {
    float r;
    asm("{\n\t.reg .b16 h;\n\tcvt.rn.f16.f32 h, %1;\n\tcvt.f32.f16 %0, h;\n\t}" : "=f"(r) : "f"(v));
    return r;
  }
  return v;
#else
  if (dtype == 1) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == 2) return f16_to_f32(f32_to_f16(v));
  return v;
#endif
}

// Two values rounded as round_to_dtype rounds them; bf16 in one paired conversion.
__device__ __forceinline__ void round2_to_dtype(float& lo, float& hi, int dtype) {
#if defined(__CUDA_ARCH__)
  if (dtype == 1) {
    u32 h2;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(h2) : "f"(hi), "f"(lo));
    lo = f32_from_bits(h2 << 16);
    hi = f32_from_bits(h2 & 0xFFFF0000u);
    return;
  }
#endif
  lo = round_to_dtype(lo, dtype);
  hi = round_to_dtype(hi, dtype);
}

// The two 16-bit input elements of a word (D: 1 bf16, 2 fp16), element 0 in the low half.
template <int D>
__device__ __forceinline__ void unpack2(u32 w, float& lo, float& hi) {
  lo = D == 1 ? f32_from_bits(w << 16) : f16_to_f32(u16(w));
  hi = D == 1 ? f32_from_bits(w & 0xFFFF0000u) : f16_to_f32(u16(w >> 16));
}

// Bytes of an input element and input elements in 16 bytes (D: 0 fp32, 1 bf16, 2 fp16).
template <int D>
constexpr int kInBytes = D == 0 ? 4 : 2;
template <int D>
constexpr int kElemsPer16 = 16 / kInBytes<D>;

// The kElemsPer16<D> input elements of a 16-byte piece, element 0 first.
template <int D>
__device__ __forceinline__ void unpack16(const uint4& raw, float* v) {
  const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if constexpr (D == 0) v[e] = f32_from_bits(w[e]);
    else unpack2<D>(w[e], v[2 * e], v[2 * e + 1]);
  }
}

// The 16 bytes of input at element idx (a multiple of kElemsPer16<D>).
template <int D>
__device__ __forceinline__ uint4 load16(const void* x, i64 idx) {
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(x) + idx * kInBytes<D>));
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

// Item `it` of this thread in a CTA-wide loop over N items laid out as rows of W (item
// j = it * T + threadIdx.x): its row and column. With T % W == 0 a thread keeps its column and
// its rows advance by T / W, which the compiler folds into addresses.
template <int W, int T>
__device__ __forceinline__ void item_rc(int it, int& row, int& col) {
  if constexpr (T % W == 0) {
    row = it * (T / W) + int(threadIdx.x / W);
    col = int(threadIdx.x % W);
  } else {
    const int j = it * T + int(threadIdx.x);
    row = j / W;
    col = j % W;
  }
}

template <int N, int T>
__device__ __forceinline__ bool item_past_end(int it) {
  return N % T != 0 && it * T + int(threadIdx.x) >= N;
}

// Rows r .. r + 15 of tile column c after the RHT (r % 16 == 0), each rounded to the input
// dtype as the reference rounds it.
template <class Cfg>
__device__ __forceinline__ void rotated_group(const TileElem<Cfg>* tile, int r, int c, float (&v)[16]) {
  constexpr int TC = Cfg::kTileCols;
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = tld(tile, tile_off<TC>(r + j, c));
  rht16(v, Cfg::kRhtMask);
#pragma unroll
  for (int j = 0; j < 16; j += 2) round2_to_dtype(v[j], v[j + 1], Cfg::kInDtype);
}

// An interior tile's 16-byte chunks (the whole tile inside the member and K, K % 16 == 0),
// straight from global memory without checks, every load of the thread issued together. Chunk
// it * T + threadIdx.x is tile row / CH, chunk column % CH (item_rc): with T % CH == 0 a thread
// keeps its chunk column, so its loads are one address plus multiples of one row stride.
template <class Cfg>
struct TileChunks {
  static constexpr int E = kElemsPer16<Cfg::kInDtype>, CH = Cfg::kTileCols / E, N = Cfg::kTileRows * CH;
  static constexpr int kIters = (N + Cfg::kThreads - 1) / Cfg::kThreads;
  static_assert(Cfg::kTileCols % E == 0, "whole 16-byte chunks per tile row");
};
template <class Cfg>
__device__ __forceinline__ void load_chunks_full(const QuantizeArgs& a, const Member& mem, i64 col0,
                                                 uint4 (&raw)[TileChunks<Cfg>::kIters]) {
  using TCh = TileChunks<Cfg>;
  constexpr int T = Cfg::kThreads, E = TCh::E, CH = TCh::CH, N = TCh::N, kBytes = kInBytes<Cfg::kInDtype>;
  int r0, c0;
  item_rc<CH, T>(0, r0, c0);
  const char* first = static_cast<const char*>(a.x) +
                      ((mem.row_base + mem.tile_row * Cfg::kTileRows + r0) * a.k + col0 + c0 * E) * kBytes;
#pragma unroll
  for (int it = 0; it < TCh::kIters; ++it) {
    int r, c;
    item_rc<CH, T>(it, r, c);
    raw[it] = make_uint4(0, 0, 0, 0);
    if (!item_past_end<N, T>(it))
      raw[it] = __ldg(reinterpret_cast<const uint4*>(first + (i64(r - r0) * a.k + (c - c0) * E) * kBytes));
  }
}

// The interior tile into shared memory. A thread's rows advance by T / CH; where that is a
// multiple of the swizzle's 8 rows (16-bit inputs in every shipped tile), its stores are one
// tile offset plus constants.
template <class Cfg>
__device__ __forceinline__ void load_tile_full(const QuantizeArgs& a, const Member& mem, i64 col0, TileElem<Cfg>* tile) {
  using TCh = TileChunks<Cfg>;
  constexpr int TC = Cfg::kTileCols, T = Cfg::kThreads, E = TCh::E, CH = TCh::CH, N = TCh::N, kIters = TCh::kIters;
  uint4 raw[kIters];
  load_chunks_full<Cfg>(a, mem, col0, raw);
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    int r, c;
    item_rc<CH, T>(it, r, c);
    c *= E;
    if (!item_past_end<N, T>(it)) {
      if constexpr (Cfg::kInDtype == 0) {
        *reinterpret_cast<uint4*>(tile + tile_off<TC>(r, c)) = raw[it];
      } else if constexpr (Cfg::kStage16) {  // the input's bits: two chunks of four
        *reinterpret_cast<uint2*>(tile + tile_off<TC>(r, c)) = make_uint2(raw[it].x, raw[it].y);
        *reinterpret_cast<uint2*>(tile + tile_off<TC>(r, c + 4)) = make_uint2(raw[it].z, raw[it].w);
      } else {
        float f[8];
        unpack16<Cfg::kInDtype>(raw[it], f);
        tst4(tile, tile_off<TC>(r, c), make_float4(f[0], f[1], f[2], f[3]));
        tst4(tile, tile_off<TC>(r, c + 4), make_float4(f[4], f[5], f[6], f[7]));
      }
    }
  }
}

// Loads the tile (zero outside the member / K). Interior tiles: every load of a thread is issued
// before the first shared-memory store. Edge tiles: compact loops (a few unrolled bodies, not one
// per chunk): they are few per tensor, and their code is in every program for any tiles, where
// it was half of the instructions and of the JIT compile time. With RHT and `rotate`, also the
// rotated copy (16-row groups per column, rounded to the input dtype) for the readers that
// cannot rotate in registers.
template <class Cfg>
__device__ void load_tile(const QuantizeArgs& a, const Member& mem, i64 col0, bool full, TileElem<Cfg>* tile,
                          TileElem<Cfg>* rtile, bool rotate = true) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, CH = TC / 4, N = TR * CH, T = Cfg::kThreads;
  constexpr int kIters = (N + T - 1) / T;
  const i64 row0 = mem.tile_row * TR;
  const bool vec = a.k % 4 == 0;
  if (full) {
    load_tile_full<Cfg>(a, mem, col0, tile);
  } else if (vec) {
    // K % 4 == 0: a chunk is in K whole or not at all. Four chunks' loads in flight at a time.
#pragma unroll 4
    for (int it = 0; it < kIters; ++it) {
      const int i = it * T + int(threadIdx.x);
      const int r = i / CH, c = (i % CH) * 4;
      const i64 rl = row0 + r, cg = col0 + c;
      if (N % T == 0 || i < N)
        tst4(tile, tile_off<TC>(r, c), rl < mem.rows && cg < a.k ? load4<Cfg::kInDtype>(a.x, (mem.row_base + rl) * a.k + cg)
                                                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    }
  } else {
    // Rows of any length (unaligned): element by element, one chunk at a time.
#pragma unroll 1
    for (int i = int(threadIdx.x); i < N; i += T) {
      const int r = i / CH, c = (i % CH) * 4;
      const i64 rl = row0 + r, cg = col0 + c, idx = (mem.row_base + rl) * a.k + cg;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (rl < mem.rows) {
        if (cg + 0 < a.k) v.x = load1<Cfg::kInDtype>(a.x, idx + 0);
        if (cg + 1 < a.k) v.y = load1<Cfg::kInDtype>(a.x, idx + 1);
        if (cg + 2 < a.k) v.z = load1<Cfg::kInDtype>(a.x, idx + 2);
        if (cg + 3 < a.k) v.w = load1<Cfg::kInDtype>(a.x, idx + 3);
      }
      tst4(tile, tile_off<TC>(r, c), v);
    }
  }
  if constexpr (Cfg::kRht) {
    if (rotate) {
      __syncthreads();
      for (int i = threadIdx.x; i < (TR / 16) * TC; i += T) {
        const int grp = i / TC, c = i % TC;
        float v[16];
        rotated_group<Cfg>(tile, grp * 16, c, v);
#pragma unroll
        for (int j = 0; j < 16; ++j) tst1(rtile, tile_off<TC>(grp * 16 + j, c), v[j]);
      }
    }
  }
  __syncthreads();
}

}  // namespace detail
}  // namespace qf
