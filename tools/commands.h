// The qforge subcommands. Each takes its arguments (after the subcommand name) and returns the
// process exit code; user errors propagate as qf::UserError (exit 2).
#pragma once
#include <string>
#include <vector>

namespace qf::cli {
using Argv = std::vector<std::string>;
int cmd_check(const Argv& args);
int cmd_inspect(const Argv& args);
int cmd_quantize(const Argv& args);
int cmd_list(const Argv& args);    // tools/cmd_cache.cpp
int cmd_verify(const Argv& args);
int cmd_clear(const Argv& args);
int cmd_prewarm(const Argv& args);  // tools/cmd_prewarm.cpp
int cmd_tune(const Argv& args);     // tools/cmd_tune.cpp
int cmd_gemm(const Argv& args);     // tools/cmd_gemm.cpp
}  // namespace qf::cli
