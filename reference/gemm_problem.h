// Host-side GEMM problems for tests and the CLI: random fp8 operands and scales in the layouts
// the kernel reads, for given group sizes.
//
//   Values::Random         A, B: fp8 encodings (RNE) of normal samples spread over the format's
//                          range (int8: uniform over [-128, 127]); fp32 scales 2^[-4, 4) * [1, 2), e8m0 scales 2^[-4, 4);
//                          alpha [0.5, 2).
//   Values::SmallIntegers  A, B in {-2, ..., 2}, scales and alpha powers of two, the previous
//                          output (accumulation) small integers: every partial sum, scale product
//                          and epilogue multiply is exact in fp32 (and in the tensor cores'
//                          accumulators) for K <= 512, so the GPU must match exact_output().
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "reference/gemm.h"

namespace qf::ref {

struct GemmProblem {
  std::vector<int64_t> offsets;  // contiguous layout: [G + 1]
  std::vector<int64_t> counts;   // masked layout: [G] (empty when contiguous)
  int64_t m_max = 0;             // masked layout: rows per group slot; 0: contiguous
  int64_t m_total = 0;           // offsets.back() plus any trailing rows outside every group (G * m_max masked)
  int64_t k_total = 0;           // K-grouped: the token dimension (offsets split it); 0 otherwise
  int num_groups() const { return m_max > 0 ? int(counts.size()) : int(offsets.size()) - 1; }
  int64_t out_rows = 0;          // rows of D: m_total, or G * m when K-grouped
  std::vector<uint8_t> a, b;     // [m_total, K], [G, N, K] (nvfp4: packed e2m1, K/2 bytes per row)
  std::vector<uint8_t> a_scale, b_scale;  // raw bytes in the kernel's layout (fp32, e8m0 or e4m3 elements)
  std::vector<float> a_amax, b_amax;      // nvfp4: per-group amax [G] each (empty otherwise)
  std::vector<float> alpha;      // empty unless requested
  std::vector<float> d_init;     // [m_total, N] previous fp32 output, when the spec accumulates
  GemmOperands operands() const;
};

enum class GemmValues { Random, SmallIntegers };

// group_rows[g] rows per group (0 allowed), in order from row 0; `trailing_rows` more rows of A
// and D belong to no group (the kernel must leave them untouched).
GemmProblem make_gemm_problem(const GemmSpec& spec, std::span<const int64_t> group_rows, int64_t trailing_rows,
                              GemmValues values, bool with_alpha, uint64_t seed, int threads = 0);
// K-grouped layouts (KGrouped, KGroupedMembers): group g reduces over tokens[g] tokens (0 allowed)
// of the shared token dimension (members: its own matrices of tokens[g] columns, back to back in
// the same bytes), padded with `pad` unused tokens and up to a multiple of 16 (nvfp4: 32).
GemmProblem make_k_grouped_gemm_problem(const GemmSpec& spec, std::span<const int64_t> tokens, int64_t pad,
                                        GemmValues values, bool with_alpha, uint64_t seed, int threads = 0);
// Masked layout: G = counts.size() slots of m_max rows; counts[g] may exceed m_max (the kernel
// clamps) or be negative (clamped to 0).
GemmProblem make_masked_gemm_problem(const GemmSpec& spec, std::span<const int64_t> counts, int64_t m_max,
                                     GemmValues values, bool with_alpha, uint64_t seed, int threads = 0);

// Random group sizes summing to `total` (each a multiple of `granule`), with `zero_groups` of them
// empty (at least one group is non-empty).
std::vector<int64_t> random_group_rows(int groups, int64_t total, int zero_groups, int64_t granule, uint64_t seed);

}  // namespace qf::ref
