// GPU numerics tier: every shipped recipe x role x usage x input dtype x shape, quantized by the
// JIT kernels on the GPU and compared BIT FOR BIT with the CPU reference (data, scales
// including padding, amax). Output buffers are poisoned (0xFF) first, so an unwritten byte
// fails. Skips without a GPU. On a mismatch the first differences are printed and, when
// QFORGE_TEST_DUMP_DIR is set, the input, expected and actual buffers are written there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include <unistd.h>

#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "qforge/numerics.cuh"
#include "reference/executor.h"
#include "runtime/gpu_test_util.h"
#include "runtime/quantizer.h"

namespace {

using namespace qf;

struct Case {
  std::string recipe;
  std::string role;
  Usage usage;
  DType dtype;
  Shape2D shape;
  std::vector<int64_t> splits;  // grouped when non-empty
  bool edge_values = false;     // NaN, Inf, denormals, values at / above max
  bool separate = false;        // QFORGE_ONE_LAUNCH=0 QFORGE_ROW_PASS=0: memsets + amax kernel + cast kernel
  // 16-row RHT groups whose outputs sit where the order of the transform's 1/4 and the bf16
  // rounding matters (docs/numerics.md: 1/4 first): 1 outputs in fp32's subnormal range beside
  // normal ones, only such outputs, zeros, NaN; 2 the same with outputs past bf16's max before
  // the 1/4 (and so multipliers below 2^-100 and blocks of scale zero).
  int rht_edges = 0;
  // Served by the program for interior tiles only (codegen.h Tiles::Interior), compiled into a
  // cache of the case's own; every other case takes the programs for any tiles
  // (QFORGE_INTERIOR_PROGRAMS=0), as before they existed.
  bool interior = false;
  // Served from a shipped root, as the wheel's bundle and an install's kernels serve a first call:
  // the plan's complete programs (for any tiles and for interior tiles, as `qforge prewarm`
  // compiles them) built into a directory of the case's own, then the call's cache has an empty
  // writable root and that directory as its shipped root, and must compile nothing.
  bool shipped = false;
};

std::string case_label(const Case& c) {
  std::string role = c.role;
  for (char& ch : role)
    if (ch == ':') ch = '_';
  const std::string recipe = c.recipe.substr(c.recipe.rfind('/') + 1);
  std::string s = recipe + "__" + role + "__" + std::string(name(c.usage)) + "__" +
                  std::string(traits(c.dtype).name) + "__" + std::to_string(c.shape.m) + "x" +
                  std::to_string(c.shape.k);
  if (!c.splits.empty()) s += "__grouped" + std::to_string(c.splits.size());
  if (c.edge_values) s += "__edge";
  if (c.separate) s += "__separate";
  if (c.rht_edges) s += "__rht_edges" + std::to_string(c.rht_edges);
  if (c.interior) s += "__interior";
  if (c.shipped) s += "__shipped";
  return s;
}
std::string case_name(const ::testing::TestParamInfo<Case>& info) { return case_label(info.param); }
void PrintTo(const Case& c, std::ostream* os) { *os << case_label(c); }

// One element of a 16-row RHT group (rows r % 16 of column col), by the column's kind. With
// the default sign mask rows 0 and 1 of a group enter every output with the same sign (outputs
// 2i) or opposite ones (2i + 1), so two equal values there leave the odd outputs to the rest.
float rht_edge_value(int edges, int64_t r, int64_t col, float normal_value, std::mt19937_64& rng) {
  const int g = int(r % 16);
  // Values on the bf16 subnormal grid (and zero), both signs: sums of them stay below 2^-124.
  const float tiny = std::ldexp(float(int(rng() % 255) - 127), -133);
  switch (col % 6) {
    case 0: return g < 2 ? 1.5f : tiny;  // odd outputs tiny, even ones near 3
    case 1: return tiny;                  // every output tiny
    case 2: return g % 2 ? -0.0f : 0.0f;
    case 3: return g == 5 ? NAN : normal_value;
    case 4: return edges == 2 ? (g < 2 ? 1.7e38f : tiny) : normal_value * std::ldexp(1.0f, int(rng() % 41) - 20);
    default: return edges == 2 ? std::ldexp(normal_value, 100) : normal_value;
  }
}

ref::HostTensor make_input(const Case& c, uint64_t seed) {
  ref::HostTensor x;
  x.dtype = c.dtype;
  x.shape = c.shape;
  const int64_t n = c.shape.m * c.shape.k;
  const int esize = traits(c.dtype).bytes;
  x.bytes.resize(size_t(n * esize));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  const float row_scale_base = std::exp2(float(int(rng() % 16)) - 8.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / c.shape.k, col = i % c.shape.k;
    float v = normal(rng) * row_scale_base * (1.0f + float(r % 7));
    if (col < 40 && r < 40 && r >= 8 && r < 24) v = 0.0f;  // a zero region: zero blocks
    if (i == n / 3) v = 300.0f * row_scale_base;            // an outlier
    if (c.rht_edges) v = rht_edge_value(c.rht_edges, r, col, v, rng);
    if (c.edge_values) {
      const uint64_t k = rng() % 64;
      static const float kEdges[] = {NAN, INFINITY, -INFINITY, 1e-40f, -1e-42f, 448.0f, 449.0f,
                                     464.0f, 57344.0f, 6.0f, 6.5f, 65504.0f, 0.0f, -0.0f};
      if (k < std::size(kEdges)) v = kEdges[k];
    }
    if (c.dtype == DType::FP32) {
      std::memcpy(&x.bytes[size_t(i * 4)], &v, 4);
    } else {
      const u16 h = c.dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(&x.bytes[size_t(i * 2)], &h, 2);
    }
  }
  (void)uni;
  return x;
}

void dump(const std::string& test, const std::string& what, const void* p, size_t n) {
  const char* dir = std::getenv("QFORGE_TEST_DUMP_DIR");
  if (!dir) return;
  std::filesystem::create_directories(dir);
  std::ofstream(std::string(dir) + "/" + test + "." + what + ".bin", std::ios::binary)
      .write(static_cast<const char*>(p), std::streamsize(n));
}

// A shipped recipe by name, or a test recipe by its path under tests/recipes/ (a name with a '/').
std::string recipe_path(const std::string& recipe) {
  const bool test_recipe = recipe.find('/') != std::string::npos;
  return std::string(QF_SOURCE_DIR) + (test_recipe ? "/tests/recipes/" : "/recipes/") + recipe + ".json";
}

// Two directories of a shipped case (a shipped root and an empty writable root), removed after.
struct ShippedRoot {
  std::filesystem::path root, writable;
  ShippedRoot() {
    const auto base = std::filesystem::temp_directory_path() /
                      ("qforge_shipped_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    root = base / "shipped";
    writable = base / "writable";
  }
  ~ShippedRoot() {
    std::error_code ec;
    std::filesystem::remove_all(root.parent_path(), ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

class GpuQuantize : public ::testing::TestWithParam<Case> {};

TEST_P(GpuQuantize, BitExactAgainstCpuReference) {
  QF_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const Recipe recipe = load_recipe(recipe_path(c.recipe));
  Plan plan;
  try {
    plan = compile_plan(recipe, PlanRequest{c.role, c.dtype, c.usage, !c.splits.empty()});
  } catch (const UserError& e) {
    GTEST_SKIP() << "recipe cannot serve this request: " << e.what();
  }
  try {
    if (c.splits.empty()) check_shape(plan, c.shape);
    else
      for (int64_t m : c.splits)
        if (m > 0) check_shape(plan, Shape2D{m, c.shape.k});
  } catch (const UserError& e) {
    GTEST_SKIP() << "shape not valid for this plan: " << e.what();
  }

  const ref::HostTensor x = make_input(c, 0x5eed + uint64_t(c.shape.m) * 131 + uint64_t(c.shape.k));
  ref::QuantizeParams params;
  params.seed = 0x1234567890abcdefull;
  params.offset = 77;
  for (const auto& b : input_buffers(plan)) params.scales[b.name] = b.name == "columnwise_scale" ? 0.75f : 3.5f;
  const std::vector<ref::Output> expected =
      c.splits.empty() ? ref::quantize(plan, x, params) : ref::quantize_grouped(plan, x, c.splits, params);

  using namespace qf::rt;
  CacheOptions memory;
  memory.disabled = true;
  KernelCache own(memory);  // an interior case's: nothing compiled elsewhere answers for it
  ShippedRoot shipped;
  std::unique_ptr<KernelCache> served;  // a shipped case's: an empty writable root over the shipped one
  if (c.shipped) {
    const std::string arch = device_arch(current_device());
    {
      CacheOptions build;
      build.writable_root = shipped.root;
      KernelCache prewarm(build);
      for (Tiles t : {Tiles::Any, Tiles::Interior}) (void)build_quantize_kernels(plan, complete_form(plan), arch, prewarm, t);
    }
    CacheOptions serve;
    serve.writable_root = shipped.writable;
    serve.shipped_roots = {shipped.root};
    served = std::make_unique<KernelCache>(serve);
  }
  if (c.separate) ::setenv("QFORGE_ONE_LAUNCH", "0", 1), ::setenv("QFORGE_ROW_PASS", "0", 1);
  if (!c.interior && !c.shipped) ::setenv("QFORGE_INTERIOR_PROGRAMS", "0", 1);
  const std::unique_ptr<Quantizer> owned =
      c.shipped    ? std::make_unique<Quantizer>(plan, *served, /*use_tuning=*/false)
      : c.interior ? std::make_unique<Quantizer>(plan, own, /*use_tuning=*/false)
                   : std::make_unique<Quantizer>(plan);
  const Quantizer& q = *owned;
  ::unsetenv("QFORGE_ONE_LAUNCH"), ::unsetenv("QFORGE_ROW_PASS"), ::unsetenv("QFORGE_INTERIOR_PROGRAMS");
  DeviceBuffer dx(x.bytes.size());
  dx.upload(x.bytes.data(), x.bytes.size());
  QuantizeCall call;
  call.input = TensorView{dx.address(), int64_t(dx.size()), c.dtype, {c.shape.m, c.shape.k}};
  call.shape = c.shape;
  call.seed = params.seed;
  call.offset = params.offset;
  std::vector<DeviceBuffer> keep;
  std::map<std::string, size_t> out_index;
  // Grouped buffers are validated against the worst case over any split: allocated as such.
  std::map<std::string, int64_t> capacity;
  if (!c.splits.empty())
    for (const auto& b : q.grouped_capacity(c.shape, int(c.splits.size()))) capacity[b.name] = b.bytes;
  for (const auto& o : expected) {
    const size_t bytes = c.splits.empty() ? o.bytes.size() : size_t(capacity.at(o.desc.name));
    keep.push_back(qf::rt::testing::poisoned_buffer(std::max<size_t>(bytes, 16)));
    call.buffers[o.desc.name] = qf::rt::testing::view_of(keep.back());
    out_index[o.desc.name] = keep.size() - 1;
  }
  for (const auto& b : input_buffers(plan)) {
    keep.emplace_back(4);
    keep.back().upload(&params.scales[b.name], 4);
    call.buffers[b.name] = qf::rt::testing::view_of(keep.back());
  }
  const int members = c.splits.empty() ? 1 : int(c.splits.size());
  const int64_t ws = q.workspace_bytes(c.shape, members);
  DeviceBuffer dws(size_t(std::max<int64_t>(ws, 0)));
  if (ws > 0) call.workspace = qf::rt::testing::view_of(dws);
  DeviceBuffer drows;
  if (!c.splits.empty()) {
    std::vector<int64_t> rows{0};
    for (int64_t m : c.splits) rows.push_back(rows.back() + m);
    drows = DeviceBuffer(rows.size() * 8);
    drows.upload(rows.data(), rows.size() * 8);
    call.member_rows = drows.address();
    call.num_members = members;
  }
  qf::rt::Stream stream;
  q.quantize(call, stream.get());
  stream.synchronize();
  if (c.interior) {  // the call was served by a program for interior tiles, and only by one
    const std::string arch = device_arch(current_device());
    int interior = 0, any = 0;
    for (QuantizeForm f : quantize_forms(plan)) {
      interior += find_quantize_kernels(plan, f, arch, own, Tiles::Interior).has_value();
      any += find_quantize_kernels(plan, f, arch, own, Tiles::Any).has_value();
    }
    EXPECT_EQ(interior, 1) << "a program for interior tiles compiled";
    EXPECT_EQ(any, 0) << "no program for any tiles compiled";
  }
  if (c.shipped) {  // served by the shipped root alone
    const CacheStats st = served->stats();
    EXPECT_EQ(st.compiles, 0u) << "a first call from a shipped root compiled";
    EXPECT_GE(st.disk_hits, 1u) << "the shipped root served nothing";
  }

  const std::string test = case_label(GetParam());
  bool dumped_input = false;
  for (const auto& o : expected) {
    std::vector<uint8_t> got(o.bytes.size());
    keep[out_index[o.desc.name]].download(got.data(), got.size());
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != o.bytes[i]) {
        if (!bad) first = i;
        ++bad;
      }
    if (bad) {
      std::ostringstream os;
      os << o.desc.name << " (" << o.desc.dtype << ", " << got.size() << " bytes): " << bad
         << " bytes differ; first at byte " << first << ":";
      for (size_t i = first, shown = 0; i < got.size() && shown < 8; ++i)
        if (got[i] != o.bytes[i]) {
          os << " [" << i << "] got 0x" << std::hex << int(got[i]) << " want 0x" << int(o.bytes[i]) << std::dec;
          ++shown;
        }
      ADD_FAILURE() << os.str();
      if (!dumped_input) dump(test, "input", x.bytes.data(), x.bytes.size()), dumped_input = true;
      dump(test, o.desc.name + ".expected", o.bytes.data(), o.bytes.size());
      dump(test, o.desc.name + ".actual", got.data(), got.size());
    }
  }
}

std::vector<Case> all_cases() {
  const char* recipes[] = {"delayed_scaling",  "current_scaling", "float8_block_scaling",
                           "mxfp8",            "mxfp8_hopper",    "nvfp4",
                           "hybrid_mxfp8_fwd_nvfp4_bwd", "int8_weight_sr", "w8a8_int8_inference", "fp8_rowwise",
                           // Transformer Engine's GEMM-ready (mn_major) layout of the 1D block scales
                           "good/float8_block_scaling_mn_major", "good/mxfp8_hopper_compact"};
  const char* roles[] = {"linear:input", "linear:weight", "linear:grad_output"};
  // {200, 320}: interior tiles (the vector paths) in a tensor whose rows are not a multiple of 16.
  const Shape2D small[] = {{1, 1}, {1, 16}, {31, 33}, {32, 64}, {128, 4224}, {200, 320}};
  const Shape2D large[] = {{4096, 4096}, {8192, 5120}};
  std::vector<Case> cases;
  for (const char* r : recipes)
    for (const char* role : roles) {
      for (Usage u : {Usage::Training, Usage::Inference})
        for (DType d : {DType::BF16, DType::FP32})
          for (Shape2D s : small) cases.push_back({r, role, u, d, s, {}, false});
      for (Shape2D s : large) cases.push_back({r, role, Usage::Training, DType::BF16, s, {}, false});
      // The one-pass row kernel (rowwise per-channel plans) at the widest rows it takes: 16384
      // bf16 / 8192 fp32 elements on 8 warps, every thread's 8 chunks live.
      cases.push_back({r, role, Usage::Inference, DType::BF16, {520, 16384}, {}, false});
      cases.push_back({r, role, Usage::Inference, DType::FP32, {264, 8192}, {}, false});
      // The two-pass form of the same plans (amax kernel, then cast kernel) on interior tiles.
      cases.push_back({r, role, Usage::Inference, DType::BF16, {128, 4224}, {}, false, true});
      cases.push_back({r, role, Usage::Training, DType::BF16, {1072, 256}, {128, 0, 48, 256, 16, 80, 512, 32}, false});
      // Rowwise-only plans on members: the direct path's interior tiles at each member's scale base.
      cases.push_back({r, role, Usage::Inference, DType::BF16, {1072, 256}, {128, 0, 48, 256, 16, 80, 512, 32}, false});
      // Members with interior tiles but rows not a multiple of 16 (no 16-row vector stores).
      cases.push_back({r, role, Usage::Training, DType::BF16, {1000, 192}, {200, 0, 98, 702}, false});
      cases.push_back({r, role, Usage::Training, DType::FP32, {64, 256}, {}, true});
      // 16-bit edge values through interior tiles (rows a multiple of 16): the register paths
      // of row + transposed pairs (cast_pair.cuh) take 16-bit inputs only.
      for (DType d : {DType::BF16, DType::FP16}) cases.push_back({r, role, Usage::Training, d, {256, 512}, {}, true});
      cases.push_back({r, role, Usage::Memory, DType::FP16, {96, 160}, {}, false});
      // Many members, every fifth one empty (and one more): their scale entries come from the kernel's
      // extra tile row alone (grouped scale buffers are not zeroed first).
      {
        std::vector<int64_t> many;
        for (int i = 0; i < 37; ++i) many.push_back(i == 32 ? 0 : 16 * (i % 5));
        int64_t rows = 0;
        for (int64_t m : many) rows += m;
        cases.push_back({r, role, Usage::Training, DType::BF16, {rows, 128}, many, false});
      }
      // No rows at all (an expert-parallel rank that received no tokens): the members' scalars only.
      cases.push_back({r, role, Usage::Training, DType::BF16, {0, 256}, {0, 0, 0}, false});
      // fp16 through interior and edge tiles of every tile shape (128-row tiles: 16-bit staging).
      cases.push_back({r, role, Usage::Training, DType::FP16, {300, 384}, {}, false});
      // RHT groups at the rounding edges (both launch forms).
      for (int edges : {1, 2})
        if (std::string(r).find("nvfp4") != std::string::npos)
          for (bool separate : {false, true}) {
            Case e{r, role, Usage::Training, DType::BF16, {256, 384}, {}, false, separate};
            e.rht_edges = edges;
            cases.push_back(e);
          }
      // Small single tensors take the one-launch fused kernel where the plan has one; these take
      // the separate launches instead (as large and grouped tensors do).
      for (Shape2D s : {Shape2D{31, 33}, Shape2D{200, 320}})
        cases.push_back({r, role, Usage::Training, DType::BF16, s, {}, false, true});
      // Programs for interior tiles only (M and K whole tiles of every shipped plan): each usage
      // and input dtype, one launch and separate launches, 16-bit edge values, a large tensor.
      auto interior = [&](Usage u, DType d, Shape2D s, bool edge_values, bool separate) {
        Case e{r, role, u, d, s, {}, edge_values, separate};
        e.interior = true;
        cases.push_back(e);
      };
      for (Usage u : {Usage::Training, Usage::Inference})
        for (DType d : {DType::BF16, DType::FP16, DType::FP32}) interior(u, d, {256, 1024}, false, false);
      interior(Usage::Training, DType::BF16, {256, 1024}, false, true);
      interior(Usage::Inference, DType::BF16, {256, 1024}, false, true);
      for (DType d : {DType::BF16, DType::FP16}) interior(Usage::Training, d, {256, 1024}, true, false);
      interior(Usage::Training, DType::BF16, {4096, 4096}, false, false);
      interior(Usage::Memory, DType::BF16, {256, 1024}, false, false);
      // First calls from a shipped root: a shape of whole tiles and one with edge tiles.
      if (std::string(role) == "linear:input")
        for (Usage u : {Usage::Training, Usage::Inference})
          for (Shape2D s : {Shape2D{256, 1024}, Shape2D{208, 320}}) {  // 208: RHT's 16-row groups
            Case e{r, role, u, DType::BF16, s, {}, false, false};
            e.shipped = true;
            cases.push_back(e);
          }
      // The per-channel pairs' pre-pass, 4 tiles of a tile row per CTA past one wave of tiles: a
      // last group of 3 tiles (35 tile columns), edge rows, and a program for interior tiles.
      if (std::string(r) == "fp8_rowwise") {
        cases.push_back({r, role, Usage::Training, DType::BF16, {4000, 4480}, {}, false});
        interior(Usage::Training, DType::FP16, {4096, 4480}, false, false);
        // Two segments of 4 tiles per CTA (133 tile columns, 17 CTAs a tile row): a last group
        // whose second segment has one tile, edge rows and a K edge (its last tile one at a time).
        cases.push_back({r, role, Usage::Training, DType::BF16, {8100, 17008}, {}, false});
        interior(Usage::Training, DType::BF16, {8192, 17024}, false, false);
      }
    }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shipped, GpuQuantize, ::testing::ValuesIn(all_cases()), case_name);

// noop == 1.0 (a CUDA graph switching a quantize off): both forms leave data and scales as they
// were and leave the amax outputs zero (the separate form zeroes them with its memsets before the
// kernels see the flag; the fused form's CTA 0 zeroes them before it does).
TEST(GpuQuantizeNoop, OutputsUntouchedAmaxZeroInBothForms) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  for (const char* recipe : {"current_scaling", "delayed_scaling", "nvfp4"}) {
    for (bool separate : {false, true}) {
      SCOPED_TRACE(std::string(recipe) + (separate ? " separate" : " fused"));
      const Plan plan = compile_plan(load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/" + recipe + ".json"),
                                     PlanRequest{"linear:input", DType::BF16, Usage::Training, false});
      if (separate) ::setenv("QFORGE_ONE_LAUNCH", "0", 1);
      Quantizer q(plan);
      if (separate) ::unsetenv("QFORGE_ONE_LAUNCH");
      const Shape2D shape{256, 512};
      DeviceBuffer dx(size_t(shape.m * shape.k * 2));
      dx.fill(0x3c);  // bf16 0x3c3c: 0.0115
      QuantizeCall call;
      call.input = TensorView{dx.address(), int64_t(dx.size()), DType::BF16, {shape.m, shape.k}};
      call.shape = shape;
      std::vector<DeviceBuffer> keep;
      std::vector<BufferDesc> outs = q.outputs(shape);
      for (const auto& b : outs) {
        keep.push_back(qf::rt::testing::poisoned_buffer(size_t(std::max<int64_t>(b.bytes, 16))));
        call.buffers[b.name] = qf::rt::testing::view_of(keep.back());
      }
      const float one = 1.0f, scale = 2.0f;
      for (const auto& b : q.inputs()) {
        keep.emplace_back(4);
        keep.back().upload(&scale, 4);
        call.buffers[b.name] = qf::rt::testing::view_of(keep.back());
      }
      DeviceBuffer noop(4);
      noop.upload(&one, 4);
      call.noop = noop.address();
      qf::rt::Stream stream;
      q.quantize(call, stream.get());
      stream.synchronize();
      for (size_t i = 0; i < outs.size(); ++i) {
        std::vector<uint8_t> got(size_t(outs[i].bytes));
        keep[i].download(got.data(), got.size());
        const uint8_t want = outs[i].kind == BufferKind::Amax ? 0x00 : 0xFF;
        EXPECT_EQ(std::count(got.begin(), got.end(), want), int64_t(got.size())) << outs[i].name;
      }
    }
  }
}

}  // namespace

namespace {

// Quantize calls captured in a CUDA graph (the fused cooperative launch, per-channel amaxes in
// the workspace, the separate memsets + amax + cast kernels, a grouped call, stochastic
// rounding) write, replay after replay, exactly
// what the same call writes when launched directly (which the suite above compares with the CPU
// reference); the amax outputs are zeroed again by every replay. Plans with per-column channel
// amaxes take the separate form in a capture though their direct call is fused, so there the
// two forms are compared with each other.
TEST(GpuQuantizeGraph, ReplaysMatchDirectCalls) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  struct G {
    const char* recipe;
    const char* role;
    bool separate;
    std::vector<int64_t> splits;
    int captured_launch = 0;  // 1: the capture holds one node (the fused kernel); 2: more; 0: unchecked
    Usage usage = Usage::Training;
  };
  const G cases[] = {{"current_scaling", "linear:input", false, {}, 1},
                     {"current_scaling", "linear:input", true, {}, 2},
                     {"delayed_scaling", "linear:weight", false, {}, 1},
                     {"mxfp8", "linear:input", false, {}},
                     {"fp8_rowwise", "linear:input", false, {}, 2},
                     {"fp8_rowwise", "linear:input", false, {}, 1, Usage::Inference},  // rows only: fused
                     {"int8_weight_sr", "linear:weight", false, {}, 2},
                     {"nvfp4", "linear:grad_output", false, {}, 1},
                     {"nvfp4", "grouped_linear:input", false, {96, 0, 160}}};
  for (const G& g : cases) {
    SCOPED_TRACE(std::string(g.recipe) + " " + g.role + " " + std::string(name(g.usage)) + (g.separate ? " separate" : ""));
    const bool grouped = !g.splits.empty();
    const Plan plan = compile_plan(load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/" + g.recipe + ".json"),
                                   PlanRequest{g.role, DType::BF16, g.usage, grouped});
    if (g.separate) ::setenv("QFORGE_ONE_LAUNCH", "0", 1);
    Quantizer q(plan);
    if (g.separate) ::unsetenv("QFORGE_ONE_LAUNCH");
    const Shape2D shape{256, 512};
    const ref::HostTensor x = make_input(Case{g.recipe, g.role, g.usage, DType::BF16, shape, {}}, 11);
    DeviceBuffer dx(x.bytes.size());
    dx.upload(x.bytes.data(), x.bytes.size());
    DeviceBuffer offsets;
    const int members = grouped ? int(g.splits.size()) : 1;
    std::vector<BufferDesc> outs = grouped ? q.grouped_capacity(shape, members) : q.outputs(shape);
    const int64_t ws = q.workspace_bytes(shape, members);
    // Two sets of outputs: [0] for the direct call, [1] for the graph.
    std::vector<DeviceBuffer> keep[2];
    DeviceBuffer work[2];
    QuantizeCall call[2];
    for (int s = 0; s < 2; ++s) {
      call[s].input = TensorView{dx.address(), int64_t(dx.size()), DType::BF16, {shape.m, shape.k}};
      call[s].shape = shape;
      call[s].seed = 0x1234;
      call[s].offset = 5;
      for (const auto& b : outs) {
        keep[s].push_back(qf::rt::testing::poisoned_buffer(size_t(std::max<int64_t>(b.bytes, 16))));
        call[s].buffers[b.name] = qf::rt::testing::view_of(keep[s].back());
      }
      const float scale = 2.0f;
      for (const auto& b : q.inputs()) {
        keep[s].emplace_back(4);
        keep[s].back().upload(&scale, 4);
        call[s].buffers[b.name] = qf::rt::testing::view_of(keep[s].back());
      }
      if (ws > 0) {
        work[s] = DeviceBuffer(size_t(ws));
        call[s].workspace = qf::rt::testing::view_of(work[s]);
      }
      if (grouped) {
        std::vector<int64_t> rows(g.splits.size() + 1, 0);
        for (size_t i = 0; i < g.splits.size(); ++i) rows[i + 1] = rows[i] + g.splits[i];
        if (s == 0) {
          offsets = DeviceBuffer(rows.size() * 8);
          offsets.upload(rows.data(), rows.size() * 8);
        }
        call[s].member_rows = offsets.address();
        call[s].num_members = members;
      }
    }
    qf::rt::Stream stream;
    q.quantize(call[0], stream.get());
    const Graph graph(stream.get(), [&] { q.quantize(call[1], stream.get()); });
    if (g.captured_launch == 1) {
      EXPECT_EQ(graph.nodes(), 1u) << "the one-launch form";
    }
    if (g.captured_launch == 2) {
      EXPECT_GT(graph.nodes(), 1u) << "the separate form";
    }
    for (int replay = 0; replay < 3; ++replay) graph.launch(stream.get());
    stream.synchronize();
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<uint8_t> direct(size_t(outs[i].bytes)), replayed(size_t(outs[i].bytes));
      keep[0][i].download(direct.data(), direct.size());
      keep[1][i].download(replayed.data(), replayed.size());
      EXPECT_TRUE(direct == replayed) << outs[i].name;
    }
  }
}

// Which form a direct call takes: one launch for a single tensor of one wave of tiles of a plan
// with a global amax; the separate launches for larger tensors, plans without the fused kernel
// and QFORGE_ONE_LAUNCH=0.
TEST(GpuQuantizeForm, OneLaunchForOneWaveOfTiles) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  auto plan = [](const char* recipe, const char* role) {
    return compile_plan(load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/" + recipe + ".json"),
                        PlanRequest{role, DType::BF16, Usage::Training, false});
  };
  const Quantizer current(plan("current_scaling", "linear:input"));
  EXPECT_TRUE(current.one_launch({1024, 1024}));
  EXPECT_TRUE(current.one_launch({31, 33}));
  EXPECT_FALSE(current.one_launch({16384, 16384}));
  const Quantizer nvfp4(plan("nvfp4", "linear:input"));
  EXPECT_TRUE(nvfp4.one_launch({1024, 1024}));
  EXPECT_FALSE(nvfp4.one_launch({8192, 8192}));
  EXPECT_FALSE(Quantizer(plan("mxfp8", "linear:input")).one_launch({1024, 1024})) << "no global amax: one kernel anyway";
  ::setenv("QFORGE_ONE_LAUNCH", "0", 1);
  const Quantizer off(plan("current_scaling", "linear:input"));
  ::unsetenv("QFORGE_ONE_LAUNCH");
  EXPECT_FALSE(off.one_launch({1024, 1024}));
}

// A plan with the fused kernel has two programs, two cache entries (docs/jit.md, step 5): the
// complete one (All: every kernel) and the separate form (without the fused kernel), which a call
// that does not launch the fused kernel compiles where the complete one is neither loaded nor in
// the cache. The tests below count compiles in a cache of their own (memory only, so nothing on
// disk or in another test's cache answers for them) and tell the entries apart by asking the
// cache for each afterwards without compiling (find_quantize_kernels).
Plan form_plan(const char* recipe, const char* role, Usage usage = Usage::Training) {
  return compile_plan(load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/" + recipe + ".json"),
                      PlanRequest{role, DType::BF16, usage, false});
}

qf::rt::CacheOptions memory_only() {
  qf::rt::CacheOptions o;
  o.disabled = true;
  return o;
}

// Quantizes a bf16 input of `shape` (make_input's values) with q on the current device and
// returns every output's bytes, in q.outputs(shape)'s order.
std::vector<std::vector<uint8_t>> run_quantizer(const qf::rt::Quantizer& q, const char* recipe, const char* role,
                                                Shape2D shape) {
  using namespace qf::rt;
  const ref::HostTensor x = make_input(Case{recipe, role, q.plan().usage, DType::BF16, shape, {}}, 5);
  DeviceBuffer dx(x.bytes.size());
  dx.upload(x.bytes.data(), x.bytes.size());
  QuantizeCall call;
  call.input = TensorView{dx.address(), int64_t(dx.size()), DType::BF16, {shape.m, shape.k}};
  call.shape = shape;
  std::vector<DeviceBuffer> keep;
  const std::vector<BufferDesc> outs = q.outputs(shape);
  for (const auto& b : outs) {
    keep.push_back(qf::rt::testing::poisoned_buffer(size_t(std::max<int64_t>(b.bytes, 16))));
    call.buffers[b.name] = qf::rt::testing::view_of(keep.back());
  }
  const float scale = 2.0f;
  for (const auto& b : q.inputs()) {
    keep.emplace_back(4);
    keep.back().upload(&scale, 4);
    call.buffers[b.name] = qf::rt::testing::view_of(keep.back());
  }
  DeviceBuffer work;
  if (const int64_t ws = q.workspace_bytes(shape); ws > 0) {
    work = DeviceBuffer(size_t(ws));
    call.workspace = qf::rt::testing::view_of(work);
  }
  qf::rt::Stream stream;
  q.quantize(call, stream.get());
  stream.synchronize();
  std::vector<std::vector<uint8_t>> got;
  for (size_t i = 0; i < outs.size(); ++i) {
    got.emplace_back(size_t(outs[i].bytes));
    keep[i].download(got.back().data(), got.back().size());
  }
  return got;
}

// A shape of more tiles than the fused kernel's guaranteed capacity (its launch bounds' min
// blocks x the SMs): a first call of it takes the separate form without compiling the other.
// K = 4096 + 16 leaves an edge tile column, so the call takes the programs for any tiles.
Shape2D beyond_guaranteed_capacity(const Plan& p) {
  const KernelSource geo = emit_quantize(p, QuantizeForm::Separate);
  const int64_t cap = int64_t(geo.fused_min_blocks) * qf::rt::device_sm_count(qf::rt::current_device());
  const int64_t k = 4096 + 16, col_tiles = (k + geo.tile.cols - 1) / geo.tile.cols;
  return Shape2D{geo.tile.rows * (cap / col_tiles + 1), k};
}

// A large tensor's first call compiles the separate form only; a small one's later call then
// compiles the complete program, which serves the large calls from then on too. A plan whose one
// cast kernel serves both forms (NVFP4) has one program: the large call compiles it, and the
// small call's one launch takes it.
TEST(GpuQuantizeForm, LargeFirstCallCompilesOnlyTheSeparateForm) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  const std::string arch = device_arch(current_device());
  for (const char* recipe : {"current_scaling", "nvfp4"}) {
    SCOPED_TRACE(recipe);
    const Plan p = form_plan(recipe, "linear:input");
    const bool own = own_fused_kernel(p);
    EXPECT_EQ(own, std::string(recipe) == "current_scaling");
    KernelCache cache(memory_only());
    const Quantizer q(p, cache, /*use_tuning=*/false);
    const Shape2D large = beyond_guaranteed_capacity(p);
    EXPECT_FALSE(q.one_launch(large));
    EXPECT_EQ(cache.stats().compiles, 0u) << "one_launch() of a grid past the guaranteed capacity loads nothing";
    (void)run_quantizer(q, recipe, "linear:input", large);
    EXPECT_EQ(cache.stats().compiles, 1u);
    EXPECT_TRUE(find_quantize_kernels(p, QuantizeForm::Separate, arch, cache).has_value()) << "the separate form";
    EXPECT_EQ(find_quantize_kernels(p, QuantizeForm::All, arch, cache).has_value(), !own);
    EXPECT_TRUE(q.one_launch({256, 528}));
    const size_t compiles = own ? 2u : 1u;
    EXPECT_EQ(cache.stats().compiles, compiles) << "the complete program, compiled on the fused kernel's first need";
    (void)run_quantizer(q, recipe, "linear:input", {256, 528});
    (void)run_quantizer(q, recipe, "linear:input", large);
    EXPECT_EQ(cache.stats().compiles, compiles);
  }
}

// A small tensor's first call compiles the complete program only, which then serves a large call
// too; a call the row kernel serves compiles the separate form.
TEST(GpuQuantizeForm, SmallFirstCallCompilesOnlyTheCompleteProgram) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  const std::string arch = device_arch(current_device());
  struct F {
    const char* recipe;
    const char* role;
    Usage usage;
    QuantizeForm compiled;  // the program the first call compiled
  };
  const F cases[] = {{"current_scaling", "linear:input", Usage::Training, QuantizeForm::All},
                     {"delayed_scaling", "linear:weight", Usage::Training, QuantizeForm::All},
                     {"nvfp4", "linear:grad_output", Usage::Training, QuantizeForm::All},
                     {"fp8_rowwise", "linear:input", Usage::Training, QuantizeForm::All},
                     {"w8a8_int8_inference", "linear:input", Usage::Inference, QuantizeForm::Separate}};
  for (const F& c : cases) {
    SCOPED_TRACE(std::string(c.recipe) + " " + c.role);
    const Plan p = form_plan(c.recipe, c.role, c.usage);
    KernelCache cache(memory_only());
    const Quantizer q(p, cache, /*use_tuning=*/false);
    (void)run_quantizer(q, c.recipe, c.role, {256, 528});  // an edge tile column: the programs for any tiles
    EXPECT_EQ(cache.stats().compiles, 1u);
    EXPECT_TRUE(find_quantize_kernels(p, c.compiled, arch, cache).has_value()) << name(c.compiled);
    if (c.compiled == QuantizeForm::All) {
      (void)run_quantizer(q, c.recipe, c.role, beyond_guaranteed_capacity(p));
      EXPECT_EQ(cache.stats().compiles, 1u) << "the complete program serves the separate launches";
      if (own_fused_kernel(p)) {
        EXPECT_FALSE(find_quantize_kernels(p, QuantizeForm::Separate, arch, cache).has_value());
      }
    }
  }
}

// prepare() compiles the complete program, so no call compiles afterwards (a CUDA-graph capture
// included), whatever its shape; a quantizer on a cache that has it (another process's prepare or
// prewarm, a shipped root) takes it for a large first call instead of compiling the separate form,
// and for shapes of interior tiles only instead of compiling their program.
TEST(GpuQuantizeForm, PreparedQuantizerCompilesNothingOnCalls) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  const Plan p = form_plan("current_scaling", "linear:input");
  KernelCache cache(memory_only());
  EXPECT_EQ(Quantizer(p, cache, false).prepare(device_arch(current_device())), CacheHow::Compiled);
  EXPECT_EQ(cache.stats().compiles, 2u) << "for any tiles and for interior tiles";
  const Quantizer q(p, cache, /*use_tuning=*/false);  // loads nothing yet
  (void)run_quantizer(q, "current_scaling", "linear:input", beyond_guaranteed_capacity(p));
  (void)run_quantizer(q, "current_scaling", "linear:input", {256, 512});
  (void)run_quantizer(q, "current_scaling", "linear:input", {8192, 8192});
  EXPECT_EQ(cache.stats().compiles, 2u);
  // A cache holding the program for any tiles only (`qforge prewarm --tiles any`, an older
  // build's): calls of interior tiles take it rather than compile.
  KernelCache any_only(memory_only());
  ::setenv("QFORGE_INTERIOR_PROGRAMS", "0", 1);
  EXPECT_EQ(Quantizer(p, any_only, false).prepare(device_arch(current_device())), CacheHow::Compiled);
  ::unsetenv("QFORGE_INTERIOR_PROGRAMS");
  const Quantizer q2(p, any_only, /*use_tuning=*/false);
  (void)run_quantizer(q2, "current_scaling", "linear:input", {256, 512});
  (void)run_quantizer(q2, "current_scaling", "linear:input", {8192, 8192});
  EXPECT_EQ(any_only.stats().compiles, 1u);
  EXPECT_FALSE(find_quantize_kernels(p, QuantizeForm::Separate, device_arch(current_device()), cache).has_value());
}

// A single tensor of interior tiles only (M and K whole tiles and whole 16s) compiles the program
// for interior tiles, which then serves its larger calls too (its separate launches); a shape with
// edge tiles compiles the program for any tiles. Both write the same bits, on one launch and on
// separate launches. Grouped calls never take it.
TEST(GpuQuantizeForm, InteriorShapesCompileTheInteriorProgram) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  const std::string arch = device_arch(current_device());
  for (const char* recipe : {"current_scaling", "nvfp4", "mxfp8"}) {
    SCOPED_TRACE(recipe);
    const Plan p = form_plan(recipe, "linear:input");
    KernelCache cache(memory_only()), any_cache(memory_only());
    const Quantizer q(p, cache, /*use_tuning=*/false);
    ::setenv("QFORGE_INTERIOR_PROGRAMS", "0", 1);
    const Quantizer any(p, any_cache, /*use_tuning=*/false);
    ::unsetenv("QFORGE_INTERIOR_PROGRAMS");
    const QuantizeForm complete = complete_form(p);
    const Shape2D small{256, 1024}, large{8192, 8192}, edge{256, 1040};
    EXPECT_TRUE(q.interior_programs(small));
    EXPECT_TRUE(q.interior_programs(large));
    EXPECT_FALSE(q.interior_programs(edge));
    EXPECT_FALSE(any.interior_programs(small)) << "QFORGE_INTERIOR_PROGRAMS=0";
    EXPECT_EQ(cache.stats().compiles + any_cache.stats().compiles, 0u) << "interior_programs() loads nothing";
    const auto got = run_quantizer(q, recipe, "linear:input", small);
    EXPECT_EQ(cache.stats().compiles, 1u);
    EXPECT_TRUE(find_quantize_kernels(p, complete, arch, cache, Tiles::Interior).has_value()) << "the interior program";
    EXPECT_FALSE(find_quantize_kernels(p, complete, arch, cache).has_value());
    EXPECT_TRUE(run_quantizer(any, recipe, "linear:input", small) == got) << "the same bits as the program for any tiles";
    const auto got_large = run_quantizer(q, recipe, "linear:input", large);
    EXPECT_EQ(cache.stats().compiles, 1u) << "the loaded interior program serves the separate launches";
    EXPECT_TRUE(run_quantizer(any, recipe, "linear:input", large) == got_large);
    (void)run_quantizer(q, recipe, "linear:input", edge);
    EXPECT_EQ(cache.stats().compiles, 2u) << "edge tiles: the program for any tiles";
    EXPECT_TRUE(find_quantize_kernels(p, complete, arch, cache).has_value());
    EXPECT_TRUE(run_quantizer(q, recipe, "linear:input", small) == got) << "still the same bits";
    EXPECT_EQ(cache.stats().compiles, 2u);
    EXPECT_EQ(any_cache.stats().compiles, 1u) << "QFORGE_INTERIOR_PROGRAMS=0: the program for any tiles only";
  }
}

// The cooperative launch refused as too large (a context with fewer SMs: MPS, green contexts;
// simulated by QFORGE_TEST_COOPERATIVE_TOO_LARGE): the call falls back to the separate launches
// of the complete program it loaded (no compile) and writes exactly what the fused kernel writes;
// after a large call loaded the separate form, the small call that is refused compiles the
// complete program for the fused kernel and falls back to the separate form's launches. (A plan
// whose one cast kernel serves both forms, NVFP4, has one program: the fallback launches that
// kernel again, as the separate form.)
TEST(GpuQuantizeForm, CooperativeFallbackTakesTheSeparateLaunches) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  for (const char* recipe : {"current_scaling", "nvfp4"}) {
    SCOPED_TRACE(recipe);
    const Plan p = form_plan(recipe, "linear:input");
    KernelCache fused_cache(memory_only()), refused_cache(memory_only()), large_first_cache(memory_only());
    const Quantizer fused(p, fused_cache, false);
    ::setenv("QFORGE_TEST_COOPERATIVE_TOO_LARGE", "1", 1);
    const Quantizer refused(p, refused_cache, false), large_first(p, large_first_cache, false);
    ::unsetenv("QFORGE_TEST_COOPERATIVE_TOO_LARGE");
    const Shape2D shape{256, 512};
    ASSERT_TRUE(fused.one_launch(shape));
    const auto want = run_quantizer(fused, recipe, "linear:input", shape);
    const std::vector<BufferDesc> outs = fused.outputs(shape);
    const auto got = run_quantizer(refused, recipe, "linear:input", shape);
    EXPECT_EQ(refused_cache.stats().compiles, 1u) << "the complete program; the fallback compiles nothing";
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << outs[i].name;
    (void)run_quantizer(large_first, recipe, "linear:input", beyond_guaranteed_capacity(p));
    const auto got2 = run_quantizer(large_first, recipe, "linear:input", shape);
    EXPECT_EQ(large_first_cache.stats().compiles, own_fused_kernel(p) ? 2u : 1u) << "the separate form, then the complete program";
    ASSERT_EQ(got2.size(), want.size());
    for (size_t i = 0; i < got2.size(); ++i) EXPECT_TRUE(got2[i] == want[i]) << outs[i].name;
  }
}

}  // namespace
