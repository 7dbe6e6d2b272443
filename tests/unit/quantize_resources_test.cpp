// Register spills of the shipped quantize kernels (no GPU: ptxas through NVRTC, sm_90a, bf16
// input): every kernel of every shipped recipe x role x usage spills no more than the budget
// listed here, and kernels not listed spill nothing. A kernel change that adds spills, or a
// new plan that spills, fails here and is either fixed or listed with the measurement that
// justifies it (docs/quantize.md, "Register spills"; `qforge inspect --resources` prints the figures).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "compiler/codegen.h"
#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "runtime/nvrtc.h"
#include "shipped_plans.h"

namespace {

using namespace qf;

// Spill-store bytes allowed per "recipe role usage kernel", as measured on 2026-11-27 (NVRTC
// 13.0). The launch bounds that cause them are measured choices (docs/quantize.md);
// `qforge tune --search registers` times the default tile with more registers (min_blocks). The
// 128x128 blockwise weight's training kernel (158 B at 64 registers) takes 80 since 3491edf.
const std::map<std::string, int>& spill_budget() {
  static const std::map<std::string, int> m = [] {
    std::map<std::string, int> b;
    b["float8_block_scaling linear:weight inference cast_kernel"] = 124;
    // 158 B before the packed 16-bit block amaxes (b83de94), timed faster with them: 631 -> 603 us
    // at 16384^2 on an H200 (bench/results/h200/packed_amax_ab_2026-11-29.md).
    b["nvfp4 linear:weight training cast_kernel"] = 290;
    b["hybrid_mxfp8_fwd_nvfp4_bwd linear:weight training cast_kernel"] = 130;
    // The H200 tiles of 2026-11-29 (compiler/passes/select_tiles.cpp): 32 x 512 for the
    // transposing per-channel plans at 80 registers, 32 x 256 on 128 threads for MXFP8's
    // same-layout copy at 64, 32 x 512 for NVFP4 rowwise at 64. Timed with these spills by
    // `qforge tune` (bench/results/h200/tune_16384_2026-11-29.txt), each faster than the tile
    // before it without them: int8_weight_sr weight 1183 -> 1076 (74 / 88), mxfp8 331 -> 296
    // (40), nvfp4 input inference 423 -> 333 (0). (fp8_rowwise training, 224 / 194 B on 32 x 512,
    // casts 128 x 128 tiles from registers since and spills nothing.)
    b["int8_weight_sr linear:weight training cast_kernel"] = 310;
    b["int8_weight_sr linear:weight training fused_kernel"] = 224;
    // Its programs for interior tiles only (the README's timed kernels at 16384^2) at 80 registers.
    b["int8_weight_sr linear:weight training cast_kernel interior"] = 4;
    b["int8_weight_sr linear:weight training fused_kernel interior"] = 4;
    b["nvfp4 linear:input inference cast_kernel"] = 144;
    b["nvfp4 linear:input inference fused_kernel"] = 176;
    // Edge tiles in compact loops (2026-11-29, cast_load.cuh load_tile): the training input's
    // one-launch kernel (small tensors only) at its 64 registers.
    b["nvfp4 linear:input training fused_kernel"] = 4;
    for (const char* role : {"linear:input", "linear:weight", "linear:grad_output"}) {
      b[std::string("mxfp8 ") + role + " training cast_kernel"] = 124;
      b[std::string("delayed_scaling ") + role + " inference cast_kernel"] = 4;
      b[std::string("delayed_scaling ") + role + " inference fused_kernel"] = 4;
    }
    // Per-tensor pairs on 128 x 128 tiles (2026-11-30, select_tiles.cpp known_scale_pair): current
    // scaling's program for any tiles at 80 registers (its program for interior tiles, which
    // whole-tile shapes take, spills nothing). Timed with them at 16320^2 (edge tiles): 426.8 ->
    // 428.5 us against 32 x 512 tiles; 16384^2 410.0 -> 401.7 us
    // (bench/results/h200/tensor_pairs_ab_2026-11-30.md).
    for (const char* role : {"linear:input", "linear:weight", "linear:grad_output"})
      b[std::string("current_scaling ") + role + " training cast_kernel"] = 24;
    b["w8a8_int8_inference linear:input inference fused_kernel"] = 6;
    b["w8a8_int8_inference linear:weight inference fused_kernel"] = 6;
    return b;
  }();
  return m;
}

class QuantizeResources : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizeResources, SpillsWithinTheListedBudget) {
  int kernels = 0;
  for (const qf::testing::ShippedPlan& sp : qf::testing::shipped_plans(qf::testing::kLinearRoles, false, {DType::BF16}, GetParam())) {
    const Plan& p = sp.plan;
    if (p.streams.empty()) continue;
    // Every kernel (the separate form's have the same code), in the programs for any tiles and
    // for interior tiles only (whose shared memory and register targets may differ: codegen.cpp, register_pair).
    for (const Tiles tiles : {Tiles::Any, Tiles::Interior}) {
      const KernelSource ks = emit_quantize(p, complete_form(p), tiles);
      std::vector<std::string> names;
      for (const auto& kernel : ks.kernels()) names.push_back(*kernel.name);
      const rt::CompileResult c =
          rt::compile_cuda(rt::CompileRequest{ks.source, "qforge_kernel.cu", names, "sm_90a", {"--ptxas-options=-v"}});
      const std::vector<rt::KernelResources> res = rt::ptxas_resources(c.log);
      ASSERT_EQ(res.size(), names.size()) << c.log;
      for (const rt::KernelResources& k : res) {
        std::string kind;
        for (const auto& kernel : ks.kernels())
          if (c.lowered_names.at(*kernel.name) == k.entry) kind = kernel.kind;
        ASSERT_FALSE(kind.empty()) << k.entry;
        const std::string key = sp.label() + " " + kind + (tiles == Tiles::Interior ? " interior" : "");
        EXPECT_GT(k.registers, 0) << key;
        const auto it = spill_budget().find(key);
        EXPECT_LE(k.spill_store_bytes, it == spill_budget().end() ? 0 : it->second)
            << key << ": " << k.registers << " registers, " << k.spill_store_bytes << " B spill stores";
        ++kernels;
      }
    }
  }
  EXPECT_GT(kernels, 0);
}

INSTANTIATE_TEST_SUITE_P(Shipped, QuantizeResources, ::testing::ValuesIn(qf::testing::shipped_recipe_names()));

// The parser itself, on a ptxas report of two kernels.
TEST(PtxasResources, ParsesEachEntryInOrder) {
  const std::string log =
      "ptxas info    : Compiling entry function '_Z1av' for 'sm_90a'\n"
      "ptxas info    : Function properties for _Z1av\n"
      "    128 bytes stack frame, 158 bytes spill stores, 68 bytes spill loads\n"
      "ptxas info    : Used 64 registers, used 1 barriers, 128 bytes cumulative stack size\n"
      "ptxas info    : Compiling entry function '_Z1bv' for 'sm_90a'\n"
      "ptxas info    : Function properties for _Z1bv\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 96 registers, used 1 barriers\n";
  const auto r = rt::ptxas_resources(log);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].entry, "_Z1av");
  EXPECT_EQ(r[0].registers, 64);
  EXPECT_EQ(r[0].stack_bytes, 128);
  EXPECT_EQ(r[0].spill_store_bytes, 158);
  EXPECT_EQ(r[0].spill_load_bytes, 68);
  EXPECT_EQ(r[1].entry, "_Z1bv");
  EXPECT_EQ(r[1].registers, 96);
  EXPECT_EQ(r[1].spill_store_bytes, 0);
  EXPECT_TRUE(rt::ptxas_resources("").empty());
}

}  // namespace
