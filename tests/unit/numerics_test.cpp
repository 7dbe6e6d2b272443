// Unit tests of templates/qforge/numerics.cuh (host build of the shared scalar numerics).
// The exhaustive comparisons against ml_dtypes live in tests/numerics/test_conversions.py;
// these tests pin the hand-computed edge cases of docs/numerics.md.
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

namespace qf {
namespace {

float F(u32 bits) { return f32_from_bits(bits); }
u32 B(float x) { return f32_bits(x); }
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ----------------------------------------------------------------------------- Philox
struct PhiloxKat {
  u32 ctr[4];
  u32 key[2];
  u32 expect[4];
};

TEST(Philox, Random123KnownAnswers) {
  // Known-answer vectors of philox4x32_10 published with Random123 (kat_vectors).
  const PhiloxKat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kats) {
    u32 out[4];
    philox4x32_10(k.ctr, k.key, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], k.expect[i]) << "word " << i;
  }
}

TEST(Philox, SrBitAssignment) {
  const u64 seed = 0x0123456789ABCDEFull, offset = 0xFEDCBA9876543210ull;
  for (u32 stream = 0; stream < 2; ++stream) {
    for (u64 l : {0ull, 1ull, 2ull, 3ull, 4ull, 7ull, 8ull, 13ull, 1000001ull, (1ull << 40) + 6}) {
      // 32-bit formats: word l & 3 of group l / 4; e2m1: byte l & 3 of word (l >> 2) & 3 of group
      // l / 16, the low byte first.
      for (const u64 per : {4ull, 16ull}) {
        const u64 g = l / per;
        const u32 key[2] = {static_cast<u32>(seed), static_cast<u32>(seed >> 32) ^ (0x9E3779B9u * stream)};
        const u32 ctr[4] = {static_cast<u32>(g), static_cast<u32>(g >> 32), static_cast<u32>(offset),
                            static_cast<u32>(offset >> 32)};
        u32 w[4], grp[4];
        philox4x32_10(ctr, key, w);
        sr_random_group(seed, offset, stream, g, grp);
        for (int i = 0; i < 4; ++i) EXPECT_EQ(grp[i], w[i]);
        if (per == 4) {
          EXPECT_EQ(sr_random_bits<Int8>(seed, offset, stream, l), w[l & 3]);
          EXPECT_EQ(sr_random_bits<E4M3>(seed, offset, stream, l), w[l & 3]);
        } else {
          EXPECT_EQ(sr_random_bits<E2M1>(seed, offset, stream, l), (w[(l >> 2) & 3] >> (8 * (l & 3))) & 0xFFu);
        }
      }
    }
  }
  // Sixteen e2m1 elements share one group, each with its own 8 bits.
  u32 w[4];
  sr_random_group(9, 4, 0, 0, w);
  for (u64 l = 0; l < 16; ++l) EXPECT_EQ(sr_random_bits<E2M1>(9, 4, 0, l), (w[l / 4] >> (8 * (l % 4))) & 0xFFu);
  // Streams 0 and 1 use different keys; different offsets different counters.
  EXPECT_NE(sr_random_bits<Int8>(1, 0, 0, 0), sr_random_bits<Int8>(1, 0, 1, 0));
  EXPECT_NE(sr_random_bits<Int8>(1, 0, 0, 0), sr_random_bits<Int8>(1, 1, 0, 0));
  EXPECT_EQ(sr_random_bits<Int8>(5, 6, 1, 77), sr_random_bits<Int8>(5, 6, 1, 77));
}

// ----------------------------------------------------------------------------- exp2i
TEST(Exp2i, ExactOverFullRange) {
  for (int e = -149; e <= 127; ++e) EXPECT_EQ(exp2i(e), std::ldexp(1.0f, e)) << e;
  EXPECT_EQ(B(exp2i(-149)), 1u);
  EXPECT_EQ(B(exp2i(-127)), 0x00400000u);
  EXPECT_EQ(B(exp2i(-126)), 0x00800000u);
  EXPECT_EQ(exp2i(-150), 0.0f);
  EXPECT_TRUE(std::isinf(exp2i(128)));
}

// ----------------------------------------------------------------------------- bf16 / fp16
TEST(Half, Bf16EdgeCases) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(F(0x3F808000)), 0x3F80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(F(0x3F818000)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(F(0x3F808001)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(F(0x7F7FFFFF)), 0x7F80);  // overflow to Inf
  EXPECT_EQ(f32_to_bf16(kNaN), 0x7FC0);
  EXPECT_EQ(f32_to_bf16(-kNaN), 0xFFC0);
  EXPECT_EQ(f32_to_bf16(F(0x7F800001)), 0x7FC0);  // signalling NaN stays NaN
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  for (u32 h = 0; h < 65536; ++h) {
    const float x = bf16_to_f32(static_cast<u16>(h));
    if (!std::isnan(x)) {
      EXPECT_EQ(f32_to_bf16(x), h);
    }
  }
}

// The 16-bit identity copies' word form (bf16 -> bf16, fp16 -> fp16 two elements at a time, as
// the copy kernels take them) against the definition, widen then narrow, per half: every pattern
// in each half beside every 61st pattern and the NaN / Inf edges in the other.
template <int D>
void expect_identity16x2_is_widen_narrow() {
  auto one = [](u32 h) -> u32 {
    return D == 1 ? f32_to_bf16(bf16_to_f32(static_cast<u16>(h))) : f32_to_f16(f16_to_f32(static_cast<u16>(h)));
  };
  auto nan = [](u32 h) {
    return std::isnan(D == 1 ? bf16_to_f32(static_cast<u16>(h)) : f16_to_f32(static_cast<u16>(h)));
  };
  std::vector<u32> ref(65536);
  for (u32 h = 0; h < 65536; ++h) ref[h] = one(h);
  std::vector<u32> other = {0x7F80, 0x7F81, 0x7FBF, 0x7FC0, 0x7FFF, 0xFF80, 0xFF81, 0xFFFF, 0x7C00, 0x7C01,
                            0x7DFF, 0x7E00, 0xFC01, 0x7BFF, 0x7F7F, 0x8000, 0x0000, 0x0001};
  for (u32 h = 0; h < 65536; h += 61) other.push_back(h);
  size_t bad = 0;
  for (u32 h = 0; h < 65536; ++h)
    for (u32 o : other) {
      bad += identity16x2<D>(h | (o << 16)) != (ref[h] | (ref[o] << 16));
      bad += identity16x2<D>(o | (h << 16)) != (ref[o] | (ref[h] << 16));
      bad += identity16x2_nan_bits<D>(h | (o << 16)) != ((nan(h) ? 0x8000u : 0u) | (nan(o) ? 0x80000000u : 0u));
    }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(identity16x2<D>(D == 1 ? 0xFF817F81u : 0xFC017C01u), D == 1 ? 0xFFC07FC0u : 0xFE007E00u);
}

TEST(Half, Identity16x2IsWidenThenNarrow) {
  expect_identity16x2_is_widen_narrow<1>();
  expect_identity16x2_is_widen_narrow<2>();
}

TEST(Half, Fp16EdgeCases) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie above max -> even -> Inf
  EXPECT_EQ(f32_to_f16(-1e30f), 0xFC00);
  EXPECT_EQ(f32_to_f16(kInf), 0x7C00);
  EXPECT_EQ(f32_to_f16(kNaN), 0x7E00);
  EXPECT_EQ(f32_to_f16(-kNaN), 0xFE00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);          // tie -> even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);          // 1.5 ulp tie -> 2
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);       // subnormal carries to normal
  EXPECT_EQ(f32_to_f16(F(1)), 0x0000);
  EXPECT_EQ(f32_to_f16(-F(1)), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie -> even
  for (u32 h = 0; h < 65536; ++h) {
    const float x = f16_to_f32(static_cast<u16>(h));
    const u32 e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F && m != 0) {
      EXPECT_TRUE(std::isnan(x));
      continue;
    }
    // Independent value: (-1)^s * 2^(e-15) * (1 + m/1024), subnormal 2^-14 * m/1024.
    const double mag = e == 0 ? std::ldexp(static_cast<double>(m), -24)
                       : e == 0x1F ? INFINITY
                                   : std::ldexp(1024.0 + m, static_cast<int>(e) - 25);
    EXPECT_EQ(static_cast<double>(x), (h & 0x8000) ? -mag : mag) << h;
    EXPECT_EQ(f32_to_f16(x), h);
  }
}

// The device's fp16 -> fp32 is a hardware conversion whose result f16_nan_as_soft keeps for
// every non-NaN input and replaces by the software NaN for NaN inputs. Whatever a converter
// returns for NaN (its own payload, the canonical 0x7FFFFFFF, another sign), the composition is
// bit-equal to f16_to_f32_soft for all 65536 inputs, given an exact converter for the rest: here
// the host's IEEE conversion (_Float16), the one the device's cvt.f32.f16 must equal
// (GPU test Fp16Widening.GpuEqualsSoftwareOnAll65536Patterns).
TEST(Half, Fp16HardwareWideningWithNanFixupEqualsSoftware) {
  EXPECT_EQ(B(f16_to_f32(0x7E01)), 0x7FC02000u);  // payload kept
  EXPECT_EQ(B(f16_to_f32(0xFC01)), 0xFF802000u);  // signalling, negative: kept as it is
  EXPECT_EQ(B(f16_nan_as_soft(0x7C01, F(0x7FFFFFFF))), 0x7F802000u);
  EXPECT_EQ(B(f16_nan_as_soft(0x7C00, kInf)), B(kInf));  // Inf is not a NaN: the converter's
  EXPECT_EQ(B(f16_nan_as_soft(0x0001, 1.0f)), B(1.0f));  // non-NaN: the converter's value, as given
  int nans = 0;
  for (u32 h = 0; h < 65536; ++h) {
    const u16 x = static_cast<u16>(h);
    const u32 want = B(f16_to_f32_soft(x));
    EXPECT_EQ(B(f16_to_f32(x)), want) << std::hex << h;
    const bool nan = ((h >> 10) & 0x1F) == 0x1F && (h & 0x3FF) != 0;
    nans += nan;
    // Converters that return some other NaN for a NaN input.
    for (u32 other : {0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FC00000u, want ^ 0x80000000u}) {
      const float got = f16_nan_as_soft(x, nan ? F(other) : f16_to_f32_soft(x));
      EXPECT_EQ(B(got), want) << std::hex << h << " " << other;
    }
#if defined(__FLT16_MAX__)
    _Float16 hw;
    static_assert(sizeof hw == 2);
    memcpy(&hw, &x, 2);
    const float widened = static_cast<float>(hw);
    if (!nan) EXPECT_EQ(B(widened), want) << std::hex << h;  // the IEEE widening is exact
    EXPECT_EQ(B(f16_nan_as_soft(x, widened)), want) << std::hex << h;
#endif
  }
  EXPECT_EQ(nans, 2 * 1023);
}

// ----------------------------------------------------------------------------- element formats
// Every finite value of a float format, by brute force from the definition (independent of
// decode): sign, exponent field, mantissa field.
template <class Fm>
std::vector<double> grid_values() {
  std::vector<double> v;
  const int n = 1 << (Fm::kBits - 1);
  for (int mag = 0; mag < n; ++mag) {
    const int ef = mag >> Fm::kManBits, mf = mag & ((1 << Fm::kManBits) - 1);
    if (std::is_same_v<Fm, E4M3> && mag == 0x7F) continue;
    if (std::is_same_v<Fm, E5M2> && ef == 31) continue;
    const double m = ef == 0 ? mf : (1 << Fm::kManBits) + mf;
    const int e = (ef == 0 ? 1 : ef) - Fm::kBias - Fm::kManBits;
    v.push_back(std::ldexp(m, e));
  }
  return v;
}

template <class Fm>
void check_format_roundtrip() {
  const int n = 1 << Fm::kBits;
  const auto grid = grid_values<Fm>();
  EXPECT_EQ(static_cast<float>(grid.back()), Fm::kMaxFinite);
  EXPECT_EQ(decode<Fm>(Fm::kMaxBits), Fm::kMaxFinite);
  for (int b = 0; b < n; ++b) {
    const u8 bits = static_cast<u8>(b);
    const float x = decode<Fm>(bits);
    if (std::isnan(x)) {
      EXPECT_EQ(encode_rn<Fm>(x), Fm::kNanBits);
      continue;
    }
    if (std::isinf(x)) {
      const u8 sign = static_cast<u8>(x < 0 ? 1u << (Fm::kBits - 1) : 0u);
      EXPECT_EQ(encode_rn<Fm>(x), sign | Fm::kMaxBits);
      continue;
    }
    const double mag = grid[b & ((1 << (Fm::kBits - 1)) - 1)];
    EXPECT_EQ(static_cast<double>(x), (b >> (Fm::kBits - 1)) ? -mag : mag) << Fm::kName << b;
    EXPECT_EQ(encode_rn<Fm>(x), bits) << Fm::kName << " " << b;
    // And with SR: an exact grid value never moves.
    EXPECT_EQ(encode_sr<Fm>(x, 0u), bits);
    EXPECT_EQ(encode_sr<Fm>(x, 0xFFFFFFFFu), bits);
  }
  // Midpoints between neighbours go to the even encoding (bits counted from 0 upward).
  for (size_t i = 0; i + 1 < grid.size(); ++i) {
    const float mid = static_cast<float>((grid[i] + grid[i + 1]) / 2);
    ASSERT_EQ(static_cast<double>(mid), (grid[i] + grid[i + 1]) / 2);
    const u8 expect = static_cast<u8>((i & 1) ? i + 1 : i);
    EXPECT_EQ(encode_rn<Fm>(mid), expect) << Fm::kName << " mid " << mid;
    EXPECT_EQ(encode_rn<Fm>(std::nextafter(mid, 0.0f)), i);
    EXPECT_EQ(encode_rn<Fm>(std::nextafter(mid, kInf)), i + 1);
    const u8 s = static_cast<u8>(1u << (Fm::kBits - 1));
    EXPECT_EQ(encode_rn<Fm>(-mid), s | expect);
  }
  // Saturation, NaN, signed zero, tiny values.
  const u8 s = static_cast<u8>(1u << (Fm::kBits - 1));
  EXPECT_EQ(encode_rn<Fm>(kInf), Fm::kMaxBits);
  EXPECT_EQ(encode_rn<Fm>(-kInf), s | Fm::kMaxBits);
  EXPECT_EQ(encode_rn<Fm>(std::nextafter(Fm::kMaxFinite, kInf)), Fm::kMaxBits);
  EXPECT_EQ(encode_rn<Fm>(Fm::kMaxFinite * 1.25f), Fm::kMaxBits);
  EXPECT_EQ(encode_rn<Fm>(-Fm::kMaxFinite * 1.25f), s | Fm::kMaxBits);
  EXPECT_EQ(encode_rn<Fm>(kFltMax), Fm::kMaxBits);
  EXPECT_EQ(encode_rn<Fm>(kNaN), Fm::kNanBits);
  EXPECT_EQ(encode_rn<Fm>(-kNaN), Fm::kNanBits);
  EXPECT_EQ(encode_rn<Fm>(-0.0f), s);
  EXPECT_EQ(encode_rn<Fm>(F(1)), 0);
  EXPECT_EQ(encode_rn<Fm>(-F(1)), s);
  const float min_sub = static_cast<float>(grid[1]);
  EXPECT_EQ(encode_rn<Fm>(min_sub / 2), 0);  // tie -> even (0)
  EXPECT_EQ(encode_rn<Fm>(std::nextafter(min_sub / 2, kInf)), 1);
}

TEST(Encode, E4M3) { check_format_roundtrip<E4M3>(); }
TEST(Encode, E5M2) { check_format_roundtrip<E5M2>(); }
TEST(Encode, E2M1) { check_format_roundtrip<E2M1>(); }
TEST(Encode, E2M3) { check_format_roundtrip<E2M3>(); }
TEST(Encode, E3M2) { check_format_roundtrip<E3M2>(); }

TEST(Encode, TraitConstants) {
  EXPECT_EQ(decode<E4M3>(0x7F) != decode<E4M3>(0x7F), true);
  EXPECT_EQ(E4M3::kMinNormalExp, -6);
  EXPECT_EQ(E5M2::kMinNormalExp, -14);
  EXPECT_EQ(E3M2::kMinNormalExp, -2);
  EXPECT_EQ(decode<E4M3>(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(decode<E5M2>(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(decode<E5M2>(0x7C), kInf);
  EXPECT_TRUE(std::isnan(decode<E5M2>(E5M2::kNanBits)));
  EXPECT_TRUE(std::isnan(decode<E4M3>(E4M3::kNanBits)));
  EXPECT_EQ(decode<E2M1>(E2M1::kNanBits), 6.0f);
  EXPECT_EQ(decode<E2M1>(0xF), -6.0f);
  EXPECT_EQ(decode<E2M3>(0x3F), -7.5f);
  EXPECT_EQ(decode<E3M2>(0x3F), -28.0f);
}

TEST(Encode, Int8) {
  for (int b = 0; b < 256; ++b) {
    const float x = decode<Int8>(static_cast<u8>(b));
    EXPECT_EQ(x, static_cast<float>(static_cast<int8_t>(b)));
    EXPECT_EQ(encode_rn<Int8>(x), b);
  }
  EXPECT_EQ(encode_rn<Int8>(0.5f), 0);
  EXPECT_EQ(encode_rn<Int8>(1.5f), 2);
  EXPECT_EQ(encode_rn<Int8>(2.5f), 2);
  EXPECT_EQ(encode_rn<Int8>(-2.5f), 0xFE);
  EXPECT_EQ(encode_rn<Int8>(-0.5f), 0);
  EXPECT_EQ(encode_rn<Int8>(-0.0f), 0);
  EXPECT_EQ(encode_rn<Int8>(126.5f), 126);
  EXPECT_EQ(encode_rn<Int8>(127.4f), 127);
  EXPECT_EQ(encode_rn<Int8>(127.5f), 127);
  EXPECT_EQ(encode_rn<Int8>(1e9f), 127);
  EXPECT_EQ(encode_rn<Int8>(kInf), 127);
  EXPECT_EQ(encode_rn<Int8>(-127.5f), 0x80);
  EXPECT_EQ(encode_rn<Int8>(-128.5f), 0x80);
  EXPECT_EQ(encode_rn<Int8>(-kInf), 0x80);
  EXPECT_EQ(encode_rn<Int8>(kNaN), 0);
  EXPECT_EQ(encode_rn<Int8>(std::nextafter(0.5f, 1.0f)), 1);
  EXPECT_EQ(encode_rn<Int8>(F(1)), 0);
  // Against std::nearbyint over a dense sweep (default rounding mode is RNE).
  for (float x = -130.0f; x <= 130.0f; x += 0.03125f) {
    const float r = std::clamp(std::nearbyint(x), -128.0f, 127.0f);
    EXPECT_EQ(static_cast<int8_t>(encode_rn<Int8>(x)), static_cast<int>(r)) << x;
  }
}

// ----------------------------------------------------------------------------- E8M0
TEST(E8M0, Rceil) {
  EXPECT_EQ(e8m0_rceil(0.0f), 0);
  EXPECT_EQ(e8m0_rceil(-0.0f), 0);
  EXPECT_EQ(e8m0_rceil(kInf), 0xFE);
  EXPECT_EQ(e8m0_rceil(kNaN), 0xFF);
  EXPECT_EQ(e8m0_rceil(1.0f), 127);                              // exact power of two
  EXPECT_EQ(e8m0_rceil(std::nextafter(1.0f, 2.0f)), 128);        // just above
  EXPECT_EQ(e8m0_rceil(std::nextafter(1.0f, 0.0f)), 127);        // just below
  EXPECT_EQ(e8m0_rceil(F(0x00800000)), 1);                        // 2^-126
  EXPECT_EQ(e8m0_rceil(F(0x00400000)), 0);                        // subnormal 2^-127
  EXPECT_EQ(e8m0_rceil(F(0x00400001)), 1);                        // subnormal above 2^-127
  EXPECT_EQ(e8m0_rceil(F(0x00000001)), 0);                        // smallest subnormal
  EXPECT_EQ(e8m0_rceil(F(0x007FFFFF)), 1);
  EXPECT_EQ(e8m0_rceil(F(0x7F000000)), 254);                      // 2^127
  EXPECT_EQ(e8m0_rceil(kFltMax), 254);                            // capped below the NaN code
  // The MX use: E = rceil(amax * fl(1/448)).
  const float r448 = 1.0f / 448.0f;
  EXPECT_EQ(e8m0_rceil(448.0f * r448), 127);
  EXPECT_EQ(e8m0_rceil(449.0f * r448), 128);
  EXPECT_EQ(e8m0_rceil(0.0f * r448), 0);
}

// The branch-free forms cast_mx_pair_direct takes (cast_pair.cuh) against e8m0_rceil and
// mx_multiplier: around every binade's boundaries and subnormal threshold, plus a stride over
// all of [0, Inf] (every pattern of that range was checked once offline, 2^31 - 2^23 + 1 values).
TEST(E8M0, RceilNonNegative) {
  const auto check = [](u32 a) {
    const float v = F(a);
    const u32 e = e8m0_rceil_nonneg(v);
    ASSERT_EQ(e, e8m0_rceil(v)) << std::hex << a;
    ASSERT_EQ(mx_multiplier_bits(e), f32_bits(mx_multiplier(u8(e)))) << std::hex << a;
  };
  for (u32 x = 0; x <= 0xFFu; ++x)
    for (u32 m : {0u, 1u, 2u, 0x3FFFFFu, 0x400000u, 0x400001u, 0x7FFFFEu, 0x7FFFFFu})
      if ((x << 23 | m) <= 0x7F800000u) check(x << 23 | m);
  for (u32 a = 0; a <= 0x7F800000u; a += 997u) check(a);
  check(0x7F800000u);
}

TEST(E8M0, Floor) {
  EXPECT_EQ(e8m0_floor(0.0f, 8), 0);
  EXPECT_EQ(e8m0_floor(kInf, 8), 254);
  EXPECT_EQ(e8m0_floor(kNaN, 8), 0xFF);
  EXPECT_EQ(e8m0_floor(448.0f, E4M3::kEmax), 127);                 // floor(log2 448) = 8
  EXPECT_EQ(e8m0_floor(256.0f, E4M3::kEmax), 127);                 // exact power of two
  EXPECT_EQ(e8m0_floor(std::nextafter(256.0f, 0.0f), 8), 126);     // just below
  EXPECT_EQ(e8m0_floor(std::nextafter(256.0f, 1e9f), 8), 127);     // just above
  EXPECT_EQ(e8m0_floor(6.0f, E2M1::kEmax), 127);
  EXPECT_EQ(e8m0_floor(std::ldexp(1.0f, -100), 8), 19);
  EXPECT_EQ(e8m0_floor(std::ldexp(1.0f, -125), 8), 0);             // clamps at 0
  EXPECT_EQ(e8m0_floor(F(0x00000001), 0), 0);                      // subnormal, clamped
  // floor(log2) of subnormals is exact: 2^-127 -> -127, 0x7FFFFF -> -127, 0x1 -> -149.
  EXPECT_EQ(e8m0_floor(F(0x00400000), -130), 130);
  EXPECT_EQ(e8m0_floor(F(0x007FFFFF), -130), 130);
  EXPECT_EQ(e8m0_floor(F(0x003FFFFF), -130), 129);
  EXPECT_EQ(e8m0_floor(F(0x00000001), -150), 128);
  EXPECT_EQ(e8m0_floor(kFltMax, 0), 254);
  EXPECT_EQ(e8m0_floor(kFltMax, E5M2::kEmax), 239);
}

TEST(E8M0, RneMatchesMlDtypesMeasurements) {
  EXPECT_EQ(e8m0_rne(1.0f), 127);
  EXPECT_EQ(e8m0_rne(1.5f), 128);
  EXPECT_EQ(e8m0_rne(3.0f), 129);
  EXPECT_EQ(e8m0_rne(0.75f), 127);
  EXPECT_EQ(e8m0_rne(std::nextafter(1.5f, 0.0f)), 127);
  EXPECT_EQ(e8m0_rne(0.0f), 255);
  EXPECT_EQ(e8m0_rne(-0.0f), 255);
  EXPECT_EQ(e8m0_rne(-2.0f), 255);
  EXPECT_EQ(e8m0_rne(kNaN), 255);
  EXPECT_EQ(e8m0_rne(kInf), 255);
  EXPECT_EQ(e8m0_rne(1e-40f), 0);
  EXPECT_EQ(e8m0_rne(std::ldexp(1.0f, -127)), 0);
  EXPECT_EQ(e8m0_rne(std::ldexp(1.0f, -128)), 0);
  EXPECT_EQ(e8m0_rne(F(0x00400001)), 1);
  EXPECT_EQ(e8m0_rne(std::ldexp(1.5f, 127)), 255);
  EXPECT_EQ(e8m0_rne(std::nextafter(std::ldexp(1.5f, 127), 0.0f)), 254);
}

TEST(E8M0, DecodeAndMultiplier) {
  EXPECT_TRUE(std::isnan(e8m0_decode(0xFF)));
  EXPECT_EQ(e8m0_decode(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_decode(127), 1.0f);
  EXPECT_EQ(e8m0_decode(254), std::ldexp(1.0f, 127));
  for (int e = 0; e < 255; ++e) {
    EXPECT_EQ(mx_multiplier(static_cast<u8>(e)), std::ldexp(1.0f, 127 - e));
    EXPECT_EQ(e8m0_rne(e8m0_decode(static_cast<u8>(e))), e);
    if (e > 0) {
      EXPECT_EQ(e8m0_rceil(e8m0_decode(static_cast<u8>(e))), e);
    }
  }
  EXPECT_EQ(B(mx_multiplier(254)), 0x00400000u);
  EXPECT_TRUE(std::isnan(mx_multiplier(0xFF)));
}

// ----------------------------------------------------------------------------- scales
TEST(Scale, Amax) {
  float a = 0.0f;
  a = amax_step(a, -3.0f);
  a = amax_step(a, kNaN);
  EXPECT_EQ(a, 3.0f);
  a = amax_step(a, -kInf);
  EXPECT_EQ(a, kInf);
  EXPECT_EQ(B(amax_step(0.0f, -0.0f)), 0u);
}

// The magnitude-word forms of input dtype D on one pair of halves (a, x), in the low half and in
// the high half: amax16x2_abs_step from a magnitude accumulator a (not NaN), read without a mask,
// and staying a magnitude; max16x2 of two magnitudes, NaN included (both NaN: a NaN).
template <int D>
bool magnitude_forms_ok(u32 a, u32 x) {
  const u32 inf = D == 1 ? 0x7F80u : 0x7C00u;
  auto widen = [](u32 h) { return D == 1 ? bf16_to_f32(static_cast<u16>(h)) : f16_to_f32(static_cast<u16>(h)); };
  auto same = [](float got, float want) { return std::isnan(want) ? std::isnan(got) : B(got) == B(want); };
  const float av = widen(a), xv = widen(x);
  bool ok = true;
  if (a <= inf) {
    const float want = std::isnan(xv) ? av : amax_step(av, xv);
    const u32 lo = amax16x2_abs_step<D>(a, x), hi = amax16x2_abs_step<D>(a << 16, x << 16);
    ok = ok && same(widen(lo), want) && same(widen(hi >> 16), want) && ((lo | hi) & 0x80008000u) == 0;
  }
  if (a <= 0x7FFFu && x <= 0x7FFFu) {
    const float want = std::isnan(av) ? xv : std::isnan(xv) ? av : std::max(av, xv);
    const u32 lo = max16x2<D>(a, x), hi = max16x2<D>(a << 16, x << 16);
    ok = ok && same(widen(lo), want) && same(widen(hi >> 16), want);
    // max16x2_nan keeps a NaN half, and has_nan16x2 finds it; else it is max16x2.
    const bool nan = std::isnan(av) || std::isnan(xv);
    const u32 nlo = max16x2_nan<D>(a, x), nhi = max16x2_nan<D>(a << 16, x << 16);
    ok = ok && has_nan16x2<D>(nlo) == nan && has_nan16x2<D>(nhi) == nan && has_nan16x2<D>(a) == std::isnan(av) &&
         (nan || (same(widen(nlo), want) && same(widen(nhi >> 16), want)));
  }
  return ok;
}

// The packed amax steps of 16-bit staged tiles and the magnitude-word forms (host forms; the GPU
// test checks the hardware's) against amax_step on the widened values, on every (accumulator,
// input) pair of halves the kernels can meet: the accumulator any non-NaN pattern for bf16's
// amax16x2_step (its sign bits are don't-care), any non-negative non-NaN one for fp16's and for
// amax16x2_abs_step; the input any pattern; two magnitudes for max16x2; in the low half and in the
// high half. The widened input's NaNs are skipped explicitly: glibc's fmaxf
// returns a NaN for a signaling NaN operand (bf16 0x7F81..0x7FBF and fp16 0x7C01..0x7DFF widen to
// fp32 signaling NaNs), where the device's max.f32 returns the other operand.
TEST(Scale, PackedAmaxStepsEqualAmaxStepOnAllPairs) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<u64> bad(threads, 0);
  std::vector<u32> first(threads, 0xFFFFFFFFu);
  auto work = [&](unsigned id) {
    for (u64 i = id; i < (u64(1) << 32); i += threads) {
      const u32 a = static_cast<u32>(i >> 16), x = static_cast<u32>(i & 0xFFFFu);
      bool ok = true;
      if ((a & 0x7FFFu) <= 0x7F80u) {  // bf16 accumulator not NaN
        const float av = std::fabs(bf16_to_f32(static_cast<u16>(a))), xv = bf16_to_f32(static_cast<u16>(x));
        const float want = std::isnan(xv) ? av : amax_step(av, xv);
        const u32 lo = amax_bf16x2_step(a, x), hi = amax_bf16x2_step(a << 16, x << 16);
        ok = ok && B(amax16x2_lo<1>(lo)) == B(want) && B(amax16x2_hi<1>(hi)) == B(want);
      }
      if (a <= 0x7C00u) {  // fp16 accumulator non-negative and not NaN (the kernels' only ones)
        const float av = std::fabs(f16_to_f32(static_cast<u16>(a))), xv = f16_to_f32(static_cast<u16>(x));
        const float want = std::isnan(xv) ? av : amax_step(av, xv);
        const u32 lo = amax_f16x2_step(a, x), hi = amax_f16x2_step(a << 16, x << 16);
        ok = ok && B(amax16x2_lo<2>(lo)) == B(want) && B(amax16x2_hi<2>(hi)) == B(want);
      }
      ok = ok && magnitude_forms_ok<1>(a, x) && magnitude_forms_ok<2>(a, x);
      if (!ok && bad[id]++ == 0) first[id] = static_cast<u32>(i);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work, t);
  for (auto& t : pool) t.join();
  u64 total = 0;
  for (u64 b : bad) total += b;
  EXPECT_EQ(total, 0u) << "first differing (acc << 16 | x) 0x" << std::hex << *std::min_element(first.begin(), first.end());
}

TEST(Scale, ComputeScale) {
  // amax 0 with eps 0 -> 1; amax 0 with eps -> fmax / eps.
  EXPECT_EQ(compute_scale(0.0f, 448.0f, 0.0f, false, kFltMax), 1.0f);
  EXPECT_EQ(compute_scale(0.0f, 448.0f, 0.5f, false, kFltMax), 896.0f);
  EXPECT_EQ(B(compute_scale(0.0f, 448.0f, 1e-4f, false, kFltMax)), 0x4A88B800u);
  // eps clamp: anything below eps behaves like eps.
  EXPECT_EQ(compute_scale(1e-10f, 448.0f, 1e-4f, false, kFltMax),
            compute_scale(1e-4f, 448.0f, 1e-4f, false, kFltMax));
  // Inf / NaN amax -> 1.
  EXPECT_EQ(compute_scale(kInf, 448.0f, 0.0f, false, kFltMax), 1.0f);
  EXPECT_EQ(compute_scale(kNaN, 448.0f, 0.0f, false, kFltMax), 1.0f);
  EXPECT_EQ(compute_scale(kNaN, 448.0f, 1e-4f, true, kFltMax), 1.0f);
  // Exactly fmax -> 1.
  EXPECT_EQ(compute_scale(448.0f, 448.0f, 0.0f, false, kFltMax), 1.0f);
  EXPECT_EQ(compute_scale(57344.0f, 57344.0f, 0.0f, true, kFltMax), 1.0f);
  // Just above a power of two: 448 / (2 + 2^-22) = 0x435FFFFE, pow2 -> 128.
  const float a2 = std::nextafter(2.0f, 3.0f);
  EXPECT_EQ(B(compute_scale(a2, 448.0f, 0.0f, false, kFltMax)), 0x435FFFFEu);
  EXPECT_EQ(compute_scale(a2, 448.0f, 0.0f, true, kFltMax), 128.0f);
  EXPECT_EQ(compute_scale(2.0f, 448.0f, 0.0f, true, kFltMax), 128.0f);  // 224 -> 128
  // pow2 rounds down: 448/3 = 149.33 (0x43155555) -> 128.
  EXPECT_EQ(B(compute_scale(3.0f, 448.0f, 0.0f, false, kFltMax)), 0x43155555u);
  EXPECT_EQ(compute_scale(3.0f, 448.0f, 0.0f, true, kFltMax), 128.0f);
  EXPECT_EQ(compute_scale(0.875f, 448.0f, 0.0f, true, kFltMax), 512.0f);  // exact 512
  // Denormal amax: 448 / 2^-140 overflows -> inf_value.
  EXPECT_EQ(compute_scale(std::ldexp(1.0f, -140), 448.0f, 0.0f, false, kFltMax), kFltMax);
  EXPECT_EQ(compute_scale(std::ldexp(1.0f, -140), 448.0f, 0.0f, true, kFltMax),
            std::ldexp(1.0f, 127));
  // inf_value path (block scaling of fp16 input): 448 * 2^120 overflows.
  EXPECT_EQ(compute_scale(std::ldexp(1.0f, -120), 448.0f, 0.0f, false, 65504.0f), 65504.0f);
  EXPECT_EQ(compute_scale(std::ldexp(1.0f, -120), 448.0f, 0.0f, true, 65504.0f), 32768.0f);
  EXPECT_EQ(compute_scale(std::ldexp(1.0f, -120), 448.0f, 0.0f, false, F(0x7F7F0000)),
            F(0x7F7F0000));
  // The denormal amax that does not overflow: 448 / 2^-118 = 1.75 * 2^126.
  EXPECT_EQ(compute_scale(std::ldexp(1.0f, -118), 448.0f, 0.0f, false, kFltMax),
            std::ldexp(1.75f, 126));
}

TEST(Scale, Nvfp4Global) {
  EXPECT_EQ(nvfp4_global_encode_scale(0.0f), 1.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(kInf), 1.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(kNaN), 1.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(2688.0f), 1.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(F(1)), kFltMax);                 // 2688 / 2^-149 = Inf
  EXPECT_EQ(nvfp4_global_encode_scale(kFltMax), 2688.0f / kFltMax);    // tiny but non-zero
  EXPECT_EQ(B(nvfp4_global_encode_scale(100.0f)), 0x41D70A3Du);        // 26.88
  EXPECT_EQ(nvfp4_global_decode_scale(1.0f), 1.0f);
  EXPECT_EQ(B(nvfp4_global_decode_scale(kFltMax)), 0x00200000u);       // 2^-128, via double
  EXPECT_EQ(nvfp4_global_decode_scale(0.25f), 4.0f);
  EXPECT_EQ(nvfp4_global_decode_scale(26.88f), static_cast<float>(1.0 / double(26.88f)));
}

TEST(Scale, Nvfp4Block) {
  // Zero block: scale 0 -> element multiplier FLT_MAX -> zeros stay zero.
  EXPECT_EQ(nvfp4_block_scale(0.0f, 26.88f), 0x00);
  EXPECT_EQ(nvfp4_element_multiplier(0x00, 1.0f), kFltMax);
  EXPECT_EQ(encode_rn<E2M1>(0.0f * kFltMax), 0);
  // amax 0 tensor: S_enc = 1; block amax 6 -> S_dec_b = 1 (0x38); multiplier 1.
  EXPECT_EQ(nvfp4_block_scale(6.0f, 1.0f), 0x38);
  EXPECT_EQ(nvfp4_element_multiplier(0x38, 1.0f), 1.0f);
  // Block with the tensor amax: 100 * (26.88 / 6) rounds to 448 exactly -> 0x7E.
  EXPECT_EQ(nvfp4_block_scale(100.0f, nvfp4_global_encode_scale(100.0f)), 0x7E);
  // Saturation of the block scale.
  EXPECT_EQ(nvfp4_block_scale(1e6f, 1.0f), 0x7E);
  EXPECT_EQ(nvfp4_block_scale(kInf, 1.0f), 0x7E);
  // Tiny block: 2^-12 * (1/6) -> below half the smallest e4m3 subnormal (2^-10) -> 0.
  EXPECT_EQ(nvfp4_block_scale(std::ldexp(1.0f, -12), 1.0f), 0x00);
  // Multiplier: 1 / (S_dec_b * S_dec), e.g. S_dec_b = 2 (0x40), S_dec = 0.25 -> 2.
  EXPECT_EQ(nvfp4_element_multiplier(0x40, 0.25f), 2.0f);
  // Product underflows to 0 -> FLT_MAX (not Inf).
  EXPECT_EQ(nvfp4_element_multiplier(0x01, F(0x00200000)), kFltMax);
}

TEST(Scale, Int8Channel) {
  EXPECT_EQ(int8_channel_scale(127.0f, 0), 1.0f);
  EXPECT_EQ(int8_channel_scale(127.0f, 1), 1.0f);
  EXPECT_EQ(int8_channel_scale(127.0f, 2), 1.0f);
  EXPECT_EQ(B(int8_channel_scale(1.0f, 0)), 0x3C010204u);  // fl(1/127)
  EXPECT_EQ(B(int8_channel_scale(1.0f, 1)), 0x3C010000u);  // -> bf16 0x3C01
  EXPECT_EQ(int8_channel_scale(1.0f, 2), std::ldexp(1032.0f, -17));  // -> fp16 0x2008
  EXPECT_EQ(int8_channel_scale(0.0f, 1), 0.0f);
  EXPECT_EQ(int8_channel_multiplier(0.0f), 1.0f / 1e-12f);
  EXPECT_EQ(int8_channel_multiplier(0.5f), 2.0f);
  // fp16 rounding can underflow a tiny scale to 0: the 1e-12 floor then applies.
  EXPECT_EQ(int8_channel_scale(1e-6f, 2), 0.0f);
  EXPECT_EQ(int8_channel_multiplier(int8_channel_scale(1e-6f, 2)), 1.0f / 1e-12f);
}

// ----------------------------------------------------------------------------- RHT
TEST(Rht, MatchesMatrixDefinition) {
  u64 state = 12345;
  auto next = [&]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int>((state >> 33) % 2001) - 1000;
  };
  for (u32 mask : {kDefaultRhtSignMask, 0u, 0xFFFFu, 0x1234u}) {
    for (int t = 0; t < 200; ++t) {
      float x[16], v[16];
      for (int i = 0; i < 16; ++i) v[i] = x[i] = static_cast<float>(next());
      rht16(v, mask);
      for (int j = 0; j < 16; ++j) {
        double y = 0;  // (x^T diag(s) H16 / 4)_j
        for (int i = 0; i < 16; ++i) {
          const double s = ((mask >> i) & 1u) ? -1.0 : 1.0;
          const double h = (__builtin_popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0;
          y += x[i] * s * h;
        }
        EXPECT_EQ(static_cast<double>(v[j]), y / 4) << mask << " " << j;
      }
    }
  }
}

TEST(Rht, NanOutputsAreCanonical) {
  // Host FPUs propagate NaN payloads and signs, GPUs produce 0x7FFFFFFF: rht16 canonicalises.
  float v[16];
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i);
  v[5] = F(0xFFA3BA7Au);  // negative NaN with a payload
  rht16(v, kDefaultRhtSignMask);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(B(v[i]), 0x7FC00000u) << i;
  for (int i = 0; i < 16; ++i) v[i] = 0.0f;
  v[0] = kInf;
  v[1] = -kInf;  // Inf - Inf
  rht16(v, 0);
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(B(v[i]) == 0x7FC00000u || std::isinf(v[i])) << i;
}

TEST(Rht, DefaultMaskIsTheSignVector) {
  const int s[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  u32 mask = 0;
  for (int i = 0; i < 16; ++i)
    if (s[i] < 0) mask |= 1u << i;
  EXPECT_EQ(mask, kDefaultRhtSignMask);
}

TEST(Rht, HadamardSquaredIs16I) {
  // H (H diag(s) x / 4) / 4 = diag(s) x: applying twice (second time without signs) gives the
  // signed input back, exactly for these integer inputs.
  float x[16], v[16];
  for (int i = 0; i < 16; ++i) v[i] = x[i] = static_cast<float>(3 * i - 17);
  rht16(v, kDefaultRhtSignMask);
  rht16(v, 0);
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(v[i], ((kDefaultRhtSignMask >> i) & 1u) ? -x[i] : x[i]);
  for (int i = 0; i < 16; ++i) v[i] = x[i];
  rht16(v, 0);
  rht16(v, 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(v[i], x[i]);
  // Unit vectors: row j of H / 4.
  for (int j = 0; j < 16; ++j) {
    for (int i = 0; i < 16; ++i) v[i] = i == j ? 1.0f : 0.0f;
    rht16(v, 0);
    for (int i = 0; i < 16; ++i)
      EXPECT_EQ(v[i], (__builtin_popcount(static_cast<unsigned>(i & j)) & 1) ? -0.25f : 0.25f);
  }
}

// ----------------------------------------------------------------------------- SR
template <class Fm>
void neighbours(float v, double& lo, double& hi) {
  if constexpr (Fm::kIsInt) {
    lo = std::floor(std::fabs(static_cast<double>(v)));
    hi = std::ceil(std::fabs(static_cast<double>(v)));
  } else {
    const auto g = grid_values<Fm>();
    const double a = std::fabs(static_cast<double>(v));
    auto it = std::lower_bound(g.begin(), g.end(), a);
    hi = *it;
    lo = (*it == a) ? a : *(it - 1);
  }
}

template <class Fm>
void check_sr_neighbours(u64 seed) {
  const auto g = grid_values<Fm>();
  const double maxv = Fm::kMaxFinite;
  u64 st = seed;
  for (int t = 0; t < 20000; ++t) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    // log-uniform magnitudes across (and below) the whole range, both signs.
    const double u = static_cast<double>(st >> 11) / 9007199254740992.0;
    float v = static_cast<float>(std::ldexp(maxv, -static_cast<int>(u * 30)) * (0.5 + u));
    if (v > Fm::kMaxFinite) continue;
    if (st & 1) v = -v;
    double lo, hi;
    neighbours<Fm>(v, lo, hi);
    const u32 r = static_cast<u32>(st >> 17);
    const double q = decode<Fm>(encode_sr<Fm>(v, r));
    EXPECT_TRUE(std::fabs(q) == lo || std::fabs(q) == hi) << v;
    EXPECT_TRUE(std::signbit(q) == std::signbit(v) || q == 0);
    // Threshold: up iff frac > (r >> 8) / 2^24; formats of fewer than 32 bits (e2m1's 8): iff
    // frac + (r mod 2^kSrBits) / 2^kSrBits >= 1, i.e. floor(q + u).
    if (lo != hi) {
      const double f = (std::fabs(static_cast<double>(v)) - lo) / (hi - lo);
      if constexpr (Fm::kSrBits < 32) {
        const double uu = std::ldexp(static_cast<double>(r & ((1u << Fm::kSrBits) - 1u)), -Fm::kSrBits);
        EXPECT_EQ(std::fabs(q), f + uu >= 1.0 ? hi : lo) << v << " r=" << r;
      } else {
        const double uu = static_cast<double>(r >> 8) / 16777216.0;
        EXPECT_EQ(std::fabs(q), f > uu ? hi : lo) << v << " r=" << r;
      }
    }
  }
}

TEST(Sr, AlwaysANeighbourWithTheSpecifiedThreshold) {
  check_sr_neighbours<E4M3>(1);
  check_sr_neighbours<E5M2>(2);
  check_sr_neighbours<E2M1>(3);
  check_sr_neighbours<E2M3>(4);
  check_sr_neighbours<E3M2>(5);
  check_sr_neighbours<Int8>(6);
}

TEST(Sr, ExactThresholds) {
  // e2m1 (8 bits, floor(q + u)): 0.75 is halfway between 0.5 and 1: up iff R >= 2^7.
  EXPECT_EQ(encode_sr<E2M1>(0.75f, 1u << 7), 0x2);
  EXPECT_EQ(encode_sr<E2M1>(0.75f, (1u << 7) - 1), 0x1);
  EXPECT_EQ(encode_sr<E2M1>(0.75f, 0xFFFFFF00u), 0x1);  // the high 24 bits are ignored
  EXPECT_EQ(encode_sr<E2M1>(-0.75f, 0xFFu), 0xA);
  EXPECT_EQ(encode_sr<E2M1>(-0.75f, 0u), 0x9);
  // On the grid nothing moves; 5.9f rounds to 6 with R >= 2^8 * (1 - frac) = 12.79999 (step 2:
  // frac 0.95000005).
  EXPECT_EQ(encode_sr<E2M1>(1.5f, 0xFFu), 0x3);
  EXPECT_EQ(encode_sr<E2M1>(5.9f, 13u), 0x7);
  EXPECT_EQ(encode_sr<E2M1>(5.9f, 12u), 0x6);
  // Below 2^-8 of a step (2^-9 here) never rounds up; exactly 2^-8 does with R = 2^8 - 1.
  EXPECT_EQ(encode_sr<E2M1>(std::ldexp(1.0f, -10), 0xFFu), 0x0);
  EXPECT_EQ(encode_sr<E2M1>(std::ldexp(1.0f, -9), 0xFFu), 0x1);
  EXPECT_EQ(encode_sr<E2M1>(std::ldexp(1.0f, -9), 0xFEu), 0x0);
  // e4m3 below the smallest subnormal: 2^-12 = 1/8 of 2^-9: up iff (r >> 8) < 2^21.
  EXPECT_EQ(encode_sr<E4M3>(std::ldexp(1.0f, -12), ((1u << 21) - 1) << 8), 0x01);
  EXPECT_EQ(encode_sr<E4M3>(std::ldexp(1.0f, -12), (1u << 21) << 8), 0x00);
  // 1.5 * 2^-11 = 0.375 of 2^-9 (shift 25 path): up iff (r >> 8) < 6291456.
  EXPECT_EQ(encode_sr<E4M3>(std::ldexp(1.5f, -11), 6291455u << 8), 0x01);
  EXPECT_EQ(encode_sr<E4M3>(std::ldexp(1.5f, -11), 6291456u << 8), 0x00);
  // fp32 subnormal input: frac < 2^-24 of an ulp: up only when r >> 8 == 0.
  EXPECT_EQ(encode_sr<E4M3>(F(1), 0u), 0x01);
  EXPECT_EQ(encode_sr<E4M3>(F(1), 0x100u), 0x00);
  EXPECT_EQ(encode_sr<E5M2>(std::ldexp(1.0f, -40), 0u), 0x01);
  EXPECT_EQ(encode_sr<E5M2>(std::ldexp(1.0f, -40), 0x100u), 0x00);
  // Zero never moves.
  EXPECT_EQ(encode_sr<E4M3>(0.0f, 0u), 0x00);
  EXPECT_EQ(encode_sr<E4M3>(-0.0f, 0u), 0x80);
  EXPECT_EQ(encode_sr<Int8>(-0.0f, 0u), 0x00);
  // Carry into the next binade: e4m3 just below 2 (1.875 < v < 2) rounding up gives 2 (0x40).
  EXPECT_EQ(encode_sr<E4M3>(1.9f, 0u), 0x40);
  // int8: 2.25 -> 2 or 3, up iff (r >> 8) < 2^22.
  EXPECT_EQ(encode_sr<Int8>(2.25f, ((1u << 22) - 1) << 8), 3);
  EXPECT_EQ(encode_sr<Int8>(2.25f, (1u << 22) << 8), 2);
  EXPECT_EQ(encode_sr<Int8>(-2.25f, 0u), 0xFD);
}

TEST(Sr, SaturationAndNaN) {
  for (u32 r : {0u, 0x80000000u, 0xFFFFFFFFu}) {
    EXPECT_EQ(encode_sr<E4M3>(449.0f, r), 0x7E);
    EXPECT_EQ(encode_sr<E4M3>(448.0f, r), 0x7E);
    EXPECT_EQ(encode_sr<E4M3>(-kInf, r), 0xFE);
    EXPECT_EQ(encode_sr<E4M3>(kNaN, r), 0x7F);
    EXPECT_EQ(encode_sr<E5M2>(1e30f, r), 0x7B);
    EXPECT_EQ(encode_sr<E5M2>(kInf, r), 0x7B);
    EXPECT_EQ(encode_sr<E5M2>(-kNaN, r), 0x7F);
    EXPECT_EQ(encode_sr<E2M1>(6.5f, r), 0x7);
    EXPECT_EQ(encode_sr<E2M1>(-kInf, r), 0xF);
    EXPECT_EQ(encode_sr<E2M1>(kNaN, r), 0x7);
    EXPECT_EQ(encode_sr<E2M3>(kNaN, r), 0x1F);
    EXPECT_EQ(encode_sr<E3M2>(-30.0f, r), 0x3F);
    EXPECT_EQ(encode_sr<Int8>(127.7f, r), 127);
    EXPECT_EQ(encode_sr<Int8>(200.0f, r), 127);
    EXPECT_EQ(encode_sr<Int8>(-128.3f, r), 0x80);
    EXPECT_EQ(encode_sr<Int8>(kInf, r), 127);
    EXPECT_EQ(encode_sr<Int8>(-kInf, r), 0x80);
    EXPECT_EQ(encode_sr<Int8>(kNaN, r), 0);
  }
  EXPECT_EQ(encode_sr<Int8>(126.5f, 0u), 127);
  EXPECT_EQ(encode_sr<Int8>(-127.5f, 0u), 0x80);
  EXPECT_EQ(encode_sr<Int8>(-127.5f, 0xFFFFFFFFu), 0x81);
}

TEST(Sr, Reproducible) {
  for (u64 l = 0; l < 64; ++l) {
    const u32 a = sr_random_bits<E2M1>(42, 7, 1, l), b = sr_random_bits<E2M1>(42, 7, 1, l);
    EXPECT_EQ(a, b);
    EXPECT_EQ(encode_sr<E2M1>(1.3f, a), encode_sr<E2M1>(1.3f, b));
  }
}

// Unbiasedness. For v between neighbours lo < hi with p = P(up) = ceil(f * 2^24) / 2^24 (formats
// of b < 32 random bits, e2m1's 8: floor(f * 2^b) / 2^b), f = (|v| - lo) / (hi - lo): |E[q] - v| =
// |p - f| * (hi - lo) <= 2^-b (hi - lo), b = 24 or kSrBits, and the mean of N draws has standard
// deviation (hi - lo) sqrt(p (1 - p) / N). Bound checked:
//   |mean - v| <= 5 * (hi - lo) * sqrt(f (1 - f) / N) + 2^-b * (hi - lo)   (+ a 1e-12 slack
// for the double-precision summation).
template <class Fm>
void check_unbiased(float v, u64 seed) {
  constexpr int N = 200000;
  double lo, hi;
  neighbours<Fm>(v, lo, hi);
  const double ulp = hi - lo;
  const double f = ulp > 0 ? (std::fabs(static_cast<double>(v)) - lo) / ulp : 0;
  double sum = 0;
  for (int i = 0; i < N; ++i)
    sum += decode<Fm>(encode_sr<Fm>(v, sr_random_bits<Fm>(seed, 3, 0, static_cast<u64>(i))));
  const double mean = sum / N;
  const double bound = 5 * ulp * std::sqrt(f * (1 - f) / N) + std::ldexp(ulp, Fm::kSrBits < 32 ? -Fm::kSrBits : -24) + 1e-12;
  EXPECT_LE(std::fabs(mean - v), bound) << Fm::kName << " v=" << v << " mean=" << mean;
}

TEST(Sr, Unbiased) {
  for (float v : {0.1f, 0.3f, 0.75f, 1.2f, 2.7f, 3.9f, 5.1f, -4.4f, -0.01f})
    check_unbiased<E2M1>(v, 11);
  for (float v : {0.3f, -7.25f, 100.9f, 126.5f, -127.99f, 0.001f}) check_unbiased<Int8>(v, 12);
  for (float v : {0.3f, 300.0f, -0.001f}) check_unbiased<E4M3>(v, 13);
}

// The kernels' int8 stochastic rounding (int8_sr_top, the code in its top byte) against
// encode_sr<Int8> on every fp32 pattern: at a pseudo-random word, at the words 0 and ~0, and, below
// 200 in magnitude, at the words whose 24 used bits sit one below, at and one above the pattern's
// fraction times 2^24 (the comparison that must be exact). The two hardware instructions it uses
// enter through their host models (max.NaN.f32, cvt.rmi.s32.f32: saturating, NaN -> 0); the GPU
// test (gpu_convert_test) runs the device code over the same patterns.
TEST(Sr, Int8FastEncoderEqualsEncodeSrOnAllPatterns) {
  EXPECT_EQ(detail::f32_floor_s32_sat(kNaN), 0);
  EXPECT_EQ(detail::f32_floor_s32_sat(-kInf), INT32_MIN);
  EXPECT_EQ(detail::f32_floor_s32_sat(-2.5f), -3);
  EXPECT_TRUE(std::isnan(detail::f32_max_nan(kNaN, -127.0f)));
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<u64> bad(threads, 0);
  std::vector<u32> first(threads, 0xFFFFFFFFu);
  auto fast = [](float x, u32 r) { return static_cast<u8>(int8_sr_top(x, r) >> 24); };
  auto work = [&](unsigned id) {
    for (u64 i = id; i < (u64(1) << 32); i += threads) {
      const u32 bits = static_cast<u32>(i);
      const float x = F(bits);
      const u32 r = (bits * 2654435761u) ^ (bits >> 11) ^ 0x5bd1e995u;
      bool ok = fast(x, r) == encode_sr<Int8>(x, r) && fast(x, 0u) == encode_sr<Int8>(x, 0u) &&
                fast(x, ~0u) == encode_sr<Int8>(x, ~0u);
      const double a = std::fabs(static_cast<double>(x));
      if (a < 200.0) {
        const double at = std::floor((a - std::floor(a)) * 16777216.0);
        for (int d = -1; d <= 1; ++d) {
          const double u = at + d;
          if (u < 0.0 || u >= 16777216.0) continue;
          const u32 rd = (static_cast<u32>(u) << 8) | (r & 0xFFu);
          ok = ok && fast(x, rd) == encode_sr<Int8>(x, rd);
        }
      }
      if (!ok && bad[id]++ == 0) first[id] = bits;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work, t);
  for (auto& t : pool) t.join();
  u64 total = 0;
  for (u64 b : bad) total += b;
  EXPECT_EQ(total, 0u) << "first differing pattern 0x" << std::hex << *std::min_element(first.begin(), first.end());
}

}  // namespace
}  // namespace qf


// The CTA -> tile mapping of the cast and amax kernels (cast_schedule.cuh tile_pos): every order visits
// each tile of the grid exactly once; column-fastest CTAs sweep a tile row, row-fastest ones a
// tile column; the reversed walk (the amax pre-pass) is the forward one backwards, so the cast
// kernel's first CTAs take the tiles the pre-pass took last.
TEST(CtaTile, EveryOrderVisitsEachTileOnceAndReversedIsForwardBackwards) {
  for (qf::u64 gx : {1, 2, 3, 7, 64, 513})
    for (qf::u64 gy : {1, 2, 5, 16, 31})
      for (bool row_fastest : {false, true}) {
        const qf::u64 n = gx * gy;
        std::vector<int> seen(n, 0);
        for (qf::u64 lin = 0; lin < n; ++lin) {
          const qf::TileRc f = qf::cta_tile(lin, gx, gy, row_fastest, false);
          const qf::TileRc r = qf::cta_tile(n - 1 - lin, gx, gy, row_fastest, true);
          ASSERT_LT(f.row, gx);
          ASSERT_LT(f.col, gy);
          ++seen[f.row * gy + f.col];
          EXPECT_EQ(f.row, r.row) << gx << "x" << gy << " lin " << lin;
          EXPECT_EQ(f.col, r.col) << gx << "x" << gy << " lin " << lin;
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), qf::i64(n)) << gx << "x" << gy;
      }
  // Column-fastest: CTAs 0..gy-1 take tile row 0 left to right; row-fastest: the grid's own order.
  EXPECT_EQ(qf::cta_tile(4, 3, 5, false, false).row, 0u);
  EXPECT_EQ(qf::cta_tile(4, 3, 5, false, false).col, 4u);
  EXPECT_EQ(qf::cta_tile(5, 3, 5, false, false).row, 1u);
  EXPECT_EQ(qf::cta_tile(4, 3, 5, true, false).row, 1u);  // blockIdx (1, 1)
  EXPECT_EQ(qf::cta_tile(4, 3, 5, true, false).col, 1u);
  EXPECT_EQ(qf::cta_tile(0, 3, 5, true, true).row, 2u);   // the last tile first
  EXPECT_EQ(qf::cta_tile(0, 3, 5, true, true).col, 4u);
}
