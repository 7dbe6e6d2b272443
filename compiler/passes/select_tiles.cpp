#include "compiler/passes/select_tiles.h"

#include <algorithm>
#include <numeric>

#include "compiler/buffers.h"
#include "compiler/formats.h"

namespace qf {
namespace {

bool transposes(const Plan& p) {
  for (const auto& s : p.streams)
    if (s.layout == DataLayout::Transposed) return true;
  return false;
}

bool two_d_blocks(const Plan& p) {
  for (const auto& s : p.streams)
    if (auto b = block_of(s.scaling); b && b->is_2d()) return true;
  return false;
}

bool has_rht(const Plan& p) {
  for (const auto& s : p.streams)
    if (s.rht) return true;
  for (const auto& a : p.amax)
    if (a.rht) return true;
  return false;
}

}  // namespace

TileConstraints tile_constraints(const Plan& p) {
  TileConstraints c;
  for (const auto& s : p.streams) {
    if (s.rht) c.row_multiple = std::lcm(c.row_multiple, 16);
    if (s.dir == Direction::Columnwise) c.row_multiple = std::lcm(c.row_multiple, 16);
    if (auto b = block_of(s.scaling)) {
      c.row_multiple = std::lcm(c.row_multiple, b->rows);
      c.col_multiple = std::lcm(c.col_multiple, b->cols);
    }
  }
  for (const auto& a : p.amax) {
    if (a.rht) c.row_multiple = std::lcm(c.row_multiple, 16);
    if (a.scope == AmaxScope::Block)
      c.row_multiple = std::lcm(c.row_multiple, a.block.rows), c.col_multiple = std::lcm(c.col_multiple, a.block.cols);
  }
  return c;
}

bool tile_fits(const Plan& p, const TileConfig& t) {
  const TileConstraints c = tile_constraints(p);
  if (t.rows <= 0 || t.cols <= 0 || t.rows % c.row_multiple != 0 || t.cols % c.col_multiple != 0) return false;
  if (t.threads < 64 || t.threads > 1024 || t.threads % 32 != 0) return false;
  if (!t.min_blocks_fit()) return false;
  if ((int64_t(t.rows) * t.cols / 4) % 32 != 0) return false;  // whole warps of rowwise runs
  const int64_t smem = int64_t(4) * t.rows * t.cols * (has_rht(p) ? 2 : 1);
  return smem <= 100 * 1024 && t.vec == 4;
}

std::vector<TileConfig> tile_candidates(const Plan& p, TileSearch search) {
  std::vector<TileConfig> out = {p.tile};
  if (search != TileSearch::Registers)
    for (int rows : {16, 32, 64, 128, 256})
      for (int cols : {32, 64, 128, 256, 512})
        for (int threads : {128, 256, 512}) {
          const TileConfig t{rows, cols, threads, 4};
          if (t != p.tile && tile_fits(p, t) && int64_t(rows) * cols >= int64_t(threads) * 4) out.push_back(t);
        }
  if (search == TileSearch::Tiles) return out;
  // The default tile at register budgets of 48 .. 255 per thread: the CTAs per SM (launch-bounds
  // min blocks) that leave each thread at least that many of the SM's 64 Ki registers. `qforge
  // tune` times each distinct kernel once (distinct_tiles, compiler/codegen.h).
  std::vector<int> seen;
  for (int regs : {48, 64, 80, 96, 128, 168, 255}) {
    TileConfig t = p.tile;
    t.min_blocks = std::max(1, 65536 / (regs * t.threads));
    if (std::find(seen.begin(), seen.end(), t.min_blocks) != seen.end() || t == p.tile || !tile_fits(p, t)) continue;
    seen.push_back(t.min_blocks);
    out.push_back(t);
  }
  return out;
}

namespace {

bool packs_fp4(const Plan& p) {
  for (const auto& s : p.streams)
    if (traits(s.format).elems_per_byte == 2) return true;
  return false;
}

bool stochastic(const Plan& p) {
  for (const auto& s : p.streams)
    if (s.rounding == Rounding::Stochastic) return true;
  return false;
}

// A row + transposed pair whose scales are known before its tile is read (per tensor: delayed or
// current; per channel: from the pre-pass's workspace): interior 128 x 128 tiles cast it from
// registers (cast_pair.cuh cast_pair_direct).
bool known_scale_pair(const Plan& p) {
  const AmaxScope scope = traits(p.streams[0].scaling).amax_scope;
  return register_pair_streams(p) && (scope == AmaxScope::Tensor || scope == AmaxScope::Channel);
}

bool has_columnwise(const Plan& p) {
  for (const auto& s : p.streams)
    if (s.dir == Direction::Columnwise) return true;
  return false;
}

}  // namespace

// Defaults from `qforge tune --verbose` at 16384^2, bf16, on an H100, retuned where the H200
// differs (docs/quantize.md); a tuned tile stored by `qforge tune` replaces them per GPU model.
Plan select_tiles(Plan p) {
  const TileConstraints c = tile_constraints(p);
  TileConfig t;
  t.threads = 256;
  if (transposes(p) && packs_fp4(p)) {
    // fp4 plans (NVFP4, the hybrid's NVFP4 copy) are instruction bound (e2m1 encoding, RHT,
    // Philox): 64 x 128 tiles of 128 threads (more registers and CTAs). H100: nvfp4 input 1117
    // -> 976 us, weight 1038 -> 937, hybrid input 865 -> 755 against 64 x 64 / 256. With
    // stochastic rounding the H100 preferred 256 threads (grad 1720 -> 1611), the H200 128:
    // nvfp4 grad_output 849 -> 787 us (`qforge tune --shape 16384x16384 --dry-run --verbose`,
    // H200, 2026-11-29).
    t.rows = std::lcm(c.row_multiple, 64);
    t.cols = std::lcm(c.col_multiple, 128);
    t.threads = 128;
  } else if (transposes_wide(p)) {
    // The 16-bit transposed copy (bf16 passthrough): 128 x 128 tiles, whose transposed rows go
    // out 256 bytes at a time. 593 -> 578 us against 32 x 256 (`qforge tune --verbose`, H100,
    // 16384^2, 2026-11-25).
    t.rows = std::lcm(c.row_multiple, 128);
    t.cols = std::lcm(c.col_multiple, 128);
  } else if (transposes(p) && c.row_multiple == 32) {
    // 32-row blocks in a transposed copy (MXFP8's 32x1 for Hopper, mxfp8_hopper.json): 64 x 128.
    // 480 -> 453 us for its training plan against 32 x 256 (`qforge tune --verbose`, H100,
    // 16384^2, 2026-11-25; 64 x 128 was the best of 41 tiles, 128 x 128 453 us).
    t.rows = 64;
    t.cols = std::lcm(c.col_multiple, 128);
  } else if (known_scale_pair(p)) {
    // Per-tensor and per-channel row + transposed pairs (delayed and current scaling, fp8 per
    // channel): 128 x 128 tiles, whose interior tiles cast from registers without staging the
    // input (cast_pair_direct), with registers for 3 CTAs per SM (80 per thread). Their programs
    // keep the staged path's shared memory (the one-launch fused kernel stages its tiles), which
    // holds as many CTAs.
    t.rows = std::lcm(c.row_multiple, 128);
    t.cols = std::lcm(c.col_multiple, 128);
    t.min_blocks = 3;
  } else if (transposes(p)) {
    // 32 x 512: long rows for the tile load and the rowwise copy; the transposed copy goes out
    // through the staged output in whole sectors. 128-row blocks keep 128 columns (shared
    // memory). H100, 32 x 256 against 64 x 64: fp8 current 601 -> 571 us, delayed 416 -> 386,
    // bf16 passthrough 630 -> 593. H200, 32 x 512 against 32 x 256 (`qforge tune --shape
    // 16384x16384 --dry-run --verbose`, 2026-11-29): fp8_rowwise input 588 -> 479 us,
    // int8_weight_sr weight 1183 -> 1076, current 424 -> 415, delayed 299 -> 300 (even).
    t.rows = std::lcm(c.row_multiple, 32);
    t.cols = std::lcm(c.col_multiple, t.rows >= 128 ? 128 : 512);
    t.vec = 4;
    if (!tile_fits(p, t)) t.cols = std::lcm(c.col_multiple, t.rows >= 128 ? 128 : 256);
    // 2-D blocks of 128 rows (the 128x128 weights, row + transposed): registers for 3 CTAs per SM
    // (80 per thread, no spills) instead of the 4 its shared memory allows, where 64 spilled 158
    // bytes. float8_block_scaling linear:weight training at 16384^2 (2026-11-27, docs/quantize.md):
    // H100 443 -> 395 us (80 -> 90 % of copy), H200 395-399 -> 363-365 us; 2 or 1 CTAs 447 us
    // (H200). The rowwise-only (inference) weight keeps the default (H200 215 -> 238 us with 3,
    // H100 even), as do the 1x128 copies (even).
    if (c.row_multiple >= 128 && two_d_blocks(p)) t.min_blocks = 3;
  } else {
    t.rows = std::lcm(c.row_multiple, 16);
    // 256 columns of 16 rows; blocks of 128 rows (128x128) keep 128 columns: a 128 x 256 tile
    // would hold a whole SM's shared memory (one CTA per SM, measured 58 % of copy bandwidth).
    t.cols = std::lcm(c.col_multiple, t.rows >= 128 ? 128 : 256);
    const bool fp4_rn = packs_fp4(p) && !stochastic(p) && !two_d_blocks(p);
    if (t.rows < 128 && (fp4_rn || has_columnwise(p))) {
      // More elements per thread where a tile of 16 x 256 / 256 threads leaves the H200 short of
      // bytes in flight (`qforge tune --shape 16384x16384 --dry-run --verbose`, 2026-11-29):
      // NVFP4 rowwise (e2m1 encoding, 1x16 blocks, round to nearest) 32 x 512 / 256, 423 -> 333
      // us, with the spills of its 64 registers (QuantizeResources lists them); MXFP8's
      // same-layout columnwise copy (32 x 1 blocks) 32 x 256 / 128, 331 -> 296 us. Not timed, so
      // kept as they were: the NVFP4 weights' 16x16 blocks and the rowwise stochastic rounding of
      // NVFP4 gradients for inference; the fp8 rowwise-only plans (86-89 % of the floor).
      TileConfig wide = t;
      wide.rows = std::lcm(c.row_multiple, 32);
      if (fp4_rn)
        wide.cols = std::lcm(c.col_multiple, 512);
      else
        wide.threads = 128;
      wide.vec = 4;
      if (tile_fits(p, wide)) t = wide;
    }
  }
  t.vec = 4;
  p.tile = t;
  return p;
}

}  // namespace qf
