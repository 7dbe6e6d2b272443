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

// "4096x7168" -> {4096, 7168}; UserError naming `flag` otherwise (M and K must be positive).
inline Shape2D parse_shape(const std::string& flag, const std::string& text) {
  const auto x = text.find('x');
  Shape2D s;
  try {
    size_t used_m = 0, used_k = 0;
    if (x == std::string::npos) throw std::invalid_argument("");
    s = {std::stoll(text.substr(0, x), &used_m), std::stoll(text.substr(x + 1), &used_k)};
    if (used_m != x || used_k != text.size() - x - 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw UserError(flag, "expected MxK, e.g. 4096x4096, got \"" + text + "\"");
  }
  if (s.m <= 0 || s.k <= 0) throw UserError(flag, "expected positive M and K, got \"" + text + "\"");
  return s;
}

// "512,0,1024" -> {512, 0, 1024}: member (group) row counts; UserError naming `flag` unless
// every item is an integer >= 0 and there is at least one.
inline std::vector<int64_t> parse_row_counts(const std::string& flag, const std::string& text) {
  std::vector<int64_t> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t used = 0;
      const long long x = std::stoll(item, &used);
      if (used != item.size() || x < 0) throw std::invalid_argument("");
      v.push_back(x);
    } catch (const std::exception&) {
      throw UserError(flag, "expected comma-separated row counts >= 0, got \"" + text + "\"");
    }
  }
  if (v.empty()) throw UserError(flag, "expected at least one group");
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
