// The kernels' fast element encoders (cast_encode.cuh enc_rn: hardware cvt for fp8 on sm_89+, the
// one-addition e2m1 and int8 encoders; enc_sr for e2m1 (without int <-> float conversions) and int8)
// against the one software definition (numerics.cuh encode_rn / encode_sr), and the packed fp8
// encoder of the vector paths (pack4), over every one of the 2^32 fp32 bit patterns, on the GPU;
// and the packed amax steps of 16-bit staged tiles (numerics.cuh amax_bf16x2_step /
// amax_f16x2_step) and the magnitude-word forms (amax16x2_abs_step, max16x2) on every pair of
// 16-bit halves.
// The compile test runs everywhere.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/gpu_test_util.h"
#include "runtime/nvrtc.h"

namespace {

const char* kSource = R"(
#include "qforge/cast.cuh"
// Counts, per format, fp32 patterns where the fast and the reference encoders differ; keeps
// the smallest differing pattern.
template <class F>
__device__ void check_one(unsigned int bits, unsigned int* count, unsigned int* first) {
  const float x = qf::f32_from_bits(bits);
  if (qf::detail::enc_rn<F>(x) != qf::encode_rn<F>(x)) {
    atomicAdd(count, 1u);
    atomicMin(first, bits);
  }
}
// Stochastic rounding: the fast exact paths (e2m1, int8) with a pseudo-random word per pattern,
// and with words whose threshold sits just below, at and just above the pattern's fraction of a
// grid step (the comparisons the fast paths must get exactly right): int8 rounds up iff frac > u
// = (r >> 8) * 2^-24, e2m1 iff frac + u >= 1 with u = (r & 0xFF) * 2^-8.
template <class F>
__device__ void check_sr(unsigned int bits, unsigned int* count, unsigned int* first) {
  const float x = qf::f32_from_bits(bits);
  const unsigned int r = (bits * 2654435761u) ^ (bits >> 11) ^ 0x5bd1e995u;
  // e2m1's fast path returns bits whose low byte is the code (the packing takes that byte).
  auto fast = [](float v, unsigned int rb) { return qf::detail::enc_sr<F>(v, rb) & (qf::detail::kIsE2m1<F> ? 0xFFu : ~0u); };
  bool ok = fast(x, r) == qf::encode_sr<F>(x, r);
  const double a = fabs((double)x);
  if (a < 200.0) {
    const double step = F::kIsInt ? 1.0 : a < 2.0 ? 0.5 : a < 4.0 ? 1.0 : 2.0, q = a / step;
    // Formats with fewer than 32 bits use the low kSrBits (floor(q + u)), the others the top 24.
    constexpr bool kLow = F::kSrBits < 32;
    const double frac = q - floor(q), one = kLow ? double(1u << (kLow ? F::kSrBits : 0)) : 16777216.0;
    const double at = kLow ? ceil((1.0 - frac) * one) : floor(frac * one);
    for (int d = -1; d <= 1; ++d) {
      const double u = at + d;
      if (u < 0.0 || u >= one) continue;
      const unsigned int rd = kLow ? ((unsigned int)u | (r & ~((1u << (kLow ? F::kSrBits : 0)) - 1u))) : (((unsigned int)u << 8) | (r & 0xFFu));
      ok = ok && fast(x, rd) == qf::encode_sr<F>(x, rd);
    }
  }
  if (!ok) {
    atomicAdd(count, 1u);
    atomicMin(first, bits);
  }
}
// The packed round-to-nearest encoder of the vector paths (pack4: two-element cvt plus the NaN
// byte fix-up for fp8) against four scalar encodes; slot i sees every pattern (bits rotated).
template <class F>
struct PackStream {
  using Format = F;
  static constexpr bool kStochastic = false;
  static constexpr long long kDir = 0;
};
template <class F>
__device__ void check_pack(unsigned int bits, unsigned int* count, unsigned int* first) {
  constexpr int kShift = F::kBits == 4 ? 4 : 8;
  float x[4];
  unsigned int want = 0;
  for (int i = 0; i < 4; ++i) {
    x[i] = qf::f32_from_bits((bits << (8 * i)) | (i ? bits >> (32 - 8 * i) : 0u));
    want |= (unsigned int)(qf::encode_rn<F>(x[i]) & ((1u << kShift) - 1u)) << (kShift * i);
  }
  const qf::QuantizeArgs unused{};
  bool ok = qf::detail::pack4<PackStream<F>>(unused, 0, x) == want;
  if constexpr (F::kBits == 4) {  // eight to a word (pack_run's e2m1 path): slot i sees every pattern
    float y[8];
    for (int i = 0; i < 8; ++i) y[i] = qf::f32_from_bits((bits << (4 * i)) | (i ? bits >> (32 - 4 * i) : 0u));
    const qf::detail::RunWords<PackStream<F>, 8> r = qf::detail::pack_run<PackStream<F>, 8>(unused, 0, y);
    for (int i = 0; i < 8; ++i) ok = ok && ((r.w[0] >> (4 * i)) & 0xFu) == qf::encode_rn<F>(y[i]);
  }
  if (!ok) {
    atomicAdd(count, 1u);
    atomicMin(first, bits);
  }
}
// The stochastic e2m1 vector paths (pack_run's sixteen, and eight at the second half of a group,
// pack4 at each four of a group of sixteen) against scalar encodes with each element's own random
// bits (sr_random_bits: 8 bits, sixteen elements per Philox group), over 2^28 patterns (each slot a
// rotation of the pattern) at a linear index that moves with the pattern.
struct SrStream {
  using Format = qf::E2M1;
  static constexpr bool kStochastic = true;
  static constexpr long long kDir = 1;
};
__device__ void check_pack_sr(unsigned int bits, unsigned int* count, unsigned int* first) {
  qf::QuantizeArgs args{};
  args.seed = 0x0123456789ABCDEFull;
  args.offset = 77;
  const long long lin = (long long)bits * 16;
  float y[16];
  for (int i = 0; i < 16; ++i) y[i] = qf::f32_from_bits((bits << (2 * i)) | (i ? bits >> (32 - 2 * i) : 0u));
  auto want = [&](int i) {
    return qf::encode_sr<qf::E2M1>(y[i], qf::sr_random_bits<qf::E2M1>(args.seed, args.offset, 1, (unsigned long long)(lin + i))) & 0xFu;
  };
  const qf::detail::RunWords<SrStream, 16> r = qf::detail::pack_run<SrStream, 16>(args, lin, y);
  bool ok = true;
  for (int i = 0; i < 16; ++i) ok = ok && ((r.w[i / 8] >> (4 * (i % 8))) & 0xFu) == want(i);
  float y8[8];
  for (int i = 0; i < 8; ++i) y8[i] = y[8 + i];
  const qf::detail::RunWords<SrStream, 8> r8 = qf::detail::pack_run<SrStream, 8>(args, lin + 8, y8);
  for (int i = 0; i < 8; ++i) ok = ok && ((r8.w[0] >> (4 * i)) & 0xFu) == want(8 + i);
  for (int q = 0; q < 4; ++q) {  // the fours at lin % 16 == 0, 4, 8 and 12
    const unsigned int w = qf::detail::pack4<SrStream>(args, lin + 4 * q, y + 4 * q);
    for (int i = 0; i < 4; ++i) ok = ok && ((w >> (4 * i)) & 0xFu) == want(4 * q + i);
  }
  if (!ok) {
    atomicAdd(count, 1u);
    atomicMin(first, bits);
  }
}
// The stochastic int8 vector paths (pack_run's sixteen and eight: groups sharing the high word of
// their index; pack4) against scalar encodes with each element's own word, over 2^28 runs at
// linear indices whose group indices cross 2^32; values in [-128, 128) with 10 fraction bits,
// every seventh element a pattern (NaN, Inf, saturation, tiny).
struct SrInt8Stream {
  using Format = qf::Int8;
  static constexpr bool kStochastic = true;
  static constexpr long long kDir = 1;
};
__device__ void check_pack_sr_int8(unsigned int bits, unsigned int* count, unsigned int* first) {
  qf::QuantizeArgs args{};
  args.seed = 0x0123456789ABCDEFull;
  args.offset = 77;
  const long long lin = (long long)bits * 16 + 0x3FFF00000ll;
  float y[16];
  for (int i = 0; i < 16; ++i) {
    const unsigned int h = (bits + 0x9E3779B9u * (unsigned int)(i + 1)) * 2654435761u;
    y[i] = i % 7 == 3 ? qf::f32_from_bits(h ^ (bits << 5)) : (float)((int)(h >> 14) - 131072) * (1.0f / 1024.0f);
  }
  auto want = [&](int i) {
    return (unsigned int)qf::encode_sr<qf::Int8>(y[i], qf::sr_random_bits<qf::Int8>(args.seed, args.offset, 1, (unsigned long long)(lin + i)));
  };
  const qf::detail::RunWords<SrInt8Stream, 16> r = qf::detail::pack_run<SrInt8Stream, 16>(args, lin, y);
  bool ok = true;
  for (int i = 0; i < 16; ++i) ok = ok && ((r.w[i / 4] >> (8 * (i % 4))) & 0xFFu) == want(i);
  float y8[8];
  for (int i = 0; i < 8; ++i) y8[i] = y[8 + i];
  const qf::detail::RunWords<SrInt8Stream, 8> r8 = qf::detail::pack_run<SrInt8Stream, 8>(args, lin + 8, y8);
  for (int i = 0; i < 8; ++i) ok = ok && ((r8.w[i / 4] >> (8 * (i % 4))) & 0xFFu) == want(8 + i);
  for (int q = 0; q < 4; ++q) {
    const unsigned int w = qf::detail::pack4<SrInt8Stream>(args, lin + 4 * q, y + 4 * q);
    for (int i = 0; i < 4; ++i) ok = ok && ((w >> (8 * i)) & 0xFFu) == want(4 * q + i);
  }
  if (!ok) {
    atomicAdd(count, 1u);
    atomicMin(first, bits);
  }
}
// The magnitude-word forms (numerics.cuh amax16x2_abs_step, max16x2, max16x2_nan, has_nan16x2) on one pair of halves, in
// the low half and in the high half, as the host test takes them: the step from a magnitude
// accumulator (not NaN), read without a mask and staying a magnitude; the max of two magnitudes,
// NaN included (both NaN: a NaN).
template <int D>
__device__ bool magnitude_forms_ok(unsigned int a, unsigned int x) {
  const unsigned int inf = D == 1 ? 0x7F80u : 0x7C00u;
  auto widen = [](unsigned int h) { return D == 1 ? qf::bf16_to_f32((unsigned short)h) : qf::f16_to_f32((unsigned short)h); };
  auto same = [](float got, float want) { return want != want ? got != got : qf::f32_bits(got) == qf::f32_bits(want); };
  const float av = widen(a), xv = widen(x);
  bool ok = true;
  if (a <= inf) {
    const float want = xv != xv ? av : qf::amax_step(av, xv);
    const unsigned int lo = qf::amax16x2_abs_step<D>(a, x), hi = qf::amax16x2_abs_step<D>(a << 16, x << 16);
    ok = ok && same(widen(lo), want) && same(widen(hi >> 16), want) && ((lo | hi) & 0x80008000u) == 0;
  }
  if (a <= 0x7FFFu && x <= 0x7FFFu) {
    const float want = av != av ? xv : xv != xv ? av : fmaxf(av, xv);
    const unsigned int lo = qf::max16x2<D>(a, x), hi = qf::max16x2<D>(a << 16, x << 16);
    ok = ok && same(widen(lo), want) && same(widen(hi >> 16), want);
    const bool nan = av != av || xv != xv;
    const unsigned int nlo = qf::max16x2_nan<D>(a, x), nhi = qf::max16x2_nan<D>(a << 16, x << 16);
    ok = ok && qf::has_nan16x2<D>(nlo) == nan && qf::has_nan16x2<D>(nhi) == nan && qf::has_nan16x2<D>(a) == (av != av) &&
         (nan || (same(widen(nlo), want) && same(widen(nhi >> 16), want)));
  }
  return ok;
}
extern "C" __global__ void exhaustive(unsigned int* out) {
  const unsigned long long n = 1ull << 32;
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < n; i += 256ull * gridDim.x) {
    const unsigned int b = (unsigned int)i;
    check_one<qf::E4M3>(b, out + 0, out + 1);
    check_one<qf::E5M2>(b, out + 2, out + 3);
    check_one<qf::E2M1>(b, out + 4, out + 5);
    check_sr<qf::E2M1>(b, out + 6, out + 7);
    check_sr<qf::Int8>(b, out + 8, out + 9);
    check_pack<qf::E4M3>(b, out + 10, out + 11);
    check_pack<qf::E5M2>(b, out + 12, out + 13);
    check_pack<qf::E2M1>(b, out + 20, out + 21);
    if ((b & 15u) == 0) check_pack_sr(b >> 4, out + 22, out + 23);  // 2^28 runs (Philox-heavy)
    if ((b & 15u) == 1) check_pack_sr_int8(b >> 4, out + 28, out + 29);  // 2^28 runs
    check_one<qf::Int8>(b, out + 24, out + 25);
    check_pack<qf::Int8>(b, out + 26, out + 27);
    // RHT outputs rounded to bf16 / fp16 by the hardware: the software value, or NaN for NaN.
    for (int d = 1; d <= 2; ++d) {
      const float x = qf::f32_from_bits(b), got = qf::detail::round_to_dtype(x, d);
      const float want = d == 1 ? qf::bf16_to_f32(qf::f32_to_bf16(x)) : qf::f16_to_f32(qf::f32_to_f16(x));
      // The paired conversion, with the pattern in either half.
      float lo = x, hi = qf::f32_from_bits(b ^ 0x80000001u), lo2 = hi, hi2 = x;
      qf::detail::round2_to_dtype(lo, hi, d);
      qf::detail::round2_to_dtype(lo2, hi2, d);
      const bool pair_ok = (qf::f32_bits(lo) == qf::f32_bits(got) || (lo != lo && got != got)) &&
                           (qf::f32_bits(hi2) == qf::f32_bits(got) || (hi2 != hi2 && got != got)) &&
                           (qf::f32_bits(hi) == qf::f32_bits(lo2) || (hi != hi && lo2 != lo2));
      if (!(qf::f32_bits(got) == qf::f32_bits(want) || (got != got && want != want)) || !pair_ok) {
        atomicAdd(out + 14 + 2 * d, 1u);
        atomicMin(out + 15 + 2 * d, b);
      }
    }
    if (b < 256) {  // the hardware e4m3 decode of the NVFP4 block scales (both forms)
      const float got = qf::detail::e4m3_value(b), want = qf::decode<qf::E4M3>((unsigned char)b);
      const float got16 = qf::detail::e4m3_value16((unsigned short)b);
      if (!(qf::f32_bits(got) == qf::f32_bits(want) || (got != got && want != want)) ||
          !(qf::f32_bits(got16) == qf::f32_bits(want) || (got16 != got16 && want != want))) {
        atomicAdd(out + 14, 1u);
        atomicMin(out + 15, b);
      }
    }
    {  // The packed amax steps of 16-bit staged tiles (max.xorsign.abs.bf16x2; |x| and
       // max.f16x2): amax_step's magnitude for every (non-NaN accumulator, input) pair of
       // halves, the pair in the low half and in the high half; and the magnitude-word forms.
      const unsigned int a = b >> 16, x = b & 0xFFFFu;
      bool ok = true;
      if ((a & 0x7FFFu) <= 0x7F80u) {
        const float av = fabsf(qf::bf16_to_f32((unsigned short)a)), xv = qf::bf16_to_f32((unsigned short)x);
        const float want = xv != xv ? av : qf::amax_step(av, xv);  // NaN x (signaling too) ignored
        const unsigned int lo = qf::amax_bf16x2_step(a, x), hi = qf::amax_bf16x2_step(a << 16, x << 16);
        ok = ok && qf::f32_bits(qf::amax16x2_lo<1>(lo)) == qf::f32_bits(want) && qf::f32_bits(qf::amax16x2_hi<1>(hi)) == qf::f32_bits(want);
      }
      if (a <= 0x7C00u) {  // fp16: a non-negative accumulator, as the kernels hold (numerics.cuh)
        const float av = fabsf(qf::f16_to_f32((unsigned short)a)), xv = qf::f16_to_f32((unsigned short)x);
        const float want = xv != xv ? av : qf::amax_step(av, xv);
        const unsigned int lo = qf::amax_f16x2_step(a, x), hi = qf::amax_f16x2_step(a << 16, x << 16);
        ok = ok && qf::f32_bits(qf::amax16x2_lo<2>(lo)) == qf::f32_bits(want) && qf::f32_bits(qf::amax16x2_hi<2>(hi)) == qf::f32_bits(want);
      }
      ok = ok && magnitude_forms_ok<1>(a, x) && magnitude_forms_ok<2>(a, x);
      if (!ok) {
        atomicAdd(out + 32, 1u);
        atomicMin(out + 33, b);
      }
    }
    {  // NVFP4's block-scale code: enc_rn's bits for every non-NaN input
      const float x = qf::f32_from_bits(b);
      if (x == x && qf::detail::e4m3_code_not_nan(x) != qf::detail::enc_rn<qf::E4M3>(x)) {
        atomicAdd(out + 30, 1u);
        atomicMin(out + 31, b);
      }
    }
  }
}
)";

qf::rt::CompileRequest request(const std::string& arch) {
  return qf::rt::CompileRequest{kSource, "convert_test.cu", {"exhaustive"}, arch, {}};
}

TEST(FastEncoders, CompileForHopperAndBlackwell) {
  for (const char* arch : {"sm_90a", "sm_100a"}) EXPECT_FALSE(qf::rt::compile_cuda(request(arch)).image.empty()) << arch;
}

TEST(FastEncoders, GpuEqualSoftwareOnAllFp32Patterns) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  const CompileResult r = compile_cuda(request(device_arch(current_device())));
  Module m(r.image);
  CUfunction f = m.function(r.lowered_names.at("exhaustive"));
  std::vector<uint32_t> init;
  for (int i = 0; i < 17; ++i) init.insert(init.end(), {0u, 0xFFFFFFFFu});
  DeviceBuffer out(init.size() * 4);
  out.upload(init.data(), init.size() * 4);
  uint64_t p = out.address();
  void* args[] = {&p};
  Stream s;
  launch(f, Dim3{unsigned(device_sm_count() * 8)}, Dim3{256}, 0, s.get(), args);
  s.synchronize();
  const auto got = out.download_as<uint32_t>();
  const char* names[] = {"e4m3 rn", "e5m2 rn", "e2m1 rn", "e2m1 sr", "int8 sr", "e4m3 rn x4", "e5m2 rn x4", "e4m3 decode",
                         "bf16 round", "fp16 round", "e2m1 rn packed", "e2m1 sr packed", "int8 rn", "int8 rn x4", "int8 sr packed",
                         "e4m3 rn (not NaN)", "bf16 / fp16 packed amax step"};
  for (int i = 0; i < 17; ++i)
    EXPECT_EQ(got[2 * i], 0u) << names[i] << ": " << got[2 * i] << " patterns differ, first 0x" << std::hex
                              << got[2 * i + 1];
}

}  // namespace
