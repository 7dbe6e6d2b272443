// Tensors as launches see them, and the checks made on them before any launch.
//
// A TensorView names a caller's buffer: a device address, how many bytes the caller owns from
// there, and optionally what it holds and its logical shape. The checks throw qf::UserError
// naming the argument ("argument rowwise_data: ...") and saying what was expected against what
// was given. Nothing here touches the driver or the compiler IR (beyond qf::DType), so the CLI,
// the library entry points and tests share it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/formats.h"

namespace qf::rt {

struct TensorView {
  uint64_t ptr = 0;                 // device address (a CUdeviceptr value); 0 = null
  int64_t bytes = 0;                // bytes the caller owns from ptr
  std::optional<DType> dtype;       // high-precision dtype; nullopt = raw bytes (fp8, int8,
                                    // packed fp4, e8m0/e4m3 scales)
  std::vector<int64_t> shape;       // logical shape, when the caller gave one
};
// The name launch-argument code uses for the same thing.
using TensorDesc = TensorView;

// "[64, 256]"
std::string format_shape(std::span<const int64_t> shape);
// "0x7f3a00000000"
std::string format_pointer(uint64_t ptr);
// Product of the dims; UserError naming arg_name on a negative dim or int64 overflow.
int64_t element_count(const std::string& arg_name, std::span<const int64_t> shape);

// The buffer is non-null (unless required_bytes is 0), aligned to `alignment` bytes (a power of
// two) and at least required_bytes long. required_for, when given, ends the too-small message:
// "... smaller than the 128 bytes required for input [64, 256]".
// buffer_fits is the same test without a message (per-call paths build the text only on failure).
inline bool buffer_fits(const TensorView& given, int64_t required_bytes, size_t alignment) {
  if (given.bytes < 0 || required_bytes < 0) return false;  // then check_buffer reports it (a negative requirement: an internal error)
  if (required_bytes == 0) return true;
  return given.ptr != 0 && given.ptr % alignment == 0 && given.bytes >= required_bytes;
}
void check_buffer(const std::string& arg_name, const TensorView& given, int64_t required_bytes,
                  size_t alignment, std::string_view required_for = {});
// given.dtype equals expected ("argument input: holds bf16, expected fp32").
void check_dtype(const std::string& arg_name, const TensorView& given,
                 std::optional<DType> expected);
// given.shape equals expected ("argument input: shape [64, 128], expected [64, 256]").
void check_shape(const std::string& arg_name, const TensorView& given,
                 std::span<const int64_t> expected);
// The byte ranges of a and b do not overlap (an output must not alias an input or another
// output). Empty or null ranges never overlap.
void check_disjoint(const std::string& a_name, const TensorView& a, const std::string& b_name,
                    const TensorView& b);

}  // namespace qf::rt
