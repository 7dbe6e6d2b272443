// Grouped GEMM (fp8, int8, NVFP4, bf16 / fp16, weight-only int8) on a GPU: the spec's kernel, compiled (or loaded from the kernel cache) for
// the current device's arch, validated arguments, TMA descriptors, a persistent launch.
//
//   qf::GemmSpec spec;  spec.scaling = qf::GemmScaling::Block128;  spec.n = 4096;  spec.k = 7168;
//   qf::rt::Gemm gemm(spec);
//   gemm.run({.a = ..., .b = ..., .d = ..., .a_scale = ..., .b_scale = ...,
//             .group_offsets = ..., .m_total = M, .num_groups = G}, stream);
//
// Contiguous layout: group g owns rows [offsets[g], offsets[g+1]) of A and D. Masked layout
// (inference, e.g. [G, M_max, K] expert buffers): group g owns rows [g * m_max, g * m_max +
// counts[g]). Offsets and counts live on the device (int64, read by the kernel: no host sync,
// CUDA-graph safe). Rows of D outside every group are not written.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <cuda.h>

#include "compiler/gemm_codegen.h"
#include "runtime/kernel_cache.h"
#include "runtime/tensor.h"

namespace qf {
struct GemmArgs;  // templates/qforge/gemm_args.cuh
}

namespace qf::rt {

// UserError unless a call of num_groups groups over `extent` (m_total; K-grouped: k_total) is
// one the GEMM takes: the extent and group bounds, every operand within 2^50 elements (errors
// name the extent extent_arg).
void check_gemm_call_size(const GemmSpec& spec, int64_t extent, int64_t num_groups, const std::string& extent_arg = "extent");

// The spec's kernel for one arch, from the cache (compiled on a miss).
struct GemmKernel {
  GemmSource source;
  CacheResult cached;
};
GemmKernel build_gemm_kernel(const GemmSpec& spec, const std::string& arch, KernelCache& cache);
// The dequant route's operand kernels (GemmRoute::Dequant) for one arch, from the cache.
struct DequantKernels {
  DequantSource source;
  CacheResult cached;
};
DequantKernels build_dequant_kernels(const GemmSpec& spec, const std::string& arch, KernelCache& cache);

struct GemmCall {
  TensorView a;              // fp8 / int8 [m_total, K] (K-grouped: [m, k_total]; nvfp4: packed e2m1 [m_total, K/2] or
                             // [m, k_total/2]; bf16 / fp16: 2 bytes per element), 16-byte aligned
  TensorView b;              // fp8 / int8 [num_groups, N, K] (K-grouped: [N, k_total]; nvfp4: [num_groups, N, K/2] or
                             // [N, k_total/2]; bf16 / fp16 with none), 16-byte aligned
  TensorView d;              // [m_total, N] (K-grouped: [num_groups, m, N]) bf16 or fp32, 16-byte aligned
  TensorView a_scale;        // fp32 (e8m0 bytes for mxfp8, e4m3 bytes for nvfp4), shape per scaling; none for
                             // bf16 / fp16 operands (gemm_a_scaled, gemm_b_scaled)
  TensorView b_scale;        // (gemm_scale_elems); 4-byte aligned (nvfp4: 16)
  TensorView a_amax;         // nvfp4 only: fp32 [num_groups], the per-tensor amax of each group's A rows
  TensorView b_amax;         // nvfp4 only: fp32 [num_groups], the amax of each B[g] (global decode scales);
                             // K-grouped: the amax of the A and of the B copy that group g's tokens
                             // were quantized with (one tensor each: the same value G times)
  TensorView alpha;          // optional fp32 [num_groups]
  TensorView group_offsets;  // contiguous layout: int64 [num_groups + 1] row offsets, on the device
                             // (K-grouped: token offsets into k_total)
  TensorView group_counts;   // masked layout: int64 [num_groups] rows used per group slot, on the
                             // device (clamped to [0, m_max]); give exactly one of the two
  int64_t m_max = 0;         // masked layout: rows per group slot (> 0); m_total = num_groups * m_max
  int64_t m_total = 0;       // rows of A and D, < 2^31 (K-grouped: 0)
  int64_t k_total = 0;       // K-grouped: the token dimension of A [m, k_total] and B [N, k_total],
                             // a multiple of 16 (nvfp4: 32); group_offsets split it
  int num_groups = 0;        // 1 .. 2^20
  int max_ctas = 0;          // cap on the persistent CTAs (e.g. to leave SMs to other streams);
                             // 0: one per SM, or as many clusters as fit at once
  TensorView workspace;      // k_grouped_members: workspace_bytes() of device memory, 128-byte aligned,
                             // where the kernel builds each member's tensor maps (one run at a time);
                             // dequant route (and auto, where it takes that route): workspace_bytes(extent,
                             // num_groups), 256-byte aligned, the operands' 16-bit copies; ignored otherwise
  bool pointers_checked = false;  // the caller vouches that every pointer is device memory of the current
                                  // device (a binding over tensors it checked): run() skips the driver's
                                  // per-pointer attribute queries (about a microsecond each)
};


class Gemm {
 public:
  // Validates the spec (UserError naming the field) and resolves its tile (GemmRoute::Auto: the
  // fused kernel's; an Auto spec without a dequant route becomes Fused).
  explicit Gemm(GemmSpec spec, KernelCache& cache = KernelCache::global());

  const GemmSpec& spec() const { return spec_; }  // tile resolved
  const GemmTile& tile() const { return spec_.tile; }

  // Validates every argument (UserError naming it), then launches on `stream` in the current
  // context. The first call per device compiles or loads the kernel.
  void run(const GemmCall& call, CUstream stream) const;

  // The route a call of num_groups groups over `extent` (m_total; K-grouped: k_total) takes
  // (choose_gemm_route): Fused or Dequant.
  // UserError naming extent or num_groups where the call could not be run.
  GemmRoute route_for(int64_t extent, int num_groups) const;

  // Compiles (or loads) for `arch` (only sm_90a: UserError otherwise) without a GPU (Auto: both
  // routes' kernels); returns how the cache answered.
  CacheHow prepare(const std::string& arch) const;

  // Persistent CTAs a launch on the current device uses at most (loads the kernel; auto: the more of
  // its two routes' GEMM kernels).
  int persistent_ctas() const;

  // Device workspace a run on the current device needs (GemmCall::workspace): k_grouped_members
  // keeps a ring of (load slots + 1) A and B tensor maps per persistent CTA (the load slots are
  // the stages but for NVFP4, gemm_member_map_count); 0 for the other layouts. The dequant route's
  // depends on the call: the overload below (this one throws UserError for it).
  int64_t workspace_bytes() const;
  // The same for a call of num_groups groups over `extent` rows (m_total; K-grouped: k_total
  // tokens): the dequant route's 16-bit copies of both operands (dequant_workspace; members: and
  // the none GEMM's tensor-map ring, sized by the device's SMs), else as above. No GPU needed for
  // the dequant route but with k_grouped_members.
  int64_t workspace_bytes(int64_t extent, int num_groups) const;

 private:
  struct Loaded;
  std::shared_ptr<const Loaded> load_for_current_device() const;
  int64_t workspace_bytes(const Loaded& l) const;
  void check_call_size(int64_t extent, int64_t num_groups) const;  // route_for's and workspace_bytes' arguments
  int64_t inner_workspace_bytes() const;  // dequant route: the none GEMM's own (members: its tensor maps)
  void run_k_grouped(const GemmCall& call, CUstream stream) const;
  struct LoadedDequant;
  std::shared_ptr<const LoadedDequant> load_dequant_for_current_device() const;
  // The dequant route, after run / run_k_grouped checked the call as the fused kernel takes it.
  void run_dequant(const GemmCall& call, CUstream stream) const;
  void launch_persistent(const Loaded& l, GemmArgs& args, int64_t units, int max_ctas, CUstream stream) const;

  GemmSpec spec_;
  KernelCache& cache_;
  std::unique_ptr<Gemm> inner_;  // dequant route: the none GEMM on the copies
  std::unique_ptr<Gemm> routes_[2];  // auto route: the fused and the dequant route's, by GemmRoute
  mutable std::mutex mu_;
  mutable std::map<int, std::shared_ptr<const Loaded>> loaded_;  // by device
  mutable std::map<int, std::shared_ptr<const LoadedDequant>> loaded_dequant_;
};

}  // namespace qf::rt
