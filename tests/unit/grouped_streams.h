// The streams of every shipped recipe's grouped roles and usages, with a grouped quantize of a
// pseudo-random input by the CPU reference: what the grouped dequantize tests start from.
#pragma once
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "pseudo_random.h"
#include "shipped_plans.h"
#include "qforge/numerics.cuh"
#include "reference/executor.h"

namespace qf::testing {

struct GroupedPlan {
  std::string label;  // "nvfp4 grouped_linear:weight training"
  Plan plan;
};

inline std::vector<GroupedPlan> shipped_grouped_plans() {
  std::vector<GroupedPlan> out;
  for (ShippedPlan& p : shipped_plans(kGroupedRoles, true)) out.push_back({p.label(), std::move(p.plan)});
  return out;
}

// A bf16 input of `rows` x k rows, values in [-range, range].
inline ref::HostTensor grouped_input(int64_t rows, int64_t k, uint32_t seed, float range = 3.0f) {
  ref::HostTensor x;
  x.dtype = DType::BF16;
  x.shape = {rows, k};
  const std::vector<float> v = pseudo_random(rows * k, range, seed);
  x.bytes.resize(size_t(rows * k * 2));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_bf16(v[i]);
    std::memcpy(x.bytes.data() + 2 * i, &h, 2);
  }
  return x;
}

// The grouped quantize's buffers of stream `si` (data, scale, the per-member amax of an NVFP4
// stream), from ref::quantize_grouped's outputs.
struct StreamBuffers {
  std::vector<uint8_t> data, scale;
  std::vector<float> amax;
};
inline StreamBuffers stream_buffers(const Plan& plan, int si, const std::vector<ref::Output>& outs) {
  StreamBuffers b;
  const Stream& s = plan.streams[size_t(si)];
  for (const auto& o : outs) {
    if (o.desc.stream == si && o.desc.kind == BufferKind::Data) b.data = o.bytes;
    if (o.desc.stream == si && o.desc.kind == BufferKind::ScaleInv) b.scale = o.bytes;
    if (s.tensor_amax >= 0 && o.desc.name == amax_output_name(plan, s.tensor_amax)) {
      b.amax.resize(o.bytes.size() / 4);
      std::memcpy(b.amax.data(), o.bytes.data(), o.bytes.size());
    }
  }
  return b;
}

}  // namespace qf::testing
