// Tests of the CPU reference executor (reference/executor.h): hand-checked small cases per
// scaling mode, layouts, ragged edges, grouped tensors, stochastic rounding, delayed scaling,
// and a sweep over every shipped recipe x role x usage x dtype x shape.
#include "reference/executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

namespace qf {
namespace {

using ref::HostTensor;
using ref::Output;
using ref::QuantizeParams;

// ----------------------------------------------------------------------------- helpers

HostTensor make_tensor(DType dt, int64_t m, int64_t k, const std::vector<float>& vals) {
  HostTensor t;
  t.dtype = dt;
  t.shape = {m, k};
  const int nb = traits(dt).bytes;
  t.bytes.resize(size_t(m * k * nb));
  for (size_t i = 0; i < vals.size(); ++i) {
    uint8_t* p = &t.bytes[i * size_t(nb)];
    if (dt == DType::FP32) {
      const u32 b = f32_bits(vals[i]);
      for (int j = 0; j < 4; ++j) p[j] = uint8_t(b >> (8 * j));
    } else {
      const u16 h = dt == DType::BF16 ? f32_to_bf16(vals[i]) : f32_to_f16(vals[i]);
      p[0] = uint8_t(h), p[1] = uint8_t(h >> 8);
    }
  }
  return t;
}

// Deterministic pseudo-random values in [-r, r) (some exact zeros).
std::vector<float> pseudo_random(int64_t n, float r, uint32_t seed = 1) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    const uint32_t u = s >> 8;
    x = (u % 97 == 0) ? 0.0f : (float(u) / float(1u << 24) * 2.0f - 1.0f) * r;
  }
  return v;
}

Plan plan_from_text(const std::string& json, const std::string& role, DType dt,
                    std::optional<Usage> usage = std::nullopt, bool grouped = false) {
  Recipe r = parse_recipe(json);
  return compile_plan(r, PlanRequest{role, dt, usage, grouped});
}

Plan plan_from_file(const std::string& recipe, const std::string& role, DType dt,
                    std::optional<Usage> usage = std::nullopt, bool grouped = false) {
  Recipe r = load_recipe(std::filesystem::path(QF_SOURCE_DIR) / "recipes" / (recipe + ".json"));
  return compile_plan(r, PlanRequest{role, dt, usage, grouped});
}

// A one-rule recipe for tests ("*:*"), from the JSON of its directions.
std::string recipe_text(const std::string& rowwise, const std::string& columnwise = "",
                        const std::string& usage = "training") {
  std::string s = R"({"qforge_recipe": 1, "name": "t", "usage": ")" + usage +
                  R"(", "roles": [{"match": "*:*", "rowwise": )" + rowwise;
  if (!columnwise.empty()) s += R"(, "columnwise": )" + columnwise;
  return s + "}]}";
}

const Output& find(const std::vector<Output>& outs, const std::string& name) {
  for (const auto& o : outs)
    if (o.desc.name == name) return o;
  throw std::runtime_error("no output named " + name);
}
bool has(const std::vector<Output>& outs, const std::string& name) {
  for (const auto& o : outs)
    if (o.desc.name == name) return true;
  return false;
}

float f32_at(const Output& o, size_t i) {
  u32 b = 0;
  for (int j = 0; j < 4; ++j) b |= u32(o.bytes[i * 4 + size_t(j)]) << (8 * j);
  return f32_from_bits(b);
}
u16 u16_at(const Output& o, size_t i) { return u16(o.bytes[i * 2] | (o.bytes[i * 2 + 1] << 8)); }

std::vector<uint8_t> bytes_of(std::initializer_list<int> v) {
  std::vector<uint8_t> out;
  for (int x : v) out.push_back(uint8_t(x));
  return out;
}

void expect_matches_buffers(const Plan& plan, Shape2D shape, const std::vector<Output>& outs) {
  const auto descs = output_buffers(plan, shape);
  ASSERT_EQ(outs.size(), descs.size());
  for (size_t i = 0; i < descs.size(); ++i) {
    EXPECT_EQ(outs[i].desc.name, descs[i].name);
    EXPECT_EQ(outs[i].desc.bytes, descs[i].bytes) << descs[i].name;
    EXPECT_EQ(int64_t(outs[i].bytes.size()), descs[i].bytes) << descs[i].name;
  }
}

// ----------------------------------------------------------------------------- per-tensor current

TEST(ReferenceCurrent, Known2x3Tensor) {
  const Plan p = plan_from_file("current_scaling", "linear:input", DType::FP32);
  // amax 4 -> scale 448 / 4 = 112.
  const HostTensor x = make_tensor(DType::FP32, 2, 3, {1, -2, 0.5f, 0.25f, 4, -3});
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  // 112 = 1.75*2^6 -> 0x6E; -224 -> 0xF6; 56 -> 0x66; 28 -> 0x5E; 448 -> 0x7E;
  // -336 = -1.3125*2^8 ties to even -> -1.25*2^8 -> 0xFA.
  EXPECT_EQ(find(outs, "rowwise_data").bytes, bytes_of({0x6E, 0xF6, 0x66, 0x5E, 0x7E, 0xFA}));
  // Columnwise: the transposed [3, 2] copy with the same scale.
  EXPECT_EQ(find(outs, "columnwise_data").bytes, bytes_of({0x6E, 0x5E, 0xF6, 0x7E, 0x66, 0xFA}));
  EXPECT_EQ(find(outs, "columnwise_data").desc.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(f32_at(find(outs, "rowwise_scale_inv"), 0), 1.0f / 112.0f);
  EXPECT_EQ(f32_at(find(outs, "columnwise_scale_inv"), 0), 1.0f / 112.0f);
  EXPECT_EQ(f32_at(find(outs, "amax"), 0), 4.0f);
}

TEST(ReferenceCurrent, ZeroTensorHasUnitScale) {
  const Plan p = plan_from_file("current_scaling", "linear:grad_output", DType::BF16);
  const HostTensor x = make_tensor(DType::BF16, 2, 2, {0, -0.0f, 0, 0});
  const auto outs = ref::quantize(p, x, {});
  EXPECT_EQ(f32_at(find(outs, "rowwise_scale_inv"), 0), 1.0f);
  EXPECT_EQ(find(outs, "rowwise_data").bytes, bytes_of({0x00, 0x80, 0x00, 0x00}));  // -0 kept
  EXPECT_EQ(f32_at(find(outs, "amax"), 0), 0.0f);
}

// ----------------------------------------------------------------------------- delayed

TEST(ReferenceDelayed, MissingScaleNamesTheInput) {
  const Plan p = plan_from_file("delayed_scaling", "linear:input", DType::BF16);
  const HostTensor x = make_tensor(DType::BF16, 2, 2, {1, 2, 3, 4});
  try {
    ref::quantize(p, x, {});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("\"scale\""), std::string::npos) << e.what();
  }
  const Plan pr = plan_from_file("delayed_scaling", "linear:input", DType::BF16, Usage::Inference);
  try {
    ref::quantize(pr, x, {});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("rowwise_scale"), std::string::npos) << e.what();
  }
}

TEST(ReferenceDelayed, UsesGivenScaleAndReportsAmax) {
  const Plan p = plan_from_file("delayed_scaling", "linear:input", DType::FP32);
  const HostTensor x = make_tensor(DType::FP32, 1, 4, {1, -2, 100, 0.5f});
  QuantizeParams params;
  params.scales["scale"] = 2.0f;
  const auto outs = ref::quantize(p, x, params);
  expect_matches_buffers(p, x.shape, outs);
  EXPECT_EQ(f32_at(find(outs, "rowwise_scale_inv"), 0), 0.5f);
  EXPECT_EQ(f32_at(find(outs, "amax"), 0), 100.0f);
  // 2 -> 0x40, -4 -> 0xC8, 200 -> e4m3 RNE (192 or 208: 200 = 1.5625*128 -> tie -> 1.5*128=192) 0x74,
  // 1 -> 0x38.
  EXPECT_EQ(find(outs, "rowwise_data").bytes, bytes_of({0x40, 0xC8, 0x74, 0x38}));
}

TEST(ReferenceDelayed, AmaxHistoryUpdate) {
  PerTensorDelayed mode;
  mode.amax_compute = AmaxCompute::Max;
  std::vector<float> h = {1, 5, 2};
  float scale = 7.0f;
  ref::update_amax_history(h, 4.0f, scale, mode, ElemFormat::E4M3);
  EXPECT_EQ(h, (std::vector<float>{4, 1, 5}));
  EXPECT_EQ(scale, 448.0f / 5.0f);

  mode.amax_compute = AmaxCompute::MostRecent;
  mode.margin = 1;
  ref::update_amax_history(h, 8.0f, scale, mode, ElemFormat::E5M2);
  EXPECT_EQ(h, (std::vector<float>{8, 4, 1}));
  EXPECT_EQ(scale, (57344.0f / 8.0f) * 0.5f);

  // amax 0 (or Inf) keeps the previous scale.
  std::vector<float> z = {0, 0};
  scale = 3.0f;
  mode.amax_compute = AmaxCompute::Max;
  ref::update_amax_history(z, 0.0f, scale, mode, ElemFormat::E4M3);
  EXPECT_EQ(scale, 3.0f);
  ref::update_amax_history(z, INFINITY, scale, mode, ElemFormat::E4M3);
  EXPECT_EQ(scale, 3.0f);
}

// ----------------------------------------------------------------------------- MX

TEST(ReferenceMx, KnownBlockAmaxRceil) {
  const Plan p = plan_from_file("mxfp8", "linear:input", DType::BF16, Usage::Inference);
  std::vector<float> v(32, 0.0f);
  v[0] = 3.0f, v[1] = 1.0f, v[2] = -0.5f;
  const HostTensor x = make_tensor(DType::BF16, 1, 32, v);
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  // 3 / 448 lies in [2^-8, 2^-7) with a non-zero mantissa: E = 127 - 8 + 1 = 120, multiplier 2^7.
  EXPECT_EQ(find(outs, "rowwise_scale_inv").bytes, bytes_of({120}));
  const auto& d = find(outs, "rowwise_data").bytes;
  EXPECT_EQ(d[0], 0x7C);  // 384 = 1.5 * 2^8
  EXPECT_EQ(d[1], 0x70);  // 128
  EXPECT_EQ(d[2], 0xE8);  // -64
  for (int i = 3; i < 32; ++i) EXPECT_EQ(d[size_t(i)], 0);
}

TEST(ReferenceMx, FloorVersusRceil) {
  const std::string fl = R"({"format": "e4m3", "scaling": {"mode": "mx", "block": [1, 32], "rule": "floor"}})";
  const std::string rc = R"({"format": "e4m3", "scaling": {"mode": "mx", "block": [1, 32], "rule": "rceil"}})";
  std::vector<float> v(32, 1.0f);
  v[5] = 500.0f;
  const HostTensor x = make_tensor(DType::FP32, 1, 32, v);
  const auto of = ref::quantize(plan_from_text(recipe_text(fl, "", "inference"), "linear:input", DType::FP32), x, {});
  const auto orc = ref::quantize(plan_from_text(recipe_text(rc, "", "inference"), "linear:input", DType::FP32), x, {});
  // floor: floor(log2 500) = 8 -> E = 8 - 8 + 127 = 127 (x1): 500 saturates to 448.
  EXPECT_EQ(find(of, "rowwise_scale_inv").bytes, bytes_of({127}));
  EXPECT_EQ(find(of, "rowwise_data").bytes[5], 0x7E);
  // rceil: 500/448 > 1 -> E = 128 (x0.5): 250 rounds to 256 -> 0x78.
  EXPECT_EQ(find(orc, "rowwise_scale_inv").bytes, bytes_of({128}));
  EXPECT_EQ(find(orc, "rowwise_data").bytes[5], 0x78);
}

TEST(ReferenceMx, ColumnwiseSameLayoutBlocksAlongM) {
  const Plan p = plan_from_file("mxfp8", "linear:input", DType::FP32);
  // 64 x 2: column 0 has amax 3 in rows [0, 32) and 0 in rows [32, 64); column 1 is 1s.
  std::vector<float> v(128, 0.0f);
  for (int m = 0; m < 64; ++m) v[size_t(m * 2 + 1)] = 1.0f;
  v[0] = 3.0f;
  const HostTensor x = make_tensor(DType::FP32, 64, 2, v);
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  const auto& cs = find(outs, "columnwise_scale_inv");
  EXPECT_EQ(cs.desc.shape, (std::vector<int64_t>{2, 2}));
  // 1/448 -> exponent field 118, mantissa non-zero -> 119.
  EXPECT_EQ(cs.bytes, bytes_of({120, 119, 0, 119}));
  const auto& cd = find(outs, "columnwise_data");
  EXPECT_EQ(cd.desc.shape, (std::vector<int64_t>{64, 2}));  // same layout, not transposed
  EXPECT_EQ(cd.bytes[0], 0x7C);
}

TEST(ReferenceMx, SwizzledPaddingIsZero) {
  const std::string sw =
      R"({"format": "e4m3", "scaling": {"mode": "mx", "block": [1, 32]}, "scale_layout": "swizzled"})";
  const Plan p = plan_from_text(recipe_text(sw, "", "inference"), "linear:input", DType::BF16);
  std::vector<float> v(2 * 64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 7) + 1.0f;  // every block non-zero
  const HostTensor x = make_tensor(DType::BF16, 2, 64, v);
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  const auto& s = find(outs, "rowwise_scale_inv");
  ASSERT_EQ(s.bytes.size(), 512u);
  EXPECT_TRUE(s.desc.zero_padding);
  const size_t at[4] = {size_t(swizzled_scale_offset(0, 0, 4)), size_t(swizzled_scale_offset(0, 1, 4)),
                        size_t(swizzled_scale_offset(1, 0, 4)), size_t(swizzled_scale_offset(1, 1, 4))};
  EXPECT_EQ(at[0], 0u);
  EXPECT_EQ(at[2], 16u);
  for (size_t i = 0; i < s.bytes.size(); ++i) {
    const bool entry = i == at[0] || i == at[1] || i == at[2] || i == at[3];
    if (entry) {
      EXPECT_NE(s.bytes[i], 0) << i;
    } else {
      EXPECT_EQ(s.bytes[i], 0) << i;
    }
  }
  // Amax 7: 7 * fl(1/448) is 2^-6 up to rounding -> E 121 or 122, as e8m0_rceil says.
  EXPECT_EQ(s.bytes[0], e8m0_rceil(7.0f * (1.0f / 448.0f)));
}

TEST(ReferenceMx, Tile2DSharedByEveryEntry) {
  const std::string t2 = R"({"format": "e4m3", "scaling": {"mode": "mx", "block": [32, 32]}})";
  const Plan p = plan_from_text(recipe_text(t2, t2), "linear:weight", DType::FP32);
  std::vector<float> v(size_t(40 * 40), 1.0f);
  v[size_t(31 * 40 + 31)] = 3.0f;  // in tile (0, 0), last row/col
  const HostTensor x = make_tensor(DType::FP32, 40, 40, v);
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  const auto& rs = find(outs, "rowwise_scale_inv");  // [40, 2]
  const auto& cs = find(outs, "columnwise_scale_inv");
  for (int r = 0; r < 40; ++r) {
    EXPECT_EQ(rs.bytes[size_t(r * 2)], r < 32 ? 120 : 119) << r;
    EXPECT_EQ(rs.bytes[size_t(r * 2 + 1)], 119) << r;
  }
  // Columnwise transposed [40 (K), 40 (M)] data, grid [40, 2]: entry (k, mblock).
  for (int k = 0; k < 40; ++k) {
    EXPECT_EQ(cs.bytes[size_t(k * 2)], k < 32 ? 120 : 119) << k;
    EXPECT_EQ(cs.bytes[size_t(k * 2 + 1)], 119) << k;
  }
}

// ----------------------------------------------------------------------------- NVFP4

TEST(ReferenceNvfp4, ZeroBlockAndKnownBlock) {
  const Plan p = plan_from_file("nvfp4", "linear:input", DType::BF16, Usage::Inference);
  std::vector<float> v(32, 0.0f);
  for (int i = 16; i < 32; ++i) v[size_t(i)] = 1.0f;
  v[16] = 6.0f, v[17] = -3.0f, v[18] = 0.5f;
  const HostTensor x = make_tensor(DType::BF16, 1, 32, v);
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  // S_enc = 2688 / 6 = 448; block 1: 6 * (448 / 6) = 448 -> e4m3 0x7E; block 0 -> scale 0.
  EXPECT_EQ(find(outs, "rowwise_scale_inv").bytes, bytes_of({0x00, 0x7E}));
  EXPECT_EQ(f32_at(find(outs, "rowwise_amax"), 0), 6.0f);
  const auto& d = find(outs, "rowwise_data").bytes;
  ASSERT_EQ(d.size(), 16u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(d[size_t(i)], 0) << i;
  // Elements 16, 17 -> byte 8: 6 -> 0x7 (low), -3 -> 0xD (high); 0.5 -> 0x1, 1 -> 0x2.
  EXPECT_EQ(d[8], 0xD7);
  EXPECT_EQ(d[9], 0x21);
  for (int i = 10; i < 16; ++i) EXPECT_EQ(d[size_t(i)], 0x22) << i;
}

TEST(ReferenceNvfp4, RhtOfSignedConstantColumn) {
  // x_i = c * s_i (s the RHT sign vector): diag(s) x = c * ones, H16 ones = 16 e_0, / 4:
  // each group becomes [4c, 0, ..., 0].
  const Plan p = plan_from_file("nvfp4", "linear:input", DType::BF16);
  const u32 mask = kDefaultRhtSignMask;
  std::vector<float> v(16 * 2);
  for (int m = 0; m < 16; ++m) {
    const float s = ((mask >> m) & 1u) ? -1.0f : 1.0f;
    v[size_t(m * 2)] = 1.5f * s;
    v[size_t(m * 2 + 1)] = 0.75f * s;
  }
  const HostTensor x = make_tensor(DType::BF16, 16, 2, v);
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  EXPECT_EQ(f32_at(find(outs, "rowwise_amax"), 0), 1.5f);
  EXPECT_EQ(f32_at(find(outs, "columnwise_amax"), 0), 6.0f);  // post-RHT
  // Columnwise [K=2, M=16] packed: only element 0 of each row is non-zero.
  const auto& cd = find(outs, "columnwise_data").bytes;
  ASSERT_EQ(cd.size(), 16u);
  EXPECT_EQ(cd[0], 0x07);  // 6 -> 6
  EXPECT_EQ(cd[8], 0x07);  // 3 * 2 -> 6
  for (int i = 0; i < 16; ++i)
    if (i != 0 && i != 8) {
      EXPECT_EQ(cd[size_t(i)], 0) << i;
    }
  // Block scales: 6 * 448/6 = 448 -> 0x7E; 3 * 448/6 = 224 -> 0x76.
  EXPECT_EQ(find(outs, "columnwise_scale_inv").bytes, bytes_of({0x7E, 0x76}));
}

TEST(ReferenceNvfp4, Tile2DBothOrientationsAgree) {
  const Plan p = plan_from_file("nvfp4", "linear:weight", DType::FP32);
  const HostTensor x = make_tensor(DType::FP32, 32, 48, pseudo_random(32 * 48, 5.0f, 7));
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  const auto& rs = find(outs, "rowwise_scale_inv");     // [32, 3]
  const auto& cs = find(outs, "columnwise_scale_inv");  // [48, 2]
  for (int m = 0; m < 32; ++m)
    for (int k = 0; k < 48; ++k)
      EXPECT_EQ(rs.bytes[size_t(m * 3 + k / 16)], cs.bytes[size_t(k * 2 + m / 16)]) << m << "," << k;
  // The data agrees too: columnwise is the transposed rowwise.
  const auto& rd = find(outs, "rowwise_data").bytes;
  const auto& cd = find(outs, "columnwise_data").bytes;
  auto nib = [](const std::vector<uint8_t>& b, size_t i) { return (b[i / 2] >> ((i & 1) * 4)) & 0xF; };
  for (int m = 0; m < 32; ++m)
    for (int k = 0; k < 48; ++k) ASSERT_EQ(nib(rd, size_t(m * 48 + k)), nib(cd, size_t(k * 32 + m)));
}

TEST(ReferenceHybrid, StreamsAreIndependent) {
  // The hybrid recipe's rowwise MXFP8 stream equals mxfp8_hopper's rowwise stream (both mn_major
  // e8m0 grids), and its columnwise NVFP4 + RHT stream equals nvfp4's columnwise input stream: one
  // fused plan, same bits.
  const HostTensor x = make_tensor(DType::BF16, 32, 64, pseudo_random(32 * 64, 8.0f, 21));
  const auto h = ref::quantize(plan_from_file("hybrid_mxfp8_fwd_nvfp4_bwd", "linear:input", DType::BF16), x, {});
  const auto m = ref::quantize(plan_from_file("mxfp8_hopper", "linear:input", DType::BF16), x, {});
  const auto n = ref::quantize(plan_from_file("nvfp4", "linear:input", DType::BF16), x, {});
  for (const char* b : {"rowwise_data", "rowwise_scale_inv"}) EXPECT_EQ(find(h, b).bytes, find(m, b).bytes) << b;
  for (const char* b : {"columnwise_data", "columnwise_scale_inv", "columnwise_amax"})
    EXPECT_EQ(find(h, b).bytes, find(n, b).bytes) << b;
}

// ----------------------------------------------------------------------------- INT8 per channel

TEST(ReferenceInt8, PerChannelRowwise) {
  const Plan p = plan_from_file("w8a8_int8_inference", "linear:weight", DType::FP32);
  const HostTensor x = make_tensor(DType::FP32, 2, 3, {127, -63.5f, 0.5f, 254, 3, -5});
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  // Row 0: scale 1: 127, rint(-63.5) = -64, rint(0.5) = 0. Row 1: scale 2: 127, rint(1.5) = 2,
  // rint(-2.5) = -2.
  EXPECT_EQ(find(outs, "rowwise_data").bytes, bytes_of({127, 0xC0, 0, 127, 2, 0xFE}));
  const auto& s = find(outs, "rowwise_scale_inv");
  EXPECT_EQ(f32_at(s, 0), 1.0f);
  EXPECT_EQ(f32_at(s, 1), 2.0f);
  EXPECT_FALSE(has(outs, "amax"));
}

TEST(ReferenceInt8, ScaleRoundedToInputDtype) {
  const Plan p = plan_from_file("w8a8_int8_inference", "linear:input", DType::BF16);
  const HostTensor x = make_tensor(DType::BF16, 1, 2, {1.0f, -0.5f});
  const auto outs = ref::quantize(p, x, {});
  const float scale = bf16_to_f32(f32_to_bf16(1.0f / 127.0f));
  EXPECT_EQ(f32_at(find(outs, "rowwise_scale_inv"), 0), scale);
  const float inv = 1.0f / scale;
  EXPECT_EQ(find(outs, "rowwise_data").bytes, bytes_of({encode_rn<Int8>(1.0f * inv), encode_rn<Int8>(-0.5f * inv)}));
}

TEST(ReferenceInt8, PerChannelColumnwiseIsPerColumnOfX) {
  const Plan p = plan_from_file("int8_weight_sr", "linear:weight", DType::FP32);
  // Every scaled value is an integer, so stochastic rounding is exact.
  const HostTensor x = make_tensor(DType::FP32, 2, 2, {127, 2, -2, -254});
  QuantizeParams params;
  params.seed = 42;
  const auto outs = ref::quantize(p, x, params);
  expect_matches_buffers(p, x.shape, outs);
  // Rowwise scales [1, 2]; columnwise (per column of X) [1, 2] over columns [127, -2], [2, -254].
  EXPECT_EQ(find(outs, "rowwise_data").bytes, bytes_of({127, 2, 0xFF, 0x81}));
  EXPECT_EQ(find(outs, "columnwise_data").bytes, bytes_of({127, 0xFE, 1, 0x81}));
  const auto& cs = find(outs, "columnwise_scale_inv");
  EXPECT_EQ(f32_at(cs, 0), 1.0f);
  EXPECT_EQ(f32_at(cs, 1), 2.0f);
}

// ----------------------------------------------------------------------------- identity

TEST(ReferenceIdentity, TransposedCopy) {
  const Plan p = plan_from_file("int8_weight_sr", "linear:input", DType::BF16);
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 65504.0f};
  const HostTensor x = make_tensor(DType::BF16, 2, 3, v);
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  ASSERT_EQ(outs.size(), 2u);  // no scales, no amax
  const auto& r = find(outs, "rowwise_data");
  const auto& c = find(outs, "columnwise_data");
  EXPECT_EQ(r.bytes, x.bytes);
  EXPECT_EQ(c.desc.shape, (std::vector<int64_t>{3, 2}));
  for (int m = 0; m < 2; ++m)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(u16_at(c, size_t(k * 2 + m)), u16_at(r, size_t(m * 3 + k)));
}

TEST(ReferenceIdentity, DtypeCast) {
  const std::string id = R"({"format": "identity", "dtype": "fp16"})";
  const Plan p = plan_from_text(recipe_text(id, "", "inference"), "linear:input", DType::FP32);
  const HostTensor x = make_tensor(DType::FP32, 1, 3, {1.0f, 1e6f, NAN});
  const auto outs = ref::quantize(p, x, {});
  const auto& r = find(outs, "rowwise_data");
  EXPECT_EQ(r.bytes.size(), 6u);
  EXPECT_EQ(u16_at(r, 0), 0x3C00);
  EXPECT_EQ(u16_at(r, 1), 0x7C00);  // overflow -> Inf
  EXPECT_EQ(u16_at(r, 2), 0x7E00);
}

// ----------------------------------------------------------------------------- FP8 block, ragged

TEST(ReferenceBlock, Ragged31x33OneByOneTwentyEight) {
  const Plan p = plan_from_file("float8_block_scaling", "linear:input", DType::BF16);
  const int64_t M = 31, K = 33;
  const auto vals = pseudo_random(M * K, 20.0f, 3);
  const HostTensor x = make_tensor(DType::BF16, M, K, vals);
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  const float bmax = traits(DType::BF16).max_finite;
  const auto& rd = find(outs, "rowwise_data");
  const auto& rs = find(outs, "rowwise_scale_inv");
  const auto& cd = find(outs, "columnwise_data");
  const auto& cs = find(outs, "columnwise_scale_inv");
  ASSERT_EQ(rs.bytes.size(), size_t(M * 4));
  // The transposed copy's grid is mn_major: [1 token block, K rows padded to 36], padding zero.
  ASSERT_EQ(cs.bytes.size(), size_t(36 * 4));
  for (size_t p = size_t(K); p < 36; ++p) EXPECT_EQ(f32_at(cs, p), 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    float a = 0;
    for (int64_t k = 0; k < K; ++k) a = amax_step(a, x.at(m, k));
    const float scale = compute_scale(a, 448.0f, 0.0f, true, bmax);
    EXPECT_EQ(f32_at(rs, size_t(m)), 1.0f / scale);
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(rd.bytes[size_t(m * K + k)], encode_rn<E4M3>(x.at(m, k) * scale));
  }
  for (int64_t k = 0; k < K; ++k) {
    float a = 0;
    for (int64_t m = 0; m < M; ++m) a = amax_step(a, x.at(m, k));
    const float scale = compute_scale(a, 448.0f, 0.0f, true, bmax);
    EXPECT_EQ(f32_at(cs, size_t(k)), 1.0f / scale);
    for (int64_t m = 0; m < M; ++m) ASSERT_EQ(cd.bytes[size_t(k * M + m)], encode_rn<E4M3>(x.at(m, k) * scale));
  }
}

TEST(ReferenceBlock, Tiles2DOneScalePerTile) {
  const Plan p = plan_from_file("float8_block_scaling", "linear:weight", DType::FP32);
  const int64_t M = 130, K = 129;
  const HostTensor x = make_tensor(DType::FP32, M, K, pseudo_random(M * K, 3.0f, 5));
  const auto outs = ref::quantize(p, x, {});
  expect_matches_buffers(p, x.shape, outs);
  const auto& rs = find(outs, "rowwise_scale_inv");
  const auto& cs = find(outs, "columnwise_scale_inv");
  ASSERT_EQ(rs.desc.shape, (std::vector<int64_t>{2, 2}));
  ASSERT_EQ(cs.desc.shape, (std::vector<int64_t>{2, 2}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      float a = 0;
      for (int64_t m = i * 128; m < std::min<int64_t>(M, (i + 1) * 128); ++m)
        for (int64_t k = j * 128; k < std::min<int64_t>(K, (j + 1) * 128); ++k) a = amax_step(a, x.at(m, k));
      const float inv = 1.0f / compute_scale(a, 448.0f, 0.0f, true, FLT_MAX);
      EXPECT_EQ(f32_at(rs, size_t(i * 2 + j)), inv);
      EXPECT_EQ(f32_at(cs, size_t(j * 2 + i)), inv);  // transposed grid
    }
}

// mn_major (Transformer Engine's GEMM-ready 1D block scales): the compact grid's entries, stored
// column-major with the rows padded to a multiple of 4 (padding zero); the data is unchanged.
TEST(ReferenceBlock, MnMajorIsTheCompactGridColumnMajor) {
  const std::string row = R"({"format": "e4m3", "scaling": {"mode": "block", "block": [1, 128]})";
  const std::string col = R"({"format": "e4m3", "scaling": {"mode": "block", "block": [128, 1]}, "layout": "transposed")";
  const std::string mn = R"(, "scale_layout": "mn_major"})";
  const Plan compact = plan_from_text(recipe_text(row + "}", col + "}"), "linear:input", DType::BF16);
  const Plan major = plan_from_text(recipe_text(row + mn, col + mn), "linear:input", DType::BF16);
  const int64_t M = 6, K = 300;  // grids [6, 3] rowwise and [300, 1] for the transposed copy
  const HostTensor x = make_tensor(DType::BF16, M, K, pseudo_random(M * K, 7.0f, 9));
  const auto a = ref::quantize(compact, x, {});
  const auto b = ref::quantize(major, x, {});
  expect_matches_buffers(major, x.shape, b);
  for (const char* n : {"rowwise_data", "columnwise_data"}) EXPECT_EQ(find(a, n).bytes, find(b, n).bytes) << n;
  struct Grid {
    const char* name;
    int64_t rows, cols;
  };
  for (const Grid g : {Grid{"rowwise_scale_inv", M, 3}, Grid{"columnwise_scale_inv", K, 1}}) {
    const int64_t padded = (g.rows + 3) / 4 * 4;
    const auto& cs = find(a, g.name);
    const auto& ms = find(b, g.name);
    EXPECT_EQ(ms.desc.shape, (std::vector<int64_t>{g.cols, padded})) << g.name;
    ASSERT_EQ(ms.bytes.size(), size_t(g.cols * padded * 4)) << g.name;
    for (int64_t c = 0; c < g.cols; ++c)
      for (int64_t r = 0; r < padded; ++r) {
        const float want = r < g.rows ? f32_at(cs, size_t(r * g.cols + c)) : 0.0f;
        EXPECT_EQ(f32_at(ms, size_t(c * padded + r)), want) << g.name << " (" << r << ", " << c << ")";
      }
  }
}

// ----------------------------------------------------------------------------- stochastic rounding

TEST(ReferenceSr, ReproducibleAndSeeded) {
  const Plan p = plan_from_file("nvfp4", "linear:grad_output", DType::BF16);
  const HostTensor x = make_tensor(DType::BF16, 32, 64, pseudo_random(32 * 64, 2.0f, 9));
  QuantizeParams a;
  a.seed = 123, a.offset = 7;
  const auto o1 = ref::quantize(p, x, a);
  const auto o2 = ref::quantize(p, x, a);
  for (size_t i = 0; i < o1.size(); ++i) EXPECT_EQ(o1[i].bytes, o2[i].bytes) << o1[i].desc.name;
  QuantizeParams b = a;
  b.seed = 124;
  const auto o3 = ref::quantize(p, x, b);
  EXPECT_NE(find(o1, "rowwise_data").bytes, find(o3, "rowwise_data").bytes);
  EXPECT_NE(find(o1, "columnwise_data").bytes, find(o3, "columnwise_data").bytes);
  EXPECT_EQ(find(o1, "rowwise_scale_inv").bytes, find(o3, "rowwise_scale_inv").bytes);
  QuantizeParams c = a;
  c.offset = 8;
  EXPECT_NE(find(o1, "rowwise_data").bytes, find(ref::quantize(p, x, c), "rowwise_data").bytes);
}

TEST(ReferenceSr, DirectionsUseDifferentBits) {
  // Int8 per-tensor SR, columnwise in the same layout: both streams cast the same values with
  // the same scale, so only the stream id of the random bits differs.
  const std::string d = R"({"format": "int8", "scaling": "per_tensor_current", "rounding": "stochastic")";
  const Plan p = plan_from_text(recipe_text(d + "}", d + R"(, "layout": "same"})"), "linear:weight", DType::FP32);
  const int64_t M = 8, K = 32;
  std::vector<float> v(size_t(M * K));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(int(i % 50) - 25) + 0.5f;
  v[0] = 127.0f;  // amax 127: scale 1
  const HostTensor x = make_tensor(DType::FP32, M, K, v);
  QuantizeParams params;
  params.seed = 0x1234567890ABCDEFull, params.offset = 99;
  const auto outs = ref::quantize(p, x, params);
  const auto& r = find(outs, "rowwise_data").bytes;
  const auto& c = find(outs, "columnwise_data").bytes;
  EXPECT_NE(r, c);
  for (int64_t l = 0; l < M * K; ++l) {
    const float xv = v[size_t(l)];
    ASSERT_EQ(r[size_t(l)], encode_sr<Int8>(xv, sr_random_bits<Int8>(params.seed, params.offset, 0, u64(l)))) << l;
    ASSERT_EQ(c[size_t(l)], encode_sr<Int8>(xv, sr_random_bits<Int8>(params.seed, params.offset, 1, u64(l)))) << l;
  }
}

TEST(ReferenceSr, TransposedIndexIsOutputCoordinates) {
  const Plan p = plan_from_file("int8_weight_sr", "linear:weight", DType::FP32);
  const int64_t M = 4, K = 6;
  std::vector<float> v(size_t(M * K));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) + 0.5f;
  v[0] = 127.0f;
  for (int64_t m = 0; m < M; ++m) v[size_t(m * K)] = 127.0f;  // every row amax 127 -> scale 1
  for (int64_t k = 0; k < K; ++k) v[size_t(k)] = 127.0f;      // every column amax 127
  const HostTensor x = make_tensor(DType::FP32, M, K, v);
  QuantizeParams params;
  params.seed = 5;
  const auto outs = ref::quantize(p, x, params);
  const auto& c = find(outs, "columnwise_data").bytes;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m = 0; m < M; ++m) {
      const u64 l = u64(k * M + m);
      ASSERT_EQ(c[size_t(l)], encode_sr<Int8>(v[size_t(m * K + k)], sr_random_bits<Int8>(5, 0, 1, l)));
    }
}

// ----------------------------------------------------------------------------- grouped

std::vector<uint8_t> concat(std::initializer_list<const std::vector<uint8_t>*> parts) {
  std::vector<uint8_t> out;
  for (auto* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

HostTensor rows_of(const HostTensor& x, int64_t r0, int64_t n) {
  HostTensor t;
  t.dtype = x.dtype;
  t.shape = {n, x.shape.k};
  const size_t row = size_t(x.shape.k * traits(x.dtype).bytes);
  t.bytes.assign(x.bytes.begin() + long(size_t(r0) * row), x.bytes.begin() + long(size_t(r0 + n) * row));
  return t;
}

TEST(ReferenceGrouped, EmptyMemberEqualsPerMemberQuantize) {
  const Plan p = plan_from_file("current_scaling", "grouped_linear:input", DType::BF16, std::nullopt, true);
  const int64_t K = 4;
  const std::vector<int64_t> splits = {3, 0, 5};
  const HostTensor x = make_tensor(DType::BF16, 8, K, pseudo_random(8 * K, 10.0f, 11));
  const auto g = ref::quantize_grouped(p, x, splits, {});
  const auto a = ref::quantize(p, rows_of(x, 0, 3), {});
  const auto c = ref::quantize(p, rows_of(x, 3, 5), {});
  for (const char* n : {"rowwise_data", "columnwise_data"})
    EXPECT_EQ(find(g, n).bytes, concat({&find(a, n).bytes, &find(c, n).bytes})) << n;
  const auto& gs = find(g, "rowwise_scale_inv");
  EXPECT_EQ(gs.desc.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(f32_at(gs, 0), f32_at(find(a, "rowwise_scale_inv"), 0));
  EXPECT_EQ(f32_at(gs, 1), 1.0f);  // empty member: amax 0 -> scale 1
  EXPECT_EQ(f32_at(gs, 2), f32_at(find(c, "rowwise_scale_inv"), 0));
  const auto& ga = find(g, "amax");
  EXPECT_EQ(ga.desc.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(ga.desc.bytes, 12);
  EXPECT_EQ(f32_at(ga, 0), f32_at(find(a, "amax"), 0));
  EXPECT_EQ(f32_at(ga, 1), 0.0f);
  EXPECT_EQ(f32_at(ga, 2), f32_at(find(c, "amax"), 0));
  EXPECT_EQ(find(g, "rowwise_data").desc.shape, (std::vector<int64_t>{8, K}));
  EXPECT_EQ(find(g, "columnwise_data").desc.shape, (std::vector<int64_t>{8 * K}));  // [K, m_i] each
  for (const auto& o : g) EXPECT_EQ(int64_t(o.bytes.size()), o.desc.bytes) << o.desc.name;
}

TEST(ReferenceGrouped, SrIndicesContinueAcrossMembers) {
  const Plan p = plan_from_file("nvfp4", "grouped_linear:grad_output", DType::BF16, std::nullopt, true);
  const int64_t K = 32;
  const std::vector<int64_t> splits = {16, 0, 32};
  const HostTensor x = make_tensor(DType::BF16, 48, K, pseudo_random(48 * K, 3.0f, 13));
  QuantizeParams params;
  params.seed = 77;
  const auto g = ref::quantize_grouped(p, x, splits, params);
  const auto g2 = ref::quantize_grouped(p, x, splits, params);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i].bytes, g2[i].bytes);
  // Member 0 starts at index 0: it equals a plain quantize of its rows.
  const auto a = ref::quantize(p, rows_of(x, 0, 16), params);
  const auto& gd = find(g, "rowwise_data").bytes;
  const auto& ad = find(a, "rowwise_data").bytes;
  EXPECT_TRUE(std::equal(ad.begin(), ad.end(), gd.begin()));
  // Member 2 does not reuse member 0's bits: it differs from a plain quantize of its rows
  // (which starts at index 0), while its scales agree.
  const auto c = ref::quantize(p, rows_of(x, 16, 32), params);
  const auto& cdat = find(c, "rowwise_data").bytes;
  EXPECT_FALSE(std::equal(cdat.begin(), cdat.end(), gd.begin() + long(ad.size())));
  const auto& gs = find(g, "rowwise_scale_inv").bytes;
  const auto& cs = find(c, "rowwise_scale_inv").bytes;
  EXPECT_TRUE(std::equal(cs.begin(), cs.end(), gs.end() - long(cs.size())));
  EXPECT_EQ(find(g, "rowwise_amax").desc.shape, (std::vector<int64_t>{3}));
}

TEST(ReferenceGrouped, BadSplitsAreUserErrors) {
  const Plan p = plan_from_file("current_scaling", "grouped_linear:input", DType::BF16, std::nullopt, true);
  const HostTensor x = make_tensor(DType::BF16, 4, 4, pseudo_random(16, 1.0f));
  const std::vector<int64_t> wrong = {1, 2}, neg = {5, -1};
  EXPECT_THROW(ref::quantize_grouped(p, x, wrong, {}), UserError);
  EXPECT_THROW(ref::quantize_grouped(p, x, neg, {}), UserError);
}

TEST(ReferenceShape, RhtNeedsMultipleOf16Rows) {
  const Plan p = plan_from_file("nvfp4", "linear:input", DType::BF16);
  const HostTensor x = make_tensor(DType::BF16, 8, 16, pseudo_random(128, 1.0f));
  EXPECT_THROW(ref::quantize(p, x, {}), UserError);
}

TEST(ReferenceShape, WrongDtypeOrSizeIsUserError) {
  const Plan p = plan_from_file("current_scaling", "linear:input", DType::BF16);
  EXPECT_THROW(ref::quantize(p, make_tensor(DType::FP32, 2, 2, {1, 2, 3, 4}), {}), UserError);
  HostTensor x = make_tensor(DType::BF16, 2, 2, {1, 2, 3, 4});
  x.bytes.pop_back();
  EXPECT_THROW(ref::quantize(p, x, {}), UserError);
}

// ----------------------------------------------------------------------------- sweep

struct SweepCase {
  std::string recipe;
  std::string role;
  Usage usage;
  DType dtype;
  Shape2D shape;
};

std::vector<SweepCase> sweep_cases() {
  std::vector<std::string> recipes;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(QF_SOURCE_DIR) / "recipes")) {
    const auto path = e.path();
    if (path.extension() == ".json" && path.filename() != "recipe.schema.json")
      recipes.push_back(path.stem().string());
  }
  std::sort(recipes.begin(), recipes.end());
  std::vector<SweepCase> out;
  for (const auto& r : recipes)
    for (auto role : standard_roles())
      for (Usage u : {Usage::Training, Usage::Inference, Usage::Memory})
        for (DType d : {DType::BF16, DType::FP32})
          for (Shape2D s : {Shape2D{1, 16}, Shape2D{31, 32}, Shape2D{128, 4224}, Shape2D{64, 48}})
            out.push_back({r, std::string(role), u, d, s});
  return out;
}

std::string case_name(const testing::TestParamInfo<SweepCase>& info) {
  const auto& c = info.param;
  std::string n = c.recipe + "_" + c.role + "_" + std::string(name(c.usage)) + "_" +
                  std::string(traits(c.dtype).name) + "_" + std::to_string(c.shape.m) + "x" +
                  std::to_string(c.shape.k);
  for (auto& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

bool scale_is_nan(const Output& o) {
  const auto& d = o.desc;
  for (size_t i = 0; i < o.bytes.size(); ++i) {
    if (d.storage == Storage::F32) {
      if (i % 4 == 0 && std::isnan(f32_at(o, i / 4))) return true;
    } else if (d.dtype == "e8m0") {
      if (o.bytes[i] == 0xFF) return true;
    } else if (d.dtype == "e4m3") {
      if ((o.bytes[i] & 0x7F) == 0x7F) return true;
    }
  }
  return false;
}

class ReferenceSweep : public testing::TestWithParam<SweepCase> {};

TEST_P(ReferenceSweep, QuantizesEveryShippedRecipe) {
  const SweepCase& c = GetParam();
  const bool grouped = c.role.rfind("grouped_", 0) == 0;
  Plan p;
  try {
    p = plan_from_file(c.recipe, c.role, c.dtype, c.usage, grouped);
  } catch (const UserError& e) {
    GTEST_SKIP() << "recipe cannot serve this request: " << e.what();
  }
  try {
    check_shape(p, c.shape);
  } catch (const UserError& e) {
    GTEST_SKIP() << "shape rejected: " << e.what();
  }
  const HostTensor x = make_tensor(c.dtype, c.shape.m, c.shape.k, pseudo_random(c.shape.m * c.shape.k, 50.0f));
  QuantizeParams params;
  params.seed = 2024;
  for (const auto& in : input_buffers(p)) params.scales[in.name] = 4.0f;

  if (!grouped) {
    std::vector<Output> outs;
    ASSERT_NO_THROW(outs = ref::quantize(p, x, params));
    expect_matches_buffers(p, c.shape, outs);
    for (const auto& o : outs)
      if (o.desc.kind == BufferKind::ScaleInv) {
        EXPECT_FALSE(scale_is_nan(o)) << o.desc.name;
      }
    for (const auto& o : outs)
      if (o.desc.kind == BufferKind::Amax) {
        EXPECT_TRUE(std::isfinite(f32_at(o, 0))) << o.desc.name;
      }
  } else {
    // Grouped: [x; empty; x] -- the shape check per member, bytes the sum over members.
    HostTensor xx = x;
    xx.shape.m *= 2;
    xx.bytes.insert(xx.bytes.end(), x.bytes.begin(), x.bytes.end());
    const std::vector<int64_t> splits = {c.shape.m, 0, c.shape.m};
    std::vector<Output> outs;
    ASSERT_NO_THROW(outs = ref::quantize_grouped(p, xx, splits, params));
    const auto one = output_buffers(p, c.shape);
    const auto none = output_buffers(p, {0, c.shape.k});
    ASSERT_EQ(outs.size(), one.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      EXPECT_EQ(outs[i].desc.name, one[i].name);
      EXPECT_EQ(outs[i].desc.bytes, 2 * one[i].bytes + none[i].bytes) << one[i].name;
      EXPECT_EQ(int64_t(outs[i].bytes.size()), outs[i].desc.bytes) << one[i].name;
      if (outs[i].desc.kind == BufferKind::ScaleInv) {
        EXPECT_FALSE(scale_is_nan(outs[i])) << one[i].name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, ReferenceSweep, testing::ValuesIn(sweep_cases()), case_name);

}  // namespace
}  // namespace qf
