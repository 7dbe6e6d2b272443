// Element encoders of the quantize kernels and the stores of encoded runs. fp8 is encoded with
// the hardware cvt on sm_89+, two elements per instruction with a NaN byte fix-up, e2m1 (round
// to nearest) in one fp32 addition (both bit-identical to the software encoder, checked
// exhaustively by the GPU tests); stochastic rounding draws one Philox call per 4 elements.
// Runs are packed into the words they are stored as (pack_run) and written with vector stores
// on interior tiles, element by element at the edges (store_run).
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_smem.cuh"
#include "qforge/numerics.cuh"

namespace qf {
namespace detail {

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

// enc_rn<E4M3>(x) for an x that is not a NaN (the caller's guarantee): the hardware conversion
// without the NaN fix-up; the pair's other byte converts +0 (0x00), so the 16 bits are the code.
// 16 bits, for e4m3_value16 and byte stores, which need no widening (NVFP4's block scale: 4
// fewer instructions per block than enc_rn + e4m3_value).
__device__ __forceinline__ u16 e4m3_code_not_nan(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return r;
#else
  return u16(enc_rn<E4M3>(x));
#endif
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
// The same from 16 bits whose high byte is 0 (e4m3_code_not_nan's).
__device__ __forceinline__ float e4m3_value16(u16 bits) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  float v;
  asm("{\n\t.reg .b16 lo, hi;\n\t.reg .b32 h2;\n\tcvt.rn.f16x2.e4m3x2 h2, %1;\n\t"
      "mov.b32 {lo, hi}, h2;\n\tcvt.f32.f16 %0, lo;\n\t}"
      : "=f"(v) : "h"(bits));
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
    // Six operations after the scaling, without branches, comparisons or a conversion of the
    // random bits (numerics.cuh int8_sr_top; the code is its top byte, which pack4 picks
    // directly). The float form before it (floor, the fraction against (r >> 8) * 2^-24, selects
    // for the sign, the clamps and NaN, the byte from one addition) took 16 with its packing.
    return int8_sr_top(x, r) >> 24;
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

// Four int8 codes stochastically rounded with the Philox words of their group (element i takes
// word i), packed element 0 lowest: the codes are int8_sr_top's top bytes.
__device__ __forceinline__ u32 pack4_int8_sr(const float* x, const u32 w[4]) {
  u32 t[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) t[i] = int8_sr_top(x[i], w[i]);
  return __byte_perm(__byte_perm(t[0], t[1], 0x0073), __byte_perm(t[2], t[3], 0x0073), 0x5410);
}

// fp8 formats (e4m3, e5m2) whose round to nearest is the hardware's pair conversion (sm_89 and
// later): cvt4_fp8_raw converts four scaled values, element 0 lowest, and fix_nan_fp8 gives NaN
// inputs the format's NaN code (fix_nan_bytes); the conversion gives no NaN code for a non-NaN
// value, so a word of non-NaN inputs needs no fix-up.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
template <class F>
constexpr bool kHwFp8Cvt = F::kBits == 8 && !F::kIsInt && (F::kExpBits == 4 || F::kExpBits == 5);
template <class F>
__device__ __forceinline__ u32 cvt4_fp8_raw(const float* x) {
  u32 p;
  if constexpr (F::kExpBits == 4)
    asm("{\n\t.reg .b16 l, h;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n\t"
        "mov.b32 %0, {l, h};\n\t}"
        : "=r"(p) : "f"(x[0]), "f"(x[1]), "f"(x[2]), "f"(x[3]));
  else
    asm("{\n\t.reg .b16 l, h;\n\t"
        "cvt.rn.satfinite.e5m2x2.f32 l, %2, %1;\n\t"
        "cvt.rn.satfinite.e5m2x2.f32 h, %4, %3;\n\t"
        "mov.b32 %0, {l, h};\n\t}"
        : "=r"(p) : "f"(x[0]), "f"(x[1]), "f"(x[2]), "f"(x[3]));
  return p;
}
template <class F>
__device__ __forceinline__ u32 fix_nan_fp8(u32 p) {
  return fix_nan_bytes<F::kExpBits == 4 ? 0x7Fu : 0x7Du>(p);
}
#else
template <class F>
constexpr bool kHwFp8Cvt = false;
template <class F>
__device__ u32 cvt4_fp8_raw(const float* x);  // declared only: kHwFp8Cvt's paths are discarded here
template <class F>
__device__ u32 fix_nan_fp8(u32 p);
#endif

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
    if constexpr (F::kIsInt && F::kBits == 8) return pack4_int8_sr(x, w);
    u32 p = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) p |= (enc_sr_group<F>(x[i], w, i) & kMask) << (kShift * i);
    return p;
  } else if constexpr (kIsE2m1<F>) {
    const u32 p01 = e2m1_rn_byte(x[0]) + (e2m1_rn_byte(x[1]) << 4), p23 = e2m1_rn_byte(x[2]) + (e2m1_rn_byte(x[3]) << 4);
    return __byte_perm(p01, p23, 0x0040) & 0xFFFFu;
  } else {
    if constexpr (kHwFp8Cvt<F>) return fix_nan_fp8<F>(cvt4_fp8_raw<F>(x));
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
  } else if constexpr (S::kStochastic && F::kIsInt && N > 4) {
    // int8, N / 4 groups: lin % min(N, 16) == 0 makes the first group's index a multiple of
    // N / 4, so the groups share its high word and their low words follow it without a carry.
    const u64 g0 = u64(lin) / 4;
#pragma unroll
    for (int g = 0; g < N / 4; ++g) {
      u32 w[4];
      sr_random_group_at(a.seed, a.offset, u32(S::kDir), u32(g0) + u32(g), u32(g0 >> 32), w);
      r.w[g] = pack4_int8_sr(x + g * 4, w);
    }
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
      // Unrolled with a bound of N, so that x stays in registers (a loop to `valid` indexes it).
      float* o = static_cast<float*>(data) + lin;
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (i < valid) o[i] = x[i];
    } else {
      u16* o = static_cast<u16*>(data) + lin;
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (i < valid) o[i] = u16(F::kDtype == 1 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]));
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

}  // namespace detail
}  // namespace qf
