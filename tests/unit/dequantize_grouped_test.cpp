// The grouped dequantize without a GPU (templates/qforge/dequant_grouped.cuh, runtime/
// dequantize_grouped.h, reference/dequantize_grouped.h): its program compiles under NVRTC for every
// stream of every shipped recipe's grouped roles; the CPU reference equals the single-tensor
// reference dequantize of each member's slice of the grouped buffers (empty members included),
// NVFP4's copy with S_dec left out times its alpha equals the full value and is exact in bf16, and
// offsets that break the grouped quantize's contract read as documented; a call's argument checks
// name what was wrong before any device work.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <tuple>

#include "error_of.h"
#include "grouped_streams.h"
#include "reference/dequantize.h"
#include "reference/dequantize_grouped.h"
#include "runtime/dequantize_grouped.h"

namespace {

using namespace qf;

TEST(DequantizeGroupedKernels, CompileForEveryShippedGroupedStreamWithoutAGpu) {
  rt::CacheOptions opts;
  opts.disabled = true;  // memory only
  rt::KernelCache cache(opts);
  std::set<std::tuple<int, int, int, int>> kinds;  // (format, scale storage, identity dtype, out)
  int compiled = 0;
  for (const auto& gp : qf::testing::shipped_grouped_plans())
    for (const Stream& s : gp.plan.streams)
      for (DType out : {DType::FP32, DType::BF16, DType::FP16}) {
        const auto key = std::make_tuple(int(s.format), int(traits(s.scaling).scale_storage), int(s.out_dtype), int(out));
        if (!kinds.insert(key).second) continue;
        const rt::QuantizeKernels k = rt::build_dequantize_grouped_kernel(s, out, "sm_90a", cache);
        EXPECT_FALSE(k.cached.entry->image.empty()) << gp.label;
        ++compiled;
      }
  EXPECT_GE(compiled, 12);  // e4m3 / e5m2 / e2m1 / int8 / identity streams, three output dtypes
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& splits) {
  std::vector<int64_t> rows{0};
  for (int64_t m : splits) rows.push_back(rows.back() + m);
  return rows;
}

// Every stream of every shipped grouped plan: the grouped reference against ref::dequantize of
// each member's slice (data at element K * first row, scales after the members' grids before, the
// member's amax).
TEST(DequantizeGroupedReference, EqualsTheSingleTensorReferencePerMember) {
  const std::vector<int64_t> splits = {48, 0, 16, 64, 32};
  const int64_t k = 96, m = 160;
  const std::vector<int64_t> rows = offsets_of(splits);
  const ref::HostTensor x = qf::testing::grouped_input(m, k, 7);
  int checked = 0;
  for (const auto& gp : qf::testing::shipped_grouped_plans()) {
    SCOPED_TRACE(gp.label);
    ref::QuantizeParams params;
    params.seed = 11;
    for (const auto& in : input_buffers(gp.plan)) params.scales[in.name] = 2.0f;
    const std::vector<ref::Output> outs = ref::quantize_grouped(gp.plan, x, splits, params);
    for (int si = 0; si < int(gp.plan.streams.size()); ++si) {
      const Stream& s = gp.plan.streams[size_t(si)];
      const qf::testing::StreamBuffers b = qf::testing::stream_buffers(gp.plan, si, outs);
      for (DType out : {DType::FP32, DType::BF16}) {
        const ref::GroupedDequantized got =
            ref::dequantize_grouped(s, Shape2D{m, k}, rows, b.data, b.scale, b.amax, out, false);
        ASSERT_EQ(got.out.size(), size_t(m * k * traits(out).bytes));
        EXPECT_TRUE(got.alpha.empty());
        int64_t data_off = 0, scale_off = 0;  // bytes of the members before
        for (size_t g = 0; g < splits.size(); ++g) {
          const Shape2D member{splits[g], k};
          Plan one = gp.plan;
          const std::vector<BufferDesc> mb = output_buffers(one, member);
          int64_t data_bytes = 0, scale_bytes = 0;
          for (const auto& d : mb) {
            if (d.stream == si && d.kind == BufferKind::Data) data_bytes = d.bytes;
            if (d.stream == si && d.kind == BufferKind::ScaleInv) scale_bytes = d.bytes;
          }
          if (splits[g] > 0) {
            const std::vector<uint8_t> want = ref::dequantize(
                s, member, std::span(b.data).subspan(size_t(data_off), size_t(data_bytes)),
                std::span(b.scale).subspan(size_t(scale_off), size_t(scale_bytes)), b.amax.empty() ? 0.0f : b.amax[g], out);
            const size_t at = size_t(rows[g] * k * traits(out).bytes);
            ASSERT_EQ(std::memcmp(got.out.data() + at, want.data(), want.size()), 0) << "member " << g << " stream " << si;
          }
          data_off += data_bytes;
          scale_off += scale_bytes;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 40);
}

// NVFP4 with alpha_out: alpha[g] is the member's S_dec, each value times it (one fp32 multiply)
// is the full dequantized value, and the bf16 copy holds the fp32 values exactly.
TEST(DequantizeGroupedReference, Nvfp4AlphaOutIsExact) {
  const std::vector<int64_t> splits = {32, 0, 64, 16};
  const int64_t k = 128, m = 112;
  const std::vector<int64_t> rows = offsets_of(splits);
  int checked = 0;
  for (const auto& gp : qf::testing::shipped_grouped_plans()) {
    for (int si = 0; si < int(gp.plan.streams.size()); ++si) {
      const Stream& s = gp.plan.streams[size_t(si)];
      if (traits(s.scaling).scale_storage != ScaleStorage::E4M3) continue;
      SCOPED_TRACE(gp.label + " stream " + std::to_string(si));
      // Members of very different ranges: their S_dec differ.
      ref::HostTensor x = qf::testing::grouped_input(m, k, 3, 1.0f);
      for (int64_t i = 0; i < 16 * k; ++i) {  // the last member's rows times 2^20
        uint16_t h;
        std::memcpy(&h, x.bytes.data() + 2 * (96 * k + i), 2);
        h = f32_to_bf16(bf16_to_f32(h) * 1048576.0f);
        std::memcpy(x.bytes.data() + 2 * (96 * k + i), &h, 2);
      }
      ref::QuantizeParams params;
      params.seed = 5;
      const std::vector<ref::Output> outs = ref::quantize_grouped(gp.plan, x, splits, params);
      const qf::testing::StreamBuffers b = qf::testing::stream_buffers(gp.plan, si, outs);
      ASSERT_EQ(b.amax.size(), splits.size());
      const auto full = ref::dequantize_grouped(s, Shape2D{m, k}, rows, b.data, b.scale, b.amax, DType::FP32, false);
      const auto f32 = ref::dequantize_grouped(s, Shape2D{m, k}, rows, b.data, b.scale, b.amax, DType::FP32, true);
      const auto bf = ref::dequantize_grouped(s, Shape2D{m, k}, rows, b.data, b.scale, b.amax, DType::BF16, true);
      ASSERT_EQ(f32.alpha.size(), splits.size());
      EXPECT_EQ(f32.alpha, bf.alpha);
      for (size_t g = 0; g < splits.size(); ++g)
        EXPECT_EQ(f32.alpha[g], nvfp4_global_decode_scale(nvfp4_global_encode_scale(b.amax[g])));
      EXPECT_NE(f32.alpha[0], f32.alpha[3]);
      for (size_t g = 0; g < splits.size(); ++g)
        for (int64_t i = rows[g] * k; i < rows[g + 1] * k; ++i) {
          float v, w;
          uint16_t h;
          std::memcpy(&v, f32.out.data() + 4 * i, 4);
          std::memcpy(&w, full.out.data() + 4 * i, 4);
          std::memcpy(&h, bf.out.data() + 2 * i, 2);
          const float prod = v * f32.alpha[g];
          ASSERT_EQ(std::memcmp(&prod, &w, 4), 0) << "element " << i;
          const float hv = bf16_to_f32(h);
          ASSERT_EQ(std::memcmp(&v, &hv, 4), 0) << "element " << i << " is not exact in bf16";
        }
      ++checked;
    }
  }
  EXPECT_GE(checked, 2);  // nvfp4's and the hybrid's streams
}

// Offsets off the quantize's contract: clamped to [0, M], made rising; rows outside every member
// read zero. Here members {0, 48} and {48, 64} (a falling offset clamped up), rows 64.. outside.
TEST(DequantizeGroupedReference, OffsetsOffTheContractAreClampedAndRisingRowsOutsideZero) {
  const std::vector<int64_t> splits = {48, 16, 32};
  const int64_t k = 64, m = 96;
  const ref::HostTensor x = qf::testing::grouped_input(m, k, 9);
  const Recipe r = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/mxfp8_hopper.json");
  const Plan plan = compile_plan(r, PlanRequest{"grouped_linear:input", DType::BF16, Usage::Training, true});
  const std::vector<ref::Output> outs = ref::quantize_grouped(plan, x, splits, {});
  const qf::testing::StreamBuffers b = qf::testing::stream_buffers(plan, 0, outs);
  const Stream& s = plan.streams[0];
  const std::vector<int64_t> good = offsets_of(splits);
  const auto want = ref::dequantize_grouped(s, Shape2D{m, k}, good, b.data, b.scale, {}, DType::BF16, false);
  const std::vector<int64_t> bad = {-5, 48, 20, 64};  // member 1: [48, 48) empty; member 2: [48, 64)
  const auto got = ref::dequantize_grouped(s, Shape2D{m, k}, bad, b.data, b.scale, {}, DType::BF16, false);
  // Members [0, 48), [48, 48) and [48, 64) read what the good split's [0, 48) and [48, 64) do.
  EXPECT_EQ(std::memcmp(got.out.data(), want.out.data(), size_t(64 * k * 2)), 0);
  for (int64_t i = 64 * k; i < m * k; ++i) ASSERT_EQ(got.out[size_t(2 * i)] | got.out[size_t(2 * i + 1)], 0) << i;
}

// Each argument check names its argument and what it expected; all run before any device work.
TEST(DequantizeGroupedArguments, ErrorsNameTheArgument) {
  const Recipe r = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/hybrid_mxfp8_fwd_nvfp4_bwd.json");
  const Plan plan = compile_plan(r, PlanRequest{"grouped_linear:weight", DType::BF16, Usage::Training, true});
  const Stream* row = nullptr;
  const Stream* col = nullptr;
  for (const Stream& s : plan.streams) (s.dir == Direction::Rowwise ? row : col) = &s;
  ASSERT_NE(row, nullptr);
  ASSERT_NE(col, nullptr);
  ASSERT_EQ(traits(col->scaling).scale_storage, ScaleStorage::E4M3);
  const Shape2D total{4 * 256, 512};
  const int G = 4;
  uint64_t next = 0x10000000;
  auto buf = [&](int64_t bytes) {
    const rt::TensorView v{next, bytes, std::nullopt, {}};
    next += uint64_t(bytes + 4096) / 4096 * 4096;
    return v;
  };
  rt::DequantizeGroupedCall good;
  good.data = buf(1 << 20);
  good.scale = buf(1 << 20);
  good.amax = buf(4 * G);
  good.member_rows = buf(8 * (G + 1));
  good.workspace = buf(rt::dequantize_grouped_workspace_bytes(G));
  good.out = buf(total.m * total.k * 2);
  good.alpha_out = buf(4 * G);
  good.num_members = G;
  auto run = [&](const qf::Stream& s, rt::DequantizeGroupedCall c) {
    return qf::testing::error_of([&] { rt::dequantize_grouped(s, total, c, DType::BF16, nullptr); });
  };
  auto expect = [](const std::string& err, const std::string& part) { EXPECT_NE(err.find(part), std::string::npos) << err; };
  {
    auto c = good;
    c.num_members = 0;
    expect(run(*col, c), "num_members");
  }
  {
    auto c = good;
    c.data.bytes = 16;
    const std::string e = run(*col, c);
    expect(e, "data");
    expect(e, "the columnwise data of a grouped input [1024, 512] of 4 members");
  }
  {
    auto c = good;
    c.scale.bytes = 16;
    expect(run(*col, c), "the columnwise scales of a grouped input [1024, 512] of 4 members");
  }
  {
    auto c = good;
    c.amax.bytes = 8;
    const std::string e = run(*col, c);
    expect(e, "amax");
    expect(e, "per-member amax");
  }
  {
    auto c = good;
    c.member_rows.bytes = 8 * G;
    expect(run(*col, c), "member_rows");
  }
  {
    auto c = good;
    c.workspace.bytes = 8;
    expect(run(*col, c), "workspace");
  }
  {
    auto c = good;
    c.out.bytes = 1024;
    expect(run(*col, c), "the dequantized [1024, 512]");
  }
  {
    auto c = good;
    c.alpha_out.bytes = 4;
    expect(run(*col, c), "alpha_out");
  }
  {
    auto c = good;  // MXFP8 has no decode scale to leave out
    expect(run(*row, c), "alpha_out: only NVFP4");
  }
  {
    auto c = good;
    c.out = c.data;
    const std::string e = run(*col, c);
    expect(e, "out");
    expect(e, "data");
  }
  {
    auto c = good;
    c.alpha_out = c.amax;
    expect(run(*col, c), "alpha_out");
  }
}

TEST(DequantizeGroupedKernels, GeometryOfTheHybridsOperands) {
  const Recipe r = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/hybrid_mxfp8_fwd_nvfp4_bwd.json");
  const Plan w = compile_plan(r, PlanRequest{"grouped_linear:weight", DType::BF16, Usage::Training, true});
  for (const Stream& s : w.streams) {
    const DequantGroupedArgs a = rt::dequantize_grouped_geometry(s, Shape2D{1024, 512}, 4);
    if (s.dir == Direction::Columnwise) {
      EXPECT_EQ(a.transposed, 1);  // per member [K, N_g]: the dgrad's B operand
      EXPECT_EQ(a.entry_rows, 1);
      EXPECT_EQ(a.entry_cols, 16);
      // A member of 256 rows: data [512, 256], grid [512, 16].
      const DequantizeArgs m = dequant_member_geometry(a, 256);
      EXPECT_EQ(m.rows, 512);
      EXPECT_EQ(m.cols, 256);
      EXPECT_EQ(m.grid_padded_rows * m.grid_padded_cols,
                scale_grid(s, Shape2D{256, 512}).size());
    }
  }
}

}  // namespace
