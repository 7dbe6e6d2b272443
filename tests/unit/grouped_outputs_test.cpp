// The runtime's grouped output sizes (rt::Quantizer::grouped_outputs, which frameworks and the CLI
// allocate and validate grouped buffers with) equal the CPU reference's (ref::quantize_grouped) for
// every shipped recipe, role and usage, with empty members among the splits: an empty member has
// its per-tensor scale and amax and a columnwise per-channel stream's K entries, and nothing else.
// CPU only (no kernel is built).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "reference/executor.h"
#include "runtime/quantizer.h"
#include "shipped_plans.h"

namespace {

using namespace qf;

TEST(GroupedOutputs, RuntimeSizesEqualTheReferences) {
  const std::vector<int64_t> splits = {48, 0, 16, 0};
  const int64_t k = 128;
  int plans = 0;
  for (const qf::testing::ShippedPlan& sp : qf::testing::shipped_plans(qf::testing::kGroupedRoles, true)) {
    const Plan& plan = sp.plan;
    SCOPED_TRACE(sp.label());
    ref::HostTensor x;
    x.dtype = DType::BF16;
    x.shape = {64, k};
    x.bytes.assign(size_t(64 * k * 2), 0x3F);
    ref::QuantizeParams params;
    for (const auto& in : input_buffers(plan)) params.scales[in.name] = 2.0f;  // delayed scaling's scales
    const std::vector<ref::Output> want = ref::quantize_grouped(plan, x, splits, params);
    const std::vector<BufferDesc> got = rt::Quantizer(plan).grouped_outputs(splits, k);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].name, want[i].desc.name);
      EXPECT_EQ(got[i].bytes, int64_t(want[i].bytes.size())) << got[i].name;
    }
    ++plans;
  }
  EXPECT_GT(plans, 20);
}

}  // namespace
