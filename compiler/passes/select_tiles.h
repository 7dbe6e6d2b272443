#pragma once
#include <vector>

#include "compiler/ir.h"

namespace qf {

// What every cast-kernel tile of a plan must be a multiple of: every block the plan computes
// an amax over, the RHT's 16-row groups, the 16-row column runs of columnwise streams, and 32
// columns (the shared-memory swizzle of cast_load.cuh).
struct TileConstraints {
  int row_multiple = 1;
  int col_multiple = 32;
};
TileConstraints tile_constraints(const Plan& plan);

// Whether `t` is a valid tile for the plan: multiples as above, 64..1024 threads (a multiple of
// 32), shared memory within 100 KiB (two tiles with RHT), whole warps of runs, min_blocks CTAs
// (if set) within an SM's 2048 threads.
bool tile_fits(const Plan& plan, const TileConfig& t);

// Candidate tiles for `qforge tune`, the default first: valid tiles around the default (Tiles),
// the default tile at register budgets of 64 to 255 per thread (Registers: min_blocks, the CTAs
// per SM its launch bounds size registers for), or both (All).
enum class TileSearch { All, Tiles, Registers };
std::vector<TileConfig> tile_candidates(const Plan& plan, TileSearch search = TileSearch::All);

// Chooses the cast kernel's default tile from the plan's streams and blocks (the measured
// choices are listed in select_tiles.cpp): 64 x 128 for fp4 with a transposed copy, 128 x 128 for
// a 16- or 32-bit transposed copy, 32 x 256 for other transposed copies, 16 x 256 when only rows
// are written; wider where the blocks need it. Vector width: 4 input elements per load. Register
// budget: codegen's default (by threads and shared memory), but 3 CTAs per SM for 128-row 2-D
// blocks with a transposed copy.
Plan select_tiles(Plan plan);

}  // namespace qf
