// CPU reference of the grouped fp8 GEMM (runtime/gemm.h, templates/qforge/gemm.cuh), in
// float64 from the dequantized operands:
//
//   value[r, n]     = alpha[g] * sum_k deq_a(r, k) * deq_b(g, n, k)
//   magnitude[r, n] = |alpha[g]| * sum_k |deq_a(r, k) * deq_b(g, n, k)|
//
// where g is the group holding row r and deq_x = decode(x) * scale(x) per the spec's scaling
// (every fp8 value times an fp32 scale is exact in float64, so `value` is exact up to the final
// sum's float64 rounding; nvfp4: e2m1 * e4m3 block scale * the global decode scale of the
// group's amax, computed as the quantize kernels do). With accumulation the kernel adds `value` to the fp32 output it finds.
//
// Error bound of the GPU result (gemm_tolerance): |got - value| <= out_rel * |value| +
// acc_rel * magnitude, where out_rel covers the output rounding (bf16 RNE; fp32 epilogue
// multiplies) and acc_rel the tensor cores' reduced-precision addition of the fp8 products
// within one k-block of 128 (promoted) or over all of K (fast accumulation). Inputs whose every
// partial sum is exactly representable (small integers, power-of-two scales) must match
// exactly: exact_output() gives those bits.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "compiler/gemm_codegen.h"

namespace qf::ref {

struct GemmOperands {
  std::span<const uint8_t> a;          // fp8 [m_total, K] (nvfp4: packed e2m1 [m_total, K/2], element 2i low)
  std::span<const uint8_t> b;          // fp8 [G, N, K] (nvfp4: [G, N, K/2])
  std::span<const uint8_t> a_scale;    // raw bytes in the kernel's layout: fp32 or e8m0 elements
  std::span<const uint8_t> b_scale;    // per scaling (runtime/gemm.h gemm_scale_elems)
  std::span<const float> alpha;        // empty: 1 for every group
  std::span<const int64_t> offsets;    // contiguous layout: [G + 1]
  std::span<const int64_t> counts;     // masked layout (m_max > 0): [G]
  int64_t m_max = 0;
  int64_t m_total = 0;
  int64_t k_total = 0;                 // K-grouped: A [m, k_total], B [N, k_total], offsets split K
  std::span<const float> a_amax{};     // nvfp4: [G] per-tensor amax of each group's A (global decode scale)
  std::span<const float> b_amax{};     // nvfp4: [G] amax of each B[g]
};

struct GemmRows {
  std::vector<int64_t> rows;      // the requested rows
  std::vector<int> group;         // per row: its group, -1 when no group holds it
  std::vector<double> value;      // [rows, N]
  std::vector<double> magnitude;  // [rows, N]
};

// The group of every row as the kernel assigns them: offsets clamped to [0, m_total], group g
// owns [offsets[g], max(offsets[g], offsets[g+1])); -1 for rows no group owns.
std::vector<int> row_groups(std::span<const int64_t> offsets, int64_t m_total);
// Masked layout: group g owns rows [g * m_max, g * m_max + clamp(counts[g], 0, m_max)).
std::vector<int> masked_row_groups(std::span<const int64_t> counts, int64_t m_max);

// Reference values of the given rows (all N columns), computed on `threads` threads (0: all
// hardware threads). K-grouped: rows of D [G * m, N] (row g * m + r of group g).
GemmRows gemm_reference(const GemmSpec& spec, const GemmOperands& ops, std::span<const int64_t> rows,
                        int threads = 0);

struct GemmTolerance {
  double out_rel;  // times |value|
  double acc_rel;  // times magnitude
};
GemmTolerance gemm_tolerance(const GemmSpec& spec);

// The output element the kernel must produce when every partial sum is exact: value (plus the
// previous fp32 output with accumulation) rounded once to the output dtype, as raw bits
// (fp32 bits, or bf16 bits in the low 16).
uint32_t exact_output(const GemmSpec& spec, double value, float previous);

}  // namespace qf::ref
