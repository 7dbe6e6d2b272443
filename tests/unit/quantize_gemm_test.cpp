// Quantize -> GEMM with no reshuffling (CPU): the shipped recipes' grouped quantize outputs, as
// the CPU reference produces them (bit-identical to the kernels: gpu_quantize_test.cpp), go into
// the GEMM reference (bit-identical bounds for the GEMM kernels: gpu_gemm_test.cpp) unchanged, and
// the result is the float64 product of the unquantized inputs within the formats' quantization
// error. fprop: A = the grouped input's rowwise copy, B = each expert weight's rowwise copy;
// dgrad: A = the grad's rowwise copy, B = each weight's transposed columnwise copy. A wrong
// layout (nibble order, a swapped expert) must fail the same check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "qforge/numerics.cuh"
#include "reference/executor.h"
#include "reference/gemm.h"

namespace {

using namespace qf;

struct Case {
  const char* recipe;
  GemmScaling scaling;
  bool dgrad;
  double max_rel;  // relative Frobenius error of the quantized product (the measured one + margin)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.recipe << (c.dgrad ? " dgrad" : " fprop"); }

// Random normal bf16 [rows, cols], a different scale per row.
ref::HostTensor random_bf16(int64_t rows, int64_t cols, uint32_t seed) {
  ref::HostTensor t;
  t.dtype = DType::BF16;
  t.shape = {rows, cols};
  t.bytes.resize(size_t(rows * cols * 2));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> row_scale(0.25f, 4.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = row_scale(rng);
    for (int64_t c = 0; c < cols; ++c) {
      const u16 h = f32_to_bf16(normal(rng) * s);
      std::memcpy(&t.bytes[size_t((r * cols + c) * 2)], &h, 2);
    }
  }
  return t;
}

const ref::Output& output(const std::vector<ref::Output>& outs, const std::string& name) {
  for (const auto& o : outs)
    if (o.desc.name == name) return o;
  throw std::runtime_error("no output buffer " + name);
}
// The per-tensor amax buffer of the rowwise (or columnwise) stream, when the plan has one.
std::vector<float> amax_of(const std::vector<ref::Output>& outs, const std::string& dir) {
  for (const auto& o : outs) {
    if (o.desc.name != dir + "_amax" && o.desc.name != "amax") continue;
    std::vector<float> v(o.bytes.size() / 4);
    std::memcpy(v.data(), o.bytes.data(), o.bytes.size());
    return v;
  }
  return {};
}

std::vector<ref::Output> quantize(const std::string& recipe, const std::string& role, const ref::HostTensor& x,
                                  std::span<const int64_t> splits) {
  const Recipe r = load_recipe(std::filesystem::path(QF_SOURCE_DIR) / "recipes" / (recipe + ".json"));
  const Plan plan = compile_plan(r, PlanRequest{role, DType::BF16, Usage::Training, true});
  ref::QuantizeParams params;
  params.seed = 11, params.offset = 0;
  return ref::quantize_grouped(plan, x, splits, params);
}

double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) e += (got[i] - want[i]) * (got[i] - want[i]), w += want[i] * want[i];
  return std::sqrt(e / w);
}

class QuantizeToGemm : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizeToGemm, OperandsNeedNoReshuffling) {
  const Case& c = GetParam();
  const bool fp4 = c.scaling == GemmScaling::Nvfp4;
  // Two experts of 128 and 256 tokens; fprop [M, K=512] x [N=256, K]^T; dgrad [M, N] x [N, K].
  const std::vector<int64_t> rows = {128, 256};
  const int64_t m = 384, n_out = 256, k_in = 512;
  const int64_t red = c.dgrad ? n_out : k_in, cols = c.dgrad ? k_in : n_out;  // GEMM K and N
  const ref::HostTensor x = random_bf16(m, red, 1);         // input (fprop) or grad (dgrad)
  const ref::HostTensor w = random_bf16(2 * n_out, k_in, 2);  // two experts' [N, K] weights
  const auto qa = quantize(c.recipe, c.dgrad ? "grouped_linear:grad_output" : "grouped_linear:input", x, rows);
  const std::vector<int64_t> experts = {n_out, n_out};
  const auto qw = quantize(c.recipe, "grouped_linear:weight", w, experts);
  const std::string bdir = c.dgrad ? "columnwise" : "rowwise";

  GemmSpec spec;
  spec.scaling = c.scaling;
  spec.a_format = spec.b_format = fp4 ? ElemFormat::E2M1 : ElemFormat::E4M3;
  spec.n = cols, spec.k = red, spec.out_dtype = DType::FP32;
  ref::GemmOperands ops;
  ops.a = output(qa, "rowwise_data").bytes;
  ops.a_scale = output(qa, "rowwise_scale_inv").bytes;
  ops.b = output(qw, bdir + "_data").bytes;
  ops.b_scale = output(qw, bdir + "_scale_inv").bytes;
  const std::vector<int64_t> offsets = {0, 128, 384};
  ops.offsets = offsets;
  ops.m_total = m;
  const std::vector<float> a_amax = amax_of(qa, "rowwise"), b_amax = amax_of(qw, bdir);
  if (fp4) {
    ASSERT_EQ(a_amax.size(), 2u);
    ASSERT_EQ(b_amax.size(), 2u);
    ops.a_amax = a_amax, ops.b_amax = b_amax;
  }
  std::vector<int64_t> all(static_cast<size_t>(m));
  for (int64_t r = 0; r < m; ++r) all[size_t(r)] = r;

  // The float64 product of the unquantized operands: row r of group g times expert g.
  std::vector<double> want(size_t(m * cols));
  for (int64_t r = 0; r < m; ++r) {
    const int64_t g = r < 128 ? 0 : 1;
    for (int64_t col = 0; col < cols; ++col) {
      double s = 0;
      for (int64_t kk = 0; kk < red; ++kk) {
        // fprop: W_g[col, kk]; dgrad: (W_g^T)[col, kk] = W_g[kk, col].
        const double wv = c.dgrad ? w.at(g * n_out + kk, col) : w.at(g * n_out + col, kk);
        s += double(x.at(r, kk)) * wv;
      }
      want[size_t(r * cols + col)] = s;
    }
  }
  const double err = rel_error(ref::gemm_reference(spec, ops, all).value, want);
  std::printf("[ measure  ] %s %s: relative Frobenius error of the quantized product %.4f\n", c.recipe,
              c.dgrad ? "dgrad" : "fprop", err);
  EXPECT_LT(err, c.max_rel);

  // Controls: the same check fails for a swapped expert, and (NVFP4) for the other nibble order.
  constexpr double kWrong = 0.6;  // above every case's max_rel
  const std::vector<int64_t> swapped = {0, 256, 384};  // rows 0..255 to expert 0: wrong for 128..255
  ops.offsets = swapped;
  const double err_swapped = rel_error(ref::gemm_reference(spec, ops, all).value, want);
  EXPECT_GT(err_swapped, kWrong);
  ops.offsets = offsets;
  double err_flipped = 0;
  if (fp4) {
    std::vector<uint8_t> flipped(ops.a.begin(), ops.a.end());
    for (auto& byte : flipped) byte = uint8_t((byte >> 4) | (byte << 4));
    ops.a = flipped;
    err_flipped = rel_error(ref::gemm_reference(spec, ops, all).value, want);
    EXPECT_GT(err_flipped, kWrong);
  }
  std::printf("[ measure  ] controls: swapped expert %.3f, nibbles flipped %.3f\n", err_swapped, err_flipped);
}

INSTANTIATE_TEST_SUITE_P(
    Shipped, QuantizeToGemm,
    ::testing::Values(Case{"nvfp4", GemmScaling::Nvfp4, false, 0.25}, Case{"nvfp4", GemmScaling::Nvfp4, true, 0.25},
                      Case{"mxfp8", GemmScaling::Mx32, false, 0.1},
                      Case{"float8_block_scaling", GemmScaling::Block128, false, 0.1},
                      Case{"float8_block_scaling", GemmScaling::Block128, true, 0.1}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return std::string(i.param.recipe) + (i.param.dgrad ? "_dgrad" : "_fprop");
    });

}  // namespace
