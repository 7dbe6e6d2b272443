// Dequantize one stream of a grouped quantize's outputs (docs/numerics.md, "Grouped dequantize"):
// the members' split is the same device row offsets the grouped quantize took (member_rows
// [num_members + 1]), so no host sync and a CUDA graph can capture it. Member g holds rows
// [member_rows[g], member_rows[g+1]) of the input [M, K]; its data is the dense layout of its shape
// ([M_g, K], or [K, M_g] for transposed copies) at element K * member_rows[g] of the data buffer,
// its scale grid the dense grid of its shape after those of members 0..g-1, its per-tensor amax
// amax[g]. Every element is dequantize.cuh's value of that member (dequant_element over a
// DequantizeArgs of the member: the same helper as the single-tensor kernel), written at the same
// element index of `out`, so out holds each member's dense copy back to back. NVFP4 with
// alpha_out: the values leave the member's S_dec out (decode(q) * decode(s), exact in bf16) and
// alpha_out[g] = S_dec(amax[g]), the per-group alpha of a grouped GEMM on the copies.
//
// Offsets as the kernels read them: each clamped to [0, M], then the running maximum (starts), so
// the members tile [starts[0], starts[G]) whatever the offsets; rows outside every member (only
// where the offsets break the quantize's contract: member_rows[0] == 0, rising, last == M) are
// written as zero.
//
// Cfg (generated, as dequantize.cuh's): Format, kScale, kIdentityIn, kOut, kThreads.
#pragma once
#include "qforge/dequant.cuh"
#include "qforge/dequantize.cuh"

namespace qf {

struct DequantGroupedArgs {
  const u8* data;            // the grouped data buffer (members back to back)
  const u8* scale;           // the grouped scale buffer (fp32, e8m0 or e4m3 entries); null for identity
  const float* amax;         // NVFP4: the members' per-tensor amaxes [num_members]
  void* out;                 // M * K elements of the output dtype, each member's at its data's element offset
  const i64* member_rows;    // [num_members + 1] row offsets (the grouped quantize's)
  i64* starts;               // workspace [num_members + 1]: clamped offsets, running maximum (prep kernel)
  i64* scale_base;           // workspace [num_members + 1]: grid entries before each member (prep kernel)
  float* alpha_out;          // NVFP4, optional [num_members]: S_dec per member; the values leave it out
  i64 m, k;                  // the grouped input's total rows and its columns
  i64 entry_rows, entry_cols;  // data elements one scale entry covers (data-layout coords; 0: the whole extent)
  i32 num_members;
  i32 transposed;            // the data layout is [K, M_g] per member
  i32 swizzled, mn_major;    // the grids' storage order
};

// Member g's data-layout shape ([rows, cols]) and scale grid, as compiler/buffers.h scale_grid
// derives a dense tensor's of the member's shape. Pointers unset.
QF_HD DequantizeArgs dequant_member_geometry(const DequantGroupedArgs& g, i64 member_rows) {
  DequantizeArgs a{};
  a.rows = g.transposed ? g.k : member_rows;
  a.cols = g.transposed ? member_rows : g.k;
  const i64 gr = g.entry_rows ? i64(ceil_div(u64(a.rows), u64(g.entry_rows))) : 1;
  const i64 gc = g.entry_cols ? i64(ceil_div(u64(a.cols), u64(g.entry_cols))) : 1;
  a.block_rows = g.entry_rows ? g.entry_rows : (a.rows > 0 ? a.rows : 1);
  a.block_cols = g.entry_cols ? g.entry_cols : (a.cols > 0 ? a.cols : 1);
  a.grid_padded_rows = g.swizzled ? i64(round_up(u64(gr), 128)) : g.mn_major ? i64(mn_major_rows(u64(gr))) : gr;
  a.grid_padded_cols = g.swizzled ? i64(round_up(u64(gc), 4)) : gc;
  a.swizzled = g.swizzled;
  a.mn_major = g.mn_major;
  return a;
}

// Scale entries of a member of `member_rows` rows (0 for identity streams: no scales).
template <class Cfg>
QF_HD i64 dequant_member_grid_size(const DequantGroupedArgs& g, i64 member_rows) {
  if constexpr (Cfg::kScale == kDqNone) return 0;
  const DequantizeArgs a = dequant_member_geometry(g, member_rows);
  return a.grid_padded_rows * a.grid_padded_cols;
}

template <class Cfg>
QF_HD constexpr int dequant_data_bits() {
  if constexpr (Cfg::kScale == kDqNone) return Cfg::kIdentityIn == 0 ? 32 : 16;
  else return Cfg::Format::kBits == 4 ? 4 : 8;
}

#if defined(__CUDACC__)
// One block of 1024 threads: starts (clamped offsets, running maximum), the members' scale-grid
// bases (a scan of each thread's run of members), alpha_out. dequant.cuh's scan_runs.
template <class Cfg>
__global__ void __launch_bounds__(1024) dequant_grouped_prep_kernel(const DequantGroupedArgs a) {
  const int G = a.num_members, t = threadIdx.x;
  const int per = (G + 1 + 1023) / 1024, g0 = t * per, g1 = min(G + 1, g0 + per);  // a run of the G + 1 offsets
  auto clamped = [&](int g) {
    const i64 v = a.member_rows[g];
    return v < 0 ? i64(0) : v > a.m ? a.m : v;
  };
  __shared__ i64 runs[1024];
  i64 mx = 0;
  for (int g = g0; g < g1; ++g) mx = max(mx, clamped(g));
  mx = dequant::scan_runs(runs, mx, [](i64 x, i64 y) { return max(x, y); });
  for (int g = g0; g < g1; ++g) a.starts[g] = mx = max(mx, clamped(g));
  __syncthreads();  // every start written (and visible to the block) before the sizes read them
  auto size = [&](int g) { return g < G ? dequant_member_grid_size<Cfg>(a, a.starts[g + 1] - a.starts[g]) : i64(0); };
  i64 sum = 0;
  for (int g = g0; g < g1; ++g) sum += size(g);
  sum = dequant::scan_runs(runs, sum, [](i64 x, i64 y) { return x + y; });
  for (int g = g0; g < g1; ++g) {
    a.scale_base[g] = sum;
    sum += size(g);
  }
  if constexpr (Cfg::kScale == kDqE4M3) {
    if (a.alpha_out)
      for (int g = t; g < G; g += 1024) a.alpha_out[g] = nvfp4_global_decode_scale(nvfp4_global_encode_scale(a.amax[g]));
  }
}

// Grid-stride over element pairs of out (two neighbours in the buffer: one packed e2m1 byte where
// the member's data starts on a byte). An element's member is the last g with starts[g] <= its
// input row (element / K: a member spans K * M_g elements from K * starts[g]), found by binary
// search over starts and kept while the thread's elements stay in it.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dequant_grouped_kernel(const DequantGroupedArgs a) {
  const int G = a.num_members;
  const u64 n = u64(a.m) * u64(a.k);
  const u64 stride = u64(gridDim.x) * Cfg::kThreads * 2;
  int g = -1;
  i64 lo = 0, hi = 0;  // member g's rows [lo, hi)
  DequantizeArgs mem{};
  float s_dec = 1.0f;
  for (u64 i = (u64(blockIdx.x) * Cfg::kThreads + threadIdx.x) * 2; i < n; i += stride) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const u64 e = i + j;
      if (e >= n) continue;
      const i64 row = i64(e / u64(a.k));
      if (g < 0 || row < lo || row >= hi) {
        g = -1;
        if (row >= a.starts[0] && row < a.starts[G]) {
          int l = 0, h = G;  // the last member in [l, h) that starts at or before row
          while (h - l > 1) {
            const int mid = (l + h) / 2;
            if (a.starts[mid] <= row) l = mid;
            else h = mid;
          }
          g = l;
          lo = a.starts[g];
          hi = a.starts[g + 1];
          mem = dequant_member_geometry(a, hi - lo);
          const u64 first = u64(lo) * u64(a.k);  // the member's first element
          mem.data = a.data + first * dequant_data_bits<Cfg>() / 8;
          if constexpr (Cfg::kScale != kDqNone)
            mem.scale = a.scale + u64(a.scale_base[g]) * (Cfg::kScale == kDqF32 ? 4 : 1);
          if constexpr (Cfg::kScale == kDqE4M3)
            s_dec = a.alpha_out ? 1.0f : nvfp4_global_decode_scale(nvfp4_global_encode_scale(a.amax[g]));
        }
      }
      float v = 0.0f;  // a row outside every member
      if (g >= 0) {
        const u64 q = e - u64(lo) * u64(a.k);  // the element's index in the member's data layout
        v = dequant_element<Cfg>(mem, q / u64(mem.cols), q % u64(mem.cols), s_dec);
      }
      dequant_store<Cfg::kOut>(a.out, e, v);
    }
  }
}
#endif

}  // namespace qf
