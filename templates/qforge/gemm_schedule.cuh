// The grouped GEMM's units of work: K per stage (stage_k), the output tile a role works on
// (TileInfo), where a consumer thread's accumulator fragment sits (Frag), and the persistent tile
// scheduler every role of every CTA walks in the same order: M-grouped (contiguous or masked
// groups, mn_major scale-grid prefixes), K-grouped (one shared token dimension, or per-member
// operands); a tile's k-blocks and the tokens of a k-block that belong to the tile's group.
#pragma once
#include "qforge/gemm_args.cuh"
#include "qforge/gemm_smem.cuh"
#include "qforge/layout.cuh"

namespace qf {
namespace gemm {

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

}  // namespace gemm
}  // namespace qf
