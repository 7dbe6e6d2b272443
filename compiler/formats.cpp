#include "compiler/formats.h"

#include <array>
#include <cfloat>

#include "compiler/error.h"
#include "qforge/numerics.cuh"

namespace qf {
namespace {

constexpr std::array kDTypes = {
    DTypeTraits{DType::FP32, "fp32", 4, FLT_MAX, 0, "<f4"},
    DTypeTraits{DType::BF16, "bf16", 2, 3.3895313892515355e38f /* 0x7F7F0000 */, 1, "<u2"},
    DTypeTraits{DType::FP16, "fp16", 2, 65504.0f, 2, "<f2"},
};

template <class F>
constexpr FormatTraits float_format(ElemFormat id, bool sr_ok, int per_byte) {
  return FormatTraits{id,    F::kName, F::kBits, F::kMaxFinite, F::kEmax, sr_ok, per_byte, "", F::kIsInt,
                      [](uint8_t b) { return decode<F>(b); }};
}

// The format table. device_type names the trait struct of templates/qforge/numerics.cuh.
const std::array<FormatTraits, 7> kFormats = [] {
  std::array<FormatTraits, 7> t = {
      float_format<E4M3>(ElemFormat::E4M3, false, 1),
      float_format<E5M2>(ElemFormat::E5M2, false, 1),
      float_format<E2M1>(ElemFormat::E2M1, true, 2),
      float_format<E2M3>(ElemFormat::E2M3, true, 1),
      float_format<E3M2>(ElemFormat::E3M2, true, 1),
      float_format<Int8>(ElemFormat::Int8, true, 1),
      FormatTraits{ElemFormat::Identity, "identity", 0, 0.0f, 0, false, 1, ""},
  };
  t[0].device_type = "qf::E4M3";
  t[1].device_type = "qf::E5M2";
  t[2].device_type = "qf::E2M1";
  t[3].device_type = "qf::E2M3";
  t[4].device_type = "qf::E3M2";
  t[5].device_type = "qf::Int8";
  return t;
}();

constexpr ElemFormat kFp8[] = {ElemFormat::E4M3, ElemFormat::E5M2};
constexpr ElemFormat kIdentity[] = {ElemFormat::Identity};
constexpr ElemFormat kPerTensor[] = {ElemFormat::E4M3, ElemFormat::E5M2, ElemFormat::Int8};
constexpr ElemFormat kChannel[] = {ElemFormat::E4M3, ElemFormat::E5M2, ElemFormat::Int8};
constexpr ElemFormat kBlock[] = {ElemFormat::E4M3, ElemFormat::E5M2, ElemFormat::Int8};
constexpr ElemFormat kMx[] = {ElemFormat::E4M3, ElemFormat::E5M2, ElemFormat::E2M1,
                              ElemFormat::E2M3, ElemFormat::E3M2};
constexpr ElemFormat kNvfp4[] = {ElemFormat::E2M1};

// Indexed by the variant index of Scaling.
const ScalingTraits kScalings[] = {
    {"none", kIdentity, ScaleStorage::None, AmaxScope::None, false, false, false, false, "", "qf::kModeNone"},
    {"per_tensor_current", kPerTensor, ScaleStorage::F32, AmaxScope::Tensor, true, false, false, false,
     "", "qf::kModeTensorCurrent"},
    {"per_tensor_delayed", kFp8, ScaleStorage::F32, AmaxScope::Tensor, false, false, false, false, "",
     "qf::kModeTensorDelayed"},
    {"per_channel", kChannel, ScaleStorage::F32, AmaxScope::Channel, true, false, false, false, "", "qf::kModeChannel"},
    {"block", kBlock, ScaleStorage::F32, AmaxScope::Block, false, true, false, true,
     "[1,L] (rowwise), [L,1] (columnwise) or [R,C], each a power of two in [16, 512]", "qf::kModeBlock"},
    {"mx", kMx, ScaleStorage::E8M0, AmaxScope::Block, false, true, true, true,
     "[1,32] (rowwise), [32,1] (columnwise) or [32,32]", "qf::kModeMx"},
    {"nvfp4", kNvfp4, ScaleStorage::E4M3, AmaxScope::Block, false, true, true, false,
     "[1,16] (rowwise), [16,1] (columnwise) or [16,16]", "qf::kModeNvfp4"},
};
static_assert(std::size(kScalings) == std::variant_size_v<Scaling>);

// Indexed by ScaleStorage.
constexpr std::array kScaleStorages = {
    ScaleStorageTraits{ScaleStorage::None, "none", 0},
    ScaleStorageTraits{ScaleStorage::F32, "fp32", 4},
    ScaleStorageTraits{ScaleStorage::E8M0, "e8m0", 1},
    ScaleStorageTraits{ScaleStorage::E4M3, "e4m3", 1},
};
static_assert(kScaleStorages[size_t(ScaleStorage::E4M3)].id == ScaleStorage::E4M3);

}  // namespace

const DTypeTraits& traits(DType d) { return kDTypes[static_cast<size_t>(d)]; }
std::span<const DTypeTraits> all_dtypes() { return kDTypes; }
std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& t : kDTypes)
    if (t.name == name) return t.id;
  return std::nullopt;
}

const FormatTraits& traits(ElemFormat f) { return kFormats[static_cast<size_t>(f)]; }
std::span<const FormatTraits> all_formats() { return kFormats; }
std::optional<ElemFormat> parse_format(std::string_view name) {
  for (const auto& t : kFormats)
    if (t.name == name) return t.id;
  return std::nullopt;
}

const ScalingTraits& traits(const Scaling& s) { return kScalings[s.index()]; }
std::string_view scaling_name(const Scaling& s) { return traits(s).name; }

std::optional<BlockShape> block_of(const Scaling& s) {
  if (auto* b = std::get_if<BlockScaling>(&s)) return b->block;
  if (auto* b = std::get_if<MxScaling>(&s)) return b->block;
  if (auto* b = std::get_if<Nvfp4Scaling>(&s)) return b->block;
  return std::nullopt;
}

bool needs_tensor_amax(const Scaling& s) {
  return traits(s).amax_scope == AmaxScope::Tensor || std::holds_alternative<Nvfp4Scaling>(s);
}

const ScaleStorageTraits& traits(ScaleStorage s) {
  QF_CHECK(static_cast<size_t>(s) < kScaleStorages.size(), "bad ScaleStorage");
  return kScaleStorages[static_cast<size_t>(s)];
}
std::string_view name(ScaleStorage s) { return traits(s).name; }
std::string_view name(AmaxCompute a) { return a == AmaxCompute::Max ? "max" : "most_recent"; }
std::string_view name(MxRule r) { return r == MxRule::RCeil ? "rceil" : "floor"; }

}  // namespace qf
