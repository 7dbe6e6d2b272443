// The INT8 parameter's fused optimizer step, on the CPU: the reference (reference/optim_int8.h)
// against the definitions (the weight rowwise stream's quantize of int8_weight_sr, the optimizer
// updates of templates/qforge/optim_int8.cuh), its edge cases (zero rows, NaN / Inf as
// docs/numerics.md says, rows whose amax grows or shrinks), the runtime's argument checks (named
// UserErrors, raised before any launch) and the kernels' NVRTC compile without a GPU. The GPU
// kernel is compared with this reference bit for bit in gpu_optim_int8_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <unistd.h>
#include <vector>

#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "reference/executor.h"
#include "reference/optim_int8.h"
#include "runtime/optim_int8.h"
#include "pseudo_random.h"

namespace qf {
namespace {

using qf::testing::pseudo_random;

u32 bits(float x) { return f32_bits(x); }

// The argument a UserError of f() names ("(no error)" when f() throws none).
template <typename F>
std::string where_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.where();
  }
  return "(no error)";
}

// The bf16 value nearest x (the weights of a bf16 model).
float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

ref::Int8Param make_param(int64_t rows, int64_t cols, int states, uint32_t seed, DType scale_dtype = DType::BF16) {
  std::vector<float> w = pseudo_random(rows * cols, 0.05f, seed);
  ref::Int8Param p = ref::int8_quantize(w, rows, cols, scale_dtype, 7, 0);
  if (states >= 1) p.state0 = pseudo_random(rows * cols, 1e-3f, seed + 1);
  if (states >= 2) {
    p.state1 = pseudo_random(rows * cols, 1e-6f, seed + 2);
    for (auto& v : p.state1) v = std::fabs(v);
  }
  return p;
}

// ------------------------------------------------------------------ the requantize rule

// int8_quantize is the weight rowwise stream of int8_weight_sr (scale from the row amax rounded to
// the input dtype, stochastic rounding, Philox stream 0), bit for bit: the same seed and offset
// give the quantize reference's data and scales.
TEST(OptimInt8Reference, QuantizeIsTheWeightRowwiseStream) {
  const Recipe r = load_recipe(std::filesystem::path(QF_SOURCE_DIR) / "recipes" / "int8_weight_sr.json");
  for (DType dt : {DType::BF16, DType::FP32}) {
    const Plan plan = compile_plan(r, PlanRequest{"linear:weight", dt, Usage::Training, false});
    const int64_t m = 5, k = 37;
    std::vector<float> w = pseudo_random(m * k, 3.0f, 11);
    if (dt == DType::BF16)
      for (auto& v : w) v = bf16_round(v);
    for (int64_t c = 0; c < k; ++c) w[size_t(2 * k + c)] = 0.0f;  // a zero row
    ref::HostTensor x;
    x.dtype = dt;
    x.shape = {m, k};
    const int nb = traits(dt).bytes;
    x.bytes.resize(size_t(m * k * nb));
    for (size_t i = 0; i < w.size(); ++i) {
      if (dt == DType::FP32) {
        std::memcpy(&x.bytes[i * 4], &w[i], 4);
      } else {
        const u16 h = f32_to_bf16(w[i]);
        std::memcpy(&x.bytes[i * 2], &h, 2);
      }
    }
    ref::QuantizeParams qp;
    qp.seed = 1234, qp.offset = 56;
    const auto outs = ref::quantize(plan, x, qp);
    const ref::Int8Param p = ref::int8_quantize(w, m, k, dt, 1234, 56);
    bool found_data = false, found_scale = false;
    for (const auto& o : outs) {
      if (o.desc.name == "rowwise_data") {
        found_data = true;
        ASSERT_EQ(o.bytes.size(), p.q.size());
        EXPECT_EQ(0, std::memcmp(o.bytes.data(), p.q.data(), p.q.size())) << std::string(traits(dt).name);
      } else if (o.desc.name == "rowwise_scale_inv") {
        found_scale = true;
        ASSERT_EQ(o.bytes.size(), p.scale.size() * 4);
        EXPECT_EQ(0, std::memcmp(o.bytes.data(), p.scale.data(), o.bytes.size())) << std::string(traits(dt).name);
      }
    }
    EXPECT_TRUE(found_data && found_scale);
    EXPECT_EQ(p.scale[2], 0.0f);  // the zero row: scale 0, data 0
  }
}

// ------------------------------------------------------------------ the optimizer math

// The reference restates the updates; the header's sgd_update / adamw_update (what the kernel
// runs) give the same bits on the host.
TEST(OptimInt8Reference, UpdatesMatchTheDeviceHeaderOnTheHost) {
  const int64_t rows = 3, cols = 50;
  const std::vector<float> g = pseudo_random(rows * cols, 0.1f, 3);
  for (int variant = 0; variant < 4; ++variant) {
    ref::Int8Param p = make_param(rows, cols, 1, 20 + uint32_t(variant));
    const ref::Int8Param before = p;
    const SgdScalars c = int8_sgd_scalars(0.05, variant == 0 ? 0.0 : 0.9, variant == 2 ? 0.1 : 0.0,
                                          variant == 3 ? 0.01 : 0.0, variant == 3, variant == 1 ? 1 : 4);
    ref::int8_sgd_step(p, g, c, DType::BF16, 9, 2);
    // The same rows through the header's element update, then the requantize rule.
    ref::Int8Param h = before;
    std::vector<float> wn(static_cast<size_t>(rows * cols));
    const std::vector<float> w = ref::int8_dequantize(before);
    for (size_t i = 0; i < wn.size(); ++i) {
      float buf = c.has_momentum ? h.state0[i] : 0.0f;
      wn[i] = sgd_update(w[i], g[i], buf, c);
      if (c.has_momentum) {
        ASSERT_EQ(bits(buf), bits(p.state0[i])) << "variant " << variant << " element " << i;
      }
    }
    const ref::Int8Param expect = ref::int8_quantize(wn, rows, cols, DType::BF16, 9, 2);
    EXPECT_EQ(expect.q, p.q) << "variant " << variant;
    EXPECT_EQ(0, std::memcmp(expect.scale.data(), p.scale.data(), p.scale.size() * 4)) << "variant " << variant;
  }
  for (int step : {1, 2, 10}) {
    ref::Int8Param p = make_param(rows, cols, 2, 40 + uint32_t(step));
    const ref::Int8Param before = p;
    const AdamWScalars c = int8_adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.1, step);
    ref::int8_adamw_step(p, g, c, DType::BF16, 9, uint64_t(step));
    std::vector<float> wn(static_cast<size_t>(rows * cols));
    const std::vector<float> w = ref::int8_dequantize(before);
    for (size_t i = 0; i < wn.size(); ++i) {
      float m = before.state0[i], v = before.state1[i];
      wn[i] = adamw_update(w[i], g[i], m, v, c);
      ASSERT_EQ(bits(m), bits(p.state0[i]));
      ASSERT_EQ(bits(v), bits(p.state1[i]));
    }
    const ref::Int8Param expect = ref::int8_quantize(wn, rows, cols, DType::BF16, 9, uint64_t(step));
    EXPECT_EQ(expect.q, p.q) << "step " << step;
    EXPECT_EQ(0, std::memcmp(expect.scale.data(), p.scale.data(), p.scale.size() * 4));
  }
}

// AdamW's per-step scalars follow torch.optim.AdamW's bias corrections, computed in double.
TEST(OptimInt8Reference, AdamWScalarsFromTheStep) {
  const AdamWScalars c = int8_adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.1, 3);
  EXPECT_EQ(c.decay, float(1.0 - 1e-3 * 0.1));
  EXPECT_EQ(c.step_size, float(1e-3 / (1.0 - 0.9 * 0.9 * 0.9)));
  EXPECT_EQ(c.bc2_sqrt, float(std::sqrt(1.0 - 0.999 * 0.999 * 0.999)));
  EXPECT_EQ(c.one_minus_beta1, float(1.0 - 0.9));
  const SgdScalars s1 = int8_sgd_scalars(0.1, 0.9, 0.0, 0.0, false, 1), s2 = int8_sgd_scalars(0.1, 0.9, 0.0, 0.0, false, 2);
  EXPECT_EQ(s1.first_step, 1);
  EXPECT_EQ(s2.first_step, 0);
}

// Each element rounds to one of the two integers around its scaled value, never further; the
// scale is the updated row's (bf16-rounded) amax / 127.
void expect_requantized(const ref::Int8Param& p, const std::vector<float>& wn) {
  for (int64_t r = 0; r < p.rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < p.cols; ++c) amax = std::fmax(amax, std::fabs(wn[size_t(r * p.cols + c)]));
    const float scale = bf16_round(amax / 127.0f);
    ASSERT_EQ(bits(p.scale[size_t(r)]), bits(scale)) << "row " << r;
    const float inv = 1.0f / std::fmax(scale, 1e-12f);
    for (int64_t c = 0; c < p.cols; ++c) {
      const float x = wn[size_t(r * p.cols + c)] * inv;
      const int q = p.q[size_t(r * p.cols + c)];
      EXPECT_TRUE(q == int(std::floor(x)) || q == int(std::ceil(x)) || (x > 127.0f && q == 127))
          << "row " << r << " col " << c << ": " << x << " -> " << q;
    }
  }
}

// A row whose amax grows (a large update) gets a larger scale; one whose amax shrinks (weight
// decay towards zero) a smaller one; the elements follow the new scale.
TEST(OptimInt8Reference, RowAmaxGrowsAndShrinks) {
  const int64_t rows = 2, cols = 40;
  ref::Int8Param p = make_param(rows, cols, 0, 5);
  const std::vector<float> w = ref::int8_dequantize(p);
  std::vector<float> g(static_cast<size_t>(rows * cols), 0.0f);
  g[3] = -50.0f;  // row 0: one element moves far out, w - lr * g with lr 0.01: +0.5
  for (int64_t c = 0; c < cols; ++c) g[size_t(cols + c)] = 80.0f * w[size_t(cols + c)];  // row 1: w * (1 - 0.8)
  const SgdScalars c = int8_sgd_scalars(0.01, 0.0, 0.0, 0.0, false, 1);
  const float old0 = p.scale[0], old1 = p.scale[1];
  ref::int8_sgd_step(p, g, c, DType::BF16, 3, 1);
  std::vector<float> wn(w.size());
  for (size_t i = 0; i < w.size(); ++i) wn[i] = w[i] - c.lr * g[i];
  expect_requantized(p, wn);
  EXPECT_GT(p.scale[0], old0 * 5.0f);
  EXPECT_LT(p.scale[1], old1 * 0.3f);
  EXPECT_EQ(p.q[3], 127);  // the row's new amax is its largest magnitude
}

TEST(OptimInt8Reference, ZeroRowStaysZero) {
  const int64_t rows = 3, cols = 9;
  ref::Int8Param p = make_param(rows, cols, 2, 8);
  for (int64_t c = 0; c < cols; ++c) p.q[size_t(cols + c)] = 0, p.state0[size_t(cols + c)] = 0.0f, p.state1[size_t(cols + c)] = 0.0f;
  std::vector<float> g = pseudo_random(rows * cols, 0.1f, 9);
  for (int64_t c = 0; c < cols; ++c) g[size_t(cols + c)] = 0.0f;
  ref::int8_adamw_step(p, g, int8_adamw_scalars(1e-2, 0.9, 0.999, 1e-8, 0.1, 1), DType::BF16, 1, 1);
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(p.q[size_t(cols + c)], 0);
  EXPECT_EQ(bits(p.scale[1]), 0u);  // amax 0: scale 0 (the multiplier is 1 / 1e-12)
  // SGD: a zero row with a zero gradient, and one whose scale is 0 but whose gradient is not.
  ref::Int8Param s = make_param(rows, cols, 1, 10);
  for (int64_t c = 0; c < cols; ++c) s.q[size_t(c)] = 0, g[size_t(c)] = 0.0f;
  ref::int8_sgd_step(s, g, int8_sgd_scalars(0.1, 0.9, 0.0, 0.0, false, 1), DType::BF16, 1, 1);
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(s.q[size_t(c)], 0);
  EXPECT_EQ(bits(s.scale[0]), 0u);
}

// docs/numerics.md: int8 encodes NaN as 0 and the amax ignores NaN, so a NaN update zeroes its
// element and leaves the row's scale to the other elements; an infinite update makes the row's
// amax Inf: scale Inf (bf16 keeps it), multiplier 1 / Inf = 0, every element 0.
TEST(OptimInt8Reference, NanAndInfFollowTheInt8Encoding) {
  const int64_t rows = 2, cols = 12;
  ref::Int8Param p = make_param(rows, cols, 1, 12);
  const std::vector<float> w = ref::int8_dequantize(p);
  std::vector<float> g(static_cast<size_t>(rows * cols), 0.01f);
  g[4] = NAN;
  g[size_t(cols + 7)] = INFINITY;
  const SgdScalars c = int8_sgd_scalars(0.1, 0.9, 0.0, 0.0, false, 1);
  ref::int8_sgd_step(p, g, c, DType::BF16, 5, 1);
  EXPECT_EQ(p.q[4], 0);
  EXPECT_TRUE(std::isnan(p.state0[4]));  // the momentum buffer keeps the NaN
  std::vector<float> wn(static_cast<size_t>(cols));
  float amax = 0.0f;
  for (int64_t k = 0; k < cols; ++k) {
    wn[size_t(k)] = w[size_t(k)] - c.lr * g[size_t(k)];
    amax = std::fmax(amax, std::fabs(wn[size_t(k)]));
  }
  EXPECT_FALSE(std::isnan(amax));
  EXPECT_EQ(bits(p.scale[0]), bits(bf16_round(amax / 127.0f)));
  EXPECT_TRUE(std::isinf(p.scale[1]));
  for (int64_t k = 0; k < cols; ++k) EXPECT_EQ(p.q[size_t(cols + k)], 0) << k;
}

// The same (seed, offset) draws the same bits; another offset (the next step) other bits.
TEST(OptimInt8Reference, SeedAndOffsetDecideTheRounding) {
  const int64_t rows = 4, cols = 64;
  const std::vector<float> g = pseudo_random(rows * cols, 0.3f, 13);
  const AdamWScalars c = int8_adamw_scalars(1e-2, 0.9, 0.999, 1e-8, 0.0, 1);
  ref::Int8Param a = make_param(rows, cols, 2, 14), b = a, d = a;
  ref::int8_adamw_step(a, g, c, DType::BF16, 77, 5);
  ref::int8_adamw_step(b, g, c, DType::BF16, 77, 5);
  ref::int8_adamw_step(d, g, c, DType::BF16, 77, 6);
  EXPECT_EQ(a.q, b.q);
  EXPECT_NE(a.q, d.q);
  EXPECT_EQ(0, std::memcmp(a.scale.data(), d.scale.data(), a.scale.size() * 4));  // the scale is not random
}

// Stochastic rounding keeps small updates in expectation: an update of a tenth of a step moves
// about a tenth of the elements by one.
TEST(OptimInt8Reference, SmallUpdatesSurviveInExpectation) {
  const int64_t rows = 1, cols = 4096;
  std::vector<float> w(size_t(cols), 0.0f);
  w[0] = 127.0f;  // the row's amax: scale 1, so the elements sit on integers
  for (int64_t c = 1; c < cols; ++c) w[size_t(c)] = 10.0f;
  ref::Int8Param p = ref::int8_quantize(w, rows, cols, DType::FP32, 1, 0);
  ASSERT_EQ(p.scale[0], 1.0f);
  std::vector<float> g(static_cast<size_t>(cols), -1.0f);
  g[0] = 0.0f;
  ref::int8_sgd_step(p, g, int8_sgd_scalars(0.1, 0.0, 0.0, 0.0, false, 1), DType::FP32, 2, 1);
  int ups = 0;
  for (int64_t c = 1; c < cols; ++c) {
    ASSERT_TRUE(p.q[size_t(c)] == 10 || p.q[size_t(c)] == 11);
    ups += p.q[size_t(c)] == 11;
  }
  EXPECT_NEAR(double(ups) / double(cols - 1), 0.1, 0.02);
}

// ------------------------------------------------------------------ the runtime's checks

TEST(OptimInt8Runtime, OptionsOutOfRangeNameTheOption) {
  using rt::AdamWOptions;
  using rt::SgdOptions;
  EXPECT_EQ(where_of([] { rt::int8_optim_scalars(SgdOptions{-1.0}, 1); }), "lr");
  EXPECT_EQ(where_of([] { rt::int8_optim_scalars(SgdOptions{0.1, 0.0, 0.0, 0.0, true}, 1); }), "nesterov");
  EXPECT_EQ(where_of([] { rt::int8_optim_scalars(SgdOptions{0.1, NAN}, 1); }), "momentum");
  EXPECT_EQ(where_of([] { rt::int8_optim_scalars(AdamWOptions{1e-3, 1.0}, 1); }), "betas[0]");
  EXPECT_EQ(where_of([] { rt::int8_optim_scalars(AdamWOptions{1e-3, 0.9, -0.1}, 1); }), "betas[1]");
  EXPECT_EQ(where_of([] { rt::int8_optim_scalars(AdamWOptions{1e-3, 0.9, 0.999, 0.0}, 1); }), "eps");
  EXPECT_EQ(where_of([] { rt::int8_optim_scalars(AdamWOptions{1e-3, 0.9, 0.999, 1e-8, -1.0}, 1); }), "weight_decay");
  EXPECT_EQ(where_of([] { rt::int8_optim_scalars(AdamWOptions{}, 0); }), "step");
  EXPECT_NO_THROW(rt::int8_optim_scalars(AdamWOptions{}, 1));
}

rt::Int8OptimCall good_call(int64_t rows, int64_t cols) {
  rt::Int8OptimCall c;
  c.rows = rows, c.cols = cols;
  const uint64_t base = 0x100000000ull, n = uint64_t(rows * cols);
  const auto view = [](uint64_t ptr, int64_t bytes) {
    rt::TensorView v;
    v.ptr = ptr, v.bytes = bytes;
    return v;
  };
  c.q = view(base, int64_t(n));
  c.scale = view(base + 0x10000000ull, rows * 4);
  c.grad = view(base + 0x20000000ull, int64_t(n * 4));
  c.state0 = view(base + 0x40000000ull, int64_t(n * 4));
  c.state1 = view(base + 0x60000000ull, int64_t(n * 4));
  return c;
}

// Every check runs before the driver is touched: no GPU needed.
TEST(OptimInt8Runtime, BadBuffersNameTheArgument) {
  const auto check = [](const rt::Int8OptimCall& c) {
    rt::check_int8_optim_call(c, rt::Int8Optimizer::AdamW, true, true);
  };
  EXPECT_NO_THROW(check(good_call(8, 64)));
  EXPECT_EQ(where_of([&] { check(good_call(8, rt::kInt8OptimMaxCols + 1)); }), "argument cols");
  EXPECT_EQ(where_of([&] { check(good_call(0, 64)); }), "argument rows");
  auto c = good_call(8, 64);
  c.scale.bytes = 8 * 4 - 1;
  EXPECT_EQ(where_of([&] { check(c); }), "argument scale");
  c = good_call(8, 64);
  c.grad.ptr = 0;
  EXPECT_EQ(where_of([&] { check(c); }), "argument grad");
  c = good_call(8, 64);
  c.grad_dtype = DType::FP16;
  EXPECT_EQ(where_of([&] { check(c); }), "argument grad");
  c = good_call(8, 64);
  c.state1.bytes = 100;
  EXPECT_EQ(where_of([&] { check(c); }), "argument exp_avg_sq");
  c = good_call(8, 64);
  c.state0.ptr = c.grad.ptr + 16;  // overlaps the gradient
  const std::string w = where_of([&] { check(c); });
  EXPECT_TRUE(w == "argument exp_avg" || w == "argument grad") << w;
  // SGD without momentum needs no buffer; with it, the buffer is named as torch names it.
  c = good_call(8, 64);
  c.state0 = {};
  EXPECT_NO_THROW(rt::check_int8_optim_call(c, rt::Int8Optimizer::Sgd, false, false));
  EXPECT_EQ(where_of([&] { rt::check_int8_optim_call(c, rt::Int8Optimizer::Sgd, true, false); }), "argument momentum_buffer");
}

TEST(OptimInt8Runtime, KernelShapeHoldsTheRow) {
  for (int64_t cols : {1, 3, 4, 64, 100, 1000, 4096, 7168, 16383, 16384, 32768})
    for (bool vec4 : {false, true}) {
      const rt::Int8OptimKernelSpec s = rt::int8_optim_spec(rt::Int8Optimizer::AdamW, cols, vec4, DType::FP32, DType::BF16);
      EXPECT_EQ(s.vec, vec4 && cols % 4 == 0 ? 4 : 1);
      EXPECT_GE(int64_t(s.threads) * s.iters * s.vec, cols) << cols;
      EXPECT_LE(s.iters * s.vec, 32) << cols;  // at most 32 values of the row per thread
      EXPECT_LE(s.threads, 1024);
    }
  const auto s = rt::int8_optim_spec(rt::Int8Optimizer::Sgd, 16384, true, DType::BF16, DType::BF16);
  EXPECT_EQ(s.threads, 1024);
  EXPECT_EQ(s.iters, 4);
}

// The kernels compile under NVRTC without a GPU (the GPU suite checks their values).
TEST(OptimInt8Runtime, KernelsCompileWithoutAGpu) {
  rt::CacheOptions opts;
  opts.disabled = true;  // memory only
  rt::KernelCache cache(opts);
  for (auto o : {rt::Int8Optimizer::Sgd, rt::Int8Optimizer::AdamW})
    for (bool vec4 : {false, true}) {
      const auto spec = rt::int8_optim_spec(o, 7168, vec4, vec4 ? DType::FP32 : DType::BF16, DType::BF16);
      const rt::Int8OptimKernel k = rt::build_int8_optim_kernel(spec, "sm_90a", cache);
      EXPECT_FALSE(k.cached.entry->image.empty());
      EXPECT_NE(k.source.find("#include \"qforge/optim_int8.cuh\""), std::string::npos);
    }
}

// ----------------------------------------------------------------- prewarm (qforge prewarm)

// The specs a prewarm compiles are every spec a step of a weight whose rows are a multiple of 4
// long picks (the optimizers' fp32 main_grad, bf16 scales), whatever its shape: 9 CTA shapes per
// optimizer. Only a plan of int8 storage's rule, of a bf16 model, gets them.
TEST(OptimInt8Prewarm, SpecsCoverEveryRowLengthAMultipleOf4) {
  const Recipe r = load_recipe(std::filesystem::path(QF_SOURCE_DIR) / "recipes" / "int8_weight_sr.json");
  const Plan wp = compile_plan(r, PlanRequest{"linear:weight", DType::BF16, Usage::Inference, false});
  ASSERT_TRUE(rt::int8_storage_rule(wp));
  const std::vector<rt::Int8OptimKernelSpec> specs = rt::int8_optim_prewarm_specs(wp);
  EXPECT_EQ(specs.size(), 18u);
  const std::set<rt::Int8OptimKernelSpec> have(specs.begin(), specs.end());
  EXPECT_EQ(have.size(), specs.size());
  for (auto o : {rt::Int8Optimizer::Sgd, rt::Int8Optimizer::AdamW})
    for (int64_t cols = 4; cols <= rt::kInt8OptimMaxCols; cols += 4)
      ASSERT_TRUE(have.count(rt::int8_optim_spec(o, cols, true, DType::FP32, DType::BF16))) << name(o) << " " << cols;
  EXPECT_EQ(rt::int8_optim_specs(rt::Int8Optimizer::AdamW, true, DType::FP32, DType::BF16).size(), 9u);
  EXPECT_EQ(rt::int8_optim_specs(rt::Int8Optimizer::AdamW, false, DType::FP32, DType::BF16).size(), 11u);
  EXPECT_EQ(rt::describe(specs.front()).find("fp32 grad, bf16 scale") != std::string::npos, true);

  // fp16 / fp32 models: int8 storage trains bf16 models only.
  EXPECT_TRUE(rt::int8_optim_prewarm_specs(
                  compile_plan(r, PlanRequest{"linear:weight", DType::FP16, Usage::Inference, false})).empty());
  // Not int8 storage's rule: the activations' identity streams, another recipe's weight.
  EXPECT_TRUE(rt::int8_optim_prewarm_specs(
                  compile_plan(r, PlanRequest{"linear:input", DType::BF16, Usage::Training, false})).empty());
  const Recipe w8a8 = load_recipe(std::filesystem::path(QF_SOURCE_DIR) / "recipes" / "w8a8_int8_inference.json");
  const Plan w8 = compile_plan(w8a8, PlanRequest{"linear:weight", DType::BF16, Usage::Inference, false});
  EXPECT_FALSE(rt::int8_storage_rule(w8));  // int8 per_channel, but round to nearest
  EXPECT_TRUE(rt::int8_optim_prewarm_specs(w8).empty());
}

// A prewarmed kernel is what a later step finds: compiled into a cache root once, then a disk hit
// for a fresh cache over that root (as a step of another process, or the wheel's shipped kernels).
TEST(OptimInt8Prewarm, ALaterLookupHitsTheCache) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("qforge-optim-prewarm-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  rt::CacheOptions opts;
  opts.writable_root = dir;
  // The step of a 4096-column weight: its spec is one of the prewarm's.
  const auto spec = rt::int8_optim_spec(rt::Int8Optimizer::AdamW, 4096, true, DType::FP32, DType::BF16);
  {
    rt::KernelCache cache(opts);
    EXPECT_EQ(rt::build_int8_optim_kernel(spec, "sm_90a", cache).cached.how, rt::CacheHow::Compiled);
    const auto listed = cache.list();
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_EQ(listed[0].content, "optim_int8");  // what `qforge list` shows in its ROLE column
  }
  rt::KernelCache later(opts);
  const rt::Int8OptimKernel k = rt::build_int8_optim_kernel(spec, "sm_90a", later);
  EXPECT_EQ(k.cached.how, rt::CacheHow::DiskHit);
  EXPECT_EQ(later.stats().compiles, 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qf
