// The fused quantize kernels. Generated code (compiler/codegen.cpp) defines one config struct
// for the plan and one per stream / per amax reduction, with named constants, and names the
// kernel templates below; everything else is here, as ordinary CUDA.
//
//   amax_kernel<Cfg, A...>  - phase 0 when the plan needs global reductions first: the tensor
//                             amax (raw or after RHT) and per-channel amaxes.
//   cast_kernel<Cfg, S...>  - the cast: one read of each input tile into shared memory, then
//                             every stream S (rowwise / columnwise, any format) written from it.
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
// Interior tiles (inside the member and K, K % 16 == 0) take vector paths without checks:
// 16-byte tile loads; transposed runs of 16 rows read once (RHT streams: rotated in registers),
// encoded into a staged copy of the tile's output in shared memory, which the CTA copies out in
// whole sectors of each output row (blocks longer than 16 rows through per-16-row partial amaxes
// in shared scratch); same-layout columnwise streams through one multiplier per (column, block)
// in shared scratch, then rowwise-style runs; MX / NVFP4 byte scale entries staged and copied
// out a row at a time; rowwise 16-column blocks (NVFP4) one whole block per thread. A plan whose
// one stream is rowwise (inference) casts interior tiles straight from global memory, without
// staging; tensor amaxes after the RHT come from global memory too. Edge tiles take the checked
// paths above, element by element where needed. CTAs take tiles column-fastest, most plans
// (tile_pos).
// fp8 is encoded with the hardware cvt on sm_89+, two elements per instruction with a NaN byte
// fix-up, e2m1 (round to nearest) in one fp32 addition (both bit-identical to the software
// encoder, checked exhaustively by the GPU tests); stochastic rounding draws one Philox call per
// 4 elements. Scales come from docs/numerics.md through
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

// Entries of the 2D-block part of a stream's scratch (the part before the column partials).
QF_HD constexpr int cast_block2d_entries(int tile_rows, int tile_cols, bool block2d, int block_rows, int block_cols) {
  return block2d ? ((tile_rows / block_rows) * (tile_cols / block_cols) + 3) / 4 * 4 : 0;
}

// A transposed stream stages an interior tile's output in shared memory, one row per tile
// column (TR elements of out_bits, then a pad of one copy unit so that lanes on consecutive
// rows hit distinct banks), and copies it out in units of 16 elements' bytes (at most 16):
// whole sectors of consecutive output bytes per warp store, where lanes on consecutive tile
// columns would each write a piece of a different output row. Byte scale entries (MX, NVFP4,
// compact) are staged likewise after the data, TR / 16 bytes per tile column at most.
QF_HD constexpr int transposed_unit_bytes(int out_bits) { return 2 * out_bits < 16 ? 2 * out_bits : 16; }
QF_HD constexpr int transposed_stage_stride(int tile_rows, int out_bits) {
  return tile_rows * out_bits / 8 + transposed_unit_bytes(out_bits);
}

// Shared-memory scratch (4-byte entries, a multiple of 4 so every region stays 16-byte aligned)
// of one stream of cast_kernel, the same on host (code generator) and device, in this order:
//   2D blocks                  - one amax per block of the tile;
//   columnwise, same layout    - a partial amax per 16 rows of each column, then the element
//                                multiplier per scale block of each column;
//   columnwise, transposed     - the partial amaxes, when a 1D block is longer than the 16 rows
//                                one thread encodes; then the staged output (above);
//   rowwise, 1D blocks wider   - the element multiplier per (row, block) of the tile, then
//   than 4 elements              its byte scale entry (MX, NVFP4, compact), staged;
//   rowwise, per channel       - the element multiplier per row of the tile.
// out_bits: the bits an element takes in the stream's data buffer (StoreBits).
QF_HD constexpr int cast_scratch_entries(int tile_rows, int tile_cols, bool columnwise, bool transposed, int ept,
                                         bool block2d, int block_rows, int block_cols, int out_bits, bool channel) {
  int n = cast_block2d_entries(tile_rows, tile_cols, block2d, block_rows, block_cols);
  if (!columnwise && channel) n += tile_rows;
  if (!columnwise && !block2d && block_cols > 4) {
    const int blocks = tile_rows * (tile_cols / block_cols);
    n += blocks + blocks / 4 + 1;  // a float multiplier per block, then its entry byte
  }
  if (columnwise && !transposed) n += tile_cols * (tile_rows / 16) + tile_cols * (tile_rows / ept);
  if (columnwise && transposed && ept > 16) n += tile_cols * (tile_rows / 16);
  if (columnwise && transposed) n += tile_cols * transposed_stage_stride(tile_rows, out_bits) / 4 + tile_cols * (tile_rows / 16) / 4;
  return (n + 3) / 4 * 4;
}

// Shared-memory bytes of cast_kernel (also computed by the host code generator): the staged
// tile (and its rotated copy with RHT), 4 bytes per element or 2 with 16-bit staging, then the
// scratch.
QF_HD constexpr u32 cast_smem_bytes(int tile_rows, int tile_cols, bool rht, int scratch_entries, bool stage16 = false) {
  return (stage16 ? 2u : 4u) * u32(tile_rows) * u32(tile_cols) * (rht ? 2u : 1u) + 4u * u32(scratch_entries);
}

// CTAs per SM the cast kernel asks registers for (Cfg::kMinBlocks, chosen by codegen): up to 5/8
// of the SM's threads (threads_per_sm 1280) where shared memory allows it (more loads in flight
// per SM; one tile per CTA has no other overlap).
QF_HD constexpr int cast_min_blocks(int threads, u32 smem_bytes, int threads_per_sm = 1280) {
  const int by_threads = threads_per_sm / threads, by_smem = int((227u * 1024u) / (smem_bytes + 1024u));
  const int n = by_threads < by_smem ? by_threads : by_smem;
  return n < 1 ? 1 : n;
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

// ---------------------------------------------------------------------------------- encoders

// Whether format F is e2m1 (the fp4 encoders below have fast paths for it).
template <class F>
constexpr bool kIsE2m1 = F::kBits == 4 && F::kExpBits == 2 && F::kManBits == 1;

// e2m1, round to nearest even, in one fp32 addition. a = min(|x|, 6) plus a number M whose ulp
// is the e2m1 step of a's binade (0.5 below 2, 1 in [2, 4), 2 from 4: M = 1.5 * 2^22, 2^23 or
// 2^24) rounds a onto the e2m1 grid, ties to even; M's low mantissa bits hold the code of the
// binade's first step (0, 2, 4) and the sign (8), both even, so ties still go to the even code
// and the sum's low byte is the 4-bit code. NaN -> +max (the fminf), as encode_rn. Returns the
// sum's bits: only the low byte is the code (pack_e2m1 packs them without masking).
__device__ __forceinline__ u32 e2m1_rn_byte(float x) {
  const float xm = fminf(x, 6.0f), a = fminf(fabsf(xm), 6.0f);
  // The exponent of max(a, 1) (127, 128 or 129) as a high product: on the FMA pipe, off the
  // integer pipe the rest of the kernel keeps busy.
  const u32 e = __umulhi(f32_bits(fmaxf(a, 1.0f)), 1u << 9);
  // Bit 3 of e * 0x800002 + 0x0B3FFF02 is 0 for e in 127..129: the sign goes in with an OR. The
  // sign's shift is a high product too (bits >> 28 = hi(bits * 16)).
  const u32 m = (e * 0x800002u + 0x0B3FFF02u) | (__umulhi(f32_bits(xm), 16u) & 8u);
  return f32_bits(a + f32_from_bits(m));
}

// Eight e2m1 codes b[0..7] (e2m1_rn_byte's low bytes, or enc_sr's codes) as one word, element 0
// in the low nibble.
__device__ __forceinline__ u32 pack_e2m1(const u32* b) {
  u32 p[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = b[2 * i] + (b[2 * i + 1] << 4);  // low byte: the pair
  return __byte_perm(__byte_perm(p[0], p[1], 0x0040), __byte_perm(p[2], p[3], 0x0040), 0x5410);
}

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
  if constexpr (kIsE2m1<F>) {
    return e2m1_rn_byte(x) & 0xFu;
  } else if constexpr (F::kIsInt && F::kBits == 8) {
    // encode_rn's clamp, then rint in one fp32 addition: c + 1.5 * 2^23 lies in [2^23, 2^24),
    // whose ulp is 1, so the sum is rounded to the nearest integer, ties to even (the constant
    // is even); its mantissa is 2^22 + rint(c), whose low byte is rint(c)'s two's complement
    // byte (2^22 is a multiple of 256). fminf / fmaxf clamp +-Inf; NaN is selected apart.
    if (f32_is_nan(x)) return F::kNanBits;
    const float c = fminf(fmaxf(x, F::kMinFinite), F::kMaxFinite);
    return f32_bits(c + 12582912.0f) & 0xFFu;
  } else {
    return encode_rn<F>(x);
  }
}

// The value of an e4m3 code (exact; NaN for 0x7F / 0xFF), through the hardware conversion
// where one exists.
__device__ __forceinline__ float e4m3_value(u32 bits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  float v;
  asm("{\n\t.reg .b16 t, lo, hi;\n\t.reg .b32 h2;\n\tcvt.u16.u32 t, %1;\n\tcvt.rn.f16x2.e4m3x2 h2, t;\n\t"
      "mov.b32 {lo, hi}, h2;\n\tcvt.f32.f16 %0, lo;\n\t}"
      : "=f"(v) : "r"(bits));
  return v;
#else
  return decode<E4M3>(u8(bits));
#endif
}

// Stochastic rounding, fast paths with the exact result of encode_sr<F> (numerics.cuh) for e2m1
// and int8, whose grid step is a power of two in each binade. e2m1 (B = kSrBits = 8 random bits R
// per element, floor(a / step + u) with u = R * 2^-B) goes without int <-> float conversions,
// floorf or a comparison, in two additions rounded toward zero:
// - v = step * (1 + R * 2^-B) is built from bits (the binade's exponent, R in the top of the
//   mantissa), and y = a + v rounded toward zero is at or above a grid point exactly when a + v
//   is (grid points are fp32 numbers, and rounding toward zero keeps them);
// - t = y + M rounded toward zero, with ulp(M) = step (M = 2^(22 + s) plus a whole number of
//   steps), is M + floor(y / step) * step = M + (floor(a / step + u) + 1) * step.
// M's whole steps are 255 + 2s + 8 * sign: the +1 of v's step carries them to 256 + the binade's
// first code (2s) + the sign (8), so t's low byte is the 4-bit code (as e2m1_rn_byte's, which the
// packing relies on). y stays below the next binade's second grid point (a <= 6 keeps the code at
// 7), so the count continues the binade's first code into the next binade as the codes do.
// enc_sr_e2m1 takes R already placed at bits [23 - B, 23) of `rp` (other bits are ignored), so
// the vector paths place each element's random byte with one shift of its Philox word
// (sr_placed_bits), which the lop3 building v masks.
template <class F>
__device__ __forceinline__ u32 enc_sr_e2m1(float x, u32 rp) {
  constexpr u32 kB = F::kSrBits;
  static_assert(kB <= 23, "R fits the mantissa");
  // NaN -> +6 (kNanBits, through fminf); Inf and |x| > 6 saturate to the code of 6.
  const float xm = fminf(x, 6.0f), a = fminf(fabsf(xm), 6.0f);
  // e = 127 + s, s the binade: 0 in [0, 2) (step 1/2, first code 0), 1 in [2, 4) (step 1, code
  // 2), 2 in [4, 6] (step 2, code 4). step = 2^(e - 128).
  const u32 e = __umulhi(f32_bits(fmaxf(a, 1.0f)), 1u << 9);
  // v's bits: the exponent of step, (e - 1) << 23, OR the placed R, in one lop3 ((a & b) | c).
  u32 vb;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(vb) : "r"(rp), "n"(((1u << kB) - 1u) << (23 - kB)), "r"((e - 1u) << 23));
  // M's bits: 0x4A800000 + (s << 23) + 255 + 2s + 8 * sign = e * 0x800002 + (0x0B000001 | sign):
  // the sign's bit 3 is clear in 0x0B000001, so the OR is the sum, and one IMAD adds it all. The
  // OR is one lop3 with the constant in a register (a lop3 takes one immediate).
  u32 sc;
  asm("lop3.b32 %0, %1, 8, %2, 0xEA;" : "=r"(sc) : "r"(__umulhi(f32_bits(xm), 16u)), "r"(0x0B000001u));
  const u32 mb = e * 0x800002u + sc;
  return f32_bits(__fadd_rz(__fadd_rz(a, f32_from_bits(vb)), f32_from_bits(mb)));
}

// x stochastically rounded with the random bits r as encode_sr<F> takes them: e2m1 returns bits
// whose low byte is the code (enc_sr_e2m1), the other formats the code.
template <class F>
__device__ __forceinline__ u32 enc_sr(float x, u32 r) {
  if constexpr (kIsE2m1<F>) {
    return enc_sr_e2m1<F>(x, r << (23 - F::kSrBits));
  } else if constexpr (F::kIsInt && F::kBits == 8) {
    // Floor and fraction are exact in fp32, and "fraction > u" is grid_round_sr's integer
    // comparison. Without branches (the branching form's BRA / BSSY / BSYNC were 11 % of the
    // instructions of int8_weight_sr's weight cast; ncu, H200, 16384^2): |x| clamped to 128 rounds to 128 (-128 for x <= -128; 127 after the positive clamp for
    // x >= 127), the signed integer's byte comes from one fp32 addition (enc_rn's), and NaN
    // (clamped to 128 on the way) is selected apart. (A conversion-free form of the comparison,
    // e2m1's before b8e416d, measured 2.6 % slower: 1504 -> 1543 us for int8_weight_sr's weight
    // at 16384^2, H100.)
    const float a = fminf(fabsf(x), 128.0f), lo = floorf(a), u = float(r >> 8) * 0x1p-24f;
    const float q = lo + ((a - lo) > u ? 1.0f : 0.0f);
    const float s = x < 0.0f ? -q : fminf(q, 127.0f);
    const u32 b = f32_bits(s + 12582912.0f) & 0xFFu;
    return f32_is_nan(x) ? u32(F::kNanBits) : b;
  } else {
    return encode_sr<F>(x, r);
  }
}

// The random bits of element i of a group from its Philox words, as the encoders take them: e2m1's
// byte placed for enc_sr_e2m1 (sr_pick's byte, shifted, the word's other bits left in), the
// others sr_pick's. i is a constant after unrolling, so the word and the shift are too.
template <class F>
__device__ __forceinline__ u32 sr_placed_bits(const u32 w[4], int i) {
  if constexpr (kIsE2m1<F>) {
    constexpr int kAt = 23 - F::kSrBits;
    const u32 v = sr_pick_word(w, sr_word_of<F>(u64(i)));
    const int sh = int(sr_bit_of<F>(u64(i)));
    return sh <= kAt ? v << (kAt - sh) : v >> (sh - kAt);
  } else {
    return sr_pick<F>(w, u64(i));
  }
}

// A run of n elements starting at element `first` of its group (first % n == 0, n a multiple of
// the elements per word): moves the run's words to the front of w, so that its element i's bits
// are element i's of the moved words, picked at constant indices. A run of the whole group is
// left as it is.
template <class F, int n>
__device__ __forceinline__ void sr_window(u32 w[4], u64 first) {
  constexpr int G = sr_group_elems<F>(), kWords = n * F::kSrBits / 32;
  static_assert(n % (32 / F::kSrBits) == 0 && G % n == 0, "a run of whole words inside one group");
  if constexpr (n < G) {
    const u32 run = u32((first % u64(G)) / u64(n));
    u32 v[kWords];
#pragma unroll
    for (int k = 0; k < kWords; ++k) v[k] = w[k];
#pragma unroll
    for (int j = 1; j < G / n; ++j)
#pragma unroll
      for (int k = 0; k < kWords; ++k) v[k] = run == u32(j) ? w[j * kWords + k] : v[k];
#pragma unroll
    for (int k = 0; k < kWords; ++k) w[k] = v[k];
  }
}

// Stochastic rounding of element i of a group whose Philox words are w (i constant after
// unrolling).
template <class F>
__device__ __forceinline__ u32 enc_sr_group(float x, const u32 w[4], int i) {
  if constexpr (kIsE2m1<F>) return enc_sr_e2m1<F>(x, sr_placed_bits<F>(w, i));
  else return enc_sr<F>(x, sr_placed_bits<F>(w, i));
}

// NaN bytes of four fp8 codes from cvt.satfinite set to the documented kNanBits (0x7F). NaN
// is the only input whose code has its low 7 bits at or above `first_nan` (e4m3 0x7F; e5m2:
// 0x7C, Inf, is never produced with satfinite, NaN codes are 0x7D..0x7F with either sign).
template <u32 kFirstNan>
__device__ __forceinline__ u32 fix_nan_bytes(u32 w) {
  constexpr u32 kAdd = (0x80u - kFirstNan) * 0x01010101u;
  if constexpr (kFirstNan == 0x7Fu) {  // 0x7F / 0xFF -> 0x7F: w & ~(t & 0x80808080) in one lop3
    const u32 t = (w & 0x7F7F7F7Fu) + kAdd;
    u32 r;
    asm("lop3.b32 %0, %1, %2, 0x80808080, 0x70;" : "=r"(r) : "r"(w), "r"(t));
    return r;
  }
  const u32 top = ((w & 0x7F7F7F7Fu) + kAdd) & 0x80808080u;  // bit 7 of each NaN byte
  const u32 full = (top >> 7) * 0xFFu;
  return (w & ~full) | (0x7F7F7F7Fu & full);
}

// Four scaled elements to the bits they are stored as, element 0 lowest: 8 bits each (fp8,
// int8, fp6 in a byte), 4 each for fp4. Round to nearest, or stochastic rounding with the random
// bits of element lin's group (lin % 4 == 0; sr_group_elems).
template <class S>
__device__ __forceinline__ u32 pack4(const QuantizeArgs& a, i64 lin, const float* x) {
  using F = typename S::Format;
  constexpr u32 kShift = F::kBits == 4 ? 4 : 8, kMask = (1u << kShift) - 1u;
  if constexpr (S::kStochastic) {
    u32 w[4];
    sr_random_group(a.seed, a.offset, u32(S::kDir), u64(lin) / u64(sr_group_elems<F>()), w);
    sr_window<F, 4>(w, u64(lin));
    u32 p = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) p |= (enc_sr_group<F>(x[i], w, i) & kMask) << (kShift * i);
    return p;
  } else if constexpr (kIsE2m1<F>) {
    const u32 p01 = e2m1_rn_byte(x[0]) + (e2m1_rn_byte(x[1]) << 4), p23 = e2m1_rn_byte(x[2]) + (e2m1_rn_byte(x[3]) << 4);
    return __byte_perm(p01, p23, 0x0040) & 0xFFFFu;
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (F::kBits == 8 && !F::kIsInt && (F::kExpBits == 4 || F::kExpBits == 5)) {
      u32 p;
      if constexpr (F::kExpBits == 4) {
        asm("{\n\t.reg .b16 l, h;\n\t"
            "cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n\t"
            "cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n\t"
            "mov.b32 %0, {l, h};\n\t}"
            : "=r"(p) : "f"(x[0]), "f"(x[1]), "f"(x[2]), "f"(x[3]));
        return fix_nan_bytes<0x7Fu>(p);
      } else {
        asm("{\n\t.reg .b16 l, h;\n\t"
            "cvt.rn.satfinite.e5m2x2.f32 l, %2, %1;\n\t"
            "cvt.rn.satfinite.e5m2x2.f32 h, %4, %3;\n\t"
            "mov.b32 %0, {l, h};\n\t}"
            : "=r"(p) : "f"(x[0]), "f"(x[1]), "f"(x[2]), "f"(x[3]));
        return fix_nan_bytes<0x7Du>(p);
      }
    }
#endif
    u32 p = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) p |= (enc_rn<F>(x[i]) & kMask) << (kShift * i);
    return p;
  }
}

// Bits one element of format F takes in its data buffer: 4 for fp4 (two per byte), the
// dtype's width for identity streams, a byte otherwise (fp6 and int8 included).
template <class F>
struct StoreBits {
  static constexpr int value = is_identity<F>::value ? F::kBits : F::kBits == 4 ? 4 : 8;
};

// N consecutive elements (N % 4 == 0, starting at element `lin`, lin % min(N, 16) == 0) as the
// words they are stored as, element 0 lowest: x holds the scaled values (identity streams: the
// input values), rounded to nearest or stochastically with the random bits of their groups.
template <class S, int N>
struct RunWords {
  static constexpr int kBytes = N * StoreBits<typename S::Format>::value / 8, kWords = kBytes / 4;
  u32 w[kWords < 1 ? 1 : kWords];
};
// Round-to-nearest e2m1 streams pack through e2m1_rn_byte / pack_e2m1.
template <class S>
constexpr bool kFastE2m1 = !S::kStochastic && kIsE2m1<typename S::Format>;

template <class S, int N>
__device__ __forceinline__ RunWords<S, N> pack_run(const QuantizeArgs& a, i64 lin, const float (&x)[N]) {
  using F = typename S::Format;
  RunWords<S, N> r;
  if constexpr (is_identity<F>::value) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      if constexpr (F::kDtype == 0) {
        r.w[i] = f32_bits(x[i]), r.w[i + 1] = f32_bits(x[i + 1]);
      } else {
        const u32 lo = F::kDtype == 1 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
        const u32 hi = F::kDtype == 1 ? f32_to_bf16(x[i + 1]) : f32_to_f16(x[i + 1]);
        r.w[i / 2] = lo | (hi << 16);
      }
    }
  } else if constexpr (F::kBits == 4 && N == 4) {
    r.w[0] = pack4<S>(a, lin, x);  // the low 16 bits
  } else if constexpr (kFastE2m1<S>) {
#pragma unroll
    for (int g = 0; g < N / 8; ++g) {
      u32 b[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) b[i] = e2m1_rn_byte(x[g * 8 + i]);
      r.w[g] = pack_e2m1(b);
    }
  } else if constexpr (F::kBits == 4) {
    // Stochastic e2m1: one group of random words per 16 elements, or per run of 8 (the group's
    // first or second half; lin % min(N, 16) == 0).
    constexpr int G = sr_group_elems<F>(), P = N < G ? N : G;
    static_assert(kIsE2m1<F> && S::kStochastic && G == 16, "fp4 is e2m1: RN took the branch above");
    u32 b[N];
#pragma unroll
    for (int g = 0; g < N / P; ++g) {
      u32 w[4];
      const u64 l = u64(lin) + u64(g * P);
      sr_random_group(a.seed, a.offset, u32(S::kDir), l / G, w);
      sr_window<F, P>(w, l);  // a run of 8: the group's first or second half
#pragma unroll
      for (int i = 0; i < P; ++i) b[g * P + i] = enc_sr_group<F>(x[g * P + i], w, i);  // constant picks
    }
#pragma unroll
    for (int j = 0; j < N / 8; ++j) r.w[j] = pack_e2m1(b + 8 * j);
  } else {
#pragma unroll
    for (int g = 0; g < N / 4; ++g) r.w[g] = pack4<S>(a, lin + g * 4, x + g * 4);
  }
  return r;
}

// B bytes of words to an address aligned to min(B, 16): 16-byte stores, or one narrower one.
template <int B>
__device__ __forceinline__ void store_words(void* p, const u32* w) {
  if constexpr (B >= 16) {
#pragma unroll
    for (int i = 0; i < B / 16; ++i) reinterpret_cast<uint4*>(p)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  } else if constexpr (B == 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else if constexpr (B == 4) {
    *reinterpret_cast<u32*>(p) = w[0];
  } else {
    static_assert(B == 2, "2, 4, 8 or a multiple of 16 bytes");
    *reinterpret_cast<u16*>(p) = u16(w[0]);
  }
}

// Stores N consecutive elements of one output row, starting at element `lin` (the element's
// offset in the stream's data buffer, which is also its stochastic-rounding index); x holds
// the scaled values (identity streams: the input values). Only the first `valid` are written.
// N is 4, 8 or 16; kAligned promises valid == N and lin % N == 0 (interior tiles): one vector
// store, no checks.
template <class S, int N, bool kAligned = false>
__device__ __forceinline__ void store_run(const QuantizeArgs& a, void* data, i64 lin, const float (&x)[N], int valid) {
  using F = typename S::Format;
  constexpr int kBits = StoreBits<F>::value;
  const bool vec = kAligned || (valid == N && lin % N == 0);
  if (vec) {
    if constexpr (N * kBits >= 16) {
      const RunWords<S, N> r = pack_run<S, N>(a, lin, x);
      store_words<RunWords<S, N>::kBytes>(static_cast<u8*>(data) + lin * kBits / 8, r.w);
      return;
    }
  }
  if constexpr (is_identity<F>::value) {
    if constexpr (F::kDtype == 0) {
      float* o = static_cast<float*>(data) + lin;
      for (int i = 0; i < valid; ++i) o[i] = x[i];
    } else {
      u16* o = static_cast<u16*>(data) + lin;
      for (int i = 0; i < valid; ++i) o[i] = u16(F::kDtype == 1 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]));
    }
  } else {
    // Edges: element by element (each with its own random bits).
    u32 q[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if constexpr (S::kStochastic)
        q[i] = i < valid ? enc_sr<F>(x[i], sr_random_bits<F>(a.seed, a.offset, u32(S::kDir), u64(lin + i))) : 0u;
      else
        q[i] = enc_rn<F>(x[i]);
    }
    if constexpr (F::kBits == 4) {
      // Two per byte, element 2i in the low nibble. lin is even (check_shape: packed rows are
      // even), so the pairs are this run's own.
      u8* o = static_cast<u8*>(data) + lin / 2;
      for (int i = 0; 2 * i < valid; ++i) o[i] = u8((q[2 * i] & 0xFu) | ((2 * i + 1 < valid ? q[2 * i + 1] & 0xFu : 0u) << 4));
    } else {
      u8* o = static_cast<u8*>(data) + lin;
      for (int i = 0; i < valid; ++i) o[i] = u8(q[i]);
    }
  }
}

// Scales N elements by one multiplier (identity streams keep their values) and stores them.
template <class S, int N, bool kAligned = false>
__device__ __forceinline__ void encode_store(const QuantizeArgs& a, void* data, i64 lin, const float (&v)[N],
                                             float mul, int valid) {
  float x[N];
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = is_identity<typename S::Format>::value ? v[i] : v[i] * mul;
  store_run<S, N, kAligned>(a, data, lin, x, valid);
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
    if constexpr (S::kStochastic) q = enc_sr<F>(v * mul, sr_random_bits<F>(a.seed, a.offset, u32(S::kDir), u64(lin)));
    else q = enc_rn<F>(v * mul);
    static_cast<u8*>(data)[lin] = u8(q);
  }
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

// ------------------------------------------------------------------------------------ tiles

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

// Loads the tile (zero outside the member / K): every load of a thread is issued before the
// first shared-memory store. With RHT and `rotate`, also the rotated copy (16-row groups per
// column, rounded to the input dtype) for the readers that cannot rotate in registers.
template <class Cfg>
__device__ void load_tile(const QuantizeArgs& a, const Member& mem, i64 col0, bool full, TileElem<Cfg>* tile,
                          TileElem<Cfg>* rtile, bool rotate = true) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, CH = TC / 4, N = TR * CH, T = Cfg::kThreads;
  constexpr int kIters = (N + T - 1) / T;
  const i64 row0 = mem.tile_row * TR;
  const bool vec = a.k % 4 == 0;
  float4 val[kIters];
  if (full) {
    load_tile_full<Cfg>(a, mem, col0, tile);
  } else {
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
      if (N % T == 0 || i < N) tst4(tile, tile_off<TC>(i / CH, (i % CH) * 4), val[it]);
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

// max |x| over the elements of one 16-byte chunk of the input (4 fp32 or 8 16-bit values; for
// 16-bit inputs packed abs/max on pairs, whose max ignores a NaN operand as amax_step does).
template <int D>
__device__ __forceinline__ float chunk_amax(const uint4& raw, float m) {
  if constexpr (D == 0) {
    return amax_step(amax_step(amax_step(amax_step(m, f32_from_bits(raw.x)), f32_from_bits(raw.y)), f32_from_bits(raw.z)),
                     f32_from_bits(raw.w));
  } else {
    u32 m2 = 0;
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (D == 1) asm("{\n\t.reg .b32 t;\n\tabs.bf16x2 t, %1;\n\tmax.bf16x2 %0, %0, t;\n\t}" : "+r"(m2) : "r"(w[e]));
      else asm("{\n\t.reg .b32 t;\n\tabs.f16x2 t, %1;\n\tmax.f16x2 %0, %0, t;\n\t}" : "+r"(m2) : "r"(w[e]));
    }
    const u16 lo = u16(m2), hi = u16(m2 >> 16);
    return fmaxf(m, D == 1 ? fmaxf(bf16_to_f32(lo), bf16_to_f32(hi)) : fmaxf(h2f(lo), h2f(hi)));
  }
}

// max |x| over an interior tile, straight from global memory: 16-byte loads, and for 16-bit
// inputs packed max/abs on pairs (max ignores a NaN operand, as amax_step does).
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
      for (int e = 0; e < 4; ++e) {
        if constexpr (Cfg::kInDtype == 1)
          asm("{\n\t.reg .b32 t;\n\tabs.bf16x2 t, %1;\n\tmax.bf16x2 %0, %0, t;\n\t}" : "+r"(m2) : "r"(w[e]));
        else
          asm("{\n\t.reg .b32 t;\n\tabs.f16x2 t, %1;\n\tmax.f16x2 %0, %0, t;\n\t}" : "+r"(m2) : "r"(w[e]));
      }
    }
    const u16 lo = u16(m2), hi = u16(m2 >> 16);
    return Cfg::kInDtype == 1 ? fmaxf(bf16_to_f32(lo), bf16_to_f32(hi)) : fmaxf(f16_to_f32(lo), f16_to_f32(hi));
  }
}

// Per-row and per-column amaxes of an interior tile straight from global memory, without staging
// (the pre-pass of per-channel plans with a transposed copy: fp8_rowwise, int8_weight_sr
// training). Warp w takes rows w, w + W, ... (W = T / 32 warps), each lane the same 16-byte
// chunks of every row it reads, so a thread keeps its columns' maxima in registers over the
// rows; a row's maximum is a warp reduction, one atomic per row; the columns' maxima meet in
// shared memory (`scratch`, W * TC floats), one atomic per column. Every load of a thread is in
// flight before the first maximum. row_amax / col_amax: the slots' bases for this member (null:
// that reduction is not wanted).
template <class Cfg>
__device__ __forceinline__ void tile_row_col_amaxes_full(const QuantizeArgs& a, const Member& mem, i64 col0, float* row_amax,
                                                         float* col_amax, float* scratch) {
  constexpr int D = Cfg::kInDtype, E = kElemsPer16<D>, TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads;
  constexpr int W = T / 32, CH = TC / E, J = CH / 32, R = TR / W;
  static_assert(CH % 32 == 0 && TR % W == 0, "whole warps of 16-byte chunks across the tile, whole rows per warp");
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const i64 row0 = mem.tile_row * TR;
  const char* base = static_cast<const char*>(a.x) + ((mem.row_base + row0) * a.k + col0) * kInBytes<D>;
  uint4 raw[R][J];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < J; ++j)
      raw[i][j] = __ldg(reinterpret_cast<const uint4*>(base + (i64(warp + i * W) * a.k + (lane + 32 * j) * E) * kInBytes<D>));
  float col[J][E];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < E; ++e) col[j][e] = 0.0f;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      float v[E];
      unpack16<D>(raw[i][j], v);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        col[j][e] = amax_step(col[j][e], v[e]);
        m = amax_step(m, v[e]);
      }
    }
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

// Per-stream values that do not change over the tile.
template <class S>
struct StreamCtx {
  float tensor_amax = 0.0f, delayed_scale = 1.0f;
  float nvfp4_k = 0.0f, nvfp4_s_dec = 0.0f;  // NVFP4: S_enc / 6 and S_dec of the tensor amax
  i64 grid_rows = 0, grid_prows = 0, grid_pcols = 0;  // the member's scale grid, padded (scale_grid)
};

template <class Cfg, class S>
__device__ __forceinline__ StreamCtx<S> stream_ctx(const QuantizeArgs& a, const Member& mem) {
  StreamCtx<S> c;
  if constexpr (S::kTensorAmax >= 0 && S::kMode != kModeTensorDelayed) c.tensor_amax = a.amax[S::kTensorAmax][mem.index];
  if constexpr (S::kMode == kModeTensorDelayed) c.delayed_scale = *a.streams[S::kIndex].scale_in;
  if constexpr (S::kMode == kModeNvfp4) {
    const float s_enc = nvfp4_global_encode_scale(c.tensor_amax);
    c.nvfp4_k = s_enc / E2M1::kMaxFinite;
    c.nvfp4_s_dec = nvfp4_global_decode_scale(s_enc);
  }
  i64 gc;
  scale_grid<S>(S::kTransposed ? a.k : mem.rows, S::kTransposed ? mem.rows : a.k, c.grid_rows, gc, c.grid_prows, c.grid_pcols);
  return c;
}

// The scale of one block: the element multiplier and the stored scale entry (fp32 bits or a
// byte), from the amaxes the mode depends on.
template <class Cfg, class S>
__device__ __forceinline__ void block_scale(float block_amax, const StreamCtx<S>& ctx, float& mul, u32& entry) {
  const float tensor_amax = ctx.tensor_amax, delayed_scale = ctx.delayed_scale;
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
    if constexpr (F::kIsInt) {  // torchao's int8 rule
      const float scale = int8_channel_scale(block_amax, Cfg::kInDtype);
      mul = int8_channel_multiplier(scale);
      entry = f32_bits(scale);
    } else {  // fp8: current scaling's rule per channel
      const float scale = compute_scale(block_amax, F::kMaxFinite, S::kEpsilon, S::kPow2, kFltMax);
      mul = scale;
      entry = f32_bits(1.0f / scale);
    }
  } else if constexpr (S::kMode == kModeMx) {
    const u8 e = S::kMxFloor ? e8m0_floor(block_amax, F::kEmax)
                             : e8m0_rceil(block_amax * (1.0f / F::kMaxFinite));
    mul = mx_multiplier(e);
    entry = e;
  } else if constexpr (S::kMode == kModeNvfp4) {
    // nvfp4_block_scale / nvfp4_element_multiplier (numerics.cuh) with the hardware e4m3
    // conversions (bit-identical: enc_rn is checked exhaustively, the decode is exact).
    const u32 sb = enc_rn<E4M3>(block_amax * ctx.nvfp4_k);
    mul = fminf(1.0f / (e4m3_value(sb) * ctx.nvfp4_s_dec), kFltMax);
    entry = sb;
  } else {
    mul = 1.0f;
    entry = 0;
  }
}

// MX and NVFP4 scale entries are bytes (e8m0, e4m3); the others fp32 bits.
template <class S>
constexpr bool kByteEntries = S::kMode == kModeMx || S::kMode == kModeNvfp4;

template <class S>
__device__ __forceinline__ void store_entry(void* base, i64 off, u32 entry) {
  if constexpr (kByteEntries<S>)
    static_cast<u8*>(base)[off] = u8(entry);
  else
    static_cast<u32*>(base)[off] = entry;
}

// A compact grid of block scales (fp32 entries: `block` scaling) gets 4 bytes per data row from
// each tile, so a row's 32-byte sector of entries is completed by 8 CTAs, which the column-fastest
// tile order runs together. Those partial sectors are stored at L2 priority evict_last, so that
// the input and outputs streaming through L2 do not evict them before they are complete (the
// likely mechanism; H100, 1x128 blockwise row + transposed at 16384^2: 410-412 us with normal
// stores, 393-397 with these, 383 with no entries at all; docs/quantize.md, "Scattered rowwise scale
// entries kept in L2"). Byte entries (MX, NVFP4) keep
// normal stores: there the hint measured 0.5 % faster (MXFP8) to 1 % slower (NVFP4, the hybrid);
// so do per-channel entries (whole sectors already; the asm's ordering made their kernels spill
// more). A line keeps the priority until its next access at another priority (the GEMM's loads of
// the grid) or until other evict_last lines evict it.
__device__ __forceinline__ u64 l2_evict_last_policy() {
  u64 policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void store_kept(u32* p, u32 v) {
  asm volatile("st.global.L2::cache_hint.b32 [%0], %1, %2;" ::"l"(p), "r"(v), "l"(l2_evict_last_policy()) : "memory");
}

// Writes the scale entry of the block whose first element is at data-layout (dr, dc), if that
// element starts an entry.
template <class S>
__device__ __forceinline__ void maybe_store_entry(const StreamArgs& out, i64 dr, i64 dc, const StreamCtx<S>& ctx,
                                                  i64 scale_base, u32 entry) {
  if constexpr (S::kMode != kModeNone && (S::kEntryRows != 0 || S::kEntryCols != 0)) {
    // dr, dc >= 0: unsigned division (shifts and masks for the power-of-two entries).
    const u64 ur = u64(dr), uc = u64(dc);
    const bool starts = (S::kEntryRows ? ur % u64(S::kEntryRows) == 0 : ur == 0) &&
                        (S::kEntryCols ? uc % u64(S::kEntryCols) == 0 : uc == 0);
    if (starts) {
      const i64 er = S::kEntryRows ? i64(ur / u64(S::kEntryRows)) : 0, ec = S::kEntryCols ? i64(uc / u64(S::kEntryCols)) : 0;
      const i64 off = S::kSwizzled  ? i64(swizzled_scale_offset(u64(er), u64(ec), u64(ctx.grid_pcols)))
                      : S::kMnMajor ? i64(mn_major_scale_offset(u64(er), u64(ec), u64(ctx.grid_prows)))
                                    : er * ctx.grid_pcols + ec;
      if constexpr (S::kMode == kModeBlock && !S::kMnMajor)
        store_kept(static_cast<u32*>(out.scale_inv) + scale_base + off, entry);
      else
        store_entry<S>(out.scale_inv, scale_base + off, entry);
      // mn_major: the last row's writer zeroes the padding after it (up to 3 entries per column).
      // (Unrolled: a loop to grid_prows made the rowwise-only cast spill.)
      if constexpr (S::kMnMajor)
        if (er + 1 == ctx.grid_rows) {
          const int pad = int(ctx.grid_prows - ctx.grid_rows);
#pragma unroll
          for (int p = 1; p <= 3; ++p)
            if (p <= pad) store_entry<S>(out.scale_inv, scale_base + off + p, 0u);
        }
    }
  }
}

// max |x| over tile row r, columns [c0, c0 + B) (c0 % B == 0, B % 4 == 0), by 16-byte reads.
// The swizzle permutes chunks only inside aligned groups of 8 (tile_off), so a run of whole
// groups (B >= 32) is read slot by slot: one swizzled offset per slot, its chunk in each group
// at a constant distance (immediate offsets; max ignores the order). Four running maxima.
template <int TC, int B, class Elem>
__device__ __forceinline__ float row_run_amax(const Elem* src, int r, int c0) {
  float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto step = [&](int off) {
    const float4 f = tld4(src, off);
    m[0] = amax_step(m[0], f.x), m[1] = amax_step(m[1], f.y), m[2] = amax_step(m[2], f.z), m[3] = amax_step(m[3], f.w);
  };
  if constexpr (B % 32 == 0) {
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const int off = tile_off<TC>(r, c0 + 4 * p);
#pragma unroll
      for (int g = 0; g < B / 32; ++g) step(off + 32 * g);
    }
  } else {
#pragma unroll
    for (int q = 0; q < B; q += 4) step(tile_off<TC>(r, c0 + q));
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

// -------------------------------------------------------------------------------- streams

// Byte scale entries (MX, NVFP4) in the compact or mn_major layout: staged in shared memory and
// copied out with lanes on consecutive entries: compact, a tile's entries of one data row are
// consecutive bytes (a store request per row instead of one per entry); mn_major (MX), those of
// one block column are (copy_entries_mn_major).
template <class S>
constexpr bool kStagedEntries = kByteEntries<S> && !S::kSwizzled;

// Copies rows x per_row staged entry bytes (src 4-byte aligned) to rows `pitch` bytes apart
// (every thread calls it, after a barrier that follows the last staging write): a thread per
// 4 or 2 bytes of a row where the rows allow it (the common case: a tile's row of MX entries is
// 4 bytes, its transposed column 2 or 4), else a thread per byte.
template <int W>
struct EntryUnit {
  using type = u8;
};
template <>
struct EntryUnit<2> {
  using type = u16;
};
template <>
struct EntryUnit<4> {
  using type = u32;
};
template <int T, int W>
__device__ __forceinline__ void copy_entry_units(u8* dst, i64 pitch, const u8* src, int rows, int per_row) {
  using U = typename EntryUnit<W>::type;
  const int units = per_row / W;
  for (int j = threadIdx.x; j < rows * units; j += T)
    reinterpret_cast<U*>(dst + (j / units) * pitch)[j % units] = reinterpret_cast<const U*>(src)[j];
}
template <int T>
__device__ __forceinline__ void copy_entries(u8* dst, i64 pitch, const u8* src, int rows, int per_row) {
  const u64 align = reinterpret_cast<u64>(dst) | u64(pitch);
  if (per_row % 4 == 0 && align % 4 == 0) copy_entry_units<T, 4>(dst, pitch, src, rows, per_row);
  else if (per_row % 2 == 0 && align % 2 == 0) copy_entry_units<T, 2>(dst, pitch, src, rows, per_row);
  else copy_entry_units<T, 1>(dst, pitch, src, rows, per_row);
}

// The same staged entries (src [rows][per_row]) into an mn_major grid: entry column b of the tile is
// a run of `rows` consecutive bytes at dst + b * pitch (pitch: the grid's padded rows). A thread per
// 4 rows of a run where dst and pitch allow (the interior tiles' rows start at a multiple of the
// tile's, and mn_major grids pad their rows to 4), else a thread per byte. Against the compact
// layout's run of per_row bytes per row, this writes whole 32-byte sectors: `mxfp8_hopper`'s row +
// transposed cast 455.7 -> 395.5 us at 16384^2 on an H100 (docs/quantize.md).
template <int T>
__device__ __forceinline__ void copy_entries_mn_major(u8* dst, i64 pitch, const u8* src, int rows, int per_row) {
  if ((rows & 3) == 0 && ((reinterpret_cast<u64>(dst) | u64(pitch)) & 3) == 0) {
    const int quads = rows / 4;
    for (int j = threadIdx.x; j < per_row * quads; j += T) {
      const int b = j / quads, q = j - b * quads;
      const u8* e = src + 4 * q * per_row + b;
      *reinterpret_cast<u32*>(dst + b * pitch + 4 * q) =
          u32(e[0]) | u32(e[per_row]) << 8 | u32(e[2 * per_row]) << 16 | u32(e[3 * per_row]) << 24;
    }
  } else {
    for (int j = threadIdx.x; j < per_row * rows; j += T) {
      const int b = j / rows, r = j - b * rows;
      dst[b * pitch + r] = src[r * per_row + b];
    }
  }
}

// Copies a tile's staged byte entries, rows x per_row ([rows][per_row], src 4-byte aligned), whose
// first is entry (er, ec) of the stream's grid, into that grid in the stream's layout.
template <class S, int T>
__device__ __forceinline__ void copy_staged_entries(void* scale_inv, i64 scale_base, const StreamCtx<S>& ctx, i64 er,
                                                    i64 ec, const u8* src, int rows, int per_row) {
  u8* grid = static_cast<u8*>(scale_inv) + scale_base;
  if constexpr (S::kMnMajor)
    copy_entries_mn_major<T>(grid + ec * ctx.grid_prows + er, ctx.grid_prows, src, rows, per_row);
  else
    copy_entries<T>(grid + er * ctx.grid_pcols + ec, ctx.grid_pcols, src, rows, per_row);
}

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
#pragma unroll 4
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

// Columnwise stream: runs of kEpt rows of one column, lanes on consecutive columns. Transposed
// ([K, M]): each 16-row chunk is one vector store into the output row of its column; same
// layout ([M, K]): element stores (consecutive lanes fill consecutive bytes of a row).
template <class Cfg, class S>
__device__ float cast_columnwise(const QuantizeArgs& a, const Member& mem, i64 col0, const TileElem<Cfg>* src,
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
    for (int e = 0; e < L; ++e) amax = amax_step(amax, tld(src, tile_off<TC>(r + e, c)));
    if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);
    float block_amax = amax;
    if constexpr (S::kBlock2d) {
      block_amax = f32_from_bits(bamax[(r / S::kBlockRows) * (TC / S::kBlockCols) + c / S::kBlockCols]);
    } else if constexpr (S::kMode == kModeChannel) {
      block_amax = a.amax[S::kLocalAmax][i64(mem.index) * a.k + cg];
    }
    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, ctx, mul, entry);
    const i64 dr = S::kTransposed ? cg : rl, dc = S::kTransposed ? rl : cg;
    maybe_store_entry<S>(out, dr, dc, ctx, scale_base, entry);
    const i64 left = mem.rows - rl;
    if constexpr (S::kTransposed) {
      const i64 line = data_base + cg * mem.rows + rl;  // output row cg, element rl
#pragma unroll 1
      for (int e0 = 0; e0 < L; e0 += 16) {
        if (left <= e0) break;
        float v[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) v[e] = tld(src, tile_off<TC>(r + e0 + e, c));
        encode_store<S, 16>(a, out.data, line + e0, v, mul, left - e0 >= 16 ? 16 : int(left - e0));
      }
    } else {
#pragma unroll 4
      for (int e = 0; e < L; ++e) {
        if (e >= left) break;
        encode_store1<S>(a, out.data, data_base + (rl + e) * a.k + cg, tld(src, tile_off<TC>(r + e, c)), mul);
      }
    }
  }
  return reported;
}

// Partial amaxes of the tile's columns, 16 rows each: part[seg * TC + c] = max |tile[seg*16 .. +15][c]|,
// by row walks: one item is a 16-row segment of one 4-column chunk (16 vector reads, lanes on
// consecutive chunks of the same rows), a quarter of the shared-memory reads of a column walk.
// Returns the max over this thread's partials.
template <class Cfg>
__device__ float column_partials(const TileElem<Cfg>* src, float* part) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, CH = TC / 4, N = CH * (TR / 16), T = Cfg::kThreads;
  float all = 0.0f;
#pragma unroll 2
  for (int it = 0; it < (N + T - 1) / T; ++it) {
    if (item_past_end<N, T>(it)) break;
    int seg, q;
    item_rc<CH, T>(it, seg, q);
    float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const float4 f = tld4(src, tile_off<TC>(seg * 16 + e, 4 * q));
      m[0] = amax_step(m[0], f.x), m[1] = amax_step(m[1], f.y), m[2] = amax_step(m[2], f.z), m[3] = amax_step(m[3], f.w);
    }
    *reinterpret_cast<float4*>(part + seg * TC + 4 * q) = make_float4(m[0], m[1], m[2], m[3]);
    all = fmaxf(all, fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3])));
  }
  return all;
}

// The block amax of a columnwise stream for tile column c, rows [r, r + L) of its block (or the
// 2D block / channel holding them), where the caller's own 16-row amax is `own`.
template <class Cfg, class S>
__device__ __forceinline__ float column_block_amax(const QuantizeArgs& a, const Member& mem, i64 col0, int r, int c,
                                                   const u32* bamax, const float* part, float own) {
  constexpr int TC = Cfg::kTileCols, L = S::kEpt;
  if constexpr (S::kBlock2d) {
    return f32_from_bits(bamax[(r / S::kBlockRows) * (TC / S::kBlockCols) + c / S::kBlockCols]);
  } else if constexpr (S::kMode == kModeChannel) {
    return a.amax[S::kLocalAmax][i64(mem.index) * a.k + col0 + c];
  } else if constexpr (L > 16 && (S::kMode == kModeBlock || S::kMode == kModeMx || S::kMode == kModeNvfp4)) {
    float m = 0.0f;
#pragma unroll
    for (int s = 0; s < L / 16; ++s) m = fmaxf(m, part[((r / L) * (L / 16) + s) * TC + c]);
    return m;
  } else {
    return own;
  }
}

// RHT streams whose interior tiles rotate each 16-row group in registers, from the raw tile
// (transposed, one thread per 16 rows); the others read the rotated copy load_tile makes.
template <class S>
constexpr bool kRhtInRegisters = S::kRht && S::kTransposed && S::kEpt == 16 && !S::kBlock2d;

// Interior tile, transposed columnwise stream ([K, M] per member, mem.rows % 16 == 0): one
// thread per 16 rows of a column, read once from shared memory (RHT streams: the raw tile,
// rotated in registers), encoded into the staged output (transposed_stage_stride), which the
// CTA then copies out row by row. Blocks longer than 16 rows read the partials column_partials
// left in `part`.
template <class Cfg, class S>
__device__ float cast_columnwise_transposed_full(const QuantizeArgs& a, const Member& mem, i64 col0, const TileElem<Cfg>* src,
                                                 const u32* bamax, const float* part, u8* stage, i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, N = TC * (TR / 16), T = Cfg::kThreads;
  constexpr int kBits = StoreBits<typename S::Format>::value, RS = transposed_stage_stride(TR, kBits);
  // Byte entries, one per kEntryCols rows of a column (compact or mn_major layout), staged too: EPR per
  // tile column, copied out with the data.
  constexpr bool kStageEntries = kStagedEntries<S> && S::kEntryRows == 1 && S::kEntryCols >= 16 && TR % S::kEntryCols == 0;
  constexpr int EPR = kStageEntries ? TR / S::kEntryCols : 1;
  u8* entries = stage + TC * RS;
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR, tile_lin = mem.row_base * a.k + col0 * mem.rows + row0;
  float reported = 0.0f;
#pragma unroll 2
  for (int it = 0; it < (N + T - 1) / T; ++it) {
    if (item_past_end<N, T>(it)) break;
    int r, c;
    item_rc<TC, T>(it, r, c);
    r *= 16;
    float v[16], amax = 0.0f;
    if constexpr (kRhtInRegisters<S>) rotated_group<Cfg>(src, r, c, v);
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      if constexpr (!kRhtInRegisters<S>) v[e] = tld(src, tile_off<TC>(r + e, c));
      amax = amax_step(amax, v[e]);
    }
    if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);
    const float block_amax = column_block_amax<Cfg, S>(a, mem, col0, r, c, bamax, part, amax);
    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, ctx, mul, entry);
    if constexpr (kStageEntries) {
      if (r % S::kEntryCols == 0) entries[c * EPR + r / S::kEntryCols] = u8(entry);
    } else {
      maybe_store_entry<S>(out, col0 + c, row0 + r, ctx, scale_base, entry);
    }
    float x[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) x[e] = is_identity<typename S::Format>::value ? v[e] : v[e] * mul;
    const RunWords<S, 16> w = pack_run<S, 16>(a, tile_lin + i64(c) * mem.rows + r, x);
    store_words<RunWords<S, 16>::kBytes>(stage + c * RS + r * kBits / 8, w.w);
  }
  __syncthreads();
  // Copy-out: units of U bytes, consecutive lanes on consecutive units of one output row. Every
  // output row of the tile starts at an element offset that is a multiple of 16 (a.k and
  // mem.rows are), so at a multiple of U bytes.
  constexpr int U = transposed_unit_bytes(kBits), UPR = TR * kBits / 8 / U, NU = TC * UPR;
  u8* dst = static_cast<u8*>(out.data) + tile_lin * kBits / 8;
  const i64 row_bytes = mem.rows * kBits / 8;
#pragma unroll 4
  for (int it = 0; it < (NU + T - 1) / T; ++it) {
    if (item_past_end<NU, T>(it)) break;
    int c, u;
    item_rc<UPR, T>(it, c, u);
    const u8* p = stage + c * RS + u * U;
    u8* q = dst + c * row_bytes + u * U;
    if constexpr (U == 16) *reinterpret_cast<uint4*>(q) = *reinterpret_cast<const uint4*>(p);
    else *reinterpret_cast<uint2*>(q) = *reinterpret_cast<const uint2*>(p);
  }
  if constexpr (kStageEntries) copy_staged_entries<S, T>(out.scale_inv, scale_base, ctx, col0, row0 / S::kEntryCols, entries, TC, EPR);
  return reported;
}

// A plan of a rowwise stream with 1x128 blocks and its transposed copy with 128x1 blocks (1x128
// blockwise row + transposed; 8-bit formats, round to nearest, no RHT, 16-bit input) casts
// interior 128 x 128 tiles from registers: no staged input. Warp w holds rows [16w, 16w + 16) of
// the tile, lane l columns [4l, 4l + 4) (one 8-byte load per row); a row's amax is a warp
// reduction by halving exchanges, a column's the maximum of the warps' 16-row partials (one
// exchange through shared memory). Only the transposed output is staged, so that it is copied
// out in whole 128-byte output rows. Edge tiles take the staged path (whose shared memory the
// kernel keeps). H100, 16384^2: 429 -> 411 us, 84 -> 88 % of copy (docs/quantize.md, "Row +
// transposed cast from registers").
template <class Cfg, class R, class C>
constexpr bool kPairDirect =
    R::kDir == 0 && C::kDir == 1 && C::kTransposed && R::kMode == kModeBlock && C::kMode == kModeBlock && !R::kBlock2d &&
    !C::kBlock2d && !R::kRht && !C::kRht && !R::kStochastic && !C::kStochastic && !Cfg::kRht &&
    StoreBits<typename R::Format>::value == 8 && StoreBits<typename C::Format>::value == 8 &&
    !is_identity<typename R::Format>::value && !is_identity<typename C::Format>::value && Cfg::kInDtype != 0 &&
    Cfg::kTileRows == 128 && Cfg::kTileCols == 128 && Cfg::kThreads == 256 && R::kBlockCols == 128 && C::kEpt == 128;

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

template <class Cfg, class R, class C>
__device__ void cast_pair_direct(const QuantizeArgs& a, const Member& mem, i64 col0, i64 base_r, i64 base_c) {
  constexpr int D = Cfg::kInDtype, TR = 128;
  static_assert(8 * 32 * 16 + 128 * TR <= int(Cfg::kSmemBytes), "the staged path's shared memory holds this path's");
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

  // Rowwise: the 16 rows' amaxes, reduced across the warp by halving exchanges (16 shuffles);
  // lane l ends with row l / 2's. (Written as one loop over the halvings, ptxas kept the array in
  // local memory: 488 us instead of 411.)
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
  {
    const StreamArgs& out = a.streams[R::kIndex];
    const StreamCtx<R> ctx = stream_ctx<Cfg, R>(a, mem);
    float mul;
    u32 entry;
    block_scale<Cfg, R>(m[0], ctx, mul, entry);
    if (l % 2 == 0) maybe_store_entry<R>(out, row0 + w * 16 + l / 2, col0, ctx, base_r, entry);
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const float me = __shfl_sync(0xFFFFFFFFu, mul, 2 * e);
      float x[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = pair_elem<D>(v[e], j);
      encode_store<R, 4, true>(a, out.data, lin_r + i64(e) * a.k, x, me, 4);
    }
  }

  // Columnwise: this warp's 16-row amax of each of the lane's 4 columns, then all 8 warps'.
  float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int e = 0; e < 16; ++e)
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = amax_step(p[j], pair_elem<D>(v[e], j));
  part[w * 32 + l] = make_float4(p[0], p[1], p[2], p[3]);
  __syncthreads();
#pragma unroll
  for (int o = 0; o < 8; ++o) {
    const float4 q = part[o * 32 + l];
    p[0] = fmaxf(p[0], q.x), p[1] = fmaxf(p[1], q.y), p[2] = fmaxf(p[2], q.z), p[3] = fmaxf(p[3], q.w);
  }
  const StreamArgs& out = a.streams[C::kIndex];
  const StreamCtx<C> ctx = stream_ctx<Cfg, C>(a, mem);
  const i64 tile_c = mem.row_base * a.k + col0 * mem.rows + row0;  // transposed: output row col0, element row0
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int c = 4 * l + j;
    float mul;
    u32 entry;
    block_scale<Cfg, C>(p[j], ctx, mul, entry);
    if (w == 0) maybe_store_entry<C>(out, col0 + c, row0, ctx, base_c, entry);
    float x[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) x[e] = pair_elem<D>(v[e], j) * mul;
    const RunWords<C, 16> rw = pack_run<C, 16>(a, tile_c + i64(c) * mem.rows + w * 16, x);
    // Output row c, bytes [16w, 16w + 16): 16-byte chunk w of the staged row, its position
    // swizzled by the lane (l % 8), so that a quarter warp's stores hit 8 distinct chunks.
    store_words<16>(stage + c * TR + ((w ^ (l & 7)) * 16), rw.w);
  }
  __syncthreads();
  u8* dst = static_cast<u8*>(out.data) + tile_c;
#pragma unroll
  for (int it = 0; it < 4; ++it) {
    const int u = it * 256 + int(threadIdx.x), c = u / 8, k = u % 8;
    *reinterpret_cast<uint4*>(dst + i64(c) * mem.rows + k * 16) =
        *reinterpret_cast<const uint4*>(stage + c * TR + ((k ^ ((c >> 2) & 7)) * 16));
  }
}

// Interior tile, same-layout columnwise stream ([M, K], scale blocks along M): the block
// multipliers first (one per column and block, through the partial amaxes), into `mul_out`;
// then runs of 4 elements of a row, as the rowwise stream, each element with its column's
// multiplier.
template <class Cfg, class S>
__device__ float cast_columnwise_same_full(const QuantizeArgs& a, const Member& mem, i64 col0, const TileElem<Cfg>* src,
                                           const u32* bamax, float* part, float* mul_out, i64 scale_base) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads, L = S::kEpt, NB = TC * (TR / L);
  constexpr int CH = TC / 4, N = TR * CH;
  static_assert(TR % L == 0 && L % 16 == 0, "columnwise runs: whole 16-row chunks");
  const StreamArgs& out = a.streams[S::kIndex];
  const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
  const i64 row0 = mem.tile_row * TR;
  float reported = column_partials<Cfg>(src, part);
  __syncthreads();
  for (int it = 0; it < (NB + T - 1) / T; ++it) {
    if (item_past_end<NB, T>(it)) break;
    int r, c;
    item_rc<TC, T>(it, r, c);
    const int j = r * TC + c;
    r *= L;
    float own = 0.0f;  // a 16-row block: its one partial
    if constexpr (L == 16) own = part[(r / 16) * TC + c];
    const float block_amax = column_block_amax<Cfg, S>(a, mem, col0, r, c, bamax, part, own);
    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, ctx, mul, entry);
    mul_out[j] = mul;
    maybe_store_entry<S>(out, row0 + r, col0 + c, ctx, scale_base, entry);
  }
  __syncthreads();
  const i64 tile_lin = (mem.row_base + row0) * a.k + col0;
#pragma unroll 4
  for (int it = 0; it < (N + T - 1) / T; ++it) {
    if (item_past_end<N, T>(it)) break;
    int r, c;
    item_rc<CH, T>(it, r, c);
    c *= 4;
    const float4 f = tld4(src, tile_off<TC>(r, c));
    const float4 m = *reinterpret_cast<const float4*>(mul_out + (r / L) * TC + c);
    const bool id = is_identity<typename S::Format>::value;
    const float x[4] = {id ? f.x : f.x * m.x, id ? f.y : f.y * m.y, id ? f.z : f.z * m.z, id ? f.w : f.w * m.w};
    store_run<S, 4, true>(a, out.data, tile_lin + i64(r) * a.k + c, x, 4);
  }
  return reported;
}

// One stream over the tile. `full`: an interior tile with K % 16 == 0 (same for the whole CTA).
// A per-tensor scale is one entry, written by the member's first tile.
template <class Cfg, class S>
__device__ __forceinline__ void store_tensor_entry(const QuantizeArgs& a, const Member& mem, i64 col0, i64 scale_base) {
  if constexpr (S::kMode != kModeNone && S::kEntryRows == 0 && S::kEntryCols == 0) {
    if (mem.tile_row == 0 && col0 == 0 && threadIdx.x == 0) {
      const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
      float mul;
      u32 entry;
      block_scale<Cfg, S>(0.0f, ctx, mul, entry);
      store_entry<S>(a.streams[S::kIndex].scale_inv, scale_base, entry);
    }
  }
}

template <class Cfg, class S>
__device__ __forceinline__ void cast_stream(const QuantizeArgs& a, const Member& mem, i64 col0, bool full,
                                            const TileElem<Cfg>* tile, const TileElem<Cfg>* rtile, float* scratch, i64 scale_base,
                                            bool report) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols;
  store_tensor_entry<Cfg, S>(a, mem, col0, scale_base);
  const bool transposed_full = S::kTransposed && full && mem.rows % 16 == 0;
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

// Grouped launches get one extra tile row, whose CTAs write every scale entry of the empty
// members (no tile of theirs exists): the scale of an all-zero block. That is the per-tensor
// entry, and the per-channel entries of a columnwise stream (one per column, either layout); block grids of an
// empty member have no entries. The entries are spread over every thread of the row.
template <class Cfg, class... S>
__device__ void fill_empty_members(const QuantizeArgs& a, i64 cta) {
  const i64 first = cta * Cfg::kThreads + threadIdx.x, stride = i64(gridDim.y) * Cfg::kThreads;
  i64 bases[kMaxStreams] = {};
  for (int g = 0; g < a.num_members; ++g) {
    const i64 mg = a.member_rows[g + 1] - a.member_rows[g];
    int s = 0;
    (
        [&] {
          if (mg == 0) {
            StreamCtx<S> ctx;
            if constexpr (S::kMode == kModeTensorDelayed) ctx.delayed_scale = *a.streams[S::kIndex].scale_in;
            float mul;
            u32 entry;
            block_scale<Cfg, S>(0.0f, ctx, mul, entry);
            const i64 n = scale_grid_size<S>(0, a.k);
            for (i64 e = first; e < n; e += stride) store_entry<S>(a.streams[S::kIndex].scale_inv, bases[s] + e, entry);
          }
          bases[s] += scale_grid_size<S>(mg, a.k);
          ++s;
        }(),
        ...);
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

namespace detail {

// The cast of one tile, all streams; kFused: the single-tensor, cooperative form (fused_kernel).
template <class Cfg, class Pre, bool kFused, class... S>
__device__ __forceinline__ void cast_tile(const QuantizeArgs& a) {
  // Fused: CTA 0 zeroes the amax outputs (the separate form's memsets), also on a no-op call,
  // whose amax outputs read zero either way.
  if constexpr (kFused) {
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
  static_assert(cast_smem_bytes(Cfg::kTileRows, Cfg::kTileCols, Cfg::kRht,
                                (0 + ... + cast_scratch_entries(Cfg::kTileRows, Cfg::kTileCols, S::kDir == 1, S::kTransposed,
                                                                S::kEpt, S::kBlock2d, S::kBlockRows, S::kBlockCols,
                                                                StoreBits<typename S::Format>::value,
                                                                S::kMode == kModeChannel)),
                                Cfg::kStage16) == Cfg::kSmemBytes,
                "shared memory as the host sized it");
  static_assert(!Cfg::kStage16 || Cfg::kInDtype != 0, "16-bit staging of a 16-bit input");
  extern __shared__ float4 smem4[];
  TileElem<Cfg>* tile = reinterpret_cast<TileElem<Cfg>*>(smem4);
  TileElem<Cfg>* rtile = Cfg::kRht ? tile + kTileFloats : tile;
  const i64 row0 = mem.tile_row * Cfg::kTileRows;
  const bool full = row0 + Cfg::kTileRows <= mem.rows && col0 + Cfg::kTileCols <= a.k && a.k % 16 == 0;
  // The rotated copy, unless every RHT stream rotates in registers on this tile.
  constexpr bool kAllRhtInRegisters = ((!S::kRht || kRhtInRegisters<S>) && ...);
  // A plan of one rowwise stream with 1D blocks (or none) and no RHT (inference) casts interior
  // tiles straight from global memory: no staging (but mn_major MX entries), no barrier.
  if constexpr (!kFused && sizeof...(S) == 1 && (((kWholeBlockRows<S> && !S::kBlock2d) || kRowwiseDirect<Cfg, S>) && ...)) {
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
  if constexpr (!kFused && sizeof...(S) == 2) {
    if constexpr (kPairDirect<Cfg, S...>) {
      if (full && mem.rows % 16 == 0) {
        cast_pair_direct<Cfg, S...>(a, mem, col0, scale_base[0], scale_base[1]);
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
  if constexpr (kFused) {
    Pre::template zero_channels<Cfg>(a, row0, col0);
    ticket = grid_arrive();
  }
  load_tile<Cfg>(a, mem, col0, full, tile, rtile, !(kAllRhtInRegisters && full && mem.rows % 16 == 0));
  if constexpr (kFused) {
    if constexpr (Pre::kSources > 0) {
      Pre::template reduce<Cfg>(a, tile, row0, col0, ticket);
      grid_wait(grid_arrive());
    } else {
      grid_wait(ticket);
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
                                       S::kMode == kModeChannel);
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

template <class Cfg, class... S>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    cast_kernel(const QuantizeArgs a) {
  detail::cast_tile<Cfg, PrePass<>, false, S...>(a);
}

// cast_kernel for a single tensor whose grid fits on the GPU at once, launched cooperatively:
// the pre-pass amaxes (Pre, tensor scope) and the zeroing of every amax output happen inside,
// around grid barriers, so a call is one launch and reads its input once.
template <class Cfg, class Pre, class... S>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    fused_kernel(const QuantizeArgs a) {
  detail::cast_tile<Cfg, Pre, true, S...>(a);
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

// Global reductions before the cast: the tensor amax (raw: straight from global memory with
// vector loads; after RHT: through the rotated tile) and per-channel amaxes.
template <class Cfg, class... A>
__global__ void __launch_bounds__(Cfg::kThreads) amax_kernel(const QuantizeArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  detail::Member mem;
  i64 unused[kMaxStreams];
  const detail::TilePos pos = detail::tile_pos<Cfg, true>();
  if (!detail::resolve_member<Cfg>(a, pos.row, mem, unused)) return;
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, T = Cfg::kThreads;
  const i64 col0 = pos.col * TC, row0 = mem.tile_row * TR;
  // The staged tile serves RHT'd reductions and column walks; raw tensor and row amaxes read
  // global memory directly.
  constexpr bool kNeedsTile = ((A::kRht || A::kScope == kScopeChannelCols) || ...);
  extern __shared__ float4 smem4[];
  detail::TileElem<Cfg>* tile = reinterpret_cast<detail::TileElem<Cfg>*>(smem4);
  detail::TileElem<Cfg>* rtile = Cfg::kRht ? tile + TR * TC : tile;
  const bool full = row0 + TR <= mem.rows && col0 + TC <= a.k && a.k % 16 == 0;
  // Per-row and per-column amaxes only (no RHT): interior tiles straight from global memory, one
  // read (H200, 16384^2 bf16, fp8_rowwise training: the staged form's pre-pass took 329 us,
  // 1.64 TB/s).
  constexpr bool kRowsCols = ((!A::kRht && A::kScope != kScopeTensor) && ...) && ((A::kScope == kScopeChannelCols) || ...) &&
                             (Cfg::kTileCols / detail::kElemsPer16<Cfg::kInDtype>) % 32 == 0 &&
                             Cfg::kTileRows % (Cfg::kThreads / 32) == 0 &&
                             Cfg::kTileRows / (Cfg::kThreads / 32) * (Cfg::kTileCols / detail::kElemsPer16<Cfg::kInDtype>) / 32 <= 8 &&
                             u32(Cfg::kThreads / 32 * Cfg::kTileCols * 4) <= Cfg::kSmemBytes;
  if constexpr (kRowsCols) {
    if (full) {
      float* rows = nullptr;
      float* cols = nullptr;
      ((A::kScope == kScopeChannelRows ? rows = a.amax[A::kSlot] + mem.row_base
                                       : cols = a.amax[A::kSlot] + i64(mem.index) * a.k),
       ...);
      detail::tile_row_col_amaxes_full<Cfg>(a, mem, col0, rows, cols, reinterpret_cast<float*>(smem4));
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

#endif  // __CUDACC__

}  // namespace qf
