#include "reference/dequantize_grouped.h"

#include <algorithm>
#include <cstring>

#include "compiler/error.h"
#include "qforge/numerics.cuh"

namespace qf::ref {

GroupedDequantized dequantize_grouped(const Stream& s, Shape2D total, std::span<const int64_t> member_rows,
                                      std::span<const uint8_t> data, std::span<const uint8_t> scale,
                                      std::span<const float> amax, DType out, bool alpha_out) {
  QF_CHECK(member_rows.size() >= 2, "at least one member");
  const size_t G = member_rows.size() - 1;
  const ScaleStorage storage = traits(s.scaling).scale_storage;
  const bool nvfp4 = storage == ScaleStorage::E4M3;
  QF_CHECK(!nvfp4 || amax.size() >= G, "one amax per member");
  const int bits = data_bits(s);
  const int out_bytes = traits(out).bytes;
  GroupedDequantized r;
  r.out.assign(size_t(total.m * total.k * out_bytes), 0);  // zero: rows outside every member
  if (nvfp4 && alpha_out) r.alpha.resize(G);
  // The members as the kernel reads the offsets.
  std::vector<int64_t> starts(G + 1);
  int64_t running = 0;
  for (size_t g = 0; g <= G; ++g) {
    running = std::max(running, std::clamp<int64_t>(member_rows[g], 0, total.m));
    starts[g] = running;
  }
  int64_t scale_base = 0;  // entries of the members before
  for (size_t g = 0; g < G; ++g) {
    const Shape2D member{starts[g + 1] - starts[g], total.k};
    const Shape2D d = data_shape(s, member);
    const ScaleGrid grid = scale_grid(s, member);
    const int64_t first = starts[g] * total.k;  // the member's first element in every buffer
    float s_dec = 1.0f;
    if (nvfp4) {
      s_dec = nvfp4_global_decode_scale(nvfp4_global_encode_scale(amax[g]));
      if (alpha_out) {
        r.alpha[g] = s_dec;
        s_dec = 1.0f;
      }
    }
    for (int64_t row = 0; row < d.m; ++row)
      for (int64_t col = 0; col < d.k; ++col) {
        const int64_t i = first + row * d.k + col;  // in the grouped buffers
        float v;
        if (storage == ScaleStorage::None) {
          if (s.out_dtype == DType::FP32) {
            std::memcpy(&v, data.data() + i * 4, 4);
          } else {
            uint16_t h;
            std::memcpy(&h, data.data() + i * 2, 2);
            v = s.out_dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
          }
        } else {
          const uint8_t byte = bits == 4 ? uint8_t((data[size_t(i / 2)] >> ((i & 1) * 4)) & 0xF) : data[size_t(i)];
          const float q = traits(s.format).decode(byte);
          const int64_t off = scale_base + grid.offset(row / grid.block_rows, col / grid.block_cols);
          if (storage == ScaleStorage::F32) {
            float si;
            std::memcpy(&si, scale.data() + off * 4, 4);
            v = q * si;
          } else if (storage == ScaleStorage::E8M0) {
            v = q * e8m0_decode(scale[size_t(off)]);
          } else {
            v = (q * decode<E4M3>(scale[size_t(off)])) * s_dec;
          }
        }
        if (v != v) v = f32_quiet_nan();  // one NaN, whatever the operands' payloads
        if (out == DType::FP32) {
          std::memcpy(r.out.data() + i * 4, &v, 4);
        } else {
          const uint16_t h = out == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
          std::memcpy(r.out.data() + i * 2, &h, 2);
        }
      }
    if (storage != ScaleStorage::None) scale_base += grid.size();
  }
  return r;
}

}  // namespace qf::ref
