// qforge: the command-line tool. `qforge help` lists the subcommands.
#include <cstring>
#include <iostream>
#include <map>

#include "compiler/error.h"
#include "tools/commands.h"

namespace {

const char* kUsage = R"(usage: qforge <command> [options]

commands:
  check <recipe.json>...            validate recipes; print how the standard roles resolve
  inspect <recipe.json> --role R    print the kernel plan for one role
          [--dtype bf16|fp16|fp32] [--usage training|inference|memory] [--grouped]
          [--dump-after PASS|all]
  quantize --recipe R --role ROLE --input x.npy --out DIR
          [--usage U] [--seed S] [--offset O] [--scale F] [--dtype bf16]
                                    quantize a tensor on the CPU reference, writing .npy files
  help                              this text

exit codes: 0 ok, 1 check found problems, 2 bad input (recipe, arguments, files), 3 internal error
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace qf::cli;
  if (argc < 2 || !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::map<std::string, int (*)(const Argv&)> commands = {
      {"check", cmd_check}, {"inspect", cmd_inspect}, {"quantize", cmd_quantize}};
  const std::string cmd = argv[1];
  Argv args(argv + 2, argv + argc);
  auto it = commands.find(cmd);
  try {
    if (it == commands.end()) throw qf::UserError("", "unknown command \"" + cmd + "\" (see qforge help)");
    return it->second(args);
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
