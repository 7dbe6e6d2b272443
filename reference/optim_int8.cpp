#include "reference/optim_int8.h"

#include <cmath>

#include "compiler/error.h"
#include "qforge/numerics.cuh"

namespace qf::ref {

namespace {

int scale_code(DType d) { return d == DType::BF16 ? 1 : d == DType::FP16 ? 2 : 0; }

// Requantizes row `row` from its updated fp32 values (the weight rowwise stream's rule).
void requantize_row(Int8Param& p, int64_t row, const std::vector<float>& wn, DType scale_dtype, uint64_t seed,
                    uint64_t offset) {
  float amax = 0.0f;
  for (float v : wn) amax = std::fmax(amax, std::fabs(v));  // NaN ignored, Inf kept
  const float scale = int8_channel_scale(amax, scale_code(scale_dtype));
  const float inv = 1.0f / std::fmax(scale, 1e-12f);
  for (int64_t c = 0; c < p.cols; ++c) {
    const uint64_t l = uint64_t(row * p.cols + c);
    const u32 r = sr_random_bits<Int8>(seed, offset, 0u, l);
    p.q[size_t(l)] = static_cast<int8_t>(encode_sr<Int8>(wn[size_t(c)] * inv, r));
  }
  p.scale[size_t(row)] = scale;
}

float dequantized(const Int8Param& p, int64_t row, int64_t c) {
  return static_cast<float>(p.q[size_t(row * p.cols + c)]) * p.scale[size_t(row)];
}

void check_param(const Int8Param& p, std::span<const float> grad, int states) {
  const size_t n = size_t(p.rows * p.cols);
  QF_CHECK(p.q.size() == n && p.scale.size() == size_t(p.rows) && grad.size() == n, "int8 reference: sizes");
  QF_CHECK(states < 1 || p.state0.size() == n, "int8 reference: state0 size");
  QF_CHECK(states < 2 || p.state1.size() == n, "int8 reference: state1 size");
}

}  // namespace

Int8Param int8_quantize(std::span<const float> w, int64_t rows, int64_t cols, DType scale_dtype, uint64_t seed,
                        uint64_t offset) {
  QF_CHECK(int64_t(w.size()) == rows * cols, "int8 reference: weight size");
  Int8Param p;
  p.rows = rows, p.cols = cols;
  p.q.assign(size_t(rows * cols), 0);
  p.scale.assign(size_t(rows), 0.0f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) row[size_t(c)] = w[size_t(r * cols + c)];
    requantize_row(p, r, row, scale_dtype, seed, offset);
  }
  return p;
}

std::vector<float> int8_dequantize(const Int8Param& p) {
  std::vector<float> out(static_cast<size_t>(p.rows * p.cols));
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < p.cols; ++c) out[size_t(r * p.cols + c)] = dequantized(p, r, c);
  return out;
}

void int8_sgd_step(Int8Param& p, std::span<const float> grad, const SgdScalars& c, DType scale_dtype, uint64_t seed,
                   uint64_t offset) {
  check_param(p, grad, c.has_momentum ? 1 : 0);
  std::vector<float> wn(static_cast<size_t>(p.cols));
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t k = 0; k < p.cols; ++k) {
      const size_t i = size_t(r * p.cols + k);
      const float w = dequantized(p, r, k);
      float d = grad[i];
      if (c.weight_decay != 0.0f) {
        const float t = c.weight_decay * w;
        d = d + t;
      }
      if (c.has_momentum) {
        float buf;
        if (c.first_step) {
          buf = d;
        } else {
          const float a = c.momentum * p.state0[i];
          const float b = c.one_minus_dampening * d;
          buf = a + b;
        }
        p.state0[i] = buf;
        if (c.nesterov) {
          const float t = c.momentum * buf;
          d = d + t;
        } else {
          d = buf;
        }
      }
      const float step = c.lr * d;
      wn[size_t(k)] = w - step;
    }
    requantize_row(p, r, wn, scale_dtype, seed, offset);
  }
}

void int8_adamw_step(Int8Param& p, std::span<const float> grad, const AdamWScalars& c, DType scale_dtype,
                     uint64_t seed, uint64_t offset) {
  check_param(p, grad, 2);
  std::vector<float> wn(static_cast<size_t>(p.cols));
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t k = 0; k < p.cols; ++k) {
      const size_t i = size_t(r * p.cols + k);
      const float g = grad[i];
      const float w = dequantized(p, r, k) * c.decay;
      const float m1 = c.beta1 * p.state0[i];
      const float m2 = c.one_minus_beta1 * g;
      const float m = m1 + m2;
      const float gg = g * g;
      const float v1 = c.beta2 * p.state1[i];
      const float v2 = c.one_minus_beta2 * gg;
      const float v = v1 + v2;
      const float root = std::sqrt(v);  // correctly rounded (IEEE 754)
      const float denom = root / c.bc2_sqrt + c.eps;
      const float ratio = m / denom;
      const float step = c.step_size * ratio;
      p.state0[i] = m;
      p.state1[i] = v;
      wn[size_t(k)] = w - step;
    }
    requantize_row(p, r, wn, scale_dtype, seed, offset);
  }
}

}  // namespace qf::ref
