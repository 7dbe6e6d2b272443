// The grouped dequantize on a GPU, bit for bit against the CPU reference (reference/
// dequantize_grouped.h): every stream of every shipped recipe's grouped roles, fp32 and bf16
// outputs, NVFP4 with and without alpha_out, splits with empty members, one of many members and
// offsets off the grouped quantize's contract. The grouped buffers are the CPU reference
// quantize's, uploaded into allocations of the runtime's grouped capacity; the output starts
// poisoned (every element must be written). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "grouped_streams.h"
#include "reference/dequantize_grouped.h"
#include "runtime/dequantize_grouped.h"
#include "runtime/gpu_test_util.h"

namespace {

using namespace qf;

std::vector<int64_t> offsets_of(const std::vector<int64_t>& splits) {
  std::vector<int64_t> rows{0};
  for (int64_t m : splits) rows.push_back(rows.back() + m);
  return rows;
}

// One call against the reference; returns the number of differing output bytes (and alpha words).
size_t run_case(const Plan& plan, int si, const std::vector<int64_t>& splits, const std::vector<int64_t>& member_rows,
                int64_t k, DType out, bool alpha_out, uint32_t seed) {
  using namespace qf::rt;
  const qf::Stream& s = plan.streams[size_t(si)];
  int64_t m = 0;
  for (int64_t v : splits) m += v;
  const int G = int(member_rows.size()) - 1;
  const ref::HostTensor x = qf::testing::grouped_input(m, k, seed);
  ref::QuantizeParams params;
  params.seed = seed;
  for (const auto& in : input_buffers(plan)) params.scales[in.name] = 2.0f;
  const std::vector<ref::Output> outs = ref::quantize_grouped(plan, x, splits, params);
  const qf::testing::StreamBuffers b = qf::testing::stream_buffers(plan, si, outs);
  const ref::GroupedDequantized want =
      ref::dequantize_grouped(s, Shape2D{m, k}, member_rows, b.data, b.scale, b.amax, out, alpha_out);

  // Allocations of the grouped quantize's capacity for this shape and member count.
  std::map<std::string, int64_t> capacity;
  for (const auto& d : Quantizer(plan).grouped_capacity(Shape2D{m, k}, G)) capacity[d.name] = d.bytes;
  auto upload = [](const void* p, size_t bytes, size_t cap) {
    DeviceBuffer d = qf::rt::testing::poisoned_buffer(std::max<size_t>(cap, 16), 0x5A);
    if (bytes) d.upload(p, bytes);
    return d;
  };
  const std::string dir(name(s.dir));
  DeviceBuffer ddata = upload(b.data.data(), b.data.size(), size_t(capacity.at(dir + "_data")));
  DeviceBuffer dscale, damax, dalpha;
  DequantizeGroupedCall call;
  call.data = qf::rt::testing::view_of(ddata);
  if (!b.scale.empty() || capacity.count(dir + "_scale_inv")) {
    dscale = upload(b.scale.data(), b.scale.size(), size_t(capacity.at(dir + "_scale_inv")));
    call.scale = qf::rt::testing::view_of(dscale);
  }
  if (!b.amax.empty()) {
    damax = upload(b.amax.data(), b.amax.size() * 4, b.amax.size() * 4);
    call.amax = qf::rt::testing::view_of(damax);
  }
  DeviceBuffer drows = upload(member_rows.data(), member_rows.size() * 8, member_rows.size() * 8);
  call.member_rows = qf::rt::testing::view_of(drows);
  DeviceBuffer dws = qf::rt::testing::poisoned_buffer(size_t(dequantize_grouped_workspace_bytes(G)));
  call.workspace = qf::rt::testing::view_of(dws);
  const size_t out_bytes = size_t(m * k * traits(out).bytes);
  DeviceBuffer dout = qf::rt::testing::poisoned_buffer(std::max<size_t>(out_bytes, 16));
  call.out = qf::rt::testing::view_of(dout);
  if (alpha_out) {
    dalpha = qf::rt::testing::poisoned_buffer(size_t(4 * G));
    call.alpha_out = qf::rt::testing::view_of(dalpha);
  }
  call.num_members = G;
  rt::Stream stream;
  dequantize_grouped(s, Shape2D{m, k}, call, out, stream.get());
  stream.synchronize();
  std::vector<uint8_t> got(out_bytes);
  if (out_bytes) dout.download(got.data(), out_bytes);
  size_t bad = 0;
  for (size_t i = 0; i < out_bytes; ++i) bad += got[i] != want.out[i];
  if (bad) {
    size_t first = 0;
    while (got[first] == want.out[first]) ++first;
    ADD_FAILURE() << bad << " of " << out_bytes << " bytes differ; first at byte " << first << ": got 0x" << std::hex
                  << int(got[first]) << " want 0x" << int(want.out[first]);
  }
  if (alpha_out) {
    std::vector<float> alpha(static_cast<size_t>(G));
    dalpha.download(alpha.data(), alpha.size() * 4);
    for (int g = 0; g < G; ++g)
      if (std::memcmp(&alpha[size_t(g)], &want.alpha[size_t(g)], 4) != 0) {
        ++bad;
        ADD_FAILURE() << "alpha[" << g << "] " << alpha[size_t(g)] << " want " << want.alpha[size_t(g)];
      }
  }
  return bad;
}

TEST(GpuDequantizeGrouped, EveryShippedGroupedStreamBitExact) {
  QF_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> splits = {48, 0, 16, 128, 32};
  int cases = 0;
  for (const auto& gp : qf::testing::shipped_grouped_plans())
    for (int si = 0; si < int(gp.plan.streams.size()); ++si)
      for (DType out : {DType::FP32, DType::BF16})
        for (bool alpha : {false, true}) {
          if (alpha && traits(gp.plan.streams[size_t(si)].scaling).scale_storage != ScaleStorage::E4M3) continue;
          SCOPED_TRACE(gp.label + " stream " + std::to_string(si) + " " + std::string(traits(out).name) +
                       (alpha ? " alpha_out" : ""));
          EXPECT_EQ(run_case(gp.plan, si, splits, offsets_of(splits), 96, out, alpha, 3), 0u);
          ++cases;
        }
  EXPECT_GT(cases, 40);
}

// The hybrid's dgrad operands at a training shape: dY's MXFP8 rowwise copy and W's NVFP4
// columnwise copy (alpha_out), 8 experts of uneven tokens, and 1500 members of 16 rows (the
// prep kernel's runs of several members per thread).
TEST(GpuDequantizeGrouped, HybridDgradOperands) {
  QF_SKIP_WITHOUT_GPU();
  const Recipe r = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/hybrid_mxfp8_fwd_nvfp4_bwd.json");
  const Plan dy = compile_plan(r, PlanRequest{"grouped_linear:grad_output", DType::BF16, Usage::Training, true});
  const Plan w = compile_plan(r, PlanRequest{"grouped_linear:weight", DType::BF16, Usage::Training, true});
  const std::vector<int64_t> tokens = {128, 0, 384, 32, 256, 16, 512, 96};
  for (int si = 0; si < int(dy.streams.size()); ++si) {
    if (dy.streams[size_t(si)].dir == Direction::Rowwise) {
      EXPECT_EQ(run_case(dy, si, tokens, offsets_of(tokens), 1024, DType::BF16, false, 1), 0u);
    }
  }
  const std::vector<int64_t> experts(8, 512);
  for (int si = 0; si < int(w.streams.size()); ++si) {
    if (w.streams[size_t(si)].dir == Direction::Columnwise) {
      EXPECT_EQ(run_case(w, si, experts, offsets_of(experts), 768, DType::BF16, true, 2), 0u);
    }
  }
  const std::vector<int64_t> many(1500, 16);
  for (int si = 0; si < int(dy.streams.size()); ++si)
    EXPECT_EQ(run_case(dy, si, many, offsets_of(many), 64, DType::BF16, false, 4), 0u) << "stream " << si;
  for (int si = 0; si < int(w.streams.size()); ++si)
    EXPECT_EQ(run_case(w, si, many, offsets_of(many), 64, DType::BF16,
                       traits(w.streams[size_t(si)].scaling).scale_storage == ScaleStorage::E4M3, 5),
              0u)
        << "stream " << si;
}

// Offsets off the contract: a negative first offset, a falling one, a last one short of M (the
// rows after it zero) and one past M.
TEST(GpuDequantizeGrouped, OffsetsOffTheContractMatchTheReference) {
  QF_SKIP_WITHOUT_GPU();
  const Recipe r = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/hybrid_mxfp8_fwd_nvfp4_bwd.json");
  const Plan dy = compile_plan(r, PlanRequest{"grouped_linear:grad_output", DType::BF16, Usage::Training, true});
  const std::vector<int64_t> splits = {64, 32, 64};
  for (const std::vector<int64_t>& rows : {std::vector<int64_t>{-5, 64, 32, 128}, std::vector<int64_t>{0, 64, 96, 200}})
    for (int si = 0; si < int(dy.streams.size()); ++si)
      EXPECT_EQ(run_case(dy, si, splits, rows, 128, DType::BF16, false, 6), 0u) << "stream " << si;
}

}  // namespace
