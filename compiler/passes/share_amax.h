#pragma once
#include "compiler/ir.h"

namespace qf {
// Merges amax sources that compute the same reduction (same scope, block and RHT): e.g. the
// per-tensor amax of current scaling in both directions, or the 128x128 tile amax of 2D block
// scaling shared by rowwise and columnwise. The fused kernel then reduces once.
Plan share_amax(Plan plan);
}
