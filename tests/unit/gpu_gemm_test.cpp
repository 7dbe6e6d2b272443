// GPU tests of the grouped fp8 GEMM (runtime/gemm.h): skipped without a GPU.
//
//   GemmExact   small-integer operands, power-of-two scales and alpha (reference/gemm_problem.h):
//               every partial sum is exact, so every output element must equal exact_output()
//               bit for bit; every scaling (incl. MXFP8, NVFP4) x format x output x accumulate x tile variant, uneven
//               groups including empty ones, M, N and K not multiples of the tile, rows after the
//               last group that must stay untouched (outputs are poisoned with 0xFF first).
//   GemmRandom  random fp8 operands and scales against the float64 reference within the bound of
//               gemm_tolerance(), plus the relative Frobenius error; long K, more tiles than SMs.
//               The masked layout ([G, m_max, K] with device counts) and the K-grouped (wgrad)
//               layout run through the same checks.
//   GemmEdge    all groups empty; an mn_major A grid past the buffer (falling offsets) gives NaN (blockwise, MXFP8); a K-grouped MX or NVFP4 NaN scale stays in its group; the K-grouped fp32
//               reduce-add keeps subnormal and special old values; a second launch gives the same bits;
//               the members layout's workspace errors.
//   K-grouped members (the grouped quantizer's per-member copies) run through GemmExact (misaligned
//   members must read NaN; a ring case with 3 CTAs) and GemmRandom.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <sstream>

#include "compiler/error.h"
#include "qforge/numerics.cuh"
#include "reference/gemm.h"
#include "reference/gemm_problem.h"
#include "runtime/gemm.h"
#include "runtime/gpu_test_util.h"

namespace {

using namespace qf;
using qf::rt::DeviceBuffer;

struct Case {
  std::string name;
  GemmSpec spec;
  std::vector<int64_t> groups;
  int64_t trailing = 0;
  bool alpha = false;
  int64_t m_max = 0;  // > 0: masked layout, `groups` are the per-slot counts
  // K-grouped (KGrouped, KGroupedMembers): `groups` are token counts, `trailing` padding tokens.
  int max_ctas = 0;   // > 0: fewer persistent CTAs (each walks more groups)
};

ref::GemmProblem problem_of(const Case& c, ref::GemmValues values, uint64_t seed) {
  if (k_grouped(c.spec.layout))
    return ref::make_k_grouped_gemm_problem(c.spec, c.groups, c.trailing, values, c.alpha, seed);
  if (c.m_max > 0) return ref::make_masked_gemm_problem(c.spec, c.groups, c.m_max, values, c.alpha, seed);
  return ref::make_gemm_problem(c.spec, c.groups, c.trailing, values, c.alpha, seed);
}
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

GemmSpec spec_of(GemmScaling s, ElemFormat a, ElemFormat b, DType out, bool acc, bool fast, int bm, int bn, int mc,
                 int64_t n, int64_t k, int ordered = 0) {
  GemmSpec g;
  g.tile.ordered = ordered;
  g.scaling = s, g.a_format = a, g.b_format = b, g.out_dtype = out, g.accumulate = acc, g.fast_accum = fast;
  g.tile.block_m = bm, g.tile.block_n = bn, g.tile.multicast = mc;
  g.n = n, g.k = k;
  return g;
}

// Blockwise / MXFP8 scale grids stored mn_major ([token blocks, rows padded to 4]).
GemmSpec mn_major(GemmSpec s) {
  s.scale_layout = ScaleLayout::MnMajor;
  return s;
}

// The dequant route: MXFP8 / NVFP4 operands into 16-bit copies, then the none GEMM (whose tile
// the spec's is).
GemmSpec dequant(GemmSpec s) {
  s.route = GemmRoute::Dequant;
  return s;
}

// Identity operands as fp16 (bf16 by default).
GemmSpec fp16(GemmSpec s) {
  s.operand_dtype = DType::FP16;
  return s;
}

// Device copies of a problem and a launch of it.
struct Device {
  DeviceBuffer a, b, sa, sb, alpha, off, d, a_amax, b_amax;
  rt::GemmCall call;
};

DeviceBuffer upload(const void* p, size_t bytes) {
  DeviceBuffer b(std::max<size_t>(bytes, 16));
  if (bytes) b.upload(p, bytes);
  return b;
}

Device to_device(const GemmSpec& spec, const ref::GemmProblem& p) {
  Device d;
  const size_t ob = size_t(traits(spec.out_dtype).bytes);
  d.a = upload(p.a.data(), p.a.size());
  d.b = upload(p.b.data(), p.b.size());
  d.sa = upload(p.a_scale.data(), p.a_scale.size());
  d.sb = upload(p.b_scale.data(), p.b_scale.size());
  if (!p.alpha.empty()) d.alpha = upload(p.alpha.data(), p.alpha.size() * 4);
  if (!p.a_amax.empty()) {
    d.a_amax = upload(p.a_amax.data(), p.a_amax.size() * 4);
    d.b_amax = upload(p.b_amax.data(), p.b_amax.size() * 4);
  }
  if (p.m_max > 0) d.off = upload(p.counts.data(), p.counts.size() * 8);
  else d.off = upload(p.offsets.data(), p.offsets.size() * 8);
  if (spec.accumulate) d.d = upload(p.d_init.data(), p.d_init.size() * 4);
  else d.d = rt::testing::poisoned_buffer(std::max<size_t>(size_t(p.out_rows * spec.n) * ob, 16));
  auto v = [](const DeviceBuffer& b) { return rt::testing::view_of(b); };
  d.call.a = v(d.a), d.call.b = v(d.b), d.call.d = v(d.d);
  if (gemm_a_scaled(spec)) d.call.a_scale = v(d.sa);
  if (gemm_b_scaled(spec)) d.call.b_scale = v(d.sb);
  if (!p.alpha.empty()) d.call.alpha = v(d.alpha);
  if (!p.a_amax.empty()) d.call.a_amax = v(d.a_amax), d.call.b_amax = v(d.b_amax);
  if (p.m_max > 0) d.call.group_counts = v(d.off), d.call.m_max = p.m_max;
  else d.call.group_offsets = v(d.off);
  d.call.m_total = p.m_total;
  d.call.k_total = p.k_total;
  d.call.num_groups = p.num_groups();
  return d;
}

// zero_workspace: the workspace zero-filled instead of poisoned (the dequant route on members: a
// member the fused kernel cannot load must be NaN by its own doing, not by the poison).
std::vector<uint8_t> run(const GemmSpec& spec, Device& dev, int max_ctas = 0, bool zero_workspace = false) {
  rt::Gemm gemm(spec);
  rt::Stream stream;
  // Members: the kernel's tensor-map ring (poisoned: every map it uses must be one it wrote); the
  // dequant route: the operands' copies (poisoned: every element the GEMM reads must be written),
  // with members also its none GEMM's maps.
  const bool copies = spec.route != GemmRoute::Fused;
  const int64_t ws_bytes = copies ? gemm.workspace_bytes(k_grouped(spec.layout) ? dev.call.k_total : dev.call.m_total,
                                                         dev.call.num_groups)
                                  : gemm.workspace_bytes();
  DeviceBuffer ws = rt::testing::poisoned_buffer(size_t(std::max<int64_t>(ws_bytes, 256)), zero_workspace ? 0x00 : 0xFF);
  if (spec.layout == GemmLayout::KGroupedMembers || copies) dev.call.workspace = rt::testing::view_of(ws);
  dev.call.max_ctas = max_ctas;
  gemm.run(dev.call, stream.get());
  stream.synchronize();
  return dev.d.download_as<uint8_t>();
}

uint32_t out_bits(const GemmSpec& s, const std::vector<uint8_t>& d, int64_t idx) {
  if (s.out_dtype == DType::FP32) {
    uint32_t u;
    std::memcpy(&u, &d[size_t(idx) * 4], 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, &d[size_t(idx) * 2], 2);
  return h;
}

// The float64 reference of every output row of a problem.
ref::GemmRows reference_of_every_row(const GemmSpec& s, const ref::GemmProblem& p) {
  std::vector<int64_t> rows(size_t(p.out_rows));
  for (int64_t r = 0; r < p.out_rows; ++r) rows[size_t(r)] = r;
  return ref::gemm_reference(s, p.operands(), rows);
}

float bits_value(const GemmSpec& s, uint32_t bits) { return s.out_dtype == DType::FP32 ? f32_from_bits(bits) : bf16_to_f32(u16(bits)); }

// ------------------------------------------------------------------------------- exact

class GemmExact : public ::testing::TestWithParam<Case> {};

TEST_P(GemmExact, BitExactSmallIntegers) {
  QF_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const GemmSpec& s = c.spec;
  const ref::GemmProblem p = problem_of(c, ref::GemmValues::SmallIntegers, 1234 + c.groups.size());
  const ref::GemmRows ref = reference_of_every_row(s, p);
  // The dequant route on members runs twice: over a poisoned workspace (every copy element the GEMM
  // reads is written) and a zero-filled one (a member the fused kernel cannot load is NaN by the
  // route's own doing).
  const bool twice = s.route != GemmRoute::Fused && s.layout == GemmLayout::KGroupedMembers;
  for (const bool zero_workspace : twice ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
    SCOPED_TRACE(zero_workspace ? "zero-filled workspace" : "poisoned workspace");
    Device dev = to_device(s, p);
    const std::vector<uint8_t> got = run(s, dev, c.max_ctas, zero_workspace);
    int64_t bad = 0, nans = 0;
    std::ostringstream first;
    for (int64_t r = 0; r < p.out_rows; ++r)
      for (int64_t n = 0; n < s.n; ++n) {
        const int64_t idx = r * s.n + n;
        const uint32_t g = out_bits(s, got, idx);
        uint32_t want;
        if (ref.group[size_t(r)] < 0) {  // no group: untouched (poison, or the previous output)
          want = s.accumulate ? f32_bits(p.d_init[size_t(idx)]) : (s.out_dtype == DType::FP32 ? 0xFFFFFFFFu : 0xFFFFu);
        } else if (std::isnan(ref.value[size_t(idx)])) {  // members: a member the kernel cannot load
          ++nans;
          if (!std::isnan(bits_value(s, g)) && bad++ < 1)
            first << "row " << r << " (group " << ref.group[size_t(r)] << ") col " << n << ": got " << bits_value(s, g)
                  << ", expected NaN (a misaligned member)";
          continue;
        } else {
          want = ref::exact_output(s, ref.value[size_t(idx)], s.accumulate ? p.d_init[size_t(idx)] : 0.0f);
        }
        if (g != want && bad++ < 1)
          first << "row " << r << " (group " << ref.group[size_t(r)] << ") col " << n << ": got " << bits_value(s, g)
                << " (0x" << std::hex << g << "), expected " << bits_value(s, want) << " (0x" << want << std::dec << ")";
      }
    EXPECT_EQ(bad, 0) << bad << " of " << p.out_rows * s.n << " elements differ; first: " << first.str();
    if (s.layout == GemmLayout::KGroupedMembers) {
      EXPECT_GT(nans, 0) << "the members cases include misaligned members";
    }
  }
}

std::vector<Case> exact_cases() {
  using S = GemmScaling;
  const auto E4 = ElemFormat::E4M3, E5 = ElemFormat::E5M2;
  const std::vector<int64_t> uneven = {0, 37, 300, 0, 129, 1};  // empty groups, partial tiles
  std::vector<Case> v;
  auto add = [&](std::string name, GemmSpec s, std::vector<int64_t> g = {}, int64_t trailing = 5, bool alpha = true) {
    v.push_back({std::move(name), s, g.empty() ? uneven : g, trailing, alpha});
  };
  // N = 200 (two n-blocks of 128, the second partial), K = 400 (three full k-blocks + 16).
  add("block_e4m3_bf16", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 400));
  add("block_e4m3_bf16_noalpha", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 400), {}, 0,
      false);
  add("block_e4m3_bf16_mc2", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 2, 200, 400));
  add("block_e5m2_e4m3_fp32", spec_of(S::Block128, E5, E4, DType::FP32, false, false, 128, 128, 1, 200, 400));
  add("block_e4m3_e5m2_fp32_acc", spec_of(S::Block128, E4, E5, DType::FP32, true, false, 128, 128, 1, 200, 400));
  add("block_bm64_bn64", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 64, 64, 1, 200, 400));
  add("block_bn64_mc2_acc", spec_of(S::Block128, E4, E4, DType::FP32, true, false, 128, 64, 2, 256, 512));
  add("tensor_promote_bf16", spec_of(S::PerTensor, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 400));
  add("tensor_fast_bf16", spec_of(S::PerTensor, E4, E4, DType::BF16, false, true, 128, 128, 1, 200, 400));
  add("tensor_fast_bn256_mc2", spec_of(S::PerTensor, E5, E5, DType::BF16, false, true, 128, 256, 2, 504, 400));
  add("tensor_fast_bn192_fp32_acc", spec_of(S::PerTensor, E4, E5, DType::FP32, true, true, 128, 192, 1, 200, 400));
  add("tensor_fast_bm64_bn64_fp32", spec_of(S::PerTensor, E4, E4, DType::FP32, false, true, 64, 64, 1, 200, 400));
  add("rowwise_promote_bf16", spec_of(S::RowChannel, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 400));
  add("rowwise_fast_bf16_bn256", spec_of(S::RowChannel, E4, E4, DType::BF16, false, true, 128, 256, 1, 200, 400));
  add("rowwise_fast_fp32_acc_mc2", spec_of(S::RowChannel, E5, E4, DType::FP32, true, true, 128, 128, 2, 200, 400));
  add("rowwise_promote_fp32_bm64", spec_of(S::RowChannel, E4, E4, DType::FP32, false, false, 64, 128, 1, 200, 400));
  // Ordered MMA issue off (the default with promotion) and on (without).
  add("block_unordered", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 400, 1));
  add("block_unordered_mc2_fp32", spec_of(S::Block128, E4, E5, DType::FP32, false, false, 128, 128, 2, 200, 400, 1));
  add("rowwise_promote_unordered", spec_of(S::RowChannel, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 400, 1));
  add("tensor_fast_ordered_mc2", spec_of(S::PerTensor, E4, E4, DType::BF16, false, true, 128, 128, 2, 200, 400, 2));
  // MXFP8: e8m0 scales per 32 of K (K a multiple of 128).
  add("mxfp8_e4m3_bf16", spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 384));
  add("mxfp8_e5m2_e4m3_fp32_acc_mc2", spec_of(S::Mx32, E5, E4, DType::FP32, true, false, 128, 128, 2, 256, 512));
  add("mxfp8_bm64_bn64_fp32", spec_of(S::Mx32, E4, E5, DType::FP32, false, false, 64, 64, 1, 200, 128));
  // One group; K = 16 (one partial k-block); N = 8 (one partial n-block).
  add("block_one_group_tiny", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 8, 16), {3}, 0);
  add("tensor_one_group_tiny_fp32", spec_of(S::PerTensor, E4, E4, DType::FP32, false, true, 128, 128, 1, 8, 16), {130}, 2);
  // Many small groups and more tiles than SMs: the persistent loop crosses groups and wraps the
  // pipeline ring many times.
  std::vector<int64_t> many(40);
  for (size_t i = 0; i < many.size(); ++i) many[i] = int64_t((i * 37) % 190);
  add("block_many_groups", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 1024, 512), many, 3);
  add("block_many_groups_mc2", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 2, 1024, 512), many, 3);
  // Masked layout [G, m_max, K]: counts with an empty slot, a partial tile, a full slot, one
  // above m_max (clamped) and one negative (empty); the unused rows of every slot stay untouched.
  auto masked = [&](std::string name, GemmSpec s, int64_t m_max) {
    v.push_back({std::move(name), s, {37, 0, 256, 1000, -5, 129}, 0, true, m_max});
  };
  masked("masked_block_bf16", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 400), 256);
  // mn_major A grids (the grouped quantizer's members: each group's [k-blocks, rows rounded up
  // to 4] after those of the groups before): groups of 37, 129 and 1 rows pad theirs; masked
  // slots of 258 rows take 260 each.
  add("block_mn_major_bf16", mn_major(spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 400)));
  add("block_mn_major_e5m2_fp32_acc_mc2", mn_major(spec_of(S::Block128, E5, E4, DType::FP32, true, false, 128, 128, 2, 256, 512)));
  add("block_mn_major_bm64_bn64_unordered", mn_major(spec_of(S::Block128, E4, E5, DType::FP32, false, false, 64, 64, 1, 200, 400, 1)));
  add("block_mn_major_many_groups_3ctas", mn_major(spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 1024, 1152)),
      many, 3);
  v.back().max_ctas = 3;  // each CTA walks every group: the grid prefix carries across them
  add("block_mn_major_one_group_tiny", mn_major(spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 8, 16)), {3}, 0);
  masked("masked_block_mn_major_fp32", mn_major(spec_of(S::Block128, E4, E4, DType::FP32, false, false, 128, 128, 1, 200, 400)), 258);
  masked("masked_tensor_fast_fp32_acc_mc2", spec_of(S::PerTensor, E4, E5, DType::FP32, true, true, 128, 128, 2, 256, 400), 256);
  masked("masked_mxfp8_bm64", spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 64, 128, 1, 200, 256), 200);
  // MXFP8 on mn_major grids (A per group as above, B per expert [K/32, N]: groups of 37, 129 and 1
  // rows pad A's; 40 groups on 3 CTAs; masked slots of 258).
  add("mxfp8_mn_major_bf16", mn_major(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 384)));
  add("mxfp8_mn_major_e5m2_fp32_acc_mc2", mn_major(spec_of(S::Mx32, E5, E4, DType::FP32, true, false, 128, 128, 2, 256, 512)));
  add("mxfp8_mn_major_bm64_bn64_fp32", mn_major(spec_of(S::Mx32, E4, E5, DType::FP32, false, false, 64, 64, 1, 200, 128)));
  add("mxfp8_mn_major_many_groups_3ctas", mn_major(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 1024, 512)),
      many, 3);
  v.back().max_ctas = 3;
  masked("masked_mxfp8_mn_major_bm64", mn_major(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 64, 128, 1, 200, 256)), 258);
  // K-grouped (wgrad): token counts with an empty group and partial 128-token tails (K of a
  // group starting mid-block), padding tokens after the last group.
  auto kgrouped = [&](std::string name, GemmSpec s, std::vector<int64_t> tokens, int64_t pad, int max_ctas = 0) {
    s.layout = GemmLayout::KGrouped;
    s.m = s.k, s.k = 0;  // spec_of's k argument is the output rows here
    v.push_back({std::move(name), s, std::move(tokens), pad, true, 0, max_ctas});
  };
  const std::vector<int64_t> tok = {37, 0, 300, 129, 1, 16};  // every partial sum < 2^24 with |a|, |b| <= 2
  kgrouped("kgrouped_tensor_bf16", spec_of(S::PerTensor, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200), tok, 5);
  kgrouped("kgrouped_tensor_fast_fp32_acc", spec_of(S::PerTensor, E4, E5, DType::FP32, true, true, 128, 128, 1, 256, 130), tok, 0);
  kgrouped("kgrouped_tensor_bm64_bn64_fp32", spec_of(S::PerTensor, E5, E4, DType::FP32, false, false, 64, 64, 1, 72, 64), tok, 40);
  kgrouped("kgrouped_tensor_unordered", spec_of(S::PerTensor, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200, 1), tok, 3);
  // Per-channel wgrad: A's and B's per-row scales shared by the groups (members: per member).
  kgrouped("kgrouped_rowwise_bf16", spec_of(S::RowChannel, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200), tok, 5);
  // ... on 3 CTAs: each walks many tiles, so the epilogue's column factors are restaged per tile.
  kgrouped("kgrouped_rowwise_3ctas_fp32", spec_of(S::RowChannel, E4, E4, DType::FP32, false, false, 128, 128, 1, 264, 300), tok, 0, 3);
  kgrouped("kgrouped_rowwise_fast_bn256_fp32_acc", spec_of(S::RowChannel, E5, E4, DType::FP32, true, true, 128, 256, 1, 264, 130),
           {127, 1, 255, 0, 129, 384, 2}, 3);
  kgrouped("kgrouped_int8_rowwise_bm64_fp32", spec_of(S::RowChannel, ElemFormat::Int8, ElemFormat::Int8, DType::FP32, false, false,
                                                     64, 128, 1, 136, 72), tok, 0);
  kgrouped("kgrouped_tensor_fast_all_empty_but_one", spec_of(S::PerTensor, E4, E4, DType::BF16, false, true, 128, 128, 1, 128, 128),
           {0, 0, 200, 0}, 0);
  // Blockwise and MX wgrad: scales per row of A and B per 128 / 32 tokens; groups start inside a
  // 128-token block (the tile starts at the block, up to 127 tokens early), 32-steps of a k-block
  // wholly outside the group.
  const std::vector<int64_t> tok128 = {127, 1, 255, 0, 129, 384, 2};
  kgrouped("kgrouped_block_bf16", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200), tok, 5);
  // mn_major grids; 202 output rows: A's grid rows padded to 204 per token block.
  kgrouped("kgrouped_block_mn_major_bf16", mn_major(spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 202)),
           tok, 5);
  kgrouped("kgrouped_block_mn_major_fp32_acc_bm64",
           mn_major(spec_of(S::Block128, E5, E4, DType::FP32, true, false, 64, 128, 1, 136, 130)), tok, 0);
  kgrouped("kgrouped_block_fp32_acc_bn64_unordered",
           spec_of(S::Block128, E4, E5, DType::FP32, true, false, 128, 64, 1, 136, 130, 1), tok128, 0);
  kgrouped("kgrouped_block_bm64_fp32", spec_of(S::Block128, E5, E4, DType::FP32, false, false, 64, 128, 1, 72, 64), tok128, 40);
  // MX scale rows of 16 bytes (496 tokens; one u32 load per row and k-block) and of 33 bytes (1040
  // tokens; byte loads).
  kgrouped("kgrouped_mxfp8_bf16", spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200), tok, 5);
  kgrouped("kgrouped_mxfp8_fp32_acc_bm64", spec_of(S::Mx32, E5, E4, DType::FP32, true, false, 64, 128, 1, 256, 130), tok128, 3);
  add("mxfp8_many_groups", spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 1024, 512), many, 3);
  // mn_major token grids: 202 and 130 output rows pad A's grid to 204 and 132 per 32-token step.
  kgrouped("kgrouped_mxfp8_mn_major_bf16", mn_major(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 202)),
           tok, 5);
  kgrouped("kgrouped_mxfp8_mn_major_fp32_acc_bm64",
           mn_major(spec_of(S::Mx32, E5, E4, DType::FP32, true, false, 64, 128, 1, 264, 130)), tok128, 3);
  // NVFP4 wgrad: groups start and end at odd tokens (inside a byte of packed e2m1 and inside 16-token
  // scale blocks); scale rows of 16 bytes (512 tokens: one 8-byte load per row and k-block) and of
  // 58 bytes (928 tokens: two-byte loads).
  const auto F4 = ElemFormat::E2M1;
  kgrouped("kgrouped_nvfp4_bf16", spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 128, 1, 200, 200), tok, 5);
  kgrouped("kgrouped_nvfp4_fp32_acc", spec_of(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 128, 1, 136, 130), tok128, 3);
  // K-grouped members (the grouped quantizer's per-member copies, tensor maps built on the device):
  // an empty member, partial 128-token tails, a 24-token member (not a multiple of 16: NaN) and the
  // member after it (its first token misaligned: NaN too); NVFP4 in multiples of 32.
  auto members = [&](std::string name, GemmSpec s, std::vector<int64_t> tokens, int64_t pad, int max_ctas = 0) {
    s.layout = GemmLayout::KGroupedMembers;
    s.m = s.k, s.k = 0;
    v.push_back({std::move(name), s, std::move(tokens), pad, true, 0, max_ctas});
  };
  const std::vector<int64_t> mtok = {48, 0, 304, 16, 24, 32}, mtok4 = {64, 0, 288, 32, 48, 64};
  members("members_tensor_bf16", spec_of(S::PerTensor, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200), mtok, 16);
  members("members_tensor_fast_fp32_acc", spec_of(S::PerTensor, E4, E5, DType::FP32, true, true, 128, 128, 1, 256, 130), mtok, 0);
  members("members_block_bf16", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200), mtok, 16);
  members("members_block_fp32_acc_bn64", spec_of(S::Block128, E5, E4, DType::FP32, true, false, 128, 64, 1, 136, 130), mtok, 0);
  members("members_block_mn_major_bf16", mn_major(spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 202)),
          mtok, 16);
  members("members_rowwise_bf16", spec_of(S::RowChannel, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200), mtok, 16);
  members("members_rowwise_fp32_acc", spec_of(S::RowChannel, E4, E5, DType::FP32, true, false, 128, 128, 1, 256, 130), mtok, 0);
  members("members_rowwise_3ctas", spec_of(S::RowChannel, E4, E4, DType::BF16, false, false, 128, 128, 1, 264, 300), mtok, 0, 3);
  members("members_mxfp8_bf16", spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200), mtok, 16);
  members("members_mxfp8_fp32_acc_bm64", spec_of(S::Mx32, E4, E5, DType::FP32, true, false, 64, 128, 1, 256, 130), mtok, 0);
  members("members_mxfp8_mn_major_bf16", mn_major(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 202)),
          mtok, 16);

  members("members_nvfp4_bf16", spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 128, 1, 200, 200), mtok4, 32);
  members("members_nvfp4_fp32_acc", spec_of(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 128, 1, 136, 130), mtok4, 0);
  // 40 members on 3 CTAs: each CTA walks ~13 groups, so its ring of load slots + 1 map slots wraps.
  std::vector<int64_t> many16(40), many32(40);
  for (size_t i = 0; i < many16.size(); ++i) many16[i] = int64_t((i * 37) % 190) / 16 * 16, many32[i] = many16[i] / 32 * 32;
  many16.push_back(8), many32.push_back(48);  // and a misaligned last member
  members("members_block_ring", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 136, 72), many16, 0, 3);
  members("members_block_mn_major_ring", mn_major(spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 136, 70)),
          many16, 0, 3);
  members("members_nvfp4_ring", spec_of(S::Nvfp4, F4, F4, DType::FP32, false, false, 128, 128, 1, 136, 72), many32, 0, 3);
  members("members_mxfp8_mn_major_ring", mn_major(spec_of(S::Mx32, E4, E4, DType::FP32, false, false, 128, 128, 1, 136, 70)),
          many16, 0, 3);
  // Rules that decide alone: MXFP8 with m = 129 and a 128-token member after 16 + 48 tokens (its
  // scale rows are whole words, but its grid starts at byte 129 * 3: the byte loads); NVFP4 with
  // m = 129 and an aligned member after members of 8 and 24 tokens (A's grid would start at an odd
  // byte: NaN, as the reference says).
  members("members_mxfp8_odd_grid_start", spec_of(S::Mx32, E4, E4, DType::FP32, false, false, 128, 128, 1, 136, 129),
          {16, 48, 128, 64, 8}, 0);
  members("members_nvfp4_odd_grid_start", spec_of(S::Nvfp4, F4, F4, DType::FP32, false, false, 128, 128, 1, 136, 129),
          {64, 8, 24, 64}, 0);
  // The dequant route on members: each member's copy from its own matrix and grid (the prep
  // kernel's token-block prefix), the none GEMM's members kernel on the copies; a member the fused
  // kernel cannot load is NaN here too (24 tokens and the one after it: the 16-bit copies would
  // be loadable), and so is NVFP4's odd grid start.
  members("dequant_members_mxfp8_bf16", dequant(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200)),
          mtok, 16);
  members("dequant_members_mxfp8_mn_major_fp32_acc",
          mn_major(dequant(spec_of(S::Mx32, E5, E4, DType::FP32, true, false, 128, 128, 1, 136, 202))), mtok, 0);
  members("dequant_members_mxfp8_mn_major_ring", mn_major(dequant(spec_of(S::Mx32, E4, E4, DType::FP32, false, false, 128,
                                                                          128, 1, 136, 70))),
          many16, 0, 3);
  members("dequant_members_mxfp8_odd_grid_start", dequant(spec_of(S::Mx32, E4, E4, DType::FP32, false, false, 128, 128, 1, 136, 129)),
          {16, 48, 128, 64, 8}, 0);
  members("dequant_members_nvfp4_bf16", dequant(spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 128, 1, 200, 200)),
          mtok4, 32);
  members("dequant_members_nvfp4_odd_grid_start", dequant(spec_of(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 128, 1, 136, 129)),
          {64, 8, 24, 64}, 0);
  // An empty member at a misaligned token (8; NVFP4 16): NaN by both routes (the 16-bit copies
  // would take it, and it has no elements to poison).
  for (GemmRoute route : {GemmRoute::Fused, GemmRoute::Dequant}) {
    const std::string r = route == GemmRoute::Dequant ? "dequant_" : "";
    GemmSpec mx = spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 136, 130);
    GemmSpec f4 = spec_of(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 128, 1, 136, 130);
    mx.route = f4.route = route;
    members(r + "members_mxfp8_empty_misaligned", mx, {8, 0, 8, 16, 32}, 16);
    members(r + "members_nvfp4_empty_misaligned", f4, {16, 0, 16, 32, 64}, 32);
  }
  // NVFP4: e2m1 operands dequantized to fp16 on chip (e4m3 per 16 of K, per-tensor amax).
  add("nvfp4_bf16", spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 128, 1, 200, 384));
  add("nvfp4_fp32_acc_noalpha", spec_of(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 128, 1, 256, 512), {}, 3, false);
  add("nvfp4_one_kblock_fp32", spec_of(S::Nvfp4, F4, F4, DType::FP32, false, false, 128, 128, 1, 136, 128));
  add("nvfp4_many_groups", spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 128, 1, 1024, 512), many, 3);
  add("nvfp4_two_stages_3ctas", spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 128, 1, 256, 1024), many, 3);
  v.back().spec.tile.stages = 2;  // five load slots: the two rings wrap at different k-blocks, across tiles
  v.back().max_ctas = 3;
  masked("masked_nvfp4_fp32", spec_of(S::Nvfp4, F4, F4, DType::FP32, false, false, 128, 128, 1, 200, 256), 256);
  add("tensor_many_groups_fast_mc2", spec_of(S::PerTensor, E4, E4, DType::BF16, false, true, 128, 256, 2, 1024, 512),
      many, 3);
  // int8 x int8 (s32 MMAs): unpromoted per-channel and per-tensor (one fp32 conversion after all of
  // K), promoted blockwise and K-grouped (a conversion per k-block).
  const auto I8 = ElemFormat::Int8;
  add("int8_rowwise_bf16", spec_of(S::RowChannel, I8, I8, DType::BF16, false, false, 128, 128, 1, 200, 400));
  add("int8_rowwise_bn256_fp32_acc_mc2", spec_of(S::RowChannel, I8, I8, DType::FP32, true, false, 128, 256, 2, 504, 400));
  add("int8_tensor_bm64_bn64_fp32", spec_of(S::PerTensor, I8, I8, DType::FP32, false, false, 64, 64, 1, 200, 400));
  add("int8_block_bf16", spec_of(S::Block128, I8, I8, DType::BF16, false, false, 128, 128, 1, 200, 400));
  add("int8_block_ordered_fp32_acc", spec_of(S::Block128, I8, I8, DType::FP32, true, false, 128, 128, 1, 200, 400, 2));
  add("int8_block_mn_major_bf16", mn_major(spec_of(S::Block128, I8, I8, DType::BF16, false, false, 128, 128, 1, 200, 400)));
  add("int8_rowwise_many_groups", spec_of(S::RowChannel, I8, I8, DType::BF16, false, false, 128, 256, 1, 1024, 512), many, 3);
  masked("masked_int8_rowwise_fp32", spec_of(S::RowChannel, I8, I8, DType::FP32, false, false, 128, 128, 1, 200, 256), 256);
  kgrouped("kgrouped_int8_tensor_bf16", spec_of(S::PerTensor, I8, I8, DType::BF16, false, false, 128, 128, 1, 200, 200), tok, 5);
  kgrouped("kgrouped_int8_block_fp32_acc", spec_of(S::Block128, I8, I8, DType::FP32, true, false, 128, 128, 1, 136, 130), tok128, 3);
  members("members_int8_block_bf16", spec_of(S::Block128, I8, I8, DType::BF16, false, false, 128, 128, 1, 200, 200), mtok, 16);
  // bf16 / fp16 operands (the identity copies): 64 of K per stage, no scales. K = 400: six full
  // stages + 16; K-grouped groups start and end inside 64-token stages; members: a 20-token member
  // (not a multiple of 8: NaN) and the member after it (misaligned: NaN).
  const auto Id = ElemFormat::Identity;
  add("bf16_bf16", spec_of(S::None, Id, Id, DType::BF16, false, false, 128, 128, 1, 200, 400));
  add("bf16_bn256_fp32_acc_mc2", spec_of(S::None, Id, Id, DType::FP32, true, false, 128, 256, 2, 504, 400));
  add("fp16_bm64_bn64_fp32", fp16(spec_of(S::None, Id, Id, DType::FP32, false, false, 64, 64, 1, 200, 400)));
  add("bf16_ordered_bn192", spec_of(S::None, Id, Id, DType::BF16, false, false, 128, 192, 1, 200, 400, 2));
  add("bf16_one_group_tiny", spec_of(S::None, Id, Id, DType::BF16, false, false, 128, 128, 1, 8, 16), {3}, 0);
  add("bf16_many_groups", spec_of(S::None, Id, Id, DType::BF16, false, false, 128, 256, 1, 1024, 512), many, 3);
  masked("masked_fp16_fp32", fp16(spec_of(S::None, Id, Id, DType::FP32, false, false, 128, 128, 1, 200, 256)), 256);
  kgrouped("kgrouped_bf16", spec_of(S::None, Id, Id, DType::BF16, false, false, 128, 128, 1, 200, 200), tok, 5);
  kgrouped("kgrouped_fp16_fp32_acc_bm64", fp16(spec_of(S::None, Id, Id, DType::FP32, true, false, 64, 128, 1, 136, 130)),
           {63, 1, 65, 0, 127, 129, 2}, 3);
  kgrouped("kgrouped_bf16_bn256_3ctas", spec_of(S::None, Id, Id, DType::BF16, false, false, 128, 256, 1, 264, 300), tok, 0, 3);
  const std::vector<int64_t> mtok16 = {48, 0, 304, 16, 20, 32};
  members("members_bf16", spec_of(S::None, Id, Id, DType::BF16, false, false, 128, 128, 1, 200, 200), mtok16, 16);
  std::vector<int64_t> many8 = many16;
  many8.back() = 4;  // misaligned for 8-token alignment
  // Weight-only int8 (channel): bf16 / fp16 A x int8 B converted on chip, fp32 scale per channel.
  add("channel_bf16", spec_of(S::Channel, Id, I8, DType::BF16, false, false, 128, 128, 1, 200, 400));
  add("channel_bn256_fp32_acc", spec_of(S::Channel, Id, I8, DType::FP32, true, false, 128, 256, 1, 504, 400));
  add("channel_fp16_bm64_bn64_fp32", fp16(spec_of(S::Channel, Id, I8, DType::FP32, false, false, 64, 64, 1, 200, 400)));
  add("channel_two_stages", spec_of(S::Channel, Id, I8, DType::BF16, false, false, 128, 128, 1, 200, 400));
  v.back().spec.tile.stages = 2;  // the next load waits for the MMAs of the k-block before
  add("channel_one_group_tiny", spec_of(S::Channel, Id, I8, DType::BF16, false, false, 128, 128, 1, 8, 16), {3}, 0);
  add("channel_many_groups_3ctas", spec_of(S::Channel, Id, I8, DType::BF16, false, false, 128, 256, 1, 1024, 512), many, 3);
  v.back().max_ctas = 3;
  masked("masked_channel_fp32", spec_of(S::Channel, Id, I8, DType::FP32, false, false, 128, 128, 1, 200, 256), 256);
  members("members_fp16_fp32_acc_3ctas", fp16(spec_of(S::None, Id, Id, DType::FP32, true, false, 128, 128, 1, 136, 130)),
          many8, 0, 3);
  // The dequant route (16-bit copies, then the none GEMM with this tile): every scale layout the
  // fused kernels read: compact, mn_major A per group (groups of 37, 129 and 1 rows pad their
  // grids; 40 groups; rows after the last group), masked slots, K-grouped token grids (202 rows
  // pad to 204; 32-token blocks cut by the groups), NVFP4's per-group alpha.
  add("dequant_mxfp8_bf16", dequant(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 384)));
  add("dequant_mxfp8_e5m2_e4m3_fp32_acc_bn256", dequant(spec_of(S::Mx32, E5, E4, DType::FP32, true, false, 128, 256, 1, 256, 512)));
  add("dequant_mxfp8_mn_major_bf16", mn_major(dequant(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 384))));
  add("dequant_mxfp8_mn_major_many_groups", mn_major(dequant(spec_of(S::Mx32, E4, E5, DType::BF16, false, false, 128, 128, 1, 1024, 512))),
      many, 3);
  masked("dequant_masked_mxfp8_mn_major_bm64", mn_major(dequant(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 64, 128, 1, 200, 256))), 258);
  kgrouped("dequant_kgrouped_mxfp8_bf16", dequant(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 200, 200)), tok, 5);
  kgrouped("dequant_kgrouped_mxfp8_mn_major_fp32_acc",
           mn_major(dequant(spec_of(S::Mx32, E5, E4, DType::FP32, true, false, 128, 128, 1, 264, 202))), tok128, 3);
  add("dequant_nvfp4_bf16", dequant(spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 128, 1, 200, 384)));
  add("dequant_nvfp4_fp32_acc_noalpha", dequant(spec_of(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 128, 1, 256, 512)), {}, 3,
      false);
  masked("dequant_masked_nvfp4_fp32", dequant(spec_of(S::Nvfp4, F4, F4, DType::FP32, false, false, 128, 128, 1, 200, 256)), 256);
  kgrouped("dequant_kgrouped_nvfp4_bf16", dequant(spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 128, 1, 200, 200)), tok, 5);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Variants, GemmExact, ::testing::ValuesIn(exact_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// ------------------------------------------------------------------------------- random

class GemmRandom : public ::testing::TestWithParam<Case> {};

TEST_P(GemmRandom, WithinTheBoundOfTheFloat64Reference) {
  QF_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const GemmSpec& s = c.spec;
  const ref::GemmProblem p = problem_of(c, ref::GemmValues::Random, 77);
  Device dev = to_device(s, p);
  const std::vector<uint8_t> got = run(s, dev, c.max_ctas);
  // Rows: every group's first and last two, its tile boundary, and a few random ones.
  std::vector<int64_t> rows;
  std::mt19937_64 rng(5);
  for (size_t g = 0; g < size_t(p.num_groups()); ++g) {
    const bool kg = k_grouped(s.layout);
    // Masked: slot g's first counts[g] rows.
    const int64_t a = kg ? int64_t(g) * s.m : p.m_max > 0 ? int64_t(g) * p.m_max : p.offsets[g];
    const int64_t e = kg ? a + s.m : p.m_max > 0 ? a + std::clamp<int64_t>(p.counts[g], 0, p.m_max) : p.offsets[g + 1];
    if (a == e) continue;
    for (int64_t r : {a, a + 1, a + 127, a + 128, e - 2, e - 1}) if (r >= a && r < e) rows.push_back(r);
    for (int i = 0; i < 6; ++i) rows.push_back(a + int64_t(rng() % uint64_t(e - a)));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  const ref::GemmRows ref = ref::gemm_reference(s, p.operands(), rows);
  const ref::GemmTolerance tol = ref::gemm_tolerance(s);
  double err2 = 0, ref2 = 0, worst = 0, worst_acc = 0;
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t idx = rows[i] * s.n + n;
      const double prev = s.accumulate ? double(p.d_init[size_t(idx)]) : 0.0;
      const double want = ref.value[i * size_t(s.n) + size_t(n)] + prev;
      const double mag = ref.magnitude[i * size_t(s.n) + size_t(n)];
      const double gv = bits_value(s, out_bits(s, got, idx));
      if (std::isnan(want)) {  // members: a member the kernel cannot load reads NaN
        if (!std::isnan(gv) && bad++ < 1) first << "row " << rows[i] << " col " << n << ": got " << gv << ", expected NaN";
        continue;
      }
      const double err = std::fabs(gv - want);
      const double bound = tol.out_rel * std::fabs(want) + tol.acc_rel * mag + std::ldexp(std::fabs(prev), -22);
      err2 += err * err, ref2 += want * want;
      worst = std::max(worst, err / bound);
      // Accumulation error alone (output rounding removed, as far as it can be): for calibration.
      worst_acc = std::max(worst_acc, std::max(0.0, err - tol.out_rel * std::fabs(want)) / mag);
      if (!(err <= bound) && bad++ < 1)
        first << "row " << rows[i] << " col " << n << ": got " << gv << ", expected " << want << ", bound " << bound;
    }
  const double rel = std::sqrt(err2 / ref2);
  std::printf("[ measure  ] %s: rel. Frobenius error %.3g, worst error/bound %.3g, worst accumulation error / sum|ab| "
              "%.3g (acc_rel %.3g)\n",
              c.name.c_str(), rel, worst, worst_acc, tol.acc_rel);
  EXPECT_EQ(bad, 0) << first.str();
  EXPECT_LT(rel, s.out_dtype == DType::BF16 ? 4e-3 : (s.fast_accum ? 2e-3 : 2e-4));
}

std::vector<Case> random_cases() {
  using S = GemmScaling;
  const auto E4 = ElemFormat::E4M3, E5 = ElemFormat::E5M2;
  const std::vector<int64_t> g8 = ref::random_group_rows(8, 4096, 1, 1, 3);  // one empty, uneven
  std::vector<Case> v;
  v.push_back({"block_e4m3_bf16_k7168", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 1024, 7168),
               g8, 0, true});
  v.push_back({"block_e4m3_fp32_k7168_mc2", spec_of(S::Block128, E4, E4, DType::FP32, false, false, 128, 128, 2, 1024, 7168),
               g8, 0, false});
  v.push_back({"block_e5m2_e4m3_fp32_acc", spec_of(S::Block128, E5, E4, DType::FP32, true, false, 128, 128, 1, 512, 2048),
               g8, 7, true});
  v.push_back({"block_mn_major_bf16_k7168", mn_major(spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 1024, 7168)),
               g8, 3, true});
  v.push_back({"masked_block_mn_major_fp32_k2048",
               mn_major(spec_of(S::Block128, E4, E4, DType::FP32, false, false, 128, 128, 2, 512, 2048)),
               {500, 0, 37, 1001}, 0, true, 1001});
  v.push_back({"tensor_fast_bf16_k7168", spec_of(S::PerTensor, E4, E4, DType::BF16, false, true, 128, 256, 2, 1024, 7168),
               g8, 0, true});
  v.push_back({"tensor_promote_fp32_k7168", spec_of(S::PerTensor, E4, E4, DType::FP32, false, false, 128, 128, 1, 1024, 7168),
               g8, 0, false});
  v.push_back({"rowwise_fast_fp32_k4096", spec_of(S::RowChannel, E4, E4, DType::FP32, false, true, 128, 128, 1, 1024, 4096),
               g8, 0, true});
  v.push_back({"block_unordered_bf16_k7168", spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 1024, 7168, 1),
               g8, 0, true});
  v.push_back({"tensor_fast_ordered_bf16_k7168", spec_of(S::PerTensor, E5, E4, DType::BF16, false, true, 128, 128, 1, 1024, 7168, 2),
               g8, 0, true});
  v.push_back({"mxfp8_e4m3_bf16_k7168", spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 1024, 7168),
               g8, 0, true});
  v.push_back({"mxfp8_e5m2_e4m3_fp32_acc_k2048", spec_of(S::Mx32, E5, E4, DType::FP32, true, false, 128, 128, 1, 512, 2048),
               g8, 7, false});
  v.push_back({"mxfp8_mn_major_bf16_k7168", mn_major(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 128, 1, 1024, 7168)),
               g8, 3, true});
  // K-grouped: 384 x 512 outputs over 4096 tokens in 8 uneven groups (one empty); returns the spec.
  auto kgrouped = [&](std::string name, GemmSpec s, bool alpha) {
    s.layout = GemmLayout::KGrouped, s.m = 384;
    v.push_back({std::move(name), s, ref::random_group_rows(8, 4096, 1, 1, 9), 16, alpha});
    return s;
  };
  const GemmSpec wg = kgrouped("kgrouped_tensor_fp32_acc_4096_tokens",
                               spec_of(S::PerTensor, E4, E4, DType::FP32, true, false, 128, 128, 1, 512, 0), true);
  const GemmSpec wb = kgrouped("kgrouped_block_bf16_4096_tokens",
                               spec_of(S::Block128, E4, E4, DType::BF16, false, false, 128, 128, 1, 512, 0), true);
  const GemmSpec wm = kgrouped("kgrouped_mxfp8_fp32_acc_4096_tokens",
                               spec_of(S::Mx32, E4, E5, DType::FP32, true, false, 128, 128, 1, 512, 0), false);
  const GemmSpec wf = kgrouped("kgrouped_nvfp4_bf16_4096_tokens",
                               spec_of(S::Nvfp4, ElemFormat::E2M1, ElemFormat::E2M1, DType::BF16, false, false, 128, 128, 1, 512, 0), true);
  const GemmSpec wr = kgrouped("kgrouped_rowwise_bf16_4096_tokens",
                               spec_of(S::RowChannel, E4, E4, DType::BF16, false, false, 128, 128, 1, 512, 0), true);
  const GemmSpec wbm = kgrouped("kgrouped_block_mn_major_bf16_4096_tokens", mn_major(wb), true);
  const GemmSpec wmm = kgrouped("kgrouped_mxfp8_mn_major_fp32_acc_4096_tokens", mn_major(wm), false);
  // Members: 8 uneven members (one empty) of multiples of 16 tokens (NVFP4: 32).
  for (GemmSpec ms : {wg, wb, wm, wf, wr, wbm, wmm}) {
    ms.layout = GemmLayout::KGroupedMembers;
    const bool fp4 = ms.scaling == S::Nvfp4;
    v.push_back({"members_" + std::string(traits(ms.scaling).name) + (ms.scale_layout == ScaleLayout::MnMajor ? "_mn_major" : "") +
                     "_4096_tokens", ms,
                 ref::random_group_rows(8, 4096, 1, fp4 ? 32 : 16, 9), 0, true});
  }
  v.push_back({"rowwise_promote_bf16_k4096", spec_of(S::RowChannel, E4, E5, DType::BF16, false, false, 128, 128, 1, 1024, 4096),
               g8, 0, false});
  const auto F4 = ElemFormat::E2M1;
  v.push_back({"nvfp4_bf16_k7168", spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 128, 1, 1024, 7168), g8, 0, true});
  v.push_back({"nvfp4_fp32_acc_k2048", spec_of(S::Nvfp4, F4, F4, DType::FP32, true, false, 128, 128, 1, 512, 2048), g8, 7,
               false});
  // int8: uniform over [-128, 127], fp32 scales.
  const auto I8 = ElemFormat::Int8;
  v.push_back({"int8_rowwise_bf16_k7168", spec_of(S::RowChannel, I8, I8, DType::BF16, false, false, 128, 256, 1, 1024, 7168),
               g8, 0, true});
  v.push_back({"int8_tensor_fp32_k4096", spec_of(S::PerTensor, I8, I8, DType::FP32, false, false, 128, 128, 2, 1024, 4096),
               g8, 0, false});
  v.push_back({"int8_block_fp32_acc_k7168", spec_of(S::Block128, I8, I8, DType::FP32, true, false, 128, 128, 1, 512, 7168),
               g8, 7, true});
  kgrouped("kgrouped_int8_block_fp32_4096_tokens", spec_of(S::Block128, I8, I8, DType::FP32, false, false, 128, 128, 1, 512, 0),
           true);
  // bf16 / fp16: normal samples, fp32 sums over all of K.
  const auto Id = ElemFormat::Identity;
  v.push_back({"bf16_bf16_k7168", spec_of(S::None, Id, Id, DType::BF16, false, false, 128, 256, 1, 1024, 7168), g8, 0, true});
  v.push_back({"fp16_fp32_acc_k2048", fp16(spec_of(S::None, Id, Id, DType::FP32, true, false, 128, 128, 1, 512, 2048)), g8, 7,
               false});
  const GemmSpec wh = kgrouped("kgrouped_bf16_4096_tokens", spec_of(S::None, Id, Id, DType::BF16, false, false, 128, 128, 1, 512, 0),
                               true);
  v.push_back({"channel_bf16_k7168", spec_of(S::Channel, Id, I8, DType::BF16, false, false, 128, 256, 1, 1024, 7168), g8, 0,
               true});
  v.push_back({"channel_fp16_fp32_acc_k2048", fp16(spec_of(S::Channel, Id, I8, DType::FP32, true, false, 128, 128, 1, 512, 2048)),
               g8, 7, false});
  GemmSpec mh = wh;
  mh.layout = GemmLayout::KGroupedMembers;
  v.push_back({"members_bf16_4096_tokens", mh, ref::random_group_rows(8, 4096, 1, 8, 9), 0, true});
  // The dequant route on random operands: the 16-bit copies' sums within the none GEMM's bound.
  v.push_back({"dequant_mxfp8_bf16_k7168", dequant(spec_of(S::Mx32, E4, E4, DType::BF16, false, false, 128, 256, 1, 1024, 7168)),
               g8, 0, true});
  v.push_back({"dequant_mxfp8_mn_major_fp32_acc_k2048",
               mn_major(dequant(spec_of(S::Mx32, E5, E4, DType::FP32, true, false, 128, 128, 1, 512, 2048))), g8, 7, false});
  v.push_back({"dequant_nvfp4_bf16_k7168", dequant(spec_of(S::Nvfp4, F4, F4, DType::BF16, false, false, 128, 256, 1, 1024, 7168)),
               g8, 0, true});
  kgrouped("dequant_kgrouped_mxfp8_mn_major_fp32_acc_4096_tokens", dequant(wmm), false);
  kgrouped("dequant_kgrouped_nvfp4_bf16_4096_tokens", dequant(wf), true);
  for (GemmSpec ms : {wmm, wf}) {  // and on the members' copies
    ms.layout = GemmLayout::KGroupedMembers;
    const bool fp4 = ms.scaling == S::Nvfp4;
    v.push_back({std::string("dequant_members_") + (fp4 ? "nvfp4" : "mxfp8_mn_major") + "_4096_tokens", dequant(ms),
                 ref::random_group_rows(8, 4096, 1, fp4 ? 32 : 16, 9), 0, true});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Variants, GemmRandom, ::testing::ValuesIn(random_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// ------------------------------------------------------------------------------- edges

// int8 sums are exact in the tensor cores' s32 accumulators: full-range int8 operands (not just
// small integers) must give exact_output() bit for bit where the fp32 arithmetic after them is
// exact: unpromoted with power-of-two scales (K = 1024: |sum| <= 2^24, one exact conversion), and
// promoted (blockwise) with unit block scales (each k-block's sum converted exactly, the running
// total an integer of at most 2^24; scales of other binades would round the fp32 total).
TEST(GemmEdge, Int8FullRangeIsExact) {
  QF_SKIP_WITHOUT_GPU();
  for (GemmScaling sc : {GemmScaling::RowChannel, GemmScaling::Block128}) {
    const GemmSpec s = spec_of(sc, ElemFormat::Int8, ElemFormat::Int8, DType::FP32, false, false, 128, 128, 1, 256, 1024);
    ref::GemmProblem p = ref::make_gemm_problem(s, std::vector<int64_t>{300, 0, 129}, 0, ref::GemmValues::SmallIntegers,
                                                true, 31);
    if (sc == GemmScaling::Block128) {
      const float one = 1.0f;
      for (size_t i = 0; i < p.a_scale.size(); i += 4) std::memcpy(&p.a_scale[i], &one, 4);
      for (size_t i = 0; i < p.b_scale.size(); i += 4) std::memcpy(&p.b_scale[i], &one, 4);
    }
    std::mt19937_64 rng(8);
    for (auto& b : p.a) b = uint8_t(rng());
    for (auto& b : p.b) b = uint8_t(rng());
    Device dev = to_device(s, p);
    const std::vector<uint8_t> got = run(s, dev);
    const ref::GemmRows ref = reference_of_every_row(s, p);
    int64_t bad = 0;
    for (int64_t i = 0; i < p.out_rows * s.n; ++i)
      bad += out_bits(s, got, i) != ref::exact_output(s, ref.value[size_t(i)], 0.0f);
    EXPECT_EQ(bad, 0) << traits(sc).name << ": elements that differ from the exact result";
  }
}

// The s32 sums at the edge of overflow: every product -128 * -128 = 2^14. K = 2^17 - 16 (the
// largest unpromoted K: the sum 2^31 - 2^18 fits) and K = 2^17 (promoted per k-block: each partial
// 2^21, totals exact in fp32) must both give the exact result.
TEST(GemmEdge, Int8LongKDoesNotOverflow) {
  QF_SKIP_WITHOUT_GPU();
  for (GemmScaling sc : {GemmScaling::PerTensor, GemmScaling::RowChannel})
  for (int64_t k : {(int64_t(1) << 17) - 16, int64_t(1) << 17}) {
    const GemmSpec s = spec_of(sc, ElemFormat::Int8, ElemFormat::Int8, DType::FP32, false, false, 128, 128, 1, 8, k);
    EXPECT_EQ(gemm_promotes(s), k >= (int64_t(1) << 17));
    ref::GemmProblem p = ref::make_gemm_problem(s, std::vector<int64_t>{3}, 0, ref::GemmValues::SmallIntegers, false, 5);
    std::fill(p.a.begin(), p.a.end(), uint8_t(0x80));
    std::fill(p.b.begin(), p.b.end(), uint8_t(0x80));
    Device dev = to_device(s, p);
    const std::vector<uint8_t> got = run(s, dev);
    const ref::GemmRows ref = reference_of_every_row(s, p);
    for (int64_t i = 0; i < p.out_rows * s.n; ++i) {
      ASSERT_GT(ref.value[size_t(i)], 0.0);
      ASSERT_EQ(out_bits(s, got, i), ref::exact_output(s, ref.value[size_t(i)], 0.0f))
          << traits(sc).name << ", K " << k << ", element " << i;
    }
  }
}

// Unpromoted int8 sums past 2^24 are converted to fp32 once, rounding to nearest, then scaled as
// the epilogue does: D = (fp32(sum) * fp32(sa[r] * alpha[g])) * sb[g, n] with general fp32 scales,
// bit for bit (A all 127, B in [64, 127]: sums of about 2^25.6, 26 significant bits).
TEST(GemmEdge, Int8SumsConvertOnce) {
  QF_SKIP_WITHOUT_GPU();
  const GemmSpec s = spec_of(GemmScaling::RowChannel, ElemFormat::Int8, ElemFormat::Int8, DType::FP32, false, false, 128,
                             256, 1, 256, 4096);
  ASSERT_FALSE(gemm_promotes(s));
  ref::GemmProblem p = ref::make_gemm_problem(s, std::vector<int64_t>{200, 0, 77}, 0, ref::GemmValues::Random, true, 41);
  std::mt19937_64 rng(17);
  std::fill(p.a.begin(), p.a.end(), uint8_t(127));
  for (auto& b : p.b) b = uint8_t(64 + rng() % 64);
  Device dev = to_device(s, p);
  const std::vector<uint8_t> got = run(s, dev);
  auto f32_at = [](const std::vector<uint8_t>& bytes, int64_t i) {
    float f;
    std::memcpy(&f, &bytes[size_t(i) * 4], 4);
    return f;
  };
  int64_t bad = 0, rounded = 0;
  std::ostringstream first;
  for (int64_t r = 0; r < p.m_total; ++r) {
    const int g = r < 200 ? 0 : 2;
    const float rf = f32_at(p.a_scale, r) * p.alpha[size_t(g)];
    for (int64_t n = 0; n < s.n; ++n) {
      int64_t sum = 0;
      for (int64_t k = 0; k < s.k; ++k) sum += 127 * int64_t(p.b[size_t((g * s.n + n) * s.k + k)]);
      rounded += int64_t(float(sum)) != sum;
      const float want = (float(sum) * rf) * f32_at(p.b_scale, g * s.n + n);
      const uint32_t gb = out_bits(s, got, r * s.n + n);
      if (gb != f32_bits(want) && bad++ == 0)
        first << "row " << r << " col " << n << ": got " << f32_from_bits(gb) << ", want " << want;
    }
  }
  EXPECT_GT(rounded, p.m_total * s.n / 2) << "most sums must need rounding to fp32";
  EXPECT_EQ(bad, 0) << first.str();
}

TEST(GemmEdge, AllGroupsEmptyWritesNothing) {
  QF_SKIP_WITHOUT_GPU();
  const GemmSpec s = spec_of(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false, false, 128,
                             128, 1, 256, 256);
  const ref::GemmProblem p = ref::make_gemm_problem(s, std::vector<int64_t>{0, 0, 0}, 50, ref::GemmValues::Random, false, 9);
  Device dev = to_device(s, p);
  const std::vector<uint8_t> got = run(s, dev);
  for (uint8_t b : got) ASSERT_EQ(b, 0xFF);
}

// M-grouped mn_major A grids, offsets that fall and rise (0, 300, 100, 400): group 2's grid would
// start after groups 0 and 1's 300 padded rows and take 300 more, past the m_total + 3 G = 409
// rows any rising split fits in. Its rows read no scale and are NaN (rows 300..399, which only
// it owns; 100..299 are group 0's too, written in either order); group 0's rows 0..99 are exact.
// Blockwise (scales in the consumers' registers) and MXFP8 (the scale writers' slots).
// The dequant route (MXFP8) gives the same: its copy of a row takes the scales of the last group
// starting at or before it (group 0 for rows 0..299), group 2's rows none (NaN).
void expect_mn_major_grid_past_the_buffer_is_nan(GemmScaling scaling, GemmRoute route = GemmRoute::Fused) {
  GemmSpec s = mn_major(spec_of(scaling, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, false, false, 128, 128, 1, 128, 256));
  s.route = route;
  ref::GemmProblem p = ref::make_gemm_problem(s, std::vector<int64_t>{300, 0, 100}, 0, ref::GemmValues::SmallIntegers, false, 23);
  p.offsets = {0, 300, 100, 400};
  Device dev = to_device(s, p);
  const std::vector<uint8_t> got = run(s, dev);
  std::vector<int64_t> rows(100);
  for (int64_t r = 0; r < 100; ++r) rows[size_t(r)] = r;
  const ref::GemmRows ref = ref::gemm_reference(s, p.operands(), rows);
  int64_t bad0 = 0, finite2 = 0;
  for (int64_t r = 0; r < 400; ++r)
    for (int64_t n = 0; n < s.n; ++n) {
      const uint32_t g = out_bits(s, got, r * s.n + n);
      if (r < 100) bad0 += g != ref::exact_output(s, ref.value[size_t(r * s.n + n)], 0.0f);
      else if (r >= 300) finite2 += !std::isnan(bits_value(s, g));
    }
  EXPECT_EQ(bad0, 0) << "group 0 elements that differ from the exact reference";
  EXPECT_EQ(finite2, 0) << "group 2 elements that are not NaN";
  // The reference agrees: group 2's rows are NaN there too.
  const std::vector<int64_t> last = {399};
  EXPECT_TRUE(std::isnan(ref::gemm_reference(s, p.operands(), last).value[0]));
}

TEST(GemmEdge, MnMajorGridPastTheBufferIsNaN) {
  QF_SKIP_WITHOUT_GPU();
  expect_mn_major_grid_past_the_buffer_is_nan(GemmScaling::Block128);
}

TEST(GemmEdge, MxMnMajorGridPastTheBufferIsNaN) {
  QF_SKIP_WITHOUT_GPU();
  expect_mn_major_grid_past_the_buffer_is_nan(GemmScaling::Mx32);
}

TEST(GemmEdge, DequantMxMnMajorGridPastTheBufferIsNaN) {
  QF_SKIP_WITHOUT_GPU();
  expect_mn_major_grid_past_the_buffer_is_nan(GemmScaling::Mx32, GemmRoute::Dequant);
}

// Runs s on p by both routes and expects every output exact against the reference (each row in a
// group, none NaN: offsets out of range are clamped alike by both and by the reference).
void expect_both_routes_exact(GemmSpec s, const ref::GemmProblem& p) {
  for (GemmRoute route : {GemmRoute::Fused, GemmRoute::Dequant}) {
    s.route = route;
    Device dev = to_device(s, p);
    const std::vector<uint8_t> got = run(s, dev);
    const ref::GemmRows ref = reference_of_every_row(s, p);
    int64_t bad = 0;
    for (int64_t r = 0; r < p.out_rows; ++r)
      for (int64_t n = 0; n < s.n; ++n) {
        const double want = ref.value[size_t(r * s.n + n)];
        ASSERT_GE(ref.group[size_t(r)], 0) << "row " << r << " is in a group once clamped";
        ASSERT_FALSE(std::isnan(want)) << "row " << r << " loads once clamped";
        bad += out_bits(s, got, r * s.n + n) != ref::exact_output(s, want, 0.0f);
      }
    EXPECT_EQ(bad, 0) << (route == GemmRoute::Dequant ? "dequant" : "fused") << " route: elements that differ";
  }
}

// Offsets past the rows (-4 and 200 with m_total 128) are clamped to [0, m_total] by both routes
// and the reference: groups of 60 and 68 rows, whose mn_major A grids (pitches 60 and 68) the
// dequant route's prep kernel must lay out from the clamped offsets. Every row exact.
TEST(GemmEdge, DequantClampsOffsetsAsTheFusedKernel) {
  QF_SKIP_WITHOUT_GPU();
  const GemmSpec s = mn_major(spec_of(GemmScaling::Mx32, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, false, false, 128,
                                      128, 1, 128, 256));
  ref::GemmProblem p = ref::make_gemm_problem(s, std::vector<int64_t>{60, 68}, 0, ref::GemmValues::SmallIntegers, false, 29);
  p.offsets = {-4, 60, 200};
  expect_both_routes_exact(s, p);
}

// Members' token offsets past k_total (-16 and 1000 with k_total 160) are clamped to [0, k_total]
// by both routes and the reference: members of 64 and 96 tokens, whose grids the dequant route's
// prep kernel lays out from the clamped offsets. Every output exact.
TEST(GemmEdge, MembersClampOffsetsOnBothRoutes) {
  QF_SKIP_WITHOUT_GPU();
  GemmSpec s = mn_major(spec_of(GemmScaling::Mx32, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, false, false, 128, 128,
                                1, 128, 0));
  s.layout = GemmLayout::KGroupedMembers, s.m = 136;
  ref::GemmProblem p = ref::make_k_grouped_gemm_problem(s, std::vector<int64_t>{64, 96}, 0, ref::GemmValues::SmallIntegers, false, 37);
  p.offsets = {-16, 64, 1000};
  expect_both_routes_exact(s, p);
}

// Route auto takes the route it names (route_for): with a poisoned workspace of the dequant
// route's size, the dequant route leaves its copies there and the fused kernel leaves it alone;
// either way the rows checked are exact. N = 2048, K = 512 (the exact tests' K: small-integer sums
// stay exact): 2 x 64 rows (h = 62): fused; 2 x 8192 rows (h = 1638, 34.4 GFLOP): dequant.
TEST(GemmEdge, AutoRouteRunsTheRouteItChooses) {
  QF_SKIP_WITHOUT_GPU();
  for (GemmScaling scaling : {GemmScaling::Mx32, GemmScaling::Nvfp4}) {
    const bool fp4 = scaling == GemmScaling::Nvfp4;
    const ElemFormat f = fp4 ? ElemFormat::E2M1 : ElemFormat::E4M3;
    GemmSpec s = spec_of(scaling, f, f, DType::FP32, false, false, 0, 0, 1, 2048, 512);
    s.route = GemmRoute::Auto;
    const rt::Gemm gemm(s);
    for (int64_t rows : {64, 8192}) {
      ref::GemmProblem p = ref::make_gemm_problem(s, std::vector<int64_t>{rows, rows}, 0, ref::GemmValues::SmallIntegers, false, 31);
      Device dev = to_device(s, p);
      const GemmRoute want = rows == 64 ? GemmRoute::Fused : GemmRoute::Dequant;
      ASSERT_EQ(gemm.route_for(p.m_total, 2), want) << rows;
      const int64_t copy_bytes =
          dequant_workspace(gemm_route_spec(s, GemmRoute::Dequant), p.m_total, 2, 0).total;
      EXPECT_EQ(gemm.workspace_bytes(p.m_total, 2), want == GemmRoute::Dequant ? copy_bytes : 0);
      DeviceBuffer ws = rt::testing::poisoned_buffer(size_t(copy_bytes));
      dev.call.workspace = rt::testing::view_of(ws);
      rt::Stream stream;
      gemm.run(dev.call, stream.get());
      stream.synchronize();
      const std::vector<uint8_t> after = ws.download_as<uint8_t>();
      const bool untouched = std::all_of(after.begin(), after.end(), [](uint8_t b) { return b == 0xFF; });
      EXPECT_EQ(untouched, want == GemmRoute::Fused) << traits(scaling).name << ", " << rows << " rows per group";
      const std::vector<uint8_t> got = dev.d.download_as<uint8_t>();
      std::vector<int64_t> check;  // every group's first and last rows, and a stride through them
      for (int64_t r = 0; r < p.out_rows; r += std::max<int64_t>(1, rows / 16)) check.push_back(r);
      check.push_back(p.out_rows - 1);
      const ref::GemmRows ref = ref::gemm_reference(s, p.operands(), check);
      int64_t bad = 0;
      for (size_t i = 0; i < check.size(); ++i)
        for (int64_t n = 0; n < s.n; ++n)
          bad += out_bits(s, got, check[i] * s.n + n) != ref::exact_output(s, ref.value[i * size_t(s.n) + size_t(n)], 0.0f);
      EXPECT_EQ(bad, 0) << traits(scaling).name << ", " << rows << " rows per group: elements that differ";
    }
  }
}

// Runs a two-group K-grouped problem whose NaN scales lie in group 0's first k-block but scale
// only group 1's tokens: group 0 must equal the exact reference, group 1 must be NaN throughout.
void expect_nan_scales_stay_in_group_1(const GemmSpec& s, const ref::GemmProblem& p) {
  Device dev = to_device(s, p);
  const std::vector<uint8_t> got = run(s, dev);
  const ref::GemmRows ref = reference_of_every_row(s, p);
  int64_t bad0 = 0, finite1 = 0;
  for (int64_t r = 0; r < p.out_rows; ++r)
    for (int64_t n = 0; n < s.n; ++n) {
      const int64_t idx = r * s.n + n;
      const uint32_t g = out_bits(s, got, idx);
      if (r < s.m) bad0 += g != ref::exact_output(s, ref.value[size_t(idx)], 0.0f);
      else finite1 += !std::isnan(bits_value(s, g));
    }
  EXPECT_EQ(bad0, 0) << "group 0 elements that differ from the exact reference";
  EXPECT_EQ(finite1, 0) << "group 1 elements that are not NaN";
}

// Its K-grouped problem: groups of 40 and 200 tokens, 128 x 128 fp32 outputs, small integers.
struct TwoGroups {
  GemmSpec spec;
  ref::GemmProblem problem;
};
TwoGroups two_groups(GemmScaling scaling, ElemFormat format, ScaleLayout layout = ScaleLayout::Compact) {
  GemmSpec s = spec_of(scaling, format, format, DType::FP32, false, false, 128, 128, 1, 128, 0);
  s.layout = GemmLayout::KGrouped, s.m = 128, s.scale_layout = layout;
  return {s, ref::make_k_grouped_gemm_problem(s, std::vector<int64_t>{40, 200}, 0, ref::GemmValues::SmallIntegers, false, 21)};
}

// K-grouped MXFP8: a NaN scale (e8m0 0xFF) of a 32-token step that holds only group 1's tokens
// (the kernel gives such steps a zero-contribution factor).
TEST(GemmEdge, KGroupedMxNanScaleStaysInItsGroup) {
  QF_SKIP_WITHOUT_GPU();
  auto [s, p] = two_groups(GemmScaling::Mx32, ElemFormat::E4M3);
  const int64_t cols = (p.k_total + 31) / 32;
  for (int64_t r = 0; r < s.m; ++r) p.a_scale[size_t(r * cols + 2)] = 0xFF;  // tokens 64..95: group 1 only
  expect_nan_scales_stay_in_group_1(s, p);
}

// The same on mn_major grids ([32-steps, rows]: step 2 is one run of rows), on A and on B (the
// scale writers' word-per-4-rows loads take the keep mask per step).
TEST(GemmEdge, KGroupedMxMnMajorNanScaleStaysInItsGroup) {
  QF_SKIP_WITHOUT_GPU();
  auto [s, p] = two_groups(GemmScaling::Mx32, ElemFormat::E4M3, ScaleLayout::MnMajor);
  for (int64_t r = 0; r < s.m; ++r) p.a_scale[size_t(2 * s.m + r)] = 0xFF;  // A (128 rows), tokens 64..95
  for (int64_t r = 0; r < s.n; ++r) p.b_scale[size_t(2 * s.n + r)] = 0xFF;  // B (128 rows), tokens 64..95
  expect_nan_scales_stay_in_group_1(s, p);
}

// K-grouped NVFP4: NaN block scales (e4m3 0x7F) of 16-token blocks that hold only group 1's tokens,
// on A (tokens 48..63) and on B (64..79): the kernel zeroes the other groups' tokens after the
// scale multiply, so neither reaches group 0.
TEST(GemmEdge, KGroupedNvfp4NanScaleStaysInItsGroup) {
  QF_SKIP_WITHOUT_GPU();
  auto [s, p] = two_groups(GemmScaling::Nvfp4, ElemFormat::E2M1);
  const int64_t cols = p.k_total / 16;
  for (int64_t r = 0; r < s.m; ++r) p.a_scale[size_t(r * cols + 3)] = 0x7F;  // A, tokens 48..63: group 1 only
  for (int64_t r = 0; r < s.n; ++r) p.b_scale[size_t(r * cols + 4)] = 0x7F;  // B, tokens 64..79: group 1 only
  expect_nan_scales_stay_in_group_1(s, p);
}

// K-grouped fp32 accumulation goes through the tensor engine's reduce-add (D += v at L2): it must
// round like the fp32 addition of the reference, subnormal old values, signed zeros and infinities
// included (an add that flushed subnormals would lose them), NaN staying NaN. Group 1 is empty
// (v = +0 there).
TEST(GemmEdge, KGroupedReduceAddKeepsSubnormalsAndSpecials) {
  QF_SKIP_WITHOUT_GPU();
  GemmSpec s = spec_of(GemmScaling::PerTensor, ElemFormat::E4M3, ElemFormat::E4M3, DType::FP32, true, false, 128, 128, 1,
                       136, 0);
  s.layout = GemmLayout::KGrouped, s.m = 72;
  ref::GemmProblem p = ref::make_k_grouped_gemm_problem(s, std::vector<int64_t>{100, 0, 37}, 0,
                                                        ref::GemmValues::SmallIntegers, true, 22);
  const float specials[] = {std::ldexp(1.0f, -149), -std::ldexp(1.0f, -149), std::ldexp(3.0f, -140), -std::ldexp(5.0f, -130),
                            std::ldexp(1.0f, -126) * 0.75f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 3.0e38f, -1.5f};
  for (size_t i = 0; i < p.d_init.size(); ++i) p.d_init[i] = specials[(i * 7 + i / 136) % std::size(specials)];
  Device dev = to_device(s, p);
  const std::vector<uint8_t> got = run(s, dev);
  const ref::GemmRows ref = reference_of_every_row(s, p);
  int64_t bad = 0, subnormal_kept = 0;
  std::ostringstream first;
  for (int64_t idx = 0; idx < p.out_rows * s.n; ++idx) {
    const uint32_t g = out_bits(s, got, idx);
    const uint32_t want = ref::exact_output(s, ref.value[size_t(idx)], p.d_init[size_t(idx)]);
    const bool nan_both = std::isnan(f32_from_bits(g)) && std::isnan(f32_from_bits(want));
    if (g != want && !nan_both && bad++ < 1)
      first << "element " << idx << ": old " << p.d_init[size_t(idx)] << " + " << ref.value[size_t(idx)] << ": got 0x"
            << std::hex << g << ", expected 0x" << want << std::dec;
    const float w = f32_from_bits(want);
    subnormal_kept += w != 0.0f && std::fabs(w) < std::ldexp(1.0f, -126);
  }
  EXPECT_EQ(bad, 0) << bad << " elements differ; first: " << first.str();
  EXPECT_GT(subnormal_kept, 0) << "the case must produce subnormal sums";
}

// Members: the workspace is an argument like any other (named when missing, short or misaligned).
TEST(GemmEdge, MembersWorkspaceErrorsNameTheArgument) {
  QF_SKIP_WITHOUT_GPU();
  GemmSpec s = spec_of(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false, false, 128, 128, 1,
                       128, 0);
  s.layout = GemmLayout::KGroupedMembers, s.m = 128;
  const ref::GemmProblem p = ref::make_k_grouped_gemm_problem(s, std::vector<int64_t>{64, 128}, 0,
                                                              ref::GemmValues::SmallIntegers, false, 3);
  Device dev = to_device(s, p);
  rt::Gemm gemm(s);
  const int64_t ws_bytes = gemm.workspace_bytes();
  EXPECT_EQ(ws_bytes, int64_t(gemm.persistent_ctas()) * (gemm.tile().stages + 1) * 256);
  DeviceBuffer ws(size_t(ws_bytes) + 128);
  auto expect_error = [&](const rt::TensorView& w, const std::string& what) {
    rt::GemmCall c = dev.call;
    c.workspace = w;
    try {
      gemm.run(c, nullptr);
      ADD_FAILURE() << "no error: " << what;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  rt::TensorView w = rt::testing::view_of(ws);
  expect_error({}, "argument workspace: null pointer");
  w.bytes = ws_bytes - 1;
  expect_error(w, "smaller than the " + std::to_string(ws_bytes) + " bytes required");
  w = rt::testing::view_of(ws), w.ptr += 64;
  expect_error(w, "not 128-byte aligned");
}

TEST(GemmEdge, RepeatedLaunchesAreBitIdentical) {
  QF_SKIP_WITHOUT_GPU();
  const GemmSpec s = spec_of(GemmScaling::Block128, ElemFormat::E4M3, ElemFormat::E4M3, DType::BF16, false, false, 128,
                             128, 2, 512, 1024);
  const ref::GemmProblem p =
      ref::make_gemm_problem(s, ref::random_group_rows(6, 3000, 1, 1, 4), 0, ref::GemmValues::Random, true, 10);
  Device dev = to_device(s, p);
  const std::vector<uint8_t> first = run(s, dev);
  for (int i = 0; i < 3; ++i) {
    dev.d.fill(0xFF);
    EXPECT_EQ(run(s, dev), first) << "launch " << i + 2;
  }
}

}  // namespace
