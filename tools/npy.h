// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0), little-endian,
// C order only. Errors (unreadable, truncated or malformed files, unsupported dtypes) are
// qf::UserError whose where() is the file path.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace qf::npy {

struct Array {
  std::string descr;           // normalized: "<f4", "<f2", "<u2", "|u1", "<i4", ...
  std::vector<int64_t> shape;  // () for a scalar
  std::vector<uint8_t> data;   // element bytes, little-endian, C order
  int64_t elements() const;
};

// Size in bytes of one element of a supported descr, 0 if the descr is not supported.
// Supported: |b1, |u1, |i1, <u2 <i2 <f2, <u4 <i4 <f4, <u8 <i8 <f8.
int itemsize(const std::string& descr);

// Reads a whole .npy file. Rejects anything but a regular file, fortran_order True, big-endian or
// unsupported descrs, malformed headers and files whose size does not match the shape.
// check_shape, when given, sees the header's shape before any data is read (and may throw): a
// caller's limits then refuse a huge array without reading it.
Array read(const std::filesystem::path& path, const std::function<void(const std::vector<int64_t>&)>& check_shape = {});

// Writes a version 1.0 .npy file (version 2.0 if the header needs it). The data size must
// equal product(shape) * itemsize(descr). Writes to a temporary file in the same directory,
// then renames it over `path`.
void write(const std::filesystem::path& path, const std::string& descr, std::span<const int64_t> shape,
           std::span<const uint8_t> data);

}  // namespace qf::npy
