// GPU: quantize kernels -> GEMM kernels with no reshuffling (skipped without a GPU). An MoE
// layer's X [T, K_in] and dY [T, N_out] are quantized per expert by the grouped quantize kernels
// (one member per expert, the member sizes on the device), and the wgrad kernel on the members'
// transposed copies (k_grouped_members) reads those buffers as they are, with the same device
// offsets array: dW[g] = dY_g^T X_g. The result must match the CPU pipeline (reference quantize ->
// float64 GEMM reference) within the GEMM's error bound (the quantize kernels are bit-exact, so the
// GEMM sees the reference's bytes), and the float64 dY^T X of the unquantized inputs within the
// formats' error (as quantize_gemm_test.cpp checks on the CPU). The same for the blockwise and MXFP8
// fprop and dgrad on the grouped copies' mn_major grids (GpuQuantizeToMGrouped).
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "compiler/buffers.h"
#include "reference/gemm.h"
#include "runtime/gemm.h"
#include "runtime/gpu_test_util.h"
#include "runtime/quantizer.h"
#include "tests/unit/quantized_operands.h"

namespace {

using namespace qf;
using qf::rt::DeviceBuffer;

struct Case {
  const char* recipe;
  GemmScaling scaling;
  double max_rel;  // relative Frobenius error against the unquantized product (CPU test's bound)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.recipe; }

// One tensor quantized per member on the GPU: every output buffer, by name.
struct GpuQuantized {
  std::map<std::string, DeviceBuffer> buffers;
  const DeviceBuffer& at(const std::string& name) const {
    auto it = buffers.find(name);
    if (it == buffers.end()) throw std::runtime_error("no output buffer " + name);
    return it->second;
  }
};

GpuQuantized quantize_on_gpu(const Recipe& r, const std::string& role, const ref::HostTensor& x,
                             std::span<const int64_t> splits, const DeviceBuffer& member_rows, rt::Stream& stream) {
  rt::Quantizer q(qf::testing::grouped_plan(r, role));
  const Shape2D shape = x.shape;
  GpuQuantized out;
  DeviceBuffer dx(x.bytes.size());
  dx.upload(x.bytes.data(), x.bytes.size());
  rt::QuantizeCall call;
  call.input = rt::TensorView{dx.address(), int64_t(dx.size()), DType::BF16, {shape.m, shape.k}};
  call.shape = shape;
  call.seed = 11, call.offset = 0;  // as qf::testing::quantize_with
  // Grouped buffers are validated against the worst case over any split of the rows.
  for (const auto& b : q.grouped_capacity(shape, int(splits.size()))) {
    const int64_t bytes = std::max<int64_t>(b.bytes, 16);
    auto [it, _] = out.buffers.emplace(b.name, rt::testing::poisoned_buffer(size_t(bytes)));
    call.buffers[b.name] = rt::testing::view_of(it->second);
  }
  const int64_t ws = q.workspace_bytes(shape, int(splits.size()));
  DeviceBuffer dws(size_t(std::max<int64_t>(ws, 16)));
  if (ws > 0) call.workspace = rt::testing::view_of(dws);
  call.member_rows = member_rows.address();
  call.num_members = int(splits.size());
  q.quantize(call, stream.get());
  stream.synchronize();
  return out;
}

// The GPU GEMM's fp32 output against the CPU pipeline's rows (reference quantize -> float64 GEMM
// reference), within the GEMM's error bound.
void expect_within_gemm_bound(const GemmSpec& spec, const std::vector<float>& got, const ref::GemmRows& want,
                              const std::string& label) {
  const ref::GemmTolerance tol = ref::gemm_tolerance(spec);
  int64_t bad = 0;
  double worst_acc = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want.value[i]);
    if (want.magnitude[i] > 0)
      worst_acc = std::max(worst_acc, std::max(0.0, err - tol.out_rel * std::fabs(want.value[i])) / want.magnitude[i]);
    if (!(err <= tol.out_rel * std::fabs(want.value[i]) + tol.acc_rel * want.magnitude[i]) && bad++ < 1)
      first << "element " << i << ": got " << got[i] << ", the CPU pipeline " << want.value[i] << ", sum |ab| "
            << want.magnitude[i];
  }
  std::printf("[ measure  ] %s: worst accumulation error / sum|ab| %.3g (acc_rel %.3g)\n", label.c_str(), worst_acc, tol.acc_rel);
  EXPECT_EQ(bad, 0) << bad << " elements outside the GEMM's bound; first: " << first.str();
}

// The CPU reference's quantize outputs of A and B (their `dir` copies, which must outlive the
// result) as GEMM operands.
ref::GemmOperands operands_of(const GemmSpec& spec, const std::vector<ref::Output>& qa, const std::vector<ref::Output>& qb,
                              const std::string& dir) {
  ref::GemmOperands ops;
  ops.a = qf::testing::output(qa, dir + "_data").bytes;
  ops.b = qf::testing::output(qb, dir + "_data").bytes;
  if (gemm_a_scaled(spec)) ops.a_scale = qf::testing::output(qa, dir + "_scale_inv").bytes;
  if (gemm_b_scaled(spec)) ops.b_scale = qf::testing::output(qb, dir + "_scale_inv").bytes;
  return ops;
}

// Runs the GEMM and returns its fp32 output D (the whole buffer dd).
std::vector<float> run_gemm(const rt::Gemm& gemm, const rt::GemmCall& call, const DeviceBuffer& dd, rt::Stream& stream) {
  gemm.run(call, stream.get());
  stream.synchronize();
  return dd.download_as<float>();
}

class GpuQuantizeToGemm : public ::testing::TestWithParam<Case> {};

TEST_P(GpuQuantizeToGemm, MembersWgradReadsGroupedQuantizeOutputs) {
  QF_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const Recipe r = qf::testing::shipped_recipe(c.recipe);
  const bool fp4 = c.scaling == GemmScaling::Nvfp4;
  const int64_t t = 384, k_in = 256, n_out = 192;
  // Members (experts' tokens): an empty one, partial scale blocks at the ends of the others.
  const std::vector<int64_t> splits = fp4 ? std::vector<int64_t>{128, 0, 192, 64} : std::vector<int64_t>{96, 0, 208, 80};
  std::vector<int64_t> offsets{0};
  for (int64_t m : splits) offsets.push_back(offsets.back() + m);
  const ref::HostTensor x = qf::testing::random_bf16(t, k_in, 3), dy = qf::testing::random_bf16(t, n_out, 4);

  rt::Stream stream;
  DeviceBuffer doff(offsets.size() * 8);
  doff.upload(offsets.data(), offsets.size() * 8);
  const GpuQuantized qx = quantize_on_gpu(r, "linear:input", x, splits, doff, stream);
  const GpuQuantized qdy = quantize_on_gpu(r, "linear:grad_output", dy, splits, doff, stream);

  GemmSpec spec;
  spec.scaling = c.scaling;
  spec.a_format = spec.b_format = fp4 ? ElemFormat::E2M1 : ElemFormat::E4M3;
  if (c.scaling == GemmScaling::PerTensor) spec.a_format = ElemFormat::E5M2;  // current_scaling's grad
  if (c.scaling == GemmScaling::None) spec.a_format = spec.b_format = ElemFormat::Identity;  // bf16 copies
  spec.layout = GemmLayout::KGroupedMembers;
  spec.m = n_out, spec.n = k_in, spec.out_dtype = DType::FP32;
  spec.scale_layout = qf::testing::recipe_gemm_scale_layout(r, spec.scaling, spec.layout);
  rt::Gemm gemm(spec);
  const int64_t groups = int64_t(splits.size());
  DeviceBuffer dd = rt::testing::poisoned_buffer(size_t(groups * n_out * k_in * 4));
  DeviceBuffer dws(size_t(gemm.workspace_bytes()));
  rt::GemmCall call;
  call.a = rt::testing::view_of(qdy.at("columnwise_data"));
  call.b = rt::testing::view_of(qx.at("columnwise_data"));
  if (gemm_a_scaled(spec)) call.a_scale = rt::testing::view_of(qdy.at("columnwise_scale_inv"));
  if (gemm_b_scaled(spec)) call.b_scale = rt::testing::view_of(qx.at("columnwise_scale_inv"));
  if (fp4) {  // each member's (post-RHT) columnwise amax
    call.a_amax = rt::testing::view_of(qdy.at("columnwise_amax"));
    call.b_amax = rt::testing::view_of(qx.at("columnwise_amax"));
  }
  call.d = rt::testing::view_of(dd);
  call.group_offsets = rt::testing::view_of(doff);  // the quantizer's member_rows, as they are
  call.k_total = t;
  call.num_groups = int(groups);
  call.workspace = rt::testing::view_of(dws);
  const std::vector<float> got = run_gemm(gemm, call, dd, stream);

  // The CPU pipeline: the reference quantize's bytes into the float64 GEMM reference.
  const auto rx = qf::testing::quantize_with(r, "linear:input", x, splits);
  const auto rdy = qf::testing::quantize_with(r, "linear:grad_output", dy, splits);
  ref::GemmOperands ops = operands_of(spec, rdy, rx, "columnwise");
  ops.offsets = offsets;
  ops.k_total = t;
  const std::vector<float> a_amax = qf::testing::amax_of(rdy, "columnwise"), b_amax = qf::testing::amax_of(rx, "columnwise");
  if (fp4) ops.a_amax = a_amax, ops.b_amax = b_amax;
  std::vector<int64_t> rows(size_t(groups * n_out));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = int64_t(i);
  expect_within_gemm_bound(spec, got, ref::gemm_reference(spec, ops, rows), c.recipe);
  std::vector<double> gotd(got.begin(), got.end()), exact(got.size());

  // Against the float64 product of the unquantized inputs, member by member.
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t o = 0; o < n_out; ++o)
      for (int64_t i = 0; i < k_in; ++i) {
        double s = 0;
        for (int64_t tok = offsets[size_t(g)]; tok < offsets[size_t(g) + 1]; ++tok) s += double(dy.at(tok, o)) * double(x.at(tok, i));
        exact[size_t((g * n_out + o) * k_in + i)] = s;
      }
  const double err = qf::testing::rel_error(gotd, exact);
  std::printf("[ measure  ] %s: GPU quantize -> members wgrad: relative Frobenius error %.4f\n", c.recipe, err);
  EXPECT_LT(err, c.max_rel);
}

// fprop / dgrad: the grouped quantizer's rowwise copies of X or dY (one member per expert, each
// member's 1x128 or 1x32 grid mn_major, padded to 4 rows on its own:
// tests/recipes/good/float8_block_scaling_mn_major.json, the shipped mxfp8_hopper.json) and the
// experts' weights (fprop: their rowwise copies; dgrad: their transposed columnwise copies; blockwise
// 128x128, MXFP8 one mn_major grid per expert) go into the M-grouped GEMM, which reads them with
// the same device offsets. Members of 209 and 85 rows pad their grids; one is empty.
void expect_grouped_mn_major_copies_feed_m_grouped_gemm(const char* recipe, GemmScaling scaling, bool dgrad) {
  const Recipe r = qf::testing::shipped_recipe(recipe);
  const std::vector<int64_t> splits = {96, 0, 209, 85};
  const int64_t t = 390, k_in = 384, n_out = 256, groups = int64_t(splits.size());
  const int64_t red = dgrad ? n_out : k_in, cols = dgrad ? k_in : n_out;  // the GEMM's K and N
  std::vector<int64_t> offsets{0}, w_offsets{0};
  for (int64_t m : splits) offsets.push_back(offsets.back() + m), w_offsets.push_back(w_offsets.back() + n_out);
  const std::vector<int64_t> experts(size_t(groups), n_out);
  // X [t, k_in] (fprop) or dY [t, n_out] (dgrad); the experts' weights W_g [n_out, k_in].
  const ref::HostTensor x = qf::testing::random_bf16(t, red, dgrad ? 7 : 5), w = qf::testing::random_bf16(groups * n_out, k_in, 6);
  const char* role = dgrad ? "linear:grad_output" : "linear:input";
  const std::string bdir = dgrad ? "columnwise" : "rowwise";

  rt::Stream stream;
  DeviceBuffer doff(offsets.size() * 8), dwoff(w_offsets.size() * 8);
  doff.upload(offsets.data(), offsets.size() * 8);
  dwoff.upload(w_offsets.data(), w_offsets.size() * 8);
  const GpuQuantized qx = quantize_on_gpu(r, role, x, splits, doff, stream);
  const GpuQuantized qw = quantize_on_gpu(r, "linear:weight", w, experts, dwoff, stream);

  GemmSpec spec;
  spec.scaling = scaling;
  spec.n = cols, spec.k = red, spec.out_dtype = DType::FP32;
  spec.scale_layout = qf::testing::recipe_gemm_scale_layout(r, spec.scaling, spec.layout);
  ASSERT_EQ(spec.scale_layout, ScaleLayout::MnMajor) << "the recipe's fprop / dgrad entries";
  rt::Gemm gemm(spec);
  DeviceBuffer dd = rt::testing::poisoned_buffer(size_t(t * cols * 4));
  rt::GemmCall call;
  call.a = rt::testing::view_of(qx.at("rowwise_data"));
  call.a_scale = rt::testing::view_of(qx.at("rowwise_scale_inv"));
  call.b = rt::testing::view_of(qw.at(bdir + "_data"));
  call.b_scale = rt::testing::view_of(qw.at(bdir + "_scale_inv"));
  call.d = rt::testing::view_of(dd);
  call.group_offsets = rt::testing::view_of(doff);  // the quantizer's member_rows, as they are
  call.m_total = t;
  call.num_groups = int(groups);
  const std::vector<float> got = run_gemm(gemm, call, dd, stream);

  const auto rx = qf::testing::quantize_with(r, role, x, splits);
  const auto rw = qf::testing::quantize_with(r, "linear:weight", w, experts);
  ref::GemmOperands ops;
  ops.a = qf::testing::output(rx, "rowwise_data").bytes;
  ops.a_scale = qf::testing::output(rx, "rowwise_scale_inv").bytes;
  ops.b = qf::testing::output(rw, bdir + "_data").bytes;
  ops.b_scale = qf::testing::output(rw, bdir + "_scale_inv").bytes;
  ops.offsets = offsets;
  ops.m_total = t;
  std::vector<int64_t> rows(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) rows[size_t(i)] = i;
  const std::string what = std::string(recipe) + (dgrad ? " dgrad" : " fprop");
  expect_within_gemm_bound(spec, got, ref::gemm_reference(spec, ops, rows), what);

  std::vector<double> gotd(got.begin(), got.end()), exact(got.size());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t row = offsets[size_t(g)]; row < offsets[size_t(g) + 1]; ++row)
      for (int64_t col = 0; col < cols; ++col) {
        double s = 0;
        for (int64_t kk = 0; kk < red; ++kk)  // fprop: W_g[col, kk]; dgrad: (W_g^T)[col, kk] = W_g[kk, col]
          s += double(x.at(row, kk)) * double(dgrad ? w.at(g * n_out + kk, col) : w.at(g * n_out + col, kk));
        exact[size_t(row * cols + col)] = s;
      }
  const double err = qf::testing::rel_error(gotd, exact);
  std::printf("[ measure  ] %s: GPU grouped quantize -> %s: relative Frobenius error %.4f\n", recipe, dgrad ? "dgrad" : "fprop", err);
  EXPECT_LT(err, 0.1);
}

struct MGroupedCase {
  const char* recipe;
  GemmScaling scaling;
  bool dgrad;  // dY's rowwise copies and the weights' transposed ones; else X's and the weights' rowwise
};
void PrintTo(const MGroupedCase& c, std::ostream* os) { *os << c.recipe << (c.dgrad ? " dgrad" : " fprop"); }

class GpuQuantizeToMGrouped : public ::testing::TestWithParam<MGroupedCase> {};

TEST_P(GpuQuantizeToMGrouped, ReadsGroupedMnMajorCopies) {
  QF_SKIP_WITHOUT_GPU();
  const MGroupedCase& c = GetParam();
  expect_grouped_mn_major_copies_feed_m_grouped_gemm(c.recipe, c.scaling, c.dgrad);
}

INSTANTIATE_TEST_SUITE_P(MnMajor, GpuQuantizeToMGrouped,
                         ::testing::Values(MGroupedCase{"good/float8_block_scaling_mn_major", GemmScaling::Block128, false},
                                           MGroupedCase{"mxfp8_hopper", GemmScaling::Mx32, false},
                                           MGroupedCase{"good/float8_block_scaling_mn_major", GemmScaling::Block128, true},
                                           MGroupedCase{"mxfp8_hopper", GemmScaling::Mx32, true}),
                         [](const ::testing::TestParamInfo<MGroupedCase>& i) {
                           std::string name = std::string(i.param.recipe) + (i.param.dgrad ? "_dgrad" : "_fprop");
                           std::replace(name.begin(), name.end(), '/', '_');
                           return name;
                         });

INSTANTIATE_TEST_SUITE_P(Shipped, GpuQuantizeToGemm,
                         ::testing::Values(Case{"float8_block_scaling", GemmScaling::Block128, 0.1},
                                           Case{"mxfp8_hopper", GemmScaling::Mx32, 0.1},
                                           Case{"good/mxfp8_hopper_compact", GemmScaling::Mx32, 0.1},
                                           Case{"nvfp4", GemmScaling::Nvfp4, 0.25},
                                           Case{"current_scaling", GemmScaling::PerTensor, 0.1},
                                           Case{"fp8_rowwise", GemmScaling::RowChannel, 0.05},
                                           // bf16 identity copies (exact): the fp32 sums' rounding only
                                           Case{"int8_weight_sr", GemmScaling::None, 1e-5}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string name = i.param.recipe;
                           std::replace(name.begin(), name.end(), '/', '_');
                           return name;
                         });

}  // namespace
