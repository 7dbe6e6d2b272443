// M-grouped DeepSeek-V3 blockwise scaling (1x128 blocks of A, 128x128 blocks of B; compact or
// mn_major A grids): every k-block is promoted, with the scales each consumer thread loads from
// global memory into registers, groups of 8 k-blocks ahead, shared by the four lanes of a quad.
#pragma once
#include "qforge/gemm_scaling.cuh"

namespace qf {
namespace gemm {

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

}  // namespace gemm
}  // namespace qf
