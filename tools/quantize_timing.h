// Device timing of quantize calls, shared by `qforge tune` and bench/qforge_bench: buffer
// sets for a call (rotated so that L2 does not serve small tensors), the minimal bytes a call
// must move, and a CUDA-event timer (median of 5 batches after warm-up).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compiler/buffers.h"
#include "compiler/ir.h"
#include "runtime/driver.h"
#include "runtime/quantizer.h"

namespace qf::cli {

struct Case {
  std::string recipe_path, recipe, role;
  Usage usage;
  Shape2D shape;
  std::vector<int64_t> members;  // grouped when non-empty
};

constexpr int64_t kRotateBytes = int64_t(256) << 20;

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Device time per call of fn(i), i rotating; median over 5 batches sized to ~target_ms each.
template <class F>
double time_us(CUstream stream, F&& fn, double target_ms) {
  rt::Event a, b;
  for (int i = 0; i < 3; ++i) fn(i);
  a.record(stream);
  fn(3);
  b.record(stream);
  b.synchronize();
  const double one_ms = std::max<double>(rt::Event::elapsed_ms(a, b), 1e-3);
  const int iters = int(std::clamp(target_ms / one_ms, 3.0, 2000.0));
  std::vector<double> samples;
  int k = 4;
  for (int rep = 0; rep < 5; ++rep) {
    a.record(stream);
    for (int i = 0; i < iters; ++i) fn(k++);
    b.record(stream);
    b.synchronize();
    samples.push_back(1000.0 * rt::Event::elapsed_ms(a, b) / iters);
  }
  return median(samples);
}

inline double copy_bandwidth_gbps(CUstream stream) {
  const size_t bytes = size_t(1) << 30;
  rt::DeviceBuffer src(bytes), dst(bytes);
  src.fill(1);
  const rt::Driver& d = rt::driver();
  const double us = time_us(
      stream, [&](int) { rt::check(d.cuMemcpyDtoDAsync(dst.get(), src.get(), bytes, stream), "copy"); }, 300);
  return 2.0 * double(bytes) / (us * 1e3);
}

// One set of buffers for a call.
// n bf16 values (the upper halves of normal(0, 1) floats, truncated) from seed: the benchmarks' input.
inline std::vector<uint16_t> normal_bf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> h(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : h) {
    const float f = nd(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = uint16_t(bits >> 16);
  }
  return h;
}

struct CallSet {
  std::vector<rt::DeviceBuffer> bufs;
  rt::QuantizeCall call;
};

inline CallSet make_set(const rt::Quantizer& q, const Case& c, uint64_t input, int64_t in_bytes,
                 uint64_t offsets) {
  CallSet s;
  s.call.input = rt::TensorView{input, in_bytes, DType::BF16, {}};
  s.call.shape = c.shape;
  s.call.seed = 1234;
  const int members = c.members.empty() ? 1 : int(c.members.size());
  for (const BufferDesc& b : c.members.empty() ? q.outputs(c.shape) : q.grouped_capacity(c.shape, members)) {
    s.bufs.emplace_back(size_t(std::max<int64_t>(b.bytes, 16)));
    s.call.buffers[b.name] = rt::TensorView{s.bufs.back().address(), int64_t(s.bufs.back().size()), std::nullopt, {}};
  }
  for (const BufferDesc& b : q.inputs()) {
    const float one = 1.0f;
    s.bufs.emplace_back(sizeof(float));
    s.bufs.back().upload(&one, sizeof(float));
    s.call.buffers[b.name] = rt::TensorView{s.bufs.back().address(), 4, std::nullopt, {}};
  }
  const int64_t ws = q.workspace_bytes(c.shape, members);
  if (ws > 0) {
    s.bufs.emplace_back(size_t(ws));
    s.call.workspace = rt::TensorView{s.bufs.back().address(), ws, std::nullopt, {}};
  }
  if (!c.members.empty()) {
    s.call.member_rows = offsets;
    s.call.num_members = members;
  }
  return s;
}

// Minimal bytes of one call: input per pass + every output once (exact sizes for this split).
inline int64_t minimal_bytes(const rt::Quantizer& q, const Plan& plan, const Case& c) {
  const int64_t in = c.shape.m * c.shape.k * 2;
  int passes = 1;
  for (const auto& ph : plan.phases)
    if (ph.kind == PhaseKind::AmaxReduce) passes = 2;
  if (q.row_pass(c.shape)) passes = 1;  // the one-pass row kernel
  int64_t out = 0;
  const auto descs = c.members.empty() ? q.outputs(c.shape) : q.grouped_outputs(c.members, c.shape.k);
  for (const auto& b : descs) out += b.bytes;
  return in * passes + out;
}

}  // namespace qf::cli
