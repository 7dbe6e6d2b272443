// The compiler passes one by one and through the pipeline: what each does to the plan of a
// shipped recipe (amax sharing, usage pruning, phases, tiles), that verify() rejects broken
// plans with an InternalError carrying file:line, and the exact text print() gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>

#include "compiler/codegen.h"
#include "compiler/error.h"
#include "compiler/ir.h"
#include "compiler/lower.h"
#include "compiler/passes/prune_usage.h"
#include "compiler/passes/schedule_phases.h"
#include "compiler/passes/select_tiles.h"
#include "compiler/passes/share_amax.h"
#include "compiler/pipeline.h"

namespace {

namespace fs = std::filesystem;
using namespace qf;

Recipe shipped(const std::string& name) {
  return load_recipe(fs::path(QF_SOURCE_DIR) / "recipes" / (name + ".json"));
}

Plan plan_for(const std::string& recipe, const std::string& role, std::optional<Usage> usage = std::nullopt,
              DType input = DType::BF16) {
  return compile_plan(shipped(recipe), PlanRequest{role, input, usage, false});
}

int count_reduce_phases(const Plan& p) {
  int n = 0;
  for (const auto& ph : p.phases) n += ph.kind == PhaseKind::AmaxReduce;
  return n;
}

// ---- lower ----

TEST(Lower, OneStreamPerDefinedDirectionEachWithItsOwnAmax) {
  const Plan p = lower(shipped("current_scaling"), PlanRequest{"linear:input", DType::BF16, std::nullopt, false});
  ASSERT_EQ(p.streams.size(), 2u);
  EXPECT_EQ(p.streams[0].dir, Direction::Rowwise);
  EXPECT_EQ(p.streams[1].dir, Direction::Columnwise);
  ASSERT_EQ(p.amax.size(), 2u) << "lower does not share";
  EXPECT_EQ(p.streams[0].tensor_amax, 0);
  EXPECT_EQ(p.streams[1].tensor_amax, 1);
  EXPECT_TRUE(p.phases.empty());
  EXPECT_EQ(p.tile, TileConfig{});
  EXPECT_EQ(p.usage, Usage::Training) << "the recipe's default";
  EXPECT_NO_THROW(verify(p));
}

TEST(Lower, IdentityTakesTheInputDtype) {
  const Plan p = lower(shipped("int8_weight_sr"), PlanRequest{"linear:input", DType::FP16, std::nullopt, false});
  ASSERT_EQ(p.streams.size(), 2u);
  EXPECT_EQ(p.streams[0].out_dtype, DType::FP16);
  EXPECT_TRUE(p.amax.empty());
}

TEST(Lower, UnknownRoleIsAUserError) {
  EXPECT_THROW(lower(shipped("w8a8_int8_inference"), PlanRequest{"linear:grad_output", DType::BF16, std::nullopt, false}), UserError);
}

// ---- share_amax + schedule_phases, per scaling mode ----

TEST(Pipeline, CurrentScalingSharesOneTensorAmaxReducedBeforeTheCast) {
  const Plan p = plan_for("current_scaling", "linear:input");
  ASSERT_EQ(p.streams.size(), 2u);
  ASSERT_EQ(p.amax.size(), 1u);
  EXPECT_EQ(p.amax[0].scope, AmaxScope::Tensor);
  EXPECT_TRUE(p.amax[0].before_cast);
  EXPECT_EQ(p.streams[0].tensor_amax, 0);
  EXPECT_EQ(p.streams[1].tensor_amax, 0);
  ASSERT_EQ(p.phases.size(), 2u);
  EXPECT_EQ(p.phases[0], (Phase{PhaseKind::AmaxReduce, {0}}));
  EXPECT_EQ(p.phases[1].kind, PhaseKind::Cast);
  EXPECT_EQ(amax_output_name(p, 0), "amax");
}

TEST(Pipeline, DelayedScalingSharesTheAmaxWithoutAReducePhase) {
  const Plan p = plan_for("delayed_scaling", "linear:grad_output");
  ASSERT_EQ(p.amax.size(), 1u);
  EXPECT_FALSE(p.amax[0].before_cast) << "delayed scaling only reports the amax";
  EXPECT_EQ(p.streams[0].tensor_amax, 0);
  EXPECT_EQ(p.streams[1].tensor_amax, 0);
  EXPECT_EQ(count_reduce_phases(p), 0);
  ASSERT_EQ(p.phases.size(), 1u);
  EXPECT_EQ(scale_input_name(p, p.streams[0]), "scale");
  EXPECT_EQ(scale_input_name(p, p.streams[1]), "scale");
}

TEST(Pipeline, Float8BlockWeightsShareOneBlockAmaxAndTileByTheBlock) {
  const Plan p = plan_for("float8_block_scaling", "linear:weight");
  ASSERT_EQ(p.amax.size(), 1u);
  EXPECT_EQ(p.amax[0].scope, AmaxScope::Block);
  EXPECT_EQ(p.amax[0].block, (BlockShape{128, 128}));
  EXPECT_EQ(p.streams[0].local_amax, 0);
  EXPECT_EQ(p.streams[1].local_amax, 0);
  EXPECT_EQ(count_reduce_phases(p), 0);
  EXPECT_EQ(p.tile.rows % 128, 0);
  EXPECT_EQ(p.tile.cols % 128, 0);
}

TEST(Pipeline, Float8Block1DKeepsTwoBlockAmaxes) {
  const Plan p = plan_for("float8_block_scaling", "linear:input");
  ASSERT_EQ(p.amax.size(), 2u);
  EXPECT_EQ(p.amax[0].block, (BlockShape{1, 128}));
  EXPECT_EQ(p.amax[1].block, (BlockShape{128, 1}));
  EXPECT_EQ(p.tile.rows % 128, 0);
  EXPECT_EQ(p.tile.cols % 128, 0);
}

TEST(Pipeline, Nvfp4InputHasRawAndRotatedTensorAmaxesBothReducedFirst) {
  const Plan p = plan_for("nvfp4", "linear:input");
  const Stream* row = p.stream(Direction::Rowwise);
  const Stream* col = p.stream(Direction::Columnwise);
  ASSERT_TRUE(row && col);
  ASSERT_NE(row->tensor_amax, col->tensor_amax);
  const AmaxSource& raw = p.amax[row->tensor_amax];
  const AmaxSource& rot = p.amax[col->tensor_amax];
  EXPECT_EQ(raw.scope, AmaxScope::Tensor);
  EXPECT_EQ(rot.scope, AmaxScope::Tensor);
  EXPECT_FALSE(raw.rht);
  ASSERT_TRUE(rot.rht);
  EXPECT_EQ(rot.rht->sign_mask, 0xD7E8u);
  EXPECT_TRUE(raw.before_cast && rot.before_cast);
  ASSERT_EQ(p.phases.size(), 2u);
  EXPECT_EQ(p.phases[0].kind, PhaseKind::AmaxReduce);
  EXPECT_EQ(p.phases[0].amax, (std::vector<int>{row->tensor_amax, col->tensor_amax}));
  EXPECT_EQ(p.phases[1].kind, PhaseKind::Cast);
  EXPECT_TRUE(p.amax[col->local_amax].rht) << "block amax over the rotated values too";
  EXPECT_EQ(p.tile.rows % 16, 0);
  EXPECT_EQ(amax_output_name(p, row->tensor_amax), "rowwise_amax");
  EXPECT_EQ(amax_output_name(p, col->tensor_amax), "columnwise_amax");
}

TEST(Pipeline, Nvfp4Weights2DShareTensorAndBlockAmax) {
  const Plan p = plan_for("nvfp4", "linear:weight");
  ASSERT_EQ(p.amax.size(), 2u);
  EXPECT_EQ(p.streams[0].tensor_amax, p.streams[1].tensor_amax);
  EXPECT_EQ(p.streams[0].local_amax, p.streams[1].local_amax);
  EXPECT_EQ(p.amax[p.streams[0].local_amax].block, (BlockShape{16, 16}));
}

TEST(Pipeline, HybridKeepsIndependentDirections) {
  const Plan p = plan_for("hybrid_mxfp8_fwd_nvfp4_bwd", "linear:input");
  const Stream* row = p.stream(Direction::Rowwise);
  const Stream* col = p.stream(Direction::Columnwise);
  ASSERT_TRUE(row && col);
  EXPECT_EQ(row->format, ElemFormat::E4M3);
  EXPECT_TRUE(std::holds_alternative<MxScaling>(row->scaling));
  EXPECT_EQ(row->tensor_amax, -1) << "MX needs no tensor amax";
  EXPECT_EQ(col->format, ElemFormat::E2M1);
  EXPECT_TRUE(col->rht);
  ASSERT_EQ(p.phases.size(), 2u);
  EXPECT_EQ(p.phases[0].amax, (std::vector<int>{col->tensor_amax}));
}

TEST(Pipeline, PerChannelNeedsBothChannelAmaxesFirst) {
  const Plan p = plan_for("int8_weight_sr", "linear:weight");
  ASSERT_EQ(p.amax.size(), 2u) << "per-row and per-column amaxes differ";
  EXPECT_EQ(p.amax[0].channel_dir, Direction::Rowwise);
  EXPECT_EQ(p.amax[1].channel_dir, Direction::Columnwise);
  EXPECT_EQ(p.phases[0], (Phase{PhaseKind::AmaxReduce, {0, 1}}));
}

TEST(ShareAmax, MergesOnlyIdenticalReductionsAndKeepsBeforeCast) {
  Plan p = lower(shipped("current_scaling"), PlanRequest{"linear:input", DType::BF16, std::nullopt, false});
  // Pretend the columnwise stream is delayed: its amax is only reported, yet the shared
  // reduction must still run before the cast for the rowwise (current) stream.
  p.amax[1].before_cast = false;
  const Plan s = share_amax(p);
  ASSERT_EQ(s.amax.size(), 1u);
  EXPECT_TRUE(s.amax[0].before_cast);
  // Already shared: a second run changes nothing.
  EXPECT_EQ(share_amax(s), s);
}

// ---- prune_usage ----

TEST(PruneUsage, InferenceDropsColumnwiseAndItsAmaxSources) {
  const Plan t = plan_for("nvfp4", "linear:input");
  const Plan p = plan_for("nvfp4", "linear:input", Usage::Inference);
  EXPECT_EQ(p.usage, Usage::Inference);
  ASSERT_EQ(p.streams.size(), 1u);
  EXPECT_EQ(p.streams[0].dir, Direction::Rowwise);
  EXPECT_EQ(t.amax.size(), 4u);
  ASSERT_EQ(p.amax.size(), 2u);
  for (const auto& a : p.amax) EXPECT_FALSE(a.rht);
  EXPECT_EQ(p.phases[0].amax, (std::vector<int>{p.streams[0].tensor_amax}));
  EXPECT_EQ(amax_output_name(p, p.streams[0].tensor_amax), "rowwise_amax");
}

TEST(PruneUsage, InferenceRenumbersAmaxSources) {
  // Columnwise-first amaxes would leave holes: make the rowwise stream use the later index.
  Plan p = lower(shipped("mxfp8"), PlanRequest{"linear:input", DType::BF16, Usage::Inference, false});
  std::swap(p.amax[0], p.amax[1]);
  p.streams[0].local_amax = 1;
  p.streams[1].local_amax = 0;
  const Plan q = prune_usage(p);
  ASSERT_EQ(q.amax.size(), 1u);
  EXPECT_EQ(q.streams[0].local_amax, 0);
  EXPECT_EQ(q.amax[0].block, (BlockShape{1, 32}));
  EXPECT_NO_THROW(verify(q));
}

TEST(PruneUsage, MemoryDropsADerivableColumnwiseCopy) {
  for (const auto& [recipe, role] : {std::pair{"current_scaling", "linear:input"}, {"delayed_scaling", "linear:weight"},
                                     {"float8_block_scaling", "linear:weight"}, {"nvfp4", "linear:weight"},
                                     {"int8_weight_sr", "linear:input"}}) {
    SCOPED_TRACE(std::string(recipe) + " " + role);
    const Plan p = plan_for(recipe, role, Usage::Memory);
    ASSERT_EQ(p.streams.size(), 1u);
    EXPECT_EQ(p.streams[0].dir, Direction::Rowwise);
  }
}

TEST(PruneUsage, MemoryKeepsANonDerivableColumnwiseCopy) {
  for (const auto& [recipe, role] : {std::pair{"float8_block_scaling", "linear:input"},  // 1D blocks
                                     {"mxfp8", "linear:input"},                            // 1D blocks
                                     {"nvfp4", "linear:input"},                            // RHT
                                     {"nvfp4", "linear:grad_output"},                      // RHT + SR
                                     {"hybrid_mxfp8_fwd_nvfp4_bwd", "linear:weight"},      // other format
                                     {"int8_weight_sr", "linear:weight"}}) {               // per channel
    SCOPED_TRACE(std::string(recipe) + " " + role);
    const Plan p = plan_for(recipe, role, Usage::Memory);
    EXPECT_EQ(p.streams.size(), 2u);
  }
}

TEST(PruneUsage, MemoryKeepsAStochasticallyRoundedCopy) {
  // 2D blocks would be derivable, but stochastic rounding draws different bits per direction.
  const Recipe r = parse_recipe(R"({"qforge_recipe": 1, "name": "t", "usage": "memory", "roles": [{"match": "*:*",
    "rowwise":    {"format": "e2m1", "scaling": {"mode": "nvfp4", "block": [16, 16]}, "rounding": "stochastic"},
    "columnwise": {"format": "e2m1", "scaling": {"mode": "nvfp4", "block": [16, 16]}, "rounding": "stochastic"}}]})");
  EXPECT_EQ(compile_plan(r, PlanRequest{"linear:weight", DType::BF16, std::nullopt, false}).streams.size(), 2u);
}

TEST(PruneUsage, UsageNeedingAMissingDirectionIsAUserError) {
  for (Usage u : {Usage::Training, Usage::Memory}) {
    try {
      (void)plan_for("w8a8_int8_inference", "linear:weight", u);
      ADD_FAILURE() << "accepted usage " << name(u);
    } catch (const UserError& e) {
      EXPECT_EQ(e.where(), "usage");
      EXPECT_NE(std::string(e.what()).find("needs the columnwise direction"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("linear:weight"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(plan_for("w8a8_int8_inference", "linear:weight").streams.size(), 1u);
  // A columnwise-only rule cannot serve inference (which needs rowwise).
  const Recipe c = parse_recipe(R"({"qforge_recipe": 1, "name": "t", "roles": [{"match": "*:*",
    "columnwise": {"format": "e4m3", "scaling": "per_tensor_current"}}]})");
  EXPECT_THROW(compile_plan(c, PlanRequest{"linear:input", DType::BF16, Usage::Inference, false}), UserError);
}

// ---- schedule_phases / select_tiles ----

TEST(SchedulePhases, IsIdempotent) {
  const Plan p = plan_for("nvfp4", "linear:input");
  EXPECT_EQ(schedule_phases(p), p);
  EXPECT_EQ(select_tiles(p), p);
}

TEST(SelectTiles, ShapesFollowLayoutsAndBlocks) {
  // same-layout columnwise (32 rows per block): 32 x 256 on 128 threads
  const Plan mx = plan_for("mxfp8", "linear:input");
  EXPECT_EQ(mx.tile, (TileConfig{32, 256, 128, 4}));
  const Plan w8 = plan_for("w8a8_int8_inference", "linear:input");  // no transpose: a wide row tile
  EXPECT_EQ(w8.tile, (TileConfig{16, 256, 256, 4}));
  const Plan cs = plan_for("current_scaling", "linear:input", std::nullopt, DType::FP32);
  EXPECT_EQ(cs.tile, (TileConfig{32, 512, 256, 4})) << "transposing: 32 rows of 512 columns";
  // Per-tensor row + transposed pairs of a 16-bit input: 128 x 128, registers for 3 CTAs per SM
  // (interior tiles cast from registers); fp32 input (above) keeps 32 x 512.
  const Plan dl = plan_for("delayed_scaling", "linear:input");
  EXPECT_EQ(dl.tile, (TileConfig{128, 128, 256, 4, 3}));
  const Plan cb = plan_for("current_scaling", "linear:input", std::nullopt, DType::FP16);
  EXPECT_EQ(cb.tile, (TileConfig{128, 128, 256, 4, 3}));
  // Per-channel pairs too (scales from the pre-pass's workspace); fp32 input keeps 32 x 512, and
  // the int8 weights' stochastic rounding (staged) keeps it as well.
  const Plan pc = plan_for("fp8_rowwise", "linear:input");
  EXPECT_EQ(pc.tile, (TileConfig{128, 128, 256, 4, 3}));
  EXPECT_EQ(plan_for("fp8_rowwise", "linear:input", std::nullopt, DType::FP32).tile, (TileConfig{32, 512, 256, 4}));
  EXPECT_EQ(plan_for("int8_weight_sr", "linear:weight").tile, (TileConfig{32, 512, 256, 4}));
  const Plan bw = plan_for("float8_block_scaling", "linear:input");  // 128x1 blocks: 128 rows
  EXPECT_EQ(bw.tile, (TileConfig{128, 128, 256, 4}));
  const Plan nv = plan_for("nvfp4", "linear:input");  // fp4: 64 x 128, 128 threads
  EXPECT_EQ(nv.tile, (TileConfig{64, 128, 128, 4}));
  const Plan sr = plan_for("nvfp4", "linear:grad_output");  // fp4 with stochastic rounding: the same
  EXPECT_EQ(sr.tile, (TileConfig{64, 128, 128, 4}));
  const Plan nvi = plan_for("nvfp4", "linear:input", Usage::Inference);  // fp4 rowwise only: 32 x 512
  EXPECT_EQ(nvi.tile, (TileConfig{32, 512, 256, 4}));
  const Plan id = plan_for("int8_weight_sr", "linear:input");  // bf16 passthrough + transpose: 128 x 128
  EXPECT_EQ(id.tile, (TileConfig{128, 128, 256, 4}));
  for (const Plan& p : {mx, w8, cs, dl, cb, pc, bw, nv, sr, nvi, id}) EXPECT_TRUE(tile_fits(p, p.tile));
}

TEST(SelectTiles, CandidatesAreValidAndStartWithTheDefault) {
  for (const char* recipe : {"mxfp8", "nvfp4", "float8_block_scaling", "current_scaling"}) {
    const Plan p = plan_for(recipe, "linear:input");
    const auto c = tile_candidates(p);
    ASSERT_GE(c.size(), 3u) << recipe;
    EXPECT_EQ(c.front(), p.tile);
    for (const auto& t : c) {
      EXPECT_TRUE(tile_fits(p, t)) << recipe << " " << t.rows << "x" << t.cols;
      EXPECT_EQ(t.rows % tile_constraints(p).row_multiple, 0);
    }
  }
  const Plan b = plan_for("float8_block_scaling", "linear:weight");  // 128x128 blocks
  EXPECT_FALSE(tile_fits(b, TileConfig{64, 128, 256, 4}));
  EXPECT_FALSE(tile_fits(b, TileConfig{128, 128, 48, 4})) << "threads: whole warps, at least 64";
}

// qforge tune's register-budget dimension: the default tile at register budgets of 64 .. 255 per
// thread (min blocks); codegen emits the override as the launch bounds' min blocks, and the
// default otherwise; tune times each distinct kernel once.
TEST(SelectTiles, RegisterBudgetCandidatesAndLaunchBounds) {
  // The 128x128 blockwise weight's default tile asks for 3 CTAs per SM (80 registers).
  EXPECT_EQ(plan_for("float8_block_scaling", "linear:weight").tile.min_blocks, 3);
  EXPECT_EQ(plan_for("float8_block_scaling", "linear:weight", Usage::Inference).tile.min_blocks, 0);
  const Plan p = plan_for("float8_block_scaling", "linear:input");  // 128 x 128, 256 threads, 1x128 blocks
  std::vector<int> budgets;
  for (const TileConfig& t : tile_candidates(p))
    if (t.min_blocks) {
      EXPECT_EQ(t.rows, p.tile.rows);
      EXPECT_EQ(t.cols, p.tile.cols);
      EXPECT_EQ(t.threads, p.tile.threads);
      budgets.push_back(t.min_blocks);
    }
  // 256 threads: 48 registers per thread are 5 CTAs, 64 are 4, 80 are 3, 96 and 128 two, 168 and
  // 255 one.
  EXPECT_EQ(budgets, (std::vector<int>{5, 4, 3, 2, 1}));
  // The search sets: registers only (the default tile first), tile shapes only.
  const auto regs = tile_candidates(p, TileSearch::Registers);
  ASSERT_EQ(regs.size(), 6u);
  EXPECT_EQ(regs[0], p.tile);
  for (const TileConfig& t : tile_candidates(p, TileSearch::Tiles)) EXPECT_EQ(t.min_blocks, 0);
  EXPECT_EQ(tile_candidates(p).size(), tile_candidates(p, TileSearch::Tiles).size() + 5);
  // What tune times: the default first, then only kernels with other launch bounds. The blockwise
  // weight's default asks for 3 CTAs itself, so its variants at 5, 4, 2 and 1 remain; the 1x128
  // plan's default bounds (by its shared memory) drop the equal variant.
  const Plan w = plan_for("float8_block_scaling", "linear:weight");
  const auto wt = distinct_tiles(w, tile_candidates(w, TileSearch::Registers));
  ASSERT_EQ(wt.size(), 5u);
  EXPECT_EQ(wt[0], w.tile);
  EXPECT_EQ(wt[0].min_blocks, 3);
  EXPECT_EQ(wt[1].min_blocks, 5);
  EXPECT_EQ(wt[2].min_blocks, 4);
  const auto pt = distinct_tiles(p, regs);
  EXPECT_EQ(pt[0], p.tile);
  std::vector<int> eff;
  for (const TileConfig& t : pt) {
    Plan q2 = p;
    q2.tile = t;
    eff.push_back(emit_quantize(q2, QuantizeForm::Separate).min_blocks);
  }
  std::vector<int> uniq = eff;
  std::sort(uniq.begin(), uniq.end());
  EXPECT_EQ(std::unique(uniq.begin(), uniq.end()), uniq.end()) << "each timed kernel has its own launch bounds";
  EXPECT_EQ(pt.size(), regs.size() - 1) << "one register variant equals the default";
  // At a whole-tile shape the 1x128 plan takes its program for interior tiles, whose registers
  // are sized for 3 CTAs (codegen.cpp register_pair): there the 3-CTA variant is the default's
  // kernel and the 2-CTA one (the default of the program for any tiles) a kernel of its own.
  std::vector<int> any_mb, interior_mb;
  for (const TileConfig& t : pt) any_mb.push_back(t.min_blocks);
  for (const TileConfig& t : distinct_tiles(p, regs, 16384, 16384)) interior_mb.push_back(t.min_blocks);
  EXPECT_EQ(any_mb, (std::vector<int>{0, 5, 4, 3, 1}));
  EXPECT_EQ(interior_mb, (std::vector<int>{0, 5, 4, 2, 1}));
  EXPECT_EQ(distinct_tiles(p, regs, 16384, 16380).size(), pt.size()) << "edge tiles: the program for any tiles";
  // 128-thread tiles (NVFP4's weight, 8 CTAs at 64 registers by default) get budgets of 10 (48 registers), 8, 6, 5, 4, 3, 2 CTAs.
  std::vector<int> fp4;
  for (const TileConfig& t : tile_candidates(plan_for("nvfp4", "linear:weight"), TileSearch::Registers))
    if (t.min_blocks) fp4.push_back(t.min_blocks);
  EXPECT_EQ(fp4, (std::vector<int>{10, 8, 6, 5, 4, 3, 2}));
  const KernelSource def = emit_quantize(p, QuantizeForm::Separate);
  EXPECT_GE(def.min_blocks, 1);
  Plan q = p;
  q.tile.min_blocks = 3;
  const KernelSource ks = emit_quantize(q, QuantizeForm::Separate);
  EXPECT_EQ(ks.min_blocks, 3);
  EXPECT_NE(ks.source.find("static constexpr long long kMinBlocks = 3;"), std::string::npos);
  EXPECT_NE(print(q).find("min_blocks=3"), std::string::npos);
  EXPECT_EQ(print(p).find("min_blocks"), std::string::npos) << "the default prints as before";
  TileConfig big = p.tile;
  big.min_blocks = 9;  // 9 x 256 threads > 2048
  EXPECT_FALSE(tile_fits(p, big));
  big.min_blocks = -1;
  EXPECT_FALSE(tile_fits(p, big));
}

// The tile is only part of a kernel's shared memory (scratch, the staged transposed output and
// entries come on top): every candidate `qforge tune` may time, of every shipped plan, must
// still fit an SM's 227 KiB.
TEST(SelectTiles, EveryCandidateFitsSharedMemory) {
  size_t checked = 0;
  for (const char* recipe : {"delayed_scaling", "current_scaling", "float8_block_scaling", "mxfp8", "nvfp4",
                             "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr", "w8a8_int8_inference", "fp8_rowwise"})
    for (const char* role : {"linear:input", "linear:weight", "linear:grad_output"})
      for (Usage u : {Usage::Training, Usage::Inference})
        for (DType d : {DType::BF16, DType::FP32}) {
          Plan p;
          try {
            p = plan_for(recipe, role, u, d);
          } catch (const UserError&) {
            continue;  // a role or usage the recipe does not define
          }
          for (const TileConfig& t : tile_candidates(p)) {
            Plan c = p;
            c.tile = t;
            EXPECT_LE(emit_quantize(c, QuantizeForm::Separate).smem_bytes, 227u * 1024u)
                << recipe << " " << role << " " << t.rows << "x" << t.cols << "/" << t.threads;
            ++checked;
          }
        }
  EXPECT_GT(checked, 500u);
}

// ---- verify ----

// Runs verify on a broken plan and checks it is an InternalError with file:line.
void expect_broken(const Plan& p, const std::string& what) {
  try {
    verify(p);
    ADD_FAILURE() << "verify accepted a plan with: " << what;
  } catch (const InternalError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(std::regex_search(m, std::regex(R"(internal error at \S+ir\.cpp:[0-9]+: check failed)"))) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  }
}

TEST(Verify, AcceptsEveryPlanOfEveryShippedRecipe) {
  for (const auto& entry : fs::directory_iterator(fs::path(QF_SOURCE_DIR) / "recipes")) {
    if (entry.path().extension() != ".json" || entry.path().filename() == "recipe.schema.json") continue;
    const Recipe r = load_recipe(entry.path());
    for (auto role : standard_roles())
      for (DType d : {DType::BF16, DType::FP16, DType::FP32})
        for (Usage u : {Usage::Training, Usage::Inference, Usage::Memory}) {
          Plan p;
          try {
            p = compile_plan(r, PlanRequest{std::string(role), d, u, false});
          } catch (const UserError&) {
            continue;  // role not covered, or usage not servable: tested elsewhere
          }
          SCOPED_TRACE(r.name + " " + std::string(role));
          EXPECT_NO_THROW(verify(p));
        }
  }
}

TEST(Verify, CatchesHandBrokenPlans) {
  const Plan cs = plan_for("current_scaling", "linear:input");
  const Plan nv = plan_for("nvfp4", "linear:input");
  const Plan blk = plan_for("float8_block_scaling", "linear:weight");
  {
    Plan p = cs;
    p.streams.clear();
    expect_broken(p, "at least one stream");
  }
  {
    Plan p = cs;
    std::swap(p.streams[0], p.streams[1]);
    expect_broken(p, "ordered rowwise, columnwise");
  }
  {
    Plan p = cs;
    p.streams[0].tensor_amax = 5;
    expect_broken(p, "tensor amax index");
  }
  {
    Plan p = cs;
    p.streams[0].tensor_amax = -1;
    expect_broken(p, "tensor amax wiring");
  }
  {
    Plan p = cs;
    p.amax.push_back(AmaxSource{});
    expect_broken(p, "amax source 1 is unused");
  }
  {
    Plan p = cs;
    p.phases.erase(p.phases.begin());  // the current-scaling amax is no longer reduced first
    expect_broken(p, "reduced before the cast iff");
  }
  {
    Plan p = cs;
    std::swap(p.phases[0], p.phases[1]);
    expect_broken(p, "the last phase is the cast");
  }
  {
    Plan p = cs;
    p.streams[0].rounding = Rounding::Stochastic;
    expect_broken(p, "SR on e4m3");
  }
  {
    Plan p = cs;
    p.streams[0].format = ElemFormat::E2M1;
    expect_broken(p, "not allowed with per_tensor_current");
  }
  {
    Plan p = cs;
    p.streams[0].layout = DataLayout::Transposed;
    expect_broken(p, "transposed rowwise");
  }
  {
    Plan p = nv;
    p.streams[0].rht = Rht{};
    expect_broken(p, "RHT on a rowwise stream");
  }
  {
    Plan p = nv;
    std::swap(p.streams[1].tensor_amax, p.streams[0].tensor_amax);  // raw amax for the rotated stream
    expect_broken(p, "tensor amax is over the values the stream casts");
  }
  {
    // RHT with per-tensor scaling (no block amax whose check would fire first).
    const Recipe r = parse_recipe(R"({"qforge_recipe": 1, "name": "t", "roles": [{"match": "*:*",
      "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"},
      "columnwise": {"format": "e4m3", "scaling": "per_tensor_current", "rht": true}}]})");
    Plan p = compile_plan(r, PlanRequest{"linear:input", DType::BF16, std::nullopt, false});
    EXPECT_NO_THROW(verify(p));
    p.tile.rows = 8;
    expect_broken(p, "RHT groups of 16");
  }
  {
    Plan p = cs;
    p.amax[0].before_cast = false;  // current scaling would cast before knowing its scale
    p.phases.erase(p.phases.begin());
    expect_broken(p, "tensor amax 0 is needed before the cast");
  }
  {
    Plan p = plan_for("int8_weight_sr", "linear:weight");
    std::swap(p.streams[0].local_amax, p.streams[1].local_amax);  // per-column amax for rows
    expect_broken(p, "channel amax 1 runs along the stream's direction");
  }
  {
    Plan p = blk;
    p.tile.rows = 64;
    expect_broken(p, "is a multiple of block 128x128");
  }
  {
    Plan p = blk;
    p.streams[1].local_amax = 1;
    p.amax.push_back(p.amax[0]);
    expect_broken(p, "survived sharing");
  }
  {
    Plan p = blk;
    p.amax[0].block = {1, 128};
    expect_broken(p, "block amax has the stream's block");
  }
}

// ---- print ----

TEST(Print, CurrentScalingGolden) {
  EXPECT_EQ(print(plan_for("current_scaling", "linear:input")),
            "plan recipe=current_scaling role=linear:input input=bf16 usage=training\n"
            "  %a0 = tensor max|x| [before cast]\n"
            "  stream rowwise: e4m3 scaling=per_tensor_current(eps=0, pow2=false) tensor_amax=%a0\n"
            "  stream columnwise: e4m3 scaling=per_tensor_current(eps=0, pow2=false) layout=transposed tensor_amax=%a0\n"
            "  phase 0: amax_reduce %a0\n"
            "  phase 1: cast tile=128x128 threads=256 vec=4 min_blocks=3\n");
}

TEST(Print, DelayedScalingInferenceGolden) {
  EXPECT_EQ(print(plan_for("delayed_scaling", "linear:grad_output", Usage::Inference, DType::FP16)),
            "plan recipe=delayed_scaling role=linear:grad_output input=fp16 usage=inference\n"
            "  %a0 = tensor max|x| [during cast]\n"
            "  stream rowwise: e5m2 scaling=per_tensor_delayed(margin=0, history=1024, amax_compute=max) tensor_amax=%a0\n"
            "  phase 0: cast tile=16x256 threads=256 vec=4\n");
}

TEST(Print, Nvfp4GradOutputGolden) {
  EXPECT_EQ(print(plan_for("nvfp4", "linear:grad_output")),
            "plan recipe=nvfp4 role=linear:grad_output input=bf16 usage=training\n"
            "  %a0 = tensor max|x| [before cast]\n"
            "  %a1 = block(1x16) max|x| [during cast]\n"
            "  %a2 = tensor max|x| after rht(0xD7E8) [before cast]\n"
            "  %a3 = block(16x1) max|x| after rht(0xD7E8) [during cast]\n"
            "  stream rowwise: e2m1 scaling=nvfp4(block=1x16) rounding=stochastic scale_layout=compact tensor_amax=%a0 local_amax=%a1\n"
            "  stream columnwise: e2m1 scaling=nvfp4(block=16x1) rounding=stochastic rht=0xD7E8 layout=transposed scale_layout=compact tensor_amax=%a2 local_amax=%a3\n"
            "  phase 0: amax_reduce %a0 %a2\n"
            "  phase 1: cast tile=64x128 threads=128 vec=4\n");
}

TEST(Print, LoweredPlanHasNoPhasesAndGroupedIsShown) {
  const Plan p = lower(shipped("int8_weight_sr"), PlanRequest{"grouped_linear:input", DType::FP32, std::nullopt, true});
  EXPECT_EQ(print(p),
            "plan recipe=int8_weight_sr role=grouped_linear:input input=fp32 usage=training grouped\n"
            "  stream rowwise: identity(fp32) scaling=none\n"
            "  stream columnwise: identity(fp32) scaling=none layout=transposed\n");
}

// ---- pipeline dumps ----

TEST(PipelineDump, AfterAllNotesUnchangedPasses) {
  std::ostringstream log;
  PipelineOptions opt;
  opt.dump_after = {"all"};
  opt.log = &log;
  (void)compile_plan(shipped("mxfp8"), PlanRequest{"linear:input", DType::BF16, std::nullopt, false}, opt);
  const std::string s = log.str();
  EXPECT_NE(s.find("// ---- after lower\n"), std::string::npos) << s;
  EXPECT_NE(s.find("// ---- after prune_usage (unchanged)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("// ---- after share_amax (unchanged)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("// ---- after schedule_phases\n"), std::string::npos) << s;
  EXPECT_NE(s.find("// ---- after select_tiles\n"), std::string::npos) << s;
}

TEST(PipelineDump, UnknownPassIsAUserError) {
  PipelineOptions opt;
  opt.dump_after = {"share"};
  try {
    (void)compile_plan(shipped("mxfp8"), PlanRequest{"linear:input", DType::BF16, std::nullopt, false}, opt);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(e.where(), "--dump-after");
  }
  EXPECT_EQ(pass_names(), (std::vector<std::string>{"lower", "prune_usage", "share_amax", "schedule_phases", "select_tiles"}));
}

}  // namespace
