#include "compiler/ir.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "compiler/error.h"

namespace qf {
namespace {

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%04X", v);
  return buf;
}

std::string fmt_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", double(v));
  return buf;
}

std::string block_str(BlockShape b) {
  return std::to_string(b.rows) + "x" + std::to_string(b.cols);
}

std::string scaling_str(const Scaling& s) {
  std::ostringstream os;
  os << scaling_name(s);
  std::visit(
      [&](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, PerTensorCurrent>)
          os << "(eps=" << fmt_float(m.epsilon) << ", pow2=" << (m.pow2 ? "true" : "false") << ")";
        if constexpr (std::is_same_v<M, PerChannel>)  // fp8 options; int8 (torchao's rule) takes none
          if (m.epsilon != 0.0f || m.pow2)
            os << "(eps=" << fmt_float(m.epsilon) << ", pow2=" << (m.pow2 ? "true" : "false") << ")";
        if constexpr (std::is_same_v<M, PerTensorDelayed>)
          os << "(margin=" << m.margin << ", history=" << m.history_length
             << ", amax_compute=" << name(m.amax_compute) << ")";
        if constexpr (std::is_same_v<M, BlockScaling>)
          os << "(block=" << block_str(m.block) << ", eps=" << fmt_float(m.epsilon)
             << ", pow2=" << (m.pow2 ? "true" : "false") << ")";
        if constexpr (std::is_same_v<M, MxScaling>)
          os << "(block=" << block_str(m.block) << ", rule=" << name(m.rule) << ")";
        if constexpr (std::is_same_v<M, Nvfp4Scaling>) os << "(block=" << block_str(m.block) << ")";
      },
      s);
  return os.str();
}

std::string amax_str(const AmaxSource& a) {
  std::string s;
  switch (a.scope) {
    case AmaxScope::Tensor: s = "tensor"; break;
    case AmaxScope::Channel: s = a.channel_dir == Direction::Rowwise ? "channel(per row)" : "channel(per column)"; break;
    case AmaxScope::Block: s = "block(" + block_str(a.block) + ")"; break;
    case AmaxScope::None: s = "none"; break;
  }
  s += " max|x|";
  if (a.rht) s += " after rht(" + hex(a.rht->sign_mask) + ")";
  s += a.before_cast ? " [before cast]" : " [during cast]";
  return s;
}

}  // namespace

Stream make_stream(Direction dir, const DirectionSpec& spec, DType input,
                   std::vector<AmaxSource>& amax) {
  Stream s;
  s.dir = dir;
  s.format = spec.format;
  s.scaling = spec.scaling;
  s.rounding = spec.rounding;
  s.rht = spec.rht;
  s.layout = spec.layout;
  s.scale_layout = spec.scale_layout;
  s.out_dtype = spec.out_dtype.value_or(input);
  QF_CHECK(!(dir == Direction::Rowwise && s.layout == DataLayout::Transposed), "rowwise data is never transposed");
  QF_CHECK(!(dir == Direction::Rowwise && s.rht), "RHT is columnwise only");

  const ScalingTraits& t = traits(s.scaling);
  if (needs_tensor_amax(s.scaling)) {
    AmaxSource a;
    a.scope = AmaxScope::Tensor;
    a.rht = s.rht;
    // NVFP4's global scale and current scaling need the amax first; delayed scaling only
    // reports it.
    a.before_cast = t.amax_before_cast || std::holds_alternative<Nvfp4Scaling>(s.scaling);
    s.tensor_amax = int(amax.size());
    amax.push_back(a);
  }
  if (t.amax_scope == AmaxScope::Block) {
    AmaxSource a;
    a.scope = AmaxScope::Block;
    a.block = *block_of(s.scaling);
    a.rht = s.rht;
    s.local_amax = int(amax.size());
    amax.push_back(a);
  } else if (t.amax_scope == AmaxScope::Channel) {
    AmaxSource a;
    a.scope = AmaxScope::Channel;
    a.channel_dir = dir;
    a.before_cast = true;
    s.local_amax = int(amax.size());
    amax.push_back(a);
  }
  return s;
}

void verify(const Plan& p) {
  QF_CHECK(!p.streams.empty(), "a plan has at least one stream");
  QF_CHECK(p.streams.size() <= 2, "a plan has at most two streams");
  if (p.streams.size() == 2)
    QF_CHECK(p.streams[0].dir == Direction::Rowwise && p.streams[1].dir == Direction::Columnwise,
             "streams are ordered rowwise, columnwise");
  std::vector<int> used(p.amax.size(), 0);
  for (const auto& s : p.streams) {
    const auto& t = traits(s.scaling);
    QF_CHECK(std::find(t.formats.begin(), t.formats.end(), s.format) != t.formats.end(),
             "format ", traits(s.format).name, " not allowed with ", t.name);
    QF_CHECK(!(s.rounding == Rounding::Stochastic && !traits(s.format).stochastic_rounding_ok),
             "SR on ", traits(s.format).name);
    QF_CHECK(!(s.rht && s.dir == Direction::Rowwise), "RHT on a rowwise stream");
    QF_CHECK(!(s.dir == Direction::Rowwise && s.layout == DataLayout::Transposed), "transposed rowwise");
    QF_CHECK(s.scale_layout != ScaleLayout::Swizzled || t.swizzle_ok, "swizzled scales of ", t.name);
    if (s.scale_layout == ScaleLayout::MnMajor) {
      const auto b = block_of(s.scaling);
      QF_CHECK(t.mn_major_ok && b && !b->is_2d() && (s.dir == Direction::Rowwise || s.layout == DataLayout::Transposed),
               "mn_major scales are of 1D blocks of K-major data (", t.name, ")");
    }
    QF_CHECK(needs_tensor_amax(s.scaling) == (s.tensor_amax >= 0), "tensor amax wiring");
    const bool wants_local = t.amax_scope == AmaxScope::Block || t.amax_scope == AmaxScope::Channel;
    QF_CHECK(wants_local == (s.local_amax >= 0), "local amax wiring");
    if (s.tensor_amax >= 0) {
      QF_CHECK(s.tensor_amax < int(p.amax.size()), "tensor amax index");
      const auto& a = p.amax[s.tensor_amax];
      QF_CHECK(a.scope == AmaxScope::Tensor, "tensor amax has tensor scope");
      QF_CHECK(a.rht == s.rht, "tensor amax is over the values the stream casts");
      // Current scaling and NVFP4's global scale read the tensor amax before any element is cast.
      if (t.amax_before_cast || std::holds_alternative<Nvfp4Scaling>(s.scaling))
        QF_CHECK(a.before_cast, "tensor amax ", s.tensor_amax, " is needed before the cast");
      used[s.tensor_amax]++;
    }
    if (s.local_amax >= 0) {
      QF_CHECK(s.local_amax < int(p.amax.size()), "local amax index");
      const auto& a = p.amax[s.local_amax];
      QF_CHECK(a.scope == t.amax_scope, "local amax scope");
      if (a.scope == AmaxScope::Block) {
        QF_CHECK(a.block == *block_of(s.scaling), "block amax has the stream's block");
        QF_CHECK(a.rht == s.rht, "block amax is over the values the stream casts");
      }
      if (a.scope == AmaxScope::Channel)
        QF_CHECK(a.before_cast && a.channel_dir == s.dir, "channel amax ", s.local_amax,
                 " runs along the stream's direction and is needed before the cast");
      used[s.local_amax]++;
    }
  }
  for (size_t i = 0; i < used.size(); ++i) QF_CHECK(used[i] > 0, "amax source ", i, " is unused");
  for (size_t i = 0; i < p.amax.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      QF_CHECK(!(p.amax[i] == p.amax[j]) || p.phases.empty(),
               "identical amax sources ", j, " and ", i, " survived sharing");
  if (!p.phases.empty()) {
    QF_CHECK(p.phases.back().kind == PhaseKind::Cast, "the last phase is the cast");
    std::vector<int> reduced(p.amax.size(), 0);
    for (size_t k = 0; k + 1 < p.phases.size(); ++k) {
      QF_CHECK(p.phases[k].kind == PhaseKind::AmaxReduce, "only the last phase casts");
      for (int a : p.phases[k].amax) {
        QF_CHECK(a >= 0 && a < int(p.amax.size()), "phase amax index");
        reduced[a]++;
      }
    }
    for (size_t i = 0; i < p.amax.size(); ++i)
      QF_CHECK(reduced[i] == (p.amax[i].before_cast ? 1 : 0),
               "amax source ", i, " is reduced before the cast iff it is needed before the cast");
  }
  if (p.tile.rows) {
    QF_CHECK(p.tile.threads > 0 && p.tile.vec > 0 && p.tile.cols > 0, "tile is complete");
    QF_CHECK(p.tile.min_blocks_fit(), "min_blocks ", p.tile.min_blocks,
             " CTAs of ", p.tile.threads, " threads fit an SM");
    for (const auto& a : p.amax)
      if (a.scope == AmaxScope::Block)
        QF_CHECK(p.tile.rows % a.block.rows == 0 && p.tile.cols % a.block.cols == 0,
                 "tile ", p.tile.rows, "x", p.tile.cols, " is a multiple of block ", a.block.rows, "x", a.block.cols);
    for (const auto& s : p.streams)
      if (s.rht) QF_CHECK(p.tile.rows % 16 == 0, "RHT groups of 16 along M fit the tile");
  }
}

std::string amax_output_name(const Plan& p, int idx) {
  int users = 0;
  const Stream* user = nullptr;
  for (const auto& s : p.streams)
    if (s.tensor_amax == idx) ++users, user = &s;
  if (users == 1) return std::string(name(user->dir)) + "_amax";
  return "amax";
}

std::string scale_input_name(const Plan& p, const Stream& s) {
  QF_CHECK(std::holds_alternative<PerTensorDelayed>(s.scaling), "scale inputs are for delayed scaling");
  for (const auto& o : p.streams)
    if (&o != &s && o.tensor_amax == s.tensor_amax && o.format == s.format && o.scaling == s.scaling)
      return "scale";
  return std::string(name(s.dir)) + "_scale";
}

std::string print(const Plan& p) {
  std::ostringstream os;
  os << "plan recipe=" << p.recipe << " role=" << p.role << " input=" << traits(p.input).name
     << " usage=" << name(p.usage) << (p.grouped ? " grouped" : "") << "\n";
  for (size_t i = 0; i < p.amax.size(); ++i) os << "  %a" << i << " = " << amax_str(p.amax[i]) << "\n";
  for (const auto& s : p.streams) {
    os << "  stream " << name(s.dir) << ": " << traits(s.format).name;
    if (s.format == ElemFormat::Identity) os << "(" << traits(s.out_dtype).name << ")";
    os << " scaling=" << scaling_str(s.scaling);
    if (s.rounding == Rounding::Stochastic) os << " rounding=stochastic";
    if (s.rht) os << " rht=" << hex(s.rht->sign_mask);
    if (s.dir == Direction::Columnwise) os << " layout=" << name(s.layout);
    if (traits(s.scaling).swizzle_ok || s.scale_layout != ScaleLayout::Compact) os << " scale_layout=" << name(s.scale_layout);
    if (s.tensor_amax >= 0) os << " tensor_amax=%a" << s.tensor_amax;
    if (s.local_amax >= 0) os << " local_amax=%a" << s.local_amax;
    os << "\n";
  }
  for (size_t k = 0; k < p.phases.size(); ++k) {
    const auto& ph = p.phases[k];
    os << "  phase " << k << ": ";
    if (ph.kind == PhaseKind::AmaxReduce) {
      os << "amax_reduce";
      for (int a : ph.amax) os << " %a" << a;
    } else {
      os << "cast";
      if (p.tile.rows)
        os << " tile=" << p.tile.rows << "x" << p.tile.cols << " threads=" << p.tile.threads
           << " vec=" << p.tile.vec;
      if (p.tile.min_blocks) os << " min_blocks=" << p.tile.min_blocks;
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace qf
