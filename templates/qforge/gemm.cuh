// Grouped fp8 / int8 / bf16 / fp16 GEMM for Hopper (sm_90a; NVFP4 dequantized on chip, below). Generated code (compiler/gemm_codegen.cpp) defines one
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
//     stage_k; NVFP4: 128 of K in 64 bytes). Scaling policies (below) decide what happens per
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
#pragma once
#include "qforge/gemm_args.cuh"
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

namespace qf {

// Scaling kinds, in the order of GemmScaling in compiler/gemm_codegen.h.
// kGemmBlock128K has no GemmScaling of its own: it is blockwise scaling in the K-grouped layout
// (wgrad), where both operands carry 1x128 blocks along the tokens (Block128KScaling).
enum GemmScalingCode : int {
  kGemmPerTensor = 0, kGemmRowChannel = 1, kGemmBlock128 = 2, kGemmMx32 = 3, kGemmNvfp4 = 4, kGemmNone = 5,
  kGemmChannel = 6, kGemmBlock128K = 7
};

constexpr int kGemmMmasPerStage = 4;       // MMAs per stage from shared memory: 32 bytes of K each
constexpr int kGemmBlockK = 128;           // K per stage: one 128-byte swizzle row of fp8 (16-bit
                                           // operands: 64, gemm::stage_k; packed e2m1: 64 bytes)
constexpr u32 kGemmSmemLimit = 232448;     // sm_90 opt-in dynamic shared memory per block
constexpr u32 kGemmSmemAlignSlack = 1024;  // the dynamic window is aligned up to 1024 in-kernel

// K-grouped kernels store their output through the tensor engine (epilogue_tma): a pass's
// staging is boxes of 64 rows x 128 bytes in the 128-byte swizzle, each 1024-byte aligned.
constexpr int kGemmEpiBoxBytes = 128;

// Output columns per epilogue pass (bf16: the whole tile; fp32, NVFP4 and weight-only int8: 64, to
// bound the staging memory: NVFP4 needs the room for its load slots, int8 B for a fourth stage)
// and the staging row pitch in 32-bit words. Pitches are chosen so that fragment stores hit 32 distinct banks: fp32 pairs (8-byte stores, half-warps of
// 4 rows x 4 lanes) need pitch = 8 (mod 32), packed bf16 pairs (4-byte stores, 8 rows x 4 lanes)
// need pitch = 4 (mod 32).
QF_HD constexpr int gemm_epi_cols(int block_n, int out_bytes, int scaling) {
  return out_bytes == 4 || scaling == kGemmNvfp4 || scaling == kGemmChannel ? 64 : block_n;
}
QF_HD constexpr int gemm_staging_pitch(int epi_cols, int out_bytes) {
  return out_bytes == 4 ? epi_cols + 8 : epi_cols / 2 + 4;
}

// Shared-memory layout (byte offsets from the 1024-aligned base), host and device.
struct GemmSmem {
  u32 a_off, a_stage;      // A stages: block_m rows x 128 bytes each (NVFP4: x 64 bytes, packed e2m1,
                           // one per load slot)
  u32 b_off, b_stage;      // B stages: block_n rows x 128 bytes each (NVFP4: the dequantized fp16
                           // B, two 128-byte-swizzled halves of block_n rows x 64 K each)
  u32 braw_off, braw_stage;  // NVFP4: B as loaded, block_n rows x 64 bytes (64-byte swizzle), one per load
                             // slot. (Weight-only int8 B lands unswizzled in the upper half of its B
                             // stage, converted in place.)
  u32 sc_off, sc_stage;    // per-stage scales (gemm_stage_scale_bytes)
  u32 staging_off, staging_wg;  // epilogue staging, one region per consumer warpgroup
  u32 col_off;             // per-column scales, block_n floats per consumer warpgroup
  u32 maps_off;            // K-grouped members: the producer's A and B tensor maps being built (2 x 128 bytes)
  u32 bar_off;             // full[stages], empty[stages], turn[2] mbarriers; then weight-only int8:
                           // loaded[stages]; NVFP4: loaded[load slots], free[load slots]
  u32 load_slots;          // TMA load slots: NVFP4's ring of A and raw B (gemm_smem), else the stages
  u32 total;               // dynamic shared memory to request (includes the alignment slack)
};

QF_HD constexpr u32 gemm_align_up(u32 v, u32 a) { return (v + a - 1) / a * a; }

// Bytes of one stage's scale slot: MX: the fp32 factors of the stage's four 32-wide k-steps,
// [4][block_m] for A then [4][block_n] for B; K-grouped blockwise: the k-block's, [block_m] then
// [block_n]; none for the other kinds (M-grouped 1x128 blocks: the consumers load their scales
// into registers).
QF_HD constexpr u32 gemm_stage_scale_bytes(int scaling, int block_m, int block_n) {
  return scaling == kGemmMx32 ? 4u * u32(block_m + block_n) * 4u
         : scaling == kGemmBlock128K ? u32(block_m + block_n) * 4u
                                     : 0u;
}

// The layout with `loads` TMA load slots (the stages' own count but for NVFP4; gemm_smem).
QF_HD constexpr GemmSmem gemm_smem_with(int block_m, int block_n, int stages, int loads, int consumers, int scaling,
                                        bool col_scales, int out_bytes, bool tma_epilogue, bool member_maps) {
  GemmSmem s{};
  const bool fp4 = scaling == kGemmNvfp4;
  s.load_slots = u32(loads);
  s.a_stage = u32(block_m) * (fp4 ? 64u : 128u);
  s.b_stage = u32(block_n) * (fp4 ? 256u : 128u);
  s.braw_stage = fp4 ? u32(block_n) * 64u : 0u;
  s.a_off = 0;
  s.b_off = s.a_off + s.load_slots * s.a_stage;  // 1024-aligned: the swizzle pattern repeats every 1024 bytes
  s.braw_off = s.b_off + u32(stages) * s.b_stage;
  s.sc_stage = gemm_stage_scale_bytes(scaling, block_m, block_n);
  s.sc_off = s.braw_off + s.load_slots * s.braw_stage;
  const int epi = gemm_epi_cols(block_n, out_bytes, scaling);
  s.staging_wg = tma_epilogue ? gemm_align_up(64u * u32(epi * out_bytes), 1024)
                              : 64u * u32(gemm_staging_pitch(epi, out_bytes)) * 4u;
  s.staging_off = gemm_align_up(s.sc_off + u32(stages) * s.sc_stage, tma_epilogue ? 1024 : 16);
  s.col_off = s.staging_off + u32(consumers) * s.staging_wg;
  s.maps_off = gemm_align_up(s.col_off + (col_scales ? u32(consumers * block_n) * 4u : 0u), member_maps ? 128 : 8);
  s.bar_off = s.maps_off + (member_maps ? 2u * 128u : 0u);
  const u32 bars = 2u * u32(stages) + 2u + (fp4 ? 2u * s.load_slots : scaling == kGemmChannel ? u32(stages) : 0u);
  s.total = s.bar_off + bars * 8u + kGemmSmemAlignSlack;
  return s;
}

// NVFP4 loads A and raw B into a ring of TMA load slots of its own, deeper than the stages that
// hold the dequantized fp16 B: a load slot is free once the consumers have read its A and the
// producers have dequantized its B, long before the MMAs that read the stage are done, so the
// loads run further ahead than the stages would let them. Slots: stages + 3 where they fit (the
// loads run four k-blocks ahead of the dequantization), down to stages + 1 (two ahead); measured
// on an H100 at 8 x 4096 x 4096 x 7168, 3 stages: 6 slots 485-496 TFLOP/s against 5 slots
// 467-477 (bf16 out); with fp32 out (whose staging leaves room for 5), 3 stages and 5 slots
// 481-484 against 2 stages and 5 slots 465. The K-grouped kernels' smaller staging (the tensor
// engine's boxes) fits 4 stages and 5 slots with bf16 out (3 + 6 with fp32): wgrad 453-454
// against 443-449 with 3 + 6, members 462-467 against 457-462. The other kinds load into their
// stages.
QF_HD constexpr GemmSmem gemm_smem(int block_m, int block_n, int stages, int consumers, int scaling, bool col_scales,
                                   int out_bytes, bool tma_epilogue = false, bool member_maps = false) {
  const bool fp4 = scaling == kGemmNvfp4;
  int loads = fp4 ? stages + 3 : stages;
  while (fp4 && loads > stages + 1 &&
         gemm_smem_with(block_m, block_n, stages, loads, consumers, scaling, col_scales, out_bytes, tma_epilogue,
                        member_maps).total > kGemmSmemLimit)
    --loads;
  return gemm_smem_with(block_m, block_n, stages, loads, consumers, scaling, col_scales, out_bytes, tma_epilogue,
                        member_maps);
}

// K-grouped members: tensor-map pairs {A, B} per persistent CTA in the workspace, a ring the
// producer reuses once every load that read a slot is complete (MemberMaps): one more than the
// load slots (GemmSmem::load_slots).
QF_HD constexpr int gemm_member_map_slots(int load_slots) { return load_slots + 1; }

#if defined(__CUDACC__)
}  // namespace qf
#include "qforge/wgmma.cuh"
namespace qf {
namespace sm90 {

// ------------------------------------------------------------------ PTX wrappers (sm_90a)

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Arrive on the mbarrier at the same shared-memory offset in CTA `cta` of this cluster.
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 cta) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar), "r"(cta)
      : "memory");
}
__device__ __forceinline__ u32 mbar_try_wait(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done;
}
__device__ __forceinline__ u64 global_timer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Waits for the phase of `parity` to complete. A wait of more than 4 s is a bug (a lost
// arrival, a TMA fault): the kernel traps (the launch fails with an illegal-instruction error)
// instead of hanging. No printf here: a call inside the main loop would serialize the wgmmas.
// (A suspending try_wait, mbarrier.try_wait with a time hint, measured +2.5% on NVFP4 and -3% on
// blockwise, and ptxas serializes the wgmmas of the one-consumer kernels with it: C7518.)
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  if (mbar_try_wait(bar, parity)) return;
  const u64 start = global_timer_ns();
  for (u32 spins = 1;; ++spins) {
    if (mbar_try_wait(bar, parity)) return;
    if ((spins & 0xFFFu) == 0 && global_timer_ns() - start > 4000000000ull) __trap();
  }
}

__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// `bytes` (a multiple of 16) from global `src` to shared `dst` (both 16-byte aligned) by the tensor
// engine, completing that many transaction bytes on `bar`.
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(reinterpret_cast<u64>(src)), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void tma_load_2d(u32 dst, const TmaDescriptor* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d_multicast(u32 dst, const TmaDescriptor* map, u32 bar, int c0, int c1,
                                                      u16 cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(u32 dst, const TmaDescriptor* map, u32 bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// Shared -> global through the tensor engine: a plain store of the box, or (reduce_add) D += box
// element-wise in fp32, done at L2. Completion by bulk groups: commit, then wait_group.read before
// the source is written again (its reads are done), wait_group before the CTA exits.
template <bool kReduceAdd>
__device__ __forceinline__ void tma_store_3d(const TmaDescriptor* map, u32 src, int c0, int c1, int c2) {
  if constexpr (kReduceAdd) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     reinterpret_cast<u64>(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
  } else {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     reinterpret_cast<u64>(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
  }
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Tensor maps rewritten on the device (K-grouped members): fields of a map in shared memory, then
// the warp's copy to global memory with a release of the tensormap proxy, then this thread's acquire
// of that global copy before its TMA instructions use it.
__device__ __forceinline__ void tensormap_set_address(u32 map, u64 addr) {
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" ::"r"(map), "l"(addr) : "memory");
}
__device__ __forceinline__ void tensormap_set_inner(u32 map, u32 dim0, u64 stride1) {
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %1;" ::"r"(map), "r"(dim0) : "memory");
  asm volatile("tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %1;" ::"r"(map), "l"(stride1) : "memory");
}
__device__ __forceinline__ void tensormap_publish(TmaDescriptor* dst, u32 src) {
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;" ::"l"(
          reinterpret_cast<u64>(dst)),
      "r"(src)
      : "memory");
}
__device__ __forceinline__ void tensormap_acquire(const TmaDescriptor* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}
__device__ __forceinline__ void tma_prefetch_descriptor(const TmaDescriptor* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Tells the compiler a register may change here (keeps accumulator reads after wgmma waits).
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(u32& r) { asm volatile("" : "+r"(r)::"memory"); }

// Shared-memory matrix descriptor of a K-major tile written by TMA with the 128-byte swizzle:
// rows of 128 bytes, 8-row groups 1024 bytes apart (stride byte offset), layout type 1.
// Moving along K inside the 128-byte row is done by adding bytes / 16 to the start address.
__device__ __forceinline__ u64 smem_desc_sw128(u32 addr) {
  return (u64(1) << 62) | (u64(1024 >> 4) << 32) | u64((addr >> 4) & 0x3FFFu);
}

template <u32 R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
template <u32 R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}

// fp16x2 multiply, round to nearest, subnormals kept (no .ftz).
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
  u32 d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// Two e4m3 values (low byte -> low half) to fp16x2, exactly.
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 two_bytes) {
  u32 d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(u16(two_bytes)));
  return d;
}
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ void named_barrier(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ u32 cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
}

}  // namespace sm90

namespace gemm {

template <bool C, class X, class Y>
struct Pick {
  using type = X;
};
template <class X, class Y>
struct Pick<false, X, Y> {
  using type = Y;
};

// 16-bit MMA operands (the quantize kernels' identity copies, as they are): the format traits
// the wgmma wrappers dispatch on (kBits 16; bf16 has 8 exponent bits, fp16 5).
struct Bf16Operand {
  static constexpr int kBits = 16, kExpBits = 8;
  static constexpr bool kIsInt = false;
};
struct Fp16Operand {
  static constexpr int kBits = 16, kExpBits = 5;
  static constexpr bool kIsInt = false;
};

// K per stage (k-block): one 128-byte row of 8-bit operands (128) or of 16-bit ones (64); packed
// e2m1 stages 128 of K in 64 bytes.
template <class Cfg>
QF_HD constexpr int stage_k() {
  return kGemmBlockK / int(Cfg::kElemBytes);
}
// Bytes of `tokens` elements of an operand row.
template <class Cfg>
__device__ __forceinline__ i64 k_bytes(i64 tokens) {
  return tokens * int(Cfg::kElemBytes) / int(Cfg::kElemsPerByte);
}

// One output tile. M-grouped: rows [row0, row0 + block_m) of A and D, of group `group` (stores
// stop at row_end), columns [n0, n0 + block_n), the whole K. K-grouped: rows [row0, ...) of A
// and of D[group] (out_row0 = group * kM + row0), K restricted to the group's range [k0, k0 +
// k_len) of the shared token dimension. Rows and K fit in 31 bits (the host checks).
struct TileInfo {
  int row0;
  int row_end;  // M-grouped: min(group end, m_total); K-grouped: kM
  int n0;
  int group;
  int out_row0;  // row of D holding tile row 0 (M-grouped: row0)
  int k0;        // first K the tile loads (K-grouped: a multiple of stage_k, Scheduler::kKAlign; members: 0)
  int k_lead;    // K-grouped: positions [k0, k0 + k_lead) belong to the previous group (< stage_k)
  int k_len;     // K loaded from k0: k_lead + the group's tokens (0 for an empty group; M-grouped: kK)
  // K-grouped scales along the tokens: row r's scale column j of the tile's group is element
  // rows * s_prefix + r * s_cols + j of its buffer (rows: kM for A, N for B); tokens at or past
  // k_limit have none. One shared token dimension: s_prefix 0, s_cols = ceil(k_total / scale_k),
  // k_limit = k_total, K positions global. Members: s_prefix = the scale columns of the groups
  // before (sum of ceil(M_h / scale_k)), s_cols = ceil(M_g / scale_k), k_limit = M_g, K positions
  // local to the member (k0 = 0).
  int s_prefix;
  int s_cols;
  int k_limit;
  int tok0;  // members: the member's first token (its data starts at rows * tok0 elements)
  bool bad;  // members: a member the kernel cannot load (misaligned, or its scales would pass the
             // buffer): nothing is loaded and D[g] is NaN. M-grouped mn_major: the group's A grid
             // would pass the buffer (offsets that fall and rise): its rows of D are NaN
  // M-grouped blockwise / MXFP8 with mn_major A grids (the grouped quantizer's members: group g's grid
  // [ceil(K/128) or K/32, round_up(rows_g, 4)] after those of the groups before; masked: slots of m_max
  // rows): s_prefix = the padded rows of the groups before, s_cols = the group's pitch
  // round_up(rows_g, 4), and grid_row = the tile's first row within its group.
  int grid_row;
};

// Where a consumer thread's accumulator fragment sits: wgmma m64nN gives thread `lane` of warp
// `warp` (in its warpgroup) rows warp*16 + lane/4 and +8, columns 8j + 2*(lane%4) + {0, 1};
// registers d[4j + 0, 1] hold the first row, d[4j + 2, 3] the second.
struct Frag {
  int wg;    // consumer warpgroup
  int tid;   // thread in the warpgroup, 0..127
  int lane;
  int row;   // tile row of the first fragment row: wg*64 + warp*16 + lane/4
};

// Walks the work units of every group in order: a unit is one tile, or with multicast a pair of
// n-adjacent tiles (one per CTA of the cluster). Each role of each CTA walks the same sequence.
template <class Cfg>
struct Scheduler {
  static constexpr int kBM = int(Cfg::kBlockM), kBN = int(Cfg::kBlockN);
  static constexpr int kNBlocks = int((Cfg::kN + kBN - 1) / kBN);
  static constexpr int kNUnits = kNBlocks / int(Cfg::kMulticast);
  static constexpr int kRaster = int(Cfg::kRasterM);
  // K-grouped: where a group's first k-block starts: a multiple of a stage's K (128 tokens; 64
  // for 16-bit operands, which carry no scales), so that a k-block covers whole scale blocks of
  // the shared token grid (1x128, 1x32, 1x16 blocks), and, for every scaling, each row's TMA box
  // is one 128-byte-aligned segment (per-tensor tiles started at the 16-aligned token below the
  // group's first before 51bf669: at uneven splits the boxes straddled two segments, 866
  // against 1050 TFLOP/s at even splits).
  static constexpr int kKAlign = stage_k<Cfg>();
  // Tokens per scale along K (the scaling traits' scale_k): 128, 32, 16; 0 per tensor.
  static constexpr int kScaleK = int(Cfg::kScaleK);
  // Members: a member's first token and token count must be multiples of this (16-byte TMA
  // addresses and row strides: 16 fp8, 32 packed e2m1 or 8 bf16 / fp16 tokens; gemm_k_total_multiple).
  static constexpr int kMemberAlign = 16 * int(Cfg::kElemsPerByte) / int(Cfg::kElemBytes);

  // The launch arguments stay in the kernel's parameter space (__grid_constant__): the scheduler
  // keeps only its position in registers, which every role (three accumulators in the consumers,
  // a 24-40 register producer) needs.
  const GemmArgs& a;
  int g = -1;
  int units_before = 0, units_in_group = 0, g_start = 0, g_end = 0, m_blocks = 0;
  // K-grouped members: the scale columns of groups [0, prefix_g) (a role walks its units in order),
  // saturated past what any buffer holds (every later group is then unreadable anyway).
  // M-grouped mn_major A grids: prefix = the padded grid rows of the groups before g, pitch = g's.
  int prefix_g = 0, prefix = 0, pitch = 0;

  __device__ explicit Scheduler(const GemmArgs& args) : a(args) {}

  __device__ int clamp_row(i64 r) const { return r < 0 ? 0 : (r > a.m_total ? int(a.m_total) : int(r)); }
  // M-grouped mn_major A grids: the rows the buffer holds (gemm_scale_elems; the runtime keeps it
  // <= 2^30, so prefixes saturated at mn_cap() + 1 and a pitch add up within an int).
  __device__ int mn_cap() const { return int(mn_major_grouped_rows(a.m_total, a.num_groups)); }

  // Unit -> tile for this CTA (rank in its cluster); false when past the last group.
  __device__ bool get(int unit, u32 rank, TileInfo& t) {
    if constexpr (Cfg::kKGrouped) {
      return get_k_grouped(unit, rank, t);
    } else {
      return get_m_grouped(unit, rank, t);
    }
  }

  // M-grouped: the groups' row ranges in order; units are walked in increasing order.
  __device__ bool get_m_grouped(int unit, u32 rank, TileInfo& t) {
    while (unit >= units_before + units_in_group) {
      units_before += units_in_group;
      if (++g >= a.num_groups) return false;
      if (a.m_max > 0) {  // masked: a slot of m_max rows per group, the first counts[g] used
        const i64 c = a.group_counts[g];
        const int m_max = int(a.m_max);
        g_start = g * m_max;
        g_end = g_start + (c < 0 ? 0 : (c > m_max ? m_max : int(c)));
      } else {
        g_start = clamp_row(a.group_offsets[g]);
        g_end = clamp_row(a.group_offsets[g + 1]);
        if (g_end < g_start) g_end = g_start;
      }
      m_blocks = (g_end - g_start + kBM - 1) / kBM;
      units_in_group = m_blocks * kNUnits;
      if constexpr (Cfg::kScaleMnMajor) {
        // Group g's grid follows those of groups 0..g-1 (a masked slot's grid has m_max rows);
        // saturated past the buffer's m_total + 3 G rows (the bound for any rising offsets).
        prefix = min(prefix + pitch, mn_cap() + 1);
        pitch = int(mn_major_rows(u64(a.m_max > 0 ? int(a.m_max) : g_end - g_start)));
      }
    }
    const int local = unit - units_before;
    const int band = local / (kRaster * kNUnits);
    const int band_start = band * kRaster;
    const int rows = min(m_blocks - band_start, kRaster);
    const int r = local - band * kRaster * kNUnits;
    const int mb = band_start + r % rows;
    const int nu = r / rows;
    t.group = g;
    t.row0 = g_start + mb * kBM;
    t.row_end = g_end;
    t.n0 = (nu * int(Cfg::kMulticast) + int(rank)) * kBN;
    t.out_row0 = t.row0;
    t.k0 = 0;
    t.k_lead = 0;
    t.k_len = int(Cfg::kK);
    if constexpr (Cfg::kScaleMnMajor) {
      t.s_prefix = prefix;
      t.s_cols = pitch;
      t.grid_row = t.row0 - g_start;
      t.bad = prefix + pitch > mn_cap();
    }
    return true;
  }

  // K-grouped (wgrad): every group has the same kM x kN output tiles; group g reduces over
  // K = [offsets[g], offsets[g+1]) of the shared token dimension (clamped to [0, k_total]), or
  // with members over its own matrices' M_g tokens (TileInfo's scale fields say where its grids are).
  __device__ int clamp_tok(i64 k) const { return int(k < 0 ? 0 : (k > a.k_total ? a.k_total : k)); }

  __device__ bool get_k_grouped(int unit, u32 rank, TileInfo& t) {
    constexpr int kMBlocks = int((Cfg::kM + kBM - 1) / kBM);
    constexpr int kUnits = kMBlocks * kNUnits;
    const int g = unit / kUnits;
    if (g >= a.num_groups) return false;
    const int local = unit - g * kUnits;
    const int band = local / (kRaster * kNUnits);
    const int band_start = band * kRaster;
    const int rows = min(kMBlocks - band_start, kRaster);
    const int r = local - band * kRaster * kNUnits;
    t.group = g;
    t.row0 = (band_start + r % rows) * kBM;
    t.row_end = int(Cfg::kM);
    t.n0 = ((r / rows) * int(Cfg::kMulticast) + int(rank)) * kBN;
    t.out_row0 = g * int(Cfg::kM) + t.row0;
    const int k0 = clamp_tok(a.group_offsets[g]);
    const int k1 = max(k0, clamp_tok(a.group_offsets[g + 1]));
    t.bad = false;
    if constexpr (Cfg::kMembers) {
      // The member's own [rows, M_g] matrices: local token positions, TMA zero fill past M_g.
      const int len = k1 - k0;
      t.k0 = 0;
      t.k_lead = 0;
      t.k_limit = len;
      t.tok0 = k0;
      t.s_prefix = 0;
      t.s_cols = 0;
      t.bad = k0 % kMemberAlign != 0 || len % kMemberAlign != 0;
      if constexpr (kScaleK > 0) {
        // The scale buffers hold ceil(k_total / scale_k) + G columns per row (any split of k_total
        // into G members whose offsets rise); offsets that fall and rise again could ask for more.
        const int cap = int((a.k_total + kScaleK - 1) / kScaleK) + a.num_groups;
        auto blocks = [](int tokens) { return int((i64(tokens) + kScaleK - 1) / kScaleK); };
        for (; prefix_g < g; ++prefix_g) {
          const int s = clamp_tok(a.group_offsets[prefix_g]);
          prefix = min(prefix + blocks(max(s, clamp_tok(a.group_offsets[prefix_g + 1])) - s), cap + 1);
        }
        const int cols = blocks(len);
        t.bad |= prefix + cols > cap;
        // NVFP4 reads A's scales two bytes at a time: the group's grid must start at an even byte.
        if constexpr (Cfg::kScaling == kGemmNvfp4) t.bad |= (i64(prefix) * Cfg::kM) % 2 != 0;
        t.s_prefix = prefix;
        t.s_cols = cols;
      }
      t.k_len = t.bad ? 0 : len;
    } else {
      t.k0 = k0 & ~(kKAlign - 1);
      t.k_lead = k0 - t.k0;
      t.k_len = k1 > k0 ? k1 - t.k0 : 0;
      t.k_limit = int(a.k_total);
      t.tok0 = 0;
      t.s_prefix = 0;
      t.s_cols = kScaleK > 0 ? int((a.k_total + kScaleK - 1) / kScaleK) : 0;
    }
    return true;
  }
};

// k-blocks (stage_k of K, one stage each) of a tile.
template <class Cfg>
__device__ __forceinline__ int tile_k_blocks(const TileInfo& t) {
  constexpr int kSK = stage_k<Cfg>();
  if constexpr (Cfg::kKGrouped) return (t.k_len + kSK - 1) / kSK;
  return int((Cfg::kK + kSK - 1) / kSK);
}

// The K positions of k-block kb that belong to the tile's group, relative to the k-block:
// [x, y); the whole k-block (0, stage_k) everywhere but at a K-grouped group's edges (the first
// k-block starts up to stage_k - 1 tokens early, the last reads past the group's end).
template <class Cfg>
__device__ __forceinline__ int2 kept_tokens(const TileInfo& t, int kb) {
  constexpr int kSK = stage_k<Cfg>();
  if constexpr (!Cfg::kKGrouped) return make_int2(0, kSK);
  return make_int2(kb == 0 ? t.k_lead : 0, min(kSK, t.k_len - kb * kSK));
}

// K-grouped members: the ring of tensor-map pairs {A, B} per CTA in a.member_maps. The producer
// warp writes a group's pair into the next slot before the group's first load (a group without
// loads, empty or unreadable, takes no slot); slot v is reused L + 1 slot-taking groups later (L
// load slots, GemmSmem::load_slots), each with at least one load, when every load that read it is
// complete (the producer has waited for the slot of the load L + 1 loads back to be consumed).
template <class Cfg>
struct Traits;
template <class Cfg>
struct MemberMaps {
  static constexpr int kSlots = gemm_member_map_slots(int(Traits<Cfg>::kSmem.load_slots));
  const TmaDescriptor* a_map;  // B's map follows A's (members), or is a.b_map
  int group = -1, visit = 0;

  __device__ explicit MemberMaps(const GemmArgs& a) : a_map(&a.a_map) {}
  __device__ const TmaDescriptor* b_map(const GemmArgs& a) const { return Cfg::kMembers ? a_map + 1 : &a.b_map; }

  // Called by the whole producer warp before the first load of tile t (one with loads): on a new
  // group, the templates a.a_map / a.b_map with the member's base address, row length (bytes, the
  // inner dimension) and row stride; the copies' release and this thread's acquire order the
  // rewrite before the TMA reads.
  __device__ void prepare(const GemmArgs& a, u8* scratch, u32 scratch_addr, const TileInfo& t, int lane) {
    if constexpr (Cfg::kMembers) {
      if (t.group == group) return;
      TmaDescriptor* dst = a.member_maps + (i64(blockIdx.x) * kSlots + visit % kSlots) * 2;
      // The previous group's copies (every lane's part of the collective reads) are done before the
      // scratch is written again (compute-sanitizer racecheck sees no order between them otherwise).
      __syncwarp();
      reinterpret_cast<u64*>(scratch)[lane] = lane < 16 ? a.a_map.opaque[lane] : a.b_map.opaque[lane - 16];
      __syncwarp();
      if (lane == 0) {
        const u32 row = u32(k_bytes<Cfg>(t.k_limit));
        const i64 first = k_bytes<Cfg>(t.tok0);
        sm90::tensormap_set_address(scratch_addr, reinterpret_cast<u64>(a.a_data) + u64(first * Cfg::kM));
        sm90::tensormap_set_inner(scratch_addr, row, row);
        sm90::tensormap_set_address(scratch_addr + 128u, reinterpret_cast<u64>(a.b_data) + u64(first * Cfg::kN));
        sm90::tensormap_set_inner(scratch_addr + 128u, row, row);
      }
      __syncwarp();
      sm90::tensormap_publish(dst, scratch_addr);
      sm90::tensormap_publish(dst + 1, scratch_addr + 128u);
      sm90::tensormap_acquire(dst);
      sm90::tensormap_acquire(dst + 1);
      a_map = dst;
      group = t.group;
      ++visit;
    }
  }
};

// ------------------------------------------------------------------ scaling policies
//
// A policy says how the scales of its kind enter the product:
//   kColScales     the epilogue needs per-column factors in shared memory (store_cols());
//   Tile begin()   per-tile factors loaded at the start of a tile (kept in registers; their
//                  load latency hides behind the main loop);
//   Step load_step() with Cfg::kPromote, per k-block, called when the consumer issues the
//                  k-block's MMAs: what its promotions need (scales loaded into registers, or
//                  the stage's scale slot);
//   promote_step() with Cfg::kPromote, per step (a k-block, or 32 of K): total += partial *
//                  factor (fp32, fused), from the k-block's Step, before its stage is released;
//   row_factor()   the epilogue factor of a fragment row (times col factor when kColScales).
//   kSteps         promotions per k-block: 1, or 4 (one per 32 of K);
//   kScaleWriters  producer threads (warps 1..3 of the producer warpgroup) that write the stages'
//                  scale slots (load_scales(), store_scales(); one warp per stage, in turn) and
//                  arrive on its full barrier (0: none), unless kBulk<Cfg>: the producer warp
//                  fills the slots with bulk copies (bulk_runs(), bulk_load()) and no writer runs.
// NoStepScales and NoColScales give the defaults (no per-k-block scales; no column factors).

// Policies whose promotions need nothing per k-block.
struct NoStepScales {
  struct Step {};
  template <class Cfg, class Tile>
  __device__ static Step load_step(const GemmArgs&, Tile&, const Frag&, int, const float*) { return {}; }
};

// Policies whose epilogue factors are per row only.
struct NoColScales {
  static constexpr bool kColScales = false;
  template <class Cfg, class Tile>
  __device__ static void store_cols(const Tile&, float*, const Frag&) {}
};

// The group's optional alpha (1 without).
__device__ __forceinline__ float group_alpha(const GemmArgs& a, const TileInfo& t) {
  return a.alpha ? a.alpha[t.group] : 1.0f;
}

// No scales (bf16 / fp16 operands, the identity copies): D = alpha * sum(a * b), the tensor cores'
// fp32 sums over all of K.
struct AlphaScaling : NoStepScales, NoColScales {
  static constexpr int kSteps = 1, kScaleWriters = 0;
  struct Tile {
    float factor;  // the tile's whole epilogue factor
  };
  template <class Cfg>
  __device__ static Tile begin(const GemmArgs& a, const TileInfo& t, const Frag&) {
    return {group_alpha(a, t)};
  }
  template <class Cfg>
  __device__ static float row_factor(const Tile& s, int) { return s.factor; }
};

// One fp32 scale per group for A and for B: D = alpha * sa * sb * sum(a * b).
struct PerTensorScaling : AlphaScaling {
  template <class Cfg>
  __device__ static Tile begin(const GemmArgs& a, const TileInfo& t, const Frag&) {
    const float alpha = group_alpha(a, t);
    return {static_cast<const float*>(a.a_scale)[t.group] * static_cast<const float*>(a.b_scale)[t.group] * alpha};
  }
  // With promotion the factor is applied per step (total += partial * factor; the epilogue then
  // multiplies by 1): ptxas keeps this variant's registers below the limit that way.
  template <class Cfg, int kAcc>
  __device__ static void promote_step(float* total, const float* acc, const Step&, int, const Frag&, const Tile& s) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] = fmaf(acc[i], s.factor, total[i]);
  }
  template <class Cfg>
  __device__ static float row_factor(const Tile& s, int) { return Cfg::kPromote ? 1.0f : s.factor; }
};

// fp32 scale per row of A (token) and per row of B[g] (output channel):
// D[r, n] = alpha * sa[r] * sb[g, n] * sum(a * b). K-grouped (wgrad on per-channel copies: the
// scales do not change along the tokens): A's per row [kM] and B's per row [kN], shared by every
// group of one tensor; members: each member's own, [G, kM] and [G, kN].
struct RowChannelScaling : NoStepScales {
  static constexpr bool kColScales = true;
  static constexpr int kSteps = 1, kScaleWriters = 0;
  struct Tile {
    float row[2];
    float col[2];  // block_n <= 256: two columns per thread
  };
  template <class Cfg>
  __device__ static Tile begin(const GemmArgs& a, const TileInfo& t, const Frag& f) {
    static_assert(Cfg::kBlockN <= 256, "two column scales per thread");
    Tile s;
    const float alpha = group_alpha(a, t);
    // Rows of A (m_total, or K-grouped kM), the group's A and B scale vectors.
    const int rows = Cfg::kKGrouped ? int(Cfg::kM) : int(a.m_total);
    const i64 a_base = Cfg::kMembers ? i64(t.group) * Cfg::kM : 0;
    const i64 b_base = !Cfg::kKGrouped || Cfg::kMembers ? i64(t.group) * Cfg::kN : 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = t.row0 + f.row + 8 * h;
      s.row[h] = r < rows ? static_cast<const float*>(a.a_scale)[a_base + r] * alpha : 0.0f;
    }
    load_cols<Cfg>(a, t, f, b_base, s);
    return s;
  }
  // This thread's two columns of the tile: B's scales from element b_base + column (0 past N).
  template <class Cfg>
  __device__ static void load_cols(const GemmArgs& a, const TileInfo& t, const Frag& f, i64 b_base, Tile& s) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = f.tid + 128 * i;
      const bool ok = c < int(Cfg::kBlockN) && t.n0 + c < int(Cfg::kN);
      s.col[i] = ok ? static_cast<const float*>(a.b_scale)[b_base + t.n0 + c] : 0.0f;
    }
  }
  template <class Cfg>
  __device__ static void store_cols(const Tile& s, float* cols, const Frag& f) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (f.tid + 128 * i < int(Cfg::kBlockN)) cols[f.tid + 128 * i] = s.col[i];
  }
  template <class Cfg>
  __device__ static float row_factor(const Tile& s, int h) { return s.row[h]; }
  template <class Cfg, int kAcc>
  __device__ static void promote_step(float* total, const float* acc, const Step&, int, const Frag&, const Tile&) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) total[i] = total[i] + acc[i];
  }
};

// Weight-only int8 (bf16 / fp16 activations x int8 weights): A unscaled, an fp32 scale per row of
// B[g] (output channel, [G, N]): D[r, n] = alpha * sb[g, n] * sum(a * b), the products of A and
// B's int8 values (converted on chip, exactly) summed by the tensor cores in fp32.
struct ChannelScaling : RowChannelScaling {
  template <class Cfg>
  __device__ static Tile begin(const GemmArgs& a, const TileInfo& t, const Frag& f) {
    Tile s;
    s.row[0] = s.row[1] = group_alpha(a, t);
    load_cols<Cfg>(a, t, f, i64(t.group) * Cfg::kN, s);
    return s;
  }
};

// DeepSeek-V3 blockwise: an fp32 scale per 1x128 block of A ([m_total, ceil(K/128)], or with
// kScaleMnMajor each group's grid [ceil(K/128), round_up(rows_g, 4)] after those of the groups
// before: TileInfo::s_prefix) and per 128x128 block of B ([G, ceil(N/128), ceil(K/128)]). Every
// k-block's partial sum is promoted: main += partial * (sa[r, kb] * sb[g, n/128, kb]); D = alpha *
// main. Each consumer thread loads the three scales its fragment needs (its two rows' sa, the
// tile's sb) from global memory ahead of the k-blocks that use them (below) and uses them at the
// k-block's promotion: the loads' latency hides behind the MMAs, and the producer and the stages
// carry no scales.
struct Block128Scaling : NoColScales {
  static constexpr int kSteps = 1, kScaleWriters = 0;
  // Groups loaded ahead: mn_major A grids two (with one they measured 3-4 % below compact grids,
  // with two 1-3 %, three no better: docs/gemm.md), compact one (two measured the same).
  static constexpr int kMaxAhead = 2;
  template <class Cfg>
  static constexpr int kAhead = Cfg::kScaleMnMajor ? 2 : 1;
  // The four lanes of a quad share their fragment rows, so they share the loads: lane q of a
  // quad holds the scales of k-blocks 8g + q and 8g + 4 + q (its two A rows, the tile's B row;
  // one 32-byte sector per row for the whole quad), and k-block kb's scales come from lane kb % 4
  // by shuffle: an eighth of the memory requests of one load per k-block. The loads run kAhead
  // groups of 8 k-blocks ahead (`next`), so only a tile's first group waits for its loads. (Loaded when
  // their group began, they made the shuffles of every group's first k-block wait on global
  // memory: 13 % of the kernel's stall samples, 69 % of those long scoreboard, Nsight Compute.)
  struct Tile {
    float alpha;
    const float* sa0;  // the fragment's two rows of A's grid (clamped to the last row: rows
    const float* sa1;  // past m_total are never stored) and the tile's row of B's grid
    const float* sb;
    i64 a_step4;       // mn_major: elements between this lane's two k-blocks of a group (4 pitches);
                       // sa0 / sa1 then point at this lane's first k-block of the next group to load
    float c[2][3];     // this lane's scales of the current group: k-blocks 8g + q and 8g + 4 + q, (sa0, sa1, sb)
    float next[kMaxAhead][2][3];  // the same for groups g + 1 .. g + kAhead<Cfg>
  };
  struct Step {
    float sa0, sa1, sb;
  };
  // This lane's scales of the group of 8 k-blocks starting at kb (0 past K); called for kb = 0,
  // 8, 16, ... in turn (mn_major: the A pointers step to the next group).
  template <class Cfg>
  __device__ static void load_group(Tile& ts, int kb, int q, float (&dst)[2][3]) {
    constexpr int kKb = int((Cfg::kK + 127) / 128);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = kb + 4 * h + q;
      const bool ok = i < kKb;
      if constexpr (Cfg::kScaleMnMajor) {
        dst[h][0] = ok ? ts.sa0[h * ts.a_step4] : 0.0f;
        dst[h][1] = ok ? ts.sa1[h * ts.a_step4] : 0.0f;
      } else {
        dst[h][0] = ok ? ts.sa0[i] : 0.0f;
        dst[h][1] = ok ? ts.sa1[i] : 0.0f;
      }
      dst[h][2] = ok ? ts.sb[i] : 0.0f;
    }
    if constexpr (Cfg::kScaleMnMajor) ts.sa0 += 2 * ts.a_step4, ts.sa1 += 2 * ts.a_step4;
  }
  template <class Cfg>
  __device__ static Tile begin(const GemmArgs& a, const TileInfo& t, const Frag& f) {
    constexpr i64 kKb = (Cfg::kK + 127) / 128;
    constexpr i64 kNb = (Cfg::kN + 127) / 128;
    const float* sa = static_cast<const float*>(a.a_scale);
    if constexpr (Cfg::kScaleMnMajor) {
      // The group's grid [kKb, pitch]; rows past the group's end read its last row (never
      // stored). A group whose grid would pass the buffer reads entry 0 and gives NaN through
      // alpha (the M-grouped epilogue has no t.bad of its own: that is the K-grouped TMA one's).
      const int last = t.row_end - t.row0 - 1;
      const float* base = t.bad ? sa : sa + i64(t.s_prefix) * kKb + t.grid_row;
      const i64 pitch = t.bad ? 0 : t.s_cols;
      const i64 q = pitch * (f.lane & 3);  // this lane's k-block of each 4
      const int i0 = t.bad ? 0 : min(f.row, last), i1 = t.bad ? 0 : min(f.row + 8, last);
      Tile ts{t.bad ? __int_as_float(0x7fc00000) : group_alpha(a, t), base + q + i0, base + q + i1,
              static_cast<const float*>(a.b_scale) + (i64(t.group) * kNb + t.n0 / 128) * kKb, 4 * pitch, {}, {}};
#pragma unroll
      for (int j = 0; j < kAhead<Cfg>; ++j) load_group<Cfg>(ts, 8 * j, f.lane & 3, ts.next[j]);
      return ts;
    }
    // (B's row pointer is computed in the Tile's initializer, after alpha: computed before it,
    // ptxas spilled 700 bytes in the consumers, GemmCompile.NvrtcSm90aNoSpills.)
    const int last = int(a.m_total) - 1;
    const int r0 = t.row0 + f.row, r1 = r0 + 8;
    Tile ts{group_alpha(a, t), sa + i64(min(r0, last)) * kKb, sa + i64(min(r1, last)) * kKb,
            static_cast<const float*>(a.b_scale) + (i64(t.group) * kNb + t.n0 / 128) * kKb, 0, {}, {}};
#pragma unroll
    for (int j = 0; j < kAhead<Cfg>; ++j) load_group<Cfg>(ts, 8 * j, f.lane & 3, ts.next[j]);
    return ts;
  }
  template <class Cfg>
  __device__ static Step load_step(const GemmArgs&, Tile& ts, const Frag& f, int kb, const float*) {
    const int q = f.lane & 3;
    if (kb % 8 == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 3; ++e) {
          ts.c[h][e] = ts.next[0][h][e];
#pragma unroll
          for (int j = 0; j + 1 < kAhead<Cfg>; ++j) ts.next[j][h][e] = ts.next[j + 1][h][e];
        }
      load_group<Cfg>(ts, kb + 8 * kAhead<Cfg>, q, ts.next[kAhead<Cfg> - 1]);
    }
    const int src = (f.lane & ~3) | (kb & 3);
    const bool hi = kb & 4;
    Step st;
    st.sa0 = __shfl_sync(0xffffffffu, hi ? ts.c[1][0] : ts.c[0][0], src);
    st.sa1 = __shfl_sync(0xffffffffu, hi ? ts.c[1][1] : ts.c[0][1], src);
    st.sb = __shfl_sync(0xffffffffu, hi ? ts.c[1][2] : ts.c[0][2], src);
    return st;
  }
  template <class Cfg>
  __device__ static float row_factor(const Tile& s, int) { return s.alpha; }
  // total += partial * (sa of the fragment's row * the tile's sb).
  template <class Cfg, int kAcc>
  __device__ static void promote_step(float* total, const float* acc, const Step& st, int, const Frag&, const Tile&) {
    const float s0 = st.sa0 * st.sb, s1 = st.sa1 * st.sb;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      total[4 * j + 0] = fmaf(acc[4 * j + 0], s0, total[4 * j + 0]);
      total[4 * j + 1] = fmaf(acc[4 * j + 1], s0, total[4 * j + 1]);
      total[4 * j + 2] = fmaf(acc[4 * j + 2], s1, total[4 * j + 2]);
      total[4 * j + 3] = fmaf(acc[4 * j + 3], s1, total[4 * j + 3]);
    }
  }
};

// Policies whose factor is the outer product of a per-row A factor and a per-row B factor that
// change along K (a step of 32 or 128 of K): main += (partial * fb[n, step]) * fa[r, step] (both
// powers of two or plain fp32 scales: the multiply is exact for powers of two, the fma rounds
// once). Three producer warps write a stage's factors into its slot, [kSteps][block_m] A then
// [kSteps][block_n] B (the policy's load_scales() / store_scales()), so a consumer reads ready
// factors after the stage's full barrier. One warp per stage, in turn: lane l loads the scales of
// rows / columns l, l + 32, ... before it waits for the stage to be free, so the loads of one stage
// overlap the waits of the others.
template <int Steps>
struct SlotScaling : NoColScales {
  static constexpr int kSteps = Steps, kScaleWriters = 96;  // three writer warps
  static constexpr int kWriterWarps = kScaleWriters / 32;
  // Whether the producer warp fills the slots by bulk copies instead (no writer warps run; the
  // policy's bulk_runs() / bulk_load(); Traits::kBulkScales).
  template <class Cfg>
  static constexpr bool kBulk = false;
  template <class Cfg>
  static constexpr int kWords = int(Cfg::kBlockM + Cfg::kBlockN) / 32;  // loaded words per lane
  struct Tile {
    float alpha;
  };
  struct Step {
    const float* slot;  // the stage's factors (written by the scale writers before its full barrier)
  };
  template <class Cfg>
  __device__ static Step load_step(const GemmArgs&, Tile&, const Frag&, int, const float* slot) {
    return {slot};
  }
  template <class Cfg>
  __device__ static Tile begin(const GemmArgs& a, const TileInfo& t, const Frag&) {
    return {group_alpha(a, t)};
  }
  template <class Cfg>
  __device__ static float row_factor(const Tile& s, int) { return s.alpha; }
  // Promotes the partial sum of k-step `step` of the stage whose slot is `st.slot`, with the
  // factors of the thread's fragment: its two rows' A factors and its kAcc / 2 columns' B factors.
  template <class Cfg, int kAcc>
  __device__ static void promote_step(float* total, const float* acc, const Step& st, int step, const Frag& f,
                                      const Tile&) {
    constexpr int kBM = int(Cfg::kBlockM), kBN = int(Cfg::kBlockN);
    const float r0 = st.slot[step * kBM + f.row], r1 = st.slot[step * kBM + f.row + 8];
    const float* cols = st.slot + kSteps * kBM + step * kBN + 2 * (f.lane & 3);
    float2 c[kAcc / 4];
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) c[j] = *reinterpret_cast<const float2*>(cols + 8 * j);
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      total[4 * j + 0] = fmaf(acc[4 * j + 0] * c[j].x, r0, total[4 * j + 0]);
      total[4 * j + 1] = fmaf(acc[4 * j + 1] * c[j].y, r0, total[4 * j + 1]);
      total[4 * j + 2] = fmaf(acc[4 * j + 2] * c[j].x, r1, total[4 * j + 2]);
      total[4 * j + 3] = fmaf(acc[4 * j + 3] * c[j].y, r1, total[4 * j + 3]);
    }
  }
  // Entry i of a stage's loads: row i of the A tile (i < block_m), else column i - block_m of B.
  template <class Cfg>
  __device__ static float* slot_entry(float* slot, int i) {
    constexpr int kBM = int(Cfg::kBlockM);
    return i < kBM ? slot + i : slot + kSteps * kBM + (i - kBM);
  }
};

// OCP MX (MXFP8): an e8m0 scale per 32 consecutive K of every row of A and of B, promoted every
// 32 of K. M-grouped: A [m_total, K/32] bytes (the quantize kernels' compact rowwise scale
// layout), B [G, N, K/32], K % 128 == 0 (one u32 of four scales per row per stage). K-grouped
// (wgrad, the transposed columnwise copies): A [kM, ceil(k_total/32)], B [N, ceil(k_total/32)]
// (members: per member, [kM, ceil(M_g/32)] and [N, ceil(M_g/32)]), read a u32 per row and k-block
// where rows and their start are 4-byte aligned, else a byte at a time; the 32-steps of a k-block
// that lie wholly outside the group get factor 2^-127 (their data is zeroed), so another group's
// scales (NaN included) never reach this group's sums. With kScaleMnMajor every grid is stored
// [32-steps, rows padded to 4] (the quantize kernels' "scale_layout": "mn_major"): M-grouped A per
// group as Block128Scaling's (TileInfo s_prefix / s_cols / grid_row), B per expert
// [K/32, round_up(N, 4)], K-grouped per tensor or member as Block128KScaling's. A word is then the
// scales of 4 consecutive rows at one step (tiles and group grids start at multiples of 4 rows, the
// pitches are multiples of 4): word w of A (of B) is step w / (rows / 4), rows 4 (w % (rows / 4))
// + 0..3, so a warp's load is 128 contiguous bytes, and store_scales writes the four factors with
// one 16-byte store.
struct Mx32Scaling : SlotScaling<4> {
  template <class Cfg>
  __device__ static Tile begin(const GemmArgs& a, const TileInfo& t, const Frag&) {
    // M-grouped mn_major: a group whose A grid would pass the buffer reads nothing and gives NaN
    // through alpha (the K-grouped epilogue has its own t.bad).
    if constexpr (Cfg::kScaleMnMajor && !Cfg::kKGrouped)
      if (t.bad) return {__int_as_float(0x7fc00000)};
    return {group_alpha(a, t)};
  }
  // K-grouped: the W-bit field k all ones when 32-step k of k-block kb holds tokens of the tile's
  // group, else 0 (those steps get factor 2^-127): W = 8, a byte mask over a row's four scales; W = 1, bits.
  template <int W>
  __device__ static u32 group_steps(const TileInfo& t, int kb) {
    u32 keep = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int lo = (4 * kb + k) * 32;  // the step's first position from k0
      if (lo + 32 > t.k_lead && lo < t.k_len) keep |= ((1u << W) - 1u) << (W * k);
    }
    return keep;
  }
  template <class Cfg>
  __device__ static void load_scales(const GemmArgs& a, const TileInfo& t, int kb, int lane, u32* words) {
    constexpr int kBM = int(Cfg::kBlockM);
    const u8* sa = static_cast<const u8*>(a.a_scale);
    const u8* sb = static_cast<const u8*>(a.b_scale);
    if constexpr (Cfg::kScaleMnMajor) {
      constexpr int kBN = int(Cfg::kBlockN), kQA = kBM / 4, kQB = kBN / 4;
      constexpr i64 kRowsB = i64(mn_major_rows(u64(Cfg::kN)));
      // A: the grid's first entry of this tile's rows at step 4 kb, the pitch between steps, and
      // the rows it may read (rows past them, or a group that cannot be read: factor 2^-127, never stored).
      const u8* pa;
      i64 pitch_a;
      int rows_a;
      const u8* pb;
      u32 keep = ~0u;  // K-grouped: the steps that hold tokens of the group (group_steps)
      if constexpr (Cfg::kKGrouped) {
        constexpr i64 kRowsA = i64(mn_major_rows(u64(Cfg::kM)));
        const i64 s0 = i64(t.s_prefix) + t.k0 / 32 + 4 * kb;
        pa = sa + kRowsA * s0 + t.row0, pitch_a = kRowsA, rows_a = int(Cfg::kM) - t.row0;
        pb = sb + kRowsB * s0 + t.n0;
        keep = group_steps<1>(t, kb);
      } else {
        constexpr i64 kSteps = Cfg::kK / 32;
        pitch_a = t.s_cols;
        pa = sa + i64(t.s_prefix) * kSteps + i64(4 * kb) * pitch_a + t.grid_row;
        rows_a = t.bad ? 0 : t.row_end - t.row0;
        pb = sb + (i64(t.group) * kSteps + 4 * kb) * kRowsB + t.n0;
      }
#pragma unroll
      for (int j = 0; j < kBM / 32; ++j) {
        const int w = lane + 32 * j, q = w % kQA, k = w / kQA;
        words[j] = 4 * q < rows_a && (keep >> k & 1u) ? *reinterpret_cast<const u32*>(pa + k * pitch_a + 4 * q) : 0u;
      }
#pragma unroll
      for (int j = 0; j < kBN / 32; ++j) {
        const int w = lane + 32 * j, q = w % kQB, k = w / kQB;
        words[kBM / 32 + j] =
            t.n0 + 4 * q < int(Cfg::kN) && (keep >> k & 1u) ? *reinterpret_cast<const u32*>(pb + k * kRowsB + 4 * q) : 0u;
      }
    } else if constexpr (Cfg::kKGrouped) {
      const i64 row_bytes = t.s_cols;
      const int s0 = t.k0 / 32 + 4 * kb;  // the k-block's first 32-step of the token grid
      const u32 keep = group_steps<8>(t, kb);  // byte mask of the steps that hold tokens of the group
      // Rows past kM, columns past N: factor 2^-127, their products are never stored. Rows of a
      // multiple of 4 bytes (k_total, or a member's tokens, a multiple of 128) that start 4-byte
      // aligned take one aligned u32 load: a k-block starts (a multiple of 128 tokens) at or before
      // a token of the group, so its four bytes lie inside the row.
      const i64 base_a = i64(Cfg::kM) * t.s_prefix, base_b = i64(Cfg::kN) * t.s_prefix;
      const bool aligned = (row_bytes & 3) == 0 && ((base_a | base_b) & 3) == 0;
      auto word = [&](const u8* p, bool ok) {
        if (!ok) return 0u;
        if (aligned) return *reinterpret_cast<const u32*>(p) & keep;
        u32 w = 0;
        for (int k = 0; k < 4; ++k) w |= (keep >> (8 * k) & 1u) ? u32(p[k]) << (8 * k) : 0u;
        return w;
      };
      const u8* pa = sa + base_a + i64(t.row0 + lane) * row_bytes + s0;
#pragma unroll
      for (int j = 0; j < kBM / 32; ++j)
        words[j] = word(pa + i64(32 * j) * row_bytes, t.row0 + lane + 32 * j < int(Cfg::kM));
      const u8* pb = sb + base_b + i64(t.n0 + lane) * row_bytes + s0;
      constexpr int kBN = int(Cfg::kBlockN);
#pragma unroll
      for (int j = 0; j < kBN / 32; ++j)
        words[kBM / 32 + j] = word(pb + i64(32 * j) * row_bytes, t.n0 + lane + 32 * j < int(Cfg::kN));
    } else {
      static_assert(Cfg::kK % 128 == 0, "MX scales: K % 128 == 0");
      constexpr i64 kRowBytes = Cfg::kK / 32;
#pragma unroll
      for (int j = 0; j < kWords<Cfg>; ++j) {
        const int i = lane + 32 * j;
        words[j] = 0;  // rows past m_total, columns past N: factor 2^-127, their products are never stored
        if (i < kBM) {
          const int r = t.row0 + i;
          if (r < int(a.m_total)) words[j] = *reinterpret_cast<const u32*>(sa + i64(r) * kRowBytes + 4 * kb);
        } else {
          const int c = t.n0 + i - kBM;
          if (c < int(Cfg::kN)) words[j] = *reinterpret_cast<const u32*>(sb + (i64(t.group) * Cfg::kN + c) * kRowBytes + 4 * kb);
        }
      }
    }
  }
  template <class Cfg>
  __device__ static void store_scales(const u32* words, int lane, float* slot) {
    if constexpr (Cfg::kScaleMnMajor) {  // words of 4 rows at one step: one 16-byte store each
      constexpr int kBM = int(Cfg::kBlockM), kBN = int(Cfg::kBlockN);
#pragma unroll
      for (int j = 0; j < kWords<Cfg>; ++j) {
        const bool is_a = j < kBM / 32;
        const int rows = is_a ? kBM : kBN, w = lane + 32 * (is_a ? j : j - kBM / 32), q = w % (rows / 4), k = w / (rows / 4);
        float* dst = (is_a ? slot : slot + kSteps * kBM) + k * rows + 4 * q;
        *reinterpret_cast<float4*>(dst) = make_float4(e8m0_decode(u8(words[j])), e8m0_decode(u8(words[j] >> 8)),
                                                      e8m0_decode(u8(words[j] >> 16)), e8m0_decode(u8(words[j] >> 24)));
      }
    } else {
#pragma unroll
      for (int j = 0; j < kWords<Cfg>; ++j) {
        const int i = lane + 32 * j;
        float* dst = slot_entry<Cfg>(slot, i);
        const int pitch = i < int(Cfg::kBlockM) ? int(Cfg::kBlockM) : int(Cfg::kBlockN);
#pragma unroll
        for (int k = 0; k < 4; ++k) dst[k * pitch] = e8m0_decode(u8(words[j] >> (8 * k)));
      }
    }
  }
};

// DeepSeek-V3 blockwise wgrad (K-grouped): both operands are transposed columnwise copies with
// an fp32 scale per 128 tokens of every row, A [kM, ceil(k_total/128)] and B [N, ceil(k_total/128)]
// (the quantize kernels' 128x1 columnwise scale grid; members: [kM, ceil(M_g/128)] and
// [N, ceil(M_g/128)] per member, TileInfo::s_prefix / s_cols), compact or, with kScaleMnMajor,
// stored [ceil(k_total/128), round_up(kM, 4)] and [..., round_up(N, 4)] (members: per member). A K-grouped tile starts on a
// 128-token boundary (Scheduler::kKAlign; members: the member's first token), so k-block kb is
// scale column k0 / 128 + kb, and every k-block holds tokens of the group:
// main += (partial * sb[n, j]) * sa[r, j].
struct Block128KScaling : SlotScaling<1> {
  template <class Cfg>
  __device__ static void load_scales(const GemmArgs& a, const TileInfo& t, int kb, int lane, u32* words) {
    static_assert(Cfg::kKGrouped, "the M-grouped blockwise kernels use Block128Scaling");
    constexpr int kBM = int(Cfg::kBlockM), kBN = int(Cfg::kBlockN);
    const int j = t.k0 / 128 + kb;
    // Compact grids: lane l reads row l's entry (a sector per lane); mn_major grids: the k-block's
    // entries of 32 consecutive rows (one 128-byte line per load). Rows past kM, columns past N:
    // 0 (never stored).
    // Rows of each grid (the mn_major pitch of a token block), and the steps between rows and
    // between token blocks.
    constexpr bool kMn = Cfg::kScaleMnMajor;
    constexpr i64 kRowsA = kMn ? i64(mn_major_rows(u64(Cfg::kM))) : i64(Cfg::kM);
    constexpr i64 kRowsB = kMn ? i64(mn_major_rows(u64(Cfg::kN))) : i64(Cfg::kN);
    const i64 row_step = kMn ? 1 : t.s_cols;
    const float* pa = static_cast<const float*>(a.a_scale) + kRowsA * t.s_prefix + i64(t.row0 + lane) * row_step + j * (kMn ? kRowsA : 1);
#pragma unroll
    for (int w = 0; w < kBM / 32; ++w)
      words[w] = t.row0 + lane + 32 * w < int(Cfg::kM) ? __float_as_uint(pa[32 * w * row_step]) : 0u;
    const float* pb = static_cast<const float*>(a.b_scale) + kRowsB * t.s_prefix + i64(t.n0 + lane) * row_step + j * (kMn ? kRowsB : 1);
#pragma unroll
    for (int w = 0; w < kBN / 32; ++w)
      words[kBM / 32 + w] = t.n0 + lane + 32 * w < int(Cfg::kN) ? __float_as_uint(pb[32 * w * row_step]) : 0u;
  }
  template <class Cfg>
  __device__ static void store_scales(const u32* words, int lane, float* slot) {
#pragma unroll
    for (int w = 0; w < kWords<Cfg>; ++w) *slot_entry<Cfg>(slot, lane + 32 * w) = __uint_as_float(words[w]);
  }
  // mn_major grids: k-block kb's factors of the tile's rows of A (of its columns: rows of B) are
  // one contiguous run of the grid's token-block row, so the producer warp copies each into the
  // stage's slot with one bulk copy, counted in the stage's transaction bytes, and no writer warps
  // run. A run stops at the grid's padded rows (a multiple of 4: 16-byte copies from 16-byte
  // aligned bases, which the host checks); slot entries past it keep stale factors of rows that are
  // never stored.
  template <class Cfg>
  static constexpr bool kBulk = Cfg::kScaleMnMajor;
  // The runs' lengths (entries of A, of B) of the tile's k-blocks.
  template <class Cfg>
  __device__ static int2 bulk_runs(const TileInfo& t) {
    constexpr int kRowsA = int(mn_major_rows(u64(Cfg::kM))), kRowsB = int(mn_major_rows(u64(Cfg::kN)));
    return make_int2(min(int(Cfg::kBlockM), kRowsA - t.row0), min(int(Cfg::kBlockN), kRowsB - t.n0));
  }
  template <class Cfg>
  __device__ static void bulk_load(const GemmArgs& a, const TileInfo& t, int kb, int2 r, u32 slot, u32 bar) {
    constexpr i64 kRowsA = i64(mn_major_rows(u64(Cfg::kM))), kRowsB = i64(mn_major_rows(u64(Cfg::kN)));
    const i64 j = i64(t.s_prefix) + t.k0 / 128 + kb;  // the k-block's token-block row of the grids
    sm90::bulk_load(slot, static_cast<const float*>(a.a_scale) + kRowsA * j + t.row0, 4u * u32(r.x), bar);
    sm90::bulk_load(slot + 4u * u32(Cfg::kBlockM), static_cast<const float*>(a.b_scale) + kRowsB * j + t.n0,
                    4u * u32(r.y), bar);
  }
};

// NVFP4 (E2M1 elements, an e4m3 scale per 1x16 block, a per-tensor global scale): Hopper has no
// fp4 MMA, so the operands are dequantized on chip to fp16 and multiplied with fp16 wgmma
// (m64nNk16, fp32 accumulation). A ([m_total, K/2] packed, scales [m_total, K/16]) is loaded by
// TMA and dequantized by the consumers into wgmma's register fragments; B ([G, N, K/2], scales
// [G, N, K/16]) is loaded by TMA and dequantized by the producer warpgroup into the stage's fp16 B
// (128-byte swizzle). Every e2m1 value times its e4m3 scale is exact in fp16, and so is every
// product of two of them in fp32, so the only roundings are the tensor cores' fp32 additions and
// the epilogue. A dot product does not depend on the order of K, so A and B are laid out along K
// in the order that makes the conversion cheap (fp4::pair; the same permutation on both sides).
namespace fp4 {

// The eight e2m1 nibbles of x (element j in nibble j) as four fp16x2 words of value * 2^-14:
// p[0] = (e0, e2), p[1] = (e4, e6), p[2] = (e1, e3), p[3] = (e5, e7) (low half first). Each
// nibble s e1 e0 m becomes the high byte s 0 0 0 e1 e0 m 0 of an fp16 (sign to bit 15, exponent
// and mantissa bits to bits 11..9), so e2m1's subnormal 0.5 lands on fp16's subnormal range and
// the rest on normals with the same 2^-14 offset: two byte-wise shift-and-mask steps for the even
// and odd nibbles, then one byte permute per word. The accumulators are multiplied by 2^28 (both
// operands) before the epilogue.
__device__ __forceinline__ void pairs(u32 x, u32* p) {
  const u32 even = ((x << 1) & 0x0E0E0E0Eu) | ((x << 4) & 0x80808080u);
  const u32 odd = ((x >> 3) & 0x0E0E0E0Eu) | (x & 0x80808080u);
  p[0] = sm90::prmt(even, 0, 0x1404u);  // bytes: zero, even.0, zero, even.1
  p[1] = sm90::prmt(even, 0, 0x3424u);
  p[2] = sm90::prmt(odd, 0, 0x1404u);
  p[3] = sm90::prmt(odd, 0, 0x3424u);
}
constexpr float kOperandOffset = 268435456.0f;  // 2^28

// Four e4m3 scale bytes -> four fp16x2 words, each scale in both halves.
__device__ __forceinline__ void scales4(u32 bytes, u32* out) {
  const u32 lo = sm90::e4m3x2_to_f16x2(bytes & 0xFFFFu), hi = sm90::e4m3x2_to_f16x2(bytes >> 16);
  out[0] = sm90::prmt(lo, 0, 0x1010u);
  out[1] = sm90::prmt(lo, 0, 0x3232u);
  out[2] = sm90::prmt(hi, 0, 0x1010u);
  out[3] = sm90::prmt(hi, 0, 0x3232u);
}

// K-grouped k-blocks at a group's edge keep the group's tokens [lo, hi) of the k-block (0..128)
// and drop the others before dequantization: 16-token scale blocks wholly outside get scale 0
// (e2m1 values are finite, so their products are 0 whatever the data, and another group's NaN
// scale never reaches this group), and in a block the group shares with another the other
// group's nibbles become +0 (a NaN scale of a shared block makes the group's own products NaN,
// as dequantization does).
// Nibble mask of a word of eight packed e2m1 elements, element j being token first + j.
__device__ __forceinline__ u32 nibble_mask(int first, int lo, int hi) {
  const int from = min(max(lo - first, 0), 8), to = min(max(hi - first, 0), 8);
  const u32 hi_bits = to == 8 ? 0xFFFFFFFFu : (1u << (4 * to)) - 1u;
  const u32 lo_bits = from == 8 ? 0xFFFFFFFFu : (1u << (4 * from)) - 1u;
  return hi_bits & ~lo_bits;
}
// Byte mask of four e4m3 block scales, byte b scaling tokens first + 16 b + [0, 16).
__device__ __forceinline__ u32 scale_mask(int first, int lo, int hi) {
  u32 m = 0;
#pragma unroll
  for (int b = 0; b < 4; ++b) m |= first + 16 * b + 16 > lo && first + 16 * b < hi ? 0xFFu << (8 * b) : 0u;
  return m;
}

}  // namespace fp4

// The K order shared by both operands, per k-block of 128 (64 bytes of a row): thread q of a quad
// (lane % 4) owns bytes [16q, 16q + 16) of its A rows, i.e. words (q, i), i = 0..3; pair r of word
// (q, i) (fp4::pairs) is k-step s = 2i + r / 2 of the k-block (16 K per wgmma), columns 8 * (r % 2)
// + 2q + {0, 1} of that step: the fragment registers a[0..3] of step s are pair r = 2 (s % 2) of
// rows g and g + 8, then pair r + 1 of rows g and g + 8. The scale of word (q, i) is the row's
// 16-block 2q + i / 2.
struct Nvfp4Scaling : NoColScales {
  static constexpr int kSteps = 1, kScaleWriters = 0;
  struct Tile {
    float factor;  // alpha * decode(a_amax) * decode(b_amax), rounded once (the accumulators carry the 2^28)
  };
  template <class Cfg>
  __device__ static Tile begin(const GemmArgs& a, const TileInfo& t, const Frag&) {
    const float alpha = group_alpha(a, t);
    const float da = nvfp4_global_decode_scale(nvfp4_global_encode_scale(a.a_amax[t.group]));
    const float db = nvfp4_global_decode_scale(nvfp4_global_encode_scale(a.b_amax[t.group]));
    // In double: the fp32 factor under- or overflows only where the product of the three does.
    return {float(double(alpha) * double(da) * double(db))};
  }
  template <class Cfg>
  __device__ static float row_factor(const Tile& s, int) { return s.factor; }
};

// ------------------------------------------------------------------ the kernel

// Whether the producer warp fills the stages' scale slots by bulk copies (SlotScaling::kBulk).
template <class S, class Cfg>
__device__ constexpr bool gemm_bulk_scales() {
  if constexpr (S::kScaleWriters > 0) return S::template kBulk<Cfg>;
  return false;
}

template <class Cfg>
struct Traits {
  using Scaling = typename Cfg::Scaling;
  static constexpr bool kBulkScales = gemm_bulk_scales<Scaling, Cfg>();
  static constexpr int kScaleWriters = kBulkScales ? 0 : Scaling::kScaleWriters;  // writer threads that run
  static constexpr int kBM = int(Cfg::kBlockM), kBN = int(Cfg::kBlockN);
  static constexpr int kConsumers = int(Cfg::kConsumers);
  static constexpr bool kFp4 = Cfg::kScaling == kGemmNvfp4;
  // int8 x int8: s32 tensor-core sums (exact), converted to fp32 where they are promoted or stored.
  static constexpr bool kInt8 = Cfg::AFormat::kIsInt;
  // bf16 / fp16 (identity) operands: 64 of K per stage, m64nNk16 MMAs, fp32 sums, no scales.
  static constexpr bool k16Bit = Cfg::AFormat::kBits == 16;
  // Weight-only int8 (channel scaling): the producer warpgroup converts B's int8 to A's 16-bit type
  // in shared memory (i8_producer); the MMAs take A's type for both.
  static constexpr bool kConvertB = Cfg::kScaling == kGemmChannel;
  using MmaB = typename Pick<kConvertB, typename Cfg::AFormat, typename Cfg::BFormat>::type;
  // NVFP4 with two consumer warpgroups: two producer warpgroups, eight warps dequantizing B (one
  // warp per scheduler is latency bound there; measured).
  // (Weight-only int8 keeps one: with 512 threads ptxas has 128 registers for the 128 x 256 tile's
  // 128 accumulators, C7602, and one consumer with two producer warpgroups serializes, C7518.)
  static constexpr int kProducerGroups = kFp4 ? 2 : 1;
  static constexpr int kThreads = 128 * (kConsumers + kProducerGroups);
  static constexpr int kStages = int(Cfg::kStages);
  static constexpr int kMc = int(Cfg::kMulticast);
  static constexpr int kAcc = kBN / 2;  // accumulator registers per thread
  static constexpr int kOutBytes = Cfg::kOutFp32 ? 4 : 2;
  static constexpr int kEpiCols = gemm_epi_cols(kBN, kOutBytes, int(Cfg::kScaling));
  static constexpr int kPitch = gemm_staging_pitch(kEpiCols, kOutBytes);
  static constexpr GemmSmem kSmem =
      gemm_smem(kBM, kBN, kStages, kConsumers, int(Cfg::kScaling), Scaling::kColScales, kOutBytes, Cfg::kKGrouped,
                Cfg::kMembers);
  static constexpr int kLoadSlots = int(kSmem.load_slots);
  // Barrier offsets from the aligned base (after full[stages], empty[stages], turn[2]; GemmSmem::
  // bar_off): loaded[load slots] (NVFP4, weight-only int8), then free[load slots] (NVFP4).
  static constexpr u32 kLoadedBar = kSmem.bar_off + 8u * u32(2 * kStages + 2);
  static constexpr u32 kFreeBar = kLoadedBar + 8u * u32(kLoadSlots);
  static constexpr u32 kTxBytes = kConvertB ? u32(kBM) * 128u + u32(kBN) * 64u : u32(kBM + kBN) * (kFp4 ? 64u : 128u);
  // NVFP4: the TMA bytes complete loaded[slot]; full[stage] takes the B dequantizing warps; every
  // thread of the CTA frees a load slot (the consumers once they have read its A, the producers
  // once they have dequantized its B).
  static constexpr u32 kLoadFreeArrivals = u32(kThreads);
  static constexpr u32 kFullArrivals =
      kFp4 || kConvertB ? 4u * kProducerGroups : 1u + (kScaleWriters ? 32u : 0u);
  // Every lane of every consumer warp (of each CTA of the multicast group) releases the stage.
  static constexpr u32 kEmptyArrivals = u32(kConsumers * 4 * 32 * kMc);
  // Registers per thread after setmaxnreg (2 or 3 consumer warpgroups; one keeps its entry count).
  // The pool is the launch's 168 x 384 registers (setmaxnreg.inc waits until the pool has them):
  // 2 x 232 + 40 = 504 = 3 x 168. Per-32 promotion keeps three accumulators: 2 x 240 + 24.
  // NVFP4 (512 threads, 128 each): 2 x 168 + 2 x 88. K-grouped with scale writers (their byte-wise
  // MX loads spill at 40): 2 x 224 + 56 (at 2 x 216 + 72 the consumers' three accumulators spill);
  // so do the M-grouped ones on mn_major grids (the group's grid prefix and pitch: 12-20 bytes at 40).
  static constexpr bool kWideWriters = (Cfg::kKGrouped || Cfg::kScaleMnMajor) && kScaleWriters > 0;
  // Weight-only int8: the B converters (and their load issue) take 56 as well.
  static constexpr u32 kProducerRegs = kConsumers == 3 ? 24 : kFp4 ? 88 : kWideWriters || kConvertB ? 56 : 40;
  static constexpr u32 kConsumerRegs = kConsumers == 3 ? 160 : kFp4 ? 168 : kWideWriters || kConvertB ? 224 : 232;

  static_assert(kBM == 64 * kConsumers, "one consumer warpgroup per 64 rows");
  static_assert(kConsumers == 1 || kConsumers * kConsumerRegs + kProducerGroups * kProducerRegs <=
                                       (kConsumers + kProducerGroups) * (65536 / kThreads / 8 * 8),
                "the setmaxnreg split must fit the launch's register pool (or the increase never returns)");
  static_assert(kBN % 64 == 0 && kBN <= 256, "block_n: 64, 128, 192 or 256");
  static_assert(!Cfg::kPromote || kBN <= 128, "promotion keeps two accumulators: block_n <= 128");
  static_assert(Cfg::kScaling != kGemmBlock128 || (kBN <= 128 && 128 % kBN == 0 && Cfg::kPromote),
                "128x128 B blocks: a tile's columns share one B scale");
  static_assert(kMc == 1 || (kMc == 2 && (Cfg::kN + kBN - 1) / kBN % 2 == 0), "multicast pairs n-blocks");
  static_assert(Cfg::kN % 8 == 0 && Cfg::kK % 16 == 0, "N % 8 == 0, K % 16 == 0");
  static_assert(!Cfg::kAccumulate || Cfg::kOutFp32, "accumulation is into fp32");
  static_assert(u32(Cfg::kSmemBytes) == kSmem.total && kSmem.total <= kGemmSmemLimit, "shared memory");
  static_assert(kBN % kEpiCols == 0, "epilogue passes");
  static_assert(!Cfg::kOrderedIssue || kConsumers == 2, "ordered issue alternates two warpgroups");
  static_assert(Scaling::kSteps == 1 || (Scaling::kSteps == 4 && Cfg::kPromote && !Cfg::kOrderedIssue),
                "per-32 promotion: promoted, unordered");
  static_assert(!Cfg::kKGrouped || ((Cfg::kScaling == kGemmPerTensor || Cfg::kScaling == kGemmRowChannel ||
                                      Cfg::kScaling == kGemmBlock128K || Cfg::kScaling == kGemmMx32 ||
                                      Cfg::kScaling == kGemmNvfp4 || Cfg::kScaling == kGemmNone) && kMc == 1),
                "K-grouped: per-tensor, per-channel, blockwise (1x128 along the tokens), MX, NVFP4 or no scaling, no multicast");
  static_assert(k16Bit == (Cfg::kScaling == kGemmNone || kConvertB) && Cfg::AFormat::kBits == MmaB::kBits &&
                    (!k16Bit || Cfg::AFormat::kExpBits == MmaB::kExpBits) &&
                    int(Cfg::kElemBytes) == (k16Bit ? 2 : 1) && !(k16Bit && Cfg::kPromote),
                "bf16 / fp16 operands: both of one type (or B int8, converted), no promotion");
  static_assert(!kConvertB || (Cfg::BFormat::kIsInt && !Cfg::kKGrouped && kMc == 1 && !Cfg::kOrderedIssue),
                "weight-only int8: int8 B, M-grouped, no multicast or ordered issue");
  static_assert(!Cfg::kMembers || Cfg::kKGrouped, "per-member operands: the K-grouped layout");
  static_assert(Cfg::kScaling != kGemmBlock128K || (Cfg::kKGrouped && Cfg::kPromote),
                "Block128KScaling: the K-grouped layout, promoted");
  static_assert(Cfg::AFormat::kIsInt == Cfg::BFormat::kIsInt || kConvertB, "int8 operands: both (or weight-only int8 B)");
  static_assert(!kInt8 || (Cfg::kScaling == kGemmPerTensor || Cfg::kScaling == kGemmRowChannel ||
                           Cfg::kScaling == kGemmBlock128 || Cfg::kScaling == kGemmBlock128K),
                "int8: per-tensor, per-row x per-channel or 1x128 blockwise scaling");
  static_assert(!kInt8 || Cfg::kPromote || (!Cfg::kKGrouped && Cfg::kK < (i64(1) << 17)),
                "int8 unpromoted: K * 2^14 < 2^31, so that no s32 sum over all of K overflows");
  static_assert(!kFp4 || (kBN == 128 && kBM == 128 && kMc == 1 && !Cfg::kOrderedIssue && !Cfg::kPromote &&
                          (Cfg::kKGrouped || Cfg::kK % 128 == 0)),
                "NVFP4: 128 x 128 tiles, no multicast, ordered issue or promotion, K % 128 == 0");
};

template <class Cfg>
__device__ __forceinline__ void producer(const GemmArgs& a, u8* smem, u32 base, u32 rank, int lane) {
  using T = Traits<Cfg>;
  using S = typename T::Scaling;
  Scheduler<Cfg> sched(a);
  MemberMaps<Cfg> maps(a);
  const u32 full0 = base + T::kSmem.bar_off, empty0 = full0 + 8u * T::kStages;
  if (lane == 0 && !Cfg::kMembers) {
    sm90::tma_prefetch_descriptor(&a.a_map);
    sm90::tma_prefetch_descriptor(&a.b_map);
  }
  int stage = 0;
  u32 phase = 0;
  const int stride = int(gridDim.x) / T::kMc;
  for (int unit = int(blockIdx.x) / T::kMc;; unit += stride) {
    TileInfo t;
    if (!sched.get(unit, rank, t)) break;
    const int k_blocks = tile_k_blocks<Cfg>(t);
    if (k_blocks > 0) maps.prepare(a, smem + T::kSmem.maps_off, base + T::kSmem.maps_off, t, lane);
    // Bulk-copied scale entries of A and B per k-block. (The expect_tx below is written twice, once
    // per branch: one expression for both changed the other kernels' register allocation.)
    int2 runs = make_int2(0, 0);
    if constexpr (T::kBulkScales) runs = S::template bulk_runs<Cfg>(t);
    for (int kb = 0; kb < k_blocks; ++kb) {
      // K coordinate of the stage (NVFP4: bytes of packed e2m1)
      const int kc = int(k_bytes<Cfg>(t.k0 + kb * stage_k<Cfg>()));  // (B converted on chip: fp4_producer, i8_producer)
      const u32 full = full0 + 8u * stage;
      const u32 empty = empty0 + 8u * stage;
      sm90::mbar_wait(empty, phase ^ 1u);
      if (lane == 0) {
        if constexpr (T::kBulkScales) {
          sm90::mbar_arrive_expect_tx(full, T::kTxBytes + 4u * u32(runs.x + runs.y));
          S::template bulk_load<Cfg>(a, t, kb, runs, base + T::kSmem.sc_off + u32(stage) * T::kSmem.sc_stage, full);
        } else {
          sm90::mbar_arrive_expect_tx(full, T::kTxBytes);
        }
        const u32 a_dst = base + T::kSmem.a_off + u32(stage) * T::kSmem.a_stage;
        if constexpr (T::kMc == 2) {
          constexpr int kHalf = T::kBM / 2;
          sm90::tma_load_2d_multicast(a_dst + rank * u32(kHalf) * 128u, &a.a_map, full, kc,
                                      t.row0 + int(rank) * kHalf, u16(0x3));
        } else {
          sm90::tma_load_2d(a_dst, maps.a_map, full, kc, t.row0);
        }
        const u32 b_dst = base + T::kSmem.b_off + u32(stage) * T::kSmem.b_stage;
        if constexpr (Cfg::kKGrouped) sm90::tma_load_2d(b_dst, maps.b_map(a), full, kc, t.n0);  // B [N, k_total] (members: [N, M_g])
        else sm90::tma_load_3d(b_dst, &a.b_map, full, kc, t.n0, t.group);                   // B [G, N, K]
      }
      if (++stage == T::kStages) stage = 0, phase ^= 1u;
    }
  }
}

// Warps 1..3 of the producer warpgroup (Traits::kScaleWriters): writer warp w fills the
// scale slot of every third stage (in pipeline order) once the consumers have released it, then
// its 32 lanes arrive on the stage's full barrier (release semantics: the consumers' wait on that
// barrier makes the slot visible). Its loads are issued before the wait.
template <class Cfg>
__device__ __forceinline__ void scale_writer(const GemmArgs& a, u8* smem, u32 base, u32 rank, int w, int lane) {
  using T = Traits<Cfg>;
  using S = typename T::Scaling;
  Scheduler<Cfg> sched(a);
  const u32 full0 = base + T::kSmem.bar_off, empty0 = full0 + 8u * T::kStages;
  int stage = 0, turn = 0;
  u32 phase = 0;
  const int stride = int(gridDim.x) / T::kMc;
  for (int unit = int(blockIdx.x) / T::kMc;; unit += stride) {
    TileInfo t;
    if (!sched.get(unit, rank, t)) break;
    for (int kb = 0; kb < tile_k_blocks<Cfg>(t); ++kb) {
      if (turn == w) {
        u32 words[S::template kWords<Cfg>];
        S::template load_scales<Cfg>(a, t, kb, lane, words);
        sm90::mbar_wait(empty0 + 8u * stage, phase ^ 1u);
        S::template store_scales<Cfg>(words, lane,
                                      reinterpret_cast<float*>(smem + T::kSmem.sc_off + u32(stage) * T::kSmem.sc_stage));
        sm90::mbar_arrive(full0 + 8u * stage);
      }
      if (++turn == S::kWriterWarps) turn = 0;
      if (++stage == T::kStages) stage = 0, phase ^= 1u;
    }
  }
}

// Four int8 values (the bytes of w, low first) as two 16-bit pairs (lo: bytes 0, 1; hi: bytes 2,
// 3), exactly. bf16: with the byte b in the low byte of each half, 0x4300 | (b & 0x7F) is the bf16
// 128 + (b & 0x7F) (ulp 1 there) and 0x4300 | (b & 0x80) is 128, or 256 for a negative b; their
// difference is b. fp16: 0x6400 | u, u = b + 128, is the fp16 1024 + u (ulp 1 there), minus 1152
// is b. One subtraction per pair either way.
template <bool kBf16>
__device__ __forceinline__ void s8x4_to_16bit(u32 w, u32& lo, u32& hi) {
  if constexpr (kBf16) {
    const u32 l = sm90::prmt(w, 0u, 0x4140u), h = sm90::prmt(w, 0u, 0x4342u);  // bytes 0, 1 / 2, 3 in the low bytes
    lo = (l & 0x007F007Fu) | 0x43004300u;
    hi = (h & 0x007F007Fu) | 0x43004300u;
    asm("sub.rn.bf16x2 %0, %0, %1;" : "+r"(lo) : "r"((l & 0x00800080u) | 0x43004300u));
    asm("sub.rn.bf16x2 %0, %0, %1;" : "+r"(hi) : "r"((h & 0x00800080u) | 0x43004300u));
  } else {
    const u32 u = w ^ 0x80808080u;
    lo = sm90::prmt(u, 0x64646464u, 0x5140u);
    hi = sm90::prmt(u, 0x64646464u, 0x7362u);
    asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(lo) : "r"(0x64806480u));
    asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(hi) : "r"(0x64806480u));
  }
}

// Weight-only int8 (channel scaling): the producer warpgroup. A stage's B is loaded as it is (int8,
// block_n rows x 64 bytes, unswizzled) into the upper half of the stage's B buffer and converted
// in place into A's 16-bit type in the 128-byte swizzle the MMAs read: each thread first converts
// its chunks of rows [0, block_n / 2), whose outputs lie below the loaded bytes, while holding its
// loaded chunks of the other rows in registers; after a barrier of the converter warps (every loaded byte read) those go over the loaded bytes. A warp reads 256 consecutive bytes and writes four
// whole 128-byte rows (no bank conflicts). Then the writes are made visible to the tensor cores
// (and ordered before the stage's next TMA load) and each warp arrives on full[stage]. Warp 0
// issues the loads (A's rows and B's, on loaded[stage]), the one of k-block kb + kStages - 1 after
// converting kb: it waits for the consumers to release kb - 1, whose conversion is done (no
// cycle), while their MMAs of kb can start. B's per-channel scales apply in the epilogue
// (ChannelScaling).
template <class Cfg>
__device__ __forceinline__ void i8_producer(const GemmArgs& a, u8* smem, u32 base, int w, int lane) {
  using T = Traits<Cfg>;
  constexpr int kBN = T::kBN;
  constexpr int kWorkers = 128 * T::kProducerGroups;
  constexpr int kRowStep = kWorkers / 8;           // rows between a thread's chunks
  constexpr int kHalf = kBN * 8 / kWorkers / 2;    // 16-byte chunks (8 elements) per thread in each half of B's rows
  constexpr bool kBf16 = Cfg::AFormat::kExpBits == 8;
  constexpr u32 kConvertBarrier = 8;  // named barrier of the converter warps (consumers use 1..3)
  static_assert(kHalf >= 1 && kHalf * 2 * kWorkers == kBN * 8, "weight-only int8: whole chunks per thread");
  const u32 full0 = base + T::kSmem.bar_off, empty0 = full0 + 8u * T::kStages, loaded0 = base + T::kLoadedBar;
  // Chunk j of this thread: row (tid / 8) + kRowStep j, 16-byte chunk tid % 8 of its converted row
  // (elements 8 (tid % 8) + [0, 8)); every j has the same swizzle (row % 8), so one offset into
  // the loaded rows and one into the converted ones serve them all.
  const int tid = w * 32 + lane, row0 = tid >> 3, c = tid & 7;
  const u32 raw_off = u32(kBN * 64 + row0 * 64 + c * 8), dst_off = u32(row0 * 128 + ((c ^ (row0 & 7)) * 16));

  // Warp 0's load sequence: its own scheduler walk, ahead of the conversion (every M-grouped tile
  // has k-blocks).
  Scheduler<Cfg> load_sched(a);
  TileInfo lt;
  int l_unit = int(blockIdx.x), l_kb = 0, l_stage = 0;
  u32 l_phase = 0;
  bool l_more = w == 0 && load_sched.get(l_unit, 0, lt);
  auto issue_load = [&] {
    if (!l_more) return;
    sm90::mbar_wait(empty0 + 8u * l_stage, l_phase ^ 1u);
    if (lane == 0) {
      const u32 bar = loaded0 + 8u * l_stage;
      const u32 b_stage = base + T::kSmem.b_off + u32(l_stage) * T::kSmem.b_stage;
      sm90::mbar_arrive_expect_tx(bar, T::kTxBytes);
      const int kt = l_kb * stage_k<Cfg>();  // the stage's first K
      sm90::tma_load_2d(base + T::kSmem.a_off + u32(l_stage) * T::kSmem.a_stage, &a.a_map, bar, int(k_bytes<Cfg>(kt)), lt.row0);
      sm90::tma_load_3d(b_stage + u32(kBN) * 64u, &a.b_map, bar, kt, lt.n0, lt.group);
    }
    if (++l_kb == tile_k_blocks<Cfg>(lt)) {
      l_kb = 0;
      l_unit += int(gridDim.x);
      l_more = load_sched.get(l_unit, 0, lt);
    }
    if (++l_stage == T::kStages) l_stage = 0, l_phase ^= 1u;
  };
  if (w == 0) {
    if (lane == 0) {
      sm90::tma_prefetch_descriptor(&a.a_map);
      sm90::tma_prefetch_descriptor(&a.b_map);
    }
    for (int i = 0; i < T::kStages - 1; ++i) issue_load();
  }

  Scheduler<Cfg> sched(a);
  int stage = 0;
  u32 phase = 0;
  for (int unit = int(blockIdx.x);; unit += int(gridDim.x)) {
    TileInfo t;
    if (!sched.get(unit, 0, t)) break;
    const int k_blocks = tile_k_blocks<Cfg>(t);
    for (int kb = 0; kb < k_blocks; ++kb) {
      sm90::mbar_wait(loaded0 + 8u * stage, phase);  // (its load waited for the stage to be free)
      u8* b = smem + T::kSmem.b_off + u32(stage) * T::kSmem.b_stage;
      const u8* raw = b + raw_off;
      u8* dst = b + dst_off;
      uint2 upper[kHalf];  // rows [kBN / 2, kBN), as loaded
#pragma unroll
      for (int j = 0; j < kHalf; ++j) upper[j] = *reinterpret_cast<const uint2*>(raw + (j + kHalf) * kRowStep * 64);
#pragma unroll
      for (int j = 0; j < kHalf; ++j) {  // rows [0, kBN / 2): written below the loaded bytes
        const uint2 v = *reinterpret_cast<const uint2*>(raw + j * kRowStep * 64);
        uint4 o;
        s8x4_to_16bit<kBf16>(v.x, o.x, o.y);
        s8x4_to_16bit<kBf16>(v.y, o.z, o.w);
        *reinterpret_cast<uint4*>(dst + j * kRowStep * 128) = o;
      }
      sm90::named_barrier(kConvertBarrier, kWorkers);  // every loaded byte of the stage is read
#pragma unroll
      for (int j = 0; j < kHalf; ++j) {
        uint4 o;
        s8x4_to_16bit<kBf16>(upper[j].x, o.x, o.y);
        s8x4_to_16bit<kBf16>(upper[j].y, o.z, o.w);
        *reinterpret_cast<uint4*>(dst + (j + kHalf) * kRowStep * 128) = o;
      }
      sm90::fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(full0 + 8u * stage);
      if (w == 0) issue_load();  // k-block kb + kStages - 1
      if (++stage == T::kStages) stage = 0, phase ^= 1u;
    }
  }
}

// NVFP4 producer warpgroups: all their warps dequantize every k-block's B, from its load slot into
// its stage once both are ready (loaded; consumed by the MMAs of the stage's previous k-block).
// Warp 0 also issues the TMA loads of A and raw B into the load slots (gemm_smem: L = kStages + 1
// .. kStages + 3), L - kStages + 1 k-blocks ahead of its own dequantization, right after waiting for the
// stage: the consumers freed that stage's last k-block, kb - kStages, after reading the A of
// kb - kStages + 1, the slot's previous k-block, so the load's wait for its slot is over but at
// a tile's first k-blocks (whose A the consumers read after the previous tile's epilogue), and
// the dequantization of kb may run kStages - 1 k-blocks ahead of the MMAs. A
// unit of work is (row, word index i) of the k-block: the four words (q, i), q = 0..3, of one row,
// which give four 16-byte chunks of fp16 B (steps 2i and 2i + 1, both column halves). Then the
// writes are made visible to the tensor cores (async proxy), each lane frees the load slot and
// each warp arrives on full[stage].
template <class Cfg>
__device__ __forceinline__ void fp4_producer(const GemmArgs& a, u8* smem, u32 base, int w, int lane) {
  using T = Traits<Cfg>;
  constexpr int kBN = T::kBN;
  constexpr int kUnits = kBN * 4;
  constexpr int kWorkers = 128 * T::kProducerGroups;
  constexpr int kPer = kUnits / kWorkers;
  // Scale loads per thread and k-block: K-grouped, one per distinct B row (units 2 x kBN apart share
  // a row; its scale loads take bounds checks): wgrad 426-433 -> 450-454 TFLOP/s, members 449-457
  // -> 465-467 (same-run A/B, H100, three rounds); M-grouped keeps one per unit (one per row measured
  // 477-485 against 490-496 at 8 x 4096 x 4096 x 7168).
  constexpr int kRows = !Cfg::kKGrouped || kPer < 2 * kBN / kWorkers ? kPer : 2 * kBN / kWorkers;
  constexpr int kSlots = T::kLoadSlots;
  constexpr int kLag = kSlots - T::kStages + 1;
  static_assert(kUnits % kWorkers == 0 && (2 * kBN) % kWorkers == 0 && kPer % kRows == 0 && kLag >= 1 && kLag <= kSlots,
                "NVFP4: whole units per thread, a load lag");
  // Scale bytes per row of B: [G, N, K/16], or K-grouped [N, k_total/16] (k_total % 32 == 0: a
  // 32-token quarter of a k-block is wholly inside or past the row; 8-byte loads when the row is
  // a multiple of 8 bytes, k_total % 128 == 0), members [N, M_g/16] each (TileInfo::s_cols).
  const u32 full0 = base + T::kSmem.bar_off, empty0 = full0 + 8u * T::kStages, loaded0 = base + T::kLoadedBar;
  const u32 free0 = base + T::kFreeBar;
  const int tid = w * 32 + lane;
  const u8* sb = static_cast<const u8*>(a.b_scale);

  // Warp 0's load sequence: its own scheduler walk, ahead of the dequantization.
  Scheduler<Cfg> load_sched(a);
  TileInfo lt;
  int l_unit = int(blockIdx.x), l_kb = 0, l_slot = 0;
  u32 l_phase = 0;
  bool l_more = w == 0 && load_sched.get(l_unit, 0, lt);
  auto skip_empty = [&] {  // K-grouped: an empty group's tiles load nothing
    if constexpr (Cfg::kKGrouped) {
      while (l_more && tile_k_blocks<Cfg>(lt) == 0) {
        l_unit += int(gridDim.x);
        l_more = load_sched.get(l_unit, 0, lt);
      }
    }
  };
  skip_empty();
  MemberMaps<Cfg> maps(a);
  auto issue_load = [&] {
    if (!l_more) return;
    if (l_kb == 0) maps.prepare(a, smem + T::kSmem.maps_off, base + T::kSmem.maps_off, lt, lane);
    sm90::mbar_wait(free0 + 8u * l_slot, l_phase ^ 1u);
    if (lane == 0) {
      const u32 bar = loaded0 + 8u * l_slot;
      sm90::mbar_arrive_expect_tx(bar, T::kTxBytes);
      const int kc = lt.k0 / 2 + l_kb * (kGemmBlockK / 2);  // bytes of packed e2m1 (M-grouped: k0 = 0)
      const u32 b_dst = base + T::kSmem.braw_off + u32(l_slot) * T::kSmem.braw_stage;
      sm90::tma_load_2d(base + T::kSmem.a_off + u32(l_slot) * T::kSmem.a_stage, maps.a_map, bar, kc, lt.row0);
      if constexpr (Cfg::kKGrouped) sm90::tma_load_2d(b_dst, maps.b_map(a), bar, kc, lt.n0);  // B [N, k_total/2] (members: [N, M_g/2])
      else sm90::tma_load_3d(b_dst, &a.b_map, bar, kc, lt.n0, lt.group);                   // B [G, N, K/2]
    }
    if (++l_kb == tile_k_blocks<Cfg>(lt)) {
      l_kb = 0;
      l_unit += int(gridDim.x);
      l_more = load_sched.get(l_unit, 0, lt);
      skip_empty();
    }
    if (++l_slot == kSlots) l_slot = 0, l_phase ^= 1u;
  };
  if (w == 0) {
    if (lane == 0 && !Cfg::kMembers) {
      sm90::tma_prefetch_descriptor(&a.a_map);
      sm90::tma_prefetch_descriptor(&a.b_map);
    }
    for (int i = 0; i < kLag; ++i) issue_load();
  }

  Scheduler<Cfg> sched(a);
  u32 seq = 0;  // k-blocks dequantized so far: stage seq % kStages, load slot seq % kSlots (one register)
  for (int unit = int(blockIdx.x);; unit += int(gridDim.x)) {
    TileInfo t;
    if (!sched.get(unit, 0, t)) break;
    const int k_blocks = tile_k_blocks<Cfg>(t);
    const i64 scale_row = Cfg::kKGrouped ? i64(t.s_cols) : Cfg::kK / 16;
    const bool scale_u64 = scale_row % 8 == 0;  // members: N % 8 == 0 keeps N * s_prefix 8-byte aligned
    const u8* sbt = sb + (Cfg::kKGrouped ? i64(Cfg::kN) * t.s_prefix : 0);
    // This thread's rows' scales of k-block kb (8 bytes per row; zero past N and past k_limit),
    // loaded one k-block ahead so that their latency hides behind a k-block's dequantization.
    // Unit j takes the scales of load j % kRows.
    uint2 sc[kRows], sc_next[kRows];
    auto load_scales = [&](int kb, uint2* dst) {
      const int tok = t.k0 + kb * kGemmBlockK;  // the k-block's first token (M-grouped: of K)
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int row = ((tid + kWorkers * j) >> 1) & (kBN - 1), col = t.n0 + row;
        const u8* p = sbt + (Cfg::kKGrouped ? i64(col) : i64(t.group) * Cfg::kN + col) * scale_row + tok / 16;
        dst[j] = make_uint2(0, 0);
        if (col >= int(Cfg::kN) || (Cfg::kKGrouped && tok >= t.k_limit)) continue;
        if (!Cfg::kKGrouped || scale_u64) {
          dst[j] = *reinterpret_cast<const uint2*>(p);
        } else {  // K-grouped rows of 2 (mod 8) bytes: the quarters inside the row, two bytes each
          u32 h[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) h[c] = tok + 32 * c < t.k_limit ? *reinterpret_cast<const u16*>(p + 2 * c) : 0u;
          dst[j] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
        }
      }
    };
    if (k_blocks > 0) load_scales(0, sc_next);
    for (int kb = 0; kb < k_blocks; ++kb) {
#pragma unroll
      for (int j = 0; j < kRows; ++j) sc[j] = sc_next[j];
      if (kb + 1 < k_blocks) load_scales(kb + 1, sc_next);
      const u32 stage = seq % u32(T::kStages), slot = seq % u32(kSlots);
      sm90::mbar_wait(empty0 + 8u * stage, (seq / u32(T::kStages) & 1u) ^ 1u);
      if (w == 0) issue_load();  // k-block kb + kLag
      sm90::mbar_wait(loaded0 + 8u * slot, seq / u32(kSlots) & 1u);
      const u8* raw = smem + T::kSmem.braw_off + u32(slot) * T::kSmem.braw_stage;
      u8* dst = smem + T::kSmem.b_off + u32(stage) * T::kSmem.b_stage;
      const int2 kept = kept_tokens<Cfg>(t, kb);
      // K-grouped: drop the other groups' tokens (fp4::nibble_mask; members: TMA's zero fill and
      // zero scales past M_g). Masks of the data and scales before the conversion keep it
      // branch-free (masks of its products, under a branch per word, cost 10 %).
      const bool edge = !Cfg::kMembers && (kept.x > 0 || kept.y < kGemmBlockK);
      uint2 smask = make_uint2(~0u, ~0u);  // the row's eight scales of the k-block
      if (edge) smask = make_uint2(fp4::scale_mask(0, kept.x, kept.y), fp4::scale_mask(64, kept.x, kept.y));
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int u = tid + kWorkers * j;
        // Lanes take i's low bit fastest, then rows: a quarter-warp's 16-byte stores hit 8 distinct
        // bank groups.
        const int i_hi = u / (2 * kBN), row = (u >> 1) & (kBN - 1), i = 2 * i_hi + (u & 1);
        const u8* rp = raw + row * 64 + 4 * i;  // 64-byte swizzle: chunk q at (q ^ (row / 2 % 4)) * 16
        const int sw = (row >> 1) & 3;
        u32 wq[4], s4[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) wq[q] = *reinterpret_cast<const u32*>(rp + ((q ^ sw) * 16));
        if (edge) {  // word (q, i) holds tokens 32 q + 8 i + [0, 8)
#pragma unroll
          for (int q = 0; q < 4; ++q) wq[q] &= fp4::nibble_mask(32 * q + 8 * i, kept.x, kept.y);
        }
        // Scale bytes 2q + i_hi, q = 0..3, of the row's eight.
        const uint2 scj = sc[j % kRows];
        fp4::scales4(sm90::prmt(scj.x & smask.x, scj.y & smask.y, 0x6420u + 0x1111u * u32(i_hi)), s4);
        u8* drow = dst + i_hi * (kBN * 128) + row * 128;
        u32 p[4][4];
#pragma unroll
        for (int q = 0; q < 4; ++q) fp4::pairs(wq[q], p[q]);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int s = 2 * i + (r >> 1), c = 2 * (s & 3) + (r & 1);
          uint4 v;
          v.x = sm90::hmul2(p[0][r], s4[0]);
          v.y = sm90::hmul2(p[1][r], s4[1]);
          v.z = sm90::hmul2(p[2][r], s4[2]);
          v.w = sm90::hmul2(p[3][r], s4[3]);
          *reinterpret_cast<uint4*>(drow + ((c ^ (row & 7)) * 16)) = v;
        }
      }
      sm90::fence_proxy_async_shared();
      sm90::mbar_arrive(free0 + 8u * slot);  // this lane's reads of the raw B are done
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(full0 + 8u * stage);
      ++seq;
    }
  }
}

// Every lane arrives, so that each thread's own reads of the stage (its scale slot) are ordered
// by its own release before the producer's acquire and next writes (one lane's arrival after a
// __syncwarp orders them too, by cumulativity, but compute-sanitizer racecheck reports the
// next round's writes as hazards then). With multicast, on each CTA's barrier of the group (this
// CTA's own with the CTA-scope arrive).
template <class Cfg>
__device__ __forceinline__ void release_stage(u32 empty, int lane, u32 rank) {
  (void)lane;
  if constexpr (Traits<Cfg>::kMc == 1) {
    sm90::mbar_arrive(empty);
  } else {
#pragma unroll
    for (u32 c = 0; c < u32(Traits<Cfg>::kMc); ++c) {
      if (c == rank) sm90::mbar_arrive(empty);
      else sm90::mbar_arrive_cluster(empty, c);
    }
  }
}

// A fragment's four outputs of columns c, c + 1 in rows r, r + 8 (acc4: d[4j .. 4j + 3]): times the
// rows' factors, then, with per-column scales, times the columns' factors staged at col_c.
template <class S>
__device__ __forceinline__ void epilogue_values(const float* acc4, float rf0, float rf1, const float* col_c, float& v0,
                                                float& v1, float& v2, float& v3) {
  v0 = acc4[0] * rf0, v1 = acc4[1] * rf0, v2 = acc4[2] * rf1, v3 = acc4[3] * rf1;
  if constexpr (S::kColScales) {
    const float c0 = col_c[0], c1 = col_c[1];
    v0 = v0 * c0, v1 = v1 * c1, v2 = v2 * c0, v3 = v3 * c1;
  }
}

// K-grouped: D[g] is a whole [kM, N] matrix per group, so every tile goes out through the tensor
// engine (a.d_map, D as [G][kM][N]; rows past kM and columns past N are clipped by the map): each
// pass, the warpgroup writes its 64 rows into boxes of [64][128 bytes] (128-byte swizzle), makes
// them visible to the async proxy, and one thread stores them, or with accumulation reduce-adds
// them (D += v in fp32 at L2, the same rounding as the load-add-store form). The warpgroup goes on
// to its next tile while the engine reads the staging; the next pass first waits for those reads.
template <class Cfg>
__device__ __forceinline__ void epilogue_tma(const GemmArgs& a, const TileInfo& t, const Frag& f, u8* smem,
                                             u32 base, float* acc, const typename Traits<Cfg>::Scaling::Tile& ts) {
  using T = Traits<Cfg>;
  using S = typename T::Scaling;
  constexpr int kBoxCols = kGemmEpiBoxBytes / T::kOutBytes;
  constexpr int kBoxes = T::kEpiCols / kBoxCols;
  static_assert(T::kEpiCols % kBoxCols == 0, "whole boxes per pass");
  const u32 bar_id = 1u + u32(f.wg);
  const u32 staging_off = T::kSmem.staging_off + u32(f.wg) * T::kSmem.staging_wg;
  u8* staging = smem + staging_off;
  float* cols = reinterpret_cast<float*>(smem + T::kSmem.col_off) + f.wg * T::kBN;
  if constexpr (S::kColScales) S::template store_cols<Cfg>(ts, cols, f);  // read after the pass barrier
  float rf0 = S::template row_factor<Cfg>(ts, 0), rf1 = S::template row_factor<Cfg>(ts, 1);
  if constexpr (Cfg::kMembers) {
    if (t.bad) rf0 = rf1 = __int_as_float(0x7FC00000);  // a member the kernel cannot read: D[g] is NaN
  }
  const int quad = f.lane & 3;
  // Byte of column c (within the pass) of row r in the boxes: box c / kBoxCols, 16-byte chunk
  // ((c % kBoxCols) * bytes / 16) ^ (r % 8) of the box's row r. The fragment's rows r and r + 8
  // share r % 8; the quad's 2 * quad columns sit at byte (2 * quad * bytes) % 16 of their chunk.
  const int r0 = f.row - f.wg * 64;  // the first fragment row within the warpgroup's 64
  u8* row0 = staging + r0 * kGemmEpiBoxBytes + ((2 * quad * T::kOutBytes) & 15);
  u8* row1 = row0 + 8 * kGemmEpiBoxBytes;
  const int swz = (r0 & 7) << 4;
  auto off = [&](int c) {  // c: the quad's first column, 8 * jj + 2 * quad
    const int cb = (c % kBoxCols) * T::kOutBytes;
    return (c / kBoxCols) * (64 * kGemmEpiBoxBytes) + ((cb & ~15) ^ swz);
  };
#pragma unroll
  for (int pass = 0; pass < T::kBN / T::kEpiCols; ++pass) {
    if (f.tid == 0) sm90::bulk_wait_read_all();  // the previous pass's (or tile's) boxes are read
    sm90::named_barrier(bar_id, 128);
#pragma unroll
    for (int i = 0; i < T::kEpiCols / 2; ++i) sm90::fence_reg(acc[pass * (T::kEpiCols / 2) + i]);
#pragma unroll
    for (int jj = 0; jj < T::kEpiCols / 8; ++jj) {
      const int j = pass * (T::kEpiCols / 8) + jj;
      const int c = 8 * jj + 2 * quad;
      float v0, v1, v2, v3;
      epilogue_values<S>(acc + 4 * j, rf0, rf1, cols + pass * T::kEpiCols + c, v0, v1, v2, v3);
      if constexpr (T::kOutBytes == 4) {
        *reinterpret_cast<float2*>(row0 + off(c)) = make_float2(v0, v1);
        *reinterpret_cast<float2*>(row1 + off(c)) = make_float2(v2, v3);
      } else {
        *reinterpret_cast<u32*>(row0 + off(c)) = u32(f32_to_bf16(v0)) | (u32(f32_to_bf16(v1)) << 16);
        *reinterpret_cast<u32*>(row1 + off(c)) = u32(f32_to_bf16(v2)) | (u32(f32_to_bf16(v3)) << 16);
      }
    }
    sm90::fence_proxy_async_shared();  // this thread's writes, visible to the tensor engine
    sm90::named_barrier(bar_id, 128);
    if (f.tid == 0) {
#pragma unroll
      for (int b = 0; b < kBoxes; ++b) {
        const int col = t.n0 + pass * T::kEpiCols + b * kBoxCols;
        if (col < int(Cfg::kN))
          sm90::tma_store_3d<Cfg::kAccumulate>(&a.d_map, base + staging_off + u32(b * 64 * kGemmEpiBoxBytes), col,
                                               t.row0 + f.wg * 64, t.group);
      }
      sm90::bulk_commit();
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void epilogue(const GemmArgs& a, const TileInfo& t, const Frag& f, u8* smem,
                                         float* acc, const typename Traits<Cfg>::Scaling::Tile& ts) {
  using T = Traits<Cfg>;
  using S = typename T::Scaling;
  const u32 bar_id = 1u + u32(f.wg);
  float* cols = reinterpret_cast<float*>(smem + T::kSmem.col_off) + f.wg * T::kBN;
  u32* staging = reinterpret_cast<u32*>(smem + T::kSmem.staging_off + u32(f.wg) * T::kSmem.staging_wg);
  if constexpr (S::kColScales) S::template store_cols<Cfg>(ts, cols, f);
  const float rf0 = S::template row_factor<Cfg>(ts, 0), rf1 = S::template row_factor<Cfg>(ts, 1);
  const int frag_row = f.row - f.wg * 64;  // row within the warpgroup's 64
  const int quad = f.lane & 3;
  const int wg_row0 = t.row0 + f.wg * 64;         // rows of the group (K-grouped) or of D
  const int out_shift = t.out_row0 - t.row0;      // D row = tile row + out_shift
  constexpr int kChunkElems = 16 / T::kOutBytes;
  constexpr int kChunksPerRow = T::kEpiCols / kChunkElems;

#pragma unroll
  for (int pass = 0; pass < T::kBN / T::kEpiCols; ++pass) {
    sm90::named_barrier(bar_id, 128);  // staging free (and column scales visible)
    // Keep this pass's conversions after the barrier (hoisting them raises register pressure).
#pragma unroll
    for (int i = 0; i < T::kEpiCols / 2; ++i) sm90::fence_reg(acc[pass * (T::kEpiCols / 2) + i]);
#pragma unroll
    for (int jj = 0; jj < T::kEpiCols / 8; ++jj) {
      const int j = pass * (T::kEpiCols / 8) + jj;
      const int c = 8 * jj + 2 * quad;  // column within the pass
      float v0, v1, v2, v3;
      epilogue_values<S>(acc + 4 * j, rf0, rf1, cols + pass * T::kEpiCols + c, v0, v1, v2, v3);
      if constexpr (T::kOutBytes == 4) {
        *reinterpret_cast<float2*>(staging + frag_row * T::kPitch + c) = make_float2(v0, v1);
        *reinterpret_cast<float2*>(staging + (frag_row + 8) * T::kPitch + c) = make_float2(v2, v3);
      } else {
        staging[frag_row * T::kPitch + c / 2] = u32(f32_to_bf16(v0)) | (u32(f32_to_bf16(v1)) << 16);
        staging[(frag_row + 8) * T::kPitch + c / 2] = u32(f32_to_bf16(v2)) | (u32(f32_to_bf16(v3)) << 16);
      }
    }
    sm90::named_barrier(bar_id, 128);  // staging written
#pragma unroll 4
    for (int ch = f.tid; ch < 64 * kChunksPerRow; ch += 128) {
      const int r = ch / kChunksPerRow, cc = ch % kChunksPerRow;
      const int grow = wg_row0 + r;
      const int gcol = t.n0 + pass * T::kEpiCols + cc * kChunkElems;
      if (grow >= t.row_end || gcol >= int(Cfg::kN)) continue;
      const int drow = grow + out_shift;
      uint4 v = *reinterpret_cast<const uint4*>(staging + r * T::kPitch + cc * 4);
      u8* dst = static_cast<u8*>(a.d) + (i64(drow) * Cfg::kN + gcol) * T::kOutBytes;
      if constexpr (Cfg::kAccumulate) {
        const float4 old = *reinterpret_cast<const float4*>(dst);
        v.x = f32_bits(old.x + __uint_as_float(v.x));
        v.y = f32_bits(old.y + __uint_as_float(v.y));
        v.z = f32_bits(old.z + __uint_as_float(v.z));
        v.w = f32_bits(old.w + __uint_as_float(v.w));
      }
      *reinterpret_cast<uint4*>(dst) = v;
    }
  }
}

// int8 operands: the tensor cores' s32 sums, whose bits the MMAs leave in the float registers, as
// fp32 values (exact up to 2^24 in magnitude, then rounded to nearest even); nothing for fp8.
template <class Cfg, int N>
__device__ __forceinline__ void int_sums_to_float(float* v) {
  if constexpr (Traits<Cfg>::kInt8) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __int2float_rn(__float_as_int(v[i]));
  }
}

// A finished tile of a consumer warpgroup -> D.
template <class Cfg>
__device__ __forceinline__ void store_tile(const GemmArgs& a, const TileInfo& t, const Frag& f, u8* smem, u32 base,
                                           float* acc, const typename Traits<Cfg>::Scaling::Tile& ts) {
  if constexpr (Cfg::kKGrouped) epilogue_tma<Cfg>(a, t, f, smem, base, acc, ts);
  else epilogue<Cfg>(a, t, f, smem, acc, ts);
}

// K-grouped: zeroes the bytes of a stage's rows outside [keep_lo, keep_hi) (the kept tokens times
// the element size; A: this warpgroup's 64 rows; B: its share of the block_n rows): the previous
// group's last tokens before the group's first (stage_k-aligned) load and the next group's after
// its last, so that they add nothing. Then
// makes the writes visible to the tensor cores (async proxy) and waits for the other consumer
// warpgroups' share. The tiles are TMA's 128-byte swizzle: byte c of row r sits at
// r * 128 + ((c / 16) ^ (r % 8)) * 16 + c % 16.
template <class Cfg>
__device__ __forceinline__ void zero_k_outside(u8* smem, int stage, int keep_lo, int keep_hi, const Frag& f) {
  using T = Traits<Cfg>;
  auto zero_rows = [&](u8* tile, int rows, int part, int parts) {
    for (int i = part; i < rows * 8; i += parts) {
      const int r = i / 8, j = i % 8, c0 = 16 * j;
      if (c0 >= keep_lo && c0 + 16 <= keep_hi) continue;  // all kept
      u8* chunk = tile + r * 128 + ((j ^ (r % 8)) * 16);
      if (c0 + 16 <= keep_lo || c0 >= keep_hi) {
        *reinterpret_cast<uint4*>(chunk) = make_uint4(0, 0, 0, 0);
      } else {
        for (int c = 0; c < 16; ++c)
          if (c0 + c < keep_lo || c0 + c >= keep_hi) chunk[c] = 0;
      }
    }
  };
  zero_rows(smem + T::kSmem.a_off + u32(stage) * T::kSmem.a_stage + u32(f.wg) * 64u * 128u, 64, f.tid, 128);
  zero_rows(smem + T::kSmem.b_off + u32(stage) * T::kSmem.b_stage, T::kBN, f.wg * 128 + f.tid, 128 * T::kConsumers);
  sm90::fence_proxy_async_shared();
  if constexpr (T::kConsumers > 1) sm90::named_barrier(1u + u32(T::kConsumers), 128u * T::kConsumers);
}

// NVFP4 consumer: per k-block, its A rows' packed e2m1 (the load slot, freed as soon as they are
// read) and e4m3 scales (global, loaded one k-block ahead) become the eight k-steps' fp16
// register fragments (one buffer: the previous k-block's MMAs are waited for first, as ptxas
// serializes MMAs whose fragments are written while they may run), then eight m64nNk16 MMAs with B from the stage's fp16 copy; the
// tensor cores accumulate over all of K in fp32, scaled by 2^-28 (fp4::pairs) until the epilogue.
// K-grouped: the k-blocks of the group's token range, other groups' tokens masked to zero at its
// edges (as in fp4_producer for B).
template <class Cfg>
__device__ __forceinline__ void consumer_fp4(const GemmArgs& a, u8* smem, u32 base, int wg) {
  using T = Traits<Cfg>;
  using S = typename T::Scaling;
  const int tid = threadIdx.x % 128, lane = threadIdx.x % 32, warp = tid / 32;
  const Frag f{wg, tid, lane, wg * 64 + warp * 16 + lane / 4};
  Scheduler<Cfg> sched(a);
  const u32 full0 = base + T::kSmem.bar_off, empty0 = full0 + 8u * T::kStages, loaded0 = base + T::kLoadedBar;
  const u32 free0 = base + T::kFreeBar;
  const int a_rows = Cfg::kKGrouped ? int(Cfg::kM) : int(a.m_total);
  const int quad = lane & 3;
  const u8* sa = static_cast<const u8*>(a.a_scale);
  float acc[T::kAcc];
  u32 frag[32];
  int stage = 0, slot = 0;
  u32 phase = 0, slot_phase = 0;
  for (int unit = int(blockIdx.x);; unit += int(gridDim.x)) {
    TileInfo t;
    if (!sched.get(unit, 0, t)) break;
    const typename S::Tile ts = S::template begin<Cfg>(a, t, f);
    const int r0 = t.row0 + f.row, r1 = r0 + 8;
    // A's scales: [rows, K/16], K-grouped [kM, k_total/16], members [kM, M_g/16] each.
    const i64 scale_row = Cfg::kKGrouped ? i64(t.s_cols) : Cfg::kK / 16;
    const u8* sat = sa + (Cfg::kKGrouped ? i64(Cfg::kM) * t.s_prefix : 0);
    // Scale bytes 2q and 2q + 1 of rows r0 and r1 in k-block kb: tokens [32 q, 32 q + 32) (rows
    // past the end, and K-grouped tokens past k_limit: 0; their products are never stored).
    u32 sc0 = 0, sc1 = 0;
    auto load_scales = [&](int kb) {
      const int tok = t.k0 + kb * kGemmBlockK + 32 * quad;
      const bool in_k = !Cfg::kKGrouped || tok < t.k_limit;
      sc0 = r0 < a_rows && in_k ? *reinterpret_cast<const u16*>(sat + i64(r0) * scale_row + tok / 16) : 0u;
      sc1 = r1 < a_rows && in_k ? *reinterpret_cast<const u16*>(sat + i64(r1) * scale_row + tok / 16) : 0u;
    };
    const int k_blocks = tile_k_blocks<Cfg>(t);
    if (k_blocks > 0) load_scales(0);
    int prev_stage = 0;
    auto step = [&](u32* fr, int kb) {
      sm90::mbar_wait(loaded0 + 8u * slot, slot_phase);  // A (TMA)
      sm90::mbar_wait(full0 + 8u * stage, phase);         // B dequantized
      const u8* ap = smem + T::kSmem.a_off + u32(slot) * T::kSmem.a_stage + f.row * 64 + 16 * quad;
      const uint4 x0 = *reinterpret_cast<const uint4*>(ap), x1 = *reinterpret_cast<const uint4*>(ap + 8 * 64);
      sm90::mbar_arrive(free0 + 8u * slot);  // this lane's reads of the load slot are done
      if (++slot == T::kLoadSlots) slot = 0, slot_phase ^= 1u;
      u32 w0[4] = {x0.x, x0.y, x0.z, x0.w}, w1[4] = {x1.x, x1.y, x1.z, x1.w};
      if constexpr (Cfg::kKGrouped && !Cfg::kMembers) {  // members: zero data and scales past M_g
        const int2 kept = kept_tokens<Cfg>(t, kb);
        if (kept.x > 0 || kept.y < kGemmBlockK) {  // drop the other groups' tokens (fp4::nibble_mask)
          const u32 sm = fp4::scale_mask(32 * quad, kept.x, kept.y);  // bytes 0, 1: tokens 32 q + [0, 32)
          sc0 &= sm, sc1 &= sm;
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // word i: tokens 32 q + 8 i + [0, 8)
            const u32 nm = fp4::nibble_mask(32 * quad + 8 * i, kept.x, kept.y);
            w0[i] &= nm, w1[i] &= nm;
          }
        }
      }
      const u32 h0 = sm90::e4m3x2_to_f16x2(sc0), h1 = sm90::e4m3x2_to_f16x2(sc1);
      const u32 s0[2] = {sm90::prmt(h0, 0, 0x1010u), sm90::prmt(h0, 0, 0x3232u)};
      const u32 s1[2] = {sm90::prmt(h1, 0, 0x1010u), sm90::prmt(h1, 0, 0x3232u)};
      if (kb + 1 < k_blocks) load_scales(kb + 1);
      u32 p0[4][4], p1[4][4];  // the pairs of every word of rows g and g + 8
      sm90::wgmma_wait<0>();  // the previous k-block's MMAs are done: their fragments and stage are free
      if (kb > 0) release_stage<Cfg>(empty0 + 8u * prev_stage, lane, 0);
#pragma unroll
      for (int i = 0; i < 4; ++i) fp4::pairs(w0[i], p0[i]), fp4::pairs(w1[i], p1[i]);
#pragma unroll
      for (int st = 0; st < 8; ++st) {
        const int i = st >> 1, r = 2 * (st & 1);
        fr[4 * st + 0] = sm90::hmul2(p0[i][r], s0[i >> 1]);
        fr[4 * st + 1] = sm90::hmul2(p1[i][r], s1[i >> 1]);
        fr[4 * st + 2] = sm90::hmul2(p0[i][r + 1], s0[i >> 1]);
        fr[4 * st + 3] = sm90::hmul2(p1[i][r + 1], s1[i >> 1]);
      }
      // Keep the conversions before the MMAs (interleaved with them, ptxas would serialize the MMAs).
#pragma unroll
      for (int i = 0; i < 32; ++i) sm90::fence_reg(fr[i]);
#pragma unroll
      for (int i = 0; i < T::kAcc; ++i) sm90::fence_reg(acc[i]);
      sm90::wgmma_fence();
      const u32 b_st = base + T::kSmem.b_off + u32(stage) * T::kSmem.b_stage;
#pragma unroll
      for (int st = 0; st < 8; ++st) {
        // Step st: fp16 K [16 st, 16 st + 16) = half st / 4, +32 bytes per step inside its 128-byte rows.
        const u64 db = sm90::smem_desc_sw128(b_st + u32(st >> 2) * u32(T::kBN * 128) + u32(st & 3) * 32u);
        wgmma::mma_m64k16_f16_rs<T::kBN>(acc, fr + 4 * st, db, kb > 0 || st > 0);
      }
      sm90::wgmma_commit();
      prev_stage = stage;
      if (++stage == T::kStages) stage = 0, phase ^= 1u;
    };
    if (k_blocks == 0) {  // K-grouped empty group: its output is zero
#pragma unroll
      for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.0f;
    }
    for (int kb = 0; kb < k_blocks; ++kb) step(frag, kb);
    sm90::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < T::kAcc; ++i) sm90::fence_reg(acc[i]), acc[i] *= fp4::kOperandOffset;  // exact
    if (k_blocks > 0) release_stage<Cfg>(empty0 + 8u * prev_stage, lane, 0);
    store_tile<Cfg>(a, t, f, smem, base, acc, ts);
  }
}

template <class Cfg>
__device__ __forceinline__ void consumer(const GemmArgs& a, u8* smem, u32 base, u32 rank, int wg) {
  using T = Traits<Cfg>;
  using S = typename T::Scaling;
  const int tid = threadIdx.x % 128, lane = threadIdx.x % 32, warp = tid / 32;
  const Frag f{wg, tid, lane, wg * 64 + warp * 16 + lane / 4};
  Scheduler<Cfg> sched(a);
  const u32 full0 = base + T::kSmem.bar_off, empty0 = full0 + 8u * T::kStages;
  // Ordered issue: wait on turn[wg], arrive on turn[1 - wg] (WG0's first wait passes at once).
  const u32 turn0 = empty0 + 8u * T::kStages;
  u32 turn_phase = wg == 0 ? 1u : 0u;
  float acc[T::kAcc];
  float part1[Cfg::kPromote ? T::kAcc : 1];  // the second partial sum (promotion)
  float total[Cfg::kPromote ? T::kAcc : 1];
  int stage = 0;
  u32 phase = 0;
  const int stride = int(gridDim.x) / T::kMc;
  for (int unit = int(blockIdx.x) / T::kMc;; unit += stride) {
    TileInfo t;
    if (!sched.get(unit, rank, t)) break;
    typename S::Tile ts = S::template begin<Cfg>(a, t, f);
    const int k_blocks = tile_k_blocks<Cfg>(t);
    // Waits for k-block kb of the tile (in `stage`); K-grouped: zeroes the other groups' tokens.
    auto stage_ready = [&](int kb) {
      sm90::mbar_wait(full0 + 8u * stage, phase);
      if constexpr (Cfg::kKGrouped && !Cfg::kMembers) {  // members: TMA zero-fills past M_g
        const int2 kept = kept_tokens<Cfg>(t, kb);
        if (kept.x > 0 || kept.y < stage_k<Cfg>())
          zero_k_outside<Cfg>(smem, stage, kept.x * int(Cfg::kElemBytes), kept.y * int(Cfg::kElemBytes), f);
      }
    };
    auto wait_turn = [&] {
      if constexpr (Cfg::kOrderedIssue) {
        sm90::mbar_wait(turn0 + 8u * u32(wg), turn_phase);
        turn_phase ^= 1u;
      }
    };
    auto pass_turn = [&] {
      if constexpr (Cfg::kOrderedIssue) {
        if (lane == 0) sm90::mbar_arrive(turn0 + 8u * u32(1 - wg));
      }
    };
    const u32 a_wg = base + T::kSmem.a_off + u32(wg) * 64u * 128u;
    if constexpr (Cfg::kPromote) {
      // fp32 promotion with two partial sums. A step is kMmas MMAs (a k-block of 128, or 32 of K
      // for per-32 scaling) into part[s % 2]; once step s is issued, step s - 1 is waited for
      // (wait_group 1) and promoted into `total` while step s runs, and its stage is released
      // after its stage's last step (the promotion may read the stage's scale slot). A k-block's
      // Step (the policy's scales for it) is taken when its MMAs are issued: `cur`, and `prev`
      // for the k-block before.
      constexpr int kSteps = S::kSteps;
      constexpr int kMmas = kGemmMmasPerStage / kSteps;
      constexpr int kUnroll = kSteps == 1 ? 2 : kSteps;  // steps per iteration: even, whole stages
#pragma unroll
      for (int i = 0; i < T::kAcc; ++i) total[i] = 0.0f;
      const int steps = k_blocks * kSteps;
      int prev_stage = 0;
      auto slot_of = [&](int st) {
        return reinterpret_cast<const float*>(smem + T::kSmem.sc_off + u32(st) * T::kSmem.sc_stage);
      };
      u64 da = 0, db = 0;
      typename S::Step cur{}, prev{};
      // Issues step s (step k of its stage) into `part`.
      auto issue = [&](float* part, int s, int k) {
        if (k == 0) {
          prev = cur;
          cur = S::template load_step<Cfg>(a, ts, f, s / kSteps, slot_of(stage));
          stage_ready(s / kSteps);
          da = sm90::smem_desc_sw128(a_wg + u32(stage) * T::kSmem.a_stage);
          db = sm90::smem_desc_sw128(base + T::kSmem.b_off + u32(stage) * T::kSmem.b_stage);
          wait_turn();
        }
#pragma unroll
        for (int i = 0; i < T::kAcc; ++i) sm90::fence_reg(part[i]);
        sm90::wgmma_fence();
#pragma unroll
        for (int m = 0; m < kMmas; ++m) {
          // +32 bytes along K per instruction (2 in the descriptor's 16-byte address units).
          const int kk = k * kMmas + m;
          wgmma::mma_ss<T::kBN, typename Cfg::AFormat, typename T::MmaB>(part, da + u64(2 * kk), db + u64(2 * kk), m > 0);
        }
        sm90::wgmma_commit();
        if (k == kSteps - 1) pass_turn();
      };
      auto end_stage = [&](int k) {
        if (k == kSteps - 1) {
          prev_stage = stage;
          if (++stage == T::kStages) stage = 0, phase ^= 1u;
        }
      };
      // An odd number of k-blocks (one step per k-block): the first runs alone, waited for at
      // once, so that the pairs below end in part1. (K-grouped only: otherwise the count is a
      // compile-time constant and this folds away.)
      int first = 0;
      if (kUnroll > kSteps && steps % 2 == 1) {
        issue(part1, 0, 0);
        sm90::wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < T::kAcc; ++i) sm90::fence_reg(part1[i]);
        int_sums_to_float<Cfg, T::kAcc>(part1);
        S::template promote_step<Cfg, T::kAcc>(total, part1, cur, 0, f, ts);
        release_stage<Cfg>(empty0 + 8u * stage, lane, rank);
        end_stage(0);
        first = 1;
      }
      for (int s0 = first; s0 < steps; s0 += kUnroll) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int s = s0 + u;
          const int k = u % kSteps;  // step within its stage
          float* part = u % 2 == 0 ? acc : part1;
          float* done = u % 2 == 0 ? part1 : acc;
          issue(part, s, k);
          sm90::wgmma_wait<1>();
#pragma unroll
          for (int i = 0; i < T::kAcc; ++i) sm90::fence_reg(done[i]);
          if (s > first) {  // step s - 1: the previous stage's last step, or this stage's previous one
            int_sums_to_float<Cfg, T::kAcc>(done);
            S::template promote_step<Cfg, T::kAcc>(total, done, k == 0 ? prev : cur, (k + kSteps - 1) % kSteps, f, ts);
            if (k == 0) release_stage<Cfg>(empty0 + 8u * prev_stage, lane, rank);
          }
          end_stage(k);
        }
      }
      // Waited for outside the branch: with a run-time step count (K-grouped), a wait inside it
      // makes ptxas serialize every wgmma of the kernel (C7518).
      sm90::wgmma_wait<0>();
      if (steps > first) {  // the last step, in part1
#pragma unroll
        for (int i = 0; i < T::kAcc; ++i) sm90::fence_reg(part1[i]);
        int_sums_to_float<Cfg, T::kAcc>(part1);
        S::template promote_step<Cfg, T::kAcc>(total, part1, cur, kSteps - 1, f, ts);
        release_stage<Cfg>(empty0 + 8u * prev_stage, lane, rank);
      }
      store_tile<Cfg>(a, t, f, smem, base, total, ts);
    } else {
      // No promotion: the tensor cores accumulate over all of K; one k-block's MMAs stay in flight.
      if (k_blocks == 0) {  // K-grouped empty group: its output is zero
#pragma unroll
        for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.0f;
      }
      int prev_stage = 0;
      for (int kb = 0; kb < k_blocks; ++kb) {
        stage_ready(kb);
        const u64 da = sm90::smem_desc_sw128(a_wg + u32(stage) * T::kSmem.a_stage);
        const u64 db = sm90::smem_desc_sw128(base + T::kSmem.b_off + u32(stage) * T::kSmem.b_stage);
        wait_turn();
#pragma unroll
        for (int i = 0; i < T::kAcc; ++i) sm90::fence_reg(acc[i]);
        sm90::wgmma_fence();
#pragma unroll
        for (int k = 0; k < kGemmMmasPerStage; ++k)
          wgmma::mma_ss<T::kBN, typename Cfg::AFormat, typename T::MmaB>(acc, da + u64(2 * k), db + u64(2 * k),
                                                                         kb > 0 || k > 0);
        sm90::wgmma_commit();
        pass_turn();
        sm90::wgmma_wait<1>();  // the previous k-block's MMAs are done: release its stage
        if (kb > 0) release_stage<Cfg>(empty0 + 8u * prev_stage, lane, rank);
        prev_stage = stage;
        if (++stage == T::kStages) stage = 0, phase ^= 1u;
      }
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < T::kAcc; ++i) sm90::fence_reg(acc[i]);
      if (k_blocks > 0) release_stage<Cfg>(empty0 + 8u * prev_stage, lane, rank);
      int_sums_to_float<Cfg, T::kAcc>(acc);  // (an empty group's zeros are 0 either way)
      store_tile<Cfg>(a, t, f, smem, base, acc, ts);
    }
  }
}

}  // namespace gemm

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

#endif  // __CUDACC__

}  // namespace qf
