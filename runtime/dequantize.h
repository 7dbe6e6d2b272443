// Dequantize one stream of a quantize call's outputs on a GPU (templates/qforge/dequantize.cuh):
// the stream's data times its scales, into fp32 / bf16 / fp16, in the data's own layout ([M, K],
// or [K, M] for transposed copies) or, with DequantizeCall::transposed_out, that layout transposed.
// Bit-exact against reference::dequantize.
#pragma once
#include <cuda.h>

#include "compiler/buffers.h"
#include "compiler/ir.h"
#include "qforge/dequantize.cuh"
#include "runtime/kernel_cache.h"
#include "runtime/quantizer.h"
#include "runtime/tensor.h"

namespace qf::rt {

struct DequantizeCall {
  TensorView data;   // the stream's <dir>_data buffer
  TensorView scale;  // its <dir>_scale_inv buffer (none for identity streams)
  TensorView amax;   // NVFP4: the stream's per-tensor amax output (fp32 [1])
  TensorView out;    // rows x cols elements of the output dtype
  bool transposed_out = false;  // out holds the data layout transposed ([cols, rows]): a copy kept in
                                // the input's own layout, turned into the operand a GEMM reads
  // NVFP4 only, optional (fp32 [1]): the values leave the global decode scale S_dec out (each is
  // decode(q) * decode(s), exact in bf16) and S_dec is written here instead, for a GEMM on the copy
  // to take as its alpha; with s_dec_multiply, times the value already there (a launch before this
  // one on the stream wrote it: two NVFP4 operands give one alpha, rounded once).
  TensorView s_dec_out;
  bool s_dec_multiply = false;
};

// The kernel arguments of a stream whose quantize input was `in` ([M, K]), pointers unset: the
// data layout's extent and the scale grid's geometry (compiler/buffers.h scale_grid, which the CPU
// reference indexes through ScaleGrid::offset).
DequantizeArgs dequantize_geometry(const qf::Stream& s, Shape2D in);

// The dequantize kernel of (s's format and scale storage, out) for `arch`, from the cache.
QuantizeKernels build_dequantize_kernel(const qf::Stream& s, DType out, const std::string& arch,
                                        KernelCache& cache = KernelCache::global());

// Validates every buffer (UserError naming it: data, scale, amax, out; sizes from
// output_buffers(plan of s, in)), then launches on `stream` in the current context. The first
// call per (device, format, scale storage, output dtype) compiles or loads the kernel.
void dequantize(const qf::Stream& s, Shape2D in, const DequantizeCall& call, DType out, CUstream stream,
                KernelCache& cache = KernelCache::global());

}  // namespace qf::rt
