// Scale rules of a quantize stream: the values that do not change over a tile (StreamCtx), the
// scale of one block (block_scale: the element multiplier and the stored entry, per scaling
// mode), and the scale entries' stores: one at a time into the stream's grid layout (compact,
// mn_major, swizzled; compact fp32 entries kept in L2), byte entries staged and copied out a
// row at a time, the per-tensor entry, and the entries of a grouped launch's empty members.
#pragma once
#include "qforge/args.cuh"
#include "qforge/cast_encode.cuh"
#include "qforge/cast_schedule.cuh"
#include "qforge/cast_smem.cuh"
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

namespace qf {
namespace detail {

// Per-stream values that do not change over the tile.
template <class S>
struct StreamCtx {
  float tensor_amax = 0.0f, delayed_scale = 1.0f;
  float nvfp4_k = 0.0f, nvfp4_s_dec = 0.0f;  // NVFP4: S_enc / 6 and S_dec of the tensor amax
  i64 grid_rows = 0, grid_prows = 0, grid_pcols = 0;  // the member's scale grid, padded (scale_grid)
};

template <class Cfg, class S>
__device__ __forceinline__ StreamCtx<S> stream_ctx(const QuantizeArgs& a, const Member& mem) {
  StreamCtx<S> c;
  if constexpr (S::kTensorAmax >= 0 && S::kMode != kModeTensorDelayed) c.tensor_amax = a.amax[S::kTensorAmax][mem.index];
  if constexpr (S::kMode == kModeTensorDelayed) c.delayed_scale = *a.streams[S::kIndex].scale_in;
  if constexpr (S::kMode == kModeNvfp4) {
    const float s_enc = nvfp4_global_encode_scale(c.tensor_amax);
    c.nvfp4_k = s_enc / E2M1::kMaxFinite;
    c.nvfp4_s_dec = nvfp4_global_decode_scale(s_enc);
  }
  i64 gc;
  scale_grid<S>(S::kTransposed ? a.k : mem.rows, S::kTransposed ? mem.rows : a.k, c.grid_rows, gc, c.grid_prows, c.grid_pcols);
  return c;
}

// The scale of one block: the element multiplier and the stored scale entry (fp32 bits or a
// byte), from the amaxes the mode depends on.
template <class Cfg, class S>
__device__ __forceinline__ void block_scale(float block_amax, const StreamCtx<S>& ctx, float& mul, u32& entry) {
  const float tensor_amax = ctx.tensor_amax, delayed_scale = ctx.delayed_scale;
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
    if constexpr (F::kIsInt) {  // torchao's int8 rule
      const float scale = int8_channel_scale(block_amax, Cfg::kInDtype);
      mul = int8_channel_multiplier(scale);
      entry = f32_bits(scale);
    } else {  // fp8: current scaling's rule per channel
      const float scale = compute_scale(block_amax, F::kMaxFinite, S::kEpsilon, S::kPow2, kFltMax);
      mul = scale;
      entry = f32_bits(1.0f / scale);
    }
  } else if constexpr (S::kMode == kModeMx) {
    const u8 e = S::kMxFloor ? e8m0_floor(block_amax, F::kEmax)
                             : e8m0_rceil(block_amax * (1.0f / F::kMaxFinite));
    mul = mx_multiplier(e);
    entry = e;
  } else if constexpr (S::kMode == kModeNvfp4) {
    // nvfp4_block_scale / nvfp4_element_multiplier (numerics.cuh) with the hardware e4m3
    // conversions (bit-identical: enc_rn is checked exhaustively, the decode is exact). The
    // product is never NaN (block amaxes are maxima of |x| from +0, NaN skipped, so in [0, Inf];
    // nvfp4_k is finite and nonzero), so enc_rn's NaN fix-up is left out (e4m3_code_not_nan).
    const u16 sb = e4m3_code_not_nan(block_amax * ctx.nvfp4_k);
    mul = fminf(1.0f / (e4m3_value16(sb) * ctx.nvfp4_s_dec), kFltMax);
    entry = sb;
  } else {
    mul = 1.0f;
    entry = 0;
  }
}

// MX and NVFP4 scale entries are bytes (e8m0, e4m3); the others fp32 bits.
template <class S>
constexpr bool kByteEntries = S::kMode == kModeMx || S::kMode == kModeNvfp4;

template <class S>
__device__ __forceinline__ void store_entry(void* base, i64 off, u32 entry) {
  if constexpr (kByteEntries<S>)
    static_cast<u8*>(base)[off] = u8(entry);
  else
    static_cast<u32*>(base)[off] = entry;
}

// A compact grid of block scales (fp32 entries: `block` scaling) gets 4 bytes per data row from
// each tile, so a row's 32-byte sector of entries is completed by 8 CTAs, which the column-fastest
// tile order runs together. Those partial sectors are stored at L2 priority evict_last, so that
// the input and outputs streaming through L2 do not evict them before they are complete (the
// likely mechanism; H100, 1x128 blockwise row + transposed at 16384^2: 410-412 us with normal
// stores, 393-397 with these, 383 with no entries at all; docs/quantize.md, "Scattered rowwise scale
// entries kept in L2"). Byte entries (MX, NVFP4) keep
// normal stores: there the hint measured 0.5 % faster (MXFP8) to 1 % slower (NVFP4, the hybrid);
// so do per-channel entries (whole sectors already; the asm's ordering made their kernels spill
// more). A line keeps the priority until its next access at another priority (the GEMM's loads of
// the grid) or until other evict_last lines evict it.
__device__ __forceinline__ u64 l2_evict_last_policy() {
  u64 policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void store_kept(u32* p, u32 v) {
  asm volatile("st.global.L2::cache_hint.b32 [%0], %1, %2;" ::"l"(p), "r"(v), "l"(l2_evict_last_policy()) : "memory");
}

// Writes the scale entry of the block whose first element is at data-layout (dr, dc), if that
// element starts an entry.
template <class S>
__device__ __forceinline__ void maybe_store_entry(const StreamArgs& out, i64 dr, i64 dc, const StreamCtx<S>& ctx,
                                                  i64 scale_base, u32 entry) {
  if constexpr (S::kMode != kModeNone && (S::kEntryRows != 0 || S::kEntryCols != 0)) {
    // dr, dc >= 0: unsigned division (shifts and masks for the power-of-two entries).
    const u64 ur = u64(dr), uc = u64(dc);
    const bool starts = (S::kEntryRows ? ur % u64(S::kEntryRows) == 0 : ur == 0) &&
                        (S::kEntryCols ? uc % u64(S::kEntryCols) == 0 : uc == 0);
    if (starts) {
      const i64 er = S::kEntryRows ? i64(ur / u64(S::kEntryRows)) : 0, ec = S::kEntryCols ? i64(uc / u64(S::kEntryCols)) : 0;
      const i64 off = S::kSwizzled  ? i64(swizzled_scale_offset(u64(er), u64(ec), u64(ctx.grid_pcols)))
                      : S::kMnMajor ? i64(mn_major_scale_offset(u64(er), u64(ec), u64(ctx.grid_prows)))
                                    : er * ctx.grid_pcols + ec;
      if constexpr (S::kMode == kModeBlock && !S::kMnMajor)
        store_kept(static_cast<u32*>(out.scale_inv) + scale_base + off, entry);
      else
        store_entry<S>(out.scale_inv, scale_base + off, entry);
      // mn_major: the last row's writer zeroes the padding after it (up to 3 entries per column).
      // (Unrolled: a loop to grid_prows made the rowwise-only cast spill.)
      if constexpr (S::kMnMajor)
        if (er + 1 == ctx.grid_rows) {
          const int pad = int(ctx.grid_prows - ctx.grid_rows);
#pragma unroll
          for (int p = 1; p <= 3; ++p)
            if (p <= pad) store_entry<S>(out.scale_inv, scale_base + off + p, 0u);
        }
    }
  }
}

// Byte scale entries (MX, NVFP4) in the compact or mn_major layout: staged in shared memory and
// copied out with lanes on consecutive entries: compact, a tile's entries of one data row are
// consecutive bytes (a store request per row instead of one per entry); mn_major (MX), those of
// one block column are (copy_entries_mn_major).
template <class S>
constexpr bool kStagedEntries = kByteEntries<S> && !S::kSwizzled;

// Copies rows x per_row staged entry bytes (src 4-byte aligned) to rows `pitch` bytes apart
// (every thread calls it, after a barrier that follows the last staging write): a thread per
// 4 or 2 bytes of a row where the rows allow it (the common case: a tile's row of MX entries is
// 4 bytes, its transposed column 2 or 4), else a thread per byte.
template <int W>
struct EntryUnit {
  using type = u8;
};
template <>
struct EntryUnit<2> {
  using type = u16;
};
template <>
struct EntryUnit<4> {
  using type = u32;
};
template <int T, int W>
__device__ __forceinline__ void copy_entry_units(u8* dst, i64 pitch, const u8* src, int rows, int per_row) {
  using U = typename EntryUnit<W>::type;
  const int units = per_row / W;
  for (int j = threadIdx.x; j < rows * units; j += T)
    reinterpret_cast<U*>(dst + (j / units) * pitch)[j % units] = reinterpret_cast<const U*>(src)[j];
}
template <int T>
__device__ __forceinline__ void copy_entries(u8* dst, i64 pitch, const u8* src, int rows, int per_row) {
  const u64 align = reinterpret_cast<u64>(dst) | u64(pitch);
  if (per_row % 4 == 0 && align % 4 == 0) copy_entry_units<T, 4>(dst, pitch, src, rows, per_row);
  else if (per_row % 2 == 0 && align % 2 == 0) copy_entry_units<T, 2>(dst, pitch, src, rows, per_row);
  else copy_entry_units<T, 1>(dst, pitch, src, rows, per_row);
}

// The same staged entries (src [rows][per_row]) into an mn_major grid: entry column b of the tile is
// a run of `rows` consecutive bytes at dst + b * pitch (pitch: the grid's padded rows). A thread per
// 4 rows of a run where dst and pitch allow (the interior tiles' rows start at a multiple of the
// tile's, and mn_major grids pad their rows to 4), else a thread per byte. Against the compact
// layout's run of per_row bytes per row, this writes whole 32-byte sectors: `mxfp8_hopper`'s row +
// transposed cast 455.7 -> 395.5 us at 16384^2 on an H100 (docs/quantize.md).
template <int T>
__device__ __forceinline__ void copy_entries_mn_major(u8* dst, i64 pitch, const u8* src, int rows, int per_row) {
  if ((rows & 3) == 0 && ((reinterpret_cast<u64>(dst) | u64(pitch)) & 3) == 0) {
    const int quads = rows / 4;
    for (int j = threadIdx.x; j < per_row * quads; j += T) {
      const int b = j / quads, q = j - b * quads;
      const u8* e = src + 4 * q * per_row + b;
      *reinterpret_cast<u32*>(dst + b * pitch + 4 * q) =
          u32(e[0]) | u32(e[per_row]) << 8 | u32(e[2 * per_row]) << 16 | u32(e[3 * per_row]) << 24;
    }
  } else {
    for (int j = threadIdx.x; j < per_row * rows; j += T) {
      const int b = j / rows, r = j - b * rows;
      dst[b * pitch + r] = src[r * per_row + b];
    }
  }
}

// Copies a tile's staged byte entries, rows x per_row ([rows][per_row], src 4-byte aligned), whose
// first is entry (er, ec) of the stream's grid, into that grid in the stream's layout.
template <class S, int T>
__device__ __forceinline__ void copy_staged_entries(void* scale_inv, i64 scale_base, const StreamCtx<S>& ctx, i64 er,
                                                    i64 ec, const u8* src, int rows, int per_row) {
  u8* grid = static_cast<u8*>(scale_inv) + scale_base;
  if constexpr (S::kMnMajor)
    copy_entries_mn_major<T>(grid + ec * ctx.grid_prows + er, ctx.grid_prows, src, rows, per_row);
  else
    copy_entries<T>(grid + er * ctx.grid_pcols + ec, ctx.grid_pcols, src, rows, per_row);
}

// A per-tensor scale is one entry, written by the member's first tile.
template <class Cfg, class S>
__device__ __forceinline__ void store_tensor_entry(const QuantizeArgs& a, const Member& mem, i64 col0, i64 scale_base) {
  if constexpr (S::kMode != kModeNone && S::kEntryRows == 0 && S::kEntryCols == 0) {
    if (mem.tile_row == 0 && col0 == 0 && threadIdx.x == 0) {
      const StreamCtx<S> ctx = stream_ctx<Cfg, S>(a, mem);
      float mul;
      u32 entry;
      block_scale<Cfg, S>(0.0f, ctx, mul, entry);
      store_entry<S>(a.streams[S::kIndex].scale_inv, scale_base, entry);
    }
  }
}

// Grouped launches get one extra tile row, whose CTAs write every scale entry of the empty
// members (no tile of theirs exists): the scale of an all-zero block. That is the per-tensor
// entry, and the per-channel entries of a columnwise stream (one per column, either layout); block grids of an
// empty member have no entries. The entries are spread over every thread of the row.
template <class Cfg, class... S>
__device__ void fill_empty_members(const QuantizeArgs& a, i64 cta) {
  const i64 first = cta * Cfg::kThreads + threadIdx.x, stride = i64(gridDim.y) * Cfg::kThreads;
  i64 bases[kMaxStreams] = {};
  for (int g = 0; g < a.num_members; ++g) {
    const i64 mg = a.member_rows[g + 1] - a.member_rows[g];
    int s = 0;
    (
        [&] {
          if (mg == 0) {
            StreamCtx<S> ctx;
            if constexpr (S::kMode == kModeTensorDelayed) ctx.delayed_scale = *a.streams[S::kIndex].scale_in;
            float mul;
            u32 entry;
            block_scale<Cfg, S>(0.0f, ctx, mul, entry);
            const i64 n = scale_grid_size<S>(0, a.k);
            for (i64 e = first; e < n; e += stride) store_entry<S>(a.streams[S::kIndex].scale_inv, bases[s] + e, entry);
          }
          bases[s] += scale_grid_size<S>(mg, a.k);
          ++s;
        }(),
        ...);
  }
}

}  // namespace detail
}  // namespace qf
