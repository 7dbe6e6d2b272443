// A recipe file, parsed and validated (docs/recipes.md; schema: recipes/recipe.schema.json).
// Everything in here has been checked: formats, modes and numbers are enums and ranges, never
// raw strings that could reach generated source.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/formats.h"
#include "compiler/gemm_codegen.h"

namespace qf {

enum class Direction : uint8_t { Rowwise, Columnwise };
enum class Rounding : uint8_t { Nearest, Stochastic };
// Data layout of the columnwise copy: transposed [K, M] (Hopper K-major GEMMs) or the same
// [M, K] layout as the input (Blackwell-style MXFP8 columnwise).
enum class DataLayout : uint8_t { RowMajor, Transposed };
enum class Usage : uint8_t { Training, Inference, Memory };

std::string_view name(Direction d);
std::string_view name(Rounding r);
std::string_view name(DataLayout l);
std::string_view name(ScaleLayout l);
std::string_view name(Usage u);
std::optional<Usage> parse_usage(std::string_view s);

struct Rht {
  uint32_t sign_mask = 0xD7E8;
  bool operator==(const Rht&) const = default;
};

// One direction (rowwise or columnwise) of one role.
struct DirectionSpec {
  ElemFormat format = ElemFormat::Identity;
  Scaling scaling = NoScaling{};
  Rounding rounding = Rounding::Nearest;
  std::optional<Rht> rht;
  DataLayout layout = DataLayout::RowMajor;
  ScaleLayout scale_layout = ScaleLayout::Compact;
  std::optional<DType> out_dtype;  // identity only; empty = the input dtype
  bool operator==(const DirectionSpec&) const = default;
};

// A role pattern: module_type:tensor_type[:name], each part a name or "*".
struct RolePattern {
  std::array<std::string, 3> parts{"*", "*", "*"};
  int specificity() const;  // number of non-wildcard parts
  bool matches(const std::array<std::string, 3>& role) const;
  std::string str() const;
};

struct RoleRule {
  std::vector<RolePattern> patterns;
  std::optional<DirectionSpec> rowwise;
  std::optional<DirectionSpec> columnwise;
  std::string pointer;  // JSON pointer of this rule, e.g. /roles/2
  const std::optional<DirectionSpec>& spec(Direction d) const {
    return d == Direction::Rowwise ? rowwise : columnwise;
  }
};

// A GEMM the recipe's user will run on the quantized operands ("gemms" in the recipe):
// `qforge prewarm` compiles it next to the quantize kernels.
struct RecipeGemm {
  GemmSpec spec;        // validated (validate(spec) passed)
  std::string pointer;  // JSON pointer, e.g. /gemms/1
};

struct Recipe {
  static constexpr int kVersion = 1;
  std::string name;
  std::string comment;
  Usage usage = Usage::Training;
  std::vector<RoleRule> roles;
  std::vector<RecipeGemm> gemms;
};

// Parses and validates recipe text. Throws UserError whose where() is a JSON pointer.
Recipe parse_recipe(std::string_view json_text);
// Reads and parses a file; errors are prefixed with the path.
Recipe load_recipe(const std::filesystem::path& path);

// Splits "linear:weight[:name]" into three parts (missing name = "*"). UserError if malformed.
std::array<std::string, 3> parse_role(std::string_view role, std::string_view where = "role");

struct ResolvedRole {
  const RoleRule* rule;
  const RolePattern* pattern;  // the pattern that matched
};
// The most specific rule matching `role`; a tie between rules is a UserError naming both.
ResolvedRole resolve_role(const Recipe& recipe, std::string_view role);

// The canonical roles frameworks ask for (used by `qforge check` and `qforge prewarm`).
std::span<const std::string_view> standard_roles();

}  // namespace qf
