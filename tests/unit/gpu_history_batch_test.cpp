// The batched amax-history update (a model's delayed-scaling tensors in one launch per history
// length): its source and compile for every length class, its argument checks (which need no GPU),
// and on a GPU, over several steps, every entry bit-identical to ref::update_amax_history and to
// the per-tensor kernel, with mixed rules, formats and margins in one batch, amax values 0 / Inf /
// NaN that keep the previous scale, and the noop flag.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compiler/error.h"
#include "qforge/numerics.cuh"
#include "reference/executor.h"
#include "runtime/gpu_test_util.h"
#include "runtime/nvrtc.h"
#include "runtime/quantizer.h"

namespace {

using namespace qf;

TEST(HistoryBatch, SourceBakesTheLengthAlone) {
  const KernelSource a = rt::emit_history_batch(1024), b = rt::emit_history_batch(16);
  EXPECT_NE(a.source.find("kLength = 1024"), std::string::npos) << a.source;
  EXPECT_NE(a.source.find("kThreads = 1024"), std::string::npos) << a.source;
  EXPECT_NE(b.source.find("kThreads = 32"), std::string::npos) << b.source;
  // The rule (margin, amax_compute, format max) is each entry's, at run time: not in the source.
  EXPECT_EQ(a.source.find("kMargin"), std::string::npos);
  EXPECT_EQ(a.source.find("kFmax"), std::string::npos);
  EXPECT_EQ(a.cast_kernel, "qf::amax_history_batch_kernel<qf_gen::HistoryBatchCfg>");
}

TEST(HistoryBatch, CompilesForHopperAndBlackwell) {
  for (int length : {1, 16, 1024, 1500}) {
    const KernelSource ks = rt::emit_history_batch(length);
    for (const char* arch : {"sm_90a", "sm_100a"}) {
      rt::CompileRequest req{ks.source, "history_batch.cu", {ks.cast_kernel}, arch, {}};
      EXPECT_FALSE(rt::compile_cuda(req).image.empty()) << length << " " << arch;
    }
  }
}

rt::TensorView fake(uint64_t ptr, int64_t bytes) { return rt::TensorView{ptr, bytes, {}, {}}; }

rt::HistoryBatchItem fake_item(uint64_t base, int length) {
  rt::HistoryBatchItem it;
  it.mode = PerTensorDelayed{0, length, AmaxCompute::Max};
  it.history = fake(base, int64_t(length) * 4);
  it.amax = fake(base + 0x10000, 4);
  it.scale = fake(base + 0x10100, 4);
  it.scale_inv = fake(base + 0x10200, 4);
  return it;
}

// The checks run before anything touches a device: they need no GPU.
TEST(HistoryBatch, RefusesWhatWouldRaceOrOverrun) {
  const auto message = [](std::vector<rt::HistoryBatchItem> items) {
    try {
      rt::HistoryBatch b(std::move(items));
    } catch (const UserError& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("other: ") + e.what();
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}).find("items: expected at least one"), std::string::npos);
  auto short_history = fake_item(0x100000, 16);
  short_history.history.bytes = 60;
  EXPECT_NE(message({fake_item(0x200000, 16), short_history}).find("items[1].history"), std::string::npos);
  // Two entries rolling one history: a race.
  auto a = fake_item(0x100000, 16), b = fake_item(0x200000, 16);
  b.history = a.history;
  const std::string shared = message({a, b});
  EXPECT_NE(shared.find("overlaps items[0].history, which the same batched update writes"), std::string::npos) << shared;
  // One entry's amax is another's scale: read while written.
  auto c = fake_item(0x300000, 16);
  c.amax = a.scale;
  const std::string read_written = message({a, c});
  EXPECT_NE(read_written.find("items[1].amax: overlaps items[0].scale"), std::string::npos) << read_written;
  auto e5 = fake_item(0x400000, 16);
  e5.format = ElemFormat::E2M1;
  EXPECT_NE(message({e5}).find("items[0].format: delayed scaling is fp8"), std::string::npos);
}

struct Tensor {
  PerTensorDelayed mode;
  ElemFormat format;
  std::vector<float> history;
  float scale = 2.0f;
};

TEST(HistoryBatch, GpuMatchesReferenceAndThePerTensorKernel) {
  QF_SKIP_WITHOUT_GPU();
  using rt::DeviceBuffer;
  std::mt19937 rng(7);
  // Two length classes (two launches), every rule and format, margins 0..2, lengths that do and do
  // not fill the block.
  std::vector<Tensor> ts;
  for (int i = 0; i < 12; ++i) {
    const int length = i % 3 == 2 ? 16 : 1024;
    ts.push_back(Tensor{PerTensorDelayed{i % 3, length, i % 2 ? AmaxCompute::MostRecent : AmaxCompute::Max},
                        i % 4 < 2 ? ElemFormat::E4M3 : ElemFormat::E5M2, std::vector<float>(size_t(length)), 1.0f + i});
    for (auto& h : ts.back().history) h = std::ldexp(float(rng() % 1000) / 7.0f, int(rng() % 20) - 10);
  }
  const size_t n = ts.size();
  std::vector<DeviceBuffer> hist, amax, scale, inv, hist2, scale2, inv2;
  std::vector<rt::HistoryBatchItem> items;
  for (const Tensor& t : ts) {
    for (auto* v : {&hist, &hist2}) v->emplace_back(t.history.size() * 4), v->back().upload(t.history.data(), t.history.size() * 4);
    for (auto* v : {&scale, &scale2}) v->emplace_back(4), v->back().upload(&t.scale, 4);
    for (auto* v : {&amax, &inv, &inv2}) v->emplace_back(4);
    rt::HistoryBatchItem it;
    it.mode = t.mode;
    it.format = t.format;
    it.history = rt::testing::view_of(hist.back());
    it.amax = rt::testing::view_of(amax.back());
    it.scale = rt::testing::view_of(scale.back());
    it.scale_inv = rt::testing::view_of(inv.back());
    items.push_back(it);
  }
  const rt::HistoryBatch batch(items);
  EXPECT_EQ(batch.size(), n);
  EXPECT_EQ(batch.launches(), 2);
  rt::Stream stream;
  DeviceBuffer noop(4);
  const float special[] = {0.0f, INFINITY, NAN, 1e-30f, 1e30f};
  for (int step = 0; step < 7; ++step) {
    const bool skip = step == 3;  // a noop step: nothing moves
    const float flag = skip ? 1.0f : 0.0f;
    noop.upload(&flag, 4);
    for (size_t i = 0; i < n; ++i) {
      const float a = (step + int(i)) % 4 == 0 ? special[(step + i) % 5] : float(rng() % 5000) / 13.0f;
      amax[i].upload(&a, 4);
      if (!skip) ref::update_amax_history(ts[i].history, a, ts[i].scale, ts[i].mode, ts[i].format);
      if (!skip) {  // the per-tensor kernel on its own copies
        rt::HistoryCall call;
        call.history = rt::testing::view_of(hist2[i]);
        call.amax = rt::testing::view_of(amax[i]);
        call.scale = rt::testing::view_of(scale2[i]);
        call.scale_inv = rt::testing::view_of(inv2[i]);
        rt::update_amax_history(ts[i].mode, ts[i].format, call, stream.get());
      }
    }
    batch.run(noop.address(), stream.get());
    stream.synchronize();
    for (size_t i = 0; i < n; ++i) {
      const std::vector<float> got = hist[i].download_as<float>(), per = hist2[i].download_as<float>();
      float s = 0, si = 0, s2 = 0;
      scale[i].download(&s, 4);
      inv[i].download(&si, 4);
      scale2[i].download(&s2, 4);
      ASSERT_EQ(0, std::memcmp(got.data(), ts[i].history.data(), got.size() * 4)) << "entry " << i << " step " << step;
      ASSERT_EQ(0, std::memcmp(got.data(), per.data(), got.size() * 4)) << "entry " << i << " step " << step;
      ASSERT_EQ(f32_bits(s), f32_bits(ts[i].scale)) << "entry " << i << " step " << step;
      ASSERT_EQ(f32_bits(s), f32_bits(s2)) << "entry " << i << " step " << step;
      ASSERT_EQ(f32_bits(si), f32_bits(1.0f / ts[i].scale)) << "entry " << i << " step " << step;
    }
  }
}

}  // namespace
