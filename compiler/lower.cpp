#include "compiler/lower.h"

#include "compiler/error.h"

namespace qf {

Plan lower(const Recipe& recipe, const PlanRequest& req) {
  const ResolvedRole rr = resolve_role(recipe, req.role);
  Plan p;
  p.recipe = recipe.name;
  p.role = req.role;
  p.input = req.input;
  p.usage = req.usage.value_or(recipe.usage);
  p.grouped = req.grouped;
  for (Direction d : {Direction::Rowwise, Direction::Columnwise})
    if (const auto& spec = rr.rule->spec(d)) p.streams.push_back(make_stream(d, *spec, req.input, p.amax));
  return p;
}

}  // namespace qf
