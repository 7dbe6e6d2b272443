// Argument helpers shared by the qforge subcommands (parse_dtype_arg / parse_usage_arg are
// defined in cmd_inspect.cpp; the inline ones are also used by bench/qforge_bench).
#pragma once
#include <algorithm>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/buffers.h"

#include "compiler/formats.h"
#include "compiler/recipe.h"
#include "tools/args.h"

namespace qf::cli {

// --dtype-style flag: bf16 (default when absent), fp16 or fp32.
DType parse_dtype_arg(const Args& args, const std::string& flag);
// --usage: training, inference or memory; empty when absent (the recipe's default).
std::optional<Usage> parse_usage_arg(const Args& args);

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_list(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

// "4096x7168" -> {4096, 7168}; UserError naming `flag` otherwise (M and K decimal, in [1, 2^31]).
inline Shape2D parse_shape(const std::string& flag, const std::string& text) {
  const auto x = text.find('x');
  const std::optional<int64_t> m = x == std::string::npos ? std::nullopt : Args::decimal(text.substr(0, x));
  const std::optional<int64_t> k = x == std::string::npos ? std::nullopt : Args::decimal(text.substr(x + 1));
  if (!m || !k) throw UserError(flag, "expected MxK, e.g. 4096x4096, got \"" + text + "\"");
  if (*m <= 0 || *k <= 0 || *m > kMaxDim || *k > kMaxDim)
    throw UserError(flag, "expected M and K in [1, 2^31], got \"" + text + "\"");
  return Shape2D{*m, *k};
}

// "512,0,1024" -> {512, 0, 1024}: member (group) row counts; UserError naming `flag` unless
// every item is a decimal integer in [0, 2^31] and there is at least one.
inline std::vector<int64_t> parse_row_counts(const std::string& flag, const std::string& text) {
  std::vector<int64_t> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const std::optional<int64_t> x = Args::decimal(item);
    if (!x || *x < 0 || *x > kMaxDim)
      throw UserError(flag, "expected comma-separated row counts in [0, 2^31], got \"" + text + "\"");
    v.push_back(*x);
  }
  if (v.empty()) throw UserError(flag, "expected at least one group");
  if (text.back() == ',') throw UserError(flag, "expected comma-separated row counts in [0, 2^31], got \"" + text + "\"");
  return v;
}

// Recipe files named on the command line: files as given, directories expanded to their *.json
// (except recipe.schema.json), sorted. UserError when nothing is found.
inline std::vector<std::filesystem::path> recipe_files(const std::vector<std::string>& args) {
  std::vector<std::filesystem::path> files;
  for (const auto& p : args) {
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> found;
      for (const auto& e : std::filesystem::directory_iterator(p))
        if (e.path().extension() == ".json" && e.path().filename() != "recipe.schema.json") found.push_back(e.path());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.emplace_back(p);
    }
  }
  if (files.empty()) throw UserError("recipes", "no recipe files found");
  return files;
}

}  // namespace qf::cli
