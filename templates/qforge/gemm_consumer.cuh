// The grouped GEMM's consumer warpgroups for operands in shared memory: per k-block, wait for the
// stage (K-grouped: zero the other groups' tokens), issue its wgmma MMAs (ordered issue: the two
// warpgroups in turn), with promotion add each partial sum into an fp32 total with the scaling
// policy's factors, release the stage; then the epilogue.
#pragma once
#include "qforge/gemm_epilogue.cuh"
#include "qforge/gemm_schedule.cuh"
#include "qforge/gemm_smem.cuh"
#include "qforge/gemm_traits.cuh"
#include "qforge/sm90.cuh"
#include "qforge/wgmma.cuh"

namespace qf {
namespace gemm {

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

// int8 operands: the tensor cores' s32 sums, whose bits the MMAs leave in the float registers, as
// fp32 values (exact up to 2^24 in magnitude, then rounded to nearest even); nothing for fp8.
template <class Cfg, int N>
__device__ __forceinline__ void int_sums_to_float(float* v) {
  if constexpr (Traits<Cfg>::kInt8) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __int2float_rn(__float_as_int(v[i]));
  }
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
}  // namespace qf
