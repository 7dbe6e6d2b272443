// qforge check <recipe>...: parse and validate recipes, then resolve the standard roles and
// compile each one's plan for the recipe's usage, printing one line per role.
#include <iostream>
#include <sstream>

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
    // The roles first, so that the recipe's line says whether it is ok; --quiet prints only the
    // roles with a problem (the exit status does not depend on it).
    std::ostringstream lines;
    int recipe_problems = 0;
    for (const auto& role : roles) {
      try {
        const ResolvedRole rr = resolve_role(r, role);
        const Plan p = compile_plan(r, PlanRequest{role, DType::BF16, std::nullopt, false});
        if (args.flag("--quiet")) continue;
        lines << "  " << role << " -> " << rr.rule->pointer << " (\"" << rr.pattern->str() << "\"):";
        for (const auto& s : p.streams) {
          lines << " " << name(s.dir) << "=" << traits(s.format).name << "/" << scaling_name(s.scaling);
          if (s.rht) lines << "+rht";
          if (s.rounding == Rounding::Stochastic) lines << "+sr";
        }
        lines << "\n";
      } catch (const UserError& e) {
        // A role the recipe does not cover is information, not a problem of the recipe; a tie
        // or a usage the rule cannot serve is.
        const std::string msg = e.what();
        const bool uncovered = msg.find("no rule of recipe") != std::string::npos;
        if (!uncovered) ++recipe_problems;
        if (!uncovered || !args.flag("--quiet"))
          lines << "  " << role << " -> " << (uncovered ? "(not covered)" : "error: " + msg) << "\n";
      }
    }
    if (!args.flag("--quiet"))
      for (const auto& g : r.gemms) lines << "  gemm " << g.pointer << ": " << describe(g.spec) << "\n";
    std::cout << path << ": "
              << (recipe_problems ? std::to_string(recipe_problems) + (recipe_problems == 1 ? " problem" : " problems")
                                  : std::string("ok"))
              << ": recipe \"" << r.name << "\", " << r.roles.size() << " rule" << (r.roles.size() == 1 ? "" : "s")
              << ", usage " << name(r.usage) << "\n"
              << lines.str();
    problems += recipe_problems;
  }
  return problems ? 1 : 0;
}

}  // namespace qf::cli
