// Plan -> CUDA source of its quantize kernels: a config struct per plan, stream and global
// reduction, instantiating the templates of templates/qforge/cast.cuh. The source depends on
// the plan's structure only (never on recipe or role names), so identical kernels of different
// recipes share one cache entry.
//
// A plan with a one-launch form (a tensor or per-channel amax) casts with one kernel in both
// forms (cast.cuh cast_fused_kernel; the launch says which), so it has one program, its complete
// one (QuantizeForm::All), unless its cast kernel casts interior tiles other than from its staged
// tile (own_fused_kernel: a register pair, or straight from global memory). Such a
// plan has a fused kernel of its own and two programs, each a cache entry of its own: its
// complete program (every kernel: cast, amax, row and the cooperative fused kernel) and its
// separate form (the same without the fused kernel), which a call that does not launch the fused
// kernel compiles instead (docs/jit.md, step 5). The fused kernel is not given a program of its
// own: compiled without the cast kernel, ptxas lays out its static shared memory otherwise and its
// code changes. Each kernel's code is the same in either program. The two sources differ (the
// separate form's first line names it), so their keys differ.
//
// Either form can also be compiled for interior tiles only (Tiles::Interior): for a single tensor
// whose M and K are multiples of the tile and of 16 (interior_tiles), every tile takes the
// unchecked paths, so the program leaves out the edge tiles' checked code, over half of a
// program's code (docs/jit.md). A call of such a shape with an empty cache compiles that
// program; where the cache already holds the program for any tiles, that one serves it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir.h"

namespace qf {

// The programs a quantize plan compiles to.
enum class QuantizeForm {
  Separate,  // cast_kernel, the amax pre-pass (amax_kernel) and the one-pass row_kernel, where the plan has them
  All,       // those and the one-launch form (single tensors whose tiles fit on the GPU at once)
};
std::string_view name(QuantizeForm f);  // "separate", "all"

// Which tiles a program handles: any (interior and edge tiles; the program every call can take)
// or interior tiles only (the source's Cfg defines kInteriorOnly; only calls of interior_tiles
// shapes may launch it).
enum class Tiles { Any, Interior };
std::string_view name(Tiles t);  // "any", "interior"

struct KernelSource {
  std::string source;                     // the translation unit given to NVRTC
  // Name expressions of the kernels the source's program holds: the cast kernel and, where the
  // plan has them, the amax and row kernels, and in the All form the one-launch form's kernel.
  // Sources of other kernels (history update, dequantize) name their one kernel cast_kernel.
  std::string cast_kernel;                // name expression of the cast kernel
  std::optional<std::string> amax_kernel; // name expression of the phase-0 reduction, if any
  // The one-launch form for small single tensors, if any: the cast kernel itself
  // (cast_fused_kernel, launched with QuantizeArgs::one_launch set) or fused_kernel.
  std::optional<std::string> fused_kernel;
  uint32_t smem_bytes = 0;                // dynamic shared memory of any of the kernels
  // The plan's launch geometry, the same in both forms' sources (a runtime choosing a form before
  // compiling it needs it): smem_bytes above, tile.threads and the launch-bound min blocks below.
  int min_blocks = 0;                     // the cast kernel's __launch_bounds__ min blocks (Cfg::kMinBlocks)
  // The one-launch form's __launch_bounds__ min blocks (Cfg's), 0 for a plan without it: ptxas
  // keeps its registers within what that many CTAs per SM allow, so that many times the SM count
  // is a lower bound of its occupancy known before compiling it.
  int fused_min_blocks = 0;
  // Tiles of a tile row amax_kernel reads as one segment (Cfg::kAmaxTiles): 4 for the
  // per-channel row + transposed pairs on 128-column tiles, whose pre-pass CTAs take one or two
  // segments of a tile row (the host launches it on a grid of that many fewer tile columns:
  // runtime/quantizer.cpp amax_group_tiles), else 1 (one tile per CTA).
  int amax_tiles = 1;
  // The one-pass form of plans with row_pass (below), if any: its threads per CTA and the 16-byte
  // input chunks each thread holds (a row of K elements fits 8 warps when K / chunk elements
  // <= row_threads * row_chunks).
  std::optional<std::string> row_kernel;
  int row_threads = 0;
  int row_chunks = 0;
  TileConfig tile;

  struct Kernel {
    const char* kind;                 // "cast_kernel", "amax_kernel", "fused_kernel" or "row_kernel"
    const std::string* name;          // its name expression (points into this KernelSource)
  };
  // The kernels the source holds, in this order: the cast kernel, then the amax, fused (where it
  // is not the cast kernel) and row kernels where it has them.
  std::vector<Kernel> kernels() const;
};

// Whether the plan has a one-launch form (a tensor or per-channel amax reduced over the whole
// tensor).
bool has_one_launch(const Plan& plan);
// Whether that form is a kernel of its own (fused_kernel): where the cast kernel casts interior
// tiles other than from its staged tile, as the one-launch form must (it reduces the pre-pass from
// it): from a row + transposed register pair (per-tensor or per-channel scales, 16-bit input, 128 x
// 128 tiles of 256 threads; cast_pair.cuh kPairDirect) or, in plans of one stream, straight from
// global memory. One kernel holding both paths took the registers of both: current scaling's
// training cast spilled, its inference cast ran 4.6 % slower at 16384^2 (docs/jit.md).
bool own_fused_kernel(const Plan& plan);
// The plan's programs: Separate and All where own_fused_kernel, else its complete one alone.
std::vector<QuantizeForm> quantize_forms(const Plan& plan);
// The program holding every kernel of the plan (All where has_one_launch, else Separate): what
// prepare and `qforge prewarm` compile.
QuantizeForm complete_form(const Plan& plan);
// The smallest program that serves the separate launches: Separate where own_fused_kernel, else
// the complete one.
QuantizeForm separate_form(const Plan& plan);

// The source of one form of the plan (InternalError for All where has_one_launch is false;
// Separate gives separate_form's).
// Tiles::Any gives the source the form always had.
KernelSource emit_quantize(const Plan& plan, QuantizeForm form, Tiles tiles = Tiles::Any);

// Whether every tile of a single [shape.m, shape.k] tensor is interior for `tile`: M and K
// multiples of the tile's rows and columns and of 16. Grouped calls (member rows known on the
// device only) never are.
bool interior_tiles(const TileConfig& tile, int64_t m, int64_t k);

// Whether the plan has a one-pass form (cast.cuh row_kernel): every stream rowwise, row-major,
// one scale per row (per-channel), and every global reduction those rows' amaxes (no RHT). A
// CTA then owns whole rows, so single tensors whose rows fit it read their input once instead
// of twice (amax pre-pass, then cast).
bool has_row_pass(const Plan& plan);

// The tiles of `candidates` (plan's tile candidates, the default first) that give distinct
// kernels: a register variant whose launch bounds (KernelSource::min_blocks) equal those of an
// earlier candidate of the same shape is dropped. What `qforge tune` times. With a tensor shape
// (m, k > 0), the launch bounds are those of the program the shape takes with each tile: for
// interior tiles only where interior_tiles() says so (its register pairs' bounds differ).
std::vector<TileConfig> distinct_tiles(const Plan& plan, const std::vector<TileConfig>& candidates, int64_t m = 0,
                                       int64_t k = 0);

// The delayed-scaling history update of one tensor (templates/qforge/history.cuh): the
// history length, margin, amax rule and format max are baked in. cast_kernel holds its name.
KernelSource emit_history_update(const PerTensorDelayed& mode, ElemFormat format);

}  // namespace qf
