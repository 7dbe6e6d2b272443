// Recipe + request -> the initial plan: one stream per direction the role's rule defines
// (both directions, whatever the usage: prune_usage drops what the usage does not need), each
// with its own amax sources (share_amax merges them).
#pragma once
#include "compiler/ir.h"

namespace qf {
Plan lower(const Recipe& recipe, const PlanRequest& request);
}
