// Test helpers shared by the quantize -> GEMM tests (CPU: quantize_gemm_test.cpp, GPU:
// gpu_quantize_gemm_test.cpp): random bf16 inputs, the CPU reference's quantize outputs by
// buffer name, a stream's per-tensor amaxes, relative errors.
#pragma once
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "qforge/numerics.cuh"
#include "reference/executor.h"

namespace qf::testing {

// Random normal bf16 [rows, cols], a different scale per row.
inline ref::HostTensor random_bf16(int64_t rows, int64_t cols, uint32_t seed) {
  ref::HostTensor t;
  t.dtype = DType::BF16;
  t.shape = {rows, cols};
  t.bytes.resize(size_t(rows * cols * 2));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> row_scale(0.25f, 4.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = row_scale(rng);
    for (int64_t c = 0; c < cols; ++c) {
      const u16 h = f32_to_bf16(normal(rng) * s);
      std::memcpy(&t.bytes[size_t((r * cols + c) * 2)], &h, 2);
    }
  }
  return t;
}

inline const ref::Output& output(const std::vector<ref::Output>& outs, const std::string& name) {
  for (const auto& o : outs)
    if (o.desc.name == name) return o;
  throw std::runtime_error("no output buffer " + name);
}
// The per-tensor amax buffer of the rowwise (or columnwise) stream, when the plan has one.
inline std::vector<float> amax_of(const std::vector<ref::Output>& outs, const std::string& dir) {
  for (const auto& o : outs) {
    if (o.desc.name != dir + "_amax" && o.desc.name != "amax") continue;
    std::vector<float> v(o.bytes.size() / 4);
    std::memcpy(v.data(), o.bytes.data(), o.bytes.size());
    return v;
  }
  return {};
}

// A shipped recipe by name, or with "good/" a test recipe of tests/recipes/good/.
inline Recipe shipped_recipe(const std::string& name) {
  const std::filesystem::path src(QF_SOURCE_DIR);
  if (name.rfind("good/", 0) == 0) return load_recipe(src / "tests/recipes" / (name + ".json"));
  return load_recipe(src / "recipes" / (name + ".json"));
}

// The scale layout the recipe's own GEMM entries of this scaling and layout read (compact where it
// lists none): a recipe's quantize outputs and its GEMMs must agree on it.
inline ScaleLayout recipe_gemm_scale_layout(const Recipe& r, GemmScaling scaling, GemmLayout layout) {
  ScaleLayout l = ScaleLayout::Compact;
  for (const RecipeGemm& g : r.gemms)
    if (g.spec.scaling == scaling && g.spec.layout == layout) l = g.spec.scale_layout;
  return l;
}
// The grouped plan of a role (one member per split), for training unless told otherwise.
inline Plan grouped_plan(const Recipe& r, const std::string& role, Usage usage = Usage::Training) {
  return compile_plan(r, PlanRequest{role, DType::BF16, usage, true});
}
// The CPU reference's grouped quantize of x (seed 11, offset 0 for stochastic rounding).
inline std::vector<ref::Output> quantize_with(const Recipe& r, const std::string& role, const ref::HostTensor& x,
                                              std::span<const int64_t> splits, Usage usage = Usage::Training) {
  ref::QuantizeParams params;
  params.seed = 11, params.offset = 0;
  return ref::quantize_grouped(grouped_plan(r, role, usage), x, splits, params);
}

inline double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) e += (got[i] - want[i]) * (got[i] - want[i]), w += want[i] * want[i];
  return std::sqrt(e / w);
}

}  // namespace qf::testing
