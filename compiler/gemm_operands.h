// Which fused GEMM reads two quantize streams' buffers as the quantize kernels wrote them: the
// bridge from a recipe's operands (format, scaling, block shape, scale layout per direction) to a
// GemmSpec, for the bindings that run a layer's fprop / dgrad / wgrad on quantize outputs.
#pragma once
#include <cstdint>
#include <optional>

#include "compiler/gemm_codegen.h"
#include "compiler/ir.h"

namespace qf {

// The spec of D [rows of A, rows of B] = A [., K] @ B [., K]^T on streams a and b (their data
// layouts' rows and columns), or nullopt where no fused kernel reads the pair as stored (two
// formats, a swizzled grid, a block shape the GEMM does not take): such pairs take a dequant
// route. `layout` MGrouped (dense: n, k; blockwise 1x128 x 1x128, the wgrad form, turns
// KGrouped with m rows) or a grouped layout (K-grouped: m rows, k = 0). The spec is validated.
std::optional<GemmSpec> gemm_for_streams(const Stream& a, const Stream& b, int64_t m, int64_t n, int64_t k,
                                         GemmLayout layout = GemmLayout::MGrouped);

}  // namespace qf
