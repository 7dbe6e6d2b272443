// qforge check <recipe>...: parse and validate recipes, then resolve the standard roles and
// compile each one's plan for the recipe's usage, printing one line per role.
#include <iostream>

#include "compiler/pipeline.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace qf::cli {

int cmd_check(const Argv& argv) {
  Args args(argv, {"--role"}, {"--quiet"});
  if (args.positional().empty()) throw UserError("recipe", "expected at least one recipe file");
  std::vector<std::string> roles = args.all("--role");
  if (roles.empty())
    for (auto r : standard_roles()) roles.emplace_back(r);
  int problems = 0;
  for (const auto& path : args.positional()) {
    Recipe r;
    try {
      r = load_recipe(path);
    } catch (const UserError& e) {
      if (args.positional().size() == 1) throw;
      std::cerr << "qforge check: error: " << e.what() << "\n";
      ++problems;
      continue;
    }
    std::cout << path << ": ok: recipe \"" << r.name << "\", " << r.roles.size() << " rule"
              << (r.roles.size() == 1 ? "" : "s") << ", usage " << name(r.usage) << "\n";
    if (args.flag("--quiet")) continue;
    for (const auto& role : roles) {
      std::cout << "  " << role << " -> ";
      try {
        const ResolvedRole rr = resolve_role(r, role);
        const Plan p = compile_plan(r, PlanRequest{role, DType::BF16, std::nullopt, false});
        std::cout << rr.rule->pointer << " (\"" << rr.pattern->str() << "\"):";
        for (const auto& s : p.streams) {
          std::cout << " " << name(s.dir) << "=" << traits(s.format).name << "/" << scaling_name(s.scaling);
          if (s.rht) std::cout << "+rht";
          if (s.rounding == Rounding::Stochastic) std::cout << "+sr";
        }
        std::cout << "\n";
      } catch (const UserError& e) {
        // A role the recipe does not cover is information, not a problem of the recipe; a tie
        // or a usage the rule cannot serve is.
        const std::string msg = e.what();
        const bool uncovered = msg.find("no rule of recipe") != std::string::npos;
        std::cout << (uncovered ? "(not covered)" : "error: " + msg) << "\n";
        if (!uncovered) ++problems;
      }
    }
    for (const auto& g : r.gemms) std::cout << "  gemm " << g.pointer << ": " << describe(g.spec) << "\n";
  }
  return problems ? 1 : 0;
}

}  // namespace qf::cli
