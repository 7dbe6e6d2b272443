// Delayed scaling's bookkeeping kernel (docs/numerics.md, "Delayed scaling"): roll the amax
// history by one slot (slot 0 the newest), put this step's amax in slot 0, and recompute the
// scale from the window. One block; the history length is baked into Cfg, so each thread keeps
// its slots in registers between the read and the write.
//
// Cfg: kLength (slots), kThreads, kMargin, kMostRecent (amax_compute), kFmax (format max).
#pragma once
#include "qforge/numerics.cuh"

namespace qf {

struct HistoryArgs {
  float* history;       // [kLength] fp32, updated in place
  const float* amax;    // this step's amax (the quantize kernel's amax output)
  float* scale;         // updated in place (kept when the window's amax is 0 or not finite)
  float* scale_inv;     // optional: 1 / scale, written when non-null
  const float* noop;    // optional: *noop == 1.0f skips the update
};

#if defined(__CUDACC__)
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) amax_history_kernel(const HistoryArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  constexpr int kPer = (Cfg::kLength + Cfg::kThreads - 1) / Cfg::kThreads;
  const float newest = *a.amax;
  float moved[kPer];
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = j * Cfg::kThreads + threadIdx.x;
    moved[j] = 0.0f;
    if (i < Cfg::kLength) {
      moved[j] = i == 0 ? newest : a.history[i - 1];
      m = fmaxf(m, moved[j]);
    }
  }
  __syncthreads();  // every old value is read before any is overwritten
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = j * Cfg::kThreads + threadIdx.x;
    if (i < Cfg::kLength) a.history[i] = moved[j];
  }
  __shared__ float warp_max[32];
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float window = 0.0f;
    for (int w = 0; w < Cfg::kThreads / 32; ++w) window = fmaxf(window, warp_max[w]);
    const float amax = Cfg::kMostRecent ? newest : window;
    if (f32_is_finite(amax) && amax > 0.0f) {
      const float scale = (Cfg::kFmax / amax) * exp2i(-int(Cfg::kMargin));
      *a.scale = scale;
      if (a.scale_inv) *a.scale_inv = 1.0f / scale;
    } else if (a.scale_inv) {
      *a.scale_inv = 1.0f / *a.scale;
    }
  }
}
#endif

}  // namespace qf
