// Quantize -> GEMM with no reshuffling (CPU): the shipped recipes' grouped quantize outputs, as
// the CPU reference produces them (bit-identical to the kernels: gpu_quantize_test.cpp), go into
// the GEMM reference (bit-identical bounds for the GEMM kernels: gpu_gemm_test.cpp) unchanged, and
// the result is the float64 product of the unquantized inputs within the formats' quantization
// error. fprop: A = the grouped input's rowwise copy, B = each expert weight's rowwise copy;
// dgrad: A = the grad's rowwise copy, B = each weight's transposed columnwise copy. A wrong
// layout (nibble order, a swapped expert) must fail the same check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "qforge/numerics.cuh"
#include "reference/executor.h"
#include "reference/gemm.h"
#include "tests/unit/quantized_operands.h"

namespace {

using namespace qf;
using qf::testing::amax_of;
using qf::testing::output;
using qf::testing::quantize_with;
using qf::testing::random_bf16;
using qf::testing::rel_error;

struct Case {
  const char* recipe;
  GemmScaling scaling;
  bool dgrad;
  double max_rel;  // relative Frobenius error of the quantized product (the measured one + margin)
  ElemFormat format = ElemFormat::E4M3;  // both operands' (nvfp4: e2m1 whatever this says)
  Usage usage = Usage::Training;         // the plans' usage (inference: the rowwise copies only)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.recipe << (c.dgrad ? " dgrad" : " fprop"); }

std::vector<ref::Output> quantize(const std::string& recipe, const std::string& role, const ref::HostTensor& x,
                                  std::span<const int64_t> splits, Usage usage) {
  return quantize_with(qf::testing::shipped_recipe(recipe), role, x, splits, usage);
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
  const auto qa = quantize(c.recipe, c.dgrad ? "grouped_linear:grad_output" : "grouped_linear:input", x, rows, c.usage);
  const std::vector<int64_t> experts = {n_out, n_out};
  const auto qw = quantize(c.recipe, "grouped_linear:weight", w, experts, c.usage);
  const std::string bdir = c.dgrad ? "columnwise" : "rowwise";

  GemmSpec spec;
  spec.scaling = c.scaling;
  spec.a_format = spec.b_format = fp4 ? ElemFormat::E2M1 : c.format;
  // Weight-only int8: the input's / grad's bf16 identity copy x the weights' int8 per-channel copy.
  if (c.scaling == GemmScaling::Channel) spec.a_format = ElemFormat::Identity, spec.b_format = ElemFormat::Int8;
  spec.n = cols, spec.k = red, spec.out_dtype = DType::FP32;
  // The layout the recipe's own fprop / dgrad entries read (blockwise: its 1x128 rowwise grids').
  spec.scale_layout = qf::testing::recipe_gemm_scale_layout(qf::testing::shipped_recipe(c.recipe), spec.scaling, spec.layout);
  ref::GemmOperands ops;
  ops.a = output(qa, "rowwise_data").bytes;
  if (gemm_a_scaled(spec)) ops.a_scale = output(qa, "rowwise_scale_inv").bytes;
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
                      Case{"mxfp8_hopper", GemmScaling::Mx32, false, 0.1}, Case{"mxfp8_hopper", GemmScaling::Mx32, true, 0.1},
                      Case{"float8_block_scaling", GemmScaling::Block128, false, 0.1},
                      Case{"float8_block_scaling", GemmScaling::Block128, true, 0.1},
                      // 1x128 grids mn_major, one per expert (member), read so by its fprop / dgrad entries
                      Case{"good/float8_block_scaling_mn_major", GemmScaling::Block128, false, 0.1},
                      Case{"good/float8_block_scaling_mn_major", GemmScaling::Block128, true, 0.1},
                      // the compact e8m0 grids (the shipped recipe's are mn_major: A per expert group, B per expert)
                      Case{"good/mxfp8_hopper_compact", GemmScaling::Mx32, false, 0.1},
                      Case{"good/mxfp8_hopper_compact", GemmScaling::Mx32, true, 0.1},
                      // fp8 per token x per channel (torchao's rowwise): the weights' columnwise copy per input channel
                      Case{"fp8_rowwise", GemmScaling::RowChannel, false, 0.05}, Case{"fp8_rowwise", GemmScaling::RowChannel, true, 0.05},
                      // W8A8: int8 per token (input) x int8 per output channel (weight), fprop only (inference)
                      Case{"w8a8_int8_inference", GemmScaling::RowChannel, false, 0.02, ElemFormat::Int8, Usage::Inference},
                      // weight-only int8 training (stochastic rounding): bf16 x int8 per output / input channel
                      Case{"int8_weight_sr", GemmScaling::Channel, false, 0.03},
                      Case{"int8_weight_sr", GemmScaling::Channel, true, 0.03}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string name = std::string(i.param.recipe) + (i.param.dgrad ? "_dgrad" : "_fprop");
      std::replace(name.begin(), name.end(), '/', '_');
      return name;
    });

}  // namespace

namespace {

// wgrad (K-grouped): dW[g] = dY_g^T X_g over each group's tokens. X [T, K_in] and dY [T, N_out] are
// each quantized as one tensor; their transposed columnwise copies (dY^T [N_out, T] as A, X^T
// [K_in, T] as B) and those copies' scale grids (per row, per 128, 32 or 16 tokens; NVFP4: and
// their amax) go into the K-grouped GEMM unchanged. Groups start and end inside scale blocks; with
// NVFP4's random Hadamard transform (16 tokens at a time, the same signs on both copies, so it
// cancels in the product) they start and end on multiples of 16.
// Members: X and dY are quantized as grouped tensors (one member per group, the way an MoE layer
// quantizes each expert's tokens); the per-member transposed copies [N_out, M_g] / [K_in, M_g],
// their own scale grids (partial blocks at each member's end) and per-member amax go into the
// k_grouped_members GEMM unchanged. Members are multiples of 16 tokens (32 for NVFP4).
struct WgradCase {
  const char* recipe;  // shipped
  GemmScaling scaling;
  double max_rel;  // relative Frobenius error of the quantized product (the measured one + margin)
  bool members = false;
};
void PrintTo(const WgradCase& c, std::ostream* os) { *os << c.recipe << (c.members ? " members" : ""); }

class QuantizeToWgrad : public ::testing::TestWithParam<WgradCase> {};

TEST_P(QuantizeToWgrad, TransposedColumnwiseCopiesNeedNoReshuffling) {
  const WgradCase& c = GetParam();
  const Recipe r = qf::testing::shipped_recipe(c.recipe);
  const bool fp4 = c.scaling == GemmScaling::Nvfp4;
  const int64_t t = 384, k_in = 256, n_out = 192;
  const std::vector<int64_t> offsets = c.members ? (fp4 ? std::vector<int64_t>{0, 128, 128, 320, 384}
                                                         : std::vector<int64_t>{0, 96, 96, 304, 384})
                                      : fp4 ? std::vector<int64_t>{0, 96, 96, 304, 384}
                                            : std::vector<int64_t>{0, 100, 100, 300, 384};
  const ref::HostTensor x = random_bf16(t, k_in, 3), dy = random_bf16(t, n_out, 4);
  std::vector<int64_t> splits = {t};
  if (c.members) {
    splits.clear();
    for (size_t g = 0; g + 1 < offsets.size(); ++g) splits.push_back(offsets[g + 1] - offsets[g]);
  }
  const auto qx = quantize_with(r, "linear:input", x, splits);
  const auto qdy = quantize_with(r, "linear:grad_output", dy, splits);

  GemmSpec spec;
  spec.scaling = c.scaling;
  spec.a_format = spec.b_format = fp4 ? ElemFormat::E2M1 : ElemFormat::E4M3;
  if (c.scaling == GemmScaling::PerTensor) spec.a_format = ElemFormat::E5M2;  // current_scaling's grad
  if (c.scaling == GemmScaling::None) spec.a_format = spec.b_format = ElemFormat::Identity;  // bf16 copies
  spec.layout = c.members ? GemmLayout::KGroupedMembers : GemmLayout::KGrouped;
  spec.m = n_out, spec.n = k_in, spec.k = 0, spec.out_dtype = DType::FP32;
  // Blockwise: mn_major, as float8_block_scaling's 128x1 columnwise copies are written.
  spec.scale_layout = qf::testing::recipe_gemm_scale_layout(r, spec.scaling, spec.layout);
  ref::GemmOperands ops;
  ops.a = output(qdy, "columnwise_data").bytes;
  ops.b = output(qx, "columnwise_data").bytes;
  if (gemm_a_scaled(spec)) ops.a_scale = output(qdy, "columnwise_scale_inv").bytes;
  if (gemm_b_scaled(spec)) ops.b_scale = output(qx, "columnwise_scale_inv").bytes;
  ops.offsets = offsets;
  ops.k_total = t;
  // NVFP4: each copy's (post-RHT) columnwise amax, the same for every group (members: each
  // member's own, in member order).
  const std::vector<float> a_amax1 = amax_of(qdy, "columnwise"), b_amax1 = amax_of(qx, "columnwise");
  std::vector<float> a_amax(4, a_amax1.empty() ? 0.0f : a_amax1[0]), b_amax(4, b_amax1.empty() ? 0.0f : b_amax1[0]);
  if (fp4) {
    ASSERT_EQ(a_amax1.size(), c.members ? 4u : 1u);
    ASSERT_EQ(b_amax1.size(), c.members ? 4u : 1u);
    if (c.members) a_amax = a_amax1, b_amax = b_amax1;
    ops.a_amax = a_amax, ops.b_amax = b_amax;
  }
  const GemmScaleElems se = gemm_scale_elems(spec, 0, 4, t);
  const int64_t sb = traits(c.scaling).scale_bytes;
  if (c.members) {  // the members' exact grids; the GEMM's size is the worst case over splits
    ASSERT_LE(int64_t(ops.a_scale.size()), se.a * sb);
    ASSERT_LE(int64_t(ops.b_scale.size()), se.b * sb);
  } else {
    ASSERT_EQ(int64_t(ops.a_scale.size()), se.a * sb);
    ASSERT_EQ(int64_t(ops.b_scale.size()), se.b * sb);
  }
  ASSERT_EQ(int64_t(ops.a.size()), gemm_row_bytes(spec, spec.a_format, n_out * t));
  std::vector<int64_t> all(size_t(4 * n_out));
  for (size_t i = 0; i < all.size(); ++i) all[i] = int64_t(i);

  auto want_for = [&](std::span<const int64_t> offs) {
    std::vector<double> want(all.size() * size_t(k_in), 0.0);
    for (int64_t g = 0; g < 4; ++g)
      for (int64_t o = 0; o < n_out; ++o)
        for (int64_t i = 0; i < k_in; ++i) {
          double s = 0;
          for (int64_t tok = offs[size_t(g)]; tok < offs[size_t(g) + 1]; ++tok) s += double(dy.at(tok, o)) * double(x.at(tok, i));
          want[size_t((g * n_out + o) * k_in + i)] = s;
        }
    return want;
  };
  const std::vector<double> want = want_for(offsets);
  const std::vector<double> got = ref::gemm_reference(spec, ops, all).value;
  const double err = rel_error(got, want);
  // Control: the same outputs against another token split.
  const std::vector<int64_t> other = {0, 224, 224, 256, 384};
  const double err_other = rel_error(got, want_for(other));
  std::printf("[ measure  ] %s wgrad: relative Frobenius error %.4f (against another token split: %.3f)\n", c.recipe, err,
              err_other);
  EXPECT_LT(err, c.max_rel);
  EXPECT_GT(err_other, 0.6);
}

INSTANTIATE_TEST_SUITE_P(
    Shipped, QuantizeToWgrad,
    ::testing::Values(WgradCase{"float8_block_scaling", GemmScaling::Block128, 0.1},
                      WgradCase{"mxfp8_hopper", GemmScaling::Mx32, 0.1},
                      WgradCase{"nvfp4", GemmScaling::Nvfp4, 0.25},
                      WgradCase{"float8_block_scaling", GemmScaling::Block128, 0.1, true},
                      WgradCase{"mxfp8_hopper", GemmScaling::Mx32, 0.1, true},
                      WgradCase{"good/mxfp8_hopper_compact", GemmScaling::Mx32, 0.1},
                      WgradCase{"good/mxfp8_hopper_compact", GemmScaling::Mx32, 0.1, true},
                      WgradCase{"nvfp4", GemmScaling::Nvfp4, 0.25, true},
                      WgradCase{"current_scaling", GemmScaling::PerTensor, 0.1, true},
                      WgradCase{"fp8_rowwise", GemmScaling::RowChannel, 0.05},
                      WgradCase{"fp8_rowwise", GemmScaling::RowChannel, 0.05, true},
                      // the bf16 identity copies (int8_weight_sr's activations and gradients): exact, so the
                      // float64 product up to its own rounding
                      WgradCase{"int8_weight_sr", GemmScaling::None, 1e-6},
                      WgradCase{"int8_weight_sr", GemmScaling::None, 1e-6, true}),
    [](const ::testing::TestParamInfo<WgradCase>& i) {
      std::string name = std::string(i.param.recipe) + (i.param.members ? "_members" : "");
      std::replace(name.begin(), name.end(), '/', '_');
      return name;
    });

}  // namespace
