// The CPU reference executor: runs a plan on host tensors and produces, bit for bit, what
// every generated kernel must produce (docs/numerics.md). It interprets the plan's streams,
// amax sources and layouts generically: there is no code path per recipe.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "compiler/buffers.h"
#include "compiler/ir.h"

namespace qf::ref {

// A row-major [M, K] tensor of the plan's input dtype, as raw bytes (bf16/fp16 bit patterns
// or fp32), little-endian.
struct HostTensor {
  DType dtype = DType::BF16;
  Shape2D shape;
  std::vector<uint8_t> bytes;
  float at(int64_t r, int64_t c) const;  // widened to fp32 exactly
};

struct QuantizeParams {
  uint64_t seed = 0;    // stochastic rounding: Philox key
  uint64_t offset = 0;  // stochastic rounding: Philox counter offset
  // Delayed scaling: the scale of each scale input, by input-buffer name ("scale",
  // "rowwise_scale", ...). Grouped: one value per member is not supported; the same scale
  // applies to every member.
  std::map<std::string, float> scales;
};

struct Output {
  BufferDesc desc;
  std::vector<uint8_t> bytes;  // desc.bytes long; padding zero-filled
};

// Quantizes x with the plan; outputs are in output_buffers(plan, x.shape) order.
// Throws UserError for shapes the plan cannot handle (check_shape) or a missing scale.
std::vector<Output> quantize(const Plan& plan, const HostTensor& x, const QuantizeParams& params);

// Grouped: x is [sum(m_splits), K]; member i is rows [off_i, off_i + m_splits[i]). Each output
// buffer is the concatenation, in member order, of the members' buffers (each member laid out
// as quantize() would lay out a [m_i, K] tensor: its own scale grid, padding and swizzle);
// outputs come in output_buffers(plan, {M, K}) order. Per-member one-value buffers (amax
// outputs, per-tensor scale_inv) therefore become [N]. Descriptor convention: desc.bytes is the
// sum over members; desc.shape stacks the members along dim 0 when their non-empty buffers
// agree on the trailing dims (rowwise data [sum m_i, K], compact rowwise scale grids, [N]
// per-tensor values), and is the flat element count [sum of member elements] otherwise (e.g.
// transposed columnwise data, [K, m_i] per member). Members may be empty (m = 0): they
// contribute no data or block scales, their amax is 0 and their per-tensor/per-channel scales are
// those of amax 0 (current scaling: scale_inv 1; delayed: 1/scale). Stochastic rounding
// indices count across the whole grouped buffer: member i's stream offsets its linear indices by
// the element count of that stream in members 0..i-1 (docs/numerics.md). A UserError if the
// splits are negative or do not add up to M, or a non-empty member fails check_shape.
std::vector<Output> quantize_grouped(const Plan& plan, const HostTensor& x,
                                     std::span<const int64_t> m_splits, const QuantizeParams& params);

// Delayed scaling bookkeeping (the separate tiny kernel of TE): rolls `history` (slot 0 the
// newest) to take `amax`, then recomputes `scale` from the window; see docs/numerics.md.
void update_amax_history(std::span<float> history, float amax, float& scale, const PerTensorDelayed& mode,
                         ElemFormat format);

}  // namespace qf::ref
