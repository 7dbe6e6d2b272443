// Compile-side tests of the grouped GEMM (no GPU needed, run in CI):
//   * every kernel variant NVRTC-compiles for sm_90a, and ptxas reports no spills, no stack
//     frame and that setmaxnreg was honoured (its resource report, via --ptxas-options=-v);
//   * the emitted source is a thin config over gemm.cuh and depends only on the spec;
//   * spec validation names the offending field; tile resolution fits shared memory;
//   * the runtime's argument checks name the argument (they run before any driver call);
//   * the CPU reference and the exact-value problems agree with hand-computed results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compiler/error.h"
#include "compiler/gemm_codegen.h"
#include "qforge/gemm.cuh"
#include "reference/gemm.h"
#include "reference/gemm_problem.h"
#include "runtime/gemm.h"
#include "runtime/nvrtc.h"

namespace {

using namespace qf;

struct Variant {
  std::string name;
  GemmSpec spec;
};

GemmSpec make(GemmScaling s, ElemFormat a, ElemFormat b, DType out, bool acc, bool fast, int bn, int mc, int bm = 128,
              int64_t n = 4096, int64_t k = 7168) {
  GemmSpec g;
  g.scaling = s, g.a_format = a, g.b_format = b, g.out_dtype = out, g.accumulate = acc, g.fast_accum = fast;
  g.n = n, g.k = k;
  g.tile.block_n = bn, g.tile.multicast = mc, g.tile.block_m = bm;
  return g;
}

GemmSpec ordered(GemmSpec s, int o) {
  s.tile.ordered = o;
  return s;
}

GemmSpec stages(GemmSpec s, int n) {
  s.tile.stages = n;
  return s;
}

// Blockwise 1D scale grids stored mn_major (M-grouped: A's per group; K-grouped: both operands').
GemmSpec mn_major(GemmSpec s) {
  s.scale_layout = ScaleLayout::MnMajor;
  return s;
}

// Identity operands as fp16 (the default is bf16).
GemmSpec fp16(GemmSpec s) {
  s.operand_dtype = DType::FP16;
  return s;
}

std::vector<uint8_t> fp32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// K-grouped (wgrad): D[g] [m, n] over each group's tokens.
GemmSpec k_grouped(GemmSpec s, int64_t m) {
  s.layout = GemmLayout::KGrouped, s.m = m, s.k = 0;
  return s;
}
// The same over per-member copies.
GemmSpec members(GemmSpec s, int64_t m) {
  s = k_grouped(s, m);
  s.layout = GemmLayout::KGroupedMembers;
  return s;
}

// Runs `call` and expects a UserError whose message contains `what`; with `what` empty, an
// error from past the argument checks: the driver's (no GPU), or, on a GPU machine, the device
// pointer check, which runs after every other check and rejects the tests' fake addresses.
// A fake device buffer for the argument checks (every size check happens before the driver is touched).
rt::TensorView buf(uint64_t addr, int64_t bytes) { return rt::TensorView{addr, bytes, std::nullopt, {}}; }

void expect_run_error(const rt::Gemm& gemm, const rt::GemmCall& call, const std::string& what) {
  try {
    gemm.run(call, nullptr);
    FAIL() << "no error: " << what;
  } catch (const UserError& e) {
    const std::string msg = e.what();
    const std::string want = what.empty() ? "is not CUDA memory" : what;
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  } catch (const std::exception& e) {
    EXPECT_TRUE(what.empty()) << e.what();
  }
}

std::vector<Variant> variants() {
  using S = GemmScaling;
  const auto E4 = ElemFormat::E4M3, E5 = ElemFormat::E5M2, F4 = ElemFormat::E2M1, I8 = ElemFormat::Int8;
  const auto Id = ElemFormat::Identity;
  return {
      {"block_e4m3_bf16", make(S::Block128, E4, E4, DType::BF16, false, false, 128, 1)},
      {"block_e4m3_bf16_mc2", make(S::Block128, E4, E4, DType::BF16, false, false, 128, 2)},
      {"block_e4m3_e5m2_fp32_acc", make(S::Block128, E4, E5, DType::FP32, true, false, 128, 1)},
      {"block_e5m2_e4m3_bn64_bm64", make(S::Block128, E5, E4, DType::BF16, false, false, 64, 1, 64)},
      {"tensor_promote_bf16", make(S::PerTensor, E4, E4, DType::BF16, false, false, 128, 1)},
      {"tensor_fast_bn256_mc2", make(S::PerTensor, E4, E4, DType::BF16, false, true, 256, 2)},
      {"tensor_fast_e5m2_fp32_acc_bn192", make(S::PerTensor, E5, E5, DType::FP32, true, true, 192, 1, 128, 3072, 2048)},
      {"rowwise_promote_bf16", make(S::RowChannel, E4, E4, DType::BF16, false, false, 128, 1)},
      {"rowwise_fast_bn256", make(S::RowChannel, E4, E4, DType::BF16, false, true, 256, 1)},
      {"rowwise_fast_fp32_mc2_odd_k", make(S::RowChannel, E4, E5, DType::FP32, false, true, 128, 2, 128, 512, 400)},
      {"block_unordered", ordered(make(S::Block128, E4, E4, DType::BF16, false, false, 128, 1), 1)},
      {"block_mn_major_bf16", mn_major(make(S::Block128, E4, E4, DType::BF16, false, false, 128, 1))},
      {"block_mn_major_e4m3_e5m2_fp32_acc", mn_major(make(S::Block128, E4, E5, DType::FP32, true, false, 128, 1))},
      {"block_mn_major_bn64_bm64", mn_major(make(S::Block128, E5, E4, DType::BF16, false, false, 64, 1, 64))},
      {"block_mn_major_mc2", mn_major(make(S::Block128, E4, E4, DType::BF16, false, false, 128, 2))},
      {"tensor_fast_ordered_bn256", ordered(make(S::PerTensor, E4, E4, DType::BF16, false, true, 256, 1), 2)},
      {"mxfp8_e4m3_bf16", make(S::Mx32, E4, E4, DType::BF16, false, false, 128, 1)},
      {"mxfp8_e5m2_e4m3_fp32_acc_mc2", make(S::Mx32, E5, E4, DType::FP32, true, false, 128, 2)},
      {"mxfp8_bm64_bn64", make(S::Mx32, E4, E4, DType::BF16, false, false, 64, 1, 64)},
      {"nvfp4_bf16", make(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 1)},
      {"nvfp4_fp32_acc_k2048", make(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 1, 128, 7168, 2048)},
      {"nvfp4_bf16_two_stages", stages(make(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 1), 2)},
      {"kgrouped_tensor_bf16", k_grouped(make(S::PerTensor, E4, E4, DType::BF16, false, false, 128, 1), 4096)},
      {"kgrouped_tensor_fast_fp32_acc", k_grouped(make(S::PerTensor, E4, E5, DType::FP32, true, true, 128, 1), 2048)},
      {"kgrouped_tensor_bm64_bn256_fast", k_grouped(make(S::PerTensor, E5, E4, DType::BF16, false, true, 256, 1, 64), 1000)},
      {"kgrouped_block_bf16", k_grouped(make(S::Block128, E4, E4, DType::BF16, false, false, 128, 1), 4096)},
      {"kgrouped_block_fp32_acc_bn64", k_grouped(make(S::Block128, E4, E5, DType::FP32, true, false, 64, 1), 2048)},
      {"kgrouped_block_bm64", k_grouped(make(S::Block128, E5, E4, DType::BF16, false, false, 128, 1, 64), 1000)},
      {"kgrouped_block_mn_major_fp32_acc", mn_major(k_grouped(make(S::Block128, E4, E4, DType::FP32, true, false, 128, 1), 4096))},
      {"members_block_mn_major_fp32_acc", mn_major(members(make(S::Block128, E4, E4, DType::FP32, true, false, 128, 1), 4096))},
      {"kgrouped_mxfp8_bf16", k_grouped(make(S::Mx32, E4, E4, DType::BF16, false, false, 128, 1), 4096)},
      {"kgrouped_mxfp8_fp32_acc_bm64", k_grouped(make(S::Mx32, E4, E4, DType::FP32, true, false, 128, 1, 64), 2048)},
      {"kgrouped_nvfp4_bf16", k_grouped(make(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 1), 4096)},
      {"kgrouped_nvfp4_fp32_acc", k_grouped(make(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 1), 2048)},
      // Per-member operands (the grouped quantizer's transposed copies): tensor maps built on the device.
      {"members_tensor_bf16", members(make(S::PerTensor, E4, E4, DType::BF16, false, false, 128, 1), 4096)},
      {"members_tensor_fast_fp32_acc", members(make(S::PerTensor, E4, E5, DType::FP32, true, true, 128, 1), 2048)},
      {"members_block_bf16", members(make(S::Block128, E4, E4, DType::BF16, false, false, 128, 1), 4096)},
      {"members_block_fp32_acc_bm64", members(make(S::Block128, E5, E4, DType::FP32, true, false, 128, 1, 64), 1000)},
      {"members_mxfp8_bf16", members(make(S::Mx32, E4, E4, DType::BF16, false, false, 128, 1), 4096)},
      {"mxfp8_mn_major_bf16", mn_major(make(S::Mx32, E4, E4, DType::BF16, false, false, 128, 1))},
      {"mxfp8_mn_major_fp32_acc_mc2", mn_major(make(S::Mx32, E5, E4, DType::FP32, true, false, 128, 2))},
      {"mxfp8_mn_major_bm64_bn64", mn_major(make(S::Mx32, E4, E4, DType::BF16, false, false, 64, 1, 64))},
      {"kgrouped_mxfp8_mn_major_fp32_acc", mn_major(k_grouped(make(S::Mx32, E4, E4, DType::FP32, true, false, 128, 1), 4096))},
      {"members_mxfp8_mn_major_bf16", mn_major(members(make(S::Mx32, E4, E4, DType::BF16, false, false, 128, 1), 4096))},
      {"members_mxfp8_fp32_acc_bm64", members(make(S::Mx32, E4, E4, DType::FP32, true, false, 128, 1, 64), 2048)},
      {"members_nvfp4_bf16", members(make(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 1), 4096)},
      {"members_nvfp4_fp32_acc", members(make(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 1), 2048)},
      // int8 x int8 (s32 MMAs): unpromoted per-tensor / per-channel, promoted blockwise, K-grouped
      // (promoted: a group's token count is run-time data), and K >= 2^17 (promoted).
      {"int8_rowwise_bf16", make(S::RowChannel, I8, I8, DType::BF16, false, false, 0, 1)},
      {"int8_rowwise_fp32_acc_mc2", make(S::RowChannel, I8, I8, DType::FP32, true, false, 128, 2)},
      {"int8_tensor_bm64_bn64", make(S::PerTensor, I8, I8, DType::BF16, false, false, 64, 1, 64)},
      {"int8_tensor_long_k", make(S::PerTensor, I8, I8, DType::BF16, false, false, 0, 1, 128, 4096, 1 << 17)},
      {"int8_rowwise_long_k_fp32", make(S::RowChannel, I8, I8, DType::FP32, false, false, 0, 1, 128, 4096, 1 << 17)},
      {"int8_rowwise_ordered", ordered(make(S::RowChannel, I8, I8, DType::BF16, false, false, 128, 1), 2)},
      {"int8_block_bf16", make(S::Block128, I8, I8, DType::BF16, false, false, 128, 1)},
      {"kgrouped_rowwise_bf16", k_grouped(make(S::RowChannel, E4, E4, DType::BF16, false, false, 128, 1), 4096)},
      {"kgrouped_rowwise_fast_fp32_acc", k_grouped(make(S::RowChannel, E4, E5, DType::FP32, true, true, 256, 1), 2048)},
      {"members_rowwise_bf16", members(make(S::RowChannel, E4, E4, DType::BF16, false, false, 128, 1), 4096)},
      {"kgrouped_int8_rowwise_bf16", k_grouped(make(S::RowChannel, I8, I8, DType::BF16, false, false, 128, 1), 4096)},
      {"kgrouped_int8_tensor_fp32_acc", k_grouped(make(S::PerTensor, I8, I8, DType::FP32, true, false, 128, 1), 2048)},
      {"kgrouped_int8_block_bf16", k_grouped(make(S::Block128, I8, I8, DType::BF16, false, false, 128, 1), 4096)},
      {"members_int8_block_bf16", members(make(S::Block128, I8, I8, DType::BF16, false, false, 128, 1), 4096)},
      // bf16 / fp16 operands (the identity copies; 64 of K per stage, m64nNk16 MMAs, no scales).
      {"bf16_default", make(S::None, Id, Id, DType::BF16, false, false, 0, 1)},
      {"fp16_fp32_acc_mc2", fp16(make(S::None, Id, Id, DType::FP32, true, false, 128, 2))},
      {"bf16_bm64_bn192_odd_k", make(S::None, Id, Id, DType::BF16, false, false, 192, 1, 64, 3072, 400)},
      {"bf16_ordered", ordered(make(S::None, Id, Id, DType::BF16, false, false, 256, 1), 2)},
      {"kgrouped_bf16", k_grouped(make(S::None, Id, Id, DType::BF16, false, false, 0, 1), 4096)},
      {"kgrouped_fp16_fp32_acc_bm64", k_grouped(fp16(make(S::None, Id, Id, DType::FP32, true, false, 128, 1, 64)), 1000)},
      {"members_bf16", members(make(S::None, Id, Id, DType::BF16, false, false, 0, 1), 4096)},
      // Weight-only int8 (bf16 / fp16 x int8, B converted by the producer warpgroup).
      {"channel_bf16_default", make(S::Channel, Id, I8, DType::BF16, false, false, 0, 1)},
      {"channel_fp16_fp32_acc", fp16(make(S::Channel, Id, I8, DType::FP32, true, false, 0, 1))},
      {"channel_bn128", make(S::Channel, Id, I8, DType::BF16, false, false, 128, 1)},
      {"channel_bn192_fp16_fp32", fp16(make(S::Channel, Id, I8, DType::FP32, false, false, 192, 1))},
      {"channel_bm64_bn64_odd_k", make(S::Channel, Id, I8, DType::BF16, false, false, 64, 1, 64, 3072, 400)},
  };
}

class GemmCompile : public ::testing::TestWithParam<Variant> {};

TEST_P(GemmCompile, NvrtcSm90aNoSpills) {
  const GemmSource src = emit_gemm(GetParam().spec);
  EXPECT_LE(src.smem_bytes, kGemmSmemLimit);
  rt::CompileRequest req{src.source, "gemm.cu", {src.kernel}, "sm_90a", {"--ptxas-options=-v"}};
  const rt::CompileResult r = rt::compile_cuda(req);
  ASSERT_FALSE(r.image.empty());
  // ptxas: "N bytes stack frame, N bytes spill stores, N bytes spill loads" (rt::ptxas_resources).
  const std::vector<rt::KernelResources> res = rt::ptxas_resources(r.log);
  ASSERT_FALSE(res.empty()) << r.log;
  EXPECT_EQ(res[0].stack_bytes, 0) << "stack frame: " << r.log;
  EXPECT_EQ(res[0].spill_store_bytes, 0) << "spill stores: " << r.log;
  EXPECT_EQ(res[0].spill_load_bytes, 0) << "spill loads: " << r.log;
  // Warnings that mean the kernel is slower than written: setmaxnreg ignored (C7508), wgmma
  // serialized (C7510, C7515, ...).
  EXPECT_EQ(r.log.find("C7508"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("wgmma.mma_async instructions are serialized"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("warning"), std::string::npos) << r.log;
}

INSTANTIATE_TEST_SUITE_P(Variants, GemmCompile, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) { return i.param.name; });

TEST(GemmCodegen, ThinConfigOverTheHeader) {
  const GemmSource src = emit_gemm(make(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E5M2, DType::BF16, false,
                                        false, 128, 0));
  EXPECT_NE(src.source.find("#include \"qforge/gemm.cuh\""), std::string::npos);
  EXPECT_NE(src.source.find("using BFormat = qf::E5M2;"), std::string::npos);
  EXPECT_NE(src.source.find("using Scaling = qf::gemm::Block128Scaling;"), std::string::npos);
  EXPECT_NE(src.source.find("static constexpr long long kK = 7168;"), std::string::npos);
  EXPECT_EQ(src.source.find("asm"), std::string::npos) << "device code belongs in the headers";
  EXPECT_EQ(src.kernel, "qf::gemm_kernel<qf_gen::GemmCfg>");
  EXPECT_EQ(src.threads, 384);
  EXPECT_EQ(src.tile.stages, 5);  // 5 x 32 KiB stages + bf16 staging fit in 227 KiB
  EXPECT_EQ(src.tile.ordered, 1);  // blockwise: unordered issue (measured faster)
  EXPECT_NE(src.source.find("static constexpr bool kOrderedIssue = false;"), std::string::npos);
  EXPECT_EQ(src.smem_bytes, gemm_smem(128, 128, 5, 2, kGemmBlock128, false, 2).total);
  // Same spec, same source; a different N, a different source.
  GemmSpec s2 = make(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E5M2, DType::BF16, false, false, 128, 0);
  EXPECT_EQ(emit_gemm(s2).source, src.source);
  s2.n = 2048;
  EXPECT_NE(emit_gemm(s2).source, src.source);
}

TEST(GemmCodegen, DefaultTiles) {
  // Promotion: 128 x 128, 5 stages (4 for per-tensor and rowwise promotion), unordered issue;
  // without: 128 x 256 (N >= 512), 3 stages. Raster bands of 16 m-blocks, 4 for blockwise.
  const GemmTile b = resolve_tile(make(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false,
                                       false, 0, 0));
  EXPECT_EQ(b, (GemmTile{128, 128, 5, 1, 4, 1}));
  const GemmTile r = resolve_tile(make(GemmScaling::RowChannel, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false,
                                       false, 0, 0));
  EXPECT_EQ(r, (GemmTile{128, 128, 4, 1, 16, 1}));
  const GemmTile tp = resolve_tile(make(GemmScaling::PerTensor, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false,
                                        false, 0, 0));
  EXPECT_EQ(tp, (GemmTile{128, 128, 4, 1, 16, 1}));
  const GemmTile f = resolve_tile(make(GemmScaling::PerTensor, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false,
                                       true, 0, 0));
  EXPECT_EQ(f, (GemmTile{128, 256, 3, 1, 16, 1}));
  const GemmTile small = resolve_tile(make(GemmScaling::RowChannel, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32,
                                           false, true, 0, 0, 0, 256, 1024));
  EXPECT_EQ(small.block_n, 128);
}

TEST(GemmCodegen, StagesFillSharedMemory) {
  // The default depth is the deepest that fits, except for M-grouped per-tensor and rowwise
  // promotion with 128-row tiles: 4 (faster than 5 on an H100, docs/gemm.md).
  for (const auto& v : variants()) {
    const GemmTile t = resolve_tile(v.spec);
    GemmSpec more = v.spec;
    more.tile = t;
    more.tile.stages = t.stages + 1;
    EXPECT_GE(t.stages, v.spec.tile.stages != 0 ? 2 : 3) << v.name;
    const bool capped = v.spec.layout == GemmLayout::MGrouped && gemm_promotes(v.spec) && t.block_m == 128 &&
                        (v.spec.scaling == GemmScaling::PerTensor || v.spec.scaling == GemmScaling::RowChannel);
    if (capped && v.spec.tile.stages == 0) {
      EXPECT_LE(t.stages, 4) << v.name;
      if (t.stages < 4) {
        EXPECT_THROW(resolve_tile(more), UserError) << v.name;
      }
    } else if (t.stages < 8 && v.spec.tile.stages == 0) {
      EXPECT_THROW(resolve_tile(more), UserError) << v.name;
    }
  }
}

void expect_spec_error(GemmSpec s, const std::string& where, const std::string& what) {
  try {
    validate(s);
    FAIL() << "no error for " << where;
  } catch (const UserError& e) {
    EXPECT_EQ(e.where(), where) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(GemmCodegen, SpecErrorsNameTheField) {
  const GemmSpec ok = make(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false, false, 0, 0);
  GemmSpec s = ok;
  s.a_format = ElemFormat::E2M3;
  expect_spec_error(s, "a_format", "expected e4m3, e5m2 or int8 (e2m1 with nvfp4 scaling, bf16 / fp16 with none), got e2m3");
  s = ok, s.b_format = ElemFormat::Int8;
  expect_spec_error(s, "a_format", "int8 b_format takes int8 here too (s8 x s8 MMAs), got e4m3");
  s = ok, s.a_format = ElemFormat::Int8;
  expect_spec_error(s, "b_format", "int8 a_format takes int8 here too (s8 x s8 MMAs), got e4m3");
  s = ok, s.n = 100;
  expect_spec_error(s, "n", "multiple of 8");
  s = ok, s.k = 8;
  expect_spec_error(s, "k", "multiple of 16");
  s = ok, s.out_dtype = DType::FP16;
  expect_spec_error(s, "out_dtype", "expected bf16 or fp32, got fp16");
  s = ok, s.accumulate = true;
  expect_spec_error(s, "accumulate", "fp32 output");
  s = ok, s.fast_accum = true;
  expect_spec_error(s, "fast_accum", "blockwise scaling changes along K");
  s = ok, s.tile.block_n = 256;
  expect_spec_error(s, "tile.block_n", "block_n <= 128");
  s = ok, s.fast_accum = false, s.scaling = GemmScaling::PerTensor, s.tile.block_n = 96;
  expect_spec_error(s, "tile.block_n", "expected 64, 128, 192 or 256");
  s = ok, s.tile.block_m = 256;
  expect_spec_error(s, "tile.block_m", "expected 64 or 128");
  s = ok, s.n = 4096 + 128, s.tile.multicast = 2;
  expect_spec_error(s, "tile.multicast", "must be even");
  s = ok, s.tile.ordered = 3;
  expect_spec_error(s, "tile.ordered", "expected 1 (off) or 2 (on)");
  s = ok, s.tile.block_m = 64, s.tile.ordered = 2;
  expect_spec_error(s, "tile.ordered", "block_m 128");
  s = ok, s.tile.stages = 7;
  expect_spec_error(s, "tile.stages", "bytes of shared memory");
  s = ok, s.scaling = GemmScaling::Mx32, s.k = 7168 + 32;
  expect_spec_error(s, "k", "mxfp8 scaling reads the scales of 128 of K at once: expected a multiple of 128, got 7200");
  s = ok, s.scaling = GemmScaling::Mx32, s.fast_accum = true;
  expect_spec_error(s, "fast_accum", "every 32 of K is promoted");
  s = ok, s.scaling = GemmScaling::Mx32, s.tile.ordered = 2;
  expect_spec_error(s, "tile.ordered", "not supported");
  // mn_major scale grids: the blockwise and mxfp8 GEMMs only (M-grouped: A's per-group grids).
  s = ok, s.scaling = GemmScaling::Nvfp4, s.a_format = s.b_format = ElemFormat::E2M1, s.scale_layout = ScaleLayout::MnMajor;
  expect_spec_error(s, "scale_layout",
                    "blockwise and mxfp8 GEMMs only (1x128 / 1x32 rowwise and 128x1 / 32x1 columnwise copies); got nvfp4 scaling, m_grouped");
  {
    // MXFP8: A per group as blockwise, B per expert [K/32, N] (N is a multiple of 8: no padding).
    GemmSpec mx = ok;
    mx.scaling = GemmScaling::Mx32, mx.scale_layout = ScaleLayout::MnMajor;
    EXPECT_NO_THROW(validate(mx));
    EXPECT_EQ(gemm_scale_elems(mx, 1000, 8).a, (1000 + 3 * 8) * (mx.k / 32));
    EXPECT_EQ(gemm_scale_elems(mx, 1000, 8).b, 8 * mx.n * (mx.k / 32));
    EXPECT_NE(emit_gemm(mx).source.find("kScaleMnMajor = true"), std::string::npos);
    mx.scale_layout = ScaleLayout::Compact;
    EXPECT_EQ(gemm_scale_elems(mx, 1000, 8).a, 1000 * (mx.k / 32));
  }
  {
    // M-grouped: each group's A grid [ceil(K/128), rows rounded up to 4], so up to 3 rows more per group.
    GemmSpec mg = ok;
    mg.scale_layout = ScaleLayout::MnMajor;
    EXPECT_NO_THROW(validate(mg));
    const int64_t kb = (mg.k + 127) / 128;
    EXPECT_EQ(gemm_scale_elems(mg, 1000, 8).a, (1000 + 3 * 8) * kb);
    EXPECT_EQ(gemm_scale_elems(mg, 1000, 8).b, gemm_scale_elems(ok, 1000, 8).b);
    EXPECT_EQ(gemm_scale_elems(ok, 1000, 8).a, 1000 * kb);
    EXPECT_NE(emit_gemm(mg).source.find("kScaleMnMajor = true"), std::string::npos);
    EXPECT_NE(emit_gemm(ok).source.find("kScaleMnMajor = false"), std::string::npos);
  }
  s = ok, s.scale_layout = ScaleLayout::Swizzled;
  expect_spec_error(s, "scale_layout", "expected compact or mn_major, got swizzled");
  s = ok, s.scaling = GemmScaling::Nvfp4, s.a_format = s.b_format = ElemFormat::E2M1, s.layout = GemmLayout::KGrouped,
  s.m = 256, s.k = 0, s.scale_layout = ScaleLayout::MnMajor;
  expect_spec_error(s, "scale_layout", "got nvfp4 scaling, k_grouped layout");
  {
    // MXFP8 K-grouped: [32-token blocks, rows padded to 4].
    GemmSpec kg = ok;
    kg.scaling = GemmScaling::Mx32, kg.layout = GemmLayout::KGrouped, kg.m = 6, kg.n = 200, kg.k = 0;
    kg.scale_layout = ScaleLayout::MnMajor;
    EXPECT_NO_THROW(validate(kg));
    EXPECT_EQ(gemm_scale_elems(kg, 0, 3, 300).a, 8 * 10);
    EXPECT_EQ(gemm_scale_elems(kg, 0, 3, 300).b, 200 * 10);
  }
  {
    // [token blocks, rows padded to 4]: 6 rows take 8 entries per block; members add a block each.
    GemmSpec kg = ok;
    kg.layout = GemmLayout::KGrouped, kg.m = 6, kg.n = 200, kg.k = 0, kg.scale_layout = ScaleLayout::MnMajor;
    EXPECT_NO_THROW(validate(kg));
    EXPECT_EQ(gemm_scale_elems(kg, 0, 3, 300).a, 8 * 3);
    EXPECT_EQ(gemm_scale_elems(kg, 0, 3, 300).b, 200 * 3);
    EXPECT_EQ(describe(kg), "e4m3 x e4m3 blockwise (mn_major scales) k-grouped M=6 N=200 -> bf16");
    EXPECT_NE(emit_gemm(kg).source.find("kScaleMnMajor = true"), std::string::npos);
    kg.layout = GemmLayout::KGroupedMembers;
    EXPECT_EQ(gemm_scale_elems(kg, 0, 3, 300).a, 8 * (3 + 3));
    kg.scale_layout = ScaleLayout::Compact;
    EXPECT_EQ(gemm_scale_elems(kg, 0, 3, 300).a, 6 * (3 + 3));
  }
  // NVFP4: e2m1 operands only (and only there), block_n 128, no fast accumulation or multicast.
  s = ok, s.a_format = ElemFormat::E2M1;
  expect_spec_error(s, "a_format", "expected e4m3, e5m2 or int8 (e2m1 with nvfp4 scaling, bf16 / fp16 with none), got e2m1");
  // bf16 / fp16 (identity) operands: none scaling, both operands, no fast accumulation.
  s = ok, s.a_format = s.b_format = ElemFormat::Identity;
  expect_spec_error(s, "scaling", "bf16 / fp16 operands: expected none (or channel, with int8 weights as B), got blockwise");
  s = ok, s.scaling = GemmScaling::None;
  expect_spec_error(s, "a_format", "none scaling: expected bf16 or fp16 (both operands), got e4m3");
  s.a_format = ElemFormat::Identity;
  expect_spec_error(s, "b_format", "none scaling: expected bf16 or fp16 (both operands), got e4m3");
  s.b_format = ElemFormat::Identity, s.operand_dtype = DType::FP32;
  expect_spec_error(s, "operand_dtype", "expected bf16 or fp16, got fp32");
  s.operand_dtype = DType::BF16, s.fast_accum = true;
  expect_spec_error(s, "fast_accum", "accumulate in fp32");
  s.fast_accum = false;
  EXPECT_NO_THROW(validate(s));
  EXPECT_EQ(resolve_tile(s).block_n, 256);  // no promotion: one accumulator
  EXPECT_FALSE(gemm_promotes(s));
  EXPECT_EQ(gemm_row_bytes(s, s.a_format, 7168), 2 * 7168);
  EXPECT_EQ(describe(s), "bf16 x bf16 none N=4096 K=7168 -> bf16");
  // Weight-only int8 (channel): a 16-bit A, an int8 B, M-grouped; B's per-channel scales only.
  GemmSpec ch = make(GemmScaling::Channel, ElemFormat::Identity, ElemFormat::Int8, DType::BF16, false, false, 0, 0);
  EXPECT_NO_THROW(validate(ch));
  EXPECT_EQ(describe(ch), "bf16 x int8 channel N=4096 K=7168 -> bf16");
  EXPECT_EQ(gemm_row_bytes(ch, ch.b_format, 7168), 7168);
  EXPECT_EQ(gemm_scale_elems(ch, 100, 3).a, 0);
  EXPECT_EQ(gemm_scale_elems(ch, 100, 3).b, 3 * 4096);
  EXPECT_FALSE(gemm_a_scaled(ch));
  EXPECT_TRUE(gemm_b_scaled(ch));
  EXPECT_EQ(resolve_tile(ch).block_n, 256);
  EXPECT_EQ(resolve_tile(ch).stages, 4);  // B converted in place: 48 KiB per stage
  s = ch, s.a_format = ElemFormat::E4M3;
  expect_spec_error(s, "a_format", "channel scaling: expected bf16 or fp16 (unscaled activations), got e4m3");
  s = ch, s.b_format = ElemFormat::Identity;
  expect_spec_error(s, "b_format", "channel scaling: expected int8 (per-channel weights), got bf16");
  s = k_grouped(ch, 4096);
  expect_spec_error(s, "layout", "channel scaling (int8 weights x 16-bit activations) is an fprop / dgrad GEMM");
  s = ch, s.tile.multicast = 2;
  expect_spec_error(s, "tile.multicast", "channel: B is converted on chip by each CTA's producer warps: expected 1, got 2");
  s = ch, s.scaling = GemmScaling::None;
  expect_spec_error(s, "b_format", "none scaling: expected bf16 or fp16 (both operands), got int8");
  // Format names: bf16 / fp16 set the operand dtype, one dtype for both operands.
  GemmSpec h;
  set_gemm_formats(h, parse_gemm_format("fp16", "a"), parse_gemm_format("fp16", "b"), "b");
  // With none, B defaults to A's format; with channel to int8.
  EXPECT_EQ(default_gemm_format(GemmScaling::None, true, "fp16"), "fp16");
  EXPECT_EQ(default_gemm_format(GemmScaling::None, true), "bf16");
  EXPECT_EQ(default_gemm_format(GemmScaling::Channel, true, "fp16"), "int8");
  // ... and A to B's; an int8 operand makes the other int8 (s8 x s8), but channel's int8 weights.
  EXPECT_EQ(default_gemm_format(GemmScaling::None, false, "fp16"), "fp16");
  EXPECT_EQ(default_gemm_format(GemmScaling::PerTensor, true, "int8"), "int8");
  EXPECT_EQ(default_gemm_format(GemmScaling::RowChannel, false, "int8"), "int8");
  EXPECT_EQ(default_gemm_format(GemmScaling::PerTensor, true), "e4m3");
  EXPECT_EQ(default_gemm_format(GemmScaling::Channel, false, "int8"), "bf16");
  EXPECT_EQ(h.a_format, ElemFormat::Identity);
  EXPECT_EQ(h.operand_dtype, DType::FP16);
  try {
    set_gemm_formats(h, parse_gemm_format("bf16", "a"), parse_gemm_format("fp16", "b"), "b");
    ADD_FAILURE() << "bf16 x fp16 accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "b: a bf16 A takes a bf16 B (one MMA type), got fp16");
  }
  try {
    (void)parse_gemm_format("fp32", "--a-format");
    ADD_FAILURE() << "fp32 accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "--a-format: expected e4m3, e5m2, int8, e2m1 (nvfp4), bf16 or fp16, got \"fp32\"");
  }
  GemmSpec f4 = make(GemmScaling::Nvfp4, ElemFormat::E2M1, ElemFormat::E2M1, DType::BF16, false, false, 0, 0);
  EXPECT_NO_THROW(validate(f4));
  EXPECT_EQ(resolve_tile(f4).block_n, 128);
  EXPECT_EQ(resolve_tile(f4).ordered, 1);
  s = f4, s.b_format = ElemFormat::E4M3;
  expect_spec_error(s, "b_format", "nvfp4 scaling: expected e2m1, got e4m3");
  s = f4, s.fast_accum = true;
  expect_spec_error(s, "fast_accum", "no promotion to skip");
  s = f4, s.tile.block_n = 64;
  expect_spec_error(s, "tile.block_n", "nvfp4: expected 128");
  s = f4, s.tile.block_n = 256;  // not the promotion message: nvfp4 has no promotion
  expect_spec_error(s, "tile.block_n", "nvfp4: expected 128 (the B dequantization's work split), got 256");
  EXPECT_EQ(resolve_tile(f4).stages, 3);  // three fp16 B stages and six load slots fill the shared memory
  s = f4, s.tile.stages = 2;  // five load slots
  EXPECT_NO_THROW(validate(s));
  s = f4, s.tile.stages = 4;  // 4 x 32 KiB of fp16 B and at least 5 x 16 KiB of load slots
  expect_spec_error(s, "tile.stages", "4 stages need");
  // Load slots: stages + 3 where they fit, down to stages + 1.
  EXPECT_EQ(gemm_smem(128, 128, 3, 2, kGemmNvfp4, false, 2).load_slots, 6u);
  EXPECT_EQ(gemm_smem(128, 128, 3, 2, kGemmNvfp4, false, 4).load_slots, 5u);  // fp32 staging
  EXPECT_EQ(gemm_smem(128, 128, 2, 2, kGemmNvfp4, false, 2).load_slots, 5u);
  EXPECT_EQ(gemm_smem(128, 128, 4, 2, kGemmNvfp4, false, 2).load_slots, 5u);  // does not fit: the minimum
  EXPECT_EQ(gemm_smem(128, 128, 4, 2, kGemmBlock128, false, 2).load_slots, 4u);
  s = f4, s.out_dtype = DType::FP32;
  EXPECT_EQ(resolve_tile(s).stages, 3);
  // K-grouped (the tensor engine's smaller epilogue staging): 4 stages + 5 slots with bf16 out, 3 +
  // 6 with fp32; the members' tensor-map ring has one slot more than the load slots.
  s = k_grouped(f4, 256);
  s.tile = resolve_tile(s);
  EXPECT_EQ(s.tile.stages, 4);
  EXPECT_EQ(gemm_member_map_count(s), 6);
  s = members(f4, 256), s.out_dtype = DType::FP32;
  s.tile = resolve_tile(s);
  EXPECT_EQ(s.tile.stages, 3);
  EXPECT_EQ(gemm_member_map_count(s), 7);
  s = members(make(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false, false, 0, 0), 256);
  s.tile = resolve_tile(s);
  EXPECT_EQ(gemm_member_map_count(s), s.tile.stages + 1);
  EXPECT_NE(emit_gemm(f4).source.find("kPromote = false"), std::string::npos) << emit_gemm(f4).source;
  s = f4, s.tile.block_m = 64;
  expect_spec_error(s, "tile.block_m", "nvfp4: expected 128 (two consumer warpgroups");
  s = f4, s.tile.multicast = 2;
  expect_spec_error(s, "tile.multicast", "nvfp4: B is converted on chip by each CTA's producer warps: expected 1, got 2");
  s = f4, s.tile.ordered = 2;
  expect_spec_error(s, "tile.ordered", "not supported");
  s = f4, s.k = 7168 + 16;
  expect_spec_error(s, "k", "expected a multiple of 128, got 7184");
  // int8 x int8: tensor, rowwise or blockwise scaling; exact s32 sums, promoted only where the
  // scales change along K or a sum over all of K could overflow s32.
  const GemmSpec i8 = make(GemmScaling::RowChannel, ElemFormat::Int8, ElemFormat::Int8, DType::BF16, false, false, 0, 0);
  EXPECT_NO_THROW(validate(i8));
  EXPECT_FALSE(gemm_promotes(i8));
  EXPECT_EQ(resolve_tile(i8).block_n, 256);  // one accumulator: the wide tile of fp8 fast accumulation
  EXPECT_NE(emit_gemm(i8).source.find("using AFormat = qf::Int8;"), std::string::npos);
  s = i8, s.fast_accum = true;
  expect_spec_error(s, "fast_accum", "int8: the tensor cores' s32 sums are exact");
  s = i8, s.scaling = GemmScaling::Mx32, s.k = 7168;
  expect_spec_error(s, "scaling", "int8 operands: expected tensor, rowwise or blockwise (MX scales are for fp8), got mxfp8");
  s = i8, s.scaling = GemmScaling::Nvfp4;
  expect_spec_error(s, "a_format", "nvfp4 scaling: expected e2m1, got int8");
  s = i8, s.k = (int64_t(1) << 17) - 16;  // the largest K whose s32 sums cannot overflow
  EXPECT_FALSE(gemm_promotes(s));
  s.k += 16;
  EXPECT_TRUE(gemm_promotes(s));
  EXPECT_EQ(resolve_tile(s).block_n, 128);
  s = i8, s.scaling = GemmScaling::Block128;
  EXPECT_TRUE(gemm_promotes(s));
  s = k_grouped(i8, 1024), s.scaling = GemmScaling::PerTensor;
  EXPECT_TRUE(gemm_promotes(s));
  // K-grouped (wgrad).
  const GemmSpec kg = k_grouped(make(GemmScaling::PerTensor, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, true,
                                     false, 0, 0), 4096);
  EXPECT_NO_THROW(validate(kg));
  s = kg, s.scaling = GemmScaling::Block128;
  EXPECT_NO_THROW(validate(s));  // both operands 1x128 along the tokens
  EXPECT_NE(emit_gemm(s).source.find("using Scaling = qf::gemm::Block128KScaling;"), std::string::npos);
  // K-grouped kernels: unordered issue by default (their promotion overlaps the next step's MMAs),
  // and the epilogue's staging holds boxes of 64 x 128 bytes, 1024-byte aligned for the 128-byte
  // swizzle of the tensor stores.
  EXPECT_EQ(resolve_tile(s).ordered, 1);
  EXPECT_EQ(resolve_tile(kg).ordered, 1);
  for (const int out_bytes : {2, 4}) {
    const GemmSmem sm = gemm_smem(128, 128, 5, 2, kGemmBlock128K, false, out_bytes, true);
    EXPECT_EQ(sm.staging_off % 1024, 0u);
    EXPECT_EQ(sm.staging_wg, 16384u);  // 64 rows x (128 bf16 | 64 fp32 columns per pass)
    EXPECT_LE(sm.total, kGemmSmemLimit);
  }
  s.tile.block_n = 64;  // any tile: B's scales are per row
  EXPECT_NO_THROW(validate(s));
  s = kg, s.scaling = GemmScaling::Mx32;
  EXPECT_NO_THROW(validate(s));
  s = kg, s.scaling = GemmScaling::RowChannel;  // per channel: [m] and [N] shared by the groups; members [G, m], [G, N]
  EXPECT_NO_THROW(validate(s));
  EXPECT_EQ(gemm_scale_elems(s, 0, 8, 1000).a, 4096);  // m, whatever the token count
  EXPECT_EQ(gemm_scale_elems(s, 0, 8, 1000).b, s.n);
  s.layout = GemmLayout::KGroupedMembers;
  EXPECT_EQ(gemm_scale_elems(s, 0, 8, 1000).a, 8 * 4096);
  EXPECT_EQ(gemm_scale_elems(s, 0, 8, 1000).b, 8 * s.n);
  s = kg, s.k = 7168;
  expect_spec_error(s, "k", "K is each group's token count, read at run time: expected 0, got 7168");
  s = kg, s.m = 0;
  expect_spec_error(s, "m", "expected the rows of each output in [1, 2^24], got 0");
  s = kg, s.tile.multicast = 2;
  expect_spec_error(s, "tile.multicast", "k-grouped: expected 1, got 2");
  s = ok, s.m = 5;
  expect_spec_error(s, "m", "m-grouped: rows are per group at run time: expected 0, got 5");
}

TEST(GemmRuntime, ArgumentErrorsNameTheArgument) {
  GemmSpec spec = make(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false, false, 0, 0, 128,
                       256, 256);
  rt::Gemm gemm(spec);
  // Fake device addresses: every size check happens before the driver is touched.
  rt::GemmCall c;
  c.m_total = 100, c.num_groups = 2;
  c.a = buf(0x100000, 100 * 256);
  c.b = buf(0x200000, 2 * 256 * 256);
  c.d = buf(0x300000, 100 * 256 * 2);
  c.a_scale = buf(0x400000, 100 * 2 * 4);
  c.b_scale = buf(0x500000, 2 * 2 * 2 * 4);
  c.group_offsets = buf(0x600000, 3 * 8);
  auto expect_error = [&](const rt::GemmCall& call, const std::string& what) { expect_run_error(gemm, call, what); };
  rt::GemmCall x = c;
  x.num_groups = 0;
  expect_error(x, "num_groups: expected 1..");
  x = c, x.m_total = (int64_t(1) << 31) - 256;  // the last tile's row indices must fit an int
  expect_error(x, "m_total: expected 0 <= m_total <= 2^31 - 257, got 2147483392");
  x = c, x.k_total = 1024;
  expect_error(x, "k_total: m-grouped: K is the spec's k");
  x = c, x.a.bytes -= 1;
  expect_error(x, "argument a: buffer of");
  x = c, x.a.ptr += 8;
  expect_error(x, "argument a: pointer");
  x = c, x.b.ptr = 0;
  expect_error(x, "argument b: null pointer");
  x = c, x.d.bytes = 100;
  expect_error(x, "for D [100, 256] bf16");
  x = c, x.d.dtype = DType::FP32;
  expect_error(x, "argument d: holds fp32, expected bf16");
  x = c, x.a_scale.bytes = 4;
  expect_error(x, "fp32 blockwise scales [m_total, ceil(K/128)]");
  x = c, x.b_scale.bytes = 4;
  expect_error(x, "argument b_scale");
  x = c, x.alpha = buf(0x700000, 4);
  expect_error(x, "argument alpha");
  x = c, x.group_offsets.bytes = 16;
  expect_error(x, "argument group_offsets");
  x = c, x.d = buf(0x100000 + 64, 100 * 256 * 2);
  expect_error(x, "argument d: buffer");  // overlaps a
  // Masked layout: m_total = num_groups * m_max, counts instead of offsets.
  x = c, x.m_max = 64;
  expect_error(x, "m_total: masked layout: expected num_groups * m_max = 2 * 64, got 100");
  x = c, x.m_max = 50;
  expect_error(x, "group_offsets: masked layout (m_max > 0) takes group_counts");
  x = c, x.m_max = 50, x.group_offsets = {};
  expect_error(x, "argument group_counts: null pointer");
  x = c, x.m_max = 50, x.group_offsets = {}, x.group_counts = buf(0x600000, 8);
  expect_error(x, "argument group_counts: buffer of 8 bytes");
  x = c, x.group_counts = buf(0x680000, 16);
  expect_error(x, "group_counts: contiguous layout takes group_offsets");
  x = c, x.m_max = -1;
  expect_error(x, "m_max: expected > 0");
  // mn_major A grids: per group, each padded to 4 rows: (100 + 3 * 2) rows of 2 k-blocks.
  GemmSpec mn = spec;
  mn.scale_layout = ScaleLayout::MnMajor;
  rt::Gemm mg(mn);
  x = c, x.a_scale = buf(0x400000, 106 * 2 * 4);
  expect_run_error(mg, x, "");
  x.a_scale.bytes -= 4;
  expect_run_error(mg, x, "argument a_scale: buffer of 844 bytes is smaller than the 848 bytes required for fp32 blockwise "
                          "scales [ceil(K/128), m_total + 3 * num_groups] (mn_major: each group's grid");
  x = c, x.m_total = (int64_t(1) << 30) - 5;  // the kernel's 30-bit row prefix
  expect_run_error(mg, x, "m_total: mn_major A scale grids: expected m_total + 3 * num_groups <= 2^30, got 1073741825");
}

TEST(GemmRuntime, NoneScalingTakesNoScales) {
  GemmSpec spec = make(GemmScaling::None, ElemFormat::Identity, ElemFormat::Identity, DType::BF16, false, false, 0, 0,
                       128, 256, 256);
  rt::Gemm gemm(spec);
  rt::GemmCall c;
  c.m_total = 100, c.num_groups = 2;
  c.a = buf(0x100000, 100 * 256 * 2);  // bf16: two bytes per element
  c.b = buf(0x200000, 2 * 256 * 256 * 2);
  c.d = buf(0x300000, 100 * 256 * 2);
  c.group_offsets = buf(0x600000, 3 * 8);
  rt::GemmCall x = c;
  x.a.bytes -= 2;
  expect_run_error(gemm, x, "for A [100, 256] bf16");
  x = c, x.b.bytes = 2 * 256 * 256;
  expect_run_error(gemm, x, "for B [2, 256, 256] bf16");
  x = c, x.a_scale = buf(0x400000, 16);
  expect_run_error(gemm, x, "a_scale: bf16 operands (none scaling) take no scales");
  x = c, x.b_scale = buf(0x400000, 16);
  expect_run_error(gemm, x, "b_scale: bf16 operands (none scaling) take no scales");
  expect_run_error(gemm, c, "");  // past every argument check
  // K-grouped: 8-token multiples (16-byte rows), A [m, k_total] and B [N, k_total] bf16.
  GemmSpec kspec = k_grouped(spec, 64);
  kspec.operand_dtype = DType::FP16;
  rt::Gemm kg(kspec);
  rt::GemmCall k;
  k.num_groups = 2, k.k_total = 12;
  k.a = buf(0x100000, 64 * 16 * 2);
  k.b = buf(0x200000, 256 * 16 * 2);
  k.d = buf(0x300000, 2 * 64 * 256 * 2);
  k.group_offsets = buf(0x600000, 3 * 8);
  expect_run_error(kg, k, "k_total: k-grouped: expected the token dimension as a multiple of 8");
  k.k_total = int64_t(1) << 30;  // 2^31 bytes per row: past the kernel's 32-bit TMA coordinates
  expect_run_error(kg, k, "k_total: k-grouped: a row of 1073741824 fp16 tokens is 2147483648 bytes; expected fewer than 2^31");
  k.k_total = 16;
  k.a.bytes -= 2;
  expect_run_error(kg, k, "A [64, 16] fp16");
  k.a.bytes += 2;
  expect_run_error(kg, k, "");
  // Weight-only int8 (channel): A bf16 [m, K] without scales, B int8 [G, N, K], fp32 scales [G, N].
  GemmSpec cspec = make(GemmScaling::Channel, ElemFormat::Identity, ElemFormat::Int8, DType::BF16, false, false, 0, 0,
                        128, 256, 256);
  rt::Gemm cg(cspec);
  rt::GemmCall w = c;
  w.b = buf(0x200000, 2 * 256 * 256);
  w.b_scale = buf(0x400000, 2 * 256 * 4);
  x = w, x.b.bytes -= 1;
  expect_run_error(cg, x, "for B [2, 256, 256] int8");
  x = w, x.b_scale.bytes -= 4;
  expect_run_error(cg, x, "fp32 channel scales [G, N]");
  x = w, x.a_scale = buf(0x500000, 16);
  expect_run_error(cg, x, "a_scale: bf16 operands (channel scaling) take no scales");
  expect_run_error(cg, w, "");
}

TEST(GemmReference, Bf16AndFp16OperandsAreTheirValues) {
  // K = 16, N = 8, one row: A = 1.5 * (k + 1) (exact in both), B row n = 2^-n; value = 1.5 * 136 * 2^-n.
  for (DType dt : {DType::BF16, DType::FP16}) {
    GemmSpec spec = make(GemmScaling::None, ElemFormat::Identity, ElemFormat::Identity, DType::FP32, false, false, 64, 1,
                         64, 8, 16);
    spec.operand_dtype = dt;
    auto put = [&](std::vector<uint8_t>& v, size_t i, float x) {
      const u16 h = dt == DType::FP16 ? f32_to_f16(x) : f32_to_bf16(x);
      v[2 * i] = uint8_t(h), v[2 * i + 1] = uint8_t(h >> 8);
    };
    std::vector<uint8_t> a(16 * 2), b(8 * 16 * 2);
    for (int k = 0; k < 16; ++k) put(a, size_t(k), 1.5f * float(k + 1));
    for (int n = 0; n < 8; ++n)
      for (int k = 0; k < 16; ++k) put(b, size_t(n * 16 + k), std::ldexp(1.0f, -n));
    const std::vector<int64_t> off = {0, 1}, rows = {0};
    const std::vector<float> alpha = {2.0f};
    const ref::GemmRows r = ref::gemm_reference(spec, ref::GemmOperands{a, b, {}, {}, alpha, off, {}, 0, 1}, rows, 1);
    for (int n = 0; n < 8; ++n) EXPECT_EQ(r.value[size_t(n)], 2.0 * 1.5 * 136 * std::ldexp(1.0, -n)) << n;
    // Problems: two bytes per element, small integers exactly, no scales.
    const ref::GemmProblem p = ref::make_gemm_problem(spec, std::vector<int64_t>{64}, 0, ref::GemmValues::SmallIntegers, false, 3);
    EXPECT_EQ(p.a.size(), size_t(64 * 16 * 2));
    EXPECT_EQ(p.b.size(), size_t(8 * 16 * 2));
    EXPECT_TRUE(p.a_scale.empty() && p.b_scale.empty());
    int distinct = 0;
    for (size_t i = 0; i < p.a.size(); i += 2) {
      const u16 h = u16(p.a[i] | p.a[i + 1] << 8);
      const float x = dt == DType::FP16 ? f16_to_f32(h) : bf16_to_f32(h);
      EXPECT_TRUE(x == std::rint(x) && std::fabs(x) <= 2.0f) << x;
      distinct += x == 2.0f;
    }
    EXPECT_GT(distinct, 0);
  }
}

TEST(GemmReference, ChannelIsTheInt8WeightTimesItsChannelScale) {
  // K = 16, N = 8: A = k + 1 (bf16), B[n] = -(n + 1) (int8 bytes), scale 2^-n per channel:
  // value = -136 * (n + 1) * 2^-n.
  GemmSpec spec = make(GemmScaling::Channel, ElemFormat::Identity, ElemFormat::Int8, DType::FP32, false, false, 64, 1,
                       64, 8, 16);
  std::vector<uint8_t> a(16 * 2), b(8 * 16);
  for (int k = 0; k < 16; ++k) {
    const u16 h = f32_to_bf16(float(k + 1));
    a[size_t(2 * k)] = uint8_t(h), a[size_t(2 * k + 1)] = uint8_t(h >> 8);
  }
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 16; ++k) b[size_t(n * 16 + k)] = uint8_t(int8_t(-(n + 1)));
  std::vector<float> cs(8);
  for (int n = 0; n < 8; ++n) cs[size_t(n)] = std::ldexp(1.0f, -n);
  const std::vector<uint8_t> sb = fp32_bytes(cs);
  const std::vector<int64_t> off = {0, 1}, rows = {0};
  const ref::GemmRows r = ref::gemm_reference(spec, ref::GemmOperands{a, b, {}, sb, {}, off, {}, 0, 1}, rows, 1);
  for (int n = 0; n < 8; ++n) EXPECT_EQ(r.value[size_t(n)], -136.0 * (n + 1) * std::ldexp(1.0, -n)) << n;
  const ref::GemmProblem p = ref::make_gemm_problem(spec, std::vector<int64_t>{64}, 0, ref::GemmValues::Random, false, 3);
  EXPECT_EQ(p.a.size(), size_t(64 * 16 * 2));  // bf16 A
  EXPECT_EQ(p.b.size(), size_t(8 * 16));       // int8 B
  EXPECT_TRUE(p.a_scale.empty());
  EXPECT_EQ(p.b_scale.size(), size_t(8 * 4));
}

TEST(GemmRuntime, KGroupedArgumentErrors) {
  GemmSpec spec = k_grouped(make(GemmScaling::PerTensor, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, false, false,
                                 0, 0), 256);
  spec.n = 128;
  rt::Gemm gemm(spec);
  rt::GemmCall c;
  c.num_groups = 3, c.k_total = 1024;
  c.a = buf(0x100000, 256 * 1024);
  c.b = buf(0x200000, 128 * 1024);
  c.d = buf(0x300000, 3 * 256 * 128 * 4);
  c.a_scale = buf(0x400000, 12);
  c.b_scale = buf(0x500000, 12);
  c.group_offsets = buf(0x600000, 4 * 8);
  auto expect_error = [&](const rt::GemmCall& call, const std::string& what) { expect_run_error(gemm, call, what); };
  rt::GemmCall x = c;
  x.k_total = 1000;
  expect_error(x, "k_total: k-grouped: expected the token dimension as a multiple of 16");
  x = c, x.m_total = 5;
  expect_error(x, "m_total: k-grouped: rows are the spec's m");
  x = c, x.d.bytes -= 4;
  expect_error(x, "for D [3, 256, 128] fp32");
  x = c, x.b.bytes = 128 * 1000;
  expect_error(x, "for B [128, 1024] e4m3");
  x = c, x.a_scale.bytes = 8;
  expect_error(x, "argument a_scale");
  x = c, x.b_amax = buf(0x700000, 12);
  expect_error(x, "b_amax: only nvfp4 scaling takes per-tensor amax; tensor scaling has none");
  expect_error(c, "");  // valid: only the driver is left

  // Blockwise and MX: scales per row of A and B along the tokens (1000 tokens: 8 and 32 columns).
  for (const auto sc : {GemmScaling::Block128, GemmScaling::Mx32}) {
    GemmSpec bs = spec;
    bs.scaling = sc;
    rt::Gemm bg(bs);
    const bool mx = sc == GemmScaling::Mx32;
    const int64_t cols = mx ? 32 : 8, eb = mx ? 1 : 4;
    rt::GemmCall y = c;
    y.k_total = 1008;
    y.a = buf(0x100000, 256 * 1008), y.b = buf(0x200000, 128 * 1008);
    y.a_scale = buf(0x400000, 256 * cols * eb);
    y.b_scale = buf(0x500000, 128 * cols * eb);
    expect_run_error(bg, y, "");
    rt::GemmCall z = y;
    z.a_scale.bytes -= 1;
    expect_run_error(bg, z, mx ? "e8m0 mxfp8 scales per row along the tokens [256, 32]"
                               : "fp32 blockwise scales per row along the tokens [256, 8]");
    z = y, z.b_scale.bytes -= 1;
    expect_run_error(bg, z, mx ? "[128, 32]" : "[128, 8]");
    if (mx) continue;
    // mn_major grids: [token blocks, rows padded to 4], named so.
    bs.scale_layout = ScaleLayout::MnMajor;
    rt::Gemm mg(bs);
    expect_run_error(mg, y, "");
    z = y, z.a_scale.bytes -= 1;
    expect_run_error(mg, z, "fp32 blockwise scales per row along the tokens [8, 256] (mn_major)");
    // The producer copies a k-block's factors with the tensor engine: 16-byte aligned bases (the
    // compact grids' gathering loads take 4-byte aligned ones).
    z = y, z.b_scale = buf(0x500004, 128 * cols * eb);
    expect_run_error(mg, z, "argument b_scale: pointer 0x500004 is not 16-byte aligned");
    expect_run_error(bg, z, "");
  }

  // NVFP4: packed e2m1 rows of k_total / 2 bytes (k_total % 32 == 0), e4m3 per 16 tokens, amax [G].
  GemmSpec fs = spec;
  fs.scaling = GemmScaling::Nvfp4, fs.a_format = fs.b_format = ElemFormat::E2M1;
  rt::Gemm fg(fs);
  rt::GemmCall f = c;
  f.k_total = 1056;  // 33 x 32 tokens: scale rows of 66 bytes
  f.a = buf(0x100000, 256 * 528), f.b = buf(0x200000, 128 * 528);
  f.a_scale = buf(0x400000, 256 * 66), f.b_scale = buf(0x500000, 128 * 66);
  f.a_amax = buf(0x700000, 12), f.b_amax = buf(0x700100, 12);
  expect_run_error(fg, f, "");  // valid
  rt::GemmCall y = f;
  y.k_total = 1040;
  expect_run_error(fg, y, "k_total: k-grouped: expected the token dimension as a multiple of 32 in [32, 2^31) "
                          "(16-byte TMA row strides of packed e2m1; pad it), got 1040");
  y = f, y.b.bytes -= 1;
  expect_run_error(fg, y, "for B [128, 1056] e2m1 packed two per byte");
  y = f, y.a_scale.bytes -= 1;
  expect_run_error(fg, y, "e4m3 nvfp4 scales per row along the tokens [256, 66]");
  y = f, y.b_scale = buf(0x500008, 128 * 66);
  expect_run_error(fg, y, "argument b_scale: pointer 0x500008 is not 16-byte aligned");
  y = f, y.a_amax = {};
  expect_run_error(fg, y, "argument a_amax: null pointer; expected a device buffer of 12 bytes");
  y = f, y.b_amax.bytes = 8;
  expect_run_error(fg, y, "argument b_amax: buffer of 8 bytes is smaller than the 12 bytes required");
}

TEST(GemmReference, KGroupedSumsEachGroupsTokens) {
  // m = 2 rows, N = 8, tokens 3 (group 0) and 2 (group 1) of k_total 16: A = 1 everywhere, B row
  // c = c + 1 on group 0's tokens and 2 on group 1's; scales 2 and 0.5 (per group).
  GemmSpec spec = k_grouped(make(GemmScaling::PerTensor, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, false,
                                 false, 64, 1, 64, 8, 16), 2);
  std::vector<uint8_t> a(2 * 16, encode_rn<E4M3>(1.0f)), b(8 * 16, encode_rn<E4M3>(0.0f));
  for (int c = 0; c < 8; ++c) {
    for (int t = 0; t < 3; ++t) b[size_t(c * 16 + t)] = encode_rn<E4M3>(float(c + 1));
    for (int t = 3; t < 5; ++t) b[size_t(c * 16 + t)] = encode_rn<E4M3>(2.0f);
  }
  const std::vector<uint8_t> sa = fp32_bytes({2.0f, 1.0f}), sb = fp32_bytes({0.5f, 1.0f});
  const std::vector<int64_t> off = {0, 3, 5};
  ref::GemmOperands ops{a, b, sa, sb, {}, off, {}, 0, 0, 16};
  const std::vector<int64_t> rows = {0, 1, 2, 3};  // D [2 groups, 2 rows]
  const ref::GemmRows r = ref::gemm_reference(spec, ops, rows, 1);
  EXPECT_EQ(r.group, (std::vector<int>{0, 0, 1, 1}));
  for (int row = 0; row < 4; ++row)
    for (int c = 0; c < 8; ++c) EXPECT_EQ(r.value[size_t(row * 8 + c)], row < 2 ? 3.0 * (c + 1) : 4.0) << row << " " << c;
}

TEST(GemmReference, KGroupedMembersReadEachMembersOwnMatrices) {
  // m = 2 rows, N = 8, k_total 64 split into members of 16, 32 and 8 tokens (the last misaligned):
  // A_0 [2, 16] at byte 0 is 1, A_1 [2, 32] at byte 2 * 16 is 2; B_0 [8, 16] at 0 has row c = c + 1,
  // B_1 [8, 32] at 8 * 16 is 1; per-member scales sa {1, 0.5, 1}, sb {2, 1, 1}.
  GemmSpec spec = members(make(GemmScaling::PerTensor, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, false,
                               false, 64, 1, 64, 8, 16), 2);
  std::vector<uint8_t> a(2 * 64, encode_rn<E4M3>(3.0f)), b(8 * 64, encode_rn<E4M3>(3.0f));
  for (int i = 0; i < 32; ++i) a[size_t(i)] = encode_rn<E4M3>(1.0f);
  for (int i = 32; i < 96; ++i) a[size_t(i)] = encode_rn<E4M3>(2.0f);
  for (int c = 0; c < 8; ++c)
    for (int t = 0; t < 16; ++t) b[size_t(c * 16 + t)] = encode_rn<E4M3>(float(c + 1));
  for (int i = 128; i < 128 + 8 * 32; ++i) b[size_t(i)] = encode_rn<E4M3>(1.0f);
  const std::vector<uint8_t> sa = fp32_bytes({1.0f, 0.5f, 1.0f}), sb = fp32_bytes({2.0f, 1.0f, 1.0f});
  const std::vector<int64_t> off = {0, 16, 48, 56};
  ref::GemmOperands ops{a, b, sa, sb, {}, off, {}, 0, 0, 64};
  const std::vector<int64_t> rows = {0, 1, 2, 3, 4, 5};  // D [3 groups, 2 rows]
  const ref::GemmRows r = ref::gemm_reference(spec, ops, rows, 1);
  for (int row = 0; row < 4; ++row)
    for (int c = 0; c < 8; ++c) EXPECT_EQ(r.value[size_t(row * 8 + c)], row < 2 ? 32.0 * (c + 1) : 32.0) << row << " " << c;
  for (int i = 32; i < 48; ++i) EXPECT_TRUE(std::isnan(r.value[size_t(i)])) << "member of 8 tokens: " << r.value[size_t(i)];
  // Scale buffers: one partial block more per member than the shared layout's grid.
  GemmSpec bs = spec;
  bs.scaling = GemmScaling::Block128;
  EXPECT_EQ(gemm_scale_elems(bs, 0, 3, 1000).a, 2 * (8 + 3));
  EXPECT_EQ(gemm_scale_elems(bs, 0, 3, 1000).b, 8 * (8 + 3));
  EXPECT_EQ(describe(spec), "e4m3 x e4m3 tensor k-grouped (members) M=2 N=8 -> fp32");
}

TEST(GemmReference, KGroupedNvfp4PacksTokensAndScalesPerRow) {
  // m = 1 row, N = 8, k_total 32 (16 bytes and two 16-token scale blocks per row); group 0 takes
  // tokens [0, 5), group 1 [5, 20), which crosses the scale blocks. A: token t is 1.0 (even t, low
  // nibble) or 0.5 (odd t), block scales 2 | 4. B row c: 1.5 (even c) or 3.0 (odd c), block scales
  // 1 | 0.5 (even c) or 2 | 1 (odd c). Global decode scales: 1 (amax 2688), 2 for group 1's A.
  GemmSpec spec = k_grouped(make(GemmScaling::Nvfp4, ElemFormat::E2M1, ElemFormat::E2M1, DType::FP32, false, false,
                                 128, 1, 128, 8, 0), 1);
  const uint8_t a_byte = uint8_t(encode_rn<E2M1>(1.0f) | (encode_rn<E2M1>(0.5f) << 4));
  std::vector<uint8_t> a(16, a_byte), b(8 * 16), sb(8 * 2);
  for (int c = 0; c < 8; ++c) {
    const bool odd = c % 2 == 1;
    for (int i = 0; i < 16; ++i) b[size_t(c * 16 + i)] = uint8_t(encode_rn<E2M1>(odd ? 3.0f : 1.5f) * 17);
    sb[size_t(2 * c)] = encode_rn<E4M3>(odd ? 2.0f : 1.0f);
    sb[size_t(2 * c + 1)] = encode_rn<E4M3>(odd ? 1.0f : 0.5f);
  }
  const std::vector<uint8_t> sa = {encode_rn<E4M3>(2.0f), encode_rn<E4M3>(4.0f)};
  const std::vector<float> a_amax = {2688.0f, 2 * 2688.0f}, b_amax = {2688.0f, 2688.0f};
  const std::vector<int64_t> off = {0, 5, 20};
  ref::GemmOperands ops{a, b, sa, sb, {}, off, {}, 0, 0, 32};
  ops.a_amax = a_amax, ops.b_amax = b_amax;
  const std::vector<int64_t> rows = {0, 1};  // D [2 groups, 1 row]
  const ref::GemmRows r = ref::gemm_reference(spec, ops, rows, 1);
  auto dot = [&](int c, int t0, int t1) {
    const bool odd = c % 2 == 1;
    double s = 0;
    for (int t = t0; t < t1; ++t)
      s += (t % 2 == 0 ? 1.0 : 0.5) * (t < 16 ? 2.0 : 4.0) * (odd ? 3.0 : 1.5) * (t < 16 ? (odd ? 2.0 : 1.0) : (odd ? 1.0 : 0.5));
    return s;
  };
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(r.value[size_t(c)], dot(c, 0, 5)) << c;
    EXPECT_EQ(r.value[size_t(8 + c)], 2.0 * dot(c, 5, 20)) << c;
  }
}

TEST(GemmRuntime, MxScaleBuffersAreE8m0Bytes) {
  GemmSpec spec = make(GemmScaling::Mx32, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false, false, 0, 0, 128,
                       256, 256);
  rt::Gemm gemm(spec);
  rt::GemmCall c;
  c.m_total = 100, c.num_groups = 2;
  c.a = buf(0x100000, 100 * 256);
  c.b = buf(0x200000, 2 * 256 * 256);
  c.d = buf(0x300000, 100 * 256 * 2);
  c.a_scale = buf(0x400000, 100 * 8 - 1);  // [100, 8] e8m0, one byte short
  c.b_scale = buf(0x500000, 2 * 256 * 8);
  c.group_offsets = buf(0x600000, 3 * 8);
  try {
    gemm.run(c, nullptr);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("argument a_scale"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("e8m0 mxfp8 scales [m_total, K/32]"), std::string::npos) << e.what();
  }
}

TEST(GemmRuntime, Nvfp4BuffersArePackedWithAmax) {
  GemmSpec spec = make(GemmScaling::Nvfp4, ElemFormat::E2M1, ElemFormat::E2M1, DType::BF16, false, false, 0, 0, 128,
                       256, 256);
  rt::Gemm gemm(spec);
  rt::GemmCall c;
  c.m_total = 100, c.num_groups = 2;
  c.a = buf(0x100000, 100 * 128);  // [100, 256] e2m1: 128 bytes per row
  c.b = buf(0x200000, 2 * 256 * 128);
  c.d = buf(0x300000, 100 * 256 * 2);
  c.a_scale = buf(0x400000, 100 * 16);  // [100, 16] e4m3
  c.b_scale = buf(0x500000, 2 * 256 * 16);
  c.group_offsets = buf(0x600000, 3 * 8);
  expect_run_error(gemm, c, "argument a_amax: null pointer; expected a device buffer of 8 bytes for fp32 [num_groups] "
                            "(nvfp4: per-tensor amax of each group's A)");
  c.a_amax = buf(0x700000, 8);
  c.b_amax = buf(0x700100, 4);
  expect_run_error(gemm, c, "argument b_amax: buffer of 4 bytes is smaller than the 8 bytes required");
  c.b_amax = buf(0x700100, 8);
  c.a = buf(0x100000, 100 * 128 - 1);
  expect_run_error(gemm, c, "e2m1 packed two per byte");
  c.a = buf(0x100000, 100 * 128);
  c.b_scale = buf(0x500008, 2 * 256 * 16);
  expect_run_error(gemm, c, "argument b_scale: pointer 0x500008 is not 16-byte aligned");
  c.b_scale = buf(0x500000, 2 * 256 * 16);
  expect_run_error(gemm, c, "");  // valid: only the driver is left
  // An fp8 GEMM takes no amax.
  rt::Gemm fp8(make(GemmScaling::PerTensor, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false, false, 0, 0, 128,
                    256, 256));
  c.a = buf(0x100000, 100 * 256), c.b = buf(0x200000, 2 * 256 * 256);
  c.a_scale = buf(0x400000, 8), c.b_scale = buf(0x500000, 8);
  expect_run_error(fp8, c, "only nvfp4 scaling takes per-tensor amax; tensor scaling has none");
}

TEST(GemmReference, Nvfp4PackedNibblesBlockScalesAndGlobalDecode) {
  // K = 128 (eight 16-blocks), N = 8. A row: element 2i = 1.0 (low nibble), 2i+1 = -0.5; block
  // scales 2, 0.5, then 0. B row n: element 2i = 1.5, 2i+1 = 1.0, block scales n+1, then 1. A
  // 16-block's dot is 8 (1.5 - 0.5) = 8 (2 with A's nibbles swapped). amax 2688 * 4 (A: decode
  // 4) and 2688 / 2 (B: decode 0.5): value = 4 * 0.5 * (16 (n+1) + 4).
  GemmSpec spec = make(GemmScaling::Nvfp4, ElemFormat::E2M1, ElemFormat::E2M1, DType::FP32, false, false, 128, 1, 128, 8,
                       128);
  const uint8_t a_byte = uint8_t(encode_rn<E2M1>(1.0f) | (encode_rn<E2M1>(-0.5f) << 4));
  const uint8_t b_byte = uint8_t(encode_rn<E2M1>(1.5f) | (encode_rn<E2M1>(1.0f) << 4));
  std::vector<uint8_t> a(64, a_byte), b(8 * 64, b_byte);
  std::vector<uint8_t> sa(8, 0), sb(8 * 8, encode_rn<E4M3>(1.0f));
  sa[0] = encode_rn<E4M3>(2.0f), sa[1] = encode_rn<E4M3>(0.5f);
  for (int n = 0; n < 8; ++n) sb[size_t(8 * n)] = encode_rn<E4M3>(float(n + 1));
  const std::vector<float> a_amax = {2688.0f * 4}, b_amax = {2688.0f / 2};
  const std::vector<int64_t> off = {0, 1};
  const std::vector<int64_t> rows = {0};
  ref::GemmOperands ops{a, b, sa, sb, {}, off, {}, 0, 1};
  ops.a_amax = a_amax, ops.b_amax = b_amax;
  const ref::GemmRows r = ref::gemm_reference(spec, ops, rows, 1);
  for (int n = 0; n < 8; ++n) EXPECT_EQ(r.value[size_t(n)], 2.0 * (16.0 * (n + 1) + 4.0)) << n;
}

TEST(GemmReference, SmallHandComputedCase) {
  // One group of 2 rows, N = 8, K = 16 (per-tensor scales 2 and 0.5, alpha 3): D = 3 * A B^T.
  GemmSpec spec = make(GemmScaling::PerTensor, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, false, false, 64, 1,
                       64, 8, 16);
  std::vector<uint8_t> a(2 * 16), b(8 * 16);
  for (int i = 0; i < 2 * 16; ++i) a[size_t(i)] = encode_rn<E4M3>(float(i % 3) - 1.0f);  // -1, 0, 1
  for (int i = 0; i < 8 * 16; ++i) b[size_t(i)] = encode_rn<E4M3>(float(i % 5) - 2.0f);
  const std::vector<uint8_t> sa = fp32_bytes({2.0f}), sb = fp32_bytes({0.5f});
  const std::vector<float> alpha = {3.0f};
  const std::vector<int64_t> off = {0, 2};
  ref::GemmOperands ops{a, b, sa, sb, alpha, off, {}, 0, 2};
  const std::vector<int64_t> rows = {0, 1};
  const ref::GemmRows r = ref::gemm_reference(spec, ops, rows, 1);
  for (int row = 0; row < 2; ++row)
    for (int n = 0; n < 8; ++n) {
      double want = 0, mag = 0;
      for (int k = 0; k < 16; ++k) {
        const double p = (double((row * 16 + k) % 3) - 1.0) * (double((n * 16 + k) % 5) - 2.0);
        want += p, mag += std::fabs(p);
      }
      EXPECT_EQ(r.value[size_t(row * 8 + n)], 3.0 * want);
      EXPECT_EQ(r.magnitude[size_t(row * 8 + n)], 3.0 * mag);
    }
  EXPECT_EQ(r.group, (std::vector<int>{0, 0}));
}

TEST(GemmReference, RowGroupsAndBlockScales) {
  EXPECT_EQ(ref::row_groups(std::vector<int64_t>{0, 2, 2, 5}, 7), (std::vector<int>{0, 0, 2, 2, 2, -1, -1}));
  EXPECT_EQ(ref::row_groups(std::vector<int64_t>{-3, 2, 9}, 4), (std::vector<int>{0, 0, 1, 1}));
  // Blockwise: K = 256 (two k-blocks), N = 8; A row 0 all ones with block scales 1 and 4, B
  // all ones with block scales 2 and 8: value = 128 * (1*2) + 128 * (4*8) = 4352.
  GemmSpec spec = make(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false, false, 64, 1, 64,
                       8, 256);
  std::vector<uint8_t> a(256, encode_rn<E4M3>(1.0f)), b(8 * 256, encode_rn<E4M3>(1.0f));
  const std::vector<uint8_t> sa = fp32_bytes({1.0f, 4.0f}), sb = fp32_bytes({2.0f, 8.0f});
  const std::vector<int64_t> off = {0, 1};
  const std::vector<int64_t> rows = {0};
  const ref::GemmRows r = ref::gemm_reference(spec, ref::GemmOperands{a, b, sa, sb, {}, off, {}, 0, 1}, rows, 2);
  for (int n = 0; n < 8; ++n) EXPECT_EQ(r.value[size_t(n)], 4352.0);
  EXPECT_EQ(ref::exact_output(spec, 4352.0, 0.0f), f32_to_bf16(4352.0f));
}

TEST(GemmReference, MxScalesPer32OfK) {
  // K = 128 (four 32-blocks), N = 8; A row 0 all ones with e8m0 scales 2^0, 2^1, 2^2, 2^-1; B
  // row n all ones with scales 2^n in every block: value = 32 * 2^n * (1 + 2 + 4 + 0.5).
  GemmSpec spec = make(GemmScaling::Mx32, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, false, false, 64, 1, 64, 8,
                       128);
  std::vector<uint8_t> a(128, encode_rn<E4M3>(1.0f)), b(8 * 128, encode_rn<E4M3>(1.0f));
  std::vector<uint8_t> sa = {127, 128, 129, 126}, sb(8 * 4);
  for (int n = 0; n < 8; ++n)
    for (int kb = 0; kb < 4; ++kb) sb[size_t(n * 4 + kb)] = uint8_t(127 + n);
  const std::vector<int64_t> off = {0, 1};
  const std::vector<int64_t> rows = {0};
  const ref::GemmRows r = ref::gemm_reference(spec, ref::GemmOperands{a, b, sa, sb, {}, off, {}, 0, 1}, rows, 1);
  for (int n = 0; n < 8; ++n) EXPECT_EQ(r.value[size_t(n)], 32.0 * std::ldexp(1.0, n) * 7.5) << n;
  // A NaN scale (0xFF) makes its rows NaN.
  sa[2] = 0xFF;
  const ref::GemmRows nan = ref::gemm_reference(spec, ref::GemmOperands{a, b, sa, sb, {}, off, {}, 0, 1}, rows, 1);
  EXPECT_TRUE(std::isnan(nan.value[0]));
  EXPECT_EQ(gemm_scale_elems(spec, 5, 3).a, 5 * 4);
  EXPECT_EQ(gemm_scale_elems(spec, 5, 3).b, 3 * 8 * 4);
}

TEST(GemmReference, Int8IsTheSignedByteTimesItsScales) {
  // Per token x per channel, K = 16, N = 8: A row 0 = -128 then 127 (alternating), B row n = n - 4
  // everywhere; scales 0.5 (row) and 2^n (channel): value = 8 * (-128 + 127) * (n - 4) * 0.5 * 2^n.
  GemmSpec spec = make(GemmScaling::RowChannel, ElemFormat::Int8, ElemFormat::Int8, DType::FP32, false, false, 64, 1, 64,
                       8, 16);
  std::vector<uint8_t> a(16), b(8 * 16);
  for (int k = 0; k < 16; ++k) a[size_t(k)] = k % 2 == 0 ? 0x80 : 0x7F;
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 16; ++k) b[size_t(n * 16 + k)] = uint8_t(int8_t(n - 4));
  std::vector<float> cs(8);
  for (int n = 0; n < 8; ++n) cs[size_t(n)] = std::ldexp(1.0f, n);
  const std::vector<uint8_t> sa = fp32_bytes({0.5f}), sb = fp32_bytes(cs);
  const std::vector<int64_t> off = {0, 1};
  const std::vector<int64_t> rows = {0};
  const ref::GemmRows r = ref::gemm_reference(spec, ref::GemmOperands{a, b, sa, sb, {}, off, {}, 0, 1}, rows, 1);
  for (int n = 0; n < 8; ++n) {
    EXPECT_EQ(r.value[size_t(n)], -8.0 * (n - 4) * 0.5 * std::ldexp(1.0, n)) << n;
    EXPECT_EQ(r.magnitude[size_t(n)], 8.0 * 255 * std::abs(n - 4) * 0.5 * std::ldexp(1.0, n)) << n;
  }
  // The problems' int8 operands: small integers, or every value of [-128, 127].
  const ref::GemmProblem small = ref::make_gemm_problem(spec, std::vector<int64_t>{64}, 0, ref::GemmValues::SmallIntegers, false, 3);
  for (uint8_t v : small.a) EXPECT_LE(std::abs(int(int8_t(v))), 2);
  const ref::GemmProblem wide = ref::make_gemm_problem(spec, std::vector<int64_t>{4096}, 0, ref::GemmValues::Random, false, 3);
  auto less = [](uint8_t x, uint8_t y) { return int8_t(x) < int8_t(y); };
  EXPECT_EQ(*std::min_element(wide.a.begin(), wide.a.end(), less), 0x80);
  EXPECT_EQ(*std::max_element(wide.a.begin(), wide.a.end(), less), 0x7F);
}

TEST(GemmProblem, ShapesSplitsAndExactValues) {
  const auto rows = ref::random_group_rows(8, 1024, 2, 64, 7);
  ASSERT_EQ(rows.size(), 8u);
  int64_t sum = 0, zeros = 0;
  for (int64_t r : rows) {
    sum += r, zeros += r == 0;
    EXPECT_EQ(r % 64, 0);
  }
  EXPECT_EQ(sum, 1024);
  EXPECT_GE(zeros, 2);
  GemmSpec spec = make(GemmScaling::RowChannel, ElemFormat::E5M2, ElemFormat::E4M3, DType::FP32, true, true, 128, 1, 128,
                       64, 128);
  const ref::GemmProblem p = ref::make_gemm_problem(spec, rows, 3, ref::GemmValues::SmallIntegers, true, 5, 2);
  EXPECT_EQ(p.m_total, 1024 + 3);
  EXPECT_EQ(p.a.size(), size_t(p.m_total * 128));
  EXPECT_EQ(p.b.size(), size_t(8 * 64 * 128));
  EXPECT_EQ(p.a_scale.size(), size_t(p.m_total) * 4);  // fp32 bytes
  EXPECT_EQ(p.b_scale.size(), size_t(8 * 64) * 4);
  EXPECT_EQ(p.d_init.size(), size_t(p.m_total * 64));
  for (uint8_t v : p.a) {
    const float x = decode<E5M2>(v);
    EXPECT_TRUE(x == std::rint(x) && std::fabs(x) <= 2.0f) << x;
  }
  const GemmScaleElems se = gemm_scale_elems(spec, p.m_total, 8);
  EXPECT_EQ(se.a, p.m_total);
  EXPECT_EQ(se.b, 8 * 64);
  // Deterministic for a seed, whatever the thread count.
  const ref::GemmProblem q = ref::make_gemm_problem(spec, rows, 3, ref::GemmValues::SmallIntegers, true, 5, 1);
  EXPECT_EQ(p.a, q.a);
  EXPECT_EQ(p.b, q.b);
}


// ------------------------------------------------------------------------- the dequant route

GemmSpec dequant(GemmSpec s) {
  s.route = GemmRoute::Dequant;
  return s;
}

TEST(GemmDequant, OperandKernelsCompileWithoutSpills) {
  using S = GemmScaling;
  const auto E4 = ElemFormat::E4M3, E5 = ElemFormat::E5M2, F4 = ElemFormat::E2M1;
  for (const GemmSpec& s : {dequant(make(S::Mx32, E5, E4, DType::BF16, false, false, 0, 1)),
                            dequant(make(S::Nvfp4, F4, F4, DType::FP32, true, false, 0, 1))}) {
    const DequantSource src = emit_dequant(s);
    EXPECT_NE(src.source.find("#include \"qforge/dequant.cuh\""), std::string::npos) << src.source;
    rt::CompileRequest req{src.source, "dequant.cu", {src.a_kernel, src.b_kernel, src.prep_kernel}, "sm_90a", {"--ptxas-options=-v"}};
    const rt::CompileResult r = rt::compile_cuda(req);
    ASSERT_FALSE(r.image.empty());
    const std::vector<rt::KernelResources> res = rt::ptxas_resources(r.log);
    ASSERT_GE(res.size(), 2u) << r.log;  // (A's and B's kernel are one instance where the formats agree)
    for (const auto& k : res) EXPECT_EQ(k.spill_store_bytes, 0) << r.log;
    // The GEMM on the copies is the none GEMM of the same problem, with the spec's tile.
    const GemmSpec in = dequant_inner_spec(s);
    EXPECT_EQ(in.scaling, S::None);
    EXPECT_EQ(in.operand_dtype, s.scaling == S::Nvfp4 ? DType::FP16 : DType::BF16);
    EXPECT_EQ(resolve_tile(s), resolve_tile(in));
    EXPECT_NE(describe(s).find("(dequant route)"), std::string::npos);
  }
}

TEST(GemmDequant, SpecErrorsNameTheRoute) {
  using S = GemmScaling;
  const auto E4 = ElemFormat::E4M3;
  auto expect = [](const GemmSpec& s, const std::string& what) {
    try {
      validate(s);
      FAIL() << "accepted: " << what;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect(dequant(make(S::Block128, E4, E4, DType::BF16, false, false, 0, 1)), "route: dequant: expected mxfp8 or nvfp4 scaling");
  expect(dequant(members(make(S::Block128, E4, E4, DType::BF16, false, false, 0, 1), 4096)), "expected mxfp8 or nvfp4");
  EXPECT_NO_THROW(validate(dequant(members(make(S::Mx32, E4, E4, DType::BF16, false, false, 0, 1), 4096))));
  expect(dequant(make(S::Mx32, E4, E4, DType::BF16, false, true, 0, 1)), "fast_accum");  // the operands' own rules
  expect(dequant(make(S::Mx32, E4, E4, DType::BF16, false, false, 96, 1)), "tile.block_n");  // the none GEMM's tile
  try {
    (void)parse_gemm_route("fast", "--route");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "--route: expected fused, dequant or auto, got \"fast\"");
  }
}

TEST(GemmDequant, WorkspaceHoldsBothCopiesPerCall) {
  using S = GemmScaling;
  const auto E4 = ElemFormat::E4M3, F4 = ElemFormat::E2M1;
  GemmSpec mx = dequant(make(S::Mx32, E4, E4, DType::BF16, false, false, 0, 1, 128, 256, 512));
  DequantWorkspace w = dequant_workspace(mx, 1000, 4, 0);
  EXPECT_EQ(w.a, 0);
  EXPECT_EQ(w.b, 1000 * 512 * 2);  // (a multiple of 256)
  EXPECT_EQ(w.total, w.b + 4 * 256 * 512 * 2);
  EXPECT_EQ(w.alpha, -1);
  EXPECT_EQ(w.prefix, -1);
  mx.scale_layout = ScaleLayout::MnMajor;  // A's per-group grid prefix and the groups' starts
  w = dequant_workspace(mx, 1000, 4, 0);
  EXPECT_EQ(w.prefix, 1000 * 512 * 2 + 4 * 256 * 512 * 2);
  EXPECT_EQ(w.starts, w.prefix + 256);
  EXPECT_EQ(w.total, w.starts + 256);
  const GemmSpec fp4 = dequant(k_grouped(make(S::Nvfp4, F4, F4, DType::FP32, false, false, 0, 1, 128, 136), 200));
  w = dequant_workspace(fp4, 4096, 8, 0);  // K-grouped: A [200, 4096], B [136, 4096], alpha [8]
  EXPECT_EQ(w.b, 200 * 4096 * 2);
  EXPECT_EQ(w.alpha, w.b + 136 * 4096 * 2);
  EXPECT_EQ(w.total, w.alpha + 256);
  EXPECT_EQ(w.prefix, -1);
  EXPECT_EQ(w.inner, -1);
  // Members: the members' token-block prefix [G + 1], their starts [G + 1], then the none GEMM's
  // tensor maps.
  const GemmSpec fp4m = dequant(members(make(S::Nvfp4, F4, F4, DType::FP32, false, false, 0, 1, 128, 136), 200));
  w = dequant_workspace(fp4m, 4096, 8, 1000);
  EXPECT_EQ(w.alpha, 200 * 4096 * 2 + 136 * 4096 * 2);
  EXPECT_EQ(w.prefix, w.alpha + 256);
  EXPECT_EQ(w.starts, w.prefix + 256);  // 9 x 8 bytes, 256-aligned
  EXPECT_EQ(w.inner, w.starts + 256);
  EXPECT_EQ(w.total, w.inner + 1024);
  // MXFP8 members have an alpha too: NaN for a member the fused kernel cannot load.
  const GemmSpec mxm = dequant(members(make(S::Mx32, E4, E4, DType::FP32, false, false, 0, 1, 128, 136), 200));
  w = dequant_workspace(mxm, 4096, 8, 1000);
  EXPECT_EQ(w.alpha, 200 * 4096 * 2 + 136 * 4096 * 2);
  EXPECT_EQ(w.prefix, w.alpha + 256);
  EXPECT_EQ(dequant_workspace(dequant(k_grouped(make(S::Mx32, E4, E4, DType::FP32, false, false, 0, 1, 128, 136), 200)), 4096, 8, 0).alpha,
            -1);
  rt::Gemm gemm(mx);
  EXPECT_EQ(gemm.workspace_bytes(1000, 4), dequant_workspace(mx, 1000, 4, 0).total);
  EXPECT_THROW((void)gemm.workspace_bytes(), UserError);  // the copies depend on the call
  // A call without it, or with too little, is refused before anything runs.
  rt::GemmCall c;
  c.m_total = 1000, c.num_groups = 4;
  c.a = buf(0x1000000, 1000 * 512);
  c.b = buf(0x2000000, 4 * 256 * 512);
  c.d = buf(0x3000000, 1000 * 256 * 2);
  c.a_scale = buf(0x4000000, (1000 + 12) * 16);
  c.b_scale = buf(0x5000000, 4 * 256 * 16);
  c.group_offsets = buf(0x6000000, 5 * 8);
  expect_run_error(gemm, c, "argument workspace: null pointer");
  c.workspace = buf(0x10000000, gemm.workspace_bytes(1000, 4) - 256);
  expect_run_error(gemm, c, "dequant route: workspace_bytes(1000, 4) = ");
  c.workspace = buf(0x10000000, gemm.workspace_bytes(1000, 4));
  c.a_scale.bytes -= 1;  // the operands are checked as the fused kernel takes them
  expect_run_error(gemm, c, "argument a_scale");
  c.a_scale.bytes += 1;
  c.workspace.ptr = 0x1000000 + 256;  // overlaps A
  expect_run_error(gemm, c, "argument workspace: buffer");
  c.workspace.ptr = 0x10000000;
  expect_run_error(gemm, c, "");  // past the checks
}

// ------------------------------------------------------------------------- the auto route

GemmSpec auto_route(GemmSpec s) {
  s.route = GemmRoute::Auto;
  return s;
}

// The rule behind route auto, at the points of the sweep it was set from (scripts/gemm_route_sweep.sh,
// docs/gemm.md "Auto"): M-grouped by h(rows per group, N) = r N / (r + N) against the format's
// crossover (mxfp8 600, nvfp4 750), K-grouped by h(M, N) and a minimum of work.
TEST(GemmAuto, ChoosesTheDequantRouteWhereItsCopiesPay) {
  using S = GemmScaling;
  using R = GemmRoute;
  const auto E4 = ElemFormat::E4M3, F4 = ElemFormat::E2M1;
  const GemmSpec mx = auto_route(make(S::Mx32, E4, E4, DType::BF16, false, false, 0, 1, 128, 4096, 7168));
  const GemmSpec fp4 = auto_route(make(S::Nvfp4, F4, F4, DType::BF16, false, false, 0, 1, 128, 4096, 7168));
  EXPECT_EQ(choose_gemm_route(mx, 8 * 512, 8), R::Fused);     // 1.20x slower by the route (H100)
  EXPECT_EQ(choose_gemm_route(mx, 8 * 768, 8), R::Dequant);   // h = 647: 0.97 and 0.90 in two sweeps
  EXPECT_EQ(choose_gemm_route(mx, 8 * 1024, 8), R::Dequant);  // h = 819: 0.87
  EXPECT_EQ(choose_gemm_route(mx, 8 * 4096, 8), R::Dequant);  // 0.67
  EXPECT_EQ(choose_gemm_route(fp4, 8 * 768, 8), R::Fused);    // 1.03
  EXPECT_EQ(choose_gemm_route(fp4, 8 * 1024, 8), R::Dequant); // 0.92
  EXPECT_EQ(choose_gemm_route(mx, 0, 8), R::Fused);           // nothing to copy
  GemmSpec short_k = mx;  // h pays, but 2 x 4096 x 4096 x 512 = 17 GFLOP: the route's launches do not
  short_k.k = 512;
  EXPECT_EQ(choose_gemm_route(short_k, 4096, 1), R::Fused);
  EXPECT_EQ(choose_gemm_route(short_k, 4 * 4096, 4), R::Dequant);  // 69 GFLOP
  GemmSpec narrow = mx;  // few output channels: the weights are cheap, but so is the GEMM
  narrow.n = 512;
  EXPECT_EQ(choose_gemm_route(narrow, 8 * 65536, 8), R::Fused);  // h < 512
  // K-grouped (wgrad): both operands are copied; the GEMM's M x N against M + N, and enough work.
  const GemmSpec kg = auto_route(k_grouped(make(S::Mx32, E4, E4, DType::FP32, false, false, 0, 1, 128, 7168), 4096));
  EXPECT_EQ(choose_gemm_route(kg, 8 * 256, 8), R::Dequant);  // 0.73
  const GemmSpec small = auto_route(k_grouped(make(S::Nvfp4, F4, F4, DType::FP32, false, false, 0, 1, 128, 2048), 2048));
  EXPECT_EQ(choose_gemm_route(small, 8 * 256, 8), R::Fused);     // 17 GFLOP: the route's fixed cost (0.93)
  EXPECT_EQ(choose_gemm_route(small, 8 * 1024, 8), R::Dequant);  // 0.86
  // Fixed routes are the spec's; scalings and layouts without a dequant route stay fused.
  EXPECT_EQ(choose_gemm_route(dequant(make(S::Mx32, E4, E4, DType::BF16, false, false, 0, 1)), 8, 8), R::Dequant);
  GemmSpec fused = mx;
  fused.route = R::Fused;
  EXPECT_EQ(choose_gemm_route(fused, 8 * 4096, 8), R::Fused);
  EXPECT_EQ(choose_gemm_route(auto_route(make(S::Block128, E4, E4, DType::BF16, false, false, 0, 1)), 8 * 4096, 8), R::Fused);
  // Members (per-member copies) judge as one tensor's K-grouped layout: h(M, N).
  const GemmSpec mem = auto_route(members(make(S::Mx32, E4, E4, DType::FP32, false, false, 0, 1, 128, 7168), 4096));
  EXPECT_TRUE(gemm_has_dequant_route(mem));
  EXPECT_EQ(choose_gemm_route(mem, 8 * 4096, 8), R::Dequant);
  EXPECT_EQ(choose_gemm_route(members(make(S::Mx32, E4, E4, DType::FP32, false, false, 0, 1, 128, 256), 256), 8 * 4096, 8),
            R::Fused);  // (a fixed route: the spec's)
  EXPECT_EQ(choose_gemm_route(auto_route(members(make(S::Mx32, E4, E4, DType::FP32, false, false, 0, 1, 128, 256), 256)),
                              8 * 4096, 8),
            R::Fused);  // h(256, 256) = 128
}

TEST(GemmAuto, SpecKeepsTheFusedTileAndBothRoutesValid) {
  using S = GemmScaling;
  const auto E4 = ElemFormat::E4M3;
  // A tile is the fused kernel's: the dequant route runs its none GEMM's default tile.
  const GemmSpec mx = auto_route(make(S::Mx32, E4, E4, DType::BF16, false, false, 64, 1));
  validate(mx);
  EXPECT_EQ(resolve_tile(mx), resolve_tile(gemm_route_spec(mx, GemmRoute::Fused)));
  EXPECT_EQ(resolve_tile(mx).block_n, 64);
  EXPECT_EQ(gemm_route_spec(mx, GemmRoute::Dequant).tile, GemmTile{});
  EXPECT_EQ(gemm_route_spec(mx, GemmRoute::Dequant).route, GemmRoute::Dequant);
  EXPECT_NE(describe(mx).find("(auto route)"), std::string::npos) << describe(mx);
  // The operands' own rules still name their field.
  try {
    validate(auto_route(make(S::Mx32, E4, E4, DType::BF16, false, true, 0, 1)));
    FAIL() << "fast_accum with mxfp8 accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(e.where(), "fast_accum") << e.what();
  }
  EXPECT_EQ(parse_gemm_route("auto", "route"), GemmRoute::Auto);
  EXPECT_EQ(name(GemmRoute::Auto), "auto");
  // Blockwise has nothing to dequantize: auto is the fused kernel, tile and all (recipes too).
  GemmSpec block_spec = auto_route(make(S::Block128, E4, E4, DType::BF16, false, false, 64, 1));
  rt::Gemm block(block_spec);
  EXPECT_EQ(block.spec().route, GemmRoute::Fused);
  EXPECT_EQ(block.workspace_bytes(), 0);
  settle_gemm_route(block_spec);
  EXPECT_EQ(describe(block_spec), describe(block.spec()));
  GemmSpec mx_settled = mx;
  settle_gemm_route(mx_settled);
  EXPECT_EQ(mx_settled.route, GemmRoute::Auto);
}

TEST(GemmAuto, WorkspaceAndRunFollowTheChoice) {
  using S = GemmScaling;
  const auto E4 = ElemFormat::E4M3;
  const GemmSpec mx = auto_route(make(S::Mx32, E4, E4, DType::BF16, false, false, 0, 1, 128, 2048, 2048));
  rt::Gemm gemm(mx);
  EXPECT_EQ(gemm.route_for(4 * 64, 4), GemmRoute::Fused);
  EXPECT_EQ(gemm.workspace_bytes(4 * 64, 4), 0);
  EXPECT_EQ(gemm.route_for(4 * 2048, 4), GemmRoute::Dequant);
  EXPECT_EQ(gemm.workspace_bytes(4 * 2048, 4), dequant_workspace(gemm_route_spec(mx, GemmRoute::Dequant), 4 * 2048, 4, 0).total);
  try {
    (void)gemm.workspace_bytes();
    FAIL() << "auto's workspace depends on the call";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("the auto route's workspace"), std::string::npos) << e.what();
  }
  // A call that could not run is refused by route_for and workspace_bytes alike, for every route.
  for (auto [extent, g, where] : {std::tuple{int64_t(-1), 4, "extent"}, std::tuple{int64_t(1) << 40, 4, "extent"},
                                  std::tuple{int64_t(4096), 0, "num_groups"}, std::tuple{int64_t(4096), 1 << 21, "num_groups"}}) {
    try {
      (void)gemm.route_for(extent, g);
      FAIL() << "route_for accepted " << extent << ", " << g;
    } catch (const UserError& e) {
      EXPECT_EQ(e.where(), where) << e.what();
    }
    GemmSpec fused = mx;
    fused.route = GemmRoute::Fused;
    try {
      (void)rt::Gemm(fused).workspace_bytes(extent, g);
      FAIL() << "workspace_bytes accepted " << extent << ", " << g;
    } catch (const UserError& e) {
      EXPECT_EQ(e.where(), where) << e.what();
    }
  }
  // A run is checked by the route it takes: the dequant route's wants its copies.
  rt::GemmCall c;
  c.m_total = 4 * 2048, c.num_groups = 4;
  c.a = buf(0x100000000, c.m_total * 2048);
  c.b = buf(0x200000000, 4 * 2048 * 2048);
  c.d = buf(0x300000000, c.m_total * 2048 * 2);
  c.a_scale = buf(0x400000000, c.m_total * 64);
  c.b_scale = buf(0x500000000, 4 * 2048 * 64);
  c.group_offsets = buf(0x600000000, 5 * 8);
  expect_run_error(gemm, c, "workspace: route auto takes the dequant route for m_total 8192 over 4 groups (route_for): "
                           "expected workspace_bytes(extent, num_groups) = ");
  c.m_total = 4 * 64;  // the fused kernel's: no workspace
  c.a.bytes = c.m_total * 2048, c.a_scale.bytes = c.m_total * 64, c.d.bytes = c.m_total * 2048 * 2;
  expect_run_error(gemm, c, "");  // past the checks
}

// What prewarm compiles for an auto spec (prepare: gemm_kernel_specs) is what each route's run
// loads: after the auto Gemm's prepare, both concrete routes' Gemms find every kernel in the cache.
TEST(GemmAuto, PrepareCompilesWhatEitherRouteLoads) {
  rt::CacheOptions o;
  o.disabled = true;  // memory only
  rt::KernelCache cache(o);
  const GemmSpec mx = auto_route(mn_major(make(GemmScaling::Mx32, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false,
                                               false, 0, 1, 128, 256, 512)));
  EXPECT_EQ(rt::Gemm(mx, cache).prepare("sm_90a"), rt::CacheHow::Compiled);
  for (GemmRoute r : {GemmRoute::Fused, GemmRoute::Dequant})
    EXPECT_EQ(rt::Gemm(gemm_route_spec(mx, r), cache).prepare("sm_90a"), rt::CacheHow::MemoryHit) << name(r);
  EXPECT_EQ(gemm_kernel_specs(mx).gemm.size(), 2u);    // the fused kernel, the bf16 GEMM on the copies
  EXPECT_EQ(gemm_kernel_specs(mx).dequant.size(), 1u);  // the operand kernels
}

}  // namespace
