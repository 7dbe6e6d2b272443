// Dequantize one output stream of a quantize call back to fp32 / bf16 / fp16 (docs/numerics.md,
// "Dequantize"): every element of the stream's data, in the data's own layout ([M, K], or [K, M]
// for transposed copies), times the scale entry that covers it:
//   fp32 scale entries (per-tensor, per-channel, block):  v = decode(q) * scale_inv
//   e8m0 entries (MX):                                    v = decode(q) * 2^(E - 127)   (E = 255: NaN)
//   e4m3 entries (NVFP4):                                 v = (decode(q) * decode(s)) * S_dec,
//                                                         S_dec = (float)(1 / (double)S_enc(amax))
//   identity copies:                                      v = the stored bf16 / fp16 / fp32 value
// each product an fp32 multiply rounded to nearest even (decode(q) * decode(s) is exact), then
// one conversion to the output dtype (RNE). The scale entry's place in its buffer comes from the
// grid's run-time geometry (compiler/buffers.h ScaleGrid), so one kernel per (format, scale
// storage, output dtype) serves every block shape and scale layout. Values in the Hadamard domain
// (RHT copies) stay there: the GEMM reads them that way.
//
// Cfg (generated): Format (numerics.cuh trait, or void for identity), kScale (DequantScale),
// kIdentityIn (identity: 0 fp32, 1 bf16, 2 fp16), kOut (0 fp32, 1 bf16, 2 fp16), kThreads.
#pragma once
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

namespace qf {

enum DequantScale : int { kDqNone = 0, kDqF32 = 1, kDqE8M0 = 2, kDqE4M3 = 3 };

struct DequantizeArgs {
  const u8* data;       // [rows, cols] elements (packed e2m1: [rows, cols / 2] bytes, element 2i low nibble)
  const u8* scale;      // the stream's scale_inv buffer (fp32, e8m0 or e4m3 entries); null for identity
  const float* amax;    // NVFP4: the stream's per-tensor amax (the global decode scale's source)
  void* out;            // [rows, cols] in the output dtype
  i64 rows, cols;       // the data layout's extent in elements
  i64 block_rows, block_cols;       // data elements one scale entry covers (>= 1)
  i64 grid_padded_rows, grid_padded_cols;
  i32 swizzled, mn_major;           // the grid's storage order (compiler/buffers.h ScaleGrid::offset)
  i32 transposed_out;               // 1: out is [cols, rows], element (r, c) at c * rows + r (the GEMMs'
                                    // operand orientation of a copy kept in the input's own layout)
  // NVFP4, optional: the values leave S_dec out, decode(q) * decode(s) (exact: at most 6 significant
  // bits, 2^-10 .. 2688, which bf16 holds), and one thread writes S_dec to s_dec_out instead, times
  // *s_dec_in where given (in double, rounded once): the factor a GEMM on the copy takes as its alpha.
  float* s_dec_out;
  const float* s_dec_in;
};

QF_HD u64 dequant_scale_offset(const DequantizeArgs& a, u64 r, u64 c) {
  const u64 gr = r / u64(a.block_rows), gc = c / u64(a.block_cols);
  if (a.swizzled) return swizzled_scale_offset(gr, gc, u64(a.grid_padded_cols));
  if (a.mn_major) return mn_major_scale_offset(gr, gc, u64(a.grid_padded_rows));
  return gr * u64(a.grid_padded_cols) + gc;
}

// One element's value in fp32, before the NaN rule (reference/dequantize.cpp restates it).
template <class Cfg>
QF_HD float dequant_value(const DequantizeArgs& a, u64 r, u64 c, float s_dec) {
  const u64 i = r * u64(a.cols) + c;
  if constexpr (Cfg::kScale == kDqNone) {
    if constexpr (Cfg::kIdentityIn == 0) return reinterpret_cast<const float*>(a.data)[i];
    else if constexpr (Cfg::kIdentityIn == 1) return bf16_to_f32(reinterpret_cast<const u16*>(a.data)[i]);
    else return f16_to_f32(reinterpret_cast<const u16*>(a.data)[i]);
  } else {
    using F = typename Cfg::Format;
    u8 bits;
    if constexpr (F::kBits == 4) bits = u8((a.data[i / 2] >> ((i & 1) * 4)) & 0xF);
    else bits = a.data[i];
    const float q = decode<F>(bits);
    const u64 off = dequant_scale_offset(a, r, c);
    if constexpr (Cfg::kScale == kDqF32) {
      return q * reinterpret_cast<const float*>(a.scale)[off];
    } else if constexpr (Cfg::kScale == kDqE8M0) {
      const u8 e = a.scale[off];
      return e == 0xFF ? f32_quiet_nan() : q * exp2i(int(e) - 127);
    } else {
      return (q * decode<E4M3>(a.scale[off])) * s_dec;
    }
  }
}

// Every NaN comes out as the one quiet NaN 0x7FC00000 (a GPU multiply would give 0x7FFFFFFF, a
// CPU the operand's payload: the rule makes both the same bits).
template <class Cfg>
QF_HD float dequant_element(const DequantizeArgs& a, u64 r, u64 c, float s_dec) {
  const float v = dequant_value<Cfg>(a, r, c, s_dec);
  return f32_is_nan(v) ? f32_quiet_nan() : v;
}

template <int kOut>
QF_HD void dequant_store(void* out, u64 i, float v) {
  if constexpr (kOut == 0) reinterpret_cast<float*>(out)[i] = v;
  else if constexpr (kOut == 1) reinterpret_cast<u16*>(out)[i] = f32_to_bf16(v);
  else reinterpret_cast<u16*>(out)[i] = f32_to_f16(v);
}

template <class Cfg>
QF_HD float dequant_global_decode(const DequantizeArgs& a) {
  if constexpr (Cfg::kScale == kDqE4M3) return nvfp4_global_decode_scale(nvfp4_global_encode_scale(*a.amax));
  else return 1.0f;
}

#if defined(__CUDACC__)
// Grid-stride over element pairs of the output (a packed e2m1 byte; two neighbours along a row
// otherwise; transposed_out: two neighbours along an output row, i.e. down a data column), one pair
// per thread and step. The stores stay coalesced either way.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dequantize_kernel(const DequantizeArgs a) {
  float s_dec = dequant_global_decode<Cfg>(a);
  if constexpr (Cfg::kScale == kDqE4M3) {
    if (a.s_dec_out) {  // S_dec goes to the GEMM's alpha; the values keep decode(q) * decode(s)
      if (blockIdx.x == 0 && threadIdx.x == 0)
        *a.s_dec_out = a.s_dec_in ? float(double(*a.s_dec_in) * double(s_dec)) : s_dec;
      s_dec = 1.0f;
    }
  }
  const u64 n = u64(a.rows) * u64(a.cols);
  const u64 stride = u64(gridDim.x) * Cfg::kThreads * 2;
  for (u64 i = (u64(blockIdx.x) * Cfg::kThreads + threadIdx.x) * 2; i < n; i += stride) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const u64 e = i + j;
      if (e >= n) continue;
      const u64 r = a.transposed_out ? e % u64(a.rows) : e / u64(a.cols);
      const u64 c = a.transposed_out ? e / u64(a.rows) : e % u64(a.cols);
      dequant_store<Cfg::kOut>(a.out, e, dequant_element<Cfg>(a, r, c, s_dec));
    }
  }
}
#endif

}  // namespace qf
