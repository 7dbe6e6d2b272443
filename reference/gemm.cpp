#include "reference/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "compiler/error.h"
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

namespace qf::ref {
namespace {

// The value of every encoding of an operand element: 256 bytes (e2m1: the low nibble), or 65536
// bf16 / fp16 bit patterns (identity operands).
std::vector<double> decode_table(const GemmSpec& spec, ElemFormat f) {
  if (gemm_operand_bits(spec, f) == 16) {
    std::vector<double> t(65536);
    for (int i = 0; i < 65536; ++i)
      t[size_t(i)] = spec.operand_dtype == DType::FP16 ? double(f16_to_f32(u16(i))) : double(bf16_to_f32(u16(i)));
    return t;
  }
  std::vector<double> t(256);
  for (int i = 0; i < 256; ++i) t[size_t(i)] = double(traits(f).decode(u8(i)));
  return t;
}

// Scale element i of a raw scale buffer (fp32, e8m0 for MX, e4m3 for NVFP4).
double scale_at(const GemmSpec& spec, std::span<const uint8_t> bytes, int64_t i) {
  if (spec.scaling == GemmScaling::Nvfp4) return double(decode<E4M3>(bytes[size_t(i)]));
  if (traits(spec.scaling).scale_bytes == 1) return double(e8m0_decode(bytes[size_t(i)]));
  float f;
  std::memcpy(&f, &bytes[size_t(i) * 4], 4);
  return double(f);
}

}  // namespace

std::vector<int> row_groups(std::span<const int64_t> offsets, int64_t m_total) {
  std::vector<int> g(size_t(m_total), -1);
  auto clamp = [&](int64_t r) { return std::clamp<int64_t>(r, 0, m_total); };
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const int64_t s = clamp(offsets[i]), e = std::max(s, clamp(offsets[i + 1]));
    for (int64_t r = s; r < e; ++r) g[size_t(r)] = int(i);  // a later group wins, as the kernel's later store
  }
  return g;
}

std::vector<int> masked_row_groups(std::span<const int64_t> counts, int64_t m_max) {
  std::vector<int> g(counts.size() * size_t(m_max), -1);
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t used = std::clamp<int64_t>(counts[i], 0, m_max);
    for (int64_t r = 0; r < used; ++r) g[i * size_t(m_max) + size_t(r)] = int(i);
  }
  return g;
}

GemmRows gemm_reference(const GemmSpec& spec, const GemmOperands& ops, std::span<const int64_t> rows, int threads) {
  validate(spec);
  const int64_t n = spec.n, k = spec.k, kb = (k + 127) / 128, nb = (n + 127) / 128;
  const bool masked = ops.m_max > 0;
  const bool kg = k_grouped(spec.layout);
  const bool members = spec.layout == GemmLayout::KGroupedMembers;
  const int64_t groups = masked ? int64_t(ops.counts.size()) : int64_t(ops.offsets.size()) - 1;
  QF_CHECK(groups >= 1, "offsets holds G + 1 entries (counts G)");
  QF_CHECK(!masked || ops.m_total == groups * ops.m_max, "masked layout: m_total = G * m_max");
  // K-grouped: A [m, k_total], B [N, k_total]; output rows g * m + r.
  const int64_t lda = kg ? ops.k_total : k;
  const int64_t out_rows = kg ? groups * spec.m : ops.m_total;
  const bool fp4 = spec.scaling == GemmScaling::Nvfp4;
  // Bytes per row of A and of B (weight-only int8: 16-bit A, int8 B).
  const int64_t a_row_bytes = gemm_row_bytes(spec, spec.a_format, lda), b_row_bytes = gemm_row_bytes(spec, spec.b_format, lda);
  QF_CHECK(!kg || ops.k_total % gemm_k_total_multiple(spec) == 0, "k-grouped: k_total % gemm_k_total_multiple == 0");
  QF_CHECK(kg ? int64_t(ops.a.size()) >= spec.m * a_row_bytes && int64_t(ops.b.size()) >= n * b_row_bytes
              : int64_t(ops.a.size()) >= ops.m_total * a_row_bytes && int64_t(ops.b.size()) >= groups * n * b_row_bytes,
           "operand sizes");
  QF_CHECK(!fp4 || (int64_t(ops.a_amax.size()) >= groups && int64_t(ops.b_amax.size()) >= groups), "nvfp4 amax [G]");
  // Element kk of an operand row starting at byte p (nvfp4: element 2i in the low nibble; 16-bit
  // elements little-endian).
  auto elem = [&](const uint8_t* p, int64_t kk, int bits) -> uint32_t {
    if (fp4) return uint32_t(p[kk / 2] >> (4 * (kk & 1))) & 15;
    if (bits == 16) return uint32_t(p[2 * kk]) | uint32_t(p[2 * kk + 1]) << 8;
    return p[kk];
  };
  const int a_bits = gemm_operand_bits(spec, spec.a_format), b_bits = gemm_operand_bits(spec, spec.b_format);
  auto global_decode = [&](std::span<const float> amax, int g) {
    return fp4 ? double(nvfp4_global_decode_scale(nvfp4_global_encode_scale(amax[size_t(g)]))) : 1.0;
  };
  std::vector<int> owner;
  if (kg) {
    owner.resize(size_t(out_rows));
    for (int64_t r = 0; r < out_rows; ++r) owner[size_t(r)] = int(r / spec.m);
  } else {
    owner = masked ? masked_row_groups(ops.counts, ops.m_max) : row_groups(ops.offsets, ops.m_total);
  }
  const std::vector<double> ta = decode_table(spec, spec.a_format), tb = decode_table(spec, spec.b_format);

  GemmRows out;
  out.rows.assign(rows.begin(), rows.end());
  out.group.resize(rows.size());
  out.value.assign(rows.size() * size_t(n), 0.0);
  out.magnitude.assign(rows.size() * size_t(n), 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    QF_CHECK(rows[i] >= 0 && rows[i] < out_rows, "row ", rows[i], " outside [0, ", out_rows, ")");
    out.group[i] = owner[size_t(rows[i])];
  }

  // mxfp8 / nvfp4 (and K-grouped blockwise): a scale per row of A and of B per 32 / 16 (128) of K.
  const int64_t sk = traits(spec.scaling).scale_k;
  const int64_t row_scales = sk > 0 ? k / sk : 0;  // M-grouped scales per row
  const bool kg_rows = kg && sk > 0;
  const int64_t kg_cols = kg_rows ? (ops.k_total + sk - 1) / sk : 0;
  // K-grouped members: group g's own matrices A_g [m, len] at element m * start and B_g [N, len] at
  // N * start (start, len: its clamped token range), its scale grids [m, ceil(len / sk)] and
  // [N, ...] after those of the groups before; a group the kernel cannot load gives NaN
  // (gemm_k_total_multiple: misaligned start or length; scales past the buffer's worst case;
  // NVFP4: an odd start of A's scale grid).
  struct Member {
    int64_t start = 0, len = 0, prefix = 0, cols = 0;
    bool bad = false;
  };
  auto clamp_tok = [&](int64_t v) { return std::clamp<int64_t>(v, 0, ops.k_total); };  // K-grouped offsets
  std::vector<Member> mem;
  if (members) {
    const int64_t align = gemm_k_total_multiple(spec);
    const int64_t cap = sk > 0 ? (ops.k_total + sk - 1) / sk + groups : 0;
    int64_t prefix = 0;
    for (int64_t g = 0; g < groups; ++g) {
      Member m;
      m.start = clamp_tok(ops.offsets[size_t(g)]);
      m.len = std::max(m.start, clamp_tok(ops.offsets[size_t(g) + 1])) - m.start;
      m.prefix = prefix;
      m.cols = sk > 0 ? (m.len + sk - 1) / sk : 0;
      m.bad = m.start % align != 0 || m.len % align != 0 || (sk > 0 && prefix + m.cols > cap) ||
              (fp4 && (prefix * spec.m) % 2 != 0);
      prefix += m.cols;
      mem.push_back(m);
    }
  }
  // Entry (r, c) of a K-grouped grid of `cols` token blocks whose rows take `pitch` entries per
  // token block (compact: row-major; mn_major: [token blocks, pitch] with pitch = rows rounded up to 4).
  const bool mn_major = spec.scale_layout == ScaleLayout::MnMajor;
  const int64_t a_pitch = mn_major_rows(spec, spec.m), b_pitch = mn_major_rows(spec, n);
  auto grid_at = [&](int64_t pitch, int64_t cols, int64_t r, int64_t c) { return mn_major ? c * pitch + r : r * cols + c; };
  // M-grouped blockwise / MXFP8 mn_major A grids (the grouped quantizer's members): group g's grid
  // [kb or K/32, round_up(rows_g, 4)] after those of the groups before (rows_g: its clamped row range, or
  // a masked slot's m_max); a group whose grid would pass the buffer's m_total + 3 G rows gives NaN.
  struct GroupGrid {
    int64_t first = 0, prefix = 0, pitch = 0;
    bool bad = false;
  };
  std::vector<GroupGrid> grids;
  if (!kg && mn_major) {
    const int64_t cap = mn_major_grouped_rows(ops.m_total, groups);
    auto clamp_row = [&](int64_t v) { return std::clamp<int64_t>(v, 0, ops.m_total); };
    int64_t prefix = 0;
    for (int64_t g = 0; g < groups; ++g) {
      GroupGrid gg;
      gg.first = masked ? g * ops.m_max : clamp_row(ops.offsets[size_t(g)]);
      const int64_t end = masked ? gg.first + ops.m_max : std::max(gg.first, clamp_row(ops.offsets[size_t(g) + 1]));
      gg.prefix = prefix;
      gg.pitch = mn_major_rows(spec, end - gg.first);
      gg.bad = prefix + gg.pitch > cap;
      prefix += gg.pitch;
      grids.push_back(gg);
    }
  }
  auto a_scale = [&](int64_t r, int64_t kk, int g) -> double {
    if (members && sk > 0) {
      const Member& m = mem[size_t(g)];
      return scale_at(spec, ops.a_scale, a_pitch * m.prefix + grid_at(a_pitch, m.cols, r, kk / sk));
    }
    if (kg_rows) return scale_at(spec, ops.a_scale, grid_at(a_pitch, kg_cols, r, kk / sk));
    switch (spec.scaling) {
      case GemmScaling::None:
      case GemmScaling::Channel: return 1.0;
      case GemmScaling::PerTensor: return scale_at(spec, ops.a_scale, g);
      case GemmScaling::RowChannel: return scale_at(spec, ops.a_scale, members ? int64_t(g) * spec.m + r : r);
      case GemmScaling::Block128:
      case GemmScaling::Mx32: {
        const int64_t steps = (k + sk - 1) / sk;  // ceil(K/128), K/32
        if (!mn_major) return scale_at(spec, ops.a_scale, r * steps + kk / sk);
        const GroupGrid& gg = grids[size_t(g)];
        if (gg.bad) return std::numeric_limits<double>::quiet_NaN();
        return scale_at(spec, ops.a_scale, gg.prefix * steps + grid_at(gg.pitch, steps, r - gg.first, kk / sk));
      }
      case GemmScaling::Nvfp4: return scale_at(spec, ops.a_scale, r * row_scales + kk / sk);
    }
    return 0;
  };
  auto b_scale = [&](int g, int64_t col, int64_t kk) -> double {
    if (members && sk > 0) {
      const Member& m = mem[size_t(g)];
      return scale_at(spec, ops.b_scale, b_pitch * m.prefix + grid_at(b_pitch, m.cols, col, kk / sk));
    }
    if (kg_rows) return scale_at(spec, ops.b_scale, grid_at(b_pitch, kg_cols, col, kk / sk));
    switch (spec.scaling) {
      case GemmScaling::None: return 1.0;
      case GemmScaling::Channel: return scale_at(spec, ops.b_scale, int64_t(g) * n + col);
      case GemmScaling::PerTensor: return scale_at(spec, ops.b_scale, g);
      case GemmScaling::RowChannel: return scale_at(spec, ops.b_scale, kg && !members ? col : int64_t(g) * n + col);
      case GemmScaling::Block128: return scale_at(spec, ops.b_scale, (int64_t(g) * nb + col / 128) * kb + kk / 128);
      case GemmScaling::Mx32:  // mn_major: each expert's grid [K/32, N rounded up to 4]
        if (mn_major) return scale_at(spec, ops.b_scale, int64_t(g) * row_scales * b_pitch + grid_at(b_pitch, row_scales, col, kk / sk));
        return scale_at(spec, ops.b_scale, (int64_t(g) * n + col) * row_scales + kk / sk);
      case GemmScaling::Nvfp4: return scale_at(spec, ops.b_scale, (int64_t(g) * n + col) * row_scales + kk / sk);
    }
    return 0;
  };

  // Work items: (row index, column chunk); each computes its dequantized A row once per chunk.
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int64_t items = int64_t(rows.size()) * chunks;
  int nt = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  nt = int(std::min<int64_t>(nt, std::max<int64_t>(1, items)));
  auto work = [&](int tid) {
    std::vector<double> arow(static_cast<size_t>(kg ? lda : k)), brow(static_cast<size_t>(kg ? lda : k));
    for (int64_t it = tid; it < items; it += nt) {
      const size_t i = size_t(it / chunks);
      const int64_t c0 = (it % chunks) * kChunk, c1 = std::min(n, c0 + kChunk);
      const int g = out.group[i];
      if (g < 0) continue;
      // The reduction of this output row: row r of A over K range [k0, k1).
      int64_t r = rows[i], k0 = 0, k1 = k;
      if (kg) {
        r = rows[i] % spec.m;
        k0 = clamp_tok(ops.offsets[size_t(g)]);
        k1 = std::max(k0, clamp_tok(ops.offsets[size_t(g) + 1]));
      }
      if (members) {
        const Member& m = mem[size_t(g)];
        if (m.bad) {
          for (int64_t col = c0; col < c1; ++col)
            out.value[i * size_t(n) + size_t(col)] = out.magnitude[i * size_t(n) + size_t(col)] = std::nan("");
          continue;
        }
        k0 = 0, k1 = m.len;  // positions in the member's own rows
      }
      const int64_t len = k1 - k0;
      const double alpha = (ops.alpha.empty() ? 1.0 : double(ops.alpha[size_t(g)])) * global_decode(ops.a_amax, g) *
                           global_decode(ops.b_amax, g);
      // Members: element m * start + r * len of A (packed e2m1: start and len are even, so rows are whole bytes).
      const uint8_t* ap = members ? &ops.a[size_t(gemm_row_bytes(spec, spec.a_format, spec.m * mem[size_t(g)].start + r * len))]
                                  : &ops.a[size_t(r * a_row_bytes)];
      for (int64_t kk = k0; kk < k1; ++kk) arow[size_t(kk - k0)] = ta[elem(ap, kk, a_bits)] * a_scale(r, kk, g);
      for (int64_t col = c0; col < c1; ++col) {
        const uint8_t* bp = members ? &ops.b[size_t(gemm_row_bytes(spec, spec.b_format, n * mem[size_t(g)].start + col * len))]
                            : kg    ? &ops.b[size_t(col * b_row_bytes)]
                                    : &ops.b[size_t((int64_t(g) * n + col) * b_row_bytes)];
        for (int64_t kk = k0; kk < k1; ++kk) brow[size_t(kk - k0)] = tb[elem(bp, kk, b_bits)] * b_scale(g, col, kk);
        double sum = 0, mag = 0;
        for (int64_t j = 0; j < len; ++j) {
          const double p = arow[size_t(j)] * brow[size_t(j)];
          sum += p;
          mag += std::fabs(p);
        }
        out.value[i * size_t(n) + size_t(col)] = alpha * sum;
        out.magnitude[i * size_t(n) + size_t(col)] = std::fabs(alpha) * mag;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < nt; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  return out;
}

GemmTolerance gemm_tolerance(const GemmSpec& spec) {
  // The dequant route: exact 16-bit copies (but past bf16's range), summed by the none GEMM.
  if (spec.route == GemmRoute::Dequant) return gemm_tolerance(dequant_inner_spec(spec));
  GemmTolerance t;
  // bf16: RNE of the fp32 result, half an ulp = 2^-9 relative, plus the fp32 epilogue
  // multiplies; fp32: a few fp32 roundings (scale products, epilogue multiplies, promotion fma).
  t.out_rel = spec.out_dtype == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -20);
  // Tensor-core accumulation of fp8 products keeps fewer bits than fp32 (about 13-14 below the
  // largest addend); with promotion the error stays inside one promoted step: four k32 MMAs per
  // k-block of 128 (each adding into the running partial, whose size is at most the step's
  // sum |ab|: 4 x 2^-13), one per step of 32 with MX scales. Measured worst |err| / sum|ab| on H100
  // (2026-11-25): 2.9e-4 for 128 (the grouped quantizer's blockwise and per-tensor copies of real
  // data in a 96-token wgrad member, GpuQuantizeToGemm; 2^-12 was too tight), 1.1e-4 for 32.
  t.acc_rel = spec.fast_accum ? std::ldexp(1.0, -9) : std::ldexp(1.0, traits(spec.scaling).promote_k == 32 ? -12 : -11);
  // nvfp4, bf16 / fp16 operands (B int8 with channel scaling): exact fp16 / bf16 products
  // accumulated in fp32 over all of K.
  if (traits(spec.scaling).fp32_sums) t.acc_rel = std::ldexp(1.0, -18);
  // int8: exact s32 sums. Unpromoted: one conversion to fp32 (2^-24 of |sum| where |sum| > 2^24)
  // and the epilogue's three fp32 multiplies (scale products, then the factors: 2^-24 of |value|
  // each), at most 4 * 2^-24 of the magnitude. Promoted (per k-block of 128): a conversion of each
  // k-block's sum (exact: |sum| <= 2^21) times its rounded scale product, added by one fp32 fma per
  // k-block into the running total (each of the two roundings at most 2^-24 of the magnitude), plus
  // the epilogue's: (2 * ceil(K / 128) + 4) * 2^-24; K-grouped (K per group unknown here): 2^-14,
  // which covers groups of up to 510 k-blocks (65,280 tokens).
  if (traits(spec.a_format).is_int) {
    const double steps = !gemm_promotes(spec) ? 4.0 : k_grouped(spec.layout) ? std::ldexp(1.0, 10) : 2.0 * double((spec.k + 127) / 128) + 4.0;
    t.acc_rel = steps * std::ldexp(1.0, -24);
  }
  return t;
}

uint32_t exact_output(const GemmSpec& spec, double value, float previous) {
  float v = float(value);
  if (spec.accumulate) v = float(double(previous) + value);
  if (spec.out_dtype == DType::BF16) return f32_to_bf16(v);
  return f32_bits(v);
}

}  // namespace qf::ref
