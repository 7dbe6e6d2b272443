// Delayed scaling's bookkeeping kernels (docs/numerics.md, "Delayed scaling"): roll the amax
// history by one slot (slot 0 the newest), put this step's amax in slot 0, and recompute the
// scale from the window. One block per history; the history length is baked into Cfg, so each
// thread keeps its slots in registers between the read and the write.
//
// amax_history_kernel: one tensor. Cfg: kLength (slots), kThreads, kMargin, kMostRecent
// (amax_compute), kFmax (format max).
// amax_history_batch_kernel: every tensor of a model whose histories have kLength slots, in one
// launch (a block per tensor, grid-stride); each entry carries its own rule (margin, amax_compute,
// format max), run through the same per-history code, so each entry's result is bit-identical to
// amax_history_kernel's for that rule. Cfg: kLength, kThreads.
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

// One tensor of a batched update (an array of these lives on the device).
struct HistoryBatchEntry {
  float* history;       // [kLength] fp32, updated in place
  const float* amax;    // this step's amax
  float* scale;         // updated in place (kept when the window's amax is 0 or not finite)
  float* scale_inv;     // optional: 1 / scale
  float fmax;           // the format's largest finite value
  i32 margin;           // scale = fmax / amax * 2^-margin
  i32 most_recent;      // 1: the newest amax, 0: the window's max
};

struct HistoryBatchArgs {
  const HistoryBatchEntry* entries;  // [count], on the device
  i32 count;
  const float* noop;                 // optional: *noop == 1.0f skips the whole update
};

#if defined(__CUDACC__)
// One history, by one block of kThreads threads (every thread calls it: it synchronizes).
template <int kLength, int kThreads>
__device__ __forceinline__ void amax_history_update(float* history, const float* amax_in, float* scale_out,
                                                    float* scale_inv, float fmax, int margin, bool most_recent) {
  constexpr int kPer = (kLength + kThreads - 1) / kThreads;
  const float newest = *amax_in;
  float moved[kPer];
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = j * kThreads + threadIdx.x;
    moved[j] = 0.0f;
    if (i < kLength) {
      moved[j] = i == 0 ? newest : history[i - 1];
      m = fmaxf(m, moved[j]);
    }
  }
  __syncthreads();  // every old value is read before any is overwritten
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = j * kThreads + threadIdx.x;
    if (i < kLength) history[i] = moved[j];
  }
  __shared__ float warp_max[32];
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    float window = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) window = fmaxf(window, warp_max[w]);
    const float amax = most_recent ? newest : window;
    if (f32_is_finite(amax) && amax > 0.0f) {
      const float scale = (fmax / amax) * exp2i(-margin);
      *scale_out = scale;
      if (scale_inv) *scale_inv = 1.0f / scale;
    } else if (scale_inv) {
      *scale_inv = 1.0f / *scale_out;
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) amax_history_kernel(const HistoryArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  amax_history_update<Cfg::kLength, Cfg::kThreads>(a.history, a.amax, a.scale, a.scale_inv, Cfg::kFmax,
                                                   int(Cfg::kMargin), bool(Cfg::kMostRecent));
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) amax_history_batch_kernel(const HistoryBatchArgs b) {
  if (b.noop && *b.noop == 1.0f) return;
  for (int e = blockIdx.x; e < b.count; e += gridDim.x) {
    const HistoryBatchEntry t = b.entries[e];
    amax_history_update<Cfg::kLength, Cfg::kThreads>(t.history, t.amax, t.scale, t.scale_inv, t.fmax, t.margin,
                                                     t.most_recent != 0);
    __syncthreads();  // warp_max is reused by the next entry
  }
}
#endif

}  // namespace qf
