// GEMM spec -> CUDA source of one grouped GEMM kernel (templates/qforge/gemm.cuh).
//
// A spec fixes everything the kernel bakes in: operand formats, how the operands are scaled, N,
// K, the output dtype, accumulation into the output, fp32 promotion, and the tile. Group sizes
// (M per group) are run-time data on the device. The emitted source depends on the spec only.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/formats.h"

namespace qf {

// How the operands are scaled (the one table of these is in gemm_codegen.cpp).
enum class GemmScaling : uint8_t {
  PerTensor,   // fp32 scale per group for A ([G]) and for B ([G])
  RowChannel,  // fp32 scale per row of A ([m_total]) and per row of B[g] ([G, N]); K-grouped: per
               // row of A ([m]) and of B ([N]), members per member ([G, m], [G, N])
  Block128,    // fp32 per 1x128 block of A ([m_total, ceil(K/128)]) and per 128x128 block of B
               // ([G, ceil(N/128), ceil(K/128)]): the quantize kernels' block-scaling layouts
  Mx32,        // MXFP8: e8m0 per 1x32 block of A ([m_total, K/32] bytes) and of B ([G, N, K/32]):
               // the quantize kernels' compact MXFP8 rowwise scale layout (or mn_major: scale_layout)
  Nvfp4,       // NVFP4: e2m1 operands packed two per byte (A [m_total, K/2], B [G, N, K/2]), e4m3 per
               // 1x16 block of A ([m_total, K/16] bytes) and of B ([G, N, K/16]), and the per-tensor
               // amax of each group's A and B (fp32 [G] each): the quantize kernels' NVFP4 layout
  None,        // no scales: bf16 or fp16 operands (the quantize kernels' identity copies), fp32 sums
  Channel,     // bf16 / fp16 A (unscaled activations) x int8 B[g] with an fp32 scale per row of B[g]
               // (per output channel, [G, N]): weight-only int8 (W8A16), B converted on chip; M-grouped
};

// The device side of a scaling kind in one layout: the policy struct (gemm_scaling*.cuh,
// gemm_nvfp4.cuh), its GemmScalingCode constant and that constant's value (an empty policy: the
// layout does not take this scaling).
struct GemmDevicePolicy {
  std::string_view policy;
  std::string_view code;
  int id = -1;
};

struct GemmScalingTraits {
  GemmScaling id;
  std::string_view name;          // as on the command line: "tensor", "rowwise", "blockwise"
  GemmDevicePolicy m_grouped;     // contiguous and masked layouts (fprop, dgrad)
  GemmDevicePolicy k_grouped;     // K-grouped (wgrad): scales per group, or per row along the tokens
  bool promotion_required;        // scales change along K: every k-block is promoted
  int promote_k;                  // K per promotion (0: once per 128 with promotion_required; never for
                                  // nvfp4, whose fp16 MMAs accumulate in fp32, or with fast_accum)
  int scale_k;                    // K (tokens) per scale along K: 128, 32, 16; 0 when the scales do
                                  // not change along K (K-grouped: [G] per group, else per row along the tokens)
  std::string_view scale_type;    // "fp32", "e8m0" or "e4m3"
  int scale_bytes;                // bytes per scale element
  int scale_align;                // scale buffers' base alignment the kernel needs beyond the element's
                                  // own (mxfp8: 4, four e8m0 scales read at once; nvfp4: 16, a row's
                                  // eight bytes of a k-block at once)
  int k_multiple;                 // K must be a multiple of this (16: the TMA row stride)
  std::string_view a_scale_shape; // for messages and --help
  std::string_view b_scale_shape;
  bool fp32_sums;                 // 16-bit MMAs (on dequantized / converted operands, or bf16 / fp16 ones)
                                  // sum in fp32 over all of K: never promoted, no fast_accum
  bool a_scaled, b_scaled;        // the operand carries scales (bf16 / fp16 operands do not)
  bool b_on_chip;                 // B is dequantized / converted on chip by the producer warps, per
                                  // CTA: no multicast, no ordered issue
  bool col_scales;                // the epilogue applies per-column (output channel) factors
  std::string_view a_default, b_default;  // operand formats when none is named (b_default empty: A's)
  bool mn_major_ok;               // reads mn_major 1D scale grids (GemmSpec::scale_layout): blockwise, mxfp8
  bool mn_major_b;                // ... B's too (mxfp8: per expert; blockwise B is a 2-D 128x128 grid, compact)
  std::string_view stream_scaling;  // the quantize scaling whose 1D grids (blocks of scale_k) it reads
                                    // in GemmSpec::scale_layout: "block", "mx" (else empty)
  std::string_view dequant_dtype = {};  // GemmRoute::Dequant: the 16-bit type its operands are
                                        // dequantized into exactly ("bf16", "fp16"; empty: no route)
  bool per_tensor_amax = false;  // a per-tensor amax of each group's A and B too (a_amax, b_amax:
                                 // NVFP4's global decode scales), folded into the epilogue's alpha
  int dequant_crossover = 0;  // GemmRoute::Auto takes the dequant route where h(tokens per group, N)
                              // (M-grouped) or h(M, N) (K-grouped) reaches this, h(x, y) = x y / (x + y):
                              // the weights' (or both operands') copies are paid for by the 16-bit
                              // GEMM's speed-up (choose_gemm_route; measured: docs/gemm.md, "Auto")
  int k_grouped_mn_major_align = 0;  // K-grouped mn_major grids' base alignment beyond the element's
                                     // (blockwise: 16, the producer's bulk copies of the factors)
};
const GemmScalingTraits& traits(GemmScaling s);
std::span<const GemmScalingTraits> all_gemm_scalings();
std::optional<GemmScaling> parse_gemm_scaling(std::string_view name);

// How the groups split the problem.
enum class GemmLayout : uint8_t {
  MGrouped,  // fprop / dgrad: groups own rows of A and D (contiguous offsets or masked slots); B [G, N, K]
  KGrouped,  // wgrad: groups own ranges of the shared K (tokens); A [m, K_total], B [N, K_total], D [G, m, N];
             // tensor, rowwise (per channel: [m] and [N], members [G, m] and [G, N]), blockwise
             // (1x128 blocks along the tokens on both operands), mxfp8 or nvfp4 scaling (1x32 /
             // 1x16 blocks along the tokens), or none (bf16 / fp16); not channel
  KGroupedMembers,  // wgrad on the grouped quantizer's per-member transposed copies: group g's A_g
                    // [m, M_g] and B_g [N, M_g] (M_g = offsets[g+1] - offsets[g]) back to back, each
                    // with its own scale grid [m, ceil(M_g / scale_k)] / [N, ...], likewise back to back
};
std::string_view name(GemmLayout l);
// Both K-grouped layouts (wgrad): D [G, m, N], groups split the tokens.
constexpr bool k_grouped(GemmLayout l) { return l != GemmLayout::MGrouped; }

// How an MXFP8 or NVFP4 GEMM runs. Fused: one kernel dequantizes on chip (MXFP8 promotes every 32
// of K; NVFP4's producers convert B to fp16). Dequant: each operand is dequantized once into a
// 16-bit copy in the call's workspace (bf16 for MXFP8, fp16 for NVFP4; templates/qforge/dequant.cuh),
// then the none GEMM runs on the copies: 1.3-1.6x faster where many tokens meet the weights, for 2
// bytes of workspace per operand element; slower where the weights dominate (docs/gemm.md).
// Auto: per call, whichever of the two choose_gemm_route expects to be faster (the fused kernel
// for every other scaling); a tile, if given, is the fused kernel's. Every layout has both.
enum class GemmRoute : uint8_t { Fused, Dequant, Auto };
std::string_view name(GemmRoute r);
GemmRoute parse_gemm_route(std::string_view name, const std::string& where);

// Tile configuration; a zero field is chosen by resolve_tile().
struct GemmTile {
  int block_m = 0;    // 64 or 128: one consumer warpgroup per 64 rows (128 for nvfp4)
  int block_n = 0;    // 64, 128, 192 or 256 (<= 128 with promotion; 64/128 for blockwise and mxfp8;
                      // 128 for nvfp4);
                      // default 128, or 256 without promotion when N >= 512
  int stages = 0;     // pipeline depth (as many as fit in shared memory, at most 8)
  int multicast = 0;  // 1 (default), or 2: clusters of two CTAs share the A tile (needs an even
                      // n-block count; correct, but measured slower so far: docs/gemm.md)
  int raster_m = 0;   // m-blocks per scheduling band (L2 reuse); default 16, 4 for blockwise
  int ordered = 0;    // 1 off, 2 on: the two consumer warpgroups issue their MMAs in turn, so one
                      // promotes while the other's MMAs run (0: on with promotion and 2 groups)
  bool operator==(const GemmTile&) const = default;
};

struct GemmSpec {
  ElemFormat a_format = ElemFormat::E4M3;  // e4m3 or e5m2 (nvfp4 scaling: e2m1), or int8 with an int8 B
                                           // (tensor, rowwise or blockwise scaling), or identity
                                           // (operand_dtype elements) with an identity B (none scaling)
                                           // or an int8 B (channel scaling)
  ElemFormat b_format = ElemFormat::E4M3;
  DType operand_dtype = DType::BF16;  // the elements of identity operands: bf16 or fp16
  GemmScaling scaling = GemmScaling::Block128;
  GemmLayout layout = GemmLayout::MGrouped;
  int64_t m = 0;                // K-grouped: rows of each D[g] (rows of A); M-grouped: 0 (run time)
  int64_t n = 0;                // output columns (rows of each B[g]); multiple of 8
  int64_t k = 0;                // reduction length; multiple of 16 (K-grouped: 0, per group at run time)
  DType out_dtype = DType::BF16;  // bf16 or fp32
  bool accumulate = false;      // D += result (fp32 output only)
  bool fast_accum = false;      // no fp32 promotion: tensor cores accumulate over all of K
                                // (fp8 with per-tensor and rowwise scaling only)
  // Blockwise and MXFP8 1D scale grids: compact (row-major) or mn_major (the quantize kernels'
  // "scale_layout": "mn_major": [blocks, rows padded to 4], coalesced per block). K-grouped: both
  // operands' grids ([rows, token blocks]); M-grouped: A's 1x128 / 1x32 grid, per group as the
  // grouped quantizer writes its members (group g's [ceil(K/128) or K/32, round_up(rows_g, 4)]
  // after those of the groups before; masked: slots of m_max rows); MXFP8 B per expert [K/32, N]
  // (blockwise B's 128x128 grid is compact). Compact for every other scaling.
  ScaleLayout scale_layout = ScaleLayout::Compact;
  GemmRoute route = GemmRoute::Fused;  // mxfp8 and nvfp4, every layout
  GemmTile tile;                       // dequant route: the none GEMM's tile
};

// An operand format by name (the CLI, the C API, recipes): e4m3, e5m2, int8, e2m1, or bf16 / fp16
// (identity: the quantize kernels' high-precision copies); which combinations a scaling takes is
// validate()'s to say. Throws UserError(where, ...) for any other name.
struct GemmOperandFormat {
  ElemFormat format = ElemFormat::E4M3;
  DType dtype = DType::BF16;  // identity: bf16 or fp16
};
GemmOperandFormat parse_gemm_format(std::string_view name, const std::string& where);
// A GEMM's scale layout by name: "compact" or "mn_major" (GemmSpec::scale_layout); UserError(where,
// ...) for any other (the CLI's --scale-layout, the C API's spec->scale_layout).
ScaleLayout parse_gemm_scale_layout(std::string_view name, const std::string& where);
// "m_grouped", "k_grouped" or "k_grouped_members" (name(GemmLayout)); UserError at `where` otherwise.
GemmLayout parse_gemm_layout(std::string_view name, const std::string& where);
// The format of operand A (b_side false) or B that a scaling takes when none is named (the table's
// a_default / b_default: e2m1 for nvfp4, bf16 for none, bf16 x int8 for channel, else e4m3),
// given the format the other operand was named as (other_named, when not empty): an int8 other
// operand makes it int8 (but channel's weights), and with none a bf16 / fp16 other makes it the
// same (one type).
std::string_view default_gemm_format(GemmScaling s, bool b_side, std::string_view other_named = {});
// Puts A's and B's formats into the spec (identity operands set operand_dtype: one dtype for both,
// else UserError(b_where)).
void set_gemm_formats(GemmSpec& s, const GemmOperandFormat& a, const GemmOperandFormat& b, const std::string& b_where);
// An operand format as users name it: "e4m3", ..., "bf16" / "fp16" for identity operands.
std::string_view gemm_format_name(const GemmSpec& s, ElemFormat f);
// Storage bits of one element of an operand in format f: 4 (packed e2m1), 8, or 16 (identity).
int gemm_operand_bits(const GemmSpec& s, ElemFormat f);
// Bytes of a row of k elements of an operand in format f (K-major rows of A and B).
int64_t gemm_row_bytes(const GemmSpec& s, ElemFormat f, int64_t k);

// Whether operand A / B carries scales: bf16 / fp16 operands do not (A with none and channel
// scaling, B with none); their scale arguments must be absent.
bool gemm_a_scaled(const GemmSpec& s);
bool gemm_b_scaled(const GemmSpec& s);

// Whether the kernel promotes partial sums into fp32 accumulators (every k-block, or every 32 of
// K for MX): fp8 unless fast_accum; never for nvfp4 (fp16 MMAs accumulate in fp32); int8 only
// where its scales change along K or an s32 sum over all of K could overflow (K >= 2^17, or
// K-grouped, whose token counts are run-time data): its s32 partial sums are exact.
bool gemm_promotes(const GemmSpec& spec);

// Throws UserError naming the field ("n", "a_format", "tile.block_n", ...) when the spec is
// not supported.
void validate(const GemmSpec& spec);
// The spec's tile with every zero field chosen (and the whole tile checked): stages as many as
// fit in shared memory.
GemmTile resolve_tile(const GemmSpec& spec);

struct GemmSource {
  std::string source;        // the translation unit given to NVRTC
  std::string kernel;        // name expression of the kernel
  uint32_t smem_bytes = 0;   // dynamic shared memory
  int threads = 0;           // block size
  GemmTile tile;             // resolved
};
GemmSource emit_gemm(const GemmSpec& spec);

// Elements of the scale buffers for this spec (see GemmScaling; traits(scaling).scale_bytes each).
// M-grouped: m_total rows of A. K-grouped: k_total tokens; blockwise and mxfp8 scales are per row
// of A [m, k_total] and of B [N, k_total] along the tokens: [m, ceil(k_total/128)] and
// [N, ceil(k_total/128)] fp32, [m, ceil(k_total/32)] and [N, ceil(k_total/32)] e8m0, or
// [m, k_total/16] and [N, k_total/16] e4m3 for nvfp4 (k_total % 32 == 0): the quantize kernels'
// 128x1 / 32x1 / 16x1 columnwise grids of one tensor, transposed. K-grouped members: the grids of
// the members back to back, sized for any split of k_total into num_groups members (each member
// may add a partial block): m * (ceil(k_total / scale_k) + G) and N * (...). K-grouped tensor: [G]
// each; rowwise: [m] and [N] (members: [G, m] and [G, N]). mn_major blockwise / MXFP8 grids (the
// spec's scale_layout) are stored [token blocks, rows padded to a multiple of 4] (mn_major_rows);
// M-grouped, A's per-group grids take up to 3 padding rows per group: [ceil(K/128) or K/32,
// m_total + 3 G]; MXFP8 B's per expert [G, K/32, N].
struct GemmScaleElems {
  int64_t a = 0, b = 0;
};
GemmScaleElems gemm_scale_elems(const GemmSpec& spec, int64_t m_total, int64_t num_groups, int64_t k_total = 0);
// Rows a K-grouped scale grid of `rows` rows takes: rounded up to a multiple of 4 when the spec's
// grids are mn_major (the pitch of one token block's scales), else rows.
int64_t mn_major_rows(const GemmSpec& spec, int64_t rows);
// K-grouped: k_total must be a multiple of this (16-byte TMA row strides of the operands: 16 fp8,
// 32 packed e2m1 or 8 bf16 / fp16 tokens); with members, so must each member's first token and token count (a
// member that is not gets NaN in D[g]: its sizes live on the device).
int64_t gemm_k_total_multiple(const GemmSpec& spec);

// K-grouped members: tensor-map pairs per persistent CTA in the workspace (the kernel's ring, one
// more than its TMA load slots), for a spec whose tile is resolved.
int gemm_member_map_count(const GemmSpec& spec);

// The spec can run either way: mxfp8 or nvfp4 scaling (every layout).
bool gemm_has_dequant_route(const GemmSpec& spec);
// The route a call of num_groups groups over `extent` (m_total; K-grouped: k_total) takes: the
// spec's, or for Auto the dequant route where its copies pay (GemmScalingTraits::dequant_crossover;
// M-grouped by the mean rows per group (masked: m_max), K-grouped by M and N; both with at least
// kGemmAutoMinFlops for the route's fixed cost), else fused. The two routes round differently
// (the fused kernels promote per 32 of K or dequantize on chip; the route sums 16-bit products in
// fp32 over all of K): where the choice flips with the token count, so do the output's low bits.
GemmRoute choose_gemm_route(const GemmSpec& spec, int64_t extent, int64_t num_groups);
inline constexpr double kGemmAutoMinFlops = 0x1p35;  // ~34 GFLOP
// An Auto spec without a dequant route (every scaling but mxfp8 and nvfp4) is the fused kernel's:
// its route becomes Fused (recipes, rt::Gemm).
void settle_gemm_route(GemmSpec& spec);
// The spec of one concrete route (Fused or Dequant) of an Auto spec: the fused one keeps the tile,
// the dequant one runs its none GEMM's default tile.
GemmSpec gemm_route_spec(const GemmSpec& spec, GemmRoute route);

// Every kernel a spec may launch (what prewarm compiles, what a fuzzer emits): the GEMM kernels
// (emit_gemm: the fused kernel, the dequant route's none GEMM) and the dequant routes' operand
// kernels (emit_dequant), for each route the spec can take.
struct GemmKernelSpecs {
  std::vector<GemmSpec> gemm;     // for emit_gemm
  std::vector<GemmSpec> dequant;  // for emit_dequant
};
GemmKernelSpecs gemm_kernel_specs(const GemmSpec& spec);

// The dequant route (GemmRoute::Dequant): the none GEMM of the same problem on the 16-bit copies
// (bf16 for MXFP8, fp16 for NVFP4; the spec's tile, output, accumulation and layout).
GemmSpec dequant_inner_spec(const GemmSpec& spec);
// Its dequantization kernels (templates/qforge/dequant.cuh): one per operand format, and the
// prep kernel (mn_major grid prefix of M-grouped A, NVFP4's per-group alpha).
struct DequantSource {
  std::string source;
  std::string a_kernel, b_kernel, prep_kernel;  // name expressions
  int threads = 0;
};
DequantSource emit_dequant(const GemmSpec& spec);
// The operand format's dequant kernel takes packed two-per-byte elements (e2m1: one thread per
// 16-element block) rather than bytes (fp8: one thread per 8 elements); the kernels' Cfg::kNvfp4.
bool gemm_dequant_packed(ElemFormat f);
// Where a dequant-route call keeps its copies in the workspace (extent: m_total, or k_total for
// the K-grouped layouts): A's copy, B's, the alpha [G] (NVFP4's per-tensor factors; members: and
// NaN for a member the fused kernel cannot load), the grid prefix [G + 1] (M-grouped
// mn_major A; members: their token blocks) and beside it the groups' starts [G + 1] (the running
// maximum of their clamped offsets), and the none GEMM's own workspace of inner_bytes
// (members: its tensor-map ring, rt::Gemm::workspace_bytes() of the inner GEMM, which depends on
// the device), each 256-byte aligned; total is what the call needs.
struct DequantWorkspace {
  int64_t a = 0, b = 0, alpha = -1, prefix = -1, starts = -1, inner = -1;  // byte offsets (-1: not used)
  int64_t total = 0;
};
DequantWorkspace dequant_workspace(const GemmSpec& spec, int64_t extent, int64_t num_groups, int64_t inner_bytes);

// "e4m3 x e4m3 blockwise N=4096 K=7168 -> bf16" (logs, cache metadata).
std::string describe(const GemmSpec& spec);

}  // namespace qf
