// The fused quantize kernels. Generated code (compiler/codegen.cpp) defines one config struct
// for the plan and one per stream / per amax reduction, with named constants, and names the
// kernel templates below; everything else is here, as ordinary CUDA.
//
//   amax_kernel<Cfg, A...>  - phase 0 when the plan needs global reductions first: the tensor
//                             amax (raw or after RHT) and per-channel amaxes.
//   cast_kernel<Cfg, S...>  - the cast: one read of each input tile into shared memory, then
//                             every stream S (rowwise / columnwise, any format) written from it.
//
// A tile is kTileRows x kTileCols of the input. A stream walks the tile in "runs": kEpt
// consecutive elements along its blocks' direction (K for rowwise, M for columnwise), handled
// by one thread; kGroup consecutive lanes whose runs share one scale block reduce its amax
// with shuffles. Scales come from docs/numerics.md through numerics.cuh, the same functions
// the CPU reference runs.
#pragma once
#include "qforge/args.cuh"
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

namespace qf {

// Scaling modes, in the order of the Scaling variant of compiler/formats.h.
enum ScaleMode : int {
  kModeNone = 0,
  kModeTensorCurrent = 1,
  kModeTensorDelayed = 2,
  kModeChannel = 3,
  kModeBlock = 4,
  kModeMx = 5,
  kModeNvfp4 = 6,
};

enum AmaxScopeCode : int { kScopeTensor = 0, kScopeChannelRows = 1, kScopeChannelCols = 2 };

// Identity (high-precision passthrough) "format": D is the output dtype code (numerics.cuh:
// 0 fp32, 1 bf16, 2 fp16).
template <int D>
struct Identity {
  static constexpr int kBits = D == 0 ? 32 : 16;
  static constexpr int kDtype = D;
};
template <class F> struct is_identity { static constexpr bool value = false; };
template <int D> struct is_identity<Identity<D>> { static constexpr bool value = true; };

// Shared-memory bytes of cast_kernel (also computed by the host code generator).
QF_HD constexpr u32 cast_smem_bytes(int tile_rows, int tile_cols, bool rht, int block2d_entries) {
  return 4u * u32(tile_rows) * u32(tile_cols + 1) * (rht ? 2u : 1u) + 4u * u32(block2d_entries);
}

#if defined(__CUDACC__)

namespace detail {

__device__ __forceinline__ float load_input(const void* x, i64 idx, int dtype) {
  if (dtype == 0) return static_cast<const float*>(x)[idx];
  const u16 h = static_cast<const u16*>(x)[idx];
  return dtype == 1 ? bf16_to_f32(h) : f16_to_f32(h);
}

__device__ __forceinline__ float round_to_dtype(float v, int dtype) {
  if (dtype == 1) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == 2) return f16_to_f32(f32_to_f16(v));
  return v;
}

// Max of non-negative floats through their bit patterns (NaN never reaches here: amax_step
// ignores it).
__device__ __forceinline__ void atomic_max_nonneg(float* p, float v) {
  atomicMax(reinterpret_cast<u32*>(p), f32_bits(v));
}

template <int G>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int d = 1; d < G; d <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}

__device__ __forceinline__ float warp_max(float v) { return group_max<32>(v); }

// Where one member of the (possibly grouped) input lives.
struct Member {
  int index;      // member number (0 for a single tensor)
  i64 row_base;   // first row of x
  i64 rows;       // rows of this member
  i64 tile_row;   // this CTA's tile row within the member
};

// Scale grid of a stream for a member whose data is [R, C] (data-layout coordinates).
template <class S>
__device__ __forceinline__ void scale_grid(i64 R, i64 C, i64& rows, i64& cols, i64& prows, i64& pcols) {
  rows = S::kEntryRows ? i64(ceil_div(u64(R), u64(S::kEntryRows))) : 1;
  cols = S::kEntryCols ? i64(ceil_div(u64(C), u64(S::kEntryCols))) : 1;
  prows = S::kSwizzled ? i64(round_up(u64(rows), 128)) : rows;
  pcols = S::kSwizzled ? i64(round_up(u64(cols), 4)) : cols;
}

template <class S>
__device__ __forceinline__ i64 scale_grid_size(i64 member_rows, i64 k) {
  if (S::kMode == kModeNone) return 0;
  i64 r, c, pr, pc;
  scale_grid<S>(S::kTransposed ? k : member_rows, S::kTransposed ? member_rows : k, r, c, pr, pc);
  return pr * pc;
}

// Resolves this CTA's member; computes each stream's scale-grid base (in entries) for it.
template <class Cfg, class... S>
__device__ bool resolve_member(const QuantizeArgs& a, Member& mem, i64 (&scale_base)[kMaxStreams]) {
  __shared__ i64 sh[3 + kMaxStreams];
  if (!a.member_rows) {
    mem = Member{0, 0, a.m, i64(blockIdx.x)};
    for (int s = 0; s < kMaxStreams; ++s) scale_base[s] = 0;
    return i64(blockIdx.x) * Cfg::kTileRows < a.m;
  }
  if (threadIdx.x == 0) {
    i64 tiles = 0, bases[kMaxStreams] = {};
    sh[0] = -1;
    for (int g = 0; g < a.num_members; ++g) {
      const i64 r0 = a.member_rows[g], mg = a.member_rows[g + 1] - r0;
      const i64 t = i64(ceil_div(u64(mg), u64(Cfg::kTileRows)));
      if (i64(blockIdx.x) < tiles + t) {
        sh[0] = g, sh[1] = r0, sh[2] = mg;
        sh[3] = i64(blockIdx.x) - tiles;
        for (int s = 0; s < kMaxStreams; ++s) sh[4 + s] = bases[s];
        break;
      }
      tiles += t;
      int s = 0;
      ((bases[s] += scale_grid_size<S>(mg, a.k), ++s), ...);
    }
  }
  __syncthreads();
  if (sh[0] < 0) return false;
  mem = Member{int(sh[0]), sh[1], sh[2], sh[3]};
  for (int s = 0; s < kMaxStreams; ++s) scale_base[s] = sh[4 + s];
  return true;
}

// Loads the tile (fp32, zero outside the member / K) and, if asked, its RHT-rotated copy.
template <class Cfg>
__device__ void load_tile(const QuantizeArgs& a, const Member& mem, i64 col0, float* tile, float* rtile) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, P = TC + 1;
  const i64 row0 = mem.tile_row * TR;
  for (int i = threadIdx.x; i < TR * TC; i += Cfg::kThreads) {
    const int r = i / TC, c = i % TC;
    const i64 rl = row0 + r, cg = col0 + c;
    float v = 0.0f;
    if (rl < mem.rows && cg < a.k) v = load_input(a.x, (mem.row_base + rl) * a.k + cg, Cfg::kInDtype);
    tile[r * P + c] = v;
  }
  if constexpr (Cfg::kRht) {
    __syncthreads();
    for (int i = threadIdx.x; i < (TR / 16) * TC; i += Cfg::kThreads) {
      const int grp = i / TC, c = i % TC;
      float v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) v[j] = tile[(grp * 16 + j) * P + c];
      rht16(v, Cfg::kRhtMask);
#pragma unroll
      for (int j = 0; j < 16; ++j) rtile[(grp * 16 + j) * P + c] = round_to_dtype(v[j], Cfg::kInDtype);
    }
  }
  __syncthreads();
}

// Geometry of one stream's walk over a tile.
template <class Cfg, class S>
struct Walk {
  static constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, E = S::kEpt;
  static constexpr bool kRowwise = S::kDir == 0;
  // Lanes sweep consecutive runs of one line (rowwise, transposed) or consecutive columns
  // (columnwise with the [M, K] layout).
  static constexpr int kRuns = TR * TC / E;
  static_assert((kRowwise ? TC : TR) % E == 0, "runs tile the tile");
  static_assert(S::kGroup == 1 || (32 % S::kGroup == 0 && (kRowwise || S::kTransposed)),
                "scale groups are lanes of one warp along one line");
  __device__ static void run_origin(int j, int& r, int& c) {
    if constexpr (kRowwise) {
      r = j / (TC / E), c = (j % (TC / E)) * E;
    } else if constexpr (S::kTransposed) {
      c = j / (TR / E), r = (j % (TR / E)) * E;
    } else {
      c = j % TC, r = (j / TC) * E;
    }
  }
  // Tile coordinates of element e of the run starting at (r, c).
  __device__ static void elem(int r, int c, int e, int& er, int& ec) {
    if constexpr (kRowwise) er = r, ec = c + e;
    else er = r + e, ec = c;
  }
};

template <class F>
__device__ __forceinline__ u32 encode_elem(float v, u32 rbits) {
  if constexpr (F::kBits == 16 || F::kBits == 32) {
    return 0;  // identity handled by the caller
  } else {
    (void)rbits;
    return encode_rn<F>(v);
  }
}

// The scale of one block: the element multiplier and the stored scale entry (fp32 bits or a
// byte), from the amaxes the mode depends on.
template <class Cfg, class S>
__device__ __forceinline__ void block_scale(float block_amax, float tensor_amax, float delayed_scale,
                                            float& mul, u32& entry) {
  using F = typename S::Format;
  if constexpr (S::kMode == kModeTensorCurrent || S::kMode == kModeBlock) {
    const float inf_value = S::kMode == kModeBlock ? Cfg::kInMaxFinite : kFltMax;
    const float amax = S::kMode == kModeBlock ? block_amax : tensor_amax;
    const float scale = compute_scale(amax, F::kMaxFinite, S::kEpsilon, S::kPow2, inf_value);
    mul = scale;
    entry = f32_bits(1.0f / scale);
  } else if constexpr (S::kMode == kModeTensorDelayed) {
    mul = delayed_scale;
    entry = f32_bits(1.0f / delayed_scale);
  } else if constexpr (S::kMode == kModeChannel) {
    const float scale = int8_channel_scale(block_amax, Cfg::kInDtype);
    mul = int8_channel_multiplier(scale);
    entry = f32_bits(scale);
  } else if constexpr (S::kMode == kModeMx) {
    const u8 e = S::kMxFloor ? e8m0_floor(block_amax, F::kEmax)
                             : e8m0_rceil(block_amax * (1.0f / F::kMaxFinite));
    mul = mx_multiplier(e);
    entry = e;
  } else if constexpr (S::kMode == kModeNvfp4) {
    const float s_enc = nvfp4_global_encode_scale(tensor_amax);
    const float s_dec = nvfp4_global_decode_scale(s_enc);
    const u8 sb = nvfp4_block_scale(block_amax, s_enc);
    mul = nvfp4_element_multiplier(sb, s_dec);
    entry = sb;
  } else {
    mul = 1.0f;
    entry = 0;
  }
}

template <class S>
__device__ __forceinline__ void store_entry(void* base, i64 off, u32 entry) {
  if constexpr (S::kMode == kModeMx || S::kMode == kModeNvfp4)
    static_cast<u8*>(base)[off] = u8(entry);
  else
    static_cast<u32*>(base)[off] = entry;
}

// 2D block amaxes of a stream over the tile, into shared memory (u32 float bits).
template <class Cfg, class S>
__device__ void block2d_amax(const float* src, u32* out) {
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, P = TC + 1;
  constexpr int BR = S::kBlockRows, BC = S::kBlockCols, NB = (TR / BR) * (TC / BC);
  for (int i = threadIdx.x; i < NB; i += Cfg::kThreads) out[i] = 0;
  __syncthreads();
  // Each thread reduces 8 consecutive elements of one row before one shared atomic.
  constexpr int V = BC % 8 == 0 ? 8 : 1;
  for (int i = threadIdx.x; i < TR * TC / V; i += Cfg::kThreads) {
    const int r = i / (TC / V), c = (i % (TC / V)) * V;
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < V; ++e) m = amax_step(m, src[r * P + c + e]);
    atomicMax(&out[(r / BR) * (TC / BC) + c / BC], f32_bits(m));
  }
}

// Casts one stream of the tile.
template <class Cfg, class S>
__device__ void cast_stream(const QuantizeArgs& a, const Member& mem, i64 col0, const float* tile,
                            const float* rtile, const u32* bamax, i64 scale_base) {
  using F = typename S::Format;
  using W = Walk<Cfg, S>;
  constexpr int P = Cfg::kTileCols + 1, E = S::kEpt;
  const float* src = S::kRht ? rtile : tile;
  const StreamArgs& out = a.streams[S::kIndex];
  const i64 row0 = mem.tile_row * Cfg::kTileRows;
  const i64 data_cols = S::kTransposed ? mem.rows : a.k;  // row length of the data layout
  const i64 data_base = mem.row_base * a.k;               // member offset, elements

  float tensor_amax = 0.0f, delayed_scale = 1.0f;
  if constexpr (S::kTensorAmax >= 0 && S::kMode != kModeTensorDelayed)
    tensor_amax = a.amax[S::kTensorAmax][mem.index];
  if constexpr (S::kMode == kModeTensorDelayed) delayed_scale = *out.scale_in;
  float reported = 0.0f;  // delayed scaling: this tensor's amax

  i64 grid_rows, grid_cols, grid_prows, grid_pcols;
  scale_grid<S>(S::kTransposed ? a.k : mem.rows, data_cols, grid_rows, grid_cols, grid_prows, grid_pcols);

  constexpr int kIters = (W::kRuns + Cfg::kThreads - 1) / Cfg::kThreads;
  for (int it = 0; it < kIters; ++it) {
    const int j = it * Cfg::kThreads + threadIdx.x;
    const bool run_ok = j < W::kRuns;
    int r = 0, c = 0;
    if (run_ok) W::run_origin(j, r, c);

    float v[E];
    bool ok[E];
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      int er, ec;
      W::elem(r, c, e, er, ec);
      ok[e] = run_ok && row0 + er < mem.rows && col0 + ec < a.k;
      v[e] = ok[e] ? src[er * P + ec] : 0.0f;
      amax = amax_step(amax, v[e]);
    }
    if constexpr (S::kMode == kModeTensorDelayed) reported = fmaxf(reported, amax);

    // The amax of this run's scale block.
    float block_amax = amax;
    if constexpr (S::kBlock2d) {
      block_amax = f32_from_bits(bamax[(r / S::kBlockRows) * (Cfg::kTileCols / S::kBlockCols) + c / S::kBlockCols]);
    } else if constexpr (S::kMode == kModeChannel) {
      const i64 ch = S::kDir == 0 ? mem.row_base + row0 + r : i64(mem.index) * a.k + col0 + c;
      block_amax = run_ok ? a.amax[S::kLocalAmax][ch] : 0.0f;
    } else if constexpr (S::kGroup > 1) {
      block_amax = group_max<S::kGroup>(amax);
    }

    float mul;
    u32 entry;
    block_scale<Cfg, S>(block_amax, tensor_amax, delayed_scale, mul, entry);

    // Data-layout coordinates of the run's first element.
    const i64 rl = row0 + r, cg = col0 + c;
    const i64 dr = S::kTransposed ? cg : rl, dc = S::kTransposed ? rl : cg;
    if (!run_ok || !ok[0]) continue;

    if constexpr (S::kMode != kModeNone) {
      const bool starts_entry = (S::kEntryRows ? dr % S::kEntryRows == 0 : dr == 0) &&
                                (S::kEntryCols ? dc % S::kEntryCols == 0 : dc == 0);
      if (starts_entry) {
        const i64 er = S::kEntryRows ? dr / S::kEntryRows : 0, ec = S::kEntryCols ? dc / S::kEntryCols : 0;
        const i64 off = S::kSwizzled ? i64(swizzled_scale_offset(u64(er), u64(ec), u64(grid_pcols)))
                                     : er * grid_pcols + ec;
        store_entry<S>(out.scale_inv, scale_base + off, entry);
      }
    }

    // Encode and store the run's elements.
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if (!ok[e]) continue;
      int er, ec;
      W::elem(r, c, e, er, ec);
      const i64 erl = row0 + er, ecg = col0 + ec;
      const i64 idx = S::kTransposed ? ecg * data_cols + erl : erl * a.k + ecg;
      if constexpr (is_identity<F>::value) {
        if constexpr (F::kDtype == 0) static_cast<float*>(out.data)[data_base + idx] = v[e];
        else if constexpr (F::kDtype == 1) static_cast<u16*>(out.data)[data_base + idx] = f32_to_bf16(v[e]);
        else static_cast<u16*>(out.data)[data_base + idx] = f32_to_f16(v[e]);
      } else {
        const float x = v[e] * mul;
        u32 q;
        if constexpr (S::kStochastic)
          q = encode_sr<F>(x, sr_random_bits(a.seed, a.offset, u32(S::kDir), u64(data_base + idx)));
        else
          q = encode_rn<F>(x);
        if constexpr (F::kBits == 4) {
          // Two elements per byte; runs start at even indices and have even length, so the
          // pair (low nibble = even element) is completed by this thread.
          if ((idx & 1) == 0) {
            u32 hi = 0;
            if (e + 1 < E && ok[e + 1]) {
              const float x1 = v[e + 1] * mul;
              if constexpr (S::kStochastic)
                hi = encode_sr<F>(x1, sr_random_bits(a.seed, a.offset, u32(S::kDir), u64(data_base + idx + 1)));
              else
                hi = encode_rn<F>(x1);
            }
            static_cast<u8*>(out.data)[(data_base + idx) >> 1] = u8((q & 0xF) | (hi << 4));
          }
        } else {
          static_cast<u8*>(out.data)[data_base + idx] = u8(q);
        }
      }
    }
  }
  if constexpr (S::kMode == kModeTensorDelayed) {
    reported = warp_max(reported);
    if ((threadIdx.x & 31) == 0) atomic_max_nonneg(a.amax[S::kTensorAmax] + mem.index, reported);
  }
}

// Grouped launches get one extra tile row; its first CTA writes the per-tensor scale entry of
// every empty member (no tile of theirs exists): the scale an all-zero tensor gets.
template <class Cfg, class... S>
__device__ void fill_empty_members(const QuantizeArgs& a) {
  if (threadIdx.x != 0) return;
  i64 bases[kMaxStreams] = {};
  for (int g = 0; g < a.num_members; ++g) {
    const i64 mg = a.member_rows[g + 1] - a.member_rows[g];
    int s = 0;
    (
        [&] {
          if constexpr (S::kMode == kModeTensorCurrent || S::kMode == kModeTensorDelayed) {
            if (mg == 0) {
              float mul;
              u32 entry;
              const float scale_in = S::kMode == kModeTensorDelayed ? *a.streams[S::kIndex].scale_in : 1.0f;
              block_scale<Cfg, S>(0.0f, 0.0f, scale_in, mul, entry);
              store_entry<S>(a.streams[S::kIndex].scale_inv, bases[s], entry);
            }
          }
          bases[s] += scale_grid_size<S>(mg, a.k);
          ++s;
        }(),
        ...);
  }
}

}  // namespace detail

template <class Cfg, class... S>
__global__ void __launch_bounds__(Cfg::kThreads) cast_kernel(const QuantizeArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  if (a.member_rows && blockIdx.x == gridDim.x - 1) {
    if (blockIdx.y == 0) detail::fill_empty_members<Cfg, S...>(a);
    return;
  }
  detail::Member mem;
  i64 scale_base[kMaxStreams];
  if (!detail::resolve_member<Cfg, S...>(a, mem, scale_base)) return;
  const i64 col0 = i64(blockIdx.y) * Cfg::kTileCols;

  extern __shared__ float smem[];
  constexpr int kTileFloats = Cfg::kTileRows * (Cfg::kTileCols + 1);
  float* tile = smem;
  float* rtile = Cfg::kRht ? smem + kTileFloats : smem;
  u32* bamax = reinterpret_cast<u32*>(smem + kTileFloats * (Cfg::kRht ? 2 : 1));
  detail::load_tile<Cfg>(a, mem, col0, tile, rtile);

  // 2D block amaxes first (one region per stream that has them), then each stream.
  u32* region = bamax;
  u32* regions[sizeof...(S)];
  int s = 0;
  ((regions[s] = region,
    S::kBlock2d ? (detail::block2d_amax<Cfg, S>(S::kRht ? rtile : tile, region),
                   region += (Cfg::kTileRows / S::kBlockRows) * (Cfg::kTileCols / S::kBlockCols), 0)
                : 0,
    ++s),
   ...);
  __syncthreads();
  s = 0;
  ((detail::cast_stream<Cfg, S>(a, mem, col0, tile, rtile, regions[s], scale_base[s]), ++s), ...);
}

template <class Cfg, class... A>
__global__ void __launch_bounds__(Cfg::kThreads) amax_kernel(const QuantizeArgs a) {
  if (a.noop && *a.noop == 1.0f) return;
  detail::Member mem;
  i64 unused[kMaxStreams];
  if (!detail::resolve_member<Cfg>(a, mem, unused)) return;
  const i64 col0 = i64(blockIdx.y) * Cfg::kTileCols;
  extern __shared__ float smem[];
  constexpr int TR = Cfg::kTileRows, TC = Cfg::kTileCols, P = TC + 1;
  constexpr int kTileFloats = TR * P;
  float* tile = smem;
  float* rtile = Cfg::kRht ? smem + kTileFloats : smem;
  detail::load_tile<Cfg>(a, mem, col0, tile, rtile);
  const i64 row0 = mem.tile_row * TR;

  (
      [&] {
        const float* src = A::kRht ? rtile : tile;
        if constexpr (A::kScope == kScopeTensor) {
          float m = 0.0f;
          for (int i = threadIdx.x; i < TR * TC; i += Cfg::kThreads) m = amax_step(m, src[(i / TC) * P + i % TC]);
          m = detail::warp_max(m);
          if ((threadIdx.x & 31) == 0) detail::atomic_max_nonneg(a.amax[A::kSlot] + mem.index, m);
        } else if constexpr (A::kScope == kScopeChannelRows) {
          for (int r = threadIdx.x; r < TR; r += Cfg::kThreads) {
            if (row0 + r >= mem.rows) continue;
            float m = 0.0f;
            for (int c = 0; c < TC; ++c) m = amax_step(m, src[r * P + c]);
            detail::atomic_max_nonneg(a.amax[A::kSlot] + mem.row_base + row0 + r, m);
          }
        } else {
          for (int c = threadIdx.x; c < TC; c += Cfg::kThreads) {
            if (col0 + c >= a.k) continue;
            float m = 0.0f;
            for (int r = 0; r < TR; ++r) m = amax_step(m, src[r * P + c]);
            detail::atomic_max_nonneg(a.amax[A::kSlot] + i64(mem.index) * a.k + col0 + c, m);
          }
        }
      }(),
      ...);
}

#endif  // __CUDACC__

}  // namespace qf
