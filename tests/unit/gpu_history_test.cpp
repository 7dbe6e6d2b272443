// Delayed scaling's amax-history update kernel: bit-identical to ref::update_amax_history
// over several steps, for history lengths that do and do not fill the block, both amax rules,
// margins, both fp8 formats, and amax values 0 / Inf / NaN that must keep the previous scale.
// The compile test runs everywhere; the GPU test skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compiler/codegen.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "qforge/numerics.cuh"
#include "reference/executor.h"
#include "runtime/gpu_test_util.h"
#include "runtime/nvrtc.h"
#include "runtime/quantizer.h"

namespace {

using namespace qf;

struct HistCase {
  int length;
  int margin;
  AmaxCompute rule;
  ElemFormat format;
};

std::string hist_name(const ::testing::TestParamInfo<HistCase>& i) {
  return "len" + std::to_string(i.param.length) + "_margin" + std::to_string(i.param.margin) + "_" +
         std::string(name(i.param.rule)) + "_" + std::string(traits(i.param.format).name);
}

class AmaxHistory : public ::testing::TestWithParam<HistCase> {};

TEST_P(AmaxHistory, CompilesForHopperAndBlackwell) {
  const HistCase& c = GetParam();
  const KernelSource ks = emit_history_update(PerTensorDelayed{c.margin, c.length, c.rule}, c.format);
  for (const char* arch : {"sm_90a", "sm_100a"}) {
    rt::CompileRequest req{ks.source, "history.cu", {ks.cast_kernel}, arch, {}};
    const rt::CompileResult r = rt::compile_cuda(req);
    EXPECT_FALSE(r.image.empty()) << arch;
  }
}

TEST(AmaxHistoryKernels, PrepareAndPrewarmCompileThemAheadOfTime) {
  // Every delayed-scaling rule of a plan, once per (rule, format): the kernels a training step
  // launches after each quantize, which Quantizer::prepare (and `qforge prewarm`) compile so that
  // the first update is no NVRTC compile.
  const Recipe r = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/delayed_scaling.json");
  const Plan input = compile_plan(r, PlanRequest{"linear:input", DType::BF16, Usage::Training, false});
  const Plan grad = compile_plan(r, PlanRequest{"linear:grad_output", DType::BF16, Usage::Training, false});
  const auto in_rules = rt::history_rules(input), grad_rules = rt::history_rules(grad);
  ASSERT_EQ(in_rules.size(), 1u);  // row and column share the rule and format: one kernel
  EXPECT_EQ(in_rules[0].second, ElemFormat::E4M3);
  EXPECT_EQ(in_rules[0].first.history_length, 1024);
  ASSERT_EQ(grad_rules.size(), 1u);
  EXPECT_EQ(grad_rules[0].second, ElemFormat::E5M2);
  const Recipe mx = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/mxfp8.json");
  EXPECT_TRUE(rt::history_rules(compile_plan(mx, PlanRequest{"linear:input", DType::BF16, Usage::Training, false})).empty());

  rt::CacheOptions opts;
  opts.disabled = true;  // memory only: what this cache compiled, nothing else
  rt::KernelCache cache(opts);
  const rt::Quantizer q(grad, cache, false);
  (void)q.prepare("sm_90a");
  const auto [mode, format] = grad_rules[0];
  EXPECT_EQ(rt::build_history_kernel(mode, format, "sm_90a", cache).cached.how, rt::CacheHow::MemoryHit);
  EXPECT_EQ(rt::build_history_kernel(mode, ElemFormat::E4M3, "sm_90a", cache).cached.how, rt::CacheHow::Compiled);
}

TEST_P(AmaxHistory, GpuMatchesReferenceOverSteps) {
  QF_SKIP_WITHOUT_GPU();
  const HistCase& c = GetParam();
  const PerTensorDelayed mode{c.margin, c.length, c.rule};
  std::mt19937 rng(c.length * 7 + c.margin);
  std::vector<float> history(size_t(c.length));
  for (auto& h : history) h = std::ldexp(float(rng() % 1000) / 7.0f, int(rng() % 20) - 10);
  float scale = 2.0f;

  using namespace qf::rt;
  DeviceBuffer dh(history.size() * 4), da(4), ds(4), dsi(4);
  dh.upload(history.data(), history.size() * 4);
  ds.upload(&scale, 4);
  qf::rt::Stream stream;
  const float amaxes[] = {3.25f, 0.0f, INFINITY, NAN, 1e-30f, 1e30f, 17.0f};
  for (float amax : amaxes) {
    ref::update_amax_history(history, amax, scale, mode, c.format);
    da.upload(&amax, 4);
    HistoryCall call;
    call.history = qf::rt::testing::view_of(dh);
    call.amax = qf::rt::testing::view_of(da);
    call.scale = qf::rt::testing::view_of(ds);
    call.scale_inv = qf::rt::testing::view_of(dsi);
    update_amax_history(mode, c.format, call, stream.get());
    stream.synchronize();
    std::vector<float> got = dh.download_as<float>();
    float got_scale = 0, got_inv = 0;
    ds.download(&got_scale, 4);
    dsi.download(&got_inv, 4);
    ASSERT_EQ(0, std::memcmp(got.data(), history.data(), history.size() * 4)) << "history after amax " << amax;
    ASSERT_EQ(f32_bits(got_scale), f32_bits(scale)) << "scale after amax " << amax;
    ASSERT_EQ(f32_bits(got_inv), f32_bits(1.0f / scale)) << "scale_inv after amax " << amax;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, AmaxHistory,
    ::testing::Values(HistCase{1, 0, AmaxCompute::Max, ElemFormat::E4M3},
                      HistCase{16, 2, AmaxCompute::Max, ElemFormat::E5M2},
                      HistCase{1024, 0, AmaxCompute::Max, ElemFormat::E4M3},
                      HistCase{1500, 1, AmaxCompute::MostRecent, ElemFormat::E4M3},
                      HistCase{65536, 0, AmaxCompute::Max, ElemFormat::E5M2}),
    hist_name);

}  // namespace
