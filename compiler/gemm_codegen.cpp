#include "compiler/gemm_codegen.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "compiler/emitter.h"
#include "compiler/error.h"
#include "qforge/gemm.cuh"

namespace qf {
namespace {

constexpr GemmScalingTraits kScalings[] = {
    {GemmScaling::PerTensor, "tensor", {"qf::gemm::PerTensorScaling", "qf::kGemmPerTensor", kGemmPerTensor},
     {"qf::gemm::PerTensorScaling", "qf::kGemmPerTensor", kGemmPerTensor}, false, 0, 0, "fp32", 4, 0, 16, "[G]", "[G]", false, true, true, false, false, "e4m3", "e4m3", false, false, ""},
    // K-grouped: per row of A [m] and of B [N] (the per-channel transposed copies of one tensor;
    // members: [G, m] and [G, N]).
    {GemmScaling::RowChannel, "rowwise", {"qf::gemm::RowChannelScaling", "qf::kGemmRowChannel", kGemmRowChannel},
     {"qf::gemm::RowChannelScaling", "qf::kGemmRowChannel", kGemmRowChannel}, false, 0, 0, "fp32", 4, 0, 16,
     "[m_total]", "[G, N]", false, true, true, false, true, "e4m3", "e4m3", false, false, ""},
    // K-grouped: both operands 1x128 along the tokens (the 128x1 columnwise grids). mn_major:
    // M-grouped A's 1x128 grids, K-grouped both operands' 128x1 grids.
    {GemmScaling::Block128, "blockwise", {"qf::gemm::Block128Scaling", "qf::kGemmBlock128", kGemmBlock128},
     {"qf::gemm::Block128KScaling", "qf::kGemmBlock128K", kGemmBlock128K}, true, 128, 128, "fp32", 4, 0, 16,
     "[m_total, ceil(K/128)]", "[G, ceil(N/128), ceil(K/128)]", false, true, true, false, false, "e4m3",
     "e4m3", true, false, "block", {}, false, 0, 16},
    // mn_major: every operand's grid (M-grouped A per group, B per expert [K/32, round_up(N, 4)];
    // K-grouped both operands' 32x1 grids).
    {GemmScaling::Mx32, "mxfp8", {"qf::gemm::Mx32Scaling", "qf::kGemmMx32", kGemmMx32},
     {"qf::gemm::Mx32Scaling", "qf::kGemmMx32", kGemmMx32}, true, 32, 32, "e8m0", 1, 4, 128, "[m_total, K/32]",
     "[G, N, K/32]", false, true, true, false, false, "e4m3", "e4m3", true, true, "mx", "bf16", false, 600},
    // Scales applied while dequantizing to fp16 (no promotion: fp16 MMAs accumulate in fp32).
    // K-grouped: both operands' 1x16 blocks along the tokens (the transposed columnwise copies).
    {GemmScaling::Nvfp4, "nvfp4", {"qf::gemm::Nvfp4Scaling", "qf::kGemmNvfp4", kGemmNvfp4},
     {"qf::gemm::Nvfp4Scaling", "qf::kGemmNvfp4", kGemmNvfp4}, false, 0, 16, "e4m3", 1, 16, 128, "[m_total, K/16]",
     "[G, N, K/16]", true, true, true, true, false, "e2m1", "e2m1", false, false, "", "fp16", true, 750},
    // bf16 / fp16 operands as they are (the identity copies): only the per-group alpha; the
    // tensor cores accumulate their exact products in fp32 over all of K.
    {GemmScaling::None, "none", {"qf::gemm::AlphaScaling", "qf::kGemmNone", kGemmNone},
     {"qf::gemm::AlphaScaling", "qf::kGemmNone", kGemmNone}, false, 0, 0, "none", 0, 0, 16, "none", "none", true, false, false, false,
     false, "bf16", "", false, false, ""},
    // Weight-only int8 (W8A16): B's int8 converted to A's 16-bit type on chip (exact), fp32 sums,
    // B's per-channel scales in the epilogue. M-grouped only (the wgrad of such a recipe is bf16 x bf16).
    {GemmScaling::Channel, "channel", {"qf::gemm::ChannelScaling", "qf::kGemmChannel", kGemmChannel}, {}, false, 0, 0,
     "fp32", 4, 0, 16, "none", "[G, N]", true, false, true, true, true, "bf16", "int8", false, false, ""},
};

// The device types of bf16 and fp16 GEMM operands (identity copies), by operand_dtype == FP16.
constexpr std::string_view kGemm16BitOperand[] = {"qf::gemm::Bf16Operand", "qf::gemm::Fp16Operand"};

constexpr int kMaxStages = 8;
constexpr int64_t kMaxDim = int64_t(1) << 24;

bool is_fp8(ElemFormat f) { return f == ElemFormat::E4M3 || f == ElemFormat::E5M2; }
bool is_identity(ElemFormat f) { return f == ElemFormat::Identity; }

// int8 x int8 sums stay exact in the tensor cores' s32 accumulators while K * 2^14 (the largest
// product, -128 * -128) < 2^31: up to this K the kernel converts them to fp32 once, after all of K.
constexpr int64_t kInt8UnpromotedK = int64_t(1) << 17;

int out_bytes(const GemmSpec& s) { return traits(s.out_dtype).bytes; }

const GemmDevicePolicy& device_policy(const GemmSpec& s) {
  return k_grouped(s.layout) ? traits(s.scaling).k_grouped : traits(s.scaling).m_grouped;
}

GemmSmem smem_for(const GemmSpec& s, const GemmTile& t) {
  return gemm_smem(t.block_m, t.block_n, t.stages, t.block_m / 64, device_policy(s).id,
                   traits(s.scaling).col_scales, out_bytes(s), k_grouped(s.layout),
                   s.layout == GemmLayout::KGroupedMembers);
}

std::string tile_field(const char* f) { return std::string("tile.") + f; }

}  // namespace

int gemm_member_map_count(const GemmSpec& s) {
  return gemm_member_map_slots(int(smem_for(s, s.tile).load_slots));
}

const GemmScalingTraits& traits(GemmScaling s) {
  for (const auto& t : kScalings)
    if (t.id == s) return t;
  QF_CHECK(false, "unknown GemmScaling ", int(s));
  return kScalings[0];
}

std::span<const GemmScalingTraits> all_gemm_scalings() { return kScalings; }

std::optional<GemmScaling> parse_gemm_scaling(std::string_view name) {
  for (const auto& t : kScalings)
    if (t.name == name) return t.id;
  return std::nullopt;
}

std::string_view name(GemmLayout l) {
  switch (l) {
    case GemmLayout::MGrouped: return "m_grouped";
    case GemmLayout::KGrouped: return "k_grouped";
    case GemmLayout::KGroupedMembers: return "k_grouped_members";
  }
  return "?";
}

GemmOperandFormat parse_gemm_format(std::string_view name, const std::string& where) {
  if (const auto d = parse_dtype(name); d && (*d == DType::BF16 || *d == DType::FP16))
    return {ElemFormat::Identity, *d};
  const auto f = parse_format(name);
  if (!f || (*f != ElemFormat::E4M3 && *f != ElemFormat::E5M2 && *f != ElemFormat::Int8 && *f != ElemFormat::E2M1))
    throw UserError(where, "expected e4m3, e5m2, int8, e2m1 (nvfp4), bf16 or fp16, got \"" + std::string(name) + "\"");
  return {*f, DType::BF16};
}

GemmLayout parse_gemm_layout(std::string_view name, const std::string& where) {
  for (GemmLayout l : {GemmLayout::MGrouped, GemmLayout::KGrouped, GemmLayout::KGroupedMembers})
    if (name == qf::name(l)) return l;
  throw UserError(where, "expected m_grouped, k_grouped or k_grouped_members, got \"" + std::string(name) + "\"");
}

ScaleLayout parse_gemm_scale_layout(std::string_view name, const std::string& where) {
  if (name == "compact") return ScaleLayout::Compact;
  if (name == "mn_major") return ScaleLayout::MnMajor;
  throw UserError(where, "expected compact or mn_major, got \"" + std::string(name) + "\"");
}

std::string_view name(GemmRoute r) {
  return r == GemmRoute::Dequant ? "dequant" : r == GemmRoute::Auto ? "auto" : "fused";
}

GemmRoute parse_gemm_route(std::string_view name, const std::string& where) {
  if (name == "fused") return GemmRoute::Fused;
  if (name == "dequant") return GemmRoute::Dequant;
  if (name == "auto") return GemmRoute::Auto;
  throw UserError(where, "expected fused, dequant or auto, got \"" + std::string(name) + "\"");
}

bool gemm_has_dequant_route(const GemmSpec& s) { return !traits(s.scaling).dequant_dtype.empty(); }

GemmRoute choose_gemm_route(const GemmSpec& s, int64_t extent, int64_t g) {
  if (s.route != GemmRoute::Auto) return s.route;
  if (!gemm_has_dequant_route(s) || extent <= 0 || g <= 0) return GemmRoute::Fused;
  // The copies cost about (rows of A + rows of B) x K bytes moved; the 16-bit GEMM saves time in
  // proportion to rows of A x rows of B x K: the route pays where h(rows A, rows B) is large.
  // Both need enough work for the route's fixed cost (its three extra launches).
  auto h = [](double x, double y) { return x * y / (x + y); };
  const double n = double(s.n), crossover = traits(s.scaling).dequant_crossover;
  const bool pays = k_grouped(s.layout) ? h(double(s.m), n) >= crossover        // A [m, tokens], B [N, tokens]
                                        : h(double(extent) / double(g), n) >= crossover;  // a group's rows, its N
  const double flops = 2 * n * double(extent) * double(k_grouped(s.layout) ? s.m : s.k);
  return pays && flops >= kGemmAutoMinFlops ? GemmRoute::Dequant : GemmRoute::Fused;
}

void settle_gemm_route(GemmSpec& s) {
  if (s.route == GemmRoute::Auto && !gemm_has_dequant_route(s)) s.route = GemmRoute::Fused;
}

GemmKernelSpecs gemm_kernel_specs(const GemmSpec& s) {
  GemmKernelSpecs out;
  std::vector<GemmRoute> routes = {s.route};
  if (s.route == GemmRoute::Auto) {
    routes = {GemmRoute::Fused};
    if (gemm_has_dequant_route(s)) routes.push_back(GemmRoute::Dequant);
  }
  for (GemmRoute r : routes) {
    const GemmSpec c = s.route == GemmRoute::Auto ? gemm_route_spec(s, r) : s;
    if (r == GemmRoute::Dequant) {
      out.dequant.push_back(c);
      out.gemm.push_back(dequant_inner_spec(c));
    } else {
      out.gemm.push_back(c);
    }
  }
  return out;
}

GemmSpec gemm_route_spec(const GemmSpec& s, GemmRoute r) {
  QF_CHECK(r != GemmRoute::Auto && (s.route == GemmRoute::Auto || s.route == r),
           "gemm_route_spec: a concrete route of an auto spec (or the spec's own)");
  GemmSpec out = s;
  out.route = r;
  if (s.route == GemmRoute::Auto && r == GemmRoute::Dequant) out.tile = {};
  return out;
}

std::string_view default_gemm_format(GemmScaling s, bool b_side, std::string_view other_named) {
  const GemmScalingTraits& t = traits(s);
  // int8 operands pair with int8 (s8 x s8 MMAs) but for channel scaling's int8 weights; none's
  // 16-bit operands share one type.
  if (other_named == "int8" && t.b_default != "int8") return "int8";
  if (t.b_default.empty() && (other_named == "bf16" || other_named == "fp16")) return other_named;
  return b_side && !t.b_default.empty() ? t.b_default : t.a_default;
}

void set_gemm_formats(GemmSpec& s, const GemmOperandFormat& a, const GemmOperandFormat& b, const std::string& b_where) {
  if (is_identity(a.format) && is_identity(b.format) && a.dtype != b.dtype)
    throw UserError(b_where, std::string("a ") + std::string(traits(a.dtype).name) + " A takes a " +
                                 std::string(traits(a.dtype).name) + " B (one MMA type), got " + std::string(traits(b.dtype).name));
  s.a_format = a.format;
  s.b_format = b.format;
  s.operand_dtype = is_identity(a.format) ? a.dtype : is_identity(b.format) ? b.dtype : DType::BF16;
}

std::string_view gemm_format_name(const GemmSpec& s, ElemFormat f) {
  return is_identity(f) ? traits(s.operand_dtype).name : traits(f).name;
}

int gemm_operand_bits(const GemmSpec& s, ElemFormat f) {
  return is_identity(f) ? 8 * traits(s.operand_dtype).bytes : traits(f).bits;
}

int64_t gemm_row_bytes(const GemmSpec& s, ElemFormat f, int64_t k) { return k * gemm_operand_bits(s, f) / 8; }

bool gemm_a_scaled(const GemmSpec& s) { return traits(s.scaling).a_scaled; }
bool gemm_b_scaled(const GemmSpec& s) { return traits(s.scaling).b_scaled; }

bool gemm_promotes(const GemmSpec& s) {
  if (traits(s.scaling).fp32_sums) return false;
  if (traits(s.a_format).is_int)  // K-grouped: a group's token count is run-time data
    return traits(s.scaling).promotion_required || k_grouped(s.layout) || s.k >= kInt8UnpromotedK;
  return !s.fast_accum;
}

void validate(const GemmSpec& s) {
  if (s.route == GemmRoute::Auto) {  // both routes, where it has both
    validate(gemm_route_spec(s, GemmRoute::Fused));
    if (gemm_has_dequant_route(s)) validate(gemm_route_spec(s, GemmRoute::Dequant));
    return;
  }
  if (s.route == GemmRoute::Dequant) {
    if (traits(s.scaling).dequant_dtype.empty())
      throw UserError("route", "dequant: expected mxfp8 or nvfp4 scaling (the others have nothing to dequantize "
                               "before their MMAs), got " + std::string(traits(s.scaling).name));
    GemmSpec fused = s;  // the operands and their scales as the fused kernel takes them
    fused.route = GemmRoute::Fused;
    fused.tile = {};
    validate(fused);
    validate(dequant_inner_spec(s));  // the tile is the none GEMM's
    return;
  }
  const bool int8 = traits(s.a_format).is_int || traits(s.b_format).is_int;
  const bool identity = is_identity(s.a_format) || is_identity(s.b_format);
  if (s.scaling == GemmScaling::Channel) {
    // Weight-only int8: 16-bit MMAs on B converted on chip (int8 values are exact in bf16 / fp16).
    if (!is_identity(s.a_format))
      throw UserError("a_format", "channel scaling: expected bf16 or fp16 (unscaled activations), got " +
                                      std::string(traits(s.a_format).name));
    if (s.b_format != ElemFormat::Int8)
      throw UserError("b_format", "channel scaling: expected int8 (per-channel weights), got " +
                                      std::string(gemm_format_name(s, s.b_format)));
    if (k_grouped(s.layout))
      throw UserError("layout", "channel scaling (int8 weights x 16-bit activations) is an fprop / dgrad GEMM: expected "
                                "m_grouped, got " + std::string(name(s.layout)));
  } else if (s.scaling == GemmScaling::None || identity) {
    // bf16 x bf16 or fp16 x fp16 MMAs: both operands the identity copies, no scales.
    if (s.scaling != GemmScaling::None)
      throw UserError("scaling", "bf16 / fp16 operands: expected none (or channel, with int8 weights as B), got " +
                                     std::string(traits(s.scaling).name));
    for (auto [field, f] : {std::pair{"a_format", s.a_format}, std::pair{"b_format", s.b_format}})
      if (!is_identity(f))
        throw UserError(field, "none scaling: expected bf16 or fp16 (both operands), got " + std::string(traits(f).name));
  } else if (s.scaling == GemmScaling::Nvfp4) {
    for (auto [field, f] : {std::pair{"a_format", s.a_format}, std::pair{"b_format", s.b_format}})
      if (f != ElemFormat::E2M1)
        throw UserError(field, "nvfp4 scaling: expected e2m1, got " + std::string(traits(f).name));
    if (s.fast_accum)
      throw UserError("fast_accum", "nvfp4: the operands are dequantized to fp16, whose MMAs accumulate in fp32; "
                                    "there is no promotion to skip");
  } else if (int8) {
    // s8 x s8 MMAs: both operands int8 (Hopper has no int8 x fp8 MMA).
    for (auto [field, f, other] : {std::tuple{"a_format", s.a_format, "b_format"}, std::tuple{"b_format", s.b_format, "a_format"}})
      if (f != ElemFormat::Int8)
        throw UserError(field, std::string("int8 ") + other + " takes int8 here too (s8 x s8 MMAs), got " +
                                   std::string(traits(f).name));
    if (s.scaling == GemmScaling::Mx32)
      throw UserError("scaling", "int8 operands: expected tensor, rowwise or blockwise (MX scales are for fp8), got mxfp8");
    if (s.fast_accum)
      throw UserError("fast_accum", "int8: the tensor cores' s32 sums are exact; there is no fast accumulation to choose");
  } else {
    if (!is_fp8(s.a_format))
      throw UserError("a_format", "expected e4m3, e5m2 or int8 (e2m1 with nvfp4 scaling, bf16 / fp16 with none), got " +
                                      std::string(traits(s.a_format).name));
    if (!is_fp8(s.b_format))
      throw UserError("b_format", "expected e4m3, e5m2 or int8 (e2m1 with nvfp4 scaling, bf16 / fp16 with none), got " +
                                      std::string(traits(s.b_format).name));
  }
  if (is_identity(s.a_format) && s.operand_dtype != DType::BF16 && s.operand_dtype != DType::FP16)
    throw UserError("operand_dtype", "expected bf16 or fp16, got " + std::string(traits(s.operand_dtype).name));
  if (is_identity(s.a_format) && s.fast_accum)
    throw UserError("fast_accum", "bf16 / fp16 MMAs accumulate in fp32: there is no promotion to skip");
  if (s.n < 8 || s.n > kMaxDim || s.n % 8 != 0)
    throw UserError("n", "expected a multiple of 8 in [8, 2^24] (16-byte output rows), got " + std::to_string(s.n));
  if (k_grouped(s.layout)) {
    if (s.m < 1 || s.m > kMaxDim)
      throw UserError("m", "k-grouped: expected the rows of each output in [1, 2^24], got " + std::to_string(s.m));
    if (s.k != 0)
      throw UserError("k", "k-grouped: K is each group's token count, read at run time: expected 0, got " + std::to_string(s.k));
    // Every other scaling has a K-grouped form (kScalings; channel was refused above).
    QF_CHECK(!traits(s.scaling).k_grouped.policy.empty(), "no k-grouped policy for ", traits(s.scaling).name);
    if (s.tile.multicast > 1) throw UserError("tile.multicast", "k-grouped: expected 1, got " + std::to_string(s.tile.multicast));
  } else if (s.m != 0) {
    throw UserError("m", "m-grouped: rows are per group at run time: expected 0, got " + std::to_string(s.m));
  }
  if (!k_grouped(s.layout) && (s.k < 16 || s.k > kMaxDim || s.k % 16 != 0))
    throw UserError("k", "expected a multiple of 16 in [16, 2^24] (16-byte TMA row strides), got " + std::to_string(s.k));
  if (const int km = traits(s.scaling).k_multiple; !k_grouped(s.layout) && s.k % km != 0)
    throw UserError("k", std::string(traits(s.scaling).name) + " scaling reads the scales of 128 of K at once: expected a multiple of " +
                             std::to_string(km) + ", got " + std::to_string(s.k));
  if (s.out_dtype != DType::BF16 && s.out_dtype != DType::FP32)
    throw UserError("out_dtype", "expected bf16 or fp32, got " + std::string(traits(s.out_dtype).name));
  if (s.accumulate && s.out_dtype != DType::FP32)
    throw UserError("accumulate", "accumulation into the output needs an fp32 output");
  if (s.fast_accum && traits(s.scaling).promotion_required)
    throw UserError("fast_accum", std::string(traits(s.scaling).name) + " scaling changes along K: every " +
                                      std::to_string(traits(s.scaling).promote_k) + " of K is promoted to fp32");
  if (s.scale_layout == ScaleLayout::Swizzled)
    throw UserError("scale_layout", "expected compact or mn_major, got swizzled (the GEMMs read compact or mn_major grids, not GEMM-swizzled tiles)");
  if (s.scale_layout == ScaleLayout::MnMajor && !traits(s.scaling).mn_major_ok)
    throw UserError("scale_layout", "mn_major scale grids are read by the blockwise and mxfp8 GEMMs only (1x128 / 1x32 "
                                    "rowwise and 128x1 / 32x1 columnwise copies); got " + std::string(traits(s.scaling).name) +
                                        " scaling, " + std::string(name(s.layout)) + " layout");
  (void)resolve_tile(s);
}

GemmTile resolve_tile(const GemmSpec& s) {
  if (s.route == GemmRoute::Dequant) return resolve_tile(dequant_inner_spec(s));
  if (s.route == GemmRoute::Auto) return resolve_tile(gemm_route_spec(s, GemmRoute::Fused));  // the fused kernel's
  GemmTile t = s.tile;
  const bool fp4 = s.scaling == GemmScaling::Nvfp4;
  const bool promote = gemm_promotes(s);
  const bool block128 = s.scaling == GemmScaling::Block128;
  const bool per32 = traits(s.scaling).promote_k == 32;
  if (t.block_m == 0) t.block_m = 128;
  // Measured on an H200 at 8 x 4096 x 4096 x 7168 (docs/gemm.md): 128 x 256 tiles are the
  // fastest without promotion (one accumulator); promotion keeps two, so 128 x 128.
  if (t.block_n == 0) t.block_n = !promote && !fp4 && s.n >= 512 ? 256 : 128;
  // Bands of 16 m-blocks, but 4 for blockwise: H100, 8 x 4096 x 4096 x 7168, three alternations
  // in one run: raster 4 1047 / 1062 / 1067 TFLOP/s, 16 1035 / 1036 / 1039 (even at 4 x 8192 x
  // 7168 x 2048 and 32 x 512 x 2048 x 7168; rowwise is faster with 16: 1110-1119 vs 1088-1106).
  if (t.raster_m == 0) t.raster_m = block128 ? 4 : 16;
  if (t.block_m != 64 && t.block_m != 128)
    throw UserError(tile_field("block_m"), "expected 64 or 128, got " + std::to_string(t.block_m));
  if (t.block_n != 64 && t.block_n != 128 && t.block_n != 192 && t.block_n != 256)
    throw UserError(tile_field("block_n"), "expected 64, 128, 192 or 256, got " + std::to_string(t.block_n));
  if (fp4 && t.block_m != 128)
    throw UserError(tile_field("block_m"), "nvfp4: expected 128 (two consumer warpgroups, two dequantizing producer "
                                           "warpgroups), got " + std::to_string(t.block_m));
  if (fp4 && t.block_n != 128)
    throw UserError(tile_field("block_n"), "nvfp4: expected 128 (the B dequantization's work split), got " +
                                               std::to_string(t.block_n));
  if (promote && t.block_n > 128)
    throw UserError(tile_field("block_n"), std::string(traits(s.a_format).is_int
                                                           ? "int8 sums are promoted here (blockwise scales, K >= 2^17 or "
                                                             "k-grouped) and "
                                                           : "") +
                                               "fp32 promotion keeps two accumulators per thread: block_n <= 128, got " +
                                               std::to_string(t.block_n));
  if (block128 && s.layout == GemmLayout::MGrouped && 128 % t.block_n != 0)
    throw UserError(tile_field("block_n"), "blockwise scaling: a tile must lie in one 128-column B block (64 or 128), got " +
                                               std::to_string(t.block_n));
  const int64_t n_blocks = (s.n + t.block_n - 1) / t.block_n;
  if (t.multicast == 0) t.multicast = 1;
  if (t.multicast != 1 && t.multicast != 2)
    throw UserError(tile_field("multicast"), "expected 1 or 2, got " + std::to_string(t.multicast));
  if (t.multicast == 2 && n_blocks % 2 != 0)
    throw UserError(tile_field("multicast"), "pairs of n-blocks share A: ceil(N / block_n) = " + std::to_string(n_blocks) +
                                                 " must be even");
  if (t.raster_m < 1 || t.raster_m > 256)
    throw UserError(tile_field("raster_m"), "expected 1..256, got " + std::to_string(t.raster_m));
  if (per32 && t.block_n > 128)
    throw UserError(tile_field("block_n"), "per-32 promotion keeps three accumulators per thread: block_n <= 128, got " +
                                               std::to_string(t.block_n));
  const std::string sn(traits(s.scaling).name);
  if (traits(s.scaling).b_on_chip && t.multicast != 1)
    throw UserError(tile_field("multicast"), sn + ": B is converted on chip by each CTA's producer warps: expected 1, got " +
                                                 std::to_string(t.multicast));
  if (traits(s.scaling).b_on_chip && t.ordered == 2)
    throw UserError(tile_field("ordered"), sn + " accumulates on the tensor cores: ordered issue is not supported");
  // Unordered issue by default. M-grouped blockwise runs 7-10 % faster without it since its
  // scales moved into the consumers' registers (H100, 2026-11-24), and so do the K-grouped
  // kernels since their promotion overlaps the next step's MMAs (blockwise 741 vs 712-723
  // TFLOP/s, 707 vs 703 with fp32 accumulation; per-tensor 1048 vs 1029-1041; H100,
  // 2026-11-25). M-grouped per-tensor and rowwise promotion (128-row tiles) were ordered before
  // 2f2c68d; unordered they are faster with 4 stages than with the 5 that fit (below, and
  // docs/gemm.md: rowwise 1164-1176 -> 1205-1223 TFLOP/s at 8 x 4096 x 4096 x 7168, per-tensor
  // 1079-1110 -> 1192-1200; unordered with 5 stages 1105-1115 for rowwise).
  const bool m_grouped = s.layout == GemmLayout::MGrouped;
  const bool four_stages = promote && !per32 && !fp4 && !block128 && m_grouped && t.block_m == 128;
  if (t.ordered == 0) t.ordered = 1;
  if (per32 && t.ordered == 2)
    throw UserError(tile_field("ordered"), "per-32 promotion overlaps its own steps: ordered issue is not supported");
  if (t.ordered != 1 && t.ordered != 2)
    throw UserError(tile_field("ordered"), "expected 1 (off) or 2 (on), got " + std::to_string(t.ordered));
  if (t.ordered == 2 && t.block_m != 128)
    throw UserError(tile_field("ordered"), "ordered issue alternates two consumer warpgroups: block_m 128");
  if (t.stages == 0) {
    for (int st = four_stages ? 4 : kMaxStages; st >= 2 && t.stages == 0; --st) {
      GemmTile c = t;
      c.stages = st;
      if (smem_for(s, c).total <= kGemmSmemLimit) t.stages = st;
    }
    if (t.stages == 0) throw UserError("tile", "no pipeline depth fits in shared memory");
  }
  if (t.stages < 2 || t.stages > kMaxStages)
    throw UserError(tile_field("stages"), "expected 2.." + std::to_string(kMaxStages) + ", got " + std::to_string(t.stages));
  if (smem_for(s, t).total > kGemmSmemLimit)
    throw UserError(tile_field("stages"), std::to_string(t.stages) + " stages need " +
                                              std::to_string(smem_for(s, t).total) + " bytes of shared memory (limit " +
                                              std::to_string(kGemmSmemLimit) + ")");
  return t;
}

GemmScaleElems gemm_scale_elems(const GemmSpec& s, int64_t m_total, int64_t num_groups, int64_t k_total) {
  const int64_t g = num_groups, kb = (s.k + 127) / 128, nb = (s.n + 127) / 128;
  if (k_grouped(s.layout)) {
    const int sk = traits(s.scaling).scale_k;
    if (s.scaling == GemmScaling::RowChannel)  // per channel: shared by the groups, or per member
      return s.layout == GemmLayout::KGroupedMembers ? GemmScaleElems{g * s.m, g * s.n} : GemmScaleElems{s.m, s.n};
    if (!traits(s.scaling).a_scaled && !traits(s.scaling).b_scaled) return {0, 0};  // bf16 / fp16 operands
    if (sk == 0) return {g, g};  // tensor: one scale per group member
    // A scale per row of A [m, k_total] and of B [N, k_total] per scale_k tokens; members: each
    // member's grid on its own, so up to one partial block more per member.
    const int64_t cols = (k_total + sk - 1) / sk + (s.layout == GemmLayout::KGroupedMembers ? g : 0);
    const int64_t rows_a = mn_major_rows(s, s.m), rows_b = mn_major_rows(s, s.n);
    return {rows_a * cols, rows_b * cols};
  }
  switch (s.scaling) {
    case GemmScaling::PerTensor: return {g, g};
    case GemmScaling::RowChannel: return {m_total, g * s.n};
    case GemmScaling::Block128:  // mn_major: each group's grid [kb, rows rounded up to 4]
      return {(s.scale_layout == ScaleLayout::MnMajor ? mn_major_grouped_rows(m_total, g) : m_total) * kb, g * nb * kb};
    case GemmScaling::Mx32:  // mn_major: A per group as Block128, B per expert [K/32, N rounded up to 4]
      return {(s.scale_layout == ScaleLayout::MnMajor ? mn_major_grouped_rows(m_total, g) : m_total) * (s.k / 32),
              g * mn_major_rows(s, s.n) * (s.k / 32)};
    case GemmScaling::Nvfp4: return {m_total * (s.k / 16), g * s.n * (s.k / 16)};
    case GemmScaling::None: return {0, 0};
    case GemmScaling::Channel: return {0, g * s.n};
  }
  QF_CHECK(false, "unknown GemmScaling");
  return {};
}

int64_t mn_major_rows(const GemmSpec& s, int64_t rows) {
  return s.scale_layout == ScaleLayout::MnMajor ? int64_t(qf::mn_major_rows(u64(rows))) : rows;
}

int64_t gemm_k_total_multiple(const GemmSpec& s) { return 128 / gemm_operand_bits(s, s.a_format); }  // (A's and B's bits agree here)

std::string describe(const GemmSpec& s) {
  const std::string shape = k_grouped(s.layout)
                                ? std::string(s.layout == GemmLayout::KGroupedMembers ? " k-grouped (members)" : " k-grouped") +
                                      " M=" + std::to_string(s.m) + " N=" + std::to_string(s.n)
                                : " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k);
  return std::string(gemm_format_name(s, s.a_format)) + " x " + std::string(gemm_format_name(s, s.b_format)) + " " +
         std::string(traits(s.scaling).name) + (s.fast_accum ? " (fast accumulation)" : "") +
         (s.scale_layout == ScaleLayout::MnMajor ? " (mn_major scales)" : "") +
         (s.route != GemmRoute::Fused ? " (" + std::string(name(s.route)) + " route)" : "") + shape + " -> " +
         std::string(traits(s.out_dtype).name) + (s.accumulate ? " (accumulate)" : "");
}

GemmSpec dequant_inner_spec(const GemmSpec& s) {
  GemmSpec in = s;
  in.route = GemmRoute::Fused;
  in.scaling = GemmScaling::None;
  in.a_format = in.b_format = ElemFormat::Identity;
  const auto dtype = parse_dtype(traits(s.scaling).dequant_dtype);
  QF_CHECK(dtype, "dequant_inner_spec: ", traits(s.scaling).name, " scaling has no dequant route");
  in.operand_dtype = *dtype;
  in.scale_layout = ScaleLayout::Compact;
  in.fast_accum = false;
  return in;
}

bool gemm_dequant_packed(ElemFormat f) { return traits(f).elems_per_byte == 2; }

DequantSource emit_dequant(const GemmSpec& s) {
  validate(s);
  QF_CHECK(s.route == GemmRoute::Dequant, "emit_dequant: a dequant-route spec");
  DequantSource out;
  out.threads = 256;
  Emitter e;
  // Only the operands' formats reach the source: every shape and layout shares one cached module.
  e.comment("Generated by qforge (compiler/gemm_codegen.cpp): the dequant route's operand kernels. Do not edit.");
  e.line("#include \"qforge/dequant.cuh\"");
  e.blank();
  e.open("namespace qf_gen");
  for (auto [cfg, f] : {std::pair{"DequantA", s.a_format}, std::pair{"DequantB", s.b_format}}) {
    e.open(std::string("struct ") + cfg);
    e.alias("Format", traits(f).device_type);
    e.constant("kNvfp4", gemm_dequant_packed(f));  // packed e2m1 with e4m3 block scales
    // Members: a member's first token and length must be multiples of this (16 bytes, as the fused
    // kernel's TMA loads need them; A's and B's bits agree).
    e.constant("kMemberAlign", gemm_k_total_multiple(s));
    e.constant("kThreads", int64_t(out.threads));
    e.close(";");
  }
  e.close("  // namespace qf_gen");
  out.source = e.str();
  out.a_kernel = "qf::dequant_kernel<qf_gen::DequantA>";
  out.b_kernel = "qf::dequant_kernel<qf_gen::DequantB>";
  out.prep_kernel = "qf::dequant_prep_kernel<qf_gen::DequantA>";
  return out;
}

DequantWorkspace dequant_workspace(const GemmSpec& s, int64_t extent, int64_t g, int64_t inner_bytes) {
  QF_CHECK(s.route == GemmRoute::Dequant, "dequant_workspace: a dequant-route spec");
  auto align = [](int64_t v) { return (v + 255) / 256 * 256; };
  const bool kg = k_grouped(s.layout);
  const int64_t rows_a = kg ? s.m : extent, rows_b = kg ? s.n : g * s.n, k = kg ? extent : s.k;
  DequantWorkspace w;
  w.a = 0;
  w.b = align(rows_a * k * 2);
  int64_t end = w.b + align(rows_b * k * 2);
  // The GEMM's alpha per group: NVFP4's per-tensor factors, and the NaN of a member the fused kernel
  // cannot load.
  if (traits(s.scaling).per_tensor_amax || s.layout == GemmLayout::KGroupedMembers) {
    w.alpha = end;
    end += align(g * 4);
  }
  if ((!kg && s.scale_layout == ScaleLayout::MnMajor) || s.layout == GemmLayout::KGroupedMembers) {
    w.prefix = end;  // the groups' grids
    end += align((g + 1) * 8);
    w.starts = end;  // where each group begins (the running maximum of its offsets)
    end += align((g + 1) * 8);
  }
  if (inner_bytes > 0) {  // members: the none GEMM's tensor-map ring
    w.inner = end;
    end += align(inner_bytes);
  }
  w.total = end;
  return w;
}

GemmSource emit_gemm(const GemmSpec& s) {
  validate(s);
  QF_CHECK(s.route == GemmRoute::Fused, "emit_gemm: the dequant route runs emit_dequant's kernels and the none GEMM");
  const GemmTile t = resolve_tile(s);
  GemmSource out;
  out.tile = t;
  out.smem_bytes = smem_for(s, t).total;
  out.threads = 128 * (t.block_m / 64 + (s.scaling == GemmScaling::Nvfp4 ? 2 : 1));  // gemm_traits.cuh Traits::kThreads

  Emitter e;
  e.comment("Generated by qforge (compiler/gemm_codegen.cpp) from a GEMM spec. Do not edit.");
  e.comment(describe(s));
  e.line("#include \"qforge/gemm.cuh\"");
  e.blank();
  e.open("namespace qf_gen");
  e.open("struct GemmCfg");
  // Identity operands: the 16-bit MMA operand types of gemm_traits.cuh (kGemm16BitOperand).
  auto device_type = [&](ElemFormat f) -> std::string_view {
    return is_identity(f) ? kGemm16BitOperand[s.operand_dtype == DType::FP16] : traits(f).device_type;
  };
  e.alias("AFormat", device_type(s.a_format));
  e.alias("BFormat", device_type(s.b_format));
  const GemmDevicePolicy& dp = device_policy(s);
  e.alias("Scaling", dp.policy);
  e.constant_ident("int", "kScaling", dp.code);
  e.constant("kKGrouped", k_grouped(s.layout));
  e.constant("kMembers", s.layout == GemmLayout::KGroupedMembers);
  e.constant("kScaleK", int64_t(traits(s.scaling).scale_k));
  e.constant("kScaleMnMajor", s.scale_layout == ScaleLayout::MnMajor);
  e.constant("kElemsPerByte", int64_t(traits(s.a_format).elems_per_byte));
  e.constant("kElemBytes", int64_t(std::max(1, gemm_operand_bits(s, s.a_format) / 8)));  // (e2m1: kElemsPerByte)
  e.constant("kM", int64_t(s.m));
  e.constant("kN", int64_t(s.n));
  e.constant("kK", int64_t(s.k));
  e.constant("kOutFp32", s.out_dtype == DType::FP32);
  e.constant("kAccumulate", s.accumulate);
  e.constant("kPromote", gemm_promotes(s));
  e.constant("kBlockM", int64_t(t.block_m));
  e.constant("kBlockN", int64_t(t.block_n));
  e.constant("kStages", int64_t(t.stages));
  e.constant("kConsumers", int64_t(t.block_m / 64));
  e.constant("kMulticast", int64_t(t.multicast));
  e.constant("kRasterM", int64_t(t.raster_m));
  e.constant("kOrderedIssue", t.ordered == 2);
  e.constant_u32("kSmemBytes", out.smem_bytes);
  e.close(";");
  e.close("  // namespace qf_gen");
  out.source = e.str();
  out.kernel = "qf::gemm_kernel<qf_gen::GemmCfg>";
  return out;
}

}  // namespace qf
