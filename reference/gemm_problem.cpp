#include "reference/gemm_problem.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "compiler/error.h"
#include "qforge/numerics.cuh"

namespace qf::ref {
namespace {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

u8 encode_fp8(ElemFormat f, float x) { return f == ElemFormat::E4M3 ? encode_rn<E4M3>(x) : encode_rn<E5M2>(x); }

// 65536 encodings to draw elements from: normal samples * fmax / 8, or integers in [-2, 2]
// (e2m1: bytes of two such nibbles, normal samples * 6 / 2; int8: uniform over every value;
// bf16 / fp16: normal samples rounded to the dtype).
std::vector<u16> elem_table(const GemmSpec& spec, ElemFormat f, GemmValues v, uint64_t seed) {
  std::vector<u16> t(65536);
  std::mt19937_64 rng(seed);
  if (gemm_operand_bits(spec, f) == 16) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& e : t) {
      const float x = v == GemmValues::Random ? normal(rng) : float(int(rng() % 5) - 2);
      e = spec.operand_dtype == DType::FP16 ? f32_to_f16(x) : f32_to_bf16(x);
    }
    return t;
  }
  if (f == ElemFormat::E2M1) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    auto nibble = [&] { return v == GemmValues::Random ? encode_rn<E2M1>(normal(rng)) : encode_rn<E2M1>(float(int(rng() % 5) - 2)); };
    for (auto& b : t) b = u8(nibble() | (nibble() << 4));
    return t;
  }
  if (traits(f).is_int) {  // int8: uniform over [-128, 127], or small integers
    for (auto& b : t) b = u8(v == GemmValues::Random ? int(rng() % 256) - 128 : int(rng() % 5) - 2);
    return t;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float spread = (f == ElemFormat::E4M3 ? 448.0f : 57344.0f) / 8.0f;
  for (auto& b : t) b = v == GemmValues::Random ? encode_fp8(f, normal(rng) * spread) : encode_fp8(f, float(int(rng() % 5) - 2));
  return t;
}

// Fills `out` with elements of `bytes` (1 or 2, little-endian) from the table in parallel chunks
// (deterministic for a seed, whatever `threads`).
void fill_elems(std::vector<uint8_t>& out, int bytes, const std::vector<u16>& table, uint64_t seed, int threads) {
  constexpr size_t kChunk = size_t(1) << 20;
  const size_t count = out.size() / size_t(bytes);
  const size_t chunks = (count + kChunk - 1) / kChunk;
  const int nt = int(std::min<size_t>(size_t(threads), std::max<size_t>(chunks, 1)));
  auto work = [&](int tid) {
    for (size_t c = size_t(tid); c < chunks; c += size_t(nt)) {
      uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (c + 1));
      const size_t end = std::min(count, (c + 1) * kChunk);
      for (size_t i = c * kChunk; i < end; i += 4) {
        const uint64_t r = splitmix(s);
        for (size_t j = 0; j < 4 && i + j < end; ++j) {
          const u16 e = table[(r >> (16 * j)) & 0xFFFF];
          for (int b = 0; b < bytes; ++b) out[(i + j) * size_t(bytes) + size_t(b)] = u8(e >> (8 * b));
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < nt; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
}

float random_scale(std::mt19937_64& rng, GemmValues v) {
  if (v == GemmValues::SmallIntegers) return std::ldexp(1.0f, int(rng() % 7) - 3);
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  return std::ldexp(u(rng), int(rng() % 8) - 4);
}

}  // namespace

GemmOperands GemmProblem::operands() const {
  GemmOperands o;
  o.a = a;
  o.b = b;
  o.a_scale = a_scale;
  o.b_scale = b_scale;
  o.alpha = alpha;
  o.a_amax = a_amax;
  o.b_amax = b_amax;
  o.offsets = offsets;
  o.counts = counts;
  o.m_max = m_max;
  o.m_total = m_total;
  o.k_total = k_total;
  return o;
}

namespace {

// Operands, scales, alpha and the previous output of a problem whose rows and groups are set.
void fill_problem(const GemmSpec& spec, GemmProblem& p, GemmValues values, bool with_alpha, uint64_t seed,
                  int threads) {
  const int64_t g = p.num_groups(), n = spec.n, k = spec.k;
  const bool kg = k_grouped(spec.layout);
  p.out_rows = kg ? g * spec.m : p.m_total;
  const bool fp4 = spec.scaling == GemmScaling::Nvfp4;
  const int64_t a_row = gemm_row_bytes(spec, spec.a_format, kg ? p.k_total : k);
  const int64_t b_row = gemm_row_bytes(spec, spec.b_format, kg ? p.k_total : k);
  p.a.resize(size_t(kg ? spec.m * a_row : p.m_total * a_row));
  p.b.resize(size_t(kg ? n * b_row : g * n * b_row));
  auto elem_bytes = [&](ElemFormat f) { return gemm_operand_bits(spec, f) == 16 ? 2 : 1; };
  fill_elems(p.a, elem_bytes(spec.a_format), elem_table(spec, spec.a_format, values, seed * 3 + 1), seed * 5 + 2, threads);
  fill_elems(p.b, elem_bytes(spec.b_format), elem_table(spec, spec.b_format, values, seed * 7 + 3), seed * 11 + 4, threads);

  std::mt19937_64 rng(seed * 13 + 5);
  const GemmScaleElems cnt = gemm_scale_elems(spec, p.m_total, g, p.k_total);
  const GemmScalingTraits& st = traits(spec.scaling);
  auto fill_scales = [&](std::vector<uint8_t>& out, int64_t count) {
    out.resize(size_t(count * st.scale_bytes));
    for (int64_t i = 0; i < count; ++i) {
      const float v = random_scale(rng, values);
      if (fp4) {
        // e4m3 block scales: powers of two (small integers), else values in [2^-4, 2^4) rounded to e4m3.
        out[size_t(i)] = encode_rn<E4M3>(v);
      } else if (st.scale_bytes == 1) {
        out[size_t(i)] = u8(127 + std::ilogb(v));  // the power of two at or below v
      } else {
        std::memcpy(&out[size_t(i) * 4], &v, 4);
      }
    }
  };
  fill_scales(p.a_scale, cnt.a);
  fill_scales(p.b_scale, cnt.b);
  if (fp4) {
    // Global amax: 6 * 448 * 2^j (decode scale 2^j exactly) for small integers, else anything positive.
    std::uniform_real_distribution<float> u(1.0f, 4000.0f);
    for (auto* v : {&p.a_amax, &p.b_amax}) {
      v->resize(size_t(g));
      for (auto& x : *v) x = values == GemmValues::Random ? u(rng) : std::ldexp(2688.0f, int(rng() % 5) - 2);
    }
  }
  if (with_alpha) {
    p.alpha.resize(size_t(g));
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    for (auto& a : p.alpha) a = values == GemmValues::Random ? u(rng) : std::ldexp(1.0f, int(rng() % 5) - 2);
  }
  if (spec.accumulate) {
    p.d_init.resize(size_t(p.out_rows * n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& d : p.d_init) d = values == GemmValues::Random ? normal(rng) : float(int(rng() % 17) - 8);
  }
}

}  // namespace

GemmProblem make_gemm_problem(const GemmSpec& spec, std::span<const int64_t> group_rows, int64_t trailing_rows,
                              GemmValues values, bool with_alpha, uint64_t seed, int threads) {
  validate(spec);
  QF_CHECK(!group_rows.empty() && trailing_rows >= 0, "at least one group");
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  GemmProblem p;
  p.offsets.push_back(0);
  for (int64_t r : group_rows) {
    QF_CHECK(r >= 0, "negative group size");
    p.offsets.push_back(p.offsets.back() + r);
  }
  p.m_total = p.offsets.back() + trailing_rows;
  fill_problem(spec, p, values, with_alpha, seed, threads);
  return p;
}

GemmProblem make_k_grouped_gemm_problem(const GemmSpec& spec, std::span<const int64_t> tokens, int64_t pad,
                                        GemmValues values, bool with_alpha, uint64_t seed, int threads) {
  validate(spec);
  QF_CHECK(k_grouped(spec.layout) && !tokens.empty() && pad >= 0, "a k-grouped spec and groups");
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  GemmProblem p;
  p.offsets.push_back(0);
  for (int64_t t : tokens) {
    QF_CHECK(t >= 0, "negative token count");
    p.offsets.push_back(p.offsets.back() + t);
  }
  const int64_t mult = gemm_k_total_multiple(spec);
  p.k_total = std::max<int64_t>(mult, (p.offsets.back() + pad + mult - 1) / mult * mult);
  fill_problem(spec, p, values, with_alpha, seed, threads);
  return p;
}

GemmProblem make_masked_gemm_problem(const GemmSpec& spec, std::span<const int64_t> counts, int64_t m_max,
                                     GemmValues values, bool with_alpha, uint64_t seed, int threads) {
  validate(spec);
  QF_CHECK(!counts.empty() && m_max > 0, "at least one group slot of m_max > 0 rows");
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  GemmProblem p;
  p.counts.assign(counts.begin(), counts.end());
  p.m_max = m_max;
  p.m_total = int64_t(counts.size()) * m_max;
  fill_problem(spec, p, values, with_alpha, seed, threads);
  return p;
}

std::vector<int64_t> random_group_rows(int groups, int64_t total, int zero_groups, int64_t granule, uint64_t seed) {
  QF_CHECK(groups >= 1 && zero_groups < groups && total >= 0 && granule >= 1 && total % granule == 0, "group split");
  std::mt19937_64 rng(seed);
  std::vector<int> order(static_cast<size_t>(groups));
  for (int i = 0; i < groups; ++i) order[size_t(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<double> w(static_cast<size_t>(groups), 0.0);
  std::uniform_real_distribution<double> u(0.2, 1.8);
  for (int i = zero_groups; i < groups; ++i) w[size_t(order[size_t(i)])] = u(rng);
  double sum = 0;
  for (double x : w) sum += x;
  const int64_t units = total / granule;
  std::vector<int64_t> rows(static_cast<size_t>(groups), 0);
  int64_t used = 0;
  for (int i = 0; i < groups; ++i) {
    rows[size_t(i)] = int64_t(std::floor(w[size_t(i)] / sum * double(units)));
    used += rows[size_t(i)];
  }
  rows[size_t(order[size_t(groups - 1)])] += units - used;  // a non-empty group takes the rest
  for (auto& r : rows) r *= granule;
  return rows;
}

}  // namespace qf::ref
