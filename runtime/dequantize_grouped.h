// Dequantize one stream of a grouped quantize's outputs on a GPU (templates/qforge/dequant_grouped.cuh),
// the members' split read on the device from the same row offsets the grouped quantize took: no host
// sync, capturable in a CUDA graph. The output holds each member's dense copy back to back (member g's
// at element K * member_rows[g], in its data's layout: [M_g, K], or [K, M_g] for transposed copies).
// NVFP4 with alpha_out: the values leave each member's S_dec out and alpha_out[g] takes it (the
// per-group alpha of an M-grouped GEMM on the copies). Bit-exact against reference::dequantize_grouped.
#pragma once
#include <cuda.h>

#include "compiler/buffers.h"
#include "compiler/codegen.h"
#include "compiler/ir.h"
#include "qforge/dequant_grouped.cuh"
#include "runtime/kernel_cache.h"
#include "runtime/quantizer.h"
#include "runtime/tensor.h"

namespace qf::rt {

struct DequantizeGroupedCall {
  TensorView data;         // the stream's grouped <dir>_data buffer
  TensorView scale;        // its grouped <dir>_scale_inv buffer (none for identity streams)
  TensorView amax;         // NVFP4: the stream's per-member amax output (fp32 [num_members])
  TensorView member_rows;  // device int64 [num_members + 1]: the grouped quantize's row offsets
  TensorView workspace;    // dequantize_grouped_workspace_bytes(num_members) bytes, 8-aligned
  TensorView out;          // total rows x K elements of the output dtype
  TensorView alpha_out;    // NVFP4 only, optional (fp32 [num_members]): S_dec per member, left out of the values
  int num_members = 0;
};

// Scratch of a call (the members' clamped starts and scale-grid bases, int64 each).
int64_t dequantize_grouped_workspace_bytes(int num_members);

// The grouped dequantize program (compiler/dequantize_codegen.h, emit_dequantize_grouped) compiled
// and loaded for (s's format and scale storage, out).
QuantizeKernels build_dequantize_grouped_kernel(const qf::Stream& s, DType out, const std::string& arch,
                                                KernelCache& cache = KernelCache::global());

// The kernels' arguments for a grouped input of `total` (rows: the members' total) and `members`
// members, pointers unset: data layout, scale-entry shape and grid order.
DequantGroupedArgs dequantize_grouped_geometry(const qf::Stream& s, Shape2D total, int members);

// Validates every argument (UserError naming it: num_members, shape, data, scale, amax, member_rows,
// workspace, out, alpha_out; data and scale sized as Quantizer::grouped_capacity sizes them, the scale
// by grouped_scale_capacity), then launches the two kernels on `stream` in the current context.
// Offsets that break the grouped quantize's contract (member_rows[0] == 0, rising, last == total.m)
// are clamped to [0, total.m] and made rising; rows outside every member come out as zero. The first call per (device, format, scale
// storage, output dtype) compiles or loads the program.
void dequantize_grouped(const qf::Stream& s, Shape2D total, const DequantizeGroupedCall& call, DType out,
                        CUstream stream, KernelCache& cache = KernelCache::global());

}  // namespace qf::rt
