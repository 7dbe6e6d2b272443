// The CPU reference executor (see executor.h). It interprets a plan in six steps:
//
//   1. widen the input to fp32 (HostTensor::at);
//   2. build the "value matrices" the plan's amax sources and streams read: X itself, or X with
//      the 16-point RHT applied along M and rounded back to the input dtype (one per sign mask);
//   3. reduce every amax source of the plan (tensor, channel or block scope) in input
//      coordinates;
//   4. derive, per stream, one scale entry per cell of its scale grid (scale_grid()) from the
//      amax of the source that covers the cell: the multiplier applied to the elements and the
//      stored scale bits;
//   5. encode every element of the stream's logical output matrix (output coordinates: [M, K],
//      or [K, M] for a transposed columnwise copy), round-to-nearest or stochastic;
//   6. write the buffers exactly as output_buffers() describes them.
//
// Nothing here depends on which recipe produced the plan.
#include "reference/executor.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <optional>

#include "compiler/error.h"
#include "qforge/layout.cuh"
#include "qforge/numerics.cuh"

namespace qf::ref {
namespace {

// ---------------------------------------------------------------------------------------------
// Scalar helpers
// ---------------------------------------------------------------------------------------------

float round_to_dtype(DType d, float x) {
  switch (d) {
    case DType::BF16: return bf16_to_f32(f32_to_bf16(x));
    case DType::FP16: return f16_to_f32(f32_to_f16(x));
    case DType::FP32: return x;
  }
  return x;
}

// fn(F{}) for the format struct of an encoded (non-identity) format.
template <class Fn>
auto visit_format(ElemFormat f, Fn&& fn) {
  switch (f) {
    case ElemFormat::E4M3: return fn(E4M3{});
    case ElemFormat::E5M2: return fn(E5M2{});
    case ElemFormat::E2M1: return fn(E2M1{});
    case ElemFormat::E2M3: return fn(E2M3{});
    case ElemFormat::E3M2: return fn(E3M2{});
    case ElemFormat::Int8: return fn(Int8{});
    case ElemFormat::Identity: break;
  }
  QF_CHECK(false, "identity is not an encoded format");
}

// One element of a quantized (non-identity) format.
u8 encode_elem(ElemFormat f, float x, bool stochastic, u32 rbits) {
  return visit_format(f, [&](auto fmt) {
    using F = decltype(fmt);
    return stochastic ? encode_sr<F>(x, rbits) : encode_rn<F>(x);
  });
}

void put_f32(uint8_t* p, float v) {
  const u32 b = f32_bits(v);
  p[0] = uint8_t(b), p[1] = uint8_t(b >> 8), p[2] = uint8_t(b >> 16), p[3] = uint8_t(b >> 24);
}
void put_u16(uint8_t* p, u16 v) { p[0] = uint8_t(v), p[1] = uint8_t(v >> 8); }

// ---------------------------------------------------------------------------------------------
// Step 2: value matrices in input coordinates [M, K]
// ---------------------------------------------------------------------------------------------

struct Values {
  Shape2D shape;
  std::vector<float> v;  // row-major [M, K]
  float at(int64_t m, int64_t k) const { return v[size_t(m * shape.k + k)]; }
};

Values widen(const HostTensor& x, int64_t row0, int64_t rows) {
  Values out;
  out.shape = {rows, x.shape.k};
  out.v.resize(size_t(rows * x.shape.k));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < x.shape.k; ++k) out.v[size_t(m * x.shape.k + k)] = x.at(row0 + m, k);
  return out;
}

// RHT along M in groups of 16 (M % 16 == 0, checked by check_shape), rounded to the input dtype.
Values rotate(const Values& x, const Rht& rht, DType input) {
  Values y = x;
  const int64_t M = x.shape.m, K = x.shape.k;
  QF_CHECK(M % 16 == 0, "RHT needs M % 16 == 0");
  float g[16];
  for (int64_t m0 = 0; m0 < M; m0 += 16)
    for (int64_t k = 0; k < K; ++k) {
      for (int i = 0; i < 16; ++i) g[i] = x.at(m0 + i, k);
      rht16(g, rht.sign_mask);
      for (int i = 0; i < 16; ++i) y.v[size_t((m0 + i) * K + k)] = round_to_dtype(input, g[i]);
    }
  return y;
}

// The raw values and every RHT variant the plan asks for.
class ValueSet {
 public:
  ValueSet(Values raw, DType input) : raw_(std::move(raw)), input_(input) {}
  const Values& get(const std::optional<Rht>& rht) {
    if (!rht) return raw_;
    for (auto& [mask, vals] : rotated_)
      if (mask == rht->sign_mask) return vals;
    rotated_.emplace_back(rht->sign_mask, rotate(raw_, *rht, input_));
    return rotated_.back().second;
  }

 private:
  Values raw_;
  DType input_;
  std::vector<std::pair<u32, Values>> rotated_;
};

// ---------------------------------------------------------------------------------------------
// Step 3: amax sources, reduced in input coordinates
// ---------------------------------------------------------------------------------------------

// A grid of amaxes over [M, K]: cell (i, j) covers rows [i*br, (i+1)*br) and columns
// [j*bc, (j+1)*bc), clipped at the edges (ragged cells use the elements that exist).
struct AmaxGrid {
  int64_t br = 1, bc = 1, rows = 0, cols = 0;
  std::vector<float> v;
  float at_elem(int64_t m, int64_t k) const { return v[size_t((m / br) * cols + k / bc)]; }
};

AmaxGrid reduce_amax(const AmaxSource& a, const Values& x) {
  const int64_t M = x.shape.m, K = x.shape.k;
  AmaxGrid g;
  switch (a.scope) {
    case AmaxScope::Tensor: g.br = M, g.bc = K; break;
    case AmaxScope::Channel:
      if (a.channel_dir == Direction::Rowwise)
        g.br = 1, g.bc = K;  // one per row of X
      else
        g.br = M, g.bc = 1;  // one per column of X
      break;
    case AmaxScope::Block: g.br = a.block.rows, g.bc = a.block.cols; break;
    case AmaxScope::None: QF_CHECK(false, "amax source without scope");
  }
  g.br = std::max<int64_t>(g.br, 1), g.bc = std::max<int64_t>(g.bc, 1);
  // At least one cell each way, so that an empty (grouped member) tensor still has a tensor /
  // channel amax of +0 to derive its scales from.
  g.rows = std::max<int64_t>(1, int64_t(ceil_div(u64(M), u64(g.br))));
  g.cols = std::max<int64_t>(1, int64_t(ceil_div(u64(K), u64(g.bc))));
  g.v.assign(size_t(g.rows * g.cols), 0.0f);  // +0
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      float& acc = g.v[size_t((m / g.br) * g.cols + k / g.bc)];
      acc = amax_step(acc, x.at(m, k));
    }
  return g;
}

// ---------------------------------------------------------------------------------------------
// Step 4: scales, one entry per cell of the stream's scale grid
// ---------------------------------------------------------------------------------------------

struct StreamScales {
  ScaleGrid grid;
  std::vector<float> mult;    // element multiplier per logical entry [rows * cols]
  std::vector<float> f32;     // stored fp32 scale (F32 storage)
  std::vector<u8> bits;       // stored scale byte (E8M0 / E4M3 storage)
};

struct Context {
  const Plan& plan;
  Shape2D shape;                  // of this (member) tensor
  std::vector<AmaxGrid> amax;     // per plan amax source
  const QuantizeParams& params;
};

// Input coordinates of data-layout element (r, c).
inline void to_input(const Stream& s, int64_t r, int64_t c, int64_t& m, int64_t& k) {
  if (s.layout == DataLayout::Transposed)
    m = c, k = r;
  else
    m = r, k = c;
}

float tensor_amax(const Context& cx, const Stream& s) {
  QF_CHECK(s.tensor_amax >= 0, "stream without tensor amax");
  return cx.amax[size_t(s.tensor_amax)].v[0];
}

float delayed_scale(const Context& cx, const Stream& s) {
  const std::string n = scale_input_name(cx.plan, s);
  auto it = cx.params.scales.find(n);
  if (it == cx.params.scales.end())
    throw UserError("scales", "delayed scaling of the " + std::string(name(s.dir)) +
                                  " stream needs the scale input \"" + n + "\", which was not given");
  return it->second;
}

StreamScales compute_scales(const Context& cx, const Stream& s) {
  StreamScales sc;
  sc.grid = scale_grid(s, cx.shape);
  const ScaleGrid& g = sc.grid;
  const size_t n = size_t(g.rows * g.cols);
  sc.mult.assign(n, 1.0f);
  sc.f32.assign(n, 1.0f);
  sc.bits.assign(n, 0);
  if (n == 0) return sc;
  const float fmax = traits(s.format).max_finite;

  // The local (channel / block) amax covering entry (gr, gc): the one of its first element.
  auto local_amax = [&](int64_t gr, int64_t gc) {
    QF_CHECK(s.local_amax >= 0, "stream without local amax");
    int64_t m, k;
    to_input(s, gr * g.block_rows, gc * g.block_cols, m, k);
    return cx.amax[size_t(s.local_amax)].at_elem(m, k);
  };
  auto each_entry = [&](auto&& fn) {
    for (int64_t gr = 0; gr < g.rows; ++gr)
      for (int64_t gc = 0; gc < g.cols; ++gc) fn(size_t(gr * g.cols + gc), gr, gc);
  };

  std::visit(
      [&](const auto& mode) {
        using M = std::decay_t<decltype(mode)>;
        if constexpr (std::is_same_v<M, NoScaling>) {
          // identity: no scale
        } else if constexpr (std::is_same_v<M, PerTensorCurrent>) {
          const float scale = compute_scale(tensor_amax(cx, s), fmax, mode.epsilon, mode.pow2, kFltMax);
          sc.mult[0] = scale;
          sc.f32[0] = 1.0f / scale;
        } else if constexpr (std::is_same_v<M, PerTensorDelayed>) {
          const float scale = delayed_scale(cx, s);
          sc.mult[0] = scale;
          sc.f32[0] = 1.0f / scale;
        } else if constexpr (std::is_same_v<M, PerChannel>) {
          const int code = traits(cx.plan.input).numerics_code;
          const bool integer = traits(s.format).is_int;
          each_entry([&](size_t i, int64_t gr, int64_t gc) {
            if (integer) {  // torchao: scale = amax / 127 in the input dtype, stored as is
              const float scale = int8_channel_scale(local_amax(gr, gc), code);
              sc.mult[i] = int8_channel_multiplier(scale);
              sc.f32[i] = scale;
            } else {  // fp8: current scaling's rule per channel, scale_inv stored
              const float scale = compute_scale(local_amax(gr, gc), fmax, mode.epsilon, mode.pow2, kFltMax);
              sc.mult[i] = scale;
              sc.f32[i] = 1.0f / scale;
            }
          });
        } else if constexpr (std::is_same_v<M, BlockScaling>) {
          const float inf_value = traits(cx.plan.input).max_finite;
          each_entry([&](size_t i, int64_t gr, int64_t gc) {
            const float scale = compute_scale(local_amax(gr, gc), fmax, mode.epsilon, mode.pow2, inf_value);
            sc.mult[i] = scale;
            sc.f32[i] = 1.0f / scale;
          });
        } else if constexpr (std::is_same_v<M, MxScaling>) {
          const float inv_fmax = 1.0f / fmax;
          const int emax = traits(s.format).emax;
          each_entry([&](size_t i, int64_t gr, int64_t gc) {
            const float a = local_amax(gr, gc);
            const u8 e = mode.rule == MxRule::RCeil ? e8m0_rceil(a * inv_fmax) : e8m0_floor(a, emax);
            sc.bits[i] = e;
            sc.mult[i] = mx_multiplier(e);
          });
        } else if constexpr (std::is_same_v<M, Nvfp4Scaling>) {
          const float s_enc = nvfp4_global_encode_scale(tensor_amax(cx, s));
          const float s_dec = nvfp4_global_decode_scale(s_enc);
          each_entry([&](size_t i, int64_t gr, int64_t gc) {
            const u8 b = nvfp4_block_scale(local_amax(gr, gc), s_enc);
            sc.bits[i] = b;
            sc.mult[i] = nvfp4_element_multiplier(b, s_dec);
          });
        }
      },
      s.scaling);
  return sc;
}

// ---------------------------------------------------------------------------------------------
// Steps 5 + 6: encode a stream and write its buffers
// ---------------------------------------------------------------------------------------------

void write_data(const Context& cx, const Stream& s, const Values& vals,
                const StreamScales& sc, uint64_t sr_index_offset, std::vector<uint8_t>& out) {
  const Shape2D d = data_shape(s, cx.shape);
  const ScaleGrid& g = sc.grid;
  const bool identity = s.format == ElemFormat::Identity;
  const bool sr = s.rounding == Rounding::Stochastic;
  const u32 stream_id = s.dir == Direction::Rowwise ? 0u : 1u;
  const int per_byte = identity ? 1 : traits(s.format).elems_per_byte;
  const int out_bytes = identity ? traits(s.out_dtype).bytes : 1;

  // Stochastic rounding: elements per group of random words and an element's bits from its
  // group's words (numerics.cuh, sr_group_elems / sr_pick of the stream's format).
  const u64 group_elems = sr ? visit_format(s.format, [](auto fmt) { return u64(sr_group_elems<decltype(fmt)>()); }) : 1;
  u32 (*const pick)(const u32*, u64) = sr ? visit_format(s.format, [](auto fmt) { return &sr_pick<decltype(fmt)>; }) : nullptr;
  u64 cached_group = ~u64(0);
  u32 words[4] = {0, 0, 0, 0};
  for (int64_t r = 0; r < d.m; ++r)
    for (int64_t c = 0; c < d.k; ++c) {
      int64_t m, k;
      to_input(s, r, c, m, k);
      const float x = vals.at(m, k);
      if (identity) {
        uint8_t* p = &out[size_t((r * d.k + c) * out_bytes)];
        switch (s.out_dtype) {
          case DType::FP32: put_f32(p, x); break;
          case DType::BF16: put_u16(p, f32_to_bf16(x)); break;
          case DType::FP16: put_u16(p, f32_to_f16(x)); break;
        }
        continue;
      }
      const float mult = sc.mult[size_t((r / g.block_rows) * g.cols + c / g.block_cols)];
      u32 rbits = 0;
      if (sr) {
        const u64 l = sr_index_offset + u64(r * d.k + c);
        if (l / group_elems != cached_group) {
          cached_group = l / group_elems;
          sr_random_group(cx.params.seed, cx.params.offset, stream_id, cached_group, words);
        }
        rbits = pick(words, l);
      }
      const u8 q = encode_elem(s.format, x * mult, sr, rbits);
      if (per_byte == 2) {
        uint8_t& b = out[size_t(r * (d.k / 2) + c / 2)];
        b = (c & 1) ? uint8_t((b & 0x0F) | ((q & 0x0F) << 4)) : uint8_t((b & 0xF0) | (q & 0x0F));
      } else {
        out[size_t(r * d.k + c)] = q;
      }
    }
}

void write_scales(const Stream& s, const StreamScales& sc, std::vector<uint8_t>& out) {
  const ScaleGrid& g = sc.grid;
  const ScaleStorage st = traits(s.scaling).scale_storage;
  for (int64_t gr = 0; gr < g.rows; ++gr)
    for (int64_t gc = 0; gc < g.cols; ++gc) {
      const size_t i = size_t(gr * g.cols + gc);
      const int64_t off = g.offset(gr, gc);
      if (st == ScaleStorage::F32)
        put_f32(&out[size_t(off * 4)], sc.f32[i]);
      else
        out[size_t(off)] = sc.bits[i];
    }
}

// Quantizes rows [row0, row0 + shape.m) of x as one tensor. sr_offsets[i]: the SR linear index
// of stream i's first element. shape.m may be 0 (an empty grouped member).
std::vector<Output> quantize_rows(const Plan& plan, const HostTensor& x, int64_t row0, Shape2D shape,
                                  const QuantizeParams& params, const std::vector<uint64_t>& sr_offsets) {
  std::vector<Output> outs;
  for (auto& desc : output_buffers(plan, shape)) {
    Output o;
    o.bytes.assign(size_t(desc.bytes), 0);
    o.desc = std::move(desc);
    outs.push_back(std::move(o));
  }

  ValueSet values(widen(x, row0, shape.m), plan.input);
  Context cx{plan, shape, {}, params};
  for (const auto& a : plan.amax) cx.amax.push_back(reduce_amax(a, values.get(a.rht)));

  std::vector<StreamScales> scales;
  for (const auto& s : plan.streams) scales.push_back(compute_scales(cx, s));

  size_t next_tensor_amax = 0;
  for (auto& o : outs) {
    switch (o.desc.kind) {
      case BufferKind::Data: {
        const Stream& s = plan.streams[size_t(o.desc.stream)];
        write_data(cx, s, values.get(s.rht), scales[size_t(o.desc.stream)],
                   sr_offsets[size_t(o.desc.stream)], o.bytes);
        break;
      }
      case BufferKind::ScaleInv:
        write_scales(plan.streams[size_t(o.desc.stream)], scales[size_t(o.desc.stream)], o.bytes);
        break;
      case BufferKind::Amax: {
        // output_buffers lists the tensor-scope sources in plan order.
        while (next_tensor_amax < plan.amax.size() && plan.amax[next_tensor_amax].scope != AmaxScope::Tensor)
          ++next_tensor_amax;
        QF_CHECK(next_tensor_amax < plan.amax.size(), "amax output without a tensor source");
        put_f32(o.bytes.data(), cx.amax[next_tensor_amax].v.empty() ? 0.0f : cx.amax[next_tensor_amax].v[0]);
        ++next_tensor_amax;
        break;
      }
      case BufferKind::Scale: QF_CHECK(false, "scale inputs are not outputs");
    }
  }
  return outs;
}

void check_input(const Plan& plan, const HostTensor& x) {
  if (x.dtype != plan.input)
    throw UserError("x", "the plan quantizes " + std::string(traits(plan.input).name) + " input, got " +
                             std::string(traits(x.dtype).name));
  if (x.shape.m < 0 || x.shape.k < 0 ||
      x.bytes.size() != size_t(x.shape.m * x.shape.k * traits(x.dtype).bytes))
    throw UserError("x", "expected " + std::to_string(x.shape.m) + " x " + std::to_string(x.shape.k) + " " +
                             std::string(traits(x.dtype).name) + " elements (" +
                             std::to_string(x.shape.m * x.shape.k * traits(x.dtype).bytes) +
                             " bytes), got " + std::to_string(x.bytes.size()) + " bytes");
}

}  // namespace

float HostTensor::at(int64_t r, int64_t c) const {
  const size_t i = size_t(r * shape.k + c);
  switch (dtype) {
    case DType::FP32: {
      u32 b;
      std::memcpy(&b, &bytes[i * 4], 4);  // little-endian host
      return f32_from_bits(b);
    }
    case DType::BF16: return bf16_to_f32(u16(bytes[i * 2] | (bytes[i * 2 + 1] << 8)));
    case DType::FP16: return f16_to_f32(u16(bytes[i * 2] | (bytes[i * 2 + 1] << 8)));
  }
  return 0.0f;
}

std::vector<Output> quantize(const Plan& plan, const HostTensor& x, const QuantizeParams& params) {
  check_input(plan, x);
  check_shape(plan, x.shape);
  return quantize_rows(plan, x, 0, x.shape, params, std::vector<uint64_t>(plan.streams.size(), 0));
}

std::vector<Output> quantize_grouped(const Plan& plan, const HostTensor& x, std::span<const int64_t> m_splits,
                                     const QuantizeParams& params) {
  check_input(plan, x);
  int64_t total = 0;
  for (size_t i = 0; i < m_splits.size(); ++i) {
    if (m_splits[i] < 0)
      throw UserError("m_splits", "member " + std::to_string(i) + " has a negative size (" +
                                      std::to_string(m_splits[i]) + ")");
    total += m_splits[i];
  }
  if (total != x.shape.m)
    throw UserError("m_splits", "the member sizes add up to " + std::to_string(total) +
                                    " rows, but the tensor has " + std::to_string(x.shape.m));
  check_grouped_shape(plan, x.shape);  // K's rules and the extent's bounds, also with no rows at all
  for (int64_t m : m_splits)
    if (m > 0) check_shape(plan, {m, x.shape.k});

  // The concatenation starts from the descriptors of the whole tensor (names, kinds, dtypes),
  // with empty contents.
  std::vector<Output> outs;
  for (auto& desc : output_buffers(plan, {0, x.shape.k})) {
    Output o;
    o.desc = std::move(desc);
    o.desc.shape.clear();
    o.desc.bytes = 0;
    outs.push_back(std::move(o));
  }
  // Trailing dims of every member's buffer, to decide between stacking and flattening.
  std::vector<std::optional<std::vector<int64_t>>> trailing(outs.size());
  std::vector<bool> flat(outs.size(), false);
  std::vector<int64_t> stacked(outs.size(), 0), elems(outs.size(), 0);

  std::vector<uint64_t> sr_offsets(plan.streams.size(), 0);
  int64_t row0 = 0;
  for (int64_t m : m_splits) {
    const Shape2D shape{m, x.shape.k};
    std::vector<Output> member = quantize_rows(plan, x, row0, shape, params, sr_offsets);
    QF_CHECK(member.size() == outs.size(), "member buffers match the grouped buffers");
    for (size_t b = 0; b < outs.size(); ++b) {
      const auto& md = member[b].desc;
      QF_CHECK(md.name == outs[b].desc.name, "member buffer order");
      outs[b].bytes.insert(outs[b].bytes.end(), member[b].bytes.begin(), member[b].bytes.end());
      outs[b].desc.bytes += md.bytes;
      std::vector<int64_t> tail(md.shape.begin() + 1, md.shape.end());
      int64_t n = 1;
      for (int64_t v : md.shape) n *= v;
      elems[b] += n;
      if (n == 0) continue;  // an empty member's buffer ([0, K] or [K, 0]) adds nothing
      stacked[b] += md.shape[0];
      if (!trailing[b])
        trailing[b] = tail;
      else if (*trailing[b] != tail)
        flat[b] = true;
    }
    for (size_t i = 0; i < plan.streams.size(); ++i) {
      const Shape2D d = data_shape(plan.streams[i], shape);
      sr_offsets[i] += uint64_t(d.m * d.k);
    }
    row0 += m;
  }
  for (size_t b = 0; b < outs.size(); ++b) {
    auto& shape = outs[b].desc.shape;
    if (flat[b] || !trailing[b]) {
      shape = {elems[b]};
    } else {
      shape = {stacked[b]};
      shape.insert(shape.end(), trailing[b]->begin(), trailing[b]->end());
    }
  }
  return outs;
}

void update_amax_history(std::span<float> history, float amax, float& scale, const PerTensorDelayed& mode,
                         ElemFormat format) {
  if (history.empty()) return;
  for (size_t i = history.size() - 1; i > 0; --i) history[i] = history[i - 1];
  history[0] = amax;
  float a = history[0];
  if (mode.amax_compute == AmaxCompute::Max) {
    a = 0.0f;
    for (float h : history) a = fmaxf(a, h);
  }
  if (f32_is_finite(a) && a > 0.0f) scale = (traits(format).max_finite / a) * exp2i(-mode.margin);
}

}  // namespace qf::ref
