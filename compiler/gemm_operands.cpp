#include "compiler/gemm_operands.h"

#include <variant>

#include "compiler/buffers.h"
#include "compiler/error.h"

namespace qf {

std::optional<GemmSpec> gemm_for_streams(const Stream& a, const Stream& b, int64_t m, int64_t n, int64_t k,
                                         GemmLayout layout) {
  const ScaleStorage sa = traits(a.scaling).scale_storage, sb = traits(b.scaling).scale_storage;
  GemmSpec spec;
  spec.layout = layout;
  if (k_grouped(layout)) spec.m = m;
  spec.a_format = a.format;
  spec.b_format = b.format;
  spec.n = n;
  spec.k = k;
  // [rows, cols] data elements per scale entry (0: the whole extent)
  const EntryShape ea = scale_entry_shape(a), eb = scale_entry_shape(b);
  auto per_tensor = [](const Scaling& s) {
    return std::holds_alternative<PerTensorCurrent>(s) || std::holds_alternative<PerTensorDelayed>(s);
  };
  if (a.format == ElemFormat::Identity && b.format == ElemFormat::Identity) {
    if (a.out_dtype != b.out_dtype || a.out_dtype == DType::FP32) return std::nullopt;
    spec.scaling = GemmScaling::None;
    spec.operand_dtype = a.out_dtype;
  } else if (a.format == ElemFormat::Identity && b.format == ElemFormat::Int8 &&
             std::holds_alternative<PerChannel>(b.scaling) && eb.rows == 1 && eb.cols == 0 && a.out_dtype != DType::FP32) {
    spec.scaling = GemmScaling::Channel;
    spec.operand_dtype = a.out_dtype;
  } else if (per_tensor(a.scaling) && per_tensor(b.scaling)) {
    spec.scaling = GemmScaling::PerTensor;
  } else if (std::holds_alternative<PerChannel>(a.scaling) && std::holds_alternative<PerChannel>(b.scaling) &&
             ea.rows == 1 && ea.cols == 0 && eb.rows == 1 && eb.cols == 0) {
    spec.scaling = GemmScaling::RowChannel;
  } else if (sa == ScaleStorage::F32 && sb == ScaleStorage::F32 && block_of(a.scaling) && block_of(b.scaling) &&
             ea.rows == 1 && ea.cols == 128 && a.scale_layout != ScaleLayout::Swizzled) {
    spec.scaling = GemmScaling::Block128;
    spec.scale_layout = a.scale_layout;
    if (eb.rows == 128 && eb.cols == 128 && b.scale_layout == ScaleLayout::Compact) {
    } else if (eb.rows == 1 && eb.cols == 128 && b.scale_layout == a.scale_layout) {
      if (!k_grouped(layout)) spec.layout = GemmLayout::KGrouped;  // both 1x128 along the reduction: the wgrad form
      spec.m = m;
      spec.k = 0;
    } else {
      return std::nullopt;
    }
  } else if (std::holds_alternative<MxScaling>(a.scaling) && std::holds_alternative<MxScaling>(b.scaling) &&
             ea.rows == 1 && ea.cols == 32 && eb.rows == 1 && eb.cols == 32 && a.scale_layout == b.scale_layout &&
             a.scale_layout != ScaleLayout::Swizzled) {
    spec.scaling = GemmScaling::Mx32;
    spec.scale_layout = a.scale_layout;
  } else if (std::holds_alternative<Nvfp4Scaling>(a.scaling) && std::holds_alternative<Nvfp4Scaling>(b.scaling) &&
             ea.rows == 1 && ea.cols == 16 && eb.rows == 1 && eb.cols == 16 && a.scale_layout == ScaleLayout::Compact &&
             b.scale_layout == ScaleLayout::Compact) {
    spec.scaling = GemmScaling::Nvfp4;
  } else {
    return std::nullopt;
  }
  try {
    validate(spec);
  } catch (const UserError&) {
    return std::nullopt;  // formats or sizes this kernel does not take: the dequant route
  }
  return spec;
}

}  // namespace qf
