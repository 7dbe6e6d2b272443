// Scaling kinds whose factors change along K for every row of A and of B and reach the consumers
// through the stages' scale slots (SlotScaling: written by three writer warps of the producer
// warpgroup, or copied in by the producer warp's bulk copies): MXFP8 (e8m0 per 32 of K, compact
// or mn_major grids, M- and K-grouped) and K-grouped blockwise (fp32 per 128 tokens).
#pragma once
#include "qforge/gemm_scaling.cuh"
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"
#include "qforge/sm90.cuh"

namespace qf {
namespace gemm {

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

}  // namespace gemm
}  // namespace qf
