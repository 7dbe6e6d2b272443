// The CPU reference grouped dequantize: what the GPU's grouped dequantize (templates/qforge/
// dequant_grouped.cuh) must produce bit for bit (docs/numerics.md, "Grouped dequantize"). Restated
// from the grouped layout (each member's buffers the dense layout of its shape, back to back) with
// the format table's decoders and the compiler's scale-grid geometry, not from the device template.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "compiler/buffers.h"
#include "compiler/ir.h"

namespace qf::ref {

struct GroupedDequantized {
  std::vector<uint8_t> out;  // total.m x total.k elements of the output dtype, little-endian
  std::vector<float> alpha;  // NVFP4 with alpha_out: S_dec per member (else empty)
};

// Dequantizes stream `s` of a grouped quantize of `total` ([sum of the members' rows, K]) split by
// member_rows ([members + 1] row offsets; clamped to [0, total.m], then made rising by a running
// maximum, as the kernel reads them: rows outside every member give zero). data and scale are the
// grouped buffers' bytes, amax the per-member amaxes (NVFP4). alpha_out: each NVFP4 member's values
// leave its S_dec out, which goes to alpha instead.
GroupedDequantized dequantize_grouped(const Stream& s, Shape2D total, std::span<const int64_t> member_rows,
                                      std::span<const uint8_t> data, std::span<const uint8_t> scale,
                                      std::span<const float> amax, DType out, bool alpha_out);

}  // namespace qf::ref
