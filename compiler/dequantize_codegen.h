// Stream -> CUDA source of its dequantize kernel (templates/qforge/dequantize.cuh): the element
// format, how its scales are stored and the output dtype are baked in; the data extent and the
// scale grid's geometry are run-time arguments, so every block shape and scale layout of one
// (format, scale storage, output dtype) shares a kernel.
#pragma once
#include "compiler/codegen.h"
#include "compiler/ir.h"

namespace qf {

// The kernel that dequantizes `s`'s data into `out` elements; cast_kernel holds its name.
KernelSource emit_dequantize(const Stream& s, DType out);

// Threads per block of both dequantize programs' element kernels (the launch reads it too).
inline constexpr int kDequantizeThreads = 256;

// The grouped dequantize program of (s's format and scale storage, out): the prep kernel
// (amax_kernel) and the element kernel (cast_kernel) of templates/qforge/dequant_grouped.cuh, over the
// same config as emit_dequantize's.
KernelSource emit_dequantize_grouped(const Stream& s, DType out);

}  // namespace qf
