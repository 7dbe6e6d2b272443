// The C API (runtime/qforge.h): contexts, quantizers, buffer queries against the compiler's
// output_buffers, ahead-of-time compilation, and that every error comes back as a status and a
// message (never an exception or a crash), including qf_quantize without a GPU; on a GPU,
// qf_quantize's outputs bit for bit against the CPU reference; the GEMM entry points likewise
// (spec errors, recipe GEMMs, ahead-of-time compilation, an exact GPU run).
#include "runtime/qforge.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compiler/buffers.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "qforge/numerics.cuh"
#include "reference/executor.h"
#include "reference/gemm.h"
#include "reference/gemm_problem.h"
#include "runtime/driver.h"
#include "runtime/gpu_test_util.h"
#include "runtime/quantizer.h"

namespace fs = std::filesystem;

namespace {

std::string recipe_path(const std::string& name) {
  return (fs::path(QF_SOURCE_DIR) / "recipes" / (name + ".json")).string();
}

std::vector<std::string> shipped_recipe_paths() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fs::path(QF_SOURCE_DIR) / "recipes"))
    if (e.path().extension() == ".json" && e.path().filename() != "recipe.schema.json")
      out.push_back(e.path().string());
  return out;
}

class CApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // ctest sets QFORGE_CACHE_DIR; a direct run of the binary gets a private one.
    if (!std::getenv("QFORGE_CACHE_DIR")) {
      const auto dir = fs::temp_directory_path() / "qforge-c-api-test-cache";
      ::setenv("QFORGE_CACHE_DIR", dir.c_str(), 0);
    }
  }
  void TearDown() override {
    qf_quantizer_destroy(q_);
    qf_context_destroy(ctx_);
  }
  void open_all() {
    const auto paths = shipped_recipe_paths();
    std::vector<const char*> ptrs;
    for (const auto& p : paths) ptrs.push_back(p.c_str());
    ASSERT_EQ(qf_context_create(ptrs.data(), int(ptrs.size()), &ctx_), QF_OK) << qf_last_error();
    int n = 0;
    ASSERT_EQ(qf_context_num_recipes(ctx_, &n), QF_OK);
    EXPECT_EQ(n, int(paths.size()));
  }
  qf_context* ctx_ = nullptr;
  qf_quantizer* q_ = nullptr;
};

TEST_F(CApi, ResolvesEveryStandardRoleOfEveryShippedRecipe) {
  open_all();
  int n = 0;
  ASSERT_EQ(qf_context_num_recipes(ctx_, &n), QF_OK);
  for (int i = 0; i < n; ++i) {
    const char* name = nullptr;
    ASSERT_EQ(qf_context_recipe_name(ctx_, i, &name), QF_OK);
    for (const auto role : qf::standard_roles()) {
      const std::string r(role);
      qf_quantizer* q = nullptr;
      const qf_status s = qf_quantizer_create(ctx_, name, r.c_str(), QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q);
      // A recipe need not cover every role; whatever happens is a status, never a throw.
      if (s == QF_OK) {
        int outs = 0;
        EXPECT_EQ(qf_quantizer_num_outputs(q, &outs), QF_OK);
        EXPECT_GT(outs, 0) << name << " " << r;
      } else {
        EXPECT_EQ(s, QF_ERR_USER) << name << " " << r << ": " << qf_last_error();
        EXPECT_STRNE(qf_last_error(), "");
        EXPECT_EQ(q, nullptr);
      }
      qf_quantizer_destroy(q);
    }
  }
}

// Which order a GEMM must read each scale grid in: mxfp8_hopper's are mn_major ([blocks, rows]),
// mxfp8's compact; the per-tensor scale of delayed scaling has none.
TEST_F(CApi, OutputInfoNamesTheScaleLayout) {
  open_all();
  auto layouts = [&](const char* recipe) {
    qf_quantizer* q = nullptr;
    EXPECT_EQ(qf_quantizer_create(ctx_, recipe, "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q), QF_OK) << qf_last_error();
    std::map<std::string, std::string> out;
    int n = 0;
    EXPECT_EQ(qf_quantizer_num_outputs(q, &n), QF_OK);
    for (int i = 0; i < n; ++i) {
      qf_buffer_info info{};
      EXPECT_EQ(qf_quantizer_output_info(q, 256, 512, i, &info), QF_OK) << qf_last_error();
      out[info.name] = info.scale_layout ? info.scale_layout : "(none)";
      if (std::string(info.name) == "rowwise_scale_inv" && info.scale_layout && std::string(info.scale_layout) == "mn_major") {
        EXPECT_EQ(info.ndim, 2);
        EXPECT_EQ(info.shape[0], 512 / 32);  // [K/32, M]
        EXPECT_EQ(info.shape[1], 256);
      }
    }
    qf_quantizer_destroy(q);
    return out;
  };
  const auto hopper = layouts("mxfp8_hopper"), mx = layouts("mxfp8"), delayed = layouts("delayed_scaling");
  EXPECT_EQ(hopper.at("rowwise_scale_inv"), "mn_major");
  EXPECT_EQ(hopper.at("columnwise_scale_inv"), "mn_major");
  EXPECT_EQ(hopper.at("rowwise_data"), "(none)");
  EXPECT_EQ(mx.at("rowwise_scale_inv"), "compact");
  EXPECT_EQ(delayed.at("rowwise_scale_inv"), "(none)");
}

TEST_F(CApi, OutputInfoMatchesCompiler) {
  open_all();
  ASSERT_EQ(qf_quantizer_create(ctx_, "mxfp8", "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_), QF_OK)
      << qf_last_error();

  const qf::Recipe recipe = qf::load_recipe(recipe_path("mxfp8"));
  const qf::Plan plan = qf::compile_plan(recipe, qf::PlanRequest{"linear:input", qf::DType::BF16, std::nullopt, false});
  const auto want = qf::output_buffers(plan, qf::Shape2D{256, 512});

  int n = 0;
  ASSERT_EQ(qf_quantizer_num_outputs(q_, &n), QF_OK);
  ASSERT_EQ(n, int(want.size()));
  ASSERT_GT(n, 0);
  for (int i = 0; i < n; ++i) {
    qf_buffer_info info{};
    ASSERT_EQ(qf_quantizer_output_info(q_, 256, 512, i, &info), QF_OK) << qf_last_error();
    const auto& w = want[size_t(i)];
    EXPECT_EQ(std::string(info.name), w.name);
    EXPECT_EQ(std::string(info.dtype), w.dtype);
    EXPECT_EQ(int(info.kind), int(w.kind));
    EXPECT_EQ(info.element_size, w.storage == qf::Storage::U8 ? 1 : w.storage == qf::Storage::U16 ? 2 : 4);
    EXPECT_EQ(info.stream, w.stream);
    EXPECT_EQ(info.zero_padding != 0, w.zero_padding);
    EXPECT_EQ(info.scale_layout ? std::string(info.scale_layout) : std::string(), w.scale_layout) << w.name;
    EXPECT_EQ(info.scale_layout != nullptr, w.kind == qf::BufferKind::ScaleInv) << w.name;  // mxfp8: every scale grid is one of blocks
    ASSERT_EQ(info.ndim, int(w.shape.size()));
    for (int d = 0; d < info.ndim; ++d) EXPECT_EQ(info.shape[d], w.shape[size_t(d)]) << w.name;
    EXPECT_EQ(info.bytes, w.bytes) << w.name;
  }
  // mxfp8 training: rowwise e4m3 [256, 512] first.
  qf_buffer_info first{};
  ASSERT_EQ(qf_quantizer_output_info(q_, 256, 512, 0, &first), QF_OK);
  EXPECT_STREQ(first.name, "rowwise_data");
  EXPECT_EQ(first.bytes, 256 * 512);

  qf_buffer_info bad{};
  EXPECT_EQ(qf_quantizer_output_info(q_, 256, 512, n, &bad), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("index"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_quantizer_output_info(q_, 0, 512, 0, &bad), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("shape"), std::string::npos) << qf_last_error();

  int ins = -1;
  ASSERT_EQ(qf_quantizer_num_inputs(q_, &ins), QF_OK);
  EXPECT_EQ(ins, int(qf::input_buffers(plan).size()));
  int64_t ws = -1;
  ASSERT_EQ(qf_quantizer_workspace_bytes(q_, 256, 512, 1, &ws), QF_OK) << qf_last_error();
  EXPECT_GE(ws, 0);
}

TEST_F(CApi, DelayedScalingHasAScaleInput) {
  const std::string p = recipe_path("delayed_scaling");
  const char* paths[] = {p.c_str()};
  ASSERT_EQ(qf_context_create(paths, 1, &ctx_), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_quantizer_create(ctx_, nullptr, "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_), QF_OK)
      << qf_last_error();
  const qf::Plan plan = qf::compile_plan(qf::load_recipe(p), qf::PlanRequest{"linear:input", qf::DType::BF16, std::nullopt, false});
  const auto want = qf::input_buffers(plan);
  int n = 0;
  ASSERT_EQ(qf_quantizer_num_inputs(q_, &n), QF_OK);
  ASSERT_EQ(n, int(want.size()));
  ASSERT_GT(n, 0);
  qf_buffer_info info{};
  ASSERT_EQ(qf_quantizer_input_info(q_, 0, &info), QF_OK) << qf_last_error();
  EXPECT_EQ(std::string(info.name), want[0].name);
  EXPECT_EQ(info.bytes, want[0].bytes);
  EXPECT_EQ(qf_quantizer_input_info(q_, n, &info), QF_ERR_USER);
}

TEST_F(CApi, UsageOverrideDropsColumnwise) {
  open_all();
  ASSERT_EQ(qf_quantizer_create(ctx_, "mxfp8", "linear:input", QF_DTYPE_BF16, QF_USAGE_INFERENCE, &q_), QF_OK)
      << qf_last_error();
  int n = 0;
  ASSERT_EQ(qf_quantizer_num_outputs(q_, &n), QF_OK);
  for (int i = 0; i < n; ++i) {
    qf_buffer_info info{};
    ASSERT_EQ(qf_quantizer_output_info(q_, 256, 512, i, &info), QF_OK);
    EXPECT_EQ(std::string(info.name).rfind("columnwise", 0), std::string::npos) << info.name;
  }
}

TEST_F(CApi, PrepareCompilesWithoutAGpu) {
  const std::string p = recipe_path("mxfp8");
  const char* paths[] = {p.c_str()};
  ASSERT_EQ(qf_context_create(paths, 1, &ctx_), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_quantizer_create(ctx_, nullptr, "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_), QF_OK)
      << qf_last_error();
  EXPECT_EQ(qf_quantizer_prepare(q_, "sm_90a"), QF_OK) << qf_last_error();
  EXPECT_EQ(qf_quantizer_prepare(q_, "sm_90a"), QF_OK) << qf_last_error();  // cache hit
  EXPECT_STREQ(qf_last_error(), "");
  EXPECT_NE(qf_quantizer_prepare(q_, "sm_nonsense"), QF_OK);
  EXPECT_STRNE(qf_last_error(), "");
}

TEST_F(CApi, BadRecipePathNamesThePath) {
  const std::string p = std::string(QF_SOURCE_DIR) + "/recipes/does_not_exist.json";
  const char* paths[] = {p.c_str()};
  EXPECT_EQ(qf_context_create(paths, 1, &ctx_), QF_ERR_USER);
  EXPECT_EQ(ctx_, nullptr);
  EXPECT_NE(std::string(qf_last_error()).find(p), std::string::npos) << qf_last_error();
}

TEST_F(CApi, BadRecipeFileNamesPathAndPointer) {
  const auto dir = fs::temp_directory_path() / "qforge-c-api-test";
  fs::create_directories(dir);
  const auto p = (dir / "bad_format.json").string();
  {
    FILE* f = std::fopen(p.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"qforge_recipe": 1, "name": "x", "usage": "training",
  "roles": [{"match": "*:input", "rowwise": {"format": "e9m9", "scaling": "per_tensor_current"}}]})", f);
    std::fclose(f);
  }
  const char* paths[] = {p.c_str()};
  EXPECT_EQ(qf_context_create(paths, 1, &ctx_), QF_ERR_USER);
  const std::string msg = qf_last_error();
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("/roles/0/rowwise/format"), std::string::npos) << msg;
}

TEST_F(CApi, UnknownRoleAndRecipe) {
  open_all();
  EXPECT_EQ(qf_quantizer_create(ctx_, "mxfp8", "linear", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_), QF_ERR_USER);
  EXPECT_EQ(q_, nullptr);
  EXPECT_NE(std::string(qf_last_error()).find("role"), std::string::npos) << qf_last_error();

  const std::string json = R"({"qforge_recipe": 1, "name": "only_weights", "usage": "inference",
    "roles": [{"match": "linear:weight", "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"}}]})";
  qf_context* c2 = nullptr;
  ASSERT_EQ(qf_context_create_from_json(json.c_str(), &c2), QF_OK) << qf_last_error();
  qf_quantizer* q = nullptr;
  EXPECT_EQ(qf_quantizer_create(c2, nullptr, "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q), QF_ERR_USER);
  EXPECT_EQ(q, nullptr);
  EXPECT_STRNE(qf_last_error(), "");
  EXPECT_EQ(qf_quantizer_create(c2, nullptr, "linear:weight", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q), QF_OK)
      << qf_last_error();
  qf_quantizer_destroy(q);
  qf_context_destroy(c2);

  EXPECT_EQ(qf_quantizer_create(ctx_, "no_such_recipe", "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_),
            QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("no_such_recipe"), std::string::npos) << qf_last_error();
  // NULL recipe name with several recipes is ambiguous.
  EXPECT_EQ(qf_quantizer_create(ctx_, nullptr, "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("recipe_name"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_quantizer_create(ctx_, "mxfp8", "linear:input", static_cast<qf_dtype>(7), QF_USAGE_DEFAULT, &q_),
            QF_ERR_USER);
  EXPECT_EQ(qf_quantizer_create(ctx_, "mxfp8", "linear:input", QF_DTYPE_BF16, static_cast<qf_usage>(9), &q_),
            QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("usage"), std::string::npos) << qf_last_error();
}

TEST_F(CApi, BadJsonReportsLineAndPointer) {
  EXPECT_EQ(qf_context_create_from_json("{\n  \"qforge_recipe\": 1,\n  oops\n}", &ctx_), QF_ERR_USER);
  EXPECT_EQ(ctx_, nullptr);
  EXPECT_NE(std::string(qf_last_error()).find("line 3"), std::string::npos) << qf_last_error();

  EXPECT_EQ(qf_context_create_from_json(R"({"qforge_recipe": 1, "name": "x", "usage": "training",
    "roles": [{"match": "*:input", "rowwise": {"format": "e4m3", "scaling": "per_tensor_current", "bogus": 1}}]})",
                                        &ctx_),
            QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("/roles/0/rowwise"), std::string::npos) << qf_last_error();
}

TEST_F(CApi, NullArgumentsAreNamed) {
  EXPECT_EQ(qf_context_create(nullptr, 1, &ctx_), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("recipe_paths"), std::string::npos) << qf_last_error();
  const char* null_path[] = {nullptr};
  EXPECT_EQ(qf_context_create(null_path, 1, &ctx_), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("recipe_paths[0]"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_context_create(null_path, 0, &ctx_), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("n"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_context_create_from_json(nullptr, &ctx_), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("json"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_context_create_from_json("{}", nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("out"), std::string::npos) << qf_last_error();

  EXPECT_EQ(qf_quantizer_create(nullptr, nullptr, "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_),
            QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("ctx"), std::string::npos) << qf_last_error();
  open_all();
  EXPECT_EQ(qf_quantizer_create(ctx_, "mxfp8", nullptr, QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("role"), std::string::npos) << qf_last_error();

  int n = 0;
  EXPECT_EQ(qf_quantizer_num_outputs(nullptr, &n), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("q:"), std::string::npos) << qf_last_error();
  ASSERT_EQ(qf_quantizer_create(ctx_, "mxfp8", "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_), QF_OK);
  EXPECT_EQ(qf_quantizer_output_info(q_, 256, 512, 0, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("out"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_quantizer_prepare(q_, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("arch"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_quantize(q_, nullptr, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("args"), std::string::npos) << qf_last_error();
  qf_quantize_args a{};
  a.m = 256;
  a.k = 512;
  a.num_buffers = 1;
  EXPECT_EQ(qf_quantize(q_, &a, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("args->buffers"), std::string::npos) << qf_last_error();
  // Destroying NULL is a no-op.
  qf_quantizer_destroy(nullptr);
  qf_context_destroy(nullptr);
}

// qf_cache_evict: each field checked and named; a policy with no rule is refused before the cache
// is touched. (Removal itself: tests/python's evict test, on a cache of its own; here only a dry
// run, as the test cache is shared.)
TEST_F(CApi, CacheEvictChecksItsPolicy) {
  qf_cache_evict_policy p{};
  qf_cache_evict_result r{};
  auto fails_naming = [&](const char* what) {
    EXPECT_EQ(qf_cache_evict(&p, &r), QF_ERR_USER) << what;
    EXPECT_NE(std::string(qf_last_error()).find(what), std::string::npos) << qf_last_error();
  };
  EXPECT_EQ(qf_cache_evict(nullptr, &r), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("policy"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_cache_evict(&p, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("out"), std::string::npos) << qf_last_error();
  fails_naming("no rule set");
  p.unused_for_s = -1;
  fails_naming("policy->unused_for_s");
  p.unused_for_s = 0, p.max_bytes = -5;
  fails_naming("policy->max_bytes");
  p.max_bytes = 0, p.stale = 2;
  fails_naming("policy->stale");
  p.stale = 1, p.dry_run = -1;
  fails_naming("policy->dry_run");
  p.dry_run = 1;
  r.removed = -7;
  ASSERT_EQ(qf_cache_evict(&p, &r), QF_OK) << qf_last_error();
  EXPECT_GE(r.removed, 0);
  EXPECT_GE(r.kept, 0);
  EXPECT_GE(r.kept_bytes, 0);
}

TEST_F(CApi, QuantizeWithoutGpuFailsCleanly) {
  if (qf::rt::driver().available()) GTEST_SKIP() << "a CUDA driver is present (fake pointers must not reach it)";
  const std::string p = recipe_path("mxfp8");
  const char* paths[] = {p.c_str()};
  ASSERT_EQ(qf_context_create(paths, 1, &ctx_), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_quantizer_create(ctx_, nullptr, "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_), QF_OK);
  int n = 0;
  ASSERT_EQ(qf_quantizer_num_outputs(q_, &n), QF_OK);
  // Fake but well-formed, aligned, non-overlapping device addresses of the right sizes.
  std::vector<qf_named_buffer> bufs;
  uintptr_t next = uintptr_t(1) << 40;
  const uintptr_t input = next;
  next += 256 * 512 * 2;
  for (int i = 0; i < n; ++i) {
    qf_buffer_info info{};
    ASSERT_EQ(qf_quantizer_output_info(q_, 256, 512, i, &info), QF_OK);
    bufs.push_back({info.name, reinterpret_cast<void*>(next), info.bytes});
    next += (uintptr_t(info.bytes) + 255) & ~uintptr_t(255);
  }
  qf_quantize_args a{};
  a.input = reinterpret_cast<const void*>(input);
  a.m = 256;
  a.k = 512;
  a.buffers = bufs.data();
  a.num_buffers = int(bufs.size());
  const qf_status s = qf_quantize(q_, &a, nullptr);
  EXPECT_TRUE(s == QF_ERR_CUDA || s == QF_ERR_USER) << s << ": " << qf_last_error();
  EXPECT_STRNE(qf_last_error(), "");
  EXPECT_NE(std::string(qf_last_error()).find("CUDA"), std::string::npos) << qf_last_error();
  std::printf("qf_quantize without a GPU: status %d: %s\n", int(s), qf_last_error());
}

// Grouped outputs: qf_quantizer_grouped_output_info gives the sizes qf_quantize checks a grouped
// call against (the worst split), the C++ grouped_capacity's, each at least what a known split
// fills; buffers of those sizes pass the checks (without a GPU the call then fails in CUDA), one
// byte less is refused naming the buffer, and a member count out of range is named.
TEST_F(CApi, GroupedOutputInfoIsWhatQuantizeChecks) {
  if (qf::rt::driver().available()) GTEST_SKIP() << "a CUDA driver is present (fake pointers must not reach it)";
  const std::string p = recipe_path("nvfp4");
  const char* paths[] = {p.c_str()};
  ASSERT_EQ(qf_context_create(paths, 1, &ctx_), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_quantizer_create_ex(ctx_, nullptr, "grouped_linear:input", QF_DTYPE_BF16, QF_USAGE_TRAINING, 1, &q_), QF_OK)
      << qf_last_error();
  const int64_t m = 512, k = 256;
  const std::vector<int64_t> split = {160, 0, 352};
  const int members = int(split.size());
  const qf::rt::Quantizer cpp(qf::compile_plan(qf::load_recipe(p), qf::PlanRequest{"grouped_linear:input", qf::DType::BF16,
                                                                                  qf::Usage::Training, true}));
  const std::vector<qf::BufferDesc> want = cpp.grouped_capacity(qf::Shape2D{m, k}, members);
  const std::vector<qf::BufferDesc> filled = cpp.grouped_outputs(split, k);
  int n = 0;
  ASSERT_EQ(qf_quantizer_num_outputs(q_, &n), QF_OK);
  ASSERT_EQ(size_t(n), want.size());
  std::vector<qf_named_buffer> bufs;
  uintptr_t next = uintptr_t(1) << 40;
  const uintptr_t input = next;
  next += uintptr_t(m * k * 2);
  for (int i = 0; i < n; ++i) {
    qf_buffer_info info{};
    ASSERT_EQ(qf_quantizer_grouped_output_info(q_, m, k, members, i, &info), QF_OK) << qf_last_error();
    EXPECT_EQ(std::string(info.name), want[size_t(i)].name);
    EXPECT_EQ(info.bytes, want[size_t(i)].bytes) << info.name;
    EXPECT_GE(info.bytes, filled[size_t(i)].bytes) << info.name;
    EXPECT_EQ(info.ndim, 1);
    EXPECT_EQ(info.shape[0] * info.element_size, info.bytes);
    bufs.push_back({info.name, reinterpret_cast<void*>(next), info.bytes});
    next += (uintptr_t(info.bytes) + 255) & ~uintptr_t(255);
  }
  qf_buffer_info info{};
  EXPECT_EQ(qf_quantizer_grouped_output_info(q_, m, k, 0, 0, &info), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "num_members: expected 1..2^20 members, got 0");
  EXPECT_EQ(qf_quantizer_grouped_output_info(q_, m, -4, members, 0, &info), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("shape"), std::string::npos) << qf_last_error();
  qf_quantize_args a{};
  a.input = reinterpret_cast<const void*>(input);
  a.m = m;
  a.k = k;
  a.buffers = bufs.data();
  a.num_buffers = int(bufs.size());
  a.member_rows = reinterpret_cast<const int64_t*>(next);
  a.num_members = members;
  EXPECT_EQ(qf_quantize(q_, &a, nullptr), QF_ERR_CUDA) << qf_last_error();
  // A grouped quantizer takes grouped calls only; num_members needs member_rows.
  a.member_rows = nullptr;
  EXPECT_EQ(qf_quantize(q_, &a, nullptr), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "member_rows: null with num_members 3: a grouped call needs the members' device row offsets");
  a.num_members = 0;
  EXPECT_EQ(qf_quantize(q_, &a, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("this quantizer is for grouped tensors"), std::string::npos) << qf_last_error();
  qf_quantizer* single = nullptr;
  ASSERT_EQ(qf_quantizer_create_ex(ctx_, nullptr, "grouped_linear:input", QF_DTYPE_BF16, QF_USAGE_TRAINING, 0, &single), QF_OK);
  a.member_rows = reinterpret_cast<const int64_t*>(next);
  a.num_members = members;
  EXPECT_EQ(qf_quantize(single, &a, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("this quantizer is for single tensors"), std::string::npos) << qf_last_error();
  qf_quantizer_destroy(single);
  for (auto& b : bufs) {
    b.bytes -= 1;
    EXPECT_EQ(qf_quantize(q_, &a, nullptr), QF_ERR_USER) << b.name;
    EXPECT_NE(std::string(qf_last_error()).find(std::string("argument ") + b.name + ":"), std::string::npos)
        << qf_last_error();
    b.bytes += 1;
  }
}

// Every pointer and extent of a call is checked before anything reaches the driver: shapes
// whose byte counts would pass int64, a grouped call's K against packed rowwise data (M, the
// members' total, may be 0), the members' row offsets and the no-op flag (aligned, outside the
// buffers the call writes or zeroes), and the workspace (outside everything the call reads).
TEST_F(CApi, QuantizeChecksEveryPointerAndExtent) {
  if (qf::rt::driver().available()) GTEST_SKIP() << "a CUDA driver is present (fake pointers must not reach it)";
  const std::string nvfp4 = recipe_path("nvfp4"), rowwise = recipe_path("fp8_rowwise");
  const char* paths[] = {nvfp4.c_str(), rowwise.c_str()};
  ASSERT_EQ(qf_context_create(paths, 2, &ctx_), QF_OK) << qf_last_error();
  // Buffers of a call over [m, k] at fake, aligned, disjoint addresses; `grouped` sizes them for
  // `members` members.
  struct Call {
    std::vector<qf_named_buffer> bufs;
    qf_quantize_args a{};
    uintptr_t next = uintptr_t(1) << 40;
  };
  auto make = [&](qf_quantizer* q, int64_t m, int64_t k, int members) {
    Call c;
    c.a.input = reinterpret_cast<const void*>(c.next);
    c.next += uintptr_t(std::max<int64_t>(m, 1) * k * 2 + 255) & ~uintptr_t(255);
    int n = 0;
    EXPECT_EQ(qf_quantizer_num_outputs(q, &n), QF_OK);
    for (int i = 0; i < n; ++i) {
      qf_buffer_info info{};
      const qf_status st = members ? qf_quantizer_grouped_output_info(q, m, k, members, i, &info)
                                   : qf_quantizer_output_info(q, m, k, i, &info);
      EXPECT_EQ(st, QF_OK) << qf_last_error();
      c.bufs.push_back({info.name, reinterpret_cast<void*>(c.next), info.bytes});
      c.next += (uintptr_t(info.bytes) + 255) & ~uintptr_t(255);
    }
    c.a.m = m, c.a.k = k;
    c.a.buffers = c.bufs.data();
    c.a.num_buffers = int(c.bufs.size());
    if (members) {
      c.a.member_rows = reinterpret_cast<const int64_t*>(c.next);
      c.a.num_members = members;
      c.next += 256 * ((size_t(members) * 8 + 8 + 255) / 256);
    }
    return c;
  };
  auto error = [] { return std::string(qf_last_error()); };

  // A single tensor of 2^31 x 2^31 fp32-sized elements would need 2^64 bytes.
  ASSERT_EQ(qf_quantizer_create(ctx_, "nvfp4", "linear:input", QF_DTYPE_BF16, QF_USAGE_TRAINING, &q_), QF_OK) << qf_last_error();
  qf_quantize_args big{};
  big.input = reinterpret_cast<const void*>(uintptr_t(1) << 40);
  big.m = big.k = int64_t(1) << 31;
  EXPECT_EQ(qf_quantize(q_, &big, nullptr), QF_ERR_USER);
  EXPECT_EQ(error(), "args->m, args->k: more than 2^50 elements are not supported, got [2147483648, 2147483648]");
  qf_buffer_info info{};
  EXPECT_EQ(qf_quantizer_output_info(q_, int64_t(1) << 31, int64_t(1) << 31, 0, &info), QF_ERR_USER);
  EXPECT_NE(error().find("2^50"), std::string::npos) << error();
  qf_quantizer_destroy(q_), q_ = nullptr;

  // Grouped NVFP4: the rowwise data packs two elements per byte along K, which the host knows.
  ASSERT_EQ(qf_quantizer_create_ex(ctx_, "nvfp4", "grouped_linear:input", QF_DTYPE_BF16, QF_USAGE_TRAINING, 1, &q_), QF_OK)
      << qf_last_error();
  EXPECT_EQ(qf_quantizer_grouped_output_info(q_, 32, 17, 2, 0, &info), QF_ERR_USER);
  EXPECT_NE(error().find("the row length (17) must be even"), std::string::npos) << error();
  {
    Call c = make(q_, 32, 18, 2);
    c.a.k = 17;
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_USER);
    EXPECT_NE(error().find("the row length (17) must be even"), std::string::npos) << error();
  }
  // No rows at all (an expert-parallel rank that received no tokens): checked, then the driver.
  {
    Call c = make(q_, 0, 256, 3);
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_CUDA) << error();
    int64_t ws = -1;
    EXPECT_EQ(qf_quantizer_workspace_bytes(q_, 0, 256, 3, &ws), QF_OK) << error();
    EXPECT_EQ(qf_quantizer_workspace_bytes(q_, 0, 256, (1 << 20) + 1, &ws), QF_ERR_USER);
    EXPECT_EQ(error(), "num_members: expected 1..2^20, got 1048577");
  }
  // The members' row offsets: aligned to 8 bytes, outside the outputs (zeroed or written).
  {
    Call c = make(q_, 512, 256, 3);
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_CUDA) << error();
    c.a.member_rows = reinterpret_cast<const int64_t*>(reinterpret_cast<uintptr_t>(c.a.member_rows) + 4);
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_USER);
    EXPECT_NE(error().find("argument member_rows:"), std::string::npos) << error();
    c.a.member_rows = reinterpret_cast<const int64_t*>(c.bufs.back().ptr);
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_USER);
    EXPECT_NE(error().find("overlaps argument member_rows"), std::string::npos) << error();
  }
  qf_quantizer_destroy(q_), q_ = nullptr;

  // fp8 per channel: a channel-amax workspace, zeroed before the kernels run.
  ASSERT_EQ(qf_quantizer_create(ctx_, "fp8_rowwise", "linear:weight", QF_DTYPE_BF16, QF_USAGE_TRAINING, &q_), QF_OK)
      << qf_last_error();
  {
    Call c = make(q_, 256, 512, 0);
    int64_t ws = 0;
    ASSERT_EQ(qf_quantizer_workspace_bytes(q_, 256, 512, 1, &ws), QF_OK) << error();
    ASSERT_GT(ws, 0);
    c.a.workspace = reinterpret_cast<void*>(c.next);
    c.a.workspace_bytes = ws;
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_CUDA) << error();
    c.a.workspace = const_cast<void*>(c.a.input);  // would zero the input before reading it
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_USER);
    EXPECT_NE(error().find("argument workspace:"), std::string::npos) << error();
    EXPECT_NE(error().find("overlaps argument input"), std::string::npos) << error();
    c.a.workspace = reinterpret_cast<void*>(c.next);
    // The no-op flag: a 4-byte aligned float outside the outputs.
    c.a.noop = reinterpret_cast<const float*>(c.next + uintptr_t(ws) + 2);
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_USER);
    EXPECT_NE(error().find("argument noop:"), std::string::npos) << error();
    c.a.noop = reinterpret_cast<const float*>(c.bufs.front().ptr);
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_USER);
    EXPECT_NE(error().find("overlaps argument noop"), std::string::npos) << error();
    c.a.noop = reinterpret_cast<const float*>(c.a.workspace);
    EXPECT_EQ(qf_quantize(q_, &c.a, nullptr), QF_ERR_USER);
    EXPECT_NE(error().find("argument workspace:"), std::string::npos) << error();
  }
}

// qf_quantize on a GPU: the outputs of the C entry point are bit-identical to the CPU reference
// (stochastic rounding, RHT, a delayed-scaling scale input, per-tensor amax), and a bad buffer
// is refused with its name before anything is launched (the poisoned outputs stay untouched).
TEST_F(CApi, QuantizeOnGpuMatchesReference) {
  QF_SKIP_WITHOUT_GPU();
  using qf::rt::DeviceBuffer;
  const int64_t m = 256, k = 512;
  for (const char* name : {"nvfp4", "delayed_scaling", "float8_block_scaling"}) {
    SCOPED_TRACE(name);
    const std::string p = recipe_path(name);
    const char* paths[] = {p.c_str()};
    qf_quantizer_destroy(q_), q_ = nullptr;
    qf_context_destroy(ctx_), ctx_ = nullptr;
    ASSERT_EQ(qf_context_create(paths, 1, &ctx_), QF_OK) << qf_last_error();
    ASSERT_EQ(qf_quantizer_create(ctx_, nullptr, "linear:grad_output", QF_DTYPE_BF16, QF_USAGE_TRAINING, &q_), QF_OK)
        << qf_last_error();
    const qf::Plan plan = qf::compile_plan(qf::load_recipe(p), qf::PlanRequest{"linear:grad_output", qf::DType::BF16,
                                                                             qf::Usage::Training, false});
    // Input: normal values per row scale, as bf16 bits.
    qf::ref::HostTensor x;
    x.dtype = qf::DType::BF16;
    x.shape = {m, k};
    x.bytes.resize(size_t(m * k * 2));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < m * k; ++i) {
      const qf::u16 h = qf::f32_to_bf16(normal(rng) * float(1 + (i / k) % 5));
      std::memcpy(&x.bytes[size_t(i * 2)], &h, 2);
    }
    qf::ref::QuantizeParams params;
    params.seed = 0xabcdef12345ull;
    params.offset = 3;
    std::vector<qf_named_buffer> bufs;
    std::vector<DeviceBuffer> keep;
    keep.reserve(16);
    int n_in = 0;
    ASSERT_EQ(qf_quantizer_num_inputs(q_, &n_in), QF_OK);
    for (int i = 0; i < n_in; ++i) {
      qf_buffer_info info{};
      ASSERT_EQ(qf_quantizer_input_info(q_, i, &info), QF_OK);
      const float scale = 2.5f;
      params.scales[info.name] = scale;
      keep.emplace_back(4);
      keep.back().upload(&scale, 4);
      bufs.push_back({info.name, reinterpret_cast<void*>(keep.back().address()), 4});
    }
    const std::vector<qf::ref::Output> expected = qf::ref::quantize(plan, x, params);
    int n_out = 0;
    ASSERT_EQ(qf_quantizer_num_outputs(q_, &n_out), QF_OK);
    ASSERT_EQ(size_t(n_out), expected.size());
    std::map<std::string, size_t> index;
    for (int i = 0; i < n_out; ++i) {
      qf_buffer_info info{};
      ASSERT_EQ(qf_quantizer_output_info(q_, m, k, i, &info), QF_OK);
      keep.push_back(qf::rt::testing::poisoned_buffer(size_t(info.bytes)));
      index[info.name] = keep.size() - 1;
      bufs.push_back({info.name, reinterpret_cast<void*>(keep.back().address()), info.bytes});
    }
    int64_t ws = 0;
    ASSERT_EQ(qf_quantizer_workspace_bytes(q_, m, k, 1, &ws), QF_OK);
    DeviceBuffer dws(size_t(std::max<int64_t>(ws, 16)));
    DeviceBuffer dx(x.bytes.size());
    dx.upload(x.bytes.data(), x.bytes.size());
    qf_quantize_args a{};
    a.input = reinterpret_cast<const void*>(dx.address());
    a.m = m;
    a.k = k;
    a.buffers = bufs.data();
    a.num_buffers = int(bufs.size());
    a.workspace = ws > 0 ? reinterpret_cast<void*>(dws.address()) : nullptr;
    a.workspace_bytes = ws;
    a.seed = params.seed;
    a.offset = params.offset;

    // One output buffer a byte short: refused, named, nothing written.
    qf_named_buffer& last = bufs.back();
    last.bytes -= 1;
    EXPECT_EQ(qf_quantize(q_, &a, nullptr), QF_ERR_USER);
    EXPECT_NE(std::string(qf_last_error()).find(last.name), std::string::npos) << qf_last_error();
    last.bytes += 1;
    {
      std::vector<uint8_t> got(size_t(last.bytes));
      keep[index[last.name]].download(got.data(), got.size());
      EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint8_t b) { return b == 0xFF; })) << "written before the check";
    }

    ASSERT_EQ(qf_quantize(q_, &a, nullptr), QF_OK) << qf_last_error();
    for (const auto& o : expected) {
      std::vector<uint8_t> got(o.bytes.size());
      keep[index.at(o.desc.name)].download(got.data(), got.size());
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != o.bytes[i];
      EXPECT_EQ(bad, 0u) << o.desc.name << ": bytes differing from the CPU reference";
    }
  }
}

// ---- Delayed scaling's amax history

TEST_F(CApi, AmaxHistoryNamesItsScaleAndChecksItsBuffers) {
  const std::string delayed = recipe_path("delayed_scaling"), mx = recipe_path("mxfp8");
  const char* paths[] = {delayed.c_str(), mx.c_str()};
  ASSERT_EQ(qf_context_create(paths, 2, &ctx_), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_quantizer_create(ctx_, "delayed_scaling", "linear:grad_output", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &q_),
            QF_OK)
      << qf_last_error();
  int len = 0;
  ASSERT_EQ(qf_quantizer_history_length(q_, nullptr, &len), QF_OK) << qf_last_error();
  EXPECT_EQ(len, 1024);  // the recipe's history_length
  ASSERT_EQ(qf_quantizer_history_length(q_, "scale", &len), QF_OK) << qf_last_error();
  EXPECT_EQ(qf_quantizer_history_length(q_, "rowwise_scale", &len), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "scale_name: no scale input \"rowwise_scale\"; expected \"scale\"");

  // Buffers are checked before anything else (no GPU needed to get here).
  // Host addresses standing for device buffers: never dereferenced, every call fails its checks.
  std::vector<float> hist(1024);
  float amax = 0, scale = 0;
  qf_history_args a{};
  a.history = hist.data();
  a.history_bytes = 4 * 1023;
  a.amax = &amax;
  a.amax_bytes = 4;
  a.scale = &scale;
  a.scale_bytes = 4;
  EXPECT_EQ(qf_quantizer_update_amax_history(q_, nullptr, &a, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("history"), std::string::npos) << qf_last_error();
  EXPECT_NE(std::string(qf_last_error()).find("4096"), std::string::npos) << qf_last_error();
  a.history_bytes = 4096;
  a.scale = nullptr;
  EXPECT_EQ(qf_quantizer_update_amax_history(q_, nullptr, &a, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("scale"), std::string::npos) << qf_last_error();
  a.scale_bytes = -1;
  EXPECT_EQ(qf_quantizer_update_amax_history(q_, nullptr, &a, nullptr), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "args->scale_bytes: must be >= 0, got -1");
  EXPECT_EQ(qf_quantizer_update_amax_history(q_, nullptr, nullptr, nullptr), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "args: must not be NULL");
  // 1 / scale written over the scale (or the history, or the amax) is refused.
  a.scale = &scale;
  a.scale_bytes = 4;
  a.scale_inv = &scale;
  a.scale_inv_bytes = 4;
  EXPECT_EQ(qf_quantizer_update_amax_history(q_, nullptr, &a, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("scale_inv"), std::string::npos) << qf_last_error();
  a.scale_inv = hist.data() + 5;  // inside the history
  EXPECT_EQ(qf_quantizer_update_amax_history(q_, nullptr, &a, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("scale_inv"), std::string::npos) << qf_last_error();

  // A quantizer without delayed scaling has no history.
  qf_quantizer* mq = nullptr;
  ASSERT_EQ(qf_quantizer_create(ctx_, "mxfp8", "linear:input", QF_DTYPE_BF16, QF_USAGE_DEFAULT, &mq), QF_OK);
  EXPECT_EQ(qf_quantizer_history_length(mq, nullptr, &len), QF_ERR_USER);
  const std::string msg = qf_last_error();
  qf_quantizer_destroy(mq);
  EXPECT_EQ(msg, "q: role \"linear:input\" of recipe \"mxfp8\" has no delayed-scaling stream, so no amax history");
}

TEST_F(CApi, AmaxHistoryOfOneOfTwoScales) {
  // Directions of different formats keep their own scale (and history rule): the name picks one.
  const char* json = R"({"qforge_recipe": 1, "name": "two_scales", "roles": [{"match": "*:*",
    "rowwise": {"format": "e4m3", "scaling": {"mode": "per_tensor_delayed", "history_length": 16}},
    "columnwise": {"format": "e5m2", "scaling": {"mode": "per_tensor_delayed", "history_length": 8}}}]})";
  ASSERT_EQ(qf_context_create_from_json(json, &ctx_), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_quantizer_create(ctx_, nullptr, "linear:input", QF_DTYPE_BF16, QF_USAGE_TRAINING, &q_), QF_OK)
      << qf_last_error();
  int len = 0;
  ASSERT_EQ(qf_quantizer_history_length(q_, "rowwise_scale", &len), QF_OK) << qf_last_error();
  EXPECT_EQ(len, 16);
  ASSERT_EQ(qf_quantizer_history_length(q_, "columnwise_scale", &len), QF_OK) << qf_last_error();
  EXPECT_EQ(len, 8);
  EXPECT_EQ(qf_quantizer_history_length(q_, nullptr, &len), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(),
               "scale_name: NULL needs a quantizer of one scale input; this one has \"rowwise_scale\", \"columnwise_scale\"");
}

TEST_F(CApi, AmaxHistoryOnGpuMatchesReference) {
  QF_SKIP_WITHOUT_GPU();
  using qf::rt::DeviceBuffer;
  const std::string p = recipe_path("delayed_scaling");
  const char* paths[] = {p.c_str()};
  ASSERT_EQ(qf_context_create(paths, 1, &ctx_), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_quantizer_create(ctx_, nullptr, "linear:grad_output", QF_DTYPE_FP32, QF_USAGE_DEFAULT, &q_), QF_OK)
      << qf_last_error();
  const qf::Recipe recipe = qf::load_recipe(p);
  const qf::Plan plan =
      qf::compile_plan(recipe, qf::PlanRequest{"linear:grad_output", qf::DType::FP32, std::nullopt, false});
  const auto& mode = std::get<qf::PerTensorDelayed>(plan.streams[0].scaling);
  // Three steps: quantize (its amax output), then roll the history and rescale; the next
  // quantize reads the new scale.
  const int64_t m = 64, k = 128;
  std::vector<float> history(size_t(mode.history_length));
  for (size_t i = 0; i < history.size(); ++i) history[i] = float(i % 37) * 0.25f;
  float scale = 1.0f;
  DeviceBuffer dh(history.size() * 4), ds(4), dsi(4), dx(size_t(m * k * 4));
  dh.upload(history.data(), history.size() * 4);
  ds.upload(&scale, 4);
  std::map<std::string, DeviceBuffer> outs;
  std::vector<qf_named_buffer> bufs;
  int n_out = 0;
  ASSERT_EQ(qf_quantizer_num_outputs(q_, &n_out), QF_OK);
  for (int i = 0; i < n_out; ++i) {
    qf_buffer_info info{};
    ASSERT_EQ(qf_quantizer_output_info(q_, m, k, i, &info), QF_OK);
    auto& b = outs.emplace(info.name, DeviceBuffer(size_t(info.bytes))).first->second;
    bufs.push_back({info.name, reinterpret_cast<void*>(b.address()), info.bytes});
  }
  bufs.push_back({"scale", reinterpret_cast<void*>(ds.address()), 4});
  ASSERT_TRUE(outs.count("amax"));
  for (float peak : {3.5f, 1000.0f, 0.125f}) {
    SCOPED_TRACE(peak);
    std::vector<float> x(size_t(m * k));
    for (size_t i = 0; i < x.size(); ++i) x[i] = peak * float(int(i % 9) - 4) / 4.0f;
    dx.upload(x.data(), x.size() * 4);
    qf_quantize_args qa{};
    qa.input = reinterpret_cast<const void*>(dx.address());
    qa.m = m;
    qa.k = k;
    qa.buffers = bufs.data();
    qa.num_buffers = int(bufs.size());
    ASSERT_EQ(qf_quantize(q_, &qa, nullptr), QF_OK) << qf_last_error();
    qf_history_args ha{};
    ha.history = reinterpret_cast<void*>(dh.address());
    ha.history_bytes = int64_t(history.size() * 4);
    ha.amax = reinterpret_cast<const void*>(outs.at("amax").address());
    ha.amax_bytes = 4;
    ha.scale = reinterpret_cast<void*>(ds.address());
    ha.scale_bytes = 4;
    ha.scale_inv = reinterpret_cast<void*>(dsi.address());
    ha.scale_inv_bytes = 4;
    ASSERT_EQ(qf_quantizer_update_amax_history(q_, "scale", &ha, nullptr), QF_OK) << qf_last_error();
    qf::ref::update_amax_history(history, peak, scale, mode, plan.streams[0].format);  // amax = peak
    std::vector<float> got(history.size());
    dh.download(got.data(), got.size() * 4);
    float got_scale = 0, got_inv = 0;
    ds.download(&got_scale, 4);
    dsi.download(&got_inv, 4);
    ASSERT_EQ(0, std::memcmp(got.data(), history.data(), history.size() * 4));
    EXPECT_EQ(qf::f32_bits(got_scale), qf::f32_bits(scale));
    EXPECT_EQ(qf::f32_bits(got_inv), qf::f32_bits(1.0f / scale));
  }
}

// ---- GEMM

qf_gemm_spec blockwise_spec() {
  qf_gemm_spec s{};
  s.scaling = "blockwise";
  s.n = 256;
  s.k = 512;
  return s;
}

TEST_F(CApi, GemmDequantRouteAndItsWorkspace) {
  qf_gemm* g = nullptr;
  qf_gemm_spec s = blockwise_spec();
  s.scaling = "mxfp8";
  s.scale_layout = "mn_major";
  s.route = "dequant";
  ASSERT_EQ(qf_gemm_create(&s, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g), "e4m3 x e4m3 mxfp8 (mn_major scales) (dequant route) N=256 K=512 -> bf16");
  int64_t bytes = -1;
  EXPECT_EQ(qf_gemm_workspace_bytes(g, &bytes), QF_ERR_USER);  // the copies depend on the call
  EXPECT_NE(std::string(qf_last_error()).find("workspace_bytes(extent, num_groups)"), std::string::npos) << qf_last_error();
  // bf16 copies of A [1000, 512] and B [4, 256, 512], then the mn_major A grid prefix [5] and the
  // groups' starts [5] (256-byte parts).
  ASSERT_EQ(qf_gemm_workspace_bytes_for(g, 1000, 4, &bytes), QF_OK) << qf_last_error();
  EXPECT_EQ(bytes, 1000 * 512 * 2 + 4 * 256 * 512 * 2 + 2 * 256);
  EXPECT_EQ(qf_gemm_workspace_bytes_for(g, -1, 4, &bytes), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("extent: expected 0 <= m_total"), std::string::npos) << qf_last_error();
  qf_gemm_destroy(g);
  // Operands past 2^50 elements, whose byte counts would pass int64, are refused by name.
  s.n = s.k = 1 << 24;
  ASSERT_EQ(qf_gemm_create(&s, &g), QF_OK) << qf_last_error();
  int64_t a_bytes = 0, b_bytes = 0;
  EXPECT_EQ(qf_gemm_scale_bytes(g, 4096, 1 << 20, &a_bytes, &b_bytes), QF_ERR_USER);
  EXPECT_EQ(std::string(qf_last_error()),
            "num_groups: 1048576 groups of 281474976710656 (n x k) elements: an operand of more than 2^50 elements is not "
            "supported");
  EXPECT_EQ(qf_gemm_workspace_bytes_for(g, (int64_t(1) << 31) - 257, 1, &bytes), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("extent: m_total 2147483391 x 16777216"), std::string::npos) << qf_last_error();
  ASSERT_EQ(qf_gemm_scale_bytes(g, 4096, 4, &a_bytes, &b_bytes), QF_OK) << qf_last_error();
  qf_gemm_destroy(g);
  s.n = 256, s.k = 512;
  // A run past those bounds is refused by its own fields before any size is computed (B's bytes
  // would wrap to 0 here and let a null B through).
  qf_gemm_spec none{};
  none.scaling = "none";
  none.n = none.k = 1 << 24;
  ASSERT_EQ(qf_gemm_create(&none, &g), QF_OK) << qf_last_error();
  qf_gemm_args run{};
  run.a = reinterpret_cast<const void*>(uintptr_t(1) << 40);
  run.a_bytes = int64_t(128) << 25;
  run.d = reinterpret_cast<void*>(uintptr_t(1) << 44);
  run.d_bytes = int64_t(128) << 25;
  run.group_offsets = reinterpret_cast<const int64_t*>(uintptr_t(1) << 45);
  run.m_total = 128;
  run.num_groups = 32768;
  EXPECT_EQ(qf_gemm_run(g, &run, nullptr), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("num_groups: 32768 groups of 281474976710656 (n x k) elements"),
            std::string::npos) << qf_last_error();
  qf_gemm_destroy(g);
  s.route = "fast";
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec->route: expected fused, dequant or auto, got \"fast\"");
  s = blockwise_spec(), s.route = "dequant";
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("spec->route: dequant: expected mxfp8 or nvfp4 scaling"), std::string::npos)
      << qf_last_error();
  s.route = nullptr;  // NULL: fused
  ASSERT_EQ(qf_gemm_create(&s, &g), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_gemm_workspace_bytes_for(g, 1000, 4, &bytes), QF_OK);
  EXPECT_EQ(bytes, 0);
  qf_gemm_destroy(g);
}

// K-grouped specs (wgrad) straight from the struct (0.4.0): layout and m, k = 0; each field's
// error names it.
TEST_F(CApi, GemmKGroupedSpecWithoutARecipe) {
  qf_gemm* g = nullptr;
  qf_gemm_spec s = blockwise_spec();
  s.scaling = "mxfp8";
  s.scale_layout = "mn_major";
  s.layout = "k_grouped_members";
  s.m = 4096;
  s.n = 7168;
  s.k = 0;
  s.out_dtype = "fp32";
  s.accumulate = 1;
  s.route = "auto";
  ASSERT_EQ(qf_gemm_create(&s, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g),
               "e4m3 x e4m3 mxfp8 (mn_major scales) (auto route) k-grouped (members) M=4096 N=7168 -> fp32 (accumulate)");
  const char* route = nullptr;
  ASSERT_EQ(qf_gemm_route_for(g, 8 * 1024, 8, &route), QF_OK) << qf_last_error();  // h(4096, 7168)
  EXPECT_STREQ(route, "dequant");
  int64_t a = 0, b = 0;  // e8m0 [4096 rows padded to 4, 8192 / 32 + 8 token blocks] each side (mn_major)
  ASSERT_EQ(qf_gemm_scale_bytes(g, 8 * 1024, 8, &a, &b), QF_OK) << qf_last_error();
  EXPECT_EQ(a, 4096 * (8 * 1024 / 32 + 8));
  EXPECT_EQ(b, 7168 * (8 * 1024 / 32 + 8));
  qf_gemm_destroy(g);
  s.layout = "k_grouped";
  s.route = nullptr;
  ASSERT_EQ(qf_gemm_create(&s, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g), "e4m3 x e4m3 mxfp8 (mn_major scales) k-grouped M=4096 N=7168 -> fp32 (accumulate)");
  qf_gemm_destroy(g);
  auto expect_error = [&](const char* what) {
    EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
    EXPECT_NE(std::string(qf_last_error()).find(what), std::string::npos) << qf_last_error();
  };
  s.k = 512;  // K-grouped: K is each group's tokens
  expect_error("spec->k: k-grouped: K is each group's token count, read at run time: expected 0, got 512");
  s.k = 0, s.m = 0;
  expect_error("spec->m: k-grouped: expected the rows of each output in [1, 2^24], got 0");
  s.layout = "wgrad";
  expect_error("spec->layout: expected m_grouped, k_grouped or k_grouped_members, got \"wgrad\"");
  s = blockwise_spec(), s.m = 128;  // m_grouped: rows at run time
  expect_error("spec->m: m-grouped: rows are per group at run time: expected 0, got 128");
}

// "auto": the route per call (qf_gemm_route_for), the workspace following it; no GPU needed.
TEST_F(CApi, GemmAutoRouteNamesItsChoice) {
  qf_gemm* g = nullptr;
  qf_gemm_spec s = blockwise_spec();
  s.scaling = "nvfp4";
  s.n = 4096;
  s.k = 7168;
  s.route = "auto";
  ASSERT_EQ(qf_gemm_create(&s, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g), "e2m1 x e2m1 nvfp4 (auto route) N=4096 K=7168 -> bf16");
  const char* route = nullptr;
  int64_t bytes = -1;
  ASSERT_EQ(qf_gemm_route_for(g, 8 * 128, 8, &route), QF_OK) << qf_last_error();  // few tokens per expert
  EXPECT_STREQ(route, "fused");
  ASSERT_EQ(qf_gemm_workspace_bytes_for(g, 8 * 128, 8, &bytes), QF_OK) << qf_last_error();
  EXPECT_EQ(bytes, 0);
  ASSERT_EQ(qf_gemm_route_for(g, 8 * 4096, 8, &route), QF_OK) << qf_last_error();
  EXPECT_STREQ(route, "dequant");
  ASSERT_EQ(qf_gemm_workspace_bytes_for(g, 8 * 4096, 8, &bytes), QF_OK) << qf_last_error();
  EXPECT_EQ(bytes, 8 * 4096 * 7168 * 2 + 8 * 4096 * 7168 * int64_t(2) + 256);  // fp16 copies of A and B, alpha [8]
  EXPECT_EQ(qf_gemm_workspace_bytes(g, &bytes), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("the auto route's workspace"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_gemm_route_for(g, -1, 8, &route), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "extent: expected 0 <= m_total <= 2^31 - 257, got -1");
  EXPECT_EQ(qf_gemm_route_for(g, 1, 0, &route), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "num_groups: expected 1..1048576, got 0");
  EXPECT_EQ(qf_gemm_route_for(g, 1, 1, nullptr), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "route: must not be NULL");
  qf_gemm_destroy(g);
  s = blockwise_spec(), s.route = "auto";  // nothing to dequantize: the fused kernel, always
  ASSERT_EQ(qf_gemm_create(&s, &g), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_gemm_route_for(g, 1 << 20, 1, &route), QF_OK) << qf_last_error();
  EXPECT_STREQ(route, "fused");
  qf_gemm_destroy(g);
}

TEST_F(CApi, GemmSpecErrorsNameTheField) {
  qf_gemm* g = nullptr;
  qf_gemm_spec s = blockwise_spec();
  s.scaling = nullptr;
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec->scaling: must not be NULL");
  s = blockwise_spec(), s.scaling = "int8";
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec->scaling: expected tensor, rowwise, blockwise, mxfp8, nvfp4, none or channel, got \"int8\"");
  s = blockwise_spec(), s.n = 100;
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("n: expected a multiple of 8"), std::string::npos) << qf_last_error();
  s = blockwise_spec(), s.block_n = 256;
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("tile.block_n"), std::string::npos) << qf_last_error();
  s = blockwise_spec(), s.a_format = "e2m1";
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec->a_format: expected e4m3, e5m2 or int8 (e2m1 with nvfp4 scaling, bf16 / fp16 with none), got e2m1");
  s = blockwise_spec(), s.a_format = "e9m9";
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec->a_format: expected e4m3, e5m2, int8, e2m1 (nvfp4), bf16 or fp16, got \"e9m9\"");
  s = blockwise_spec(), s.a_format = "int8", s.b_format = "e4m3";  // int8 takes an int8 B
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec->b_format: int8 a_format takes int8 here too (s8 x s8 MMAs), got e4m3");
  s.b_format = nullptr;  // ... which is B's default then
  ASSERT_EQ(qf_gemm_create(&s, &g), QF_OK) << qf_last_error();
  EXPECT_EQ(std::string(qf_gemm_describe(g)).rfind("int8 x int8 blockwise", 0), 0u) << qf_gemm_describe(g);
  qf_gemm_destroy(g);
  g = nullptr;
  s = blockwise_spec(), s.accumulate = 2;
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec->accumulate: expected 0 or 1, got 2");
  s = blockwise_spec(), s.scale_layout = "swizzled";
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec->scale_layout: expected compact or mn_major, got \"swizzled\"");
  s = blockwise_spec(), s.scaling = "tensor", s.scale_layout = "mn_major";
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("spec->scale_layout: mn_major scale grids are read by the blockwise and mxfp8 GEMMs only"),
            std::string::npos)
      << qf_last_error();
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(qf_gemm_create(nullptr, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec: must not be NULL");
}

TEST_F(CApi, GemmFromRecipePreparesWithoutAGpu) {
  const std::string p = recipe_path("float8_block_scaling");
  const char* paths[] = {p.c_str()};
  ASSERT_EQ(qf_context_create(paths, 1, &ctx_), QF_OK) << qf_last_error();
  int n = 0;
  ASSERT_EQ(qf_context_num_gemms(ctx_, nullptr, &n), QF_OK) << qf_last_error();
  EXPECT_EQ(n, 8);
  qf_gemm* g = nullptr;
  EXPECT_EQ(qf_gemm_create_from_recipe(ctx_, nullptr, 8, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "index: index 8 out of range: recipe \"float8_block_scaling\" lists 8 gemms");
  // The per-member wgrad entries: each member's scale grid on its own (one partial block more per
  // member), and a workspace for the tensor maps the kernel builds (its size needs the GPU).
  ASSERT_EQ(qf_gemm_create_from_recipe(ctx_, nullptr, 6, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g),
               "e4m3 x e4m3 blockwise (mn_major scales) k-grouped (members) M=4096 N=7168 -> fp32 (accumulate)");
  int64_t ma = 0, mb = 0;
  ASSERT_EQ(qf_gemm_scale_bytes(g, 1000, 8, &ma, &mb), QF_OK);
  EXPECT_EQ(ma, 4096 * (8 + 8) * 4);  // [ceil(k_total/128) + G, m] fp32 (mn_major; m a multiple of 4)
  EXPECT_EQ(mb, 7168 * (8 + 8) * 4);
  EXPECT_EQ(qf_gemm_workspace_bytes(g, nullptr), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "bytes: must not be NULL");
  int64_t ws = -1;
  if (qf_gemm_workspace_bytes(g, &ws) == QF_OK) {
    EXPECT_GT(ws, 0);  // a GPU: (load slots + 1) x 2 tensor maps per persistent CTA
  } else {
    EXPECT_EQ(ws, -1);
    EXPECT_NE(std::string(qf_last_error()), "");
  }
  qf_gemm_destroy(g);
  // The wgrad entries: K-grouped, scales per row along the tokens (extent = k_total).
  ASSERT_EQ(qf_gemm_create_from_recipe(ctx_, nullptr, 4, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g), "e4m3 x e4m3 blockwise (mn_major scales) k-grouped M=4096 N=7168 -> fp32 (accumulate)");
  int64_t ka = 0, kb = 0;
  ASSERT_EQ(qf_gemm_scale_bytes(g, 1000, 8, &ka, &kb), QF_OK);
  EXPECT_EQ(ka, 4096 * 8 * 4);  // [ceil(k_total/128), m] fp32 (mn_major)
  EXPECT_EQ(kb, 7168 * 8 * 4);  // [N, ceil(k_total/128)] fp32
  qf_gemm_destroy(g);
  EXPECT_EQ(qf_gemm_create_from_recipe(ctx_, "nope", 0, &g), QF_ERR_USER);
  ASSERT_EQ(qf_gemm_create_from_recipe(ctx_, "float8_block_scaling", 1, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g), "e4m3 x e4m3 blockwise N=7168 K=2048 -> bf16");
  int64_t none = -1;
  ASSERT_EQ(qf_gemm_workspace_bytes(g, &none), QF_OK) << qf_last_error();  // no GPU needed
  EXPECT_EQ(none, 0);
  int64_t sa = 0, sb = 0;
  ASSERT_EQ(qf_gemm_scale_bytes(g, 1000, 8, &sa, &sb), QF_OK);
  EXPECT_EQ(sa, 1000 * 16 * 4);     // [m_total, K/128] fp32
  EXPECT_EQ(sb, 8 * 56 * 16 * 4);   // [G, N/128, K/128] fp32
  EXPECT_EQ(qf_gemm_prepare(g, "sm_100a"), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("sm_90a"), std::string::npos) << qf_last_error();
  EXPECT_EQ(qf_gemm_prepare(g, "sm_90a"), QF_OK) << qf_last_error();
  // Without a GPU (or with short buffers) a run fails cleanly, naming what is wrong.
  qf_gemm_args a{};
  a.m_total = 100, a.num_groups = 8;
  EXPECT_EQ(qf_gemm_run(g, &a, nullptr), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "argument group_offsets: null pointer; expected a device buffer of 72 bytes for int64 [num_groups + 1]");
  EXPECT_EQ(qf_gemm_run(g, nullptr, nullptr), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "args: must not be NULL");
  qf_gemm_destroy(g);

  qf_gemm_spec mx{};
  mx.scaling = "mxfp8", mx.n = 256, mx.k = 512;
  ASSERT_EQ(qf_gemm_create(&mx, &g), QF_OK) << qf_last_error();
  ASSERT_EQ(qf_gemm_scale_bytes(g, 10, 3, &sa, &sb), QF_OK);
  EXPECT_EQ(sa, 10 * 16);       // [m_total, K/32] e8m0
  EXPECT_EQ(sb, 3 * 256 * 16);  // [G, N, K/32] e8m0
  qf_gemm_destroy(g);
  mx.scale_layout = "mn_major";  // A per group (up to 3 padding rows each), B per expert
  ASSERT_EQ(qf_gemm_create(&mx, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g), "e4m3 x e4m3 mxfp8 (mn_major scales) N=256 K=512 -> bf16");
  ASSERT_EQ(qf_gemm_scale_bytes(g, 10, 3, &sa, &sb), QF_OK);
  EXPECT_EQ(sa, (10 + 3 * 3) * 16);  // [K/32, m_total + 3 G] e8m0
  EXPECT_EQ(sb, 3 * 16 * 256);       // [G, K/32, N] e8m0
  qf_gemm_destroy(g);
}

TEST_F(CApi, Nvfp4GemmFromRecipe) {
  const std::string p = recipe_path("nvfp4");
  const char* paths[] = {p.c_str()};
  ASSERT_EQ(qf_context_create(paths, 1, &ctx_), QF_OK) << qf_last_error();
  int n = 0;
  ASSERT_EQ(qf_context_num_gemms(ctx_, nullptr, &n), QF_OK) << qf_last_error();
  EXPECT_EQ(n, 8);  // fprop, dgrad and wgrad (one tensor's copies, and per-member copies) of both projections
  qf_gemm* g = nullptr;
  ASSERT_EQ(qf_gemm_create_from_recipe(ctx_, nullptr, 4, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g), "e2m1 x e2m1 nvfp4 (auto route) k-grouped M=4096 N=7168 -> fp32 (accumulate)");
  int64_t ka = 0, kb = 0;
  ASSERT_EQ(qf_gemm_scale_bytes(g, 1056, 8, &ka, &kb), QF_OK);  // K-grouped: the extent is k_total
  EXPECT_EQ(ka, 4096 * 66);  // [m, k_total/16] e4m3
  EXPECT_EQ(kb, 7168 * 66);  // [N, k_total/16] e4m3
  qf_gemm_destroy(g);
  ASSERT_EQ(qf_gemm_create_from_recipe(ctx_, nullptr, 0, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g), "e2m1 x e2m1 nvfp4 (auto route) N=4096 K=7168 -> bf16");
  int64_t sa = 0, sb = 0;
  ASSERT_EQ(qf_gemm_scale_bytes(g, 10, 3, &sa, &sb), QF_OK);
  EXPECT_EQ(sa, 10 * 448);         // [m_total, K/16] e4m3
  EXPECT_EQ(sb, 3 * 4096 * 448);   // [G, N, K/16] e4m3
  // Packed operands: A is K/2 bytes per row; the amax arrays are required.
  qf_gemm_args a{};
  a.m_total = 10, a.num_groups = 1;
  a.group_offsets = reinterpret_cast<const int64_t*>(0x10000);
  a.a = reinterpret_cast<const void*>(0x100000), a.a_bytes = 10 * 3584 - 1;
  EXPECT_EQ(qf_gemm_run(g, &a, nullptr), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "argument a: buffer of 35839 bytes is smaller than the 35840 bytes required for A [10, 7168] e2m1 packed two per byte");
  qf_gemm_destroy(g);
  qf_gemm_spec s{};
  s.scaling = "nvfp4", s.n = 256, s.k = 512, s.a_format = "e4m3";
  EXPECT_EQ(qf_gemm_create(&s, &g), QF_ERR_USER);
  EXPECT_STREQ(qf_last_error(), "spec->a_format: nvfp4 scaling: expected e2m1, got e4m3");
  s.a_format = nullptr;  // e2m1 by default with nvfp4
  ASSERT_EQ(qf_gemm_create(&s, &g), QF_OK) << qf_last_error();
  EXPECT_STREQ(qf_gemm_describe(g), "e2m1 x e2m1 nvfp4 N=256 K=512 -> bf16");
  qf_gemm_destroy(g);
}

// On a GPU: small-integer operands (every partial sum exact), bit for bit against the reference,
// contiguous and masked layouts.
TEST_F(CApi, GemmOnGpuIsExact) {
  QF_SKIP_WITHOUT_GPU();
  using qf::rt::DeviceBuffer;
  for (const char* scaling : {"blockwise", "mxfp8", "nvfp4"}) {
    for (bool masked : {false, true}) {
      SCOPED_TRACE(std::string(scaling) + (masked ? " masked" : " contiguous"));
      qf_gemm_spec cs{};
      cs.scaling = scaling, cs.n = 200, cs.k = 384, cs.out_dtype = "fp32";
      qf_gemm* g = nullptr;
      ASSERT_EQ(qf_gemm_create(&cs, &g), QF_OK) << qf_last_error();
      qf::GemmSpec spec;
      spec.scaling = *qf::parse_gemm_scaling(scaling), spec.n = 200, spec.k = 384, spec.out_dtype = qf::DType::FP32;
      if (spec.scaling == qf::GemmScaling::Nvfp4) spec.a_format = spec.b_format = qf::ElemFormat::E2M1;
      const std::vector<int64_t> rows = {37, 0, 150};
      const qf::ref::GemmProblem p =
          masked ? qf::ref::make_masked_gemm_problem(spec, rows, 128, qf::ref::GemmValues::SmallIntegers, true, 3)
                 : qf::ref::make_gemm_problem(spec, rows, 4, qf::ref::GemmValues::SmallIntegers, true, 3);
      auto up = [](const void* d, size_t bytes) {
        DeviceBuffer b(std::max<size_t>(bytes, 16));
        if (bytes) b.upload(d, bytes);
        return b;
      };
      DeviceBuffer da = up(p.a.data(), p.a.size()), db = up(p.b.data(), p.b.size());
      DeviceBuffer dsa = up(p.a_scale.data(), p.a_scale.size()), dsb = up(p.b_scale.data(), p.b_scale.size());
      DeviceBuffer dal = up(p.alpha.data(), p.alpha.size() * 4);
      DeviceBuffer daa = up(p.a_amax.data(), p.a_amax.size() * 4), dba = up(p.b_amax.data(), p.b_amax.size() * 4);
      DeviceBuffer doff = masked ? up(p.counts.data(), p.counts.size() * 8) : up(p.offsets.data(), p.offsets.size() * 8);
      DeviceBuffer dd = qf::rt::testing::poisoned_buffer(size_t(p.m_total * 200 * 4));
      int64_t sa = 0, sb = 0;
      ASSERT_EQ(qf_gemm_scale_bytes(g, p.m_total, 3, &sa, &sb), QF_OK);
      ASSERT_EQ(size_t(sa), p.a_scale.size());
      ASSERT_EQ(size_t(sb), p.b_scale.size());
      qf_gemm_args a{};
      a.a = reinterpret_cast<const void*>(da.address()), a.a_bytes = int64_t(p.a.size());
      a.b = reinterpret_cast<const void*>(db.address()), a.b_bytes = int64_t(p.b.size());
      a.d = reinterpret_cast<void*>(dd.address()), a.d_bytes = p.m_total * 200 * 4;
      a.a_scale = reinterpret_cast<const void*>(dsa.address()), a.a_scale_bytes = sa;
      a.b_scale = reinterpret_cast<const void*>(dsb.address()), a.b_scale_bytes = sb;
      a.alpha = reinterpret_cast<const float*>(dal.address());
      if (spec.scaling == qf::GemmScaling::Nvfp4) {
        ASSERT_EQ(p.a_amax.size(), 3u);
        a.a_amax = reinterpret_cast<const float*>(daa.address());
        a.b_amax = reinterpret_cast<const float*>(dba.address());
      }
      if (masked) a.group_counts = reinterpret_cast<const int64_t*>(doff.address()), a.m_max = 128;
      else a.group_offsets = reinterpret_cast<const int64_t*>(doff.address());
      a.m_total = p.m_total, a.num_groups = 3;
      ASSERT_EQ(qf_gemm_run(g, &a, nullptr), QF_OK) << qf_last_error();
      std::vector<float> got(size_t(p.m_total * 200));
      dd.download(got.data(), got.size() * 4);
      std::vector<int64_t> all(size_t(p.m_total));
      for (int64_t r = 0; r < p.m_total; ++r) all[size_t(r)] = r;
      const qf::ref::GemmRows ref = qf::ref::gemm_reference(spec, p.operands(), all);
      int64_t bad = 0;
      for (int64_t r = 0; r < p.m_total; ++r)
        for (int64_t c = 0; c < 200; ++c) {
          uint32_t bits;
          std::memcpy(&bits, &got[size_t(r * 200 + c)], 4);
          const uint32_t want = ref.group[size_t(r)] < 0 ? 0xFFFFFFFFu
                                                          : qf::ref::exact_output(spec, ref.value[size_t(r * 200 + c)], 0.0f);
          bad += bits != want;
        }
      EXPECT_EQ(bad, 0);
      qf_gemm_destroy(g);
    }
  }
}

// The header is plain C: compile it with the C compiler, when there is one.
TEST_F(CApi, HeaderCompilesAsC) {
  if (std::system("command -v cc > /dev/null 2>&1") != 0) GTEST_SKIP() << "no C compiler";
  const std::string cmd = std::string("cc -std=c99 -Wall -Wextra -Werror -pedantic -fsyntax-only -x c ") +
                          QF_SOURCE_DIR + "/runtime/qforge.h";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
