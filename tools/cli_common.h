// Argument helpers shared by the qforge subcommands (defined in cmd_inspect.cpp).
#pragma once
#include <optional>
#include <string>

#include "compiler/formats.h"
#include "compiler/recipe.h"
#include "tools/args.h"

namespace qf::cli {

// --dtype-style flag: bf16 (default when absent), fp16 or fp32.
DType parse_dtype_arg(const Args& args, const std::string& flag);
// --usage: training, inference or memory; empty when absent (the recipe's default).
std::optional<Usage> parse_usage_arg(const Args& args);

}  // namespace qf::cli
