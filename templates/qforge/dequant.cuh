// The dequant route of the MXFP8 and NVFP4 grouped GEMMs (compiler/gemm_codegen.h, GemmRoute):
// each operand is dequantized once into a 16-bit copy, then the bf16 / fp16 GEMM (gemm.cuh, none
// scaling) runs on the copies. MXFP8: e4m3 / e5m2 x e8m0 into bf16, exact but where the value
// passes bf16's range or falls below its smallest subnormal (2^-133); NVFP4: e2m1 x e4m3 into fp16,
// always exact (|x| <= 2688, multiples of 2^-10), the per-tensor decode scales going into the
// per-group alpha (dequant_prep_kernel) as the fused kernel folds them into its epilogue factor.
//
// Cfg (generated per operand): Format (E4M3, E5M2 or E2M1), kNvfp4, kThreads.
#pragma once
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

namespace qf {

// Where a block's scale sits (the layouts the fused kernels read).
enum DequantGrid : int {
  kGridCompact = 0,   // [rows, ceil(k / block)] row-major
  kGridMnMajor = 1,   // grids of grid_rows rows back to back, each [ceil(k / block), round_up(grid_rows, 4)]
                      // (one tensor: grid_rows = rows; MXFP8 B per expert: N; masked A: m_max)
  kGridGroups = 2,    // M-grouped A, mn_major: group g's grid [ceil(k / block), round_up(rows_g, 4)] after
                      // those of groups 0..g-1 (prefix from dequant_prep_kernel); offsets clamped to
                      // [0, rows] and group g's end to at least its start, as the fused kernel's
                      // scheduler does (rising offsets: the same scales; falling ones are the caller's
                      // error either way); rows outside every group become zero, the rows of a group
                      // whose grid would pass the buffer NaN
  kGridMembers = 3,   // K-grouped members (the grouped quantizer's per-member copies): member g, tokens
                      // [offsets[g], offsets[g+1]) clamped to [0, k] (its end to at least its start), is its
                      // own matrix [rows, len] at element rows * offsets[g], its grid [rows, ceil(len / block)]
                      // after rows x prefix[g] entries (prefix from dequant_prep_kernel: the token blocks of the
                      // members before, saturated at cap + 1; -1 for a member the fused kernel cannot load,
                      // whose copy is left alone: the prep kernel makes its alpha NaN, so D[g] is NaN as the
                      // fused kernel's); elements outside every member are left alone too (no GEMM reads them)
  kGridMembersMnMajor = 4,  // the same, each member's grid [ceil(len / block), round_up(rows, 4)] after
                            // round_up(rows, 4) x prefix[g] entries
};

struct DequantArgs {
  const u8* data;       // [rows, k] fp8, or packed e2m1 [rows, k / 2] (element 2i in the low nibble)
  const u8* scale;      // e8m0 (MXFP8) or e4m3 (NVFP4) scales, laid out by `grid`
  u16* out;             // [rows, k] bf16 (MXFP8) or fp16 (NVFP4)
  i64 rows, k;          // k: elements per row (members' prep: rows = A's, for NVFP4's odd-grid rule)
  i64 grid_rows;        // kGridMnMajor
  i32 grid;             // DequantGrid
  i32 num_groups;       // kGridGroups, members; dequant_prep_kernel
  const i64* offsets;   // kGridGroups: row offsets [num_groups + 1]; members: token offsets
  i64* prefix;          // kGridGroups: padded grid rows before each group [num_groups + 1] (written by
                        // dequant_prep_kernel from the offsets clamped to [0, rows], saturated at cap + 1);
                        // members: token blocks before each member (offsets clamped to [0, k]), -1 for a
                        // member the fused kernel cannot load (Scheduler::get_k_grouped: a first token or
                        // length off Cfg::kMemberAlign, a grid past the cap, NVFP4's odd grid start of A)
  i64* starts;          // kGridGroups, members: the running maximum of the clamped offsets [num_groups + 1]
                        // (written by dequant_prep_kernel; GroupCursor's, rising whatever the offsets)
  i64 cap;              // kGridGroups: grid rows the scale buffer holds (m_total + 3 num_groups); members:
                        // its token blocks per row (ceil(k / block) + num_groups)
  // dequant_prep_kernel, NVFP4 and members: alpha_out[g] = alpha[g] (1 when null), NVFP4 x
  // decode(a_amax[g]) x decode(b_amax[g]) in double, rounded once (the fused kernel's epilogue
  // factor); members: NaN for a member the fused kernel cannot load (its D[g] is NaN there).
  const float* alpha;
  const float* a_amax;
  const float* b_amax;
  float* alpha_out;
};

// Threads a dequant_kernel launch needs for an operand (the host sizes the grid from it). NVFP4:
// one per 16-element block. MXFP8: one per 8 elements (a lane loads 8 bytes, stores 16: a warp's
// loads and stores are whole 256- and 512-byte runs); mn_major grids in warps of 2 rows x 4 blocks.
QF_HD i64 dequant_threads(i64 rows, i64 k, bool nvfp4, bool tiled) {
  if (nvfp4) {
    const i64 nblk = (k + 15) / 16;
    return tiled ? (rows + 7) / 8 * ((nblk + 3) / 4) * 32 : rows * nblk;
  }
  const i64 nblk = (k + 31) / 32;
  return tiled ? (rows + 1) / 2 * ((nblk + 3) / 4) * 32 : rows * ((k + 7) / 8);
}

#if defined(__CUDACC__)
namespace dequant {

// Offset i clamped to [0, hi] (gemm_schedule.cuh's Scheduler::clamp_row, hi = rows; clamp_tok, hi = k).
__device__ __forceinline__ i64 clamped_offset(const DequantArgs& a, int i, i64 hi) {
  const i64 v = a.offsets[i];
  return v < 0 ? 0 : v > hi ? hi : v;
}

template <class Cfg>
__device__ constexpr int block_elems() {
  return Cfg::kNvfp4 ? 16 : 32;
}

__device__ __forceinline__ bool members_grid(const DequantArgs& a) {
  return a.grid == kGridMembers || a.grid == kGridMembersMnMajor;
}

// A thread's place among the groups, kept across its grid strides (its positions only rise): the
// last group whose first position (a.starts[g] x unit: kGridGroups rows, unit 1; members elements,
// unit = rows) is at or before the position, or -1. a.starts is the running maximum of the clamped
// offsets (dequant_prep_kernel), rising whatever the offsets, so the answer depends on the
// position alone, however the thread came to it: a few steps on from the last group (a thread's
// strides mostly stay in a group), else a binary search, so that many small groups cost log G per
// position, not G per thread. Searching at every position (a chain of dependent loads per run)
// made the copies of per-member operands 1.7x slower (docs/gemm.md, "The dequant route on per-member copies").
struct GroupCursor {
  static constexpr int kSteps = 4;
  int g = -2;  // -2: not searched yet
  // Moves to pos's group; true where it changed.
  __device__ __forceinline__ bool seek(const DequantArgs& a, i64 pos, i64 unit) {
    const int G = a.num_groups;
    int lo = g < 0 ? -1 : g;  // a group that starts at or before pos (-1: none known)
    int step = g == -2 ? kSteps : 0;
    for (; step < kSteps && lo + 1 < G && a.starts[lo + 1] * unit <= pos; ++step) ++lo;
    if (step == kSteps && lo + 1 < G && a.starts[lo + 1] * unit <= pos) {
      int hi = G;  // the last of [lo + 1, hi) that starts at or before pos
      ++lo;
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (a.starts[mid] * unit <= pos) lo = mid;
        else hi = mid;
      }
    }
    const bool changed = lo != g;
    g = lo;
    return changed;
  }
};

// The scale entry of block kb of row r in a compact or plain mn_major grid (kGridGroups: the
// MXFP8 kernel's GroupCursor; members: dequant_members).
__device__ __forceinline__ i64 scale_index(const DequantArgs& a, i64 r, i64 kb, i64 nblk) {
  if (a.grid == kGridCompact) return r * nblk + kb;
  const i64 pitch = i64(mn_major_rows(u64(a.grid_rows)));
  return (r / a.grid_rows) * nblk * pitch + kb * pitch + r % a.grid_rows;
}

// e8m0 -> fp32 multiplier 2^(e - 127) (0xFF: NaN).
__device__ __forceinline__ float e8m0_value(u32 e) {
  return e == 0xFFu ? f32_quiet_nan() : e == 0u ? f32_from_bits(0x00400000u) : f32_from_bits(e << 23);
}

// Two fp8 bytes (low byte first) -> fp16x2, exact.
template <class F>
__device__ __forceinline__ u32 fp8x2_to_f16x2(u32 b) {
  u32 h;
  if constexpr (F::kManBits == 3) asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(u16(b)));
  else asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h) : "h"(u16(b)));
  return h;
}

// Eight fp8 bytes times the block's multiplier -> eight bf16 (four words).
template <class F>
__device__ __forceinline__ uint4 mx8(uint2 in, float mul) {
  const u32 w[2] = {in.x, in.y};
  u32 o[4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32 f2 = fp8x2_to_f16x2<F>(h ? w[i] >> 16 : w[i] & 0xFFFFu);
      float lo, hi;
      asm("{.reg .b16 l, u; mov.b32 {l, u}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, u;}" : "=f"(lo), "=f"(hi) : "r"(f2));
      u32 r;
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi * mul), "f"(lo * mul));
      o[2 * i + h] = r;
    }
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// An e2m1 nibble -> fp16 bits (exact): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
__device__ __forceinline__ u32 e2m1_f16(u32 n) {
  const u32 mag = n & 7u;
  const u32 bits = mag >= 2u ? ((((mag >> 1) + 14u) << 10) | ((mag & 1u) << 9)) : (mag == 1u ? 0x3800u : 0u);
  return bits | ((n & 8u) << 12);
}

// Eight packed bytes (sixteen e2m1) times the block's e4m3 scale (fp16x2 in both halves) ->
// sixteen fp16 (eight words), exact.
__device__ __forceinline__ void fp4x16(uint2 in, u32 s2, u32 (&o)[8]) {
  const u32 w[2] = {in.x, in.y};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const u32 byte = (w[i / 4] >> (8 * (i % 4))) & 0xFFu;
    const u32 v = e2m1_f16(byte & 0xFu) | (e2m1_f16(byte >> 4) << 16);
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(v), "r"(s2));
    o[i] = r;
  }
}

// One NVFP4 block: eight packed bytes times their e4m3 scale byte -> sixteen fp16 at out.
__device__ __forceinline__ void store_fp4x16(u16* out, uint2 in, u32 scale) {
  u32 h, o[8];
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(u16(scale)));
  fp4x16(in, (h & 0xFFFFu) | (h << 16), o);
  reinterpret_cast<uint4*>(out)[0] = make_uint4(o[0], o[1], o[2], o[3]);
  reinterpret_cast<uint4*>(out)[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// Members: one thread per run of 8 (fp8) or 16 (e2m1) elements of the operand's buffer, run i at
// element 8i / 16i whatever member holds it, so that every element is written by one thread only,
// whatever the offsets. The run's member is its GroupCursor's (a member spans rows x tokens
// elements, so most of a thread's strides stay in it); the thread keeps the member's constants and
// the run's row and token, stepped without a division. The data load goes first: nothing it reads
// depends on the member. A member the fused kernel cannot load (prefix -1) is left alone: its
// alpha is NaN. A loadable member's runs never pass its end (its start and length are multiples of
// Cfg::kMemberAlign tokens, at least a run).
template <class Cfg>
__device__ __forceinline__ void dequant_members(const DequantArgs& a) {
  using F = typename Cfg::Format;
  constexpr int B = block_elems<Cfg>();
  constexpr int kRun = Cfg::kNvfp4 ? 16 : 8;
  static_assert(Cfg::kMemberAlign % kRun == 0, "a member's runs stay in its rows");
  const bool mn = a.grid == kGridMembersMnMajor;
  const i64 rows = a.rows;
  const i64 pitch = mn ? i64(mn_major_rows(u64(rows))) : rows;  // grid entries per token block
  const i64 total = rows * a.k / kRun;  // (k: a multiple of the run, as k_total is of 16-byte rows)
  const i64 stride = i64(gridDim.x) * Cfg::kThreads, step = stride * kRun;
  GroupCursor cur;
  i64 k0 = 0, end = 0, prefix = -1, len = 0, cols = 0, r = 0, t = 0, dr = 0, dt = 0;  // of cur.g
  for (i64 i = i64(blockIdx.x) * Cfg::kThreads + threadIdx.x; i < total; i += stride) {
    const i64 p = i * kRun;
    const uint2 in = *reinterpret_cast<const uint2*>(a.data + (Cfg::kNvfp4 ? p / 2 : p));
    if (cur.seek(a, p, rows)) {  // a new member: its constants, and the run's place in it (one division)
      prefix = -1;
      if (cur.g >= 0) {
        k0 = clamped_offset(a, cur.g, a.k);
        len = max(k0, clamped_offset(a, cur.g + 1, a.k)) - k0;
        end = rows * (k0 + len);
        prefix = a.prefix[cur.g];
        cols = (len + B - 1) / B;
        if (prefix >= 0 && p < end) {
          const i64 q = p - rows * k0;
          r = q / len;
          t = q - r * len;
          dr = step / len;
          dt = step - dr * len;
        }
      }
    } else if (prefix >= 0 && p < end) {  // the same member, one stride on
      r += dr;
      t += dt;
      if (t >= len) {
        t -= len;
        ++r;
      }
    }
    if (prefix < 0 || p >= end) continue;  // no member, past the last one's end, or one it cannot load
    const i64 si = pitch * prefix + (mn ? (t / B) * pitch + r : r * cols + t / B);
    if constexpr (Cfg::kNvfp4) {
      store_fp4x16(a.out + p, in, a.scale[si]);
    } else {
      *reinterpret_cast<uint4*>(a.out + p) = mx8<F>(in, e8m0_value(a.scale[si]));
    }
  }
}

// The prep kernel's scans: the block's 1024 threads each give the value of their run of groups;
// returns the exclusive scan of them under op (0 first) at this thread, by one thread in between
// two barriers (runs: shared memory, reused).
template <class Op>
__device__ __forceinline__ i64 scan_runs(i64 (&runs)[1024], i64 mine, Op op) {
  __syncthreads();  // (the previous scan's reads are done)
  runs[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    i64 acc = 0;
    for (int i = 0; i < 1024; ++i) {
      const i64 v = runs[i];
      runs[i] = acc;
      acc = op(acc, v);
    }
  }
  __syncthreads();
  return runs[threadIdx.x];
}

}  // namespace dequant

// NVFP4: one thread per 16-element block (8 bytes in, 32 out). MXFP8: one thread per 8 elements
// (8 bytes in, 16 out; four threads share a block's scale), so that a warp's loads and stores are
// whole runs (a thread per 32-element block, 32 bytes in and 64 out, ran at about 71 % of the copy
// bandwidth: every load and store instruction of a warp touched twice or four times the sectors it
// wrote). Compact grids: the elements row by row. mn_major grids, whose bytes are contiguous along
// the rows: NVFP4 warps take 8 rows x 4 blocks, MXFP8 warps 2 rows x 4 blocks (128 bytes of each
// row), the warps of a row band along K (a walk down the rows, one block column at a time,
// measured 3x slower: every DRAM page opened for 32 bytes). A row's last MXFP8 block may be
// partial (k % 32 == 16, K-grouped token counts).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dequant_kernel(const DequantArgs a) {
  static_assert(Cfg::kThreads % 32 == 0, "whole warps (the tiled grids' warps of rows x blocks)");
  if (dequant::members_grid(a)) {
    dequant::dequant_members<Cfg>(a);
    return;
  }
  using F = typename Cfg::Format;
  constexpr int B = dequant::block_elems<Cfg>();
  const i64 nblk = i64(ceil_div(u64(a.k), u64(B)));
  const bool tiled = a.grid != kGridCompact;
  const i64 k_tiles = (nblk + 3) / 4;
  const i64 total = dequant_threads(a.rows, a.k, Cfg::kNvfp4, tiled);
  dequant::GroupCursor cur;  // kGridGroups: the row's group and its grid (base + row, pitch)
  i64 first = 0, end = 0, base = 0, pitch = 0;
  bool bad = false;
  for (i64 i = i64(blockIdx.x) * Cfg::kThreads + threadIdx.x; i < total; i += i64(gridDim.x) * Cfg::kThreads) {
    if constexpr (Cfg::kNvfp4) {
      i64 r, kb;
      if (tiled) {
        const i64 w = i / 32;
        const int lane = int(i % 32);
        r = w / k_tiles * 8 + lane % 8;
        kb = w % k_tiles * 4 + lane / 8;
        if (r >= a.rows || kb >= nblk) continue;
      } else {
        r = i / nblk;
        kb = i % nblk;
      }
      const i64 e = r * a.k + kb * B;
      dequant::store_fp4x16(a.out + e, *reinterpret_cast<const uint2*>(a.data + e / 2), a.scale[dequant::scale_index(a, r, kb, nblk)]);
    } else {
      i64 r, e0, si;  // the row and first element of this thread's 8, their block's scale entry
      if (tiled) {
        const i64 w = i / 32;
        const int lane = int(i % 32);
        r = w / k_tiles * 2 + lane / 16;
        e0 = (w % k_tiles * 4 + (lane / 4) % 4) * B + (lane % 4) * 8;
        if (r >= a.rows || e0 >= a.k) continue;
      } else {
        const i64 per_row = (a.k + 7) / 8;
        r = i / per_row;
        e0 = i % per_row * 8;
      }
      const uint2 in = *reinterpret_cast<const uint2*>(a.data + r * a.k + e0);  // first: it needs no lookup
      if (a.grid == kGridGroups) {
        // The row's group: rows outside every group have no scale (zero), a group whose grid
        // would pass the buffer NaN (as the fused kernel's scheduler).
        if (cur.seek(a, r, 1) && cur.g >= 0) {
          first = dequant::clamped_offset(a, cur.g, a.rows);
          end = max(first, dequant::clamped_offset(a, cur.g + 1, a.rows));
          pitch = i64(mn_major_rows(u64(end - first)));
          bad = a.prefix[cur.g] + pitch > a.cap;
          base = nblk * a.prefix[cur.g] - first;
        }
        si = cur.g < 0 || r >= end ? -1 : bad ? -2 : base + r + e0 / B * pitch;
      } else {
        si = dequant::scale_index(a, r, e0 / B, nblk);
      }
      const float mul = si >= 0 ? dequant::e8m0_value(a.scale[si]) : si == -1 ? 0.0f : f32_quiet_nan();
      *reinterpret_cast<uint4*>(a.out + r * a.k + e0) = dequant::mx8<F>(in, mul);
    }
  }
}

// One block before the operands' dequantization: kGridGroups' grid prefix or the members' token-block
// prefix (each thread a run of groups, then a scan of the runs' sums), the groups' starts (a scan
// of the runs' maxima), and the per-group alpha of NVFP4 and of members (alpha_out).
template <class Cfg>
__global__ void __launch_bounds__(1024) dequant_prep_kernel(const DequantArgs a) {
  const int G = a.num_groups, t = threadIdx.x;
  const bool members = dequant::members_grid(a);
  auto factor = [&](int g) {  // the GEMM's alpha of group g: the caller's, times NVFP4's decode scales
    const float alpha = a.alpha ? a.alpha[g] : 1.0f;
    if (!a.a_amax) return alpha;
    const float da = nvfp4_global_decode_scale(nvfp4_global_encode_scale(a.a_amax[g]));
    const float db = nvfp4_global_decode_scale(nvfp4_global_encode_scale(a.b_amax[g]));
    return float(double(alpha) * double(da) * double(db));
  };
  if (a.alpha_out && !members)
    for (int g = t; g < G; g += 1024) a.alpha_out[g] = factor(g);
  if (!a.prefix) return;
  const int per = (G + 1023) / 1024, g0 = t * per, g1 = min(G, g0 + per);  // this thread's run of groups
  // Clamped offsets (kGridGroups: to the rows; members: to the tokens), and group g's grid rows
  // (kGridGroups: its padded rows; members: its token blocks), as the kernels read them.
  auto offset = [&](int g) { return dequant::clamped_offset(a, g, members ? a.k : a.rows); };
  auto pitch = [&](int g) -> i64 {
    const i64 n = offset(g + 1) - offset(g);
    if (n <= 0) return 0;
    return members ? (n + dequant::block_elems<Cfg>() - 1) / dequant::block_elems<Cfg>() : i64(mn_major_rows(u64(n)));
  };
  __shared__ i64 runs[1024];
  // prefix[g]: the grid rows of groups 0..g-1, saturated at cap + 1; members: -1 for one the fused
  // kernel cannot load (Scheduler::get_k_grouped's rule), whose alpha becomes NaN.
  auto add = [&](i64 x, i64 y) { return x + y > a.cap + 1 ? a.cap + 1 : x + y; };
  i64 p = 0;
  for (int g = g0; g < g1; ++g) p += pitch(g);
  p = dequant::scan_runs(runs, p, add);
  for (int g = g0; g < g1; ++g) {
    a.prefix[g] = p;
    if (members) {
      const i64 k0 = offset(g), len = max(k0, offset(g + 1)) - k0;
      const bool bad = k0 % Cfg::kMemberAlign != 0 || len % Cfg::kMemberAlign != 0 || p + pitch(g) > a.cap ||
                       (Cfg::kNvfp4 && (p * a.rows) % 2 != 0);  // NVFP4 A's grid read two bytes at a time
      if (bad) a.prefix[g] = -1;
      a.alpha_out[g] = bad ? f32_quiet_nan() : factor(g);
    }
    p = add(p, pitch(g));
  }
  if (t == 1023) a.prefix[G] = p;
  // starts[g]: the largest offset of groups 0..g (GroupCursor).
  auto larger = [](i64 x, i64 y) { return max(x, y); };
  i64 m = 0;
  for (int g = g0; g < g1; ++g) m = max(m, offset(g));
  m = dequant::scan_runs(runs, m, larger);
  for (int g = g0; g < g1; ++g) a.starts[g] = m = max(m, offset(g));
  if (t == 1023) a.starts[G] = max(m, offset(G));
}
#endif

}  // namespace qf
