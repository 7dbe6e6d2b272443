// Format and scaling-mode traits: the one table that describes every element format, input
// dtype and scaling mode qforge knows. Adding a format touches this table (and
// templates/qforge/numerics.cuh for its bit-level encoding), nothing else.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

namespace qf {

// High-precision dtypes: quantizer inputs and identity outputs.
enum class DType : uint8_t { FP32, BF16, FP16 };

struct DTypeTraits {
  DType id;
  std::string_view name;     // "bf16"
  int bytes;
  float max_finite;          // as fp32
  int numerics_code;         // the code numerics.cuh functions take (0 fp32, 1 bf16, 2 fp16)
  std::string_view npy_descr;  // "<f4", "<f2"; bf16 is "<u2" (bit patterns)
};

const DTypeTraits& traits(DType d);
std::span<const DTypeTraits> all_dtypes();
std::optional<DType> parse_dtype(std::string_view name);

// Element formats of quantized outputs.
enum class ElemFormat : uint8_t { E4M3, E5M2, E2M1, E2M3, E3M2, Int8, Identity };

struct FormatTraits {
  ElemFormat id;
  std::string_view name;        // as written in recipes: "e4m3"
  int bits;                     // storage bits of one element (identity: 0, see out dtype)
  float max_finite;             // 0 for identity
  int emax;                     // OCP MX emax_elem (floor rule); 0 where meaningless
  bool stochastic_rounding_ok;  // SR defined for this format (docs/numerics.md)
  int elems_per_byte;           // 2 for e2m1 (packed nibbles), else 1
  std::string_view device_type; // trait struct in templates/qforge/numerics.cuh ("qf::E4M3")
  bool is_int = false;          // an integer grid (int8: torchao's per-channel rule, s8 MMAs)
  float (*decode)(uint8_t) = nullptr;  // exact value of an encoding (bits above `bits` ignored); identity: none
};

const FormatTraits& traits(ElemFormat f);
std::span<const FormatTraits> all_formats();
std::optional<ElemFormat> parse_format(std::string_view name);

// ---- Scaling modes: one struct per mode, a variant over them. ----

// Block geometry in input coordinates [rows along M, cols along K].
struct BlockShape {
  int rows = 1;
  int cols = 1;
  bool operator==(const BlockShape&) const = default;
  bool is_2d() const { return rows > 1 && cols > 1; }
};

// Where a stream's scale entries live: compact (the grid [rows, cols] row-major), swizzled (the
// GEMM 128x4 tiles of MX / NVFP4 scales) or mn_major (the grid column-major, rows padded to a
// multiple of 4: Transformer Engine's GEMM-ready layout of 1D block scales, DeepGEMM's MN-major
// scaling factors; fp32 block and e8m0 MX scales).
enum class ScaleLayout : uint8_t { Compact, Swizzled, MnMajor };
// (The blockwise and MXFP8 GEMMs read compact or mn_major grids: GemmSpec::scale_layout.)
enum class AmaxCompute : uint8_t { Max, MostRecent };
enum class MxRule : uint8_t { RCeil, Floor };

struct NoScaling {  // identity passthrough
  bool operator==(const NoScaling&) const = default;
};
struct PerTensorCurrent {
  float epsilon = 0.0f;
  bool pow2 = false;
  bool operator==(const PerTensorCurrent&) const = default;
};
struct PerTensorDelayed {
  int margin = 0;
  int history_length = 1024;
  AmaxCompute amax_compute = AmaxCompute::Max;
  bool operator==(const PerTensorDelayed&) const = default;
};
struct PerChannel {  // one scale per row (rowwise) or per column (columnwise): torchao's rule for
                     // int8, current scaling's (fmax / amax) per channel for fp8
  float epsilon = 0.0f;  // fp8 only: amax floor
  bool pow2 = false;     // fp8 only: scales rounded down to powers of two
  bool operator==(const PerChannel&) const = default;
};
struct BlockScaling {  // fp32 scales per 1D block or 2D tile (DeepSeek-V3 style)
  BlockShape block{1, 128};
  float epsilon = 0.0f;
  bool pow2 = true;
  bool operator==(const BlockScaling&) const = default;
};
struct MxScaling {  // OCP MX: E8M0 scale per 32 elements (or 32x32 tile)
  BlockShape block{1, 32};
  MxRule rule = MxRule::RCeil;
  bool operator==(const MxScaling&) const = default;
};
struct Nvfp4Scaling {  // E4M3 scale per 16 elements (or 16x16 tile) + fp32 tensor amax
  BlockShape block{1, 16};
  bool operator==(const Nvfp4Scaling&) const = default;
};

using Scaling = std::variant<NoScaling, PerTensorCurrent, PerTensorDelayed, PerChannel,
                             BlockScaling, MxScaling, Nvfp4Scaling>;

// How a mode stores its per-block scale.
enum class ScaleStorage : uint8_t { None, F32, E8M0, E4M3 };

struct ScaleStorageTraits {
  ScaleStorage id;
  std::string_view name;  // as buffers name their dtype: "e8m0"
  int bytes;              // one stored scale (none: 0)
};

const ScaleStorageTraits& traits(ScaleStorage s);

// What the scale of a mode depends on: nothing, the whole tensor's amax, a channel's
// amax, or a block's amax.
enum class AmaxScope : uint8_t { None, Tensor, Channel, Block };

struct ScalingTraits {
  std::string_view name;                   // "mx"
  std::span<const ElemFormat> formats;     // element formats this mode accepts
  ScaleStorage scale_storage;
  AmaxScope amax_scope;                    // scope of the amax its scale is computed from
  bool amax_before_cast;                   // the scale needs that amax before any element is cast
  bool has_block;                          // the mode takes a "block" shape
  bool swizzle_ok;                         // GEMM-swizzled 128x4 scale layout allowed
  bool mn_major_ok;                        // mn_major scale layout allowed (with 1D blocks)
  std::string_view allowed_blocks;         // for messages: "[1,32], [32,1] or [32,32]"
  std::string_view device_mode;            // its constant in templates/qforge/cast_smem.cuh
};

const ScalingTraits& traits(const Scaling& s);
std::string_view scaling_name(const Scaling& s);
// The mode's block shape, if it has one.
std::optional<BlockShape> block_of(const Scaling& s);
// For NVFP4, the per-tensor amax is also needed (for the global scale).
bool needs_tensor_amax(const Scaling& s);

std::string_view name(ScaleStorage s);
std::string_view name(AmaxCompute a);
std::string_view name(MxRule r);

}  // namespace qf
