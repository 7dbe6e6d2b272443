// The INT8 parameter's fused optimizer step on the GPU (runtime/optim_int8.h) against the CPU
// reference (reference/optim_int8.h), bit for bit: int8 data, scales and optimizer state after
// each of several steps in a row, for SGD (with and without momentum, Nesterov, weight decay)
// and AdamW, fp32 and bf16 gradients, rows of 1 to 32768 elements (multiples of the vector width
// and not, a misaligned buffer that forces the scalar path), one row and more rows than CTAs.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "qforge/numerics.cuh"
#include "reference/optim_int8.h"
#include "runtime/driver.h"
#include "runtime/gpu_test_util.h"
#include "runtime/optim_int8.h"
#include "pseudo_random.h"

namespace {

using namespace qf;
using rt::DeviceBuffer;

using qf::testing::pseudo_random;

struct OptimCase {
  rt::Int8Optimizer optimizer;
  int variant;  // SGD: 0 plain, 1 momentum, 2 Nesterov + weight decay, 3 momentum + dampening; AdamW: 0, 1 (no decay)
  int64_t rows, cols;
  DType grad;
  int misalign;  // bytes added to the gradient's address (forces the scalar path)
};

std::string case_name(const ::testing::TestParamInfo<OptimCase>& i) {
  const OptimCase& c = i.param;
  return std::string(rt::name(c.optimizer)) + std::to_string(c.variant) + "_" + std::to_string(c.rows) + "x" +
         std::to_string(c.cols) + "_" + std::string(traits(c.grad).name) + (c.misalign ? "_misaligned" : "");
}

rt::Int8OptimOptions options_of(const OptimCase& c) {
  if (c.optimizer == rt::Int8Optimizer::Sgd) {
    rt::SgdOptions o;
    o.lr = 0.05;
    if (c.variant >= 1) o.momentum = 0.9;
    if (c.variant == 2) o.nesterov = true, o.weight_decay = 0.01;
    if (c.variant == 3) o.dampening = 0.1;
    return o;
  }
  rt::AdamWOptions o;
  o.lr = 2e-3;
  if (c.variant == 1) o.weight_decay = 0.0;
  return o;
}

int states_of(const OptimCase& c) {
  if (c.optimizer == rt::Int8Optimizer::AdamW) return 2;
  return c.variant >= 1 ? 1 : 0;
}

struct DeviceParam {
  DeviceBuffer q, scale, grad, state0, state1;
};

class GpuOptimInt8 : public ::testing::TestWithParam<OptimCase> {};

TEST_P(GpuOptimInt8, MatchesTheReferenceOverSteps) {
  QF_SKIP_WITHOUT_GPU();
  const OptimCase& c = GetParam();
  const int64_t n = c.rows * c.cols;
  const int states = states_of(c);
  ref::Int8Param p = ref::int8_quantize(pseudo_random(n, 0.05f, 3), c.rows, c.cols, DType::BF16, 99, 0);
  if (c.rows > 1)  // a zero row
    for (int64_t k = 0; k < c.cols; ++k) p.q[size_t(c.cols + k)] = 0;
  if (states >= 1) p.state0.assign(size_t(n), 0.0f);
  if (states >= 2) p.state1.assign(size_t(n), 0.0f);

  const int gbytes = traits(c.grad).bytes;
  DeviceParam d{DeviceBuffer(size_t(n)), DeviceBuffer(size_t(c.rows) * 4), DeviceBuffer(size_t(n * gbytes) + 16),
                DeviceBuffer(states >= 1 ? size_t(n) * 4 : 0), DeviceBuffer(states >= 2 ? size_t(n) * 4 : 0)};
  d.q.upload(p.q.data(), p.q.size());
  d.scale.upload(p.scale.data(), p.scale.size() * 4);
  if (states >= 1) d.state0.upload(p.state0.data(), size_t(n) * 4);
  if (states >= 2) d.state1.upload(p.state1.data(), size_t(n) * 4);

  rt::Int8OptimCall call;
  call.q = rt::testing::view_of(d.q);
  call.scale = rt::testing::view_of(d.scale);
  call.grad.ptr = d.grad.address() + uint64_t(c.misalign);
  call.grad.bytes = int64_t(n * gbytes);
  if (states >= 1) call.state0 = rt::testing::view_of(d.state0);
  if (states >= 2) call.state1 = rt::testing::view_of(d.state1);
  call.rows = c.rows, call.cols = c.cols;
  call.grad_dtype = c.grad;
  call.scale_dtype = DType::BF16;
  call.seed = 0x1234567890ull;

  for (int64_t step = 1; step <= 3; ++step) {
    // A gradient per step, exact in its dtype; a few large entries move their rows' amax.
    std::vector<float> g = pseudo_random(n, step == 2 ? 2.0f : 0.2f, uint32_t(10 + step));
    std::vector<uint8_t> gb(static_cast<size_t>(n * gbytes));
    for (int64_t i = 0; i < n; ++i) {
      if (c.grad == DType::BF16) {
        const u16 h = f32_to_bf16(g[size_t(i)]);
        g[size_t(i)] = bf16_to_f32(h);
        std::memcpy(&gb[size_t(i) * 2], &h, 2);
      } else {
        std::memcpy(&gb[size_t(i) * 4], &g[size_t(i)], 4);
      }
    }
    d.grad.upload(gb.data(), gb.size(), size_t(c.misalign));
    call.offset = uint64_t(step);
    const rt::Int8OptimScalarSet scalars = rt::int8_optim_scalars(options_of(c), step);
    rt::int8_optim_step(call, scalars, nullptr);
    rt::check(rt::driver().cuCtxSynchronize(), "cuCtxSynchronize");
    if (c.optimizer == rt::Int8Optimizer::Sgd)
      ref::int8_sgd_step(p, g, std::get<SgdScalars>(scalars), DType::BF16, call.seed, call.offset);
    else
      ref::int8_adamw_step(p, g, std::get<AdamWScalars>(scalars), DType::BF16, call.seed, call.offset);

    const auto q = d.q.download_as<int8_t>();
    const auto s = d.scale.download_as<u32>();
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(int(q[size_t(i)]), int(p.q[size_t(i)]))
          << "step " << step << " row " << i / c.cols << " col " << i % c.cols;
    for (int64_t r = 0; r < c.rows; ++r)
      ASSERT_EQ(s[size_t(r)], f32_bits(p.scale[size_t(r)])) << "step " << step << " scale of row " << r;
    if (states >= 1) {
      const auto m = d.state0.download_as<u32>();
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(m[size_t(i)], f32_bits(p.state0[size_t(i)])) << "step " << step << " state0 " << i;
    }
    if (states >= 2) {
      const auto v = d.state1.download_as<u32>();
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[size_t(i)], f32_bits(p.state1[size_t(i)])) << "step " << step << " state1 " << i;
    }
  }
}

std::vector<OptimCase> cases() {
  std::vector<OptimCase> out;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {1, 16384}, {7, 37}, {3, 4099}, {64, 4096}, {4, 16384}, {2, 32768}, {2000, 12}, {5, 7168}};
  for (auto [rows, cols] : shapes) {
    out.push_back({rt::Int8Optimizer::AdamW, 0, rows, cols, DType::FP32, 0});
    out.push_back({rt::Int8Optimizer::Sgd, 1, rows, cols, DType::FP32, 0});
  }
  for (int v = 0; v < 4; ++v) out.push_back({rt::Int8Optimizer::Sgd, v, 9, 1000, DType::BF16, 0});
  out.push_back({rt::Int8Optimizer::AdamW, 1, 9, 1000, DType::BF16, 0});
  out.push_back({rt::Int8Optimizer::AdamW, 0, 6, 4096, DType::FP32, 4});   // cols % 4 == 0, scalar path
  out.push_back({rt::Int8Optimizer::Sgd, 2, 6, 4096, DType::BF16, 2});
  out.push_back({rt::Int8Optimizer::AdamW, 0, 3, 16384, DType::BF16, 0});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuOptimInt8, ::testing::ValuesIn(cases()), case_name);

// A noop flag of 1.0 on the device leaves data, scales and state untouched; 0.0 steps.
TEST(GpuOptimInt8Noop, FlagSkipsTheStep) {
  QF_SKIP_WITHOUT_GPU();
  const int64_t rows = 4, cols = 256, n = rows * cols;
  ref::Int8Param p = ref::int8_quantize(pseudo_random(n, 0.05f, 5), rows, cols, DType::BF16, 1, 0);
  DeviceBuffer q(static_cast<size_t>(n)), scale(static_cast<size_t>(rows) * 4), grad(static_cast<size_t>(n) * 4),
      m(static_cast<size_t>(n) * 4), v(static_cast<size_t>(n) * 4), flag(4);
  q.upload(p.q.data(), size_t(n));
  scale.upload(p.scale.data(), size_t(rows) * 4);
  const std::vector<float> g = pseudo_random(n, 0.5f, 6);
  grad.upload(g.data(), size_t(n) * 4);
  m.fill(0), v.fill(0);
  rt::Int8OptimCall call;
  call.q = rt::testing::view_of(q), call.scale = rt::testing::view_of(scale), call.grad = rt::testing::view_of(grad);
  call.state0 = rt::testing::view_of(m), call.state1 = rt::testing::view_of(v), call.noop = rt::testing::view_of(flag);
  call.rows = rows, call.cols = cols, call.seed = 3, call.offset = 1;
  const float one = 1.0f, zero = 0.0f;
  flag.upload(&one, 4);
  const auto scalars = rt::int8_optim_scalars(rt::AdamWOptions{}, 1);
  rt::int8_optim_step(call, scalars, nullptr);
  rt::check(rt::driver().cuCtxSynchronize(), "cuCtxSynchronize");
  EXPECT_EQ(q.download_as<int8_t>(), p.q);
  EXPECT_EQ(m.download_as<u32>(), std::vector<u32>(size_t(n), 0u));
  flag.upload(&zero, 4);
  rt::int8_optim_step(call, scalars, nullptr);
  rt::check(rt::driver().cuCtxSynchronize(), "cuCtxSynchronize");
  p.state0.assign(size_t(n), 0.0f), p.state1.assign(size_t(n), 0.0f);
  ref::int8_adamw_step(p, g, std::get<AdamWScalars>(scalars), DType::BF16, 3, 1);
  EXPECT_EQ(q.download_as<int8_t>(), p.q);
}

}  // namespace
