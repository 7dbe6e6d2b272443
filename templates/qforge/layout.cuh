// Scale-factor layouts shared by kernels and the CPU reference (host + device).
#pragma once
#include "qforge/numerics.cuh"

namespace qf {

// GEMM-swizzled scale layout of 128x4 tiles (MX / NVFP4 scales as block-scaled GEMMs read
// them): the grid [rows, cols] is padded to multiples of (128, 4); tile (tr, tc) of the padded
// grid occupies 512 consecutive bytes, tiles in row-major order.
QF_HD u64 swizzled_scale_offset(u64 r, u64 c, u64 padded_cols) {
  const u64 n_tile_cols = padded_cols / 4;
  const u64 tile = (r / 128) * n_tile_cols + (c / 4);
  return tile * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

QF_HD constexpr u64 round_up(u64 v, u64 m) { return (v + m - 1) / m * m; }
QF_HD u64 ceil_div(u64 v, u64 m) { return (v + m - 1) / m; }

// mn_major scale layout (1D fp32 block and e8m0 MX scales; Transformer Engine's GEMM-ready order,
// what the blockwise and MXFP8 GEMMs read coalesced): the grid [rows, cols] stored column-major, its rows
// padded to a multiple of 4 (the padding zero), i.e. as [cols, mn_major_rows(rows)].
QF_HD constexpr u64 mn_major_rows(u64 rows) { return round_up(rows, 4); }
QF_HD u64 mn_major_scale_offset(u64 r, u64 c, u64 padded_rows) { return c * padded_rows + r; }
// The padded rows of `groups` mn_major grids whose rows sum to `rows` (one per member of a
// grouped quantize, back to back), at most: each pads by up to 3.
QF_HD constexpr i64 mn_major_grouped_rows(i64 rows, i64 groups) { return rows + 3 * groups; }

// The tile a CTA takes in a launch grid of gx tile rows x gy tile columns, from its dispatch index
// lin = blockIdx.y * gx + blockIdx.x (the order in which the hardware starts CTAs). Column-fastest:
// consecutive CTAs take consecutive tile columns of one tile row; row-fastest: consecutive tile
// rows. `reversed` walks the same tiles last to first (the amax pre-pass: cast_schedule.cuh tile_pos).
struct TileRc {
  u64 row, col;
};
QF_HD TileRc cta_tile(u64 lin, u64 gx, u64 gy, bool row_fastest, bool reversed) {
  if (reversed) lin = gx * gy - 1 - lin;
  return row_fastest ? TileRc{lin % gx, lin / gx} : TileRc{lin / gy, lin % gy};
}

}  // namespace qf
