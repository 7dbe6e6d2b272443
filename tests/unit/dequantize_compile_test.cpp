// The JIT dequantize kernels compile under NVRTC for every stream of every shipped recipe's
// standard roles and usages and every output dtype, without a GPU: the GPU suites check their
// values, but a template change that breaks the kernel would otherwise surface only there. Also
// the run-time geometry the kernels take for a same-layout columnwise copy (whose transpose the
// dequant_transpose GEMM route writes): the data layout's extent, blocks along M. And the
// argument checks a call makes before any device work (their messages, built only on failure).
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "compiler/error.h"
#include "error_of.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "runtime/dequantize.h"
#include "shipped_plans.h"

namespace {

using namespace qf;

TEST(DequantizeKernels, CompileForEveryShippedStreamWithoutAGpu) {
  rt::CacheOptions opts;
  opts.disabled = true;  // memory only
  rt::KernelCache cache(opts);
  std::set<std::tuple<int, int, int, int>> kinds;  // (format, scale storage, identity dtype, out)
  int compiled = 0;
  for (const qf::testing::ShippedPlan& sp : qf::testing::shipped_plans(qf::testing::kLinearRoles))
    for (const Stream& s : sp.plan.streams)
      for (DType out : {DType::FP32, DType::BF16, DType::FP16}) {
        const auto key = std::make_tuple(int(s.format), int(traits(s.scaling).scale_storage), int(s.out_dtype), int(out));
        if (!kinds.insert(key).second) continue;
        const rt::QuantizeKernels k = rt::build_dequantize_kernel(s, out, "sm_90a", cache);
        EXPECT_FALSE(k.cached.entry->image.empty()) << sp.label();
        ++compiled;
      }
  EXPECT_GE(compiled, 12);  // e4m3 / e5m2 / e2m1 / int8 / identity streams, three output dtypes
}

TEST(DequantizeKernels, SameLayoutColumnwiseGeometry) {
  const Recipe r = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/mxfp8.json");
  const Plan plan = compile_plan(r, PlanRequest{"linear:weight", DType::BF16, Usage::Training, false});
  const Stream* col = nullptr;
  for (const Stream& s : plan.streams)
    if (s.dir == Direction::Columnwise) col = &s;
  ASSERT_NE(col, nullptr);
  ASSERT_EQ(col->layout, DataLayout::RowMajor);  // "layout": "same"
  const DequantizeArgs a = rt::dequantize_geometry(*col, Shape2D{256, 512});
  EXPECT_EQ(a.rows, 256);  // the data keeps the input's [M, K]
  EXPECT_EQ(a.cols, 512);
  EXPECT_EQ(a.block_rows, 32);  // one e8m0 scale per 32 elements along M
  EXPECT_EQ(a.block_cols, 1);
  EXPECT_EQ(a.transposed_out, 0);  // set per call (DequantizeCall::transposed_out)
}

// Each too-small buffer is named with the shape it was sized for (the text is built only when the
// check fails; the checks run before any device work, so no GPU is needed).
TEST(DequantizeArguments, TooSmallBuffersNameWhatTheyHold) {
  const Recipe r = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/mxfp8.json");
  const Plan plan = compile_plan(r, PlanRequest{"linear:input", DType::BF16, Usage::Training, false});
  const Stream& s = plan.streams[0];
  ASSERT_EQ(s.dir, Direction::Rowwise);
  const Shape2D in{128, 256};
  const rt::TensorView big{0x100000, 1 << 20, std::nullopt, {}}, tiny{0x800000, 16, std::nullopt, {}};
  auto run = [&](rt::TensorView data, rt::TensorView scale, rt::TensorView out) {
    rt::DequantizeCall call;
    call.data = data;
    call.scale = scale;
    call.out = out;
    return qf::testing::error_of([&] { rt::dequantize(s, in, call, DType::BF16, nullptr); });
  };
  const rt::TensorView out_big{0x300000, 1 << 20, std::nullopt, {}};
  const rt::TensorView scale_big{0x200000, 1 << 16, std::nullopt, {}};
  const std::string data_err = run(tiny, scale_big, out_big);
  EXPECT_NE(data_err.find("data"), std::string::npos) << data_err;
  EXPECT_NE(data_err.find("for the rowwise data of input [128, 256]"), std::string::npos) << data_err;
  const std::string scale_err = run(big, tiny, out_big);
  EXPECT_NE(scale_err.find("scale"), std::string::npos) << scale_err;
  EXPECT_NE(scale_err.find("for the rowwise scales of input [128, 256]"), std::string::npos) << scale_err;
  const std::string out_err = run(big, scale_big, tiny);
  EXPECT_NE(out_err.find("out"), std::string::npos) << out_err;
  EXPECT_NE(out_err.find("for the dequantized [128, 256]"), std::string::npos) << out_err;
}

}  // namespace
