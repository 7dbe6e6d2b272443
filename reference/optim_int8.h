// The CPU reference of the INT8 parameter's fused optimizer step (templates/qforge/optim_int8.cuh,
// docs/training.md "INT8 parameters"): what the GPU kernel must produce bit for bit. Per row:
// dequantize (decode(q) * scale, fp32), the optimizer's fp32 update restated here in the same
// operation order (host code is built with -ffp-contract=off), the updated row's amax, then the
// weight rowwise stream's scale and stochastic rounding (numerics.cuh's int8_channel_scale,
// encode_sr and Philox bits, stream 0, linear index row * cols + col).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "compiler/formats.h"
#include "qforge/optim_int8.cuh"

namespace qf::ref {

// A host copy of one int8 parameter and its optimizer state.
struct Int8Param {
  int64_t rows = 0, cols = 0;
  std::vector<int8_t> q;       // [rows, cols]
  std::vector<float> scale;    // [rows]
  std::vector<float> state0;   // [rows, cols]: SGD momentum buffer (empty without momentum) / AdamW exp_avg
  std::vector<float> state1;   // [rows, cols]: AdamW exp_avg_sq (empty for SGD)
};

// The int8 storage of an fp32 [rows, cols] weight: the weight rowwise stream's quantize (scale from
// each row's amax rounded to scale_dtype, stochastic rounding with (seed, offset), stream 0).
Int8Param int8_quantize(std::span<const float> w, int64_t rows, int64_t cols, DType scale_dtype, uint64_t seed,
                        uint64_t offset);

// Each value of p as the step dequantizes it (decode(q) * scale[row], fp32).
std::vector<float> int8_dequantize(const Int8Param& p);

// One step in place. grad: rows * cols fp32 values (a bf16 gradient widened exactly).
void int8_sgd_step(Int8Param& p, std::span<const float> grad, const SgdScalars& c, DType scale_dtype, uint64_t seed,
                   uint64_t offset);
void int8_adamw_step(Int8Param& p, std::span<const float> grad, const AdamWScalars& c, DType scale_dtype,
                     uint64_t seed, uint64_t offset);

}  // namespace qf::ref
