// NVFP4 on Hopper, which has no fp4 MMA: e2m1 data and e4m3 scales converted to fp16 on chip
// (fp4::), the scaling policy, the producer warpgroups that dequantize B into the stages, and the
// consumers that dequantize A into wgmma's register fragments.
#pragma once
#include "qforge/gemm_consumer.cuh"
#include "qforge/gemm_epilogue.cuh"
#include "qforge/gemm_producer.cuh"
#include "qforge/gemm_scaling.cuh"
#include "qforge/gemm_schedule.cuh"
#include "qforge/gemm_smem.cuh"
#include "qforge/gemm_traits.cuh"
#include "qforge/numerics.cuh"
#include "qforge/sm90.cuh"
#include "qforge/wgmma.cuh"

namespace qf {
namespace gemm {

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

}  // namespace gemm
}  // namespace qf
