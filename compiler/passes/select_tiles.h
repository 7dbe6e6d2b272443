#pragma once
#include "compiler/ir.h"

namespace qf {
// Chooses the cast kernel's tile: a multiple of every block the plan computes an amax over
// (and of the RHT's 16-row groups), square when a transposed copy is written (so both the
// read and the transposed write are coalesced), wide and short when only rows are written.
// Vector width: 16 bytes of input per load.
Plan select_tiles(Plan plan);
}
