// The grouped GEMM's producer warpgroup for operands loaded as they are: warp 0 issues the TMA
// loads of A and B into the ring of stages (with multicast, each CTA loads half of A for both),
// first rewriting the tensor maps of a K-grouped member (MemberMaps); with slot scaling, warps
// 1..3 write the stages' scale slots (scale_writer).
#pragma once
#include "qforge/gemm_schedule.cuh"
#include "qforge/gemm_smem.cuh"
#include "qforge/gemm_traits.cuh"
#include "qforge/sm90.cuh"

namespace qf {
namespace gemm {

// K-grouped members: the ring of tensor-map pairs {A, B} per CTA in a.member_maps. The producer
// warp writes a group's pair into the next slot before the group's first load (a group without
// loads, empty or unreadable, takes no slot); slot v is reused L + 1 slot-taking groups later (L
// load slots, GemmSmem::load_slots), each with at least one load, when every load that read it is
// complete (the producer has waited for the slot of the load L + 1 loads back to be consumed).
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

}  // namespace gemm
}  // namespace qf
