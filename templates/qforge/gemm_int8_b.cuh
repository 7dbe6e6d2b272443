// Weight-only int8 (bf16 / fp16 A x int8 B, channel scaling): the producer warpgroup that loads
// B's int8 as it is and converts it on chip, exactly, into A's 16-bit type in the 128-byte swizzle
// the MMAs read.
#pragma once
#include "qforge/gemm_schedule.cuh"
#include "qforge/gemm_traits.cuh"
#include "qforge/sm90.cuh"

namespace qf {
namespace gemm {

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

}  // namespace gemm
}  // namespace qf
