// qforge scalar numerics: the one implementation of docs/numerics.md.
//
// Compiled twice: by the host compiler for the CPU reference (reference/) and by NVRTC for every
// generated kernel, so both produce the same bits. Rules that keep it that way:
//   * every float operation is one plain IEEE binary32 operation (host: -ffp-contract=off,
//     device: --fmad=false, no fast math, no ftz); no transcendental functions;
//   * conversions between formats are done on the integer bits, never through the
//     hardware converters (whose NaN/saturation behaviour differs between host and device);
//     the exceptions, fp16 -> fp32 on the device (f16_to_f32), exact, with NaN fixed up to the
//     software bits, and int8_sr_top's floor to int32 (cvt.rmi.s32.f32: saturating, NaN -> 0,
//     as its host model), are exhaustively checked against the software definitions;
//   * no host headers under NVRTC (builtins only), no exceptions, no dynamic memory.
#pragma once

#include "qforge/types.cuh"

#if !defined(__CUDACC_RTC__)
#include <math.h>
#include <string.h>
#endif

namespace qf {

// ---------------------------------------------------------------------------------------------
// Bit casts and fp32 classification
// ---------------------------------------------------------------------------------------------
QF_HD u32 f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  u32 u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}

QF_HD float f32_from_bits(u32 u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

constexpr float kFltMax = 3.40282346638528859811704183484516925e+38f;  // 0x7F7FFFFF
constexpr u32 kF32SignMask = 0x80000000u;
constexpr u32 kF32AbsMask = 0x7FFFFFFFu;
constexpr u32 kF32InfBits = 0x7F800000u;

QF_HD bool f32_is_nan(float x) { return (f32_bits(x) & kF32AbsMask) > kF32InfBits; }
QF_HD bool f32_is_inf(float x) { return (f32_bits(x) & kF32AbsMask) == kF32InfBits; }
QF_HD bool f32_is_finite(float x) { return (f32_bits(x) & kF32AbsMask) < kF32InfBits; }
QF_HD float f32_quiet_nan() { return f32_from_bits(0x7FC00000u); }

// Exact 2^e built from bits; e in [-149, 127] (2^-149 .. 2^-127 are fp32 subnormals).
// Below -149 gives +0, above 127 gives +Inf.
QF_HD float exp2i(int e) {
  if (e > 127) return f32_from_bits(kF32InfBits);
  if (e >= -126) return f32_from_bits(static_cast<u32>(e + 127) << 23);
  if (e >= -149) return f32_from_bits(1u << (e + 149));
  return 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Element format traits: the single source of every format constant.
// ---------------------------------------------------------------------------------------------
struct E4M3 {
  static constexpr const char* kName = "e4m3";
  static constexpr int kBits = 8;
  static constexpr int kExpBits = 4;
  static constexpr int kManBits = 3;
  static constexpr int kBias = 7;
  static constexpr int kMinNormalExp = 1 - kBias;  // -6
  static constexpr int kEmax = 8;                  // OCP emax_elem
  static constexpr float kMaxFinite = 448.0f;
  static constexpr u8 kMaxBits = 0x7E;
  static constexpr u8 kNanBits = 0x7F;
  static constexpr bool kIsInt = false;
  static constexpr bool kHasInf = false;
  static constexpr bool kHasNan = true;  // S.1111.111 only
  static constexpr int kSrBits = 32;  // random bits per element of stochastic rounding (24 used)
};

struct E5M2 {
  static constexpr const char* kName = "e5m2";
  static constexpr int kBits = 8;
  static constexpr int kExpBits = 5;
  static constexpr int kManBits = 2;
  static constexpr int kBias = 15;
  static constexpr int kMinNormalExp = 1 - kBias;  // -14
  static constexpr int kEmax = 15;
  static constexpr float kMaxFinite = 57344.0f;
  static constexpr u8 kMaxBits = 0x7B;
  static constexpr u8 kNanBits = 0x7F;
  static constexpr bool kIsInt = false;
  static constexpr bool kHasInf = true;  // exponent 11111, mantissa 0
  static constexpr bool kHasNan = true;  // exponent 11111, mantissa != 0
  static constexpr int kSrBits = 32;  // random bits per element of stochastic rounding (24 used)
};

struct E2M1 {
  static constexpr const char* kName = "e2m1";
  static constexpr int kBits = 4;
  static constexpr int kExpBits = 2;
  static constexpr int kManBits = 1;
  static constexpr int kBias = 1;
  static constexpr int kMinNormalExp = 1 - kBias;  // 0
  static constexpr int kEmax = 2;
  static constexpr float kMaxFinite = 6.0f;
  static constexpr u8 kMaxBits = 0x7;
  static constexpr u8 kNanBits = 0x7;  // no NaN: NaN -> +max
  static constexpr bool kIsInt = false;
  static constexpr bool kHasInf = false;
  static constexpr bool kHasNan = false;
  static constexpr int kSrBits = 8;  // random bits per element of stochastic rounding
};

struct E2M3 {
  static constexpr const char* kName = "e2m3";
  static constexpr int kBits = 6;
  static constexpr int kExpBits = 2;
  static constexpr int kManBits = 3;
  static constexpr int kBias = 1;
  static constexpr int kMinNormalExp = 1 - kBias;  // 0
  static constexpr int kEmax = 2;
  static constexpr float kMaxFinite = 7.5f;
  static constexpr u8 kMaxBits = 0x1F;
  static constexpr u8 kNanBits = 0x1F;  // no NaN: NaN -> +max
  static constexpr bool kIsInt = false;
  static constexpr bool kHasInf = false;
  static constexpr bool kHasNan = false;
  static constexpr int kSrBits = 32;  // random bits per element of stochastic rounding (24 used)
};

struct E3M2 {
  static constexpr const char* kName = "e3m2";
  static constexpr int kBits = 6;
  static constexpr int kExpBits = 3;
  static constexpr int kManBits = 2;
  static constexpr int kBias = 3;
  static constexpr int kMinNormalExp = 1 - kBias;  // -2
  static constexpr int kEmax = 4;
  static constexpr float kMaxFinite = 28.0f;
  static constexpr u8 kMaxBits = 0x1F;
  static constexpr u8 kNanBits = 0x1F;  // no NaN: NaN -> +max
  static constexpr bool kIsInt = false;
  static constexpr bool kHasInf = false;
  static constexpr bool kHasNan = false;
  static constexpr int kSrBits = 32;  // random bits per element of stochastic rounding (24 used)
};

// Symmetric int8. The rounding helpers treat it as the grid with a fixed ulp of 1: exponent 7
// with 7 "mantissa" bits covers every integer magnitude up to 255.
struct Int8 {
  static constexpr const char* kName = "int8";
  static constexpr int kBits = 8;
  static constexpr int kExpBits = 0;
  static constexpr int kManBits = 7;
  static constexpr int kBias = 0;
  static constexpr int kMinNormalExp = 7;  // grid exponent (ulp = 2^(7 - 7) = 1)
  static constexpr int kEmax = 0;          // unused (no MX scaling of int8)
  static constexpr float kMaxFinite = 127.0f;
  static constexpr float kMinFinite = -128.0f;
  static constexpr u8 kMaxBits = 0x7F;
  static constexpr u8 kNanBits = 0x00;  // NaN -> 0
  static constexpr bool kIsInt = true;
  static constexpr bool kHasInf = false;
  static constexpr bool kHasNan = false;
  static constexpr int kSrBits = 32;  // random bits per element of stochastic rounding (24 used)
};

// Elements of format F per Philox call of stochastic rounding (a group): 4 of 32 bits, or 16 of
// 8 bits (kSrBits; e2m1).
template <class F>
QF_HD constexpr int sr_group_elems() {
  static_assert(F::kSrBits == 8 || F::kSrBits == 32, "stochastic rounding takes 8 or 32 bits per element");
  return 128 / F::kSrBits;
}

namespace detail {

// The magnitude |x| (given as fp32 bits without the sign, finite) on the grid of a format with
// minimum normal exponent `emin` and `man` mantissa bits: e = max(floor(log2|x|), emin),
// ulp = 2^(e - man). Returns q = |x| / ulp split into its integer part `lo` and the fraction
// rem / 2^shift (exact; shift >= 1 always for the formats here).
struct GridPos {
  u32 lo;
  u32 rem;    // valid when shift < 32
  u32 sig;    // the 24-bit significand (for shift >= 32)
  int shift;  // fraction bits
  int e;      // grid exponent
};

QF_HD GridPos grid_pos(u32 abs_bits, int emin, int man) {
  const u32 expf = abs_bits >> 23;
  u32 sig = abs_bits & 0x7FFFFFu;
  int ex;
  if (expf == 0) {
    ex = -126;  // fp32 subnormal: value = sig * 2^(-126 - 23)
  } else {
    ex = static_cast<int>(expf) - 127;
    sig |= 0x800000u;
  }
  const int e = ex > emin ? ex : emin;
  // |x| = sig * 2^(ex - 23) = q * 2^(e - man)  =>  q = sig * 2^-(23 - man + e - ex)
  const int shift = 23 - man + (e - ex);
  GridPos p;
  p.sig = sig;
  p.shift = shift;
  p.e = e;
  if (shift <= 0) {  // never for the formats here (|x| <= max keeps ex <= emax)
    p.lo = sig << (-shift);
    p.rem = 0;
  } else if (shift < 32) {
    p.lo = sig >> shift;
    p.rem = sig & ((1u << shift) - 1u);
  } else {
    p.lo = 0;
    p.rem = 0;
  }
  return p;
}

// RNE of q (half-even on the integer count).
QF_HD u32 grid_round_rne(const GridPos& p) {
  if (p.shift <= 0) return p.lo;
  if (p.shift >= 32) return 0;  // q = sig / 2^shift < 2^24 / 2^32 < 1/2
  const u32 half = 1u << (p.shift - 1);
  u32 q = p.lo;
  if (p.rem > half || (p.rem == half && (q & 1u))) ++q;
  return q;
}

// Stochastic, 32-bit words: q_lo + (frac(q) > u) with u = (r >> 8) * 2^-24, compared exactly on
// integers: rem / 2^shift > R / 2^24.
QF_HD u32 grid_round_sr(const GridPos& p, u32 rbits) {
  const u64 R = rbits >> 8;
  bool up;
  if (p.shift <= 0) {
    up = false;
  } else if (p.shift < 32) {
    const u64 rem = p.rem;
    if (p.shift <= 24)
      up = (rem << (24 - p.shift)) > R;
    else
      up = rem > (R << (p.shift - 24));
  } else if (p.shift < 48) {
    // lo = 0, rem = sig (< 2^24): sig * 2^24 > R * 2^shift  <=>  sig > R * 2^(shift - 24)
    up = static_cast<u64>(p.sig) > (R << (p.shift - 24));
  } else {
    // sig * 2^24 < 2^48 <= R * 2^shift unless R == 0.
    up = (R == 0) && (p.sig != 0);
  }
  return p.lo + (up ? 1u : 0u);
}

// Stochastic, B < 32 random bits (kSrBits B: e2m1's 8): floor(q + u) with u = R * 2^-B, R = the
// low B bits of rbits, i.e. q_lo + (frac(q) >= 1 - u), compared exactly on integers: rem * 2^B >=
// (2^B - R) * 2^shift.
template <int B>
QF_HD u32 grid_round_sr_low(const GridPos& p, u32 rbits) {
  static_assert(B >= 1 && B <= 16, "a comparison that fits 64 bits");
  const u64 need = (u64(1) << B) - (rbits & ((1u << B) - 1u));  // 2^B (1 - u), in [1, 2^B]
  bool up;
  if (p.shift <= 0) {
    up = false;
  } else if (p.shift < 32) {
    up = (static_cast<u64>(p.rem) << B) >= (need << p.shift);  // both < 2^(32 + B)
  } else if (p.shift < 24 + B) {
    up = (static_cast<u64>(p.sig) << B) >= (need << p.shift);  // lo = 0, frac = sig / 2^shift; < 2^(24 + 2B)
  } else {
    up = false;  // sig * 2^B < 2^(24 + B) <= 2^shift <= need * 2^shift
  }
  return p.lo + (up ? 1u : 0u);
}

template <class F>
QF_HD u32 grid_round_sr_of(const GridPos& p, u32 rbits) {
  if constexpr (F::kSrBits < 32) return grid_round_sr_low<F::kSrBits>(p, rbits);
  else return grid_round_sr(p, rbits);
}

// Encoding of the magnitude count * 2^(e - man) (e >= emin): subnormals when e == emin and
// count < 2^man, normals otherwise; a carry to 2^(man+1) moves into the next binade by itself.
template <class F>
QF_HD u32 float_mag_bits(u32 count, int e) {
  return (static_cast<u32>(e - F::kMinNormalExp) << F::kManBits) + count;
}

template <class F>
QF_HD u8 sign_bit(u32 xbits) {
  return (xbits & kF32SignMask) ? static_cast<u8>(1u << (F::kBits - 1)) : static_cast<u8>(0);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// fp32 -> element format (RNE, satfinite) and back
// ---------------------------------------------------------------------------------------------
template <class F>
QF_HD u8 encode_rn(float x) {
  const u32 xb = f32_bits(x);
  const u32 ab = xb & kF32AbsMask;
  if (ab > kF32InfBits) return F::kNanBits;
  if constexpr (F::kIsInt) {
    // clamp(rint(x), -128, 127); clamping first is equivalent and keeps |x| <= 128.
    if (x >= F::kMaxFinite) return F::kMaxBits;
    if (x <= F::kMinFinite) return static_cast<u8>(0x80);
    const detail::GridPos p = detail::grid_pos(ab, F::kMinNormalExp, F::kManBits);
    const u32 q = detail::grid_round_rne(p);  // integer magnitude, <= 128
    const u32 s = (xb & kF32SignMask) ? (0u - q) : q;
    return static_cast<u8>(s & 0xFFu);
  } else {
    const u8 sign = detail::sign_bit<F>(xb);
    if (!(f32_from_bits(ab) <= F::kMaxFinite)) return static_cast<u8>(sign | F::kMaxBits);
    const detail::GridPos p = detail::grid_pos(ab, F::kMinNormalExp, F::kManBits);
    u32 m = detail::float_mag_bits<F>(detail::grid_round_rne(p), p.e);
    if (m > F::kMaxBits) m = F::kMaxBits;  // unreachable for |x| <= max; kept as a guard
    return static_cast<u8>(sign | m);
  }
}

// Stochastic rounding (docs/numerics.md "Stochastic rounding"): rounds the magnitude up with
// probability ceil(frac * 2^24) / 2^24 using the top 24 bits of rbits (32-bit formats), or
// floor(frac * 2^8) / 2^8 using its low 8 bits (F::kSrBits 8: e2m1).
template <class F>
QF_HD u8 encode_sr(float x, u32 rbits) {
  const u32 xb = f32_bits(x);
  const u32 ab = xb & kF32AbsMask;
  if (ab > kF32InfBits) return F::kNanBits;
  if constexpr (F::kIsInt) {
    if (x >= F::kMaxFinite) return F::kMaxBits;
    if (x <= F::kMinFinite) return static_cast<u8>(0x80);
    const detail::GridPos p = detail::grid_pos(ab, F::kMinNormalExp, F::kManBits);
    u32 q = detail::grid_round_sr_of<F>(p, rbits);  // <= 128
    u32 s;
    if (xb & kF32SignMask) {
      s = 0u - q;  // q <= 128 since |x| < 128
    } else {
      if (q > 127u) q = 127u;
      s = q;
    }
    return static_cast<u8>(s & 0xFFu);
  } else {
    const u8 sign = detail::sign_bit<F>(xb);
    if (!(f32_from_bits(ab) <= F::kMaxFinite)) return static_cast<u8>(sign | F::kMaxBits);
    const detail::GridPos p = detail::grid_pos(ab, F::kMinNormalExp, F::kManBits);
    u32 m = detail::float_mag_bits<F>(detail::grid_round_sr_of<F>(p, rbits), p.e);
    if (m > F::kMaxBits) m = F::kMaxBits;  // unreachable for |x| <= max
    return static_cast<u8>(sign | m);
  }
}

// int8 stochastic rounding in six operations after the scaling (the kernels' encoder,
// cast_encode.cuh enc_sr): encode_sr<Int8>(y, r) is the top byte of int8_sr_top(y, r).
// With n = r >> 8 and C = ceil(|y| 2^24) (|y| < 128): C = floor(|y|) 2^24 + ceil(frac 2^24),
// the last term below 2^24, and frac > n 2^-24 exactly when ceil(frac 2^24) > n, so the
// magnitude floor(|y|) + (frac > u) is the top byte of C + (2^24 - 1 - n), and the negative
// code, its two's complement, the top byte of n - C. With T = floor(-|c| 2^24) = -C and m the
// sign of c = -min(y, 127) spread over the word (-1 for y > 0 and +0, else 0) both are the top
// byte of (T + n + m 2^24) ^ m. Saturation: y >= 127 (+Inf) is c = -127, code 127; y <= -128
// (-Inf) saturates T at -2^31, code 0x80; NaN (c NaN) converts to T = 0, code 0 either way.
// Two hardware instructions with fully specified results, modelled on the host: max.NaN.f32
// (canonical NaN for a NaN operand) and cvt.rmi.s32.f32 (floor, saturating, NaN -> 0).
namespace detail {
QF_HD float f32_max_nan(float a, float b) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  if (f32_is_nan(a) || f32_is_nan(b)) return f32_from_bits(0x7FFFFFFFu);
  return a > b ? a : b;  // b is a nonzero constant here: no signed-zero case
#endif
}

QF_HD i32 f32_floor_s32_sat(float p) {
#if defined(__CUDA_ARCH__)
  return __float2int_rd(p);
#else
  if (f32_is_nan(p)) return 0;
  if (p <= -2147483648.0f) return static_cast<i32>(0x80000000u);
  if (p >= 2147483648.0f) return 0x7FFFFFFF;
  return static_cast<i32>(floorf(p));
#endif
}
}  // namespace detail

QF_HD u32 int8_sr_top(float y, u32 r) {
  const float c = detail::f32_max_nan(-y, -127.0f);
  const u32 t = static_cast<u32>(detail::f32_floor_s32_sat(-fabsf(c) * 16777216.0f));
  const u32 m = static_cast<u32>(static_cast<i32>(f32_bits(c)) >> 31);
#if defined(__CUDA_ARCH__)
  return (t + __funnelshift_l(r, m, 24)) ^ m;  // (r >> 8) + (m << 24)
#else
  return (t + (r >> 8) + (m << 24)) ^ m;
#endif
}

// Exact value of an encoding (bits above kBits are ignored). Int8: the signed byte.
template <class F>
QF_HD float decode(u8 bits) {
  if constexpr (F::kIsInt) {
    return static_cast<float>(static_cast<i8>(bits));
  } else {
    const u32 b = static_cast<u32>(bits) & ((1u << F::kBits) - 1u);
    const bool neg = (b >> (F::kBits - 1)) & 1u;
    const u32 mag = b & ((1u << (F::kBits - 1)) - 1u);
    const u32 expf = mag >> F::kManBits;
    const u32 man = mag & ((1u << F::kManBits) - 1u);
    constexpr u32 kExpAllOnes = (1u << F::kExpBits) - 1u;
    float v;
    if (F::kHasNan && !F::kHasInf && mag == ((1u << (F::kBits - 1)) - 1u)) {
      v = f32_quiet_nan();  // e4m3: S.1111.111
    } else if (F::kHasInf && expf == kExpAllOnes) {
      v = man == 0 ? f32_from_bits(kF32InfBits) : f32_quiet_nan();
    } else if (expf == 0) {
      v = static_cast<float>(man) * exp2i(F::kMinNormalExp - F::kManBits);
    } else {
      v = static_cast<float>(man | (1u << F::kManBits)) *
          exp2i(static_cast<int>(expf) - F::kBias - F::kManBits);
    }
    return neg ? -v : v;
  }
}

// ---------------------------------------------------------------------------------------------
// bf16 / fp16 (software, integer ops only; fp16 -> fp32 in hardware on the device, same bits)
// ---------------------------------------------------------------------------------------------
QF_HD float bf16_to_f32(u16 h) { return f32_from_bits(static_cast<u32>(h) << 16); }

QF_HD u16 f32_to_bf16(float x) {
  const u32 u = f32_bits(x);
  if ((u & kF32AbsMask) > kF32InfBits) return static_cast<u16>(((u >> 16) & 0x8000u) | 0x7FC0u);
  const u32 r = u + 0x7FFFu + ((u >> 16) & 1u);  // RNE; overflow carries into Inf
  return static_cast<u16>(r >> 16);
}

// The definition of fp16 -> fp32: exact, the NaN payload and sign kept (sign | 0x7F800000 |
// mantissa << 13). Integer ops only, with a loop for subnormals.
QF_HD float f16_to_f32_soft(u16 h) {
  const u32 sign = (static_cast<u32>(h) & 0x8000u) << 16;
  const u32 expf = (h >> 10) & 0x1Fu;
  u32 man = h & 0x3FFu;
  if (expf == 0x1F) return f32_from_bits(sign | kF32InfBits | (man << 13));
  if (expf == 0) {
    if (man == 0) return f32_from_bits(sign);
    int e = -14;
    while (!(man & 0x400u)) {
      man <<= 1;
      --e;
    }
    man &= 0x3FFu;
    return f32_from_bits(sign | (static_cast<u32>(e + 127) << 23) | (man << 13));
  }
  return f32_from_bits(sign | ((expf - 15u + 127u) << 23) | (man << 13));
}

// A converter's result `wide` for h, with a NaN h replaced by f16_to_f32_soft's NaN (a hardware
// converter may return another payload or sign for NaN; every other fp16 value widens exactly,
// so there it is the definition's value already).
QF_HD float f16_nan_as_soft(u16 h, float wide) {
  if ((h & 0x7FFFu) > 0x7C00u)
    return f32_from_bits(((static_cast<u32>(h) & 0x8000u) << 16) | kF32InfBits | ((static_cast<u32>(h) & 0x3FFu) << 13));
  return wide;
}

// fp16 -> fp32, bit-equal to f16_to_f32_soft. On the device the hardware conversion (cvt.f32.f16:
// exact, and without .ftz it keeps subnormals), NaN fixed up by a select: one conversion per
// element instead of the software path's branches and subnormal loop, which compiled fp16-input
// kernels 2.2-2.5x slower than their bf16 twins (docs/jit.md).
QF_HD float f16_to_f32(u16 h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f16_nan_as_soft(h, f);
#else
  return f16_to_f32_soft(h);
#endif
}

QF_HD u16 f32_to_f16(float x) {
  const u32 u = f32_bits(x);
  const u32 sign = (u >> 16) & 0x8000u;
  const u32 a = u & kF32AbsMask;
  if (a > kF32InfBits) return static_cast<u16>(sign | 0x7E00u);
  if (a >= 0x47800000u) return static_cast<u16>(sign | 0x7C00u);  // >= 2^16 (and Inf)
  // fp16 grid: emin -14, 10 mantissa bits; a carry out of exponent 30 lands on 0x7C00 (Inf).
  const detail::GridPos p = detail::grid_pos(a, -14, 10);
  const u32 m = (static_cast<u32>(p.e + 14) << 10) + detail::grid_round_rne(p);
  return static_cast<u16>(sign | m);
}

// A 16-bit identity copy (bf16 -> bf16: D = 1, fp16 -> fp16: D = 2) of the two elements of a word
// (element 0 in the low half), in integer operations on the word: per half the bits of
// f32_to_bf16(bf16_to_f32(h)) / f32_to_f16(f16_to_f32(h)), i.e. h itself unless h is a NaN, which
// becomes the identity copy's NaN (sign | 0x7FC0 / sign | 0x7E00; docs/numerics.md).
// identity16x2_nan_bits: bit 15 of a half set exactly when that half is a NaN ((h & 0x7FFF) above
// Inf's bits: at most 0x7FFF + 0x7FFF - 0x7C00, no carry into the other half).
template <int D>
QF_HD u32 identity16x2_nan_bits(u32 w) {
  constexpr u32 kInf = D == 1 ? 0x7F80u : 0x7C00u;
  return ((w & 0x7FFF7FFFu) + (0x7FFFu - kInf) * 0x00010001u) & 0x80008000u;
}
template <int D>
QF_HD u32 identity16x2(u32 w) {
  constexpr u32 kQuiet = D == 1 ? 0x7FC0u : 0x7E00u;
  const u32 m = (identity16x2_nan_bits<D>(w) >> 15) * 0xFFFFu;  // 0xFFFF in each NaN half
  return (w & ~(m & 0x7FFF7FFFu)) | (m & (kQuiet * 0x00010001u));
}

// ---------------------------------------------------------------------------------------------
// E8M0 (MX scales)
// ---------------------------------------------------------------------------------------------
// TE's round-up: exponent field + (mantissa != 0); subnormals +1 only if mantissa > 0x400000.
// NaN -> 0xFF, Inf -> 0xFE, 0 -> 0. The sign is ignored (v is an amax product). A normal v above
// 2^254-127 with a non-zero mantissa stays 0xFE (never rounds into the NaN encoding).
QF_HD u8 e8m0_rceil(float v) {
  const u32 a = f32_bits(v) & kF32AbsMask;
  if (a > kF32InfBits) return 0xFF;
  if (a == kF32InfBits) return 0xFE;
  u32 e = a >> 23;
  const u32 m = a & 0x7FFFFFu;
  if (e == 0) {
    if (m > 0x400000u) e = 1;
  } else if (m != 0 && e < 0xFEu) {
    ++e;
  }
  return static_cast<u8>(e);
}

// e8m0_rceil(v) for v in [0, Inf] (sign clear, not NaN: an amax of magnitudes times fl(1/fmax)),
// without branches: the exponent field rounded up by a carry out of the mantissa (normal v: +
// 0x7FFFFF, so any non-zero mantissa carries; subnormal v: + 0x3FFFFF, so a mantissa above
// 0x400000 does), Inf and the carry out of 0xFE's binade clamped to 0xFE. mx_multiplier_bits(E)
// for E <= 0xFE (what it returns): the bits of mx_multiplier(E) = 2^(127 - E), the normal
// (254 - E) << 23 for E <= 253 and the subnormal 2^-127 (0x400000) for E = 254. Both equal the
// branchy forms on every such input (tests/unit/numerics_test.cpp, E8M0.RceilNonNegative).
QF_HD u32 e8m0_rceil_nonneg(float v) {
  const u32 a = f32_bits(v);
  const u32 e = (a + (a >= 0x800000u ? 0x7FFFFFu : 0x3FFFFFu)) >> 23;
  return e < 0xFEu ? e : 0xFEu;
}
QF_HD u32 mx_multiplier_bits(u32 e) { return e == 0xFEu ? 0x400000u : 0x7F000000u - (e << 23); }

// OCP rule: floor(log2(amax)) - emax_elem + 127 clamped to [0, 254]; amax 0 -> 0, Inf -> 254,
// NaN -> 0xFF (not reachable from an fmaxf-style amax). The sign is ignored.
QF_HD u8 e8m0_floor(float amax, int emax_elem) {
  const u32 a = f32_bits(amax) & kF32AbsMask;
  if (a > kF32InfBits) return 0xFF;
  if (a == kF32InfBits) return 0xFE;
  if (a == 0) return 0;
  int fl;
  const u32 e = a >> 23;
  if (e != 0) {
    fl = static_cast<int>(e) - 127;
  } else {
    int p = 22;
    while (!((a >> p) & 1u)) --p;
    fl = p - 149;
  }
  int E = fl - emax_elem + 127;
  if (E < 0) E = 0;
  if (E > 254) E = 254;
  return static_cast<u8>(E);
}

// Plain conversion, equal to ml_dtypes.float8_e8m0fnu: nearest exponent with ties (mantissa
// 0x400000) up; v <= 2^-127 -> 0; any v in (2^-127, 2^-126) -> 1 (as ml_dtypes does);
// v >= 1.5 * 2^127, Inf, NaN, zero, negative (incl. -0) -> 0xFF.
QF_HD u8 e8m0_rne(float v) {
  const u32 u = f32_bits(v);
  if ((u & kF32SignMask) || u == 0 || u >= kF32InfBits) return 0xFF;
  const u32 e = u >> 23;
  const u32 m = u & 0x7FFFFFu;
  if (e == 0) return m > 0x400000u ? 1 : 0;
  const u32 r = e + (m >= 0x400000u ? 1u : 0u);
  return static_cast<u8>(r > 0xFFu ? 0xFFu : r);
}

// 0xFF -> NaN; otherwise 2^(e - 127) (0 -> the subnormal 2^-127).
QF_HD float e8m0_decode(u8 e) {
  if (e == 0xFF) return f32_quiet_nan();
  return exp2i(static_cast<int>(e) - 127);
}

// Element multiplier 2^(127 - e), exact (e = 254 -> 2^-127 subnormal); e = 0xFF (NaN scale) ->
// NaN, so the elements of such a block encode as NaN (or the format's NaN substitute).
QF_HD float mx_multiplier(u8 e) {
  if (e == 0xFF) return f32_quiet_nan();
  return exp2i(127 - static_cast<int>(e));
}

// ---------------------------------------------------------------------------------------------
// Amax and scales
// ---------------------------------------------------------------------------------------------
QF_HD float amax_step(float acc, float x) { return fmaxf(acc, fabsf(x)); }

// amax_step on two 16-bit inputs at once (a staged tile's bf16 / fp16 bits, element 0 in the
// low half), one packed instruction per pair on the device: each half of acc becomes the larger
// magnitude of its own and x's, a NaN x leaving it as it was. The magnitudes are amax_step's
// on the widened values (widening is exact and keeps the order of magnitudes). An accumulator
// starts at +0 and is read through amax16x2_lo / _hi; it never holds a NaN (the max of a
// non-NaN and anything is not NaN). bf16: acc's sign bits are don't-care (max.xorsign.abs
// compares magnitudes and leaves the XOR of the inputs' signs there). fp16: acc must be
// non-negative (max.f16x2 compares signed values, only x goes through abs), which it stays:
// every step is a max of it and a magnitude; the host form below clears acc's sign, so it
// equals the device only there. Checked on every (acc, x) pair of halves the kernels can meet
// against amax_step, host and GPU (tests/unit).
//
// Magnitude words (both halves' sign bits clear), under the same contract, for reductions that
// keep their packed amaxes so: abs16x2 makes one by a mask; max16x2<D> is the larger of two,
// half by half (max.bf16x2 / max.f16x2: a NaN half gives the other's, two NaN halves a NaN);
// amax16x2_abs_step<D> steps a magnitude accumulator by abs then max (fp16: amax_f16x2_step's
// code; bf16: its halves then widen without amax16x2_lo's mask). The mask and abs.bf16x2 /
// abs.f16x2 give the same bits except on a NaN, whose payload the PTX ISA leaves unspecified: a
// NaN either way, which max16x2 and the steps drop alike, so no amax differs. The forms differ
// in the code ptxas makes of them (sm_90a: abs.bf16x2 an HFMA2 with a |x| operand and the maxima
// paired into VHMNMX, the mask a LOP3, the xorsign step one HMNMX2 per word read out through
// the mask), so each caller keeps the one its kernels were measured with (chunk_amax and
// cast_mx_pair_direct say why theirs).
namespace detail {
// One lane of the packed step as the PTX ISA defines max{.xorsign.abs} (host form): NaN x keeps
// acc's magnitude; the sign the XOR of both (bf16), or clear (fp16, and every magnitude-word
// form: max of |acc| and |x|); both NaN: a NaN (0x7FFF, the canonical one).
QF_HD u32 amax16_lane(u32 acc, u32 x, u32 inf, bool xorsign) {
  const u32 a = acc & 0x7FFFu, m = x & 0x7FFFu, sign = xorsign ? (acc ^ x) & 0x8000u : 0u;
  if (m > inf) return a > inf ? 0x7FFFu : a | sign;
  if (a > inf) return m | sign;
  return (a > m ? a : m) | sign;
}
// Both lanes; D: 1 bf16, 2 fp16 (their Inf bits without the sign).
template <int D>
QF_HD u32 amax16x2_lanes(u32 acc, u32 x, bool xorsign) {
  static_assert(D == 1 || D == 2, "16-bit inputs");
  constexpr u32 inf = D == 1 ? 0x7F80u : 0x7C00u;
  return amax16_lane(acc, x, inf, xorsign) | (amax16_lane(acc >> 16, x >> 16, inf, xorsign) << 16);
}
}  // namespace detail
QF_HD u32 amax_bf16x2_step(u32 acc, u32 x) {
#if defined(__CUDA_ARCH__)
  u32 r;
  asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(acc), "r"(x));
  return r;
#else
  return detail::amax16x2_lanes<1>(acc, x, true);
#endif
}
template <int D>
QF_HD u32 amax16x2_abs_step(u32 acc, u32 x) {
  static_assert(D == 1 || D == 2, "16-bit inputs");
#if defined(__CUDA_ARCH__)
  // |x| then max: ptxas pairs the maxima into one VHMNMX per two steps (three inputs; fp16 takes
  // |x| as operands, bf16 through an HFMA2 each).
  u32 r;
  if constexpr (D == 1) asm("{\n\t.reg .b32 t;\n\tabs.bf16x2 t, %2;\n\tmax.bf16x2 %0, %1, t;\n\t}" : "=r"(r) : "r"(acc), "r"(x));
  else asm("{\n\t.reg .b32 t;\n\tabs.f16x2 t, %2;\n\tmax.f16x2 %0, %1, t;\n\t}" : "=r"(r) : "r"(acc), "r"(x));
  return r;
#else
  return detail::amax16x2_lanes<D>(acc, x, false);
#endif
}
QF_HD u32 amax_f16x2_step(u32 acc, u32 x) { return amax16x2_abs_step<2>(acc, x); }
// The step of input dtype D (1 bf16, 2 fp16), and an accumulator's low / high half as the fp32
// amax (sign cleared; exact).
template <int D>
QF_HD u32 amax16x2_step(u32 acc, u32 x) {
  static_assert(D == 1 || D == 2, "16-bit inputs");
  return D == 1 ? amax_bf16x2_step(acc, x) : amax_f16x2_step(acc, x);
}
template <int D>
QF_HD float amax16x2_lo(u32 acc) {
  static_assert(D == 1 || D == 2, "16-bit inputs");
  if (D == 1) return f32_from_bits((acc & 0x7FFFu) << 16);
  return f16_to_f32(static_cast<u16>(acc & 0x7FFFu));
}
template <int D>
QF_HD float amax16x2_hi(u32 acc) {
  static_assert(D == 1 || D == 2, "16-bit inputs");
  if (D == 1) return f32_from_bits(acc & 0x7FFF0000u);
  return f16_to_f32(static_cast<u16>((acc >> 16) & 0x7FFFu));
}
// Magnitude words (above): the mask, and the larger of two.
QF_HD u32 abs16x2(u32 w) { return w & 0x7FFF7FFFu; }
template <int D>
QF_HD u32 max16x2(u32 a, u32 b) {
  static_assert(D == 1 || D == 2, "16-bit inputs");
#if defined(__CUDA_ARCH__)
  u32 r;
  if constexpr (D == 1) asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  return detail::amax16x2_lanes<D>(a, b, false);
#endif
}
// NaN detection on magnitude words: max16x2_nan<D> keeps a NaN half (max.NaN; host: the
// canonical 0x7FFF), so a chain of it holds a NaN half iff one of its inputs did; has_nan16x2<D>
// says whether a word has one (a half above Inf's bits carries into bit 15).
template <int D>
QF_HD bool has_nan16x2(u32 w) {
  static_assert(D == 1 || D == 2, "16-bit inputs");
  return (((w & 0x7FFF7FFFu) + (D == 1 ? 0x007F007Fu : 0x03FF03FFu)) & 0x80008000u) != 0;
}
template <int D>
QF_HD u32 max16x2_nan(u32 a, u32 b) {
  static_assert(D == 1 || D == 2, "16-bit inputs");
#if defined(__CUDA_ARCH__)
  u32 r;
  if constexpr (D == 1) asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  const u32 lo = has_nan16x2<D>(a & 0xFFFFu) || has_nan16x2<D>(b & 0xFFFFu) ? 0x7FFFu : detail::amax16x2_lanes<D>(a, b, false) & 0xFFFFu;
  const u32 hi = has_nan16x2<D>(a >> 16) || has_nan16x2<D>(b >> 16) ? 0x7FFFu : detail::amax16x2_lanes<D>(a, b, false) >> 16;
  return lo | (hi << 16);
#endif
}

// Per-tensor / block fp32 scale (docs/numerics.md "Scale rules").
QF_HD float compute_scale(float amax, float fmax, float eps, bool pow2, float inf_value) {
  if (amax < eps) amax = eps;
  if (amax == 0.0f || !f32_is_finite(amax)) return 1.0f;
  float scale = fmax / amax;
  if (f32_is_inf(scale)) scale = inf_value;
  if (pow2) scale = f32_from_bits(f32_bits(scale) & 0xFF800000u);
  return scale;
}

// NVFP4 global encode scale S_enc = (448 * 6) / amax; FLT_MAX if Inf; 1 if amax is 0 or not
// finite or the quotient is 0.
QF_HD float nvfp4_global_encode_scale(float amax_tensor) {
  if (amax_tensor == 0.0f || !f32_is_finite(amax_tensor)) return 1.0f;
  float s = (E4M3::kMaxFinite * E2M1::kMaxFinite) / amax_tensor;
  if (f32_is_inf(s)) s = kFltMax;
  if (s == 0.0f) s = 1.0f;
  return s;
}

// S_dec = (float)(1.0 / (double)S_enc).
QF_HD float nvfp4_global_decode_scale(float s_enc) {
  return static_cast<float>(1.0 / static_cast<double>(s_enc));
}

// E4M3 bits of S_dec_b = e4m3_satfinite(block_amax * (S_enc / 6)).
QF_HD u8 nvfp4_block_scale(float block_amax, float s_enc) {
  const float k = s_enc / E2M1::kMaxFinite;
  return encode_rn<E4M3>(block_amax * k);
}

// min(1 / (float(S_dec_b) * S_dec), FLT_MAX); a zero block scale gives FLT_MAX.
QF_HD float nvfp4_element_multiplier(u8 s_dec_b_bits, float s_dec) {
  const float d = decode<E4M3>(s_dec_b_bits) * s_dec;
  return fminf(1.0f / d, kFltMax);
}

// INT8 per-channel (torchao style): scale = round_to_input_dtype(amax / 127).
// input_dtype: 0 = fp32, 1 = bf16, 2 = fp16.
QF_HD float int8_channel_scale(float amax, int input_dtype) {
  const float s = amax / 127.0f;
  if (input_dtype == 1) return bf16_to_f32(f32_to_bf16(s));
  if (input_dtype == 2) return f16_to_f32(f32_to_f16(s));
  return s;
}

QF_HD float int8_channel_multiplier(float scale) { return 1.0f / fmaxf(scale, 1e-12f); }

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 and the stochastic-rounding bit assignment
// ---------------------------------------------------------------------------------------------
constexpr u32 kPhiloxM0 = 0xD2511F53u;
constexpr u32 kPhiloxM1 = 0xCD9E8D57u;
constexpr u32 kPhiloxW0 = 0x9E3779B9u;
constexpr u32 kPhiloxW1 = 0xBB67AE85u;

QF_HD u32 mulhi32(u32 a, u32 b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<u32>((static_cast<u64>(a) * b) >> 32);
#endif
}

QF_HD void philox4x32_10(const u32 counter[4], const u32 key[2], u32 out[4]) {
  u32 c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  u32 k0 = key[0], k1 = key[1];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    const u32 hi0 = mulhi32(kPhiloxM0, c0), lo0 = kPhiloxM0 * c0;
    const u32 hi1 = mulhi32(kPhiloxM1, c2), lo1 = kPhiloxM1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// The 4 random words of element group g (elements 4g .. 4g+3 of a stream's logical output, or
// 16g .. 16g+15 for 8-bit elements: sr_group_elems).
QF_HD void sr_random_group(u64 seed, u64 offset, u32 stream_id, u64 group, u32 out[4]) {
  const u32 key[2] = {static_cast<u32>(seed),
                      static_cast<u32>(seed >> 32) ^ (kPhiloxW0 * stream_id)};
  const u32 ctr[4] = {static_cast<u32>(group), static_cast<u32>(group >> 32),
                      static_cast<u32>(offset), static_cast<u32>(offset >> 32)};
  philox4x32_10(ctr, key, out);
}

// sr_random_group with the group index given as its two words (vector paths whose groups share
// the high word).
QF_HD void sr_random_group_at(u64 seed, u64 offset, u32 stream_id, u32 group_lo, u32 group_hi, u32 out[4]) {
  const u32 key[2] = {static_cast<u32>(seed),
                      static_cast<u32>(seed >> 32) ^ (kPhiloxW0 * stream_id)};
  const u32 ctr[4] = {group_lo, group_hi, static_cast<u32>(offset), static_cast<u32>(offset >> 32)};
  philox4x32_10(ctr, key, out);
}

// Where the random bits of element l of format F lie among the words of its group (l /
// sr_group_elems<F>()): word (l & 3), or for 8-bit elements byte (l & 3) of word ((l >> 2) & 3),
// the low byte first. sr_word_of is the word, sr_bit_of the first bit.
template <class F>
QF_HD constexpr u32 sr_word_of(u64 l) {
  return static_cast<u32>((l / (32 / F::kSrBits)) & 3u);
}
template <class F>
QF_HD constexpr u32 sr_bit_of(u64 l) {
  return static_cast<u32>(F::kSrBits * (l % (32 / F::kSrBits)));
}

// Word i of a group (selects, not an indexed load: a run-time index into w would put it in local
// memory).
QF_HD u32 sr_pick_word(const u32 w[4], u32 i) { return i == 0 ? w[0] : i == 1 ? w[1] : i == 2 ? w[2] : w[3]; }

// The random bits of element l of format F from the words of its group.
template <class F>
QF_HD u32 sr_pick(const u32 w[4], u64 l) {
  const u32 v = sr_pick_word(w, sr_word_of<F>(l));
  if constexpr (F::kSrBits == 32) return v;
  else return (v >> sr_bit_of<F>(l)) & ((1u << F::kSrBits) - 1u);
}

// The random bits of the element with linear index l of a stream of format F.
template <class F>
QF_HD u32 sr_random_bits(u64 seed, u64 offset, u32 stream_id, u64 linear_index) {
  u32 w[4];
  sr_random_group(seed, offset, stream_id, linear_index / u64(sr_group_elems<F>()), w);
  return sr_pick<F>(w, linear_index);
}

// ---------------------------------------------------------------------------------------------
// 16-point random Hadamard transform (in place, no dtype rounding: the caller rounds).
// NaN outputs are canonical 0x7FC00000 on the host (see rht16); no output depends on the payload.
// ---------------------------------------------------------------------------------------------
constexpr u32 kDefaultRhtSignMask = 0xD7E8u;

// The signs and butterflies of rht16, without its final 1/4 (4 * the transform; a max of
// magnitudes over it, times 1/4, is the max over rht16's outputs: the exact power-of-two
// scaling is monotone, and NaN outputs are skipped either way).
QF_HD void rht16_unscaled(float v[16], u32 sign_mask) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 16; ++i)
    if ((sign_mask >> i) & 1u) v[i] = -v[i];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int h = 1; h < 16; h <<= 1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < 16; ++i) {
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
    }
  }
}

QF_HD void rht16(float v[16], u32 sign_mask) {
  rht16_unscaled(v, sign_mask);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 16; ++i) {
    // On the host a NaN output is made the canonical +qNaN (the FPU keeps an operand's payload;
    // the GPU's arithmetic gives 0x7FFFFFFF). RHT streams are quantized formats, whose encoders
    // map every NaN to one code, so the payload reaches no output either way.
    const float y = v[i] * 0.25f;
#if defined(__CUDA_ARCH__)
    v[i] = y;
#else
    v[i] = f32_is_nan(y) ? f32_quiet_nan() : y;
#endif
  }
}

}  // namespace qf
