// Grouped fp8 / int8 / bf16 / fp16 GEMM for Hopper (sm_90a; NVFP4 dequantized on chip: gemm_nvfp4.cuh). Generated code (compiler/gemm_codegen.cpp) defines one
// config struct with named constants (formats, scaling, N, K, output, tile shape) and names
// gemm_kernel<Cfg>; everything else is here, as ordinary CUDA.
//
// Problem (gemm_args.cuh): M-grouped, D[rows of g] (+)= alpha[g] * A[rows of g] * B[g]^T
// with A [m_total, K] and B [G, N, K] K-major fp8 (e4m3 or e5m2, independently), both int8 or both
// bf16 / fp16 (the identity copies; a stage then holds 64 of K: wgmma m64nNk16), or bf16 / fp16 A
// with int8 B converted on chip (weight-only int8, per-channel B scales), D [m_total, N]
// bf16 or fp32. Group row ranges come from a device offsets array, read in the kernel, so a
// launch needs no host sync and can be captured in a CUDA graph. Layouts: contiguous (offsets
// [G + 1]) or masked (A [G, m_max, K], counts [G]: group g uses the first counts[g] rows of its slot).
//
// Kernel shape (one CTA per SM, persistent):
//   * warpgroups 0..kConsumers-1 are consumers: each owns 64 rows of the block_m x block_n tile
//     and runs wgmma (m64nNk32 for 8-bit operands, m64nNk16 for 16-bit ones) from shared memory;
//     the last warpgroup is the producer: one warp issues TMA loads (128-byte swizzle, zero fill
//     out of bounds) into a kStages-deep ring of shared-memory stages, each guarded by a "full"
//     and an "empty" mbarrier (B converted on chip: NVFP4's two producer warpgroups dequantize it,
//     weight-only int8's four producer warps convert it, between the loads and "full").
//     setmaxnreg moves registers from the producer to the consumers.
//   * A tile scheduler walks the tiles of every group in order (bands of kRasterM m-blocks,
//     n-blocks inside a band, for L2 reuse); CTA (or cluster) i takes tiles i, i + grid, ...
//     Tiles start at their group's first row; the last m-block of a group reads rows of the next
//     group (or TMA zero fill past m_total), which only feed output rows that are never stored.
//   * kMulticast == 2: clusters of two CTAs take n-adjacent tiles of the same m-block; each loads
//     half of the A tile and multicasts it to both (halving A's L2 traffic).
//   * kOrderedIssue (two consumer warpgroups): the warpgroups issue their MMAs of a k-block in
//     turn (WG0, WG1, WG0, ...; two "turn" mbarriers), so the tensor cores run one warpgroup's
//     MMAs while the other promotes its previous partial sum, instead of both waiting together.
//   * One k-block = one stage = 128 bytes of each operand row (128 of K; 64 for 16-bit operands:
//     stage_k; NVFP4: 128 of K in 64 bytes). Scaling policies (gemm_scaling.cuh) decide what happens per
//     k-block (fp32 promotion: the tensor-core partial sum is scaled and added into an fp32
//     accumulator in registers) and in the epilogue (per-tensor / per-row / per-column factors).
//   * Epilogue: fragments -> shared memory (padded, conflict-free) -> 16-byte coalesced stores,
//     rows clipped to the group's end and m_total, columns to N; optional accumulate into fp32 D.
//
// Numerics: products of fp8 values are exact; the tensor cores add them with their own (reduced,
// implementation-defined) precision within a k-block (or over all of K without promotion); int8
// sums are exact s32, converted to fp32 once per promoted step or once after all of K; all
// other arithmetic is explicit IEEE fp32 (fmaf where fused); bf16 output rounds RNE through
// numerics.cuh. The CPU reference (reference/gemm.h) states the error bound.
//
// This header is the entry point: the parts of the kernel are the headers below, one idea each,
// and the kernel itself, which gives each warpgroup its role, is at the end.
#pragma once
#include "qforge/gemm_args.cuh"
#include "qforge/gemm_smem.cuh"  // (host and device) scaling codes, stage constants, shared-memory layout
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

#if defined(__CUDACC__)
#include "qforge/wgmma.cuh"                 // the warpgroup MMAs (generated)
#include "qforge/sm90.cuh"                  // PTX wrappers: mbarriers, TMA, bulk copies, tensor maps, barriers
#include "qforge/gemm_traits.cuh"           // what a Cfg implies: warpgroups, registers, barriers, checks
#include "qforge/gemm_schedule.cuh"         // tiles, fragments, the persistent tile scheduler
#include "qforge/gemm_scaling.cuh"          // the scaling-policy interface; per-tensor / row / channel kinds
#include "qforge/gemm_scaling_block128.cuh" // M-grouped blockwise: scales in registers, loaded ahead
#include "qforge/gemm_scaling_slots.cuh"    // MX, K-grouped blockwise: scales in the stages' slots
#include "qforge/gemm_producer.cuh"         // TMA loads, scale-slot writers, member tensor maps
#include "qforge/gemm_int8_b.cuh"           // weight-only int8: B converted to 16 bits on chip
#include "qforge/gemm_epilogue.cuh"         // tile -> D: staged coalesced stores, or TMA stores
#include "qforge/gemm_consumer.cuh"         // the wgmma main loop, promotion, stage release
#include "qforge/gemm_nvfp4.cuh"            // NVFP4: e2m1 -> fp16 on chip, policy, producer, consumer

namespace qf {

// The grouped GEMM kernel: (kConsumers + 1) warpgroups, one CTA per SM, grid = the persistent
// CTA count (a multiple of kMulticast), dynamic shared memory Cfg::kSmemBytes.
template <class Cfg>
__global__ void __launch_bounds__(gemm::Traits<Cfg>::kThreads, 1) gemm_kernel(const __grid_constant__ GemmArgs a) {
  using T = gemm::Traits<Cfg>;
  extern __shared__ __align__(1024) u8 gemm_smem_raw[];
  const u32 raw = sm90::smem_addr(gemm_smem_raw);
  const u32 base = gemm_align_up(raw, 1024);
  u8* smem = gemm_smem_raw + (base - raw);
  const int wg = int(threadIdx.x / 128);

  if (threadIdx.x == 0) {
    const u32 full0 = base + T::kSmem.bar_off, empty0 = full0 + 8u * T::kStages;
    for (int s = 0; s < T::kStages; ++s) {
      sm90::mbar_init(full0 + 8u * s, T::kFullArrivals);
      sm90::mbar_init(empty0 + 8u * s, T::kEmptyArrivals);
    }
    sm90::mbar_init(empty0 + 8u * T::kStages, 4);  // turn[0]: the four warps of WG1 arrive
    sm90::mbar_init(empty0 + 8u * T::kStages + 8u, 4);
    if constexpr (T::kFp4 || T::kConvertB)
      for (int s = 0; s < T::kLoadSlots; ++s) sm90::mbar_init(base + T::kLoadedBar + 8u * s, 1);  // loaded[slot]
    if constexpr (T::kFp4)
      for (int s = 0; s < T::kLoadSlots; ++s) sm90::mbar_init(base + T::kFreeBar + 8u * s, T::kLoadFreeArrivals);
    sm90::fence_barrier_init();
    sm90::fence_proxy_async_shared();
  }
  u32 rank = 0;
  if constexpr (T::kMc > 1) {
    rank = sm90::cluster_ctarank();
    sm90::cluster_sync();
  } else {
    __syncthreads();
  }

  // (Written as == for one producer warpgroup: with >=, ptxas serializes the wgmmas of the
  // one-consumer kernels, C7518.)
  if (T::kProducerGroups == 1 ? wg == T::kConsumers : wg >= T::kConsumers) {
    if constexpr (T::kConsumers > 1) sm90::setmaxnreg_dec<T::kProducerRegs>();
    const int pw = int(threadIdx.x / 32) - T::kConsumers * 4;  // warp in the producer warpgroup
    if constexpr (T::kFp4) {
      gemm::fp4_producer<Cfg>(a, smem, base, pw, int(threadIdx.x % 32));
    } else if constexpr (T::kConvertB) {
      gemm::i8_producer<Cfg>(a, smem, base, pw, int(threadIdx.x % 32));
    } else {
      if (pw == 0) gemm::producer<Cfg>(a, smem, base, rank, int(threadIdx.x % 32));
      else if constexpr (T::kScaleWriters > 0) gemm::scale_writer<Cfg>(a, smem, base, rank, pw - 1, int(threadIdx.x % 32));
    }
  } else {
    if constexpr (T::kConsumers > 1) sm90::setmaxnreg_inc<T::kConsumerRegs>();
    if constexpr (T::kFp4) gemm::consumer_fp4<Cfg>(a, smem, base, wg);
    else gemm::consumer<Cfg>(a, smem, base, rank, wg);
  }

  // K-grouped epilogues store through the tensor engine: the staging must outlive its reads, and
  // the stores be done with the kernel (a thread without bulk groups passes at once). Here rather
  // than after the consumers' tile loop, where any code makes ptxas spill the consumers' registers.
  if constexpr (Cfg::kKGrouped) sm90::bulk_wait_all();
  if constexpr (T::kMc > 1) {
    // Neither CTA may exit while its peer can still multicast into it or arrive on its barriers.
    __syncwarp();
    sm90::cluster_sync();
  }
}


}  // namespace qf

#endif  // __CUDACC__
