// The qforge subcommands. Each takes its arguments (after the subcommand name) and returns the
// process exit code; user errors propagate as qf::UserError (exit 2).
#pragma once
#include <iosfwd>
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
int cmd_version(const Argv& args);  // tools/main.cpp
int cmd_help(const Argv& args);     // tools/usage.cpp

// One subcommand: its entry point and its usage text, defined once (tools/usage.cpp). main()
// dispatches through the table, so a command cannot exist without its help.
struct Command {
  const char* name;
  int (*run)(const Argv&);
  const char* synopsis;  // what follows "qforge <name>", one line per '\n' (printed aligned)
  const char* summary;   // one line: the overview's, and the second paragraph of --help
  const char* details;   // what the options mean (lines of at most 100 columns); may be empty
};
const Command* find_command(const std::string& name);  // nullptr when unknown; "--version" is version
void print_overview(std::ostream& os);                  // qforge help
void print_usage(std::ostream& os, const Command& c);   // qforge <command> --help
}  // namespace qf::cli
