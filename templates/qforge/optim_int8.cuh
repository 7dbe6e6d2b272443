// INT8 weight-only training: the optimizer step of a parameter stored as int8 with one fp32 scale
// per row (docs/training.md, "INT8 parameters"). One fused kernel per step: dequantize each row,
// run the optimizer's fp32 update, reduce the updated row's amax, then requantize the row with
// stochastic rounding and write its new scale. The scale and rounding rules are the weight
// rowwise stream's of recipes/int8_weight_sr.json (docs/numerics.md, "INT8 per-channel" and
// "Stochastic rounding"): scale = round_to(scale dtype, amax / 127), inv = 1 / max(scale, 1e-12),
// q = encode_sr<Int8>(w * inv, r), r the element's Philox word (stream 0, linear index row * cols +
// col). The element updates (sgd_update, adamw_update) are host/device functions: the CPU
// reference (reference/optim_int8.cpp) runs the same code. Every float operation is one IEEE
// binary32 operation (no contraction: host -ffp-contract=off, NVRTC --fmad=false; sqrtf and the
// division correctly rounded on both sides: NVRTC keeps -prec-sqrt / -prec-div on).
//
// A CTA owns one row at a time (grid-stride over rows): each thread holds kIters x kVec updated
// values of the row in registers between the amax reduction and the encode, so the row is read
// once and written once. Cfg: Step (SgdStep / AdamWStep), kThreads, kIters, kVec (4: 16-byte
// loads, the row length a multiple of 4; 1: any row length), kGradBf16 (the gradient's dtype:
// bf16, else fp32), kScaleDtype (the scale's rounding: 0 fp32, 1 bf16, 2 fp16, as
// int8_channel_scale). A row holds at most kThreads * kIters * kVec elements.
#pragma once
#include "qforge/numerics.cuh"

namespace qf {

// --------------------------------------------------------------------------- per-step scalars
// fp32 values the host derives once per step from the hyper-parameters and the step number
// (int8_sgd_scalars / int8_adamw_scalars below, in double, each rounded once to fp32).

struct SgdScalars {
  float lr;
  float weight_decay;         // L2: d = g + weight_decay * w (skipped when 0)
  float momentum;             // buf = momentum * buf + (1 - dampening) * d
  float one_minus_dampening;
  i32 has_momentum;           // 0: no momentum buffer (momentum == 0)
  i32 nesterov;               // d = d + momentum * buf, else d = buf
  i32 first_step;             // the buffer starts as d (torch.optim.SGD's first step)
};

struct AdamWScalars {
  float decay;                // 1 - lr * weight_decay (decoupled weight decay)
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;            // lr / (1 - beta1^t)
  float bc2_sqrt;             // sqrt(1 - beta2^t)
  float eps;
};

// ------------------------------------------------------------------------- element updates
// SGD (torch.optim.SGD's rule; fp32, in this order):
//   d = g;  if wd != 0: d = d + wd * w
//   if momentum: buf = first ? d : momentum * buf + (1 - dampening) * d;  d = nesterov ? d + momentum * buf : buf
//   w = w - lr * d
QF_HD float sgd_update(float w, float g, float& buf, const SgdScalars& c) {
  float d = g;
  if (c.weight_decay != 0.0f) d = d + c.weight_decay * w;
  if (c.has_momentum) {
    buf = c.first_step ? d : c.momentum * buf + c.one_minus_dampening * d;
    d = c.nesterov ? d + c.momentum * buf : buf;
  }
  return w - c.lr * d;
}

// AdamW (torch.optim.AdamW's rule, amsgrad off; fp32, in this order):
//   w = w * decay;  m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * (g * g)
//   w = w - step_size * (m / (sqrt(v) / bc2_sqrt + eps))
QF_HD float adamw_update(float w, float g, float& m, float& v, const AdamWScalars& c) {
  w = w * c.decay;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * (g * g);
  const float denom = sqrtf(v) / c.bc2_sqrt + c.eps;
  return w - c.step_size * (m / denom);
}

// The optimizers as the kernel's policy: their scalars, how many fp32 state tensors they keep, and
// the element update over those states.
struct SgdStep {
  using Scalars = SgdScalars;
  static constexpr int kStates = 1;  // the momentum buffer (absent when has_momentum is 0)
  QF_HD static bool uses_state(const Scalars& c, int i) { return i == 0 && c.has_momentum != 0; }
  QF_HD static float update(float w, float g, float& s0, float& /*s1*/, const Scalars& c) {
    return sgd_update(w, g, s0, c);
  }
};

struct AdamWStep {
  using Scalars = AdamWScalars;
  static constexpr int kStates = 2;  // exp_avg, exp_avg_sq
  QF_HD static bool uses_state(const Scalars&, int i) { return i < 2; }
  QF_HD static float update(float w, float g, float& s0, float& s1, const Scalars& c) {
    return adamw_update(w, g, s0, s1, c);
  }
};

template <class Scalars>
struct Int8OptimArgs {
  u8* q;              // [rows, cols] int8 (two's complement bytes), updated in place
  float* scale;       // [rows] fp32: the dequantize multiplier of each row, updated in place
  const void* grad;   // [rows, cols] fp32 or bf16 (Cfg::kGradBf16)
  float* state0;      // [rows, cols] fp32: SGD's momentum buffer (null without momentum), AdamW's exp_avg
  float* state1;      // [rows, cols] fp32: AdamW's exp_avg_sq (null for SGD)
  const float* noop;  // optional: *noop == 1.0f skips the whole step (e.g. a found-inf flag)
  i64 rows;
  i64 cols;
  u64 seed;           // stochastic rounding: Philox key (stream 0)
  u64 offset;         // stochastic rounding: the step's counter (the parameter's update count)
  Scalars s;
};

#if !defined(__CUDACC_RTC__)
// Host: the step's fp32 scalars. step: 1 for the first step (torch's count).
inline SgdScalars int8_sgd_scalars(double lr, double momentum, double dampening, double weight_decay,
                                   bool nesterov, long long step) {
  SgdScalars c{};
  c.lr = static_cast<float>(lr);
  c.weight_decay = static_cast<float>(weight_decay);
  c.momentum = static_cast<float>(momentum);
  c.one_minus_dampening = static_cast<float>(1.0 - dampening);
  c.has_momentum = momentum != 0.0 ? 1 : 0;
  c.nesterov = nesterov ? 1 : 0;
  c.first_step = step <= 1 ? 1 : 0;
  return c;
}

inline AdamWScalars int8_adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                       long long step) {
  AdamWScalars c{};
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const double t = static_cast<double>(step);
  c.step_size = static_cast<float>(lr / (1.0 - pow(beta1, t)));
  c.bc2_sqrt = static_cast<float>(sqrt(1.0 - pow(beta2, t)));
  c.eps = static_cast<float>(eps);
  return c;
}
#endif

#if defined(__CUDACC__)
namespace detail {

// kVec consecutive elements at element index i of a row-major array (16-byte loads at kVec 4).
template <int kVec>
__device__ __forceinline__ void load_f32(const float* p, i64 i, float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p + i);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = p[i + e];
  }
}

template <int kVec>
__device__ __forceinline__ void store_f32(float* p, i64 i, const float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) p[i + e] = v[e];
  }
}

template <int kVec, bool kBf16>
__device__ __forceinline__ void load_grad(const void* p, i64 i, float (&v)[kVec]) {
  if constexpr (kBf16) {
    const u16* h = static_cast<const u16*>(p);
    if constexpr (kVec == 4) {
      const uint2 t = *reinterpret_cast<const uint2*>(h + i);
      v[0] = bf16_to_f32(u16(t.x & 0xFFFFu)), v[1] = bf16_to_f32(u16(t.x >> 16));
      v[2] = bf16_to_f32(u16(t.y & 0xFFFFu)), v[3] = bf16_to_f32(u16(t.y >> 16));
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[e] = bf16_to_f32(h[i + e]);
    }
  } else {
    load_f32<kVec>(static_cast<const float*>(p), i, v);
  }
}

template <int kVec>
__device__ __forceinline__ void load_q(const u8* p, i64 i, float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    const u32 t = *reinterpret_cast<const u32*>(p + i);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = decode<Int8>(u8((t >> (8 * e)) & 0xFFu));
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = decode<Int8>(p[i + e]);
  }
}

template <int kVec>
__device__ __forceinline__ void store_q(u8* p, i64 i, const u8 (&b)[kVec]) {
  if constexpr (kVec == 4) {
    *reinterpret_cast<u32*>(p + i) = u32(b[0]) | (u32(b[1]) << 8) | (u32(b[2]) << 16) | (u32(b[3]) << 24);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) p[i + e] = b[e];
  }
}

}  // namespace detail

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) int8_optim_kernel(const Int8OptimArgs<typename Cfg::Step::Scalars> a) {
  using Step = typename Cfg::Step;
  constexpr int kThreads = int(Cfg::kThreads), kIters = int(Cfg::kIters), kVec = int(Cfg::kVec);
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  static_assert(kVec == 1 || kVec == 4, "kVec is 1 or 4");
  if (a.noop && *a.noop == 1.0f) return;
  __shared__ float warp_max[kThreads / 32];
  const bool s0 = Step::uses_state(a.s, 0), s1 = Step::kStates > 1 && Step::uses_state(a.s, 1);
  for (i64 row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const i64 base = row * a.cols;
    const float scale = a.scale[row];
    float wn[kIters][kVec];
    float amax = 0.0f;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const i64 c = (i64(it) * kThreads + threadIdx.x) * kVec;  // kVec 4: cols % 4 == 0, so c < cols covers c + 3
#pragma unroll
      for (int e = 0; e < kVec; ++e) wn[it][e] = 0.0f;
      if (c < a.cols) {
        float w[kVec], g[kVec], m[kVec], v[kVec];
        detail::load_q<kVec>(a.q, base + c, w);
        detail::load_grad<kVec, bool(Cfg::kGradBf16)>(a.grad, base + c, g);
#pragma unroll
        for (int e = 0; e < kVec; ++e) m[e] = v[e] = 0.0f;
        if (s0) detail::load_f32<kVec>(a.state0, base + c, m);
        if (s1) detail::load_f32<kVec>(a.state1, base + c, v);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          wn[it][e] = Step::update(w[e] * scale, g[e], m[e], v[e], a.s);
          amax = amax_step(amax, wn[it][e]);
        }
        if (s0) detail::store_f32<kVec>(a.state0, base + c, m);
        if (s1) detail::store_f32<kVec>(a.state1, base + c, v);
      }
    }
    // The row's amax (NaN ignored, Inf kept: fmaxf), reduced over the CTA.
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();  // also: every thread has read scale[row] before it is overwritten below
    float row_amax = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) row_amax = fmaxf(row_amax, warp_max[w]);
    const float new_scale = int8_channel_scale(row_amax, int(Cfg::kScaleDtype));  // the weight rowwise stream's rule
    const float inv = int8_channel_multiplier(new_scale);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const i64 c = (i64(it) * kThreads + threadIdx.x) * kVec;
      if (c < a.cols) {
        u8 b[kVec];
        if constexpr (kVec == 4) {
          u32 r[4];  // base + c is a multiple of 4: one Philox group, element e takes word e
          sr_random_group(a.seed, a.offset, 0u, u64(base + c) >> 2, r);
#pragma unroll
          for (int e = 0; e < 4; ++e) b[e] = encode_sr<Int8>(wn[it][e] * inv, r[e]);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            b[e] = encode_sr<Int8>(wn[it][e] * inv, sr_random_bits<Int8>(a.seed, a.offset, 0u, u64(base + c + e)));
        }
        detail::store_q<kVec>(a.q, base + c, b);
      }
    }
    if (threadIdx.x == 0) a.scale[row] = new_scale;
    __syncthreads();  // warp_max is reused by the next row
  }
}
#endif

}  // namespace qf
