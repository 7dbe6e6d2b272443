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
  TileConfig tile;

  struct Kernel {
    const char* kind;                 // "cast_kernel", "amax_kernel" or "fused_kernel"
    const std::string* name;          // its name expression (points into this KernelSource)
  };
  // The kernels present: the cast kernel, then the amax and fused kernels where the plan has them.
  std::vector<Kernel> kernels() const;
};

KernelSource emit_quantize(const Plan& plan);

// The tiles of `candidates` (plan's tile candidates, the default first) that give distinct
// kernels: a register variant whose launch bounds (KernelSource::min_blocks) equal those of an
// earlier candidate of the same shape is dropped. What `qforge tune` times.
std::vector<TileConfig> distinct_tiles(const Plan& plan, const std::vector<TileConfig>& candidates);

// The delayed-scaling history update of one tensor (templates/qforge/history.cuh): the
// history length, margin, amax rule and format max are baked in. cast_kernel holds its name.
KernelSource emit_history_update(const PerTensorDelayed& mode, ElemFormat format);

}  // namespace qf
