#include "reference/dequantize.h"

#include <cstring>

#include "compiler/error.h"
#include "qforge/numerics.cuh"

namespace qf::ref {

namespace {
float load_f32(std::span<const uint8_t> b, int64_t i) {
  float v;
  std::memcpy(&v, b.data() + i * 4, 4);
  return v;
}
uint16_t load_u16(std::span<const uint8_t> b, int64_t i) {
  uint16_t v;
  std::memcpy(&v, b.data() + i * 2, 2);
  return v;
}
}  // namespace

std::vector<uint8_t> dequantize(const Stream& s, Shape2D in, std::span<const uint8_t> data,
                                std::span<const uint8_t> scale, float amax, DType out) {
  const Shape2D d = data_shape(s, in);
  const ScaleGrid g = scale_grid(s, in);
  const ScaleStorage storage = traits(s.scaling).scale_storage;
  const int bits = data_bits(s);
  QF_CHECK(int64_t(data.size()) * 8 >= d.m * d.k * bits, "data buffer too small");
  QF_CHECK(storage == ScaleStorage::None || int64_t(scale.size()) >= g.size() * traits(storage).bytes,
           "scale buffer too small");
  // NVFP4's global decode scale, as the quantize derived its encode scale from the amax.
  const float s_dec = nvfp4_global_decode_scale(nvfp4_global_encode_scale(amax));
  const int out_bytes = traits(out).bytes;
  std::vector<uint8_t> result(size_t(d.m * d.k * out_bytes));
  for (int64_t r = 0; r < d.m; ++r)
    for (int64_t c = 0; c < d.k; ++c) {
      const int64_t i = r * d.k + c;
      float v;
      if (storage == ScaleStorage::None) {
        const DType in_dtype = s.out_dtype;
        v = in_dtype == DType::FP32 ? load_f32(data, i)
            : in_dtype == DType::BF16 ? bf16_to_f32(load_u16(data, i))
                                      : f16_to_f32(load_u16(data, i));
      } else {
        const uint8_t byte = bits == 4 ? uint8_t((data[size_t(i / 2)] >> ((i & 1) * 4)) & 0xF) : data[size_t(i)];
        const float q = traits(s.format).decode(byte);
        const int64_t off = g.offset(r / g.block_rows, c / g.block_cols);
        if (storage == ScaleStorage::F32) {
          v = q * load_f32(scale, off);
        } else if (storage == ScaleStorage::E8M0) {
          v = q * e8m0_decode(scale[size_t(off)]);
        } else {
          v = (q * decode<E4M3>(scale[size_t(off)])) * s_dec;
        }
      }
      if (v != v) v = f32_quiet_nan();  // one NaN, whatever the operands' payloads (docs/numerics.md)
      if (out == DType::FP32) {
        std::memcpy(result.data() + i * 4, &v, 4);
      } else {
        const uint16_t h = out == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(result.data() + i * 2, &h, 2);
      }
    }
  return result;
}

}  // namespace qf::ref
