#pragma once
#include "compiler/ir.h"

namespace qf {
// Drops the streams the plan's usage does not need:
//   training  - rowwise (fprop) and columnwise (dgrad/wgrad) both;
//   inference - rowwise only (the forward GEMM's operand);
//   memory    - both, except a columnwise copy that a consumer can derive from the rowwise
//               one bit for bit (same format and scale per element, no RHT or SR).
// A usage that needs a direction the role's rule does not define is a UserError.
Plan prune_usage(Plan plan);
}
