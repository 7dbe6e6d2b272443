// Launch arguments of the quantize kernels. Included by the generated kernels (NVRTC) and by
// the host runtime (runtime/), so the struct the host fills is, by construction, the struct
// the kernel reads: one definition, one layout, passed by value as the kernel's only parameter.
#pragma once
#include "qforge/types.cuh"

namespace qf {

constexpr int kMaxStreams = 2;       // rowwise + columnwise
constexpr int kMaxAmaxSlots = 4;     // amax sources a plan may have

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
  // 1 on the one-launch form's cooperative launch of a kernel that also serves the separate
  // launches (cast.cuh cast_fused_kernel), else 0.
  i32 one_launch;
};

}  // namespace qf
