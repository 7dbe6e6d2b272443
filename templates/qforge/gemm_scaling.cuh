// Scaling policies of the grouped GEMM: the interface every scaling kind implements (below), and
// the kinds whose factors are per tensor, per row of A or per column of D: none (alpha), per
// tensor, per row x per channel, weight-only int8's per channel. The kinds with factors along K
// are in gemm_scaling_block128.cuh (M-grouped blockwise, scales in registers) and
// gemm_scaling_slots.cuh (MX and K-grouped blockwise, scales in the stages' slots); NVFP4's is in
// gemm_nvfp4.cuh.
#pragma once
#include "qforge/gemm_args.cuh"
#include "qforge/gemm_schedule.cuh"

namespace qf {
namespace gemm {

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

}  // namespace gemm
}  // namespace qf
