// The CPU reference dequantize: what the GPU's dequantize kernel must produce bit for bit
// (docs/numerics.md, "Dequantize"). Restated from the definitions with the format table's
// decoders and the compiler's scale-grid geometry, not from the device template.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "compiler/buffers.h"
#include "compiler/ir.h"

namespace qf::ref {

// Dequantizes stream `s` of a quantize call whose input was `in`: data and scale are its
// buffers' bytes (scale empty for identity streams), amax the stream's per-tensor amax (NVFP4).
// Returns rows x cols elements of `out` in the data's layout, little-endian bytes.
std::vector<uint8_t> dequantize(const Stream& s, Shape2D in, std::span<const uint8_t> data,
                                std::span<const uint8_t> scale, float amax, DType out);

}  // namespace qf::ref
