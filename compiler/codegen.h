// Plan -> CUDA source of its quantize kernels: a config struct per plan, stream and global
// reduction, instantiating the templates of templates/qforge/cast.cuh. The source depends on
// the plan's structure only (never on recipe or role names), so identical kernels of different
// recipes share one cache entry.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir.h"

namespace qf {

struct KernelSource {
  std::string source;                     // the translation unit given to NVRTC
  std::string cast_kernel;                // name expression of the cast kernel
  std::optional<std::string> amax_kernel; // name expression of the phase-0 reduction, if any
  std::optional<std::string> fused_kernel;  // the one-launch form for small single tensors, if any
  uint32_t smem_bytes = 0;                // dynamic shared memory of any of the kernels
  int fused_threads = 0;                  // threads per CTA of fused_kernel (tile.threads: the others')
  int min_blocks = 0;                     // the cast kernel's __launch_bounds__ min blocks (Cfg::kMinBlocks)
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
  // The kernels present: the cast kernel, then the amax, fused and row kernels where the plan has
  // them.
  std::vector<Kernel> kernels() const;
};

KernelSource emit_quantize(const Plan& plan);

// Whether the plan has a one-pass form (cast.cuh row_kernel): every stream rowwise, row-major,
// one scale per row (per-channel), and every global reduction those rows' amaxes (no RHT). A
// CTA then owns whole rows, so single tensors whose rows fit it read their input once instead
// of twice (amax pre-pass, then cast).
bool has_row_pass(const Plan& plan);

// The tiles of `candidates` (plan's tile candidates, the default first) that give distinct
// kernels: a register variant whose launch bounds (KernelSource::min_blocks) equal those of an
// earlier candidate of the same shape is dropped. What `qforge tune` times.
std::vector<TileConfig> distinct_tiles(const Plan& plan, const std::vector<TileConfig>& candidates);

// The delayed-scaling history update of one tensor (templates/qforge/history.cuh): the
// history length, margin, amax rule and format max are baked in. cast_kernel holds its name.
KernelSource emit_history_update(const PerTensorDelayed& mode, ElemFormat format);

}  // namespace qf
