// The plans of the shipped recipes (recipes/*.json): what the tests that walk every shipped
// recipe x role x usage start from. No GPU needed.
#pragma once
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"

namespace qf::testing {

// The shipped recipes' names (file stems), sorted.
inline std::vector<std::string> shipped_recipe_names() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(QF_SOURCE_DIR) + "/recipes")) {
    const auto& path = entry.path();
    if (path.extension() == ".json" && path.filename() != "recipe.schema.json") names.push_back(path.stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct ShippedPlan {
  std::string recipe, role;
  Usage usage;
  DType dtype;
  Plan plan;
  std::string label() const { return recipe + " " + role + " " + std::string(name(usage)); }  // "nvfp4 linear:input training"
};

// Every plan the shipped recipes serve for these roles, usages (training, inference) and input
// dtypes, recipe by recipe in name order; `only` keeps one recipe. A role or usage a recipe does
// not define (compile_plan's UserError) is left out.
inline std::vector<ShippedPlan> shipped_plans(const std::vector<const char*>& roles, bool grouped = false,
                                              const std::vector<DType>& dtypes = {DType::BF16},
                                              const std::string& only = "") {
  std::vector<ShippedPlan> out;
  for (const std::string& recipe : shipped_recipe_names()) {
    if (!only.empty() && recipe != only) continue;
    const Recipe r = load_recipe(std::string(QF_SOURCE_DIR) + "/recipes/" + recipe + ".json");
    for (const char* role : roles)
      for (Usage u : {Usage::Training, Usage::Inference})
        for (DType d : dtypes) {
          try {
            out.push_back({recipe, role, u, d, compile_plan(r, PlanRequest{role, d, u, grouped})});
          } catch (const UserError&) {
            // the recipe does not serve this role or usage
          }
        }
  }
  return out;
}

inline const std::vector<const char*> kLinearRoles = {"linear:input", "linear:weight", "linear:grad_output"};
inline const std::vector<const char*> kGroupedRoles = {"grouped_linear:input", "grouped_linear:weight",
                                                      "grouped_linear:grad_output"};

}  // namespace qf::testing
