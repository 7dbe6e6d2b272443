// Delayed scaling's amax-history update kernel: bit-identical to ref::update_amax_history
// over several steps, for history lengths that do and do not fill the block, both amax rules,
// margins, both fp8 formats, and amax values 0 / Inf / NaN that must keep the previous scale.
// The compile test runs everywhere; the GPU test skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compiler/codegen.h"
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
