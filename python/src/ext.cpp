// qforge._C: the compiled core of the Python package (nanobind over the C++ API).
//
// Torch-independent: tensors cross as device addresses (ints), so this builds and its host-side
// half is tested without torch or a GPU. What a call needs beyond the addresses is computed once
// and kept: a Quantizer's Layout per (shape, members) holds every output's place in one flat
// allocation and a prebuilt QuantizeCall whose pointers a call only rebases; a GemmPlan holds
// the GEMM (fused, or a dequant route for mixed formats and same-layout copies), its operands'
// places in their layouts and a device copy of its group offsets. Error text is built only when a
// check fails.
// The torch layer (python/qforge/torch) allocates with torch's caching allocator and passes
// torch's current stream.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "compiler/buffers.h"
#include "compiler/error.h"
#include "compiler/gemm_codegen.h"
#include "compiler/gemm_operands.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "reference/dequantize.h"
#include "reference/executor.h"
#include "runtime/dequantize.h"
#include "runtime/driver.h"
#include "runtime/gemm.h"
#include "runtime/log.h"
#include "runtime/quantizer.h"
#include "runtime/tensor_map_cache.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace qf::py {

namespace {

// Buffers in one allocation start at multiples of this (TMA and vector loads want 16; a GEMM
// scale grid 16; 256 keeps every buffer on its own cache lines).
constexpr int64_t kAlign = 256;
int64_t align_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

DType parse_dtype_arg(const std::string& s, const char* arg) {
  if (auto d = qf::parse_dtype(s)) return *d;
  throw UserError(arg, "expected bf16, fp16 or fp32, got \"" + s + "\"");
}

// The device's primary context for a call's ScopedContext (which switches only when another
// context is current: one cuCtxGetCurrent otherwise). rt::primary_context retains it once and keeps
// it for the life of the process, so its handle is remembered here per device and a call takes no
// lock for it.
CUcontext primary_ctx(int device) {
  constexpr int kKnown = 64;
  static std::atomic<CUcontext> known[kKnown] = {};
  if (device < 0 || device >= kKnown) return rt::primary_context(device)->get();
  if (CUcontext c = known[device].load(std::memory_order_acquire)) return c;
  const CUcontext c = rt::primary_context(device)->get();
  known[device].store(c, std::memory_order_release);
  return c;
}

// ------------------------------------------------------------------------------ layouts

struct BufferSlot {
  BufferDesc desc;
  int64_t offset = 0;    // bytes from the allocation's base
  int64_t reserved = 0;  // bytes kept for it (>= desc.bytes): an mn_major grid gets the 3 extra
                         // rows per group that a GEMM's bound on grouped grids counts
};

// Where one quantize call's outputs live in one allocation, and the call prebuilt around them.
struct Layout {
  Shape2D shape;              // [M, K] (grouped: all members' rows)
  int members = 0;            // 0: a single tensor; grouped: the member count (split on the device)
  std::vector<BufferSlot> buffers;
  int64_t workspace_offset = 0, workspace_bytes = 0;
  int64_t nbytes = 0;
  // The call with every buffer's ptr relative to base 0; quantize() rebases a copy under mu.
  mutable std::mutex mu;
  mutable rt::QuantizeCall call;
  std::vector<std::string> input_names;  // delayed scaling's scale inputs, in Quantizer::inputs() order
  // call.buffers' entries (std::map nodes: their addresses stay), so that a call rebases without
  // looking names up: each output's, in `buffers` order, and the first two scale inputs'.
  std::vector<rt::TensorView*> out_views, input_views;
  int amax_slot = -1;  // the one per-tensor amax output (delayed scaling's), or -1: none or several

  int index(const std::string& name) const {
    for (size_t i = 0; i < buffers.size(); ++i)
      if (buffers[i].desc.name == name) return int(i);
    return -1;
  }
  const BufferSlot& slot(const std::string& name) const {
    const int i = index(name);
    if (i < 0) throw UserError("buffer", "the layout has no buffer \"" + name + "\"");
    return buffers[size_t(i)];
  }
};

std::shared_ptr<Layout> make_layout(const rt::Quantizer& q, std::vector<BufferDesc> bufs, Shape2D shape, int members,
                                    int64_t workspace) {
  auto L = std::make_shared<Layout>();
  L->shape = shape;
  L->members = members;
  int64_t at = 0;
  for (auto& b : bufs) {
    // mn_major grids: the 3 padding rows per group a GEMM's bound counts. Grouped scale grids: the
    // bound a grouped GEMM checks per group (a partial block and padding per member; GroupedGemmPlan
    // verifies it against this).
    int64_t extra = b.scale_layout == "mn_major" ? 3 * b.shape[0] * storage_bytes(b.storage) : 0;
    if (members > 0 && b.kind == BufferKind::ScaleInv)
      extra += 4 * int64_t(members + 1) * *std::max_element(b.shape.begin(), b.shape.end()) * storage_bytes(b.storage);
    L->buffers.push_back(BufferSlot{std::move(b), at, 0});
    L->buffers.back().reserved = L->buffers.back().desc.bytes + extra;
    at = align_up(at + L->buffers.back().reserved);
  }
  L->workspace_offset = at;
  L->workspace_bytes = workspace;
  L->nbytes = std::max<int64_t>(at + workspace, 1);
  L->call.shape = shape;
  L->call.num_members = members;
  for (const auto& s : L->buffers) L->call.buffers[s.desc.name] = rt::TensorView{uint64_t(s.offset), s.desc.bytes, {}, {}};
  if (workspace) L->call.workspace = rt::TensorView{uint64_t(L->workspace_offset), workspace, {}, {}};
  for (const auto& in : q.inputs()) L->input_names.push_back(in.name);
  for (const auto& s : L->buffers) L->out_views.push_back(&L->call.buffers[s.desc.name]);
  for (size_t i = 0; i < L->input_names.size() && i < 2; ++i) L->input_views.push_back(&L->call.buffers[L->input_names[i]]);
  for (size_t i = 0; i < L->buffers.size(); ++i)
    if (L->buffers[i].desc.kind == BufferKind::Amax) L->amax_slot = L->amax_slot == -1 ? int(i) : -2;
  if (L->amax_slot < 0) L->amax_slot = -1;
  return L;
}

// ------------------------------------------------------------------------------ quantizer

struct StreamInfo {  // what Python sees of a plan stream
  int index;
  std::string direction, format, scaling, layout, scale_layout, scale_dtype;
  bool rht, stochastic;
  std::string data_dtype;  // identity: bf16 / fp16 / fp32; else the format
};

class QuantizerBinding {
 public:
  QuantizerBinding(Plan plan) : q_(std::make_shared<rt::Quantizer>(std::move(plan))) {}

  const Plan& plan() const { return q_->plan(); }

  std::shared_ptr<Layout> layout(int64_t m, int64_t k, int members) const {
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const auto& L : layouts_)
        if (L->shape.m == m && L->shape.k == k && L->members == members) return L;
    }
    const Shape2D shape{m, k};
    std::shared_ptr<Layout> L;
    if (plan().grouped) {
      if (members < 1) throw UserError("members", "a grouped quantizer needs members >= 1, got " + std::to_string(members));
      L = make_layout(*q_, q_->grouped_capacity(shape, members), shape, members, q_->workspace_bytes(shape, members));
    } else {
      if (members != 0) throw UserError("members", "only grouped quantizers take members");
      check_extent(shape, false, "x");
      check_shape(plan(), shape);
      L = make_layout(*q_, q_->outputs(shape), shape, 0, q_->workspace_bytes(shape, 1));
    }
    std::lock_guard<std::mutex> g(mu_);
    if (layouts_.size() >= 64) layouts_.erase(layouts_.begin());
    layouts_.push_back(L);
    return L;
  }

  // Each member's own buffers, for a host-known split: Layouts whose offsets point into the
  // grouped allocation `grouped` (members' outputs concatenated buffer by buffer).
  std::vector<std::shared_ptr<Layout>> member_layouts(const Layout& grouped, const std::vector<int64_t>& rows) const {
    if (!plan().grouped) throw UserError("split", "only a grouped quantize has members");
    if (int(rows.size()) != grouped.members)
      throw UserError("split", "expected " + std::to_string(grouped.members) + " member row counts, got " +
                                   std::to_string(rows.size()));
    int64_t total = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0) throw UserError("split", "member " + std::to_string(i) + " has negative rows");
      total += rows[i];
    }
    if (total != grouped.shape.m)
      throw UserError("split", "the members' rows sum to " + std::to_string(total) + ", the tensor has " +
                                   std::to_string(grouped.shape.m));
    Plan single = plan();
    single.grouped = false;
    std::vector<int64_t> cursor(grouped.buffers.size(), 0);
    std::vector<std::shared_ptr<Layout>> out;
    for (size_t i = 0; i < rows.size(); ++i) {
      auto L = std::make_shared<Layout>();
      L->shape = Shape2D{rows[i], grouped.shape.k};
      if (rows[i] > 0) check_shape(single, L->shape);
      const std::vector<BufferDesc> bufs = output_buffers(single, L->shape);
      for (size_t b = 0; b < bufs.size(); ++b) {
        const int gi = grouped.index(bufs[b].name);
        QF_CHECK(gi >= 0, "grouped layout lacks ", bufs[b].name);
        L->buffers.push_back(BufferSlot{bufs[b], grouped.buffers[size_t(gi)].offset + cursor[size_t(gi)], bufs[b].bytes});
        cursor[size_t(gi)] += bufs[b].bytes;
        QF_CHECK(cursor[size_t(gi)] <= grouped.buffers[size_t(gi)].desc.bytes,
                 "member buffers overflow the grouped capacity of ", bufs[b].name);
      }
      L->nbytes = grouped.nbytes;
      out.push_back(std::move(L));
    }
    return out;
  }

  // amax_out (optional): where the tensor's amax goes instead of its slot in the allocation (a
  // module's buffer that a batched delayed-scaling update reads; the slot is then left unwritten).
  void quantize(const Layout& L, uint64_t x, uint64_t base, uintptr_t stream, int device, uint64_t noop, uint64_t seed,
                uint64_t offset, uint64_t member_rows, uint64_t scale0, uint64_t scale1, uint64_t amax_out) const {
    if (amax_out && (L.amax_slot < 0 || L.members))
      throw UserError("amax_out", "the quantizer writes no single per-tensor amax (delayed scaling of one tensor)");
    rt::ScopedContext ctx(primary_ctx(device));
    std::lock_guard<std::mutex> g(L.mu);
    rt::QuantizeCall& c = L.call;
    const int64_t in_bytes = L.shape.m * L.shape.k * traits(plan().input).bytes;
    c.input = rt::TensorView{x, in_bytes, plan().input, {}};
    QF_CHECK(L.out_views.size() == L.buffers.size(), "a member layout is not quantized into");
    for (size_t i = 0; i < L.buffers.size(); ++i) L.out_views[i]->ptr = base + uint64_t(L.buffers[i].offset);
    if (L.workspace_bytes) c.workspace.ptr = base + uint64_t(L.workspace_offset);
    const uint64_t scales[2] = {scale0, scale1};
    for (size_t i = 0; i < L.input_views.size(); ++i) {
      L.input_views[i]->ptr = scales[i];
      L.input_views[i]->bytes = scales[i] ? 4 : 0;
    }
    c.noop = noop;
    c.seed = seed;
    c.offset = offset;
    c.member_rows = member_rows;
    if (amax_out) L.out_views[size_t(L.amax_slot)]->ptr = amax_out;  // rebased again next call
    q_->quantize(c, reinterpret_cast<CUstream>(stream));
  }

  std::vector<StreamInfo> streams() const {
    std::vector<StreamInfo> out;
    for (size_t i = 0; i < plan().streams.size(); ++i) {
      const qf::Stream& s = plan().streams[i];
      StreamInfo p;
      p.index = int(i);
      p.direction = std::string(name(s.dir));
      p.format = std::string(traits(s.format).name);
      p.scaling = std::string(scaling_name(s.scaling));
      p.layout = s.layout == DataLayout::Transposed ? "transposed" : "same";
      p.scale_layout = block_of(s.scaling) ? std::string(name(s.scale_layout)) : "";
      p.scale_dtype = std::string(name(traits(s.scaling).scale_storage));
      p.rht = s.rht.has_value();
      p.stochastic = s.rounding == Rounding::Stochastic;
      p.data_dtype = s.format == ElemFormat::Identity ? std::string(traits(s.out_dtype).name) : p.format;
      out.push_back(p);
    }
    return out;
  }

  // The stream of one direction's buffers in a layout: data, scale_inv (or none) and its amax
  // (NVFP4; or none).
  struct Operand {
    const qf::Stream* stream = nullptr;
    const BufferSlot* data = nullptr;
    const BufferSlot* scale = nullptr;
    const BufferSlot* amax = nullptr;
  };
  Operand operand(const Layout& L, int stream_index) const {
    if (stream_index < 0 || size_t(stream_index) >= plan().streams.size())
      throw UserError("direction", "the quantizer has no stream " + std::to_string(stream_index));
    Operand o;
    o.stream = &plan().streams[size_t(stream_index)];
    for (const auto& s : L.buffers) {
      if (s.desc.stream == stream_index && s.desc.kind == BufferKind::Data) o.data = &s;
      if (s.desc.stream == stream_index && s.desc.kind == BufferKind::ScaleInv) o.scale = &s;
    }
    if (o.stream->tensor_amax >= 0 && needs_tensor_amax(o.stream->scaling)) {
      const int i = L.index(amax_output_name(plan(), o.stream->tensor_amax));
      if (i >= 0) o.amax = &L.buffers[size_t(i)];
    }
    QF_CHECK(o.data, "layout without the stream's data");
    return o;
  }

  void dequantize(const Layout& L, int stream_index, uint64_t base, uint64_t out, const std::string& out_dtype,
                  uintptr_t stream, int device) const {
    if (L.members) throw UserError("layout", "a grouped quantize dequantizes per member (member_layouts)");
    const Operand o = operand(L, stream_index);
    const DType od = parse_dtype_arg(out_dtype, "dtype");
    rt::ScopedContext ctx(primary_ctx(device));
    auto view = [&](const BufferSlot* s) {
      return s ? rt::TensorView{base + uint64_t(s->offset), s->desc.bytes, {}, {}} : rt::TensorView{};
    };
    const Shape2D d = data_shape(*o.stream, L.shape);
    rt::dequantize(*o.stream, L.shape,
                   rt::DequantizeCall{view(o.data), view(o.scale), view(o.amax),
                                      rt::TensorView{out, d.m * d.k * traits(od).bytes, {}, {}}, false},
                   od, reinterpret_cast<CUstream>(stream));
  }

  std::string prepare(const std::string& arch) const { return std::string(name(q_->prepare(arch))); }
  std::vector<std::string> inputs() const {
    std::vector<std::string> out;
    for (const auto& b : q_->inputs()) out.push_back(b.name);
    return out;
  }
  // The delayed-scaling stream behind scale input `input_index` and its rule.
  std::pair<const qf::Stream*, const PerTensorDelayed*> delayed(int input_index) const {
    const auto ins = q_->inputs();
    if (input_index < 0 || size_t(input_index) >= ins.size())
      throw UserError("scale", "the quantizer has no scale input " + std::to_string(input_index));
    const auto& s = plan().streams[size_t(std::max(ins[size_t(input_index)].stream, 0))];
    const auto* d = std::get_if<PerTensorDelayed>(&s.scaling);
    QF_CHECK(d, "a scale input of a stream without delayed scaling");
    return {&s, d};
  }
  int history_length(int input_index) const { return delayed(input_index).second->history_length; }
  void update_history(int input_index, uint64_t history, uint64_t amax, uint64_t scale, uint64_t scale_inv, uint64_t noop,
                      uintptr_t stream, int device) const {
    const auto [st, d] = delayed(input_index);
    const qf::Stream& s = *st;
    rt::ScopedContext ctx(primary_ctx(device));
    rt::update_amax_history(*d, s.format,
                            rt::HistoryCall{rt::TensorView{history, int64_t(d->history_length) * 4, {}, {}},
                                            rt::TensorView{amax, 4, {}, {}}, rt::TensorView{scale, 4, {}, {}},
                                            rt::TensorView{scale_inv, scale_inv ? 4 : 0, {}, {}}, noop},
                            reinterpret_cast<CUstream>(stream));
  }

 private:
  std::shared_ptr<rt::Quantizer> q_;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<Layout>> layouts_;
};

// One quantize of a fused linear-layer call: what QuantizerBinding::quantize takes (x, the
// allocation's base, noop, SR seed and offset, delayed scaling's scale, amax_out) and, with
// `history`, the delayed-scaling update the modules run right after it (the amax of that quantize,
// scale input 0, the same noop). 0 means none, as in the separate calls.
struct QuantizeStep {
  uint64_t x = 0, base = 0, noop = 0, seed = 0, offset = 0, scale = 0, amax_out = 0, history = 0;
};

void quantize_step(const QuantizerBinding& q, const Layout& L, const QuantizeStep& s, uintptr_t stream, int device) {
  if (s.history && !s.amax_out && L.amax_slot < 0)
    throw UserError("history", "the quantizer writes no single per-tensor amax to roll into a history");
  q.quantize(L, s.x, s.base, stream, device, s.noop, s.seed, s.offset, 0, s.scale, 0, s.amax_out);
  if (!s.history) return;
  const uint64_t amax = s.amax_out ? s.amax_out : s.base + uint64_t(L.buffers[size_t(L.amax_slot)].offset);
  q.update_history(0, s.history, amax, s.scale, 0, s.noop, stream, device);
}

// ------------------------------------------------------------------------------ context

class RecipeSet {
 public:
  explicit RecipeSet(std::vector<Recipe> r) : recipes_(std::move(r)) {}
  static RecipeSet from_paths(const std::vector<std::string>& paths) {
    std::vector<Recipe> r;
    for (const auto& p : paths) r.push_back(load_recipe(p));
    return RecipeSet(std::move(r));
  }
  static RecipeSet from_json(const std::string& text) { return RecipeSet({parse_recipe(text)}); }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& r : recipes_) out.push_back(r.name);
    return out;
  }
  const Recipe& find(const std::optional<std::string>& name) const {
    if (!name) {
      if (recipes_.size() != 1)
        throw UserError("recipe", "None needs a context of exactly one recipe; this one has " + std::to_string(recipes_.size()));
      return recipes_[0];
    }
    std::string names;
    for (const auto& r : recipes_) {
      if (r.name == *name) return r;
      names += (names.empty() ? "" : ", ") + r.name;
    }
    throw UserError("recipe", "no recipe named \"" + *name + "\" (the context has " + names + ")");
  }
  std::shared_ptr<QuantizerBinding> quantizer(const std::string& role, const std::optional<std::string>& recipe,
                                         const std::string& dtype, const std::optional<std::string>& usage,
                                         bool grouped) const {
    PlanRequest req{role, parse_dtype_arg(dtype, "dtype"), std::nullopt, grouped};
    if (usage) {
      req.usage = parse_usage(*usage);
      if (!req.usage) throw UserError("usage", "expected training, inference, memory or None, got \"" + *usage + "\"");
    }
    return std::make_shared<QuantizerBinding>(compile_plan(find(recipe), req));
  }
  // The recipe's "gemms" entries: (JSON pointer, description).
  std::vector<std::tuple<std::string, std::string>> gemms(const std::optional<std::string>& recipe) const {
    std::vector<std::tuple<std::string, std::string>> out;
    for (const auto& g : find(recipe).gemms) out.emplace_back(g.pointer, describe(g.spec));
    return out;
  }

 private:
  std::vector<Recipe> recipes_;
};

// ------------------------------------------------------------------------------ GEMM plans

// Which kernel reads a pair of streams: compiler/gemm_operands.h (gemm_for_streams).

// A columnwise copy kept in the input's own [M, K] layout ("layout": "same", blocks along M): the
// backward GEMMs read its transpose, which no fused kernel does; the dense plan dequantizes it
// transposed (the dequant_transpose route).
bool same_layout_columnwise(const qf::Stream& s) {
  return s.dir == Direction::Columnwise && s.layout == DataLayout::RowMajor;
}

// What every GEMM plan refuses of its two operands: two operands transformed differently along the
// reduction (RHT on one but not the other, or other sign masks: the products of Hadamard-domain
// values equal the original ones only when both sides match) and, where the plan has no transposing
// route (grouped), a same-layout columnwise copy.
void check_operands(const qf::Stream& a, const qf::Stream& b, bool transposing_route) {
  if (!transposing_route)
    for (const auto& [st, arg] : {std::pair{&a, "a_direction"}, std::pair{&b, "b_direction"}})
      if (same_layout_columnwise(*st))
        throw UserError(arg, "the columnwise copy has the input's own [M, K] layout (\"layout\": \"same\"); the "
                             "grouped GEMMs read transposed copies: use a recipe whose columnwise layout is "
                             "\"transposed\" (e.g. mxfp8_hopper.json rather than mxfp8.json)");
  if (a.rht != b.rht) {
    const auto rht = [](const qf::Stream& st) {
      return st.rht ? "RHT (sign mask " + std::to_string(st.rht->sign_mask) + ")" : std::string("no RHT");
    };
    throw UserError("b_direction", "the operands were transformed differently along the reduction: A has " + rht(a) +
                                       ", B has " + rht(b) + "; their product would not be A @ B^T");
  }
}

// Device memory owned by a plan (group offsets), freed with it. `live` counts the allocations
// held now (live_plan_buffers(): what the torch layer's bounded plan tables are tested against).
struct DeviceBuffer {
  static inline std::atomic<int64_t> live{0};
  int device = -1;
  CUdeviceptr ptr = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (!ptr) return;
    --live;
    if (rt::driver_alive()) {
      rt::ScopedContext ctx(primary_ctx(device));
      rt::driver().cuMemFree(ptr);
    }
  }
};

class GemmPlan {
 public:
  GemmPlan(std::shared_ptr<QuantizerBinding> qa, std::shared_ptr<Layout> la, int sa, std::shared_ptr<QuantizerBinding> qb,
           std::shared_ptr<Layout> lb, int sb, const std::string& out_dtype, bool accumulate)
      : qa_(std::move(qa)), qb_(std::move(qb)), la_(std::move(la)), lb_(std::move(lb)) {
    a_ = qa_->operand(*la_, sa);
    b_ = qb_->operand(*lb_, sb);
    if (la_->members || lb_->members)
      throw UserError(la_->members ? "a" : "b", "a grouped quantize: its members take GroupedGemmPlan");
    check_operands(*a_.stream, *b_.stream, true);
    // The operands as the GEMM reads them, [rows, K]: the data layout, or the transpose of a
    // same-layout columnwise copy.
    a_flip_ = same_layout_columnwise(*a_.stream);
    b_flip_ = same_layout_columnwise(*b_.stream);
    const auto operand_dims = [](const qf::Stream& s, Shape2D in, bool flip) {
      const Shape2D d = data_shape(s, in);
      return flip ? Shape2D{d.k, d.m} : d;
    };
    const Shape2D da = operand_dims(*a_.stream, la_->shape, a_flip_);
    const Shape2D db = operand_dims(*b_.stream, lb_->shape, b_flip_);
    if (da.k != db.k)
      throw UserError("b", "the operands' reduction lengths differ: A " + format_dims(da) + ", B " + format_dims(db) +
                               " (D = A @ B^T needs both [., K])");
    m_ = da.m;
    n_ = db.m;
    k_ = da.k;
    out_ = parse_dtype_arg(out_dtype, "out_dtype");
    if (out_ == DType::FP16) throw UserError("out_dtype", "expected bf16 or fp32, got fp16");
    if (accumulate && out_ != DType::FP32) throw UserError("accumulate", "needs an fp32 output");
    auto fused = a_flip_ || b_flip_ ? std::nullopt : gemm_for_streams(*a_.stream, *b_.stream, m_, n_, k_);
    if (fused) {
      fused->out_dtype = out_;
      fused->accumulate = accumulate;
      if (fused->scaling == GemmScaling::Mx32 || fused->scaling == GemmScaling::Nvfp4) fused->route = GemmRoute::Auto;
      gemm_ = std::make_unique<rt::Gemm>(*fused);
      route_ = fused->route == GemmRoute::Auto ? "auto" : "fused";
    } else {
      // Mixed formats, or a same-layout columnwise copy (which no fused kernel reads transposed):
      // both operands dequantized into bf16 copies in the workspace, [rows, K] each (a same-layout
      // copy written transposed), then the bf16 GEMM.
      GemmSpec spec;
      spec.a_format = spec.b_format = ElemFormat::Identity;
      spec.operand_dtype = DType::BF16;
      spec.scaling = GemmScaling::None;
      spec.n = n_;
      spec.k = k_;
      spec.out_dtype = out_;
      spec.accumulate = accumulate;
      validate(spec);
      gemm_ = std::make_unique<rt::Gemm>(spec);
      route_ = a_flip_ || b_flip_ ? "dequant_transpose" : "dequant_mixed";
      a_copy_ = align_up(m_ * k_ * 2);
      b_copy_ = align_up(n_ * k_ * 2);
      // An NVFP4 operand's copy keeps decode(q) * decode(s), exact in bf16; its per-tensor decode
      // scale S_dec becomes the bf16 GEMM's alpha (one fp32 in the workspace, written by the
      // dequantize), so the GEMM's fp32 sums are the only rounding before the output's.
      a_sdec_ = traits(a_.stream->scaling).scale_storage == ScaleStorage::E4M3;
      b_sdec_ = traits(b_.stream->scaling).scale_storage == ScaleStorage::E4M3;
      if (a_sdec_ || b_sdec_) alpha_ = kAlign;
    }
  }

  static std::string format_dims(Shape2D d) { return "[" + std::to_string(d.m) + ", " + std::to_string(d.k) + "]"; }

  int64_t workspace_bytes() const {
    std::call_once(ws_once_, [&] {
      const bool kg = k_grouped(gemm_->spec().layout);
      ws_ = a_copy_ + b_copy_ + alpha_ + align_up(gemm_->workspace_bytes(kg ? k_ : m_, 1));
    });
    return ws_;
  }

  void run(uint64_t a_base, uint64_t b_base, uint64_t d, uint64_t workspace, uintptr_t stream, int device,
           bool checked) const {
    rt::ScopedContext ctx(primary_ctx(device));
    const uint64_t offsets = group_offsets(device);
    const auto at = [](uint64_t base, const BufferSlot* s) {
      return s ? rt::TensorView{base + uint64_t(s->offset), s->reserved, {}, {}} : rt::TensorView{};
    };
    rt::GemmCall c;
    const bool kg = k_grouped(gemm_->spec().layout);
    const int64_t d_bytes = m_ * n_ * traits(out_).bytes;
    c.d = rt::TensorView{d, d_bytes, {}, {}};
    c.num_groups = 1;
    c.group_offsets = rt::TensorView{offsets, 16, {}, {}};
    if (kg) c.k_total = k_;
    else c.m_total = m_;
    const int64_t ws_bytes = workspace_bytes();
    if (a_copy_) {  // the mixed route: dequantize both, then the bf16 GEMM on the copies
      rt::DequantizeCall qa{at(a_base, a_.data), at(a_base, a_.scale), at(a_base, a_.amax),
                            rt::TensorView{workspace, m_ * k_ * 2, {}, {}}, a_flip_};
      rt::DequantizeCall qb{at(b_base, b_.data), at(b_base, b_.scale), at(b_base, b_.amax),
                            rt::TensorView{workspace + uint64_t(a_copy_), n_ * k_ * 2, {}, {}}, b_flip_};
      if (ws_bytes && !workspace) throw UserError("workspace", "the mixed-format GEMM needs a workspace");
      // NVFP4's S_dec into the alpha slot: A's written, B's multiplied in (or written, A not NVFP4).
      const rt::TensorView alpha{workspace + uint64_t(a_copy_ + b_copy_), 4, {}, {}};
      if (a_sdec_) qa.s_dec_out = alpha;
      if (b_sdec_) qb.s_dec_out = alpha, qb.s_dec_multiply = a_sdec_;
      rt::dequantize(*a_.stream, la_->shape, qa, DType::BF16, reinterpret_cast<CUstream>(stream));
      rt::dequantize(*b_.stream, lb_->shape, qb, DType::BF16, reinterpret_cast<CUstream>(stream));
      c.a = qa.out;
      c.b = qb.out;
      if (alpha_) c.alpha = alpha;
    } else {
      c.a = at(a_base, a_.data);
      c.b = at(b_base, b_.data);
      c.a_scale = at(a_base, a_.scale);
      c.b_scale = at(b_base, b_.scale);
      if (traits(gemm_->spec().scaling).per_tensor_amax) {  // NVFP4's global decode scales
        c.a_amax = at(a_base, a_.amax);
        c.b_amax = at(b_base, b_.amax);
      }
    }
    const int64_t inner = ws_bytes - a_copy_ - b_copy_ - alpha_;
    if (inner) c.workspace = rt::TensorView{workspace + uint64_t(a_copy_ + b_copy_ + alpha_), inner, {}, {}};
    c.pointers_checked = checked;  // the caller (the torch layer) checked every tensor's device
    gemm_->run(c, reinterpret_cast<CUstream>(stream));
  }

  // A linear layer's forward in one call (fprop: A the input's quantize, B the weight's): the
  // input's quantize into its layout at x.base, the weight's into w.base unless w.x is 0 (the kept
  // copy at w.base is current), then this GEMM into d. The same launches in the same order as the
  // separate calls, so the same bits.
  void linear_forward(const QuantizeStep& x, const QuantizeStep& w, uint64_t d, uint64_t workspace, uintptr_t stream,
                      int device) const {
    quantize_step(*qa_, *la_, x, stream, device);
    if (w.x) quantize_step(*qb_, *lb_, w, stream, device);
    run(x.base, w.base, d, workspace, stream, device, true);
  }

  // Whether this plan's A is the quantize of (q, L): the backward's check that a dgrad / wgrad plan
  // reads the grad_output quantize it is run after.
  bool a_is(const QuantizerBinding& q, const Layout& L) const {
    return qa_.get() == &q && la_->shape.m == L.shape.m && la_->shape.k == L.shape.k && la_->members == L.members;
  }

  std::string describe_spec() const { return describe(gemm_->spec()); }
  std::string route() const { return route_; }
  int64_t m() const { return m_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  std::string prepare(const std::string& arch) const { return std::string(name(gemm_->prepare(arch))); }

 private:
  // {0, extent} on the device, written once per device (outside any capture: the first run).
  uint64_t group_offsets(int device) const {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& b : offsets_)
      if (b->device == device) return b->ptr;
    auto buf = std::make_shared<DeviceBuffer>();
    buf->device = device;
    const int64_t host[2] = {0, k_grouped(gemm_->spec().layout) ? k_ : m_};
    rt::check(rt::driver().cuMemAlloc(&buf->ptr, sizeof(host)), "cuMemAlloc (GEMM group offsets)");
    ++DeviceBuffer::live;
    rt::check(rt::driver().cuMemcpyHtoD(buf->ptr, host, sizeof(host)), "cuMemcpyHtoD (GEMM group offsets)");
    offsets_.push_back(buf);
    return buf->ptr;
  }

  std::shared_ptr<QuantizerBinding> qa_, qb_;
  std::shared_ptr<Layout> la_, lb_;
  QuantizerBinding::Operand a_, b_;
  int64_t m_ = 0, n_ = 0, k_ = 0;
  DType out_ = DType::BF16;
  std::unique_ptr<rt::Gemm> gemm_;
  std::string route_;
  bool a_flip_ = false, b_flip_ = false;  // the operand is a same-layout columnwise copy, read transposed
  int64_t a_copy_ = 0, b_copy_ = 0;
  bool a_sdec_ = false, b_sdec_ = false;  // the operand is NVFP4: its S_dec goes to the alpha slot
  int64_t alpha_ = 0;                     // the alpha slot's bytes in the workspace, after the copies
  mutable std::once_flag ws_once_;
  mutable int64_t ws_ = 0;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<DeviceBuffer>> offsets_;
};

// A linear layer's backward in one call: grad_output's quantize (q, L) into g.base, then dgrad
// (A: that quantize, B: the weight's copy at w_base) into dx and wgrad (B: the input's copy at
// x_base) into dw, each where its plan is given (dw: an fp32 main gradient when the plan
// accumulates). The same launches in the same order as the separate calls.
void linear_backward(const QuantizerBinding& q, const Layout& L, const GemmPlan* dgrad, const GemmPlan* wgrad,
                     const QuantizeStep& g, uint64_t w_base, uint64_t x_base, uint64_t dx, uint64_t dx_workspace,
                     uint64_t dw, uint64_t dw_workspace, uintptr_t stream, int device) {
  if (dgrad && !dgrad->a_is(q, L)) throw UserError("dgrad", "the plan's A is not this grad_output quantize");
  if (wgrad && !wgrad->a_is(q, L)) throw UserError("wgrad", "the plan's A is not this grad_output quantize");
  quantize_step(q, L, g, stream, device);
  if (dgrad) dgrad->run(g.base, w_base, dx, dx_workspace, stream, device, true);
  if (wgrad) wgrad->run(g.base, x_base, dw, dw_workspace, stream, device, true);
}

// The grouped GEMMs of an MoE layer on grouped quantizes (members = experts): fprop and dgrad
// M-grouped over the tokens' quantize (A, split by device row offsets) and the stacked weights'
// quantize (B [G, N, K]: one member per expert); wgrad K-grouped over both token quantizes'
// per-member transposed copies. The split lives on the device: run() takes its offsets.
class GroupedGemmPlan {
 public:
  GroupedGemmPlan(std::shared_ptr<QuantizerBinding> qa, std::shared_ptr<Layout> la, int sa,
                  std::shared_ptr<QuantizerBinding> qb, std::shared_ptr<Layout> lb, int sb, bool wgrad,
                  const std::string& out_dtype, bool accumulate)
      : qa_(std::move(qa)), qb_(std::move(qb)), la_(std::move(la)), lb_(std::move(lb)), wgrad_(wgrad) {
    if (!la_->members || !lb_->members) throw UserError("a", "grouped GEMMs take grouped quantizes (members)");
    a_ = qa_->operand(*la_, sa);
    b_ = qb_->operand(*lb_, sb);
    check_operands(*a_.stream, *b_.stream, false);
    // Orientation: M-grouped reads A's rows as tokens (its data untransposed); wgrad reads both
    // operands' transposed copies, tokens along their rows.
    if (!wgrad_ && a_.stream->layout == DataLayout::Transposed)
      throw UserError("a_direction", "the M-grouped GEMMs read A's tokens along its rows: the rowwise copy, not the transposed one");
    if (wgrad_ && (a_.stream->layout != DataLayout::Transposed || b_.stream->layout != DataLayout::Transposed))
      throw UserError(a_.stream->layout != DataLayout::Transposed ? "a_direction" : "b_direction",
                      "wgrad reads both operands' transposed (columnwise) copies");
    groups_ = la_->members;
    const Shape2D da = data_shape(*a_.stream, Shape2D{la_->shape.m, la_->shape.k});
    const Shape2D db = data_shape(*b_.stream, Shape2D{lb_->shape.m, lb_->shape.k});
    if (wgrad_) {  // A^T [m, tokens], B^T [n, tokens]: D[g] [m, n] over each member's tokens
      if (lb_->members != groups_ || la_->shape.m != lb_->shape.m)
        throw UserError("b", "wgrad: both operands must be quantizes of the same tokens and members (" +
                                 std::to_string(la_->shape.m) + " x " + std::to_string(groups_) + " vs " +
                                 std::to_string(lb_->shape.m) + " x " + std::to_string(lb_->members) + ")");
      m_ = da.m;
      n_ = db.m;
      tokens_ = la_->shape.m;
    } else {  // A [M_total, K] by row offsets; B [G, N, K]: one member of N rows per group
      if (lb_->members != groups_)
        throw UserError("b", "expected " + std::to_string(groups_) + " weight members, got " + std::to_string(lb_->members));
      if (lb_->shape.m % groups_) throw UserError("b", "the stacked weights' rows are not G equal members");
      const int64_t per = lb_->shape.m / groups_;
      const Shape2D one = data_shape(*b_.stream, Shape2D{per, lb_->shape.k});
      if (da.k != one.k)
        throw UserError("b", "the operands' reduction lengths differ: A [., " + std::to_string(da.k) + "], B[g] [" +
                                 std::to_string(one.m) + ", " + std::to_string(one.k) + "]");
      m_ = la_->shape.m;
      n_ = one.m;
      k_ = one.k;
    }
    const DType out = parse_dtype_arg(out_dtype, "out_dtype");
    if (out == DType::FP16) throw UserError("out_dtype", "expected bf16 or fp32, got fp16");
    if (accumulate && out != DType::FP32) throw UserError("accumulate", "needs an fp32 output");
    auto spec = gemm_for_streams(*a_.stream, *b_.stream, wgrad_ ? m_ : 0, n_, wgrad_ ? 0 : k_,
                           wgrad_ ? GemmLayout::KGroupedMembers : GemmLayout::MGrouped);
    if (!spec) throw UserError("b", "no grouped GEMM reads these two formats (" + std::string(traits(a_.stream->format).name) +
                                        " / " + std::string(scaling_name(a_.stream->scaling)) + " x " +
                                        std::string(traits(b_.stream->format).name) + " / " +
                                        std::string(scaling_name(b_.stream->scaling)) +
                                        "): no grouped mixed-format GEMM yet");
    spec->layout = wgrad_ ? GemmLayout::KGroupedMembers : GemmLayout::MGrouped;
    if (wgrad_) {
      spec->m = m_;
      spec->n = n_;
      spec->k = 0;
    }
    spec->out_dtype = out;
    spec->accumulate = accumulate;
    validate(*spec);
    gemm_ = std::make_unique<rt::Gemm>(*spec);
    // The layouts' scale slots against what the GEMM checks for this call's extent.
    const GemmScaleElems se = wgrad_ ? gemm_scale_elems(gemm_->spec(), 0, groups_, tokens_)
                                     : gemm_scale_elems(gemm_->spec(), m_, groups_);
    const int sbytes = traits(gemm_->spec().scaling).scale_bytes;
    if (a_.scale && se.a * sbytes > a_.scale->reserved)
      throw InternalError(__FILE__, __LINE__, "A's scale slot holds " + std::to_string(a_.scale->reserved) + " bytes, the GEMM reads up to " + std::to_string(se.a * sbytes));
    if (b_.scale && se.b * sbytes > b_.scale->reserved)
      throw InternalError(__FILE__, __LINE__, "B's scale slot holds " + std::to_string(b_.scale->reserved) + " bytes, the GEMM reads up to " + std::to_string(se.b * sbytes));
  }

  int64_t workspace_bytes() const {
    std::call_once(ws_once_, [&] { ws_ = gemm_->workspace_bytes(wgrad_ ? tokens_ : m_, groups_); });
    return ws_;
  }

  // offsets: device int64 [G + 1], the members' row offsets (the same the grouped quantizes took).
  void run(uint64_t a_base, uint64_t b_base, uint64_t d, uint64_t offsets, uint64_t workspace, uintptr_t stream,
           int device, bool checked) const {
    rt::ScopedContext ctx(primary_ctx(device));
    const auto at = [](uint64_t base, const BufferSlot* s) {
      return s ? rt::TensorView{base + uint64_t(s->offset), s->reserved, {}, {}} : rt::TensorView{};
    };
    rt::GemmCall c;
    c.a = at(a_base, a_.data);
    c.b = at(b_base, b_.data);
    c.a_scale = at(a_base, a_.scale);
    c.b_scale = at(b_base, b_.scale);
    if (traits(gemm_->spec().scaling).per_tensor_amax) {
      c.a_amax = at(a_base, a_.amax);
      c.b_amax = at(b_base, b_.amax);
    }
    c.num_groups = groups_;
    c.group_offsets = rt::TensorView{offsets, int64_t(groups_ + 1) * 8, {}, {}};
    const int64_t rows = wgrad_ ? int64_t(groups_) * m_ : m_;
    c.d = rt::TensorView{d, rows * n_ * traits(gemm_->spec().out_dtype).bytes, {}, {}};
    if (wgrad_) c.k_total = tokens_;
    else c.m_total = m_;
    const int64_t ws = workspace_bytes();
    if (ws) c.workspace = rt::TensorView{workspace, ws, {}, {}};
    c.pointers_checked = checked;  // the caller (the torch layer) checked every tensor's device
    gemm_->run(c, reinterpret_cast<CUstream>(stream));
  }

  std::vector<int64_t> out_shape() const {
    return wgrad_ ? std::vector<int64_t>{groups_, m_, n_} : std::vector<int64_t>{m_, n_};
  }
  std::string describe_spec() const { return describe(gemm_->spec()); }
  std::string prepare(const std::string& arch) const { return std::string(name(gemm_->prepare(arch))); }

 private:
  std::shared_ptr<QuantizerBinding> qa_, qb_;
  std::shared_ptr<Layout> la_, lb_;
  QuantizerBinding::Operand a_, b_;
  bool wgrad_ = false;
  int groups_ = 0;
  int64_t m_ = 0, n_ = 0, k_ = 0, tokens_ = 0;
  std::unique_ptr<rt::Gemm> gemm_;
  mutable std::once_flag ws_once_;
  mutable int64_t ws_ = 0;
};

// ------------------------------------------------------------------------------ delayed scaling, batched

// Every delayed-scaling tensor of a model updated in one launch per history length: built once
// for the tensors' buffers (module buffers, whose addresses stay), run once per step.
class HistoryBatchBinding {
 public:
  // items: (quantizer, scale input index, history, amax, scale, scale_inv or 0), device addresses.
  using Item = std::tuple<std::shared_ptr<QuantizerBinding>, int, uint64_t, uint64_t, uint64_t, uint64_t>;
  HistoryBatchBinding(const std::vector<Item>& items, int device) : device_(device) {
    std::vector<rt::HistoryBatchItem> v;
    for (const auto& [q, input, history, amax, scale, scale_inv] : items) {
      if (!q) throw UserError("items", "expected a quantizer in every item");
      const auto [st, d] = q->delayed(input);
      rt::HistoryBatchItem it;
      it.mode = *d;
      it.format = st->format;
      it.history = rt::TensorView{history, int64_t(d->history_length) * 4, {}, {}};
      it.amax = rt::TensorView{amax, 4, {}, {}};
      it.scale = rt::TensorView{scale, 4, {}, {}};
      it.scale_inv = rt::TensorView{scale_inv, scale_inv ? 4 : 0, {}, {}};
      v.push_back(it);
    }
    rt::check_history_batch(v);  // before any device work: bad items fail the same without a GPU
    rt::ScopedContext ctx(primary_ctx(device));
    batch_ = std::make_unique<rt::HistoryBatch>(std::move(v));
  }
  void run(uint64_t noop, uintptr_t stream, int device) const {
    if (device != device_)
      throw UserError("device", "the batch was built for cuda:" + std::to_string(device_) + ", called on cuda:" +
                                    std::to_string(device));
    rt::ScopedContext ctx(primary_ctx(device));
    batch_->run(noop, reinterpret_cast<CUstream>(stream));
  }
  int64_t size() const { return int64_t(batch_->size()); }
  int launches() const { return batch_->launches(); }

 private:
  int device_;
  std::unique_ptr<rt::HistoryBatch> batch_;
};

// ------------------------------------------------------------------------------ CPU reference

nb::bytes to_bytes(const std::vector<uint8_t>& v) { return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size()); }

// Quantizes host bytes (the plan's input dtype, row-major [m, k]) on the CPU reference: name -> bytes.
std::vector<std::tuple<std::string, nb::bytes>> reference_quantize(const QuantizerBinding& q, nb::bytes x, int64_t m, int64_t k,
                                                                  uint64_t seed, uint64_t offset,
                                                                  const std::vector<float>& scales,
                                                                  const std::vector<int64_t>& split) {
  ref::HostTensor t;
  t.dtype = q.plan().input;
  t.shape = Shape2D{m, k};
  const int64_t want = m * k * traits(t.dtype).bytes;
  if (int64_t(x.size()) != want)
    throw UserError("x", "expected " + std::to_string(want) + " bytes for [" + std::to_string(m) + ", " +
                             std::to_string(k) + "], got " + std::to_string(x.size()));
  t.bytes.assign(reinterpret_cast<const uint8_t*>(x.c_str()), reinterpret_cast<const uint8_t*>(x.c_str()) + x.size());
  ref::QuantizeParams p;
  p.seed = seed;
  p.offset = offset;
  const auto ins = q.inputs();
  for (size_t i = 0; i < ins.size() && i < scales.size(); ++i) p.scales[ins[i]] = scales[i];
  const std::vector<ref::Output> outs =
      q.plan().grouped ? ref::quantize_grouped(q.plan(), t, split, p) : ref::quantize(q.plan(), t, p);
  std::vector<std::tuple<std::string, nb::bytes>> r;
  for (const auto& o : outs) r.emplace_back(o.desc.name, to_bytes(o.bytes));
  return r;
}

nb::bytes reference_dequantize(const QuantizerBinding& q, int stream_index, int64_t m, int64_t k, nb::bytes data,
                               nb::bytes scale, float amax, const std::string& out) {
  if (stream_index < 0 || size_t(stream_index) >= q.plan().streams.size())
    throw UserError("direction", "the quantizer has no stream " + std::to_string(stream_index));
  const Shape2D in{m, k};
  Plan single = q.plan();
  single.grouped = false;
  check_extent(in, false, "m, k");
  check_shape(single, in);
  for (const auto& b : output_buffers(single, in)) {
    const bool is_data = b.kind == BufferKind::Data, is_scale = b.kind == BufferKind::ScaleInv;
    if (b.stream != stream_index || !(is_data || is_scale)) continue;
    const int64_t given = int64_t(is_data ? data.size() : scale.size());
    if (given != b.bytes)
      throw UserError(is_data ? "data" : "scale", "expected the " + b.name + " buffer of " + std::to_string(b.bytes) +
                                                      " bytes, got " + std::to_string(given));
  }
  const auto span = [](const nb::bytes& b) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b.c_str()), b.size());
  };
  return to_bytes(ref::dequantize(q.plan().streams[size_t(stream_index)], Shape2D{m, k}, span(data), span(scale), amax,
                                  parse_dtype_arg(out, "dtype")));
}

}  // namespace

}  // namespace qf::py

namespace qf::py { void register_optim(nb::module_& m); }  // python/src/ext_optim.cpp
NB_MODULE(_C, m) {
  using namespace qf::py;
  m.doc() = "qforge's compiled core: recipes, quantize layouts and launches, GEMM plans (device addresses as ints)";
  m.attr("__version__") = QFORGE_VERSION;
  register_optim(m);  // the INT8 parameter's fused optimizer step
  // Quantizers and plans live in the torch layer's module-level tables until the interpreter
  // exits, after nanobind's own teardown checks: not leaks.
  nb::set_leak_warnings(false);

  // Errors surface as the qforge package's own classes (qforge.UserError, ...), with the
  // library's message and its qf_status code.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    const char* cls = "InternalError";
    int status = 3;
    std::string msg;
    try {
      std::rethrow_exception(p);
    } catch (const qf::UserError& e) {
      cls = "UserError", status = 1, msg = e.what();
    } catch (const qf::rt::CudaError& e) {
      cls = "CudaError", status = 2, msg = e.what();
    } catch (const qf::InternalError& e) {
      msg = e.what();
    }  // anything else goes on to nanobind's own translators
    nb::object mod = nb::module_::import_("qforge");
    nb::object err = mod.attr(cls)(status, msg);
    PyErr_SetObject(err.type().ptr(), err.ptr());
  });

  nb::class_<Layout>(m, "Layout")
      .def_prop_ro("m", [](const Layout& l) { return l.shape.m; })
      .def_prop_ro("k", [](const Layout& l) { return l.shape.k; })
      .def_ro("members", &Layout::members)
      .def_ro("nbytes", &Layout::nbytes)
      .def_ro("workspace_offset", &Layout::workspace_offset)
      .def_ro("workspace_bytes", &Layout::workspace_bytes)
      .def_prop_ro("buffers",
                   [](const Layout& l) {
                     // (name, kind, stream, dtype, element_size, shape, offset, bytes, scale_layout)
                     std::vector<std::tuple<std::string, std::string, int, std::string, int, std::vector<int64_t>,
                                            int64_t, int64_t, std::string>>
                         out;
                     static const char* kinds[] = {"data", "scale_inv", "amax", "scale"};
                     for (const auto& s : l.buffers)
                       out.emplace_back(s.desc.name, kinds[int(s.desc.kind)], s.desc.stream, s.desc.dtype,
                                        int(qf::storage_bytes(s.desc.storage)), s.desc.shape, s.offset, s.desc.bytes,
                                        s.desc.scale_layout);
                     return out;
                   })
      .def("index", &Layout::index, "name"_a);

  nb::class_<StreamInfo>(m, "Stream")
      .def_ro("index", &StreamInfo::index)
      .def_ro("direction", &StreamInfo::direction)
      .def_ro("format", &StreamInfo::format)
      .def_ro("scaling", &StreamInfo::scaling)
      .def_ro("layout", &StreamInfo::layout)
      .def_ro("scale_layout", &StreamInfo::scale_layout)
      .def_ro("scale_dtype", &StreamInfo::scale_dtype)
      .def_ro("rht", &StreamInfo::rht)
      .def_ro("stochastic", &StreamInfo::stochastic)
      .def_ro("data_dtype", &StreamInfo::data_dtype);

  nb::class_<QuantizerBinding>(m, "Quantizer")
      .def_prop_ro("recipe", [](const QuantizerBinding& q) { return q.plan().recipe; })
      .def_prop_ro("role", [](const QuantizerBinding& q) { return q.plan().role; })
      .def_prop_ro("dtype", [](const QuantizerBinding& q) { return std::string(qf::traits(q.plan().input).name); })
      .def_prop_ro("usage", [](const QuantizerBinding& q) { return std::string(qf::name(q.plan().usage)); })
      .def_prop_ro("grouped", [](const QuantizerBinding& q) { return q.plan().grouped; })
      .def_prop_ro("streams", &QuantizerBinding::streams)
      .def_prop_ro("inputs", &QuantizerBinding::inputs)
      .def("layout", &QuantizerBinding::layout, "m"_a, "k"_a, "members"_a = 0)
      .def("member_layouts", &QuantizerBinding::member_layouts, "layout"_a, "rows"_a)
      .def("quantize", &QuantizerBinding::quantize, "layout"_a, "x"_a, "base"_a, "stream"_a, "device"_a, "noop"_a = 0,
           "seed"_a = 0, "offset"_a = 0, "member_rows"_a = 0, "scale0"_a = 0, "scale1"_a = 0, "amax_out"_a = 0,
           nb::call_guard<nb::gil_scoped_release>())
      .def("dequantize", &QuantizerBinding::dequantize, "layout"_a, "stream_index"_a, "base"_a, "out"_a, "dtype"_a,
           "stream"_a, "device"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("history_length", &QuantizerBinding::history_length, "input_index"_a = 0)
      .def("update_history", &QuantizerBinding::update_history, "input_index"_a, "history"_a, "amax"_a, "scale"_a,
           "scale_inv"_a, "noop"_a, "stream"_a, "device"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("prepare", &QuantizerBinding::prepare, "arch"_a = "sm_90a", nb::call_guard<nb::gil_scoped_release>())
      .def("describe", [](const QuantizerBinding& q) { return qf::print(q.plan()); });

  nb::class_<RecipeSet>(m, "Context")
      .def(nb::new_(&RecipeSet::from_paths), "paths"_a)
      .def_static("from_json", &RecipeSet::from_json, "text"_a)
      .def_prop_ro("recipes", &RecipeSet::names)
      .def("quantizer", &RecipeSet::quantizer, "role"_a, "recipe"_a = nb::none(), "dtype"_a = "bf16",
           "usage"_a = nb::none(), "grouped"_a = false)
      .def("gemms", &RecipeSet::gemms, "recipe"_a = nb::none());

  nb::class_<GemmPlan>(m, "GemmPlan")
      .def(nb::init<std::shared_ptr<QuantizerBinding>, std::shared_ptr<Layout>, int, std::shared_ptr<QuantizerBinding>,
                    std::shared_ptr<Layout>, int, const std::string&, bool>(),
           "a_quantizer"_a, "a_layout"_a, "a_stream"_a, "b_quantizer"_a, "b_layout"_a, "b_stream"_a,
           "out_dtype"_a = "bf16", "accumulate"_a = false)
      .def_prop_ro("m", &GemmPlan::m)
      .def_prop_ro("n", &GemmPlan::n)
      .def_prop_ro("k", &GemmPlan::k)
      .def_prop_ro("route", &GemmPlan::route)
      .def("describe", &GemmPlan::describe_spec)
      .def("workspace_bytes", &GemmPlan::workspace_bytes)
      .def("prepare", &GemmPlan::prepare, "arch"_a = "sm_90a", nb::call_guard<nb::gil_scoped_release>())
      .def("run", &GemmPlan::run, "a_base"_a, "b_base"_a, "d"_a, "workspace"_a, "stream"_a, "device"_a,
           "checked"_a = false, nb::call_guard<nb::gil_scoped_release>())
      // The input's quantize (x .. x_history: QuantizeStep's fields), the weight's (w = 0: the
      // copy at w_base is kept, not quantized), then this GEMM: one call per forward, positional
      // ints only (the torch layer's eager path; its checks are the caller's).
      .def("linear_forward",
           [](const GemmPlan& p, uint64_t x, uint64_t x_base, uint64_t x_noop, uint64_t x_seed, uint64_t x_offset,
              uint64_t x_scale, uint64_t x_amax_out, uint64_t x_history, uint64_t w, uint64_t w_base, uint64_t w_noop,
              uint64_t w_seed, uint64_t w_offset, uint64_t w_scale, uint64_t w_amax_out, uint64_t w_history, uint64_t d,
              uint64_t workspace, uintptr_t stream, int device) {
             p.linear_forward(QuantizeStep{x, x_base, x_noop, x_seed, x_offset, x_scale, x_amax_out, x_history},
                              QuantizeStep{w, w_base, w_noop, w_seed, w_offset, w_scale, w_amax_out, w_history}, d,
                              workspace, stream, device);
           },
           nb::call_guard<nb::gil_scoped_release>());

  // grad_output's quantize (g .. g_history: QuantizeStep's fields), then dgrad and wgrad where
  // their plans are given (None: skipped): one call per backward, positional arguments.
  m.def("linear_backward",
        [](const QuantizerBinding& q, const Layout& L, const GemmPlan* dgrad, const GemmPlan* wgrad, uint64_t g,
           uint64_t g_base, uint64_t g_noop, uint64_t g_seed, uint64_t g_offset, uint64_t g_scale, uint64_t g_amax_out,
           uint64_t g_history, uint64_t w_base, uint64_t x_base, uint64_t dx, uint64_t dx_workspace, uint64_t dw,
           uint64_t dw_workspace, uintptr_t stream, int device) {
          linear_backward(q, L, dgrad, wgrad, QuantizeStep{g, g_base, g_noop, g_seed, g_offset, g_scale, g_amax_out, g_history},
                          w_base, x_base, dx, dx_workspace, dw, dw_workspace, stream, device);
        },
        "quantizer"_a, "layout"_a, "dgrad"_a.none(), "wgrad"_a.none(), "g"_a, "g_base"_a, "g_noop"_a, "g_seed"_a,
        "g_offset"_a, "g_scale"_a, "g_amax_out"_a, "g_history"_a, "w_base"_a, "x_base"_a, "dx"_a, "dx_workspace"_a,
        "dw"_a, "dw_workspace"_a, "stream"_a, "device"_a, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<GroupedGemmPlan>(m, "GroupedGemmPlan")
      .def(nb::init<std::shared_ptr<QuantizerBinding>, std::shared_ptr<Layout>, int, std::shared_ptr<QuantizerBinding>,
                    std::shared_ptr<Layout>, int, bool, const std::string&, bool>(),
           "a_quantizer"_a, "a_layout"_a, "a_stream"_a, "b_quantizer"_a, "b_layout"_a, "b_stream"_a, "wgrad"_a = false,
           "out_dtype"_a = "bf16", "accumulate"_a = false)
      .def_prop_ro("out_shape", &GroupedGemmPlan::out_shape)
      .def("describe", &GroupedGemmPlan::describe_spec)
      .def("workspace_bytes", &GroupedGemmPlan::workspace_bytes)
      .def("prepare", &GroupedGemmPlan::prepare, "arch"_a = "sm_90a", nb::call_guard<nb::gil_scoped_release>())
      .def("run", &GroupedGemmPlan::run, "a_base"_a, "b_base"_a, "d"_a, "offsets"_a, "workspace"_a, "stream"_a,
           "device"_a, "checked"_a = false, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<HistoryBatchBinding>(m, "HistoryBatch")
      .def(nb::init<const std::vector<HistoryBatchBinding::Item>&, int>(), "items"_a, "device"_a)
      .def_prop_ro("size", &HistoryBatchBinding::size)
      .def_prop_ro("launches", &HistoryBatchBinding::launches)
      .def("run", &HistoryBatchBinding::run, "noop"_a, "stream"_a, "device"_a, nb::call_guard<nb::gil_scoped_release>());

  m.def("reference_update_amax_history",
        [](const QuantizerBinding& q, int input_index, std::vector<float> history, float amax, float scale) {
          const auto [st, d] = q.delayed(input_index);
          if (int64_t(history.size()) != d->history_length)
            throw qf::UserError("history", "expected " + std::to_string(d->history_length) + " slots, got " +
                                           std::to_string(history.size()));
          qf::ref::update_amax_history(history, amax, scale, *d, st->format);
          return std::make_tuple(history, scale);
        },
        "quantizer"_a, "input_index"_a, "history"_a, "amax"_a, "scale"_a,
        "the CPU reference of one delayed-scaling update: (history, scale) after it");
  m.def("live_plan_buffers", [] { return DeviceBuffer::live.load(); },
        "device buffers the GEMM plans alive now hold (each plan's group offsets, per device)");
  m.def(
      "tensor_map_cache_stats",
      [] {
        const qf::rt::TensorMapCache& c = qf::rt::tensor_map_cache();
        return std::make_tuple(c.hits(), c.misses(), int64_t(c.size()));
      },
      "(hits, misses, entries) of the GEMMs' cache of encoded tensor maps in this module's runtime "
      "(runtime/tensor_map_cache.h): a steady loop of GEMMs on the same operands hits");
  m.def("reference_quantize", &reference_quantize, "quantizer"_a, "x"_a, "m"_a, "k"_a, "seed"_a = 0, "offset"_a = 0,
        "scales"_a = std::vector<float>{}, "split"_a = std::vector<int64_t>{});
  m.def("reference_dequantize", &reference_dequantize, "quantizer"_a, "stream_index"_a, "m"_a, "k"_a, "data"_a,
        "scale"_a, "amax"_a, "dtype"_a);

  // The log sink of this module's own copy of the runtime (runtime/log.h; libqforge.so has its
  // own): fn(level, message) gets every message within the threshold, None sends them to stderr
  // again; level (QF_LOG_OFF 0 .. QF_LOG_DEBUG 4), when given, sets the threshold. Returns the
  // threshold in force. python/qforge/_log.py bridges this into Python's logging.
  m.def(
      "set_log_callback",
      [](nb::object fn, std::optional<int> level) {
        static std::mutex mu;                  // one replacement at a time: `current` is the one in force
        static nb::object* current = nullptr;  // never freed at exit: a compiling thread may still log
        if (level && (*level < int(qf::log::Level::Off) || *level > int(qf::log::Level::Debug)))
          throw nb::value_error(("level: expected 0 (off) .. 4 (debug), got " + std::to_string(*level)).c_str());
        qf::log::Callback forward = [](int lvl, const char* message, void* user) {
          nb::gil_scoped_acquire gil;  // called on any compiling thread, never under a lock of the runtime
          try {
            (*static_cast<nb::object*>(user))(lvl, message);
          } catch (nb::python_error& e) {
            e.discard_as_unraisable("qforge._C log callback");
          } catch (...) {
          }
        };
        nb::object* next = fn.is_none() ? nullptr : new nb::object(fn);
        nb::object* old = nullptr;
        bool ok = false;
        {
          nb::gil_scoped_release release;  // set_callback waits for calls in progress, which take the GIL
          std::lock_guard lk(mu);
          ok = qf::log::set_callback(next ? forward : nullptr, next);
          if (ok) old = std::exchange(current, next);
          if (ok && level) qf::log::set_level(qf::log::Level(*level));
        }
        delete (ok ? old : next);  // no call of it is in progress any more
        if (!ok) throw nb::value_error("set_log_callback: called from inside the log callback");
        return int(qf::log::level());
      },
      "fn"_a.none(), "level"_a = nb::none());
}
