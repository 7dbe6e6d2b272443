#pragma once
#include "compiler/ir.h"

namespace qf {
// Orders the work into kernels: one amax_reduce phase for the reductions that must finish
// before any element is cast (tensor amax of current scaling and NVFP4, channel amax), then
// the cast phase, which also computes block amaxes tile by tile and reports delayed-scaling
// amaxes. A plan with nothing to reduce up front is a single fused kernel.
Plan schedule_phases(Plan plan);
}
