// What the host code generator (compiler/codegen.cpp) and the quantize kernels agree on,
// compiled for both: the scaling modes' and amax scopes' codes, the identity (passthrough)
// formats, and the shared memory of cast_kernel: each stream's scratch and the total, and the
// CTAs per SM it asks registers for.
#pragma once
#include "qforge/types.cuh"

namespace qf {

// Scaling modes, in the order of the Scaling variant of compiler/formats.h.
enum ScaleMode : int {
  kModeNone = 0,
  kModeTensorCurrent = 1,
  kModeTensorDelayed = 2,
  kModeChannel = 3,
  kModeBlock = 4,
  kModeMx = 5,
  kModeNvfp4 = 6,
};

enum AmaxScopeCode : int { kScopeTensor = 0, kScopeChannelRows = 1, kScopeChannelCols = 2 };

// Identity (high-precision passthrough) "format": D is the output dtype code (numerics.cuh:
// 0 fp32, 1 bf16, 2 fp16).
template <int D>
struct Identity {
  static constexpr int kBits = D == 0 ? 32 : 16;
  static constexpr int kDtype = D;
};
template <class F> struct is_identity { static constexpr bool value = false; };
template <int D> struct is_identity<Identity<D>> { static constexpr bool value = true; };

// Entries of the 2D-block part of a stream's scratch (the part before the column partials).
QF_HD constexpr int cast_block2d_entries(int tile_rows, int tile_cols, bool block2d, int block_rows, int block_cols) {
  return block2d ? ((tile_rows / block_rows) * (tile_cols / block_cols) + 3) / 4 * 4 : 0;
}

// A transposed stream stages an interior tile's output in shared memory, one row per tile
// column (TR elements of out_bits, then a pad of one copy unit so that lanes on consecutive
// rows hit distinct banks), and copies it out in units of 16 elements' bytes (at most 16):
// whole sectors of consecutive output bytes per warp store, where lanes on consecutive tile
// columns would each write a piece of a different output row. Byte scale entries (MX, NVFP4,
// compact) are staged likewise after the data, TR / 16 bytes per tile column at most (fp32
// entries are not staged).
QF_HD constexpr int transposed_unit_bytes(int out_bits) { return 2 * out_bits < 16 ? 2 * out_bits : 16; }
QF_HD constexpr int transposed_stage_stride(int tile_rows, int out_bits) {
  return tile_rows * out_bits / 8 + transposed_unit_bytes(out_bits);
}

// Shared-memory scratch (4-byte entries, a multiple of 4 so every region stays 16-byte aligned)
// of one stream of cast_kernel, the same on host (code generator) and device, in this order:
//   2D blocks                  - one amax per block of the tile;
//   columnwise, same layout    - a partial amax per 16 rows of each column, then the element
//                                multiplier per scale block of each column;
//   columnwise, transposed     - the partial amaxes, when a 1D block is longer than the 16 rows
//                                one thread encodes; then the staged output (above);
//   rowwise, 1D blocks wider   - the element multiplier per (row, block) of the tile, then
//   than 4 elements              its byte scale entry (MX, NVFP4, compact), staged;
//   rowwise, per channel       - the element multiplier per row of the tile.
// out_bits: the bits an element takes in the stream's data buffer (StoreBits); byte_entries:
// the stream's scale entries are bytes (MX, NVFP4), which a transposed stream stages.
QF_HD constexpr int cast_scratch_entries(int tile_rows, int tile_cols, bool columnwise, bool transposed, int ept,
                                         bool block2d, int block_rows, int block_cols, int out_bits, bool channel,
                                         bool byte_entries) {
  int n = cast_block2d_entries(tile_rows, tile_cols, block2d, block_rows, block_cols);
  if (!columnwise && channel) n += tile_rows;
  if (!columnwise && !block2d && block_cols > 4) {
    const int blocks = tile_rows * (tile_cols / block_cols);
    n += blocks + blocks / 4 + 1;  // a float multiplier per block, then its entry byte
  }
  if (columnwise && !transposed) n += tile_cols * (tile_rows / 16) + tile_cols * (tile_rows / ept);
  if (columnwise && transposed && ept > 16) n += tile_cols * (tile_rows / 16);
  if (columnwise && transposed) n += tile_cols * transposed_stage_stride(tile_rows, out_bits) / 4;
  if (columnwise && transposed && byte_entries) n += tile_cols * (tile_rows / 16) / 4;
  return (n + 3) / 4 * 4;
}

// Shared-memory bytes of cast_kernel (also computed by the host code generator): the staged
// tile (and its rotated copy with RHT), 4 bytes per element or 2 with 16-bit staging, then the
// scratch.
QF_HD constexpr u32 cast_smem_bytes(int tile_rows, int tile_cols, bool rht, int scratch_entries, bool stage16 = false) {
  return (stage16 ? 2u : 4u) * u32(tile_rows) * u32(tile_cols) * (rht ? 2u : 1u) + 4u * u32(scratch_entries);
}

// Shared-memory bytes of the row + transposed pairs cast from registers (cast_pair.cuh) on
// interior tiles: cast_pair_direct (1x128 + 128x1 blocks, 128 x 128 tiles) keeps the 8 warps'
// 16-row column amaxes (8 x 32 float4), then the transposed output (128 rows of 128 bytes);
// cast_mx_pair_direct (MX 1x32 + 32x1 blocks, 64 x 128 tiles) the transposed output (128 rows of
// 64 bytes), then both streams' entry bytes (64 x 4 and 128 x 2). A program for interior tiles
// only of such a plan asks this much, not the staged path's, whose tile held the SM below the
// CTAs its registers allow.
QF_HD constexpr u32 cast_pair_smem_bytes(bool mx) {
  return mx ? 128u * 64u + 2u * 64u * 4u : 8u * 32u * 16u + 128u * 128u;
}

// CTAs per SM the cast kernel asks registers for (Cfg::kMinBlocks, chosen by codegen): up to 5/8
// of the SM's threads (threads_per_sm 1280) where shared memory allows it (more loads in flight
// per SM; one tile per CTA has no other overlap).
QF_HD constexpr int cast_min_blocks(int threads, u32 smem_bytes, int threads_per_sm = 1280) {
  const int by_threads = threads_per_sm / threads, by_smem = int((227u * 1024u) / (smem_bytes + 1024u));
  const int n = by_threads < by_smem ? by_threads : by_smem;
  return n < 1 ? 1 : n;
}

}  // namespace qf
