// qforge: the command-line tool. `qforge help` lists the subcommands.
#include <iostream>
#include <string>

#include "compiler/error.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc.h"
#include "tools/commands.h"

namespace qf::cli {

// qforge's version, the NVRTC it compiles with, and the kernel cache's format and device-header
// hash: what keys every cached kernel, and what a bug report needs.
int cmd_version(const qf::cli::Argv& args) {
  if (!args.empty()) throw qf::UserError(args[0], "version takes no arguments");
  std::cout << "qforge " << QFORGE_VERSION << "\n"
            << "nvrtc " << qf::rt::nvrtc_version() << "\n"
            << "kernel cache " << qf::rt::kCacheDirName << " (schema " << qf::rt::kCacheSchemaVersion
            << "), device headers " << qf::rt::templates_hash().substr(0, 16) << "\n";
  return 0;
}

}  // namespace qf::cli

int main(int argc, char** argv) {
  using namespace qf::cli;
  if (argc < 2) {  // no command: the overview, as an error
    print_overview(std::cout);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h") cmd = "help";
  const Argv args(argv + 2, argv + argc);
  const Command* c = find_command(cmd);
  try {
    if (!c) throw qf::UserError("", "unknown command \"" + cmd + "\" (see qforge help)");
    // --help or -h anywhere after the command prints its usage instead of running it, before
    // any other argument is looked at (so `qforge gemm --scaling x --help` is help, not an error).
    for (const std::string& a : args)
      if (a == "--help" || a == "-h") {
        print_usage(std::cout, *c);
        return 0;
      }
    return c->run(args);
  } catch (const qf::UserError& e) {
    std::cerr << "qforge " << cmd << ": error: " << e.what() << "\n";
    return 2;
  } catch (const qf::InternalError& e) {
    std::cerr << "qforge " << cmd << ": " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "qforge " << cmd << ": internal error: " << e.what() << "\n";
    return 3;
  }
}
