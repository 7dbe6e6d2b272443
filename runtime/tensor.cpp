#include "runtime/tensor.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>

#include "compiler/error.h"

namespace qf::rt {
namespace {

std::string where(const std::string& arg_name) { return "argument " + arg_name; }

std::string bytes_str(int64_t n) { return std::to_string(n) + (n == 1 ? " byte" : " bytes"); }

std::string dtype_str(const std::optional<DType>& d) {
  return d ? std::string(traits(*d).name) : std::string("raw bytes");
}

}  // namespace

std::string format_shape(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string format_pointer(uint64_t ptr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, ptr);
  return buf;
}

int64_t element_count(const std::string& arg_name, std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      throw UserError(where(arg_name), "shape " + format_shape(shape) + " has a negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw UserError(where(arg_name),
                      "shape " + format_shape(shape) + " has more elements than fit in int64");
    n *= d;
  }
  return n;
}

void check_buffer(const std::string& arg_name, const TensorView& given, int64_t required_bytes,
                  size_t alignment, std::string_view required_for) {
  QF_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, "alignment ", alignment,
           " is not a power of two");
  QF_CHECK(required_bytes >= 0, "negative requirement ", required_bytes, " for ", arg_name);
  if (buffer_fits(given, required_bytes, alignment)) return;
  // Built only for a message: this runs for every buffer of every call.
  auto suffix = [&] { return required_for.empty() ? std::string() : " for " + std::string(required_for); };
  if (given.bytes < 0)
    throw UserError(where(arg_name), "buffer size " + std::to_string(given.bytes) + " is negative");
  if (required_bytes == 0) return;  // nothing will be read or written
  if (given.ptr == 0)
    throw UserError(where(arg_name), "null pointer; expected a device buffer of " +
                                         bytes_str(required_bytes) + suffix());
  if (given.ptr % alignment != 0)
    throw UserError(where(arg_name), "pointer " + format_pointer(given.ptr) + " is not " +
                                         std::to_string(alignment) + "-byte aligned");
  if (given.bytes < required_bytes)
    throw UserError(where(arg_name), "buffer of " + bytes_str(given.bytes) +
                                         " is smaller than the " + bytes_str(required_bytes) +
                                         " required" + suffix());
}

void check_dtype(const std::string& arg_name, const TensorView& given,
                 std::optional<DType> expected) {
  if (given.dtype != expected)
    throw UserError(where(arg_name),
                    "holds " + dtype_str(given.dtype) + ", expected " + dtype_str(expected));
}

void check_shape(const std::string& arg_name, const TensorView& given,
                 std::span<const int64_t> expected) {
  if (!std::equal(given.shape.begin(), given.shape.end(), expected.begin(), expected.end()))
    throw UserError(where(arg_name), "shape " + format_shape(given.shape) + ", expected " +
                                         format_shape(expected));
}

void check_disjoint(const std::string& a_name, const TensorView& a, const std::string& b_name,
                    const TensorView& b) {
  if (!a.ptr || !b.ptr || a.bytes <= 0 || b.bytes <= 0) return;
  const uint64_t a_end = a.ptr + static_cast<uint64_t>(a.bytes);
  const uint64_t b_end = b.ptr + static_cast<uint64_t>(b.bytes);
  if (a.ptr < b_end && b.ptr < a_end)
    throw UserError(where(a_name), "buffer [" + format_pointer(a.ptr) + ", " +
                                       format_pointer(a_end) + ") overlaps argument " + b_name +
                                       " [" + format_pointer(b.ptr) + ", " +
                                       format_pointer(b_end) + ")");
}

}  // namespace qf::rt
