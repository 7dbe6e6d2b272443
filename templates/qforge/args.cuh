// Launch arguments of the quantize kernels. Included by the generated kernels (NVRTC) and by
// the host runtime (runtime/), so the struct the host fills is, by construction, the struct
// the kernel reads: one definition, one layout, passed by value as the kernel's only parameter.
#pragma once
#include "qforge/types.cuh"

namespace qf {

constexpr int kMaxStreams = 2;       // rowwise + columnwise
constexpr int kMaxAmaxSlots = 4;     // amax sources a plan may have

// Unsigned division by a divisor fixed at launch, for dividends below 2^31: one multiply-high
// and a shift (the round-up multiplier method; init() on the host).
struct FastDiv {
  u32 d;      // divisor (>= 1)
  u32 m;      // multiplier
  u32 shift;  // right shift after the multiply-high
  QF_HD u32 div(u32 n) const {
#if defined(__CUDA_ARCH__)
    return d == 1 ? n : __umulhi(n, m) >> shift;
#else
    return d == 1 ? n : u32((u64(n) * m) >> 32) >> shift;
#endif
  }
  QF_HD static FastDiv make(u32 divisor) {
    FastDiv f{divisor, 0, 0};
    if (divisor <= 1) return f;
    u32 log2 = 0;
    while ((u64(1) << log2) < divisor) ++log2;  // ceil(log2(d))
    const u32 p = 31 + log2;
    f.m = u32(((u64(1) << p) + divisor - 1) / divisor);
    f.shift = p - 32;
    return f;
  }
};

constexpr int kBandRows = 8;  // tile rows per band of the persistent walk (cast.cuh tile_coords)

struct StreamArgs {
  void* data;             // quantized (or identity) elements
  void* scale_inv;        // per-block / per-tensor dequantization scales (may be null: none)
  const float* scale_in;  // delayed scaling: the scale to apply (device scalar)
};

struct QuantizeArgs {
  const void* x;          // input [M, K] row-major, the plan's input dtype
  i64 m;                  // rows (grouped: total rows of the buffer)
  i64 k;                  // columns
  const float* noop;      // optional: *noop == 1.0f makes the launch a no-op (CUDA graphs)
  StreamArgs streams[kMaxStreams];
  // Per amax source (the plan's index): tensor-scope sources point at the amax output
  // ([1], grouped [N]); channel-scope sources at a workspace ([M] per row, or [N*K] per column);
  // block-scope sources are kept on chip and have no pointer.
  float* amax[kMaxAmaxSlots];
  u64 seed;               // stochastic rounding (Philox key)
  u64 offset;             // stochastic rounding (Philox counter offset)
  // Grouped tensors: member i owns rows [member_rows[i], member_rows[i+1]) of x; read on the
  // device so the launch needs no host sync. Null for a single tensor.
  const i64* member_rows;  // [num_members + 1], member_rows[0] == 0
  i32 num_members;
  // Tile rows the launch walks: ceil(m / tile rows), grouped: + num_members (each member may
  // end in a partial tile). Persistent CTAs take tiles blockIdx.x, + gridDim.x, ...
  i64 tile_rows;
  i64 walk_tiles;     // walk indices: ceil(tile_rows / kBandRows) * kBandRows * tile columns
  FastDiv band_div;   // by kBandRows * tile columns
};

}  // namespace qf
