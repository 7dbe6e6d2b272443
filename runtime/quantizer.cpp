#include "runtime/quantizer.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <string_view>

#include "compiler/emitter.h"
#include "compiler/env.h"
#include "compiler/error.h"
#include "qforge/args.cuh"
#include "qforge/history.cuh"
#include "qforge/layout.cuh"
#include "runtime/driver.h"
#include "runtime/tuning.h"

namespace qf::rt {

namespace {

CompileRequest quantize_request(const KernelSource& source, const std::string& arch) {
  CompileRequest req;
  req.source = source.source;
  req.source_name = "qforge_quantize.cu";
  for (const auto& kernel : source.kernels()) req.name_expressions.push_back(*kernel.name);
  req.arch = arch;
  return req;
}

nlohmann::json quantize_metadata(const Plan& plan, QuantizeForm form, Tiles tiles) {
  nlohmann::json m = {{"kind", "quantize"},
                      {"recipe", plan.recipe},
                      {"role", plan.role},
                      {"input", std::string(traits(plan.input).name)},
                      {"usage", std::string(name(plan.usage))},
                      {"form", std::string(name(form))}};
  if (tiles == Tiles::Interior) m["tiles"] = std::string(name(tiles));
  return m;
}

}  // namespace

QuantizeKernels build_quantize_kernels(const Plan& plan, QuantizeForm form, const std::string& arch, KernelCache& cache,
                                       Tiles tiles) {
  check_quantize_arch(arch);
  QuantizeKernels k;
  k.source = emit_quantize(plan, form, tiles);
  k.cached = cache.get_or_compile(quantize_request(k.source, arch), quantize_metadata(plan, form, tiles));
  return k;
}

std::optional<QuantizeKernels> find_quantize_kernels(const Plan& plan, QuantizeForm form, const std::string& arch,
                                                     KernelCache& cache, Tiles tiles) {
  check_quantize_arch(arch);
  QuantizeKernels k;
  k.source = emit_quantize(plan, form, tiles);
  auto hit = cache.find(quantize_request(k.source, arch), quantize_metadata(plan, form, tiles));
  if (!hit) return std::nullopt;
  k.cached = std::move(*hit);
  return k;
}

struct Quantizer::Form {
  QuantizeKernels kernels;
  std::shared_ptr<const Module> module;
  CUfunction cast = nullptr;
  CUfunction amax = nullptr;
  CUfunction row = nullptr;
  CUfunction fused = nullptr;  // the All form's
  int64_t fused_ctas = 0;      // how many CTAs of `fused` fit on the device at once
};

struct Quantizer::Loaded {
  int device = -1;
  std::string arch;
  Plan plan;              // plan_ with the device's tile
  KernelSource geometry;  // the separate form's source for any tiles: tile, threads (each loaded form launches with its own shared memory)
  int64_t fused_guaranteed = 0;  // fused_min_blocks x SMs: CTAs of the fused kernel certain to fit (0: no such form)
  int64_t sms = 0;               // the device's SM count
  // Guarded by Quantizer::mu_: the entries for any tiles, and those for interior tiles only.
  std::shared_ptr<const Form> separate, all, interior_separate, interior_all;
};

namespace {

bool one_launch_enabled() { return env_flag("QFORGE_ONE_LAUNCH", true); }
bool row_pass_enabled() { return env_flag("QFORGE_ROW_PASS", true); }
bool interior_programs_enabled() { return env_flag("QFORGE_INTERIOR_PROGRAMS", true); }

// Plans whose calls take the separate form (memsets, amax kernel, cast kernel) when the stream is
// capturing into a CUDA graph, though the fused form fits: those with per-column channel amaxes.
// Replayed from a graph a launch costs the GPU ~1 us and the host nothing, and for these plans the
// fused form's pre-pass between two grid barriers costs more than the two launches it saves:
// 1024^2, H100, GPU time per call in a graph (bench/results/h100/one_launch_vs_separate_1024_
// 2026-11-27.json): fp8_rowwise training 8.5 us separate vs 9.2 fused (back to back, where the
// host's launches count, 12.8 vs 10.6), int8_weight_sr's weight 14.8 vs 15.3 (18.9 vs 16.7);
// every other shipped plan is as fast or faster fused in a graph too (rows-only channel plans:
// fp8_rowwise inference 8.2 vs 7.3, W8A8 10.5 vs 9.7).
bool separate_in_capture(const Plan& plan) {
  for (const auto& a : plan.amax)
    if (a.scope == AmaxScope::Channel && a.channel_dir == Direction::Columnwise) return true;
  return false;
}

bool stream_capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // An error (e.g. the legacy stream while another thread captures globally) leaves the form
  // as it is; the launch reports the real problem.
  return driver().cuStreamIsCapturing(stream, &status) == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

}  // namespace

Quantizer::Quantizer(Plan plan, KernelCache& cache, bool use_tuning)
    : plan_(std::move(plan)), cache_(cache), use_tuning_(use_tuning), one_launch_(one_launch_enabled()),
      row_pass_(row_pass_enabled() && has_row_pass(plan_)), interior_programs_(interior_programs_enabled()),
      refuse_cooperative_(env_flag("QFORGE_TEST_COOPERATIVE_TOO_LARGE", false)) {
  verify(plan_);
  separate_in_capture_ = separate_in_capture(plan_);
  inputs_ = input_buffers(plan_);
  scale_input_.fill(-1);
  QF_CHECK(plan_.streams.size() <= scale_input_.size(), "plan with ", plan_.streams.size(), " streams");
  for (size_t i = 0; i < plan_.streams.size(); ++i) {
    if (!std::holds_alternative<PerTensorDelayed>(plan_.streams[i].scaling)) continue;
    const std::string n = scale_input_name(plan_, plan_.streams[i]);
    for (size_t j = 0; j < inputs_.size(); ++j)
      if (inputs_[j].name == n) scale_input_[i] = int(j);
  }
}

CacheHow Quantizer::prepare(const std::string& arch) const {
  // The complete program: every kernel a call may launch (the separate form's are in it too),
  // for any tiles, and for interior tiles only, which the calls of such shapes take.
  const CacheHow how = build_quantize_kernels(plan_, complete_form(plan_), arch, cache_).cached.how;
  if (interior_programs_) (void)build_quantize_kernels(plan_, complete_form(plan_), arch, cache_, Tiles::Interior);
  for (const auto& [mode, format] : history_rules(plan_)) (void)build_history_kernel(mode, format, arch, cache_);
  return how;
}

Quantizer::View Quantizer::load_for_current_device(const Shape2D* single) const {
  const int dev = current_device();
  // Whether the call may take the programs for interior tiles only (the tile is the device's).
  auto interior = [&](const Loaded& l) {
    return interior_programs_ && single && interior_tiles(l.geometry.tile, single->m, single->k);
  };
  {
    std::lock_guard<std::mutex> g(mu_);
    if (auto it = loaded_.find(dev); it != loaded_.end()) return view(it->second, interior(*it->second));
  }
  // The device's first call: its tile and geometry, no compile (each form's entry is loaded when
  // a call first needs it). A racing thread may do the same; the first one kept wins.
  auto l = std::make_shared<Loaded>();
  l->device = dev;
  l->arch = device_arch(dev);
  l->plan = plan_;
  if (use_tuning_)
    if (auto t = find_tuning(l->plan, l->arch, device_name(dev), cache_)) l->plan.tile = t->tile;
  l->geometry = emit_quantize(l->plan, separate_form(l->plan));
  l->sms = device_sm_count(dev);
  l->fused_guaranteed = int64_t(l->geometry.fused_min_blocks) * l->sms;
  std::lock_guard<std::mutex> g(mu_);
  const std::shared_ptr<Loaded>& kept = loaded_.emplace(dev, std::move(l)).first->second;
  return view(kept, interior(*kept));
}

// The All form serves the separate launches too (its cast, amax and row kernels are the separate
// form's, with the same code). A call of interior tiles takes a loaded program for interior tiles,
// else one for any tiles.
Quantizer::View Quantizer::view(const std::shared_ptr<Loaded>& l, bool interior) {
  std::shared_ptr<const Form> separate = l->separate ? l->separate : l->all;
  std::shared_ptr<const Form> all = l->all;
  if (interior) {
    if (l->interior_separate || l->interior_all) separate = l->interior_separate ? l->interior_separate : l->interior_all;
    if (l->interior_all) all = l->interior_all;
  }
  return {l, separate, all, interior};
}

std::shared_ptr<const Quantizer::Form> Quantizer::load_form(Loaded& l, QuantizeForm f, std::shared_ptr<const Form> have,
                                                            bool interior) const {
  if (have) return have;
  auto fm = std::make_shared<Form>();
  // What the cache holds serves without a compile, in this order: for interior tiles, their own
  // programs, then those for any tiles; for the separate launches of a plan with a fused kernel,
  // its complete program (prepare, `qforge prewarm`, a shipped root, another process).
  // Else the call compiles its form: the separate one in about 0.58 of the complete program's
  // time (docs/jit.md, step 5), for interior tiles without the edge tiles' code.
  const Tiles want = interior ? Tiles::Interior : Tiles::Any;
  const bool complete_too = f != complete_form(l.plan);
  std::vector<std::pair<QuantizeForm, Tiles>> found_by;
  if (interior) {
    found_by.emplace_back(f, Tiles::Interior);
    if (complete_too) found_by.emplace_back(QuantizeForm::All, Tiles::Interior);
  }
  if (complete_too) found_by.emplace_back(QuantizeForm::All, Tiles::Any);
  if (interior) found_by.emplace_back(f, Tiles::Any);
  Tiles tiles = want;
  for (const auto& [form, t] : found_by)
    if (auto hit = find_quantize_kernels(l.plan, form, l.arch, cache_, t)) {
      fm->kernels = std::move(*hit);
      f = form;
      tiles = t;
      break;
    }
  if (!fm->kernels.cached.entry) fm->kernels = build_quantize_kernels(l.plan, f, l.arch, cache_, want);
  const CacheEntry& entry = *fm->kernels.cached.entry;
  const KernelSource& ks = fm->kernels.source;
  fm->module = module_registry().get(l.device, entry.key, std::string_view(entry.image));
  fm->cast = fm->module->function(entry.lowered(ks.cast_kernel));
  allow_dynamic_smem(fm->cast, ks.smem_bytes);
  if (ks.amax_kernel) {
    fm->amax = fm->module->function(entry.lowered(*ks.amax_kernel));
    allow_dynamic_smem(fm->amax, ks.smem_bytes);
  }
  if (ks.row_kernel) fm->row = fm->module->function(entry.lowered(*ks.row_kernel));
  if (ks.fused_kernel) {
    // One kernel serves both forms where the program has no fused kernel of its own (codegen.h
    // own_fused_kernel): the cast's function, already looked up and given its shared memory.
    if (*ks.fused_kernel == ks.cast_kernel) {
      fm->fused = fm->cast;
    } else {
      fm->fused = fm->module->function(entry.lowered(*ks.fused_kernel));
      allow_dynamic_smem(fm->fused, ks.smem_bytes);
    }
    int per_sm = 0;
    check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fm->fused, ks.tile.threads, ks.smem_bytes),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor (fused quantize kernel)");
    fm->fused_ctas = int64_t(per_sm) * device_sm_count(l.device);
  }
  std::lock_guard<std::mutex> g(mu_);
  std::shared_ptr<const Form>& slot = tiles == Tiles::Interior ? (f == QuantizeForm::Separate ? l.interior_separate : l.interior_all)
                                                               : (f == QuantizeForm::Separate ? l.separate : l.all);
  if (!slot) slot = std::move(fm);
  return slot;
}

int64_t grouped_scale_capacity(const qf::Stream& s, Shape2D total, int members) {
  const ScalingTraits& t = traits(s.scaling);
  const int64_t sb = traits(t.scale_storage).bytes;
  if (sb == 0) return 0;
  const ScaleGrid g = scale_grid(s, total);
  // Modes without blocks store a flat grid: one entry of it (a per-tensor scale, a per-channel
  // scale over an extent of one) is one per member.
  if (!t.has_block && g.rows * g.cols == 1) return sb * members;
  // Each member may add one partial block per blocked dim and its own swizzle (mn_major) padding.
  const int64_t extra_rows = (g.swizzled ? 128 : g.mn_major ? 4 : 1) * int64_t(members);
  const int64_t extra_cols = (g.swizzled ? 4 : 1) * int64_t(members);
  return (g.padded_rows + extra_rows) * (g.padded_cols + extra_cols) * sb;
}

std::vector<BufferDesc> Quantizer::grouped_outputs(std::span<const int64_t> counts, int64_t k) const {
  std::vector<BufferDesc> total;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0) throw UserError("member_rows", "member " + std::to_string(i) + " has negative rows");
    // An empty member's buffers as the CPU reference sizes them (output_buffers of 0 rows): its
    // per-tensor scale and amax, a columnwise per-channel stream's K entries, nothing of its data,
    // block grids or rowwise per-channel entries. (A 1-row stand-in, zeroed except for
    // single-element scales, kept a rowwise per-channel entry the kernels do not write.)
    if (counts[i] > 0) check_shape(plan_, Shape2D{counts[i], k});
    const std::vector<BufferDesc> one = output_buffers(plan_, Shape2D{counts[i], k});
    if (total.empty()) {
      total = one;
    } else {
      for (size_t j = 0; j < total.size(); ++j) total[j].bytes += one[j].bytes;
    }
  }
  for (auto& b : total) b.shape = {b.bytes / storage_bytes(b.storage)};  // concatenation: flat
  return total;
}

namespace {
void check_members(int members) {
  if (members < 1 || members > (1 << 20))
    throw UserError("num_members", "expected 1..2^20 members, got " + std::to_string(members));
}
}  // namespace

// Measured on an H200, fp8_rowwise training (bf16, 4-tile segments of 128 x 128 tiles; a CTA
// issues one atomic per row, and the CTAs of a tile row issue theirs together):
// - one tile where the cast's tiles fit one wave of 4 CTAs per SM: 1024^2 in a CUDA graph took
//   8.7 us with one tile per CTA, 13.2 with 4;
// - two segments where one would leave more than kSegmentsPerRow CTAs (atomics) per tile row and
//   two keep more than 4 CTAs per SM: 16384^2 took 422.8 us with 4 tiles per CTA, 415.6 with 8;
//   4096 x 32768 227.7 and 220.4;
// - else one segment: 65536 x 7168 (14 segments a row) took 709.6 us with 4 tiles per CTA, 718.6
//   with 8, 719.5 with 14; 4096^2 35.5 with 4, 40.0 with 8 (its 128 CTAs one per SM).
uint64_t amax_group_tiles(uint64_t tile_rows, uint64_t tile_cols, int segment, int sms) {
  constexpr uint64_t kSegmentsPerRow = 16;
  const uint64_t ctas_per_wave = 4 * uint64_t(sms > 0 ? sms : 1);
  if (segment <= 1 || tile_rows * tile_cols <= ctas_per_wave) return 1;
  const uint64_t one = uint64_t(segment), two = 2 * one;
  const bool crowded = ceil_div(tile_cols, one) > kSegmentsPerRow;
  return crowded && tile_rows * ceil_div(tile_cols, two) > ctas_per_wave ? two : one;
}

int64_t Quantizer::workspace_bytes(Shape2D shape, int num_members) const {
  int64_t bytes = 0;
  for (const auto& a : plan_.amax) {
    if (a.scope != AmaxScope::Channel) continue;
    const int64_t n = a.channel_dir == Direction::Rowwise ? shape.m : int64_t(num_members) * shape.k;
    bytes += int64_t(round_up(u64(n * 4), 256));
  }
  return bytes;
}

// What every call of one shape needs, from output_buffers and the workspace rule.
struct Quantizer::Layout {
  Shape2D shape;
  int members = 1;
  bool grouped = false;
  std::vector<BufferDesc> outs;  // output_buffers(plan, shape): names, kinds, streams
  std::vector<int64_t> need;     // bytes each output must hold (grouped: the worst split)
  std::array<int, kMaxAmaxSlots> amax_out{};  // per amax source: index into outs, or -1
  int64_t input_bytes = 0;
  int64_t workspace = 0;
};

std::shared_ptr<const Quantizer::Layout> Quantizer::layout(Shape2D shape, int members, bool grouped) const {
  {
    std::lock_guard<std::mutex> g(layouts_mu_);
    for (const auto& l : layouts_)
      if (l->shape.m == shape.m && l->shape.k == shape.k && l->members == members && l->grouped == grouped) return l;
  }
  // Grouped member sizes live on the device: the caller guarantees the per-member rules of
  // check_shape (even rows for packed transposed data, 16-row groups for RHT); K's are checked.
  if (!grouped) check_shape(plan_, shape);
  else check_grouped_shape(plan_, shape);
  auto l = std::make_shared<Layout>();
  l->shape = shape;
  l->members = members;
  l->grouped = grouped;
  l->input_bytes = shape.m * shape.k * traits(plan_.input).bytes;
  // Single tensors must match output_buffers exactly; grouped buffers hold the concatenation of
  // members, whose sizes are only known on the device, so the bound is the worst case over any
  // split of M rows into `members` parts.
  l->outs = output_buffers(plan_, shape);
  for (const auto& b : l->outs) {
    int64_t need = b.bytes;
    if (b.kind == BufferKind::Amax) need = 4 * int64_t(members);
    else if (grouped && b.kind == BufferKind::ScaleInv) need = grouped_scale_capacity(plan_.streams[size_t(b.stream)], shape, members);
    l->need.push_back(need);
  }
  l->amax_out.fill(-1);
  for (size_t a = 0; a < plan_.amax.size(); ++a) {
    if (plan_.amax[a].scope != AmaxScope::Tensor) continue;
    const std::string n = amax_output_name(plan_, int(a));
    for (size_t i = 0; i < l->outs.size(); ++i)
      if (l->outs[i].name == n) l->amax_out[a] = int(i);
    QF_CHECK(l->amax_out[a] >= 0, "amax source ", a, " has no output buffer");
  }
  l->workspace = workspace_bytes(shape, members);
  std::lock_guard<std::mutex> g(layouts_mu_);
  // A few shapes recur in a framework's calls (weights, a handful of token counts); keep the
  // last ones.
  constexpr size_t kKept = 16;
  layouts_.insert(layouts_.begin(), l);
  if (layouts_.size() > kKept) layouts_.pop_back();
  return l;
}

std::vector<BufferDesc> Quantizer::grouped_capacity(Shape2D total, int members) const {
  check_members(members);
  const std::shared_ptr<const Layout> lay = layout(total, members, true);
  std::vector<BufferDesc> out = lay->outs;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].bytes = lay->need[i];
    out[i].shape = {out[i].bytes / storage_bytes(out[i].storage)};
  }
  return out;
}

BoundCall Quantizer::bind(const QuantizeCall& call) const {
  const bool grouped = call.member_rows != 0;
  const int members = grouped ? call.num_members : 1;
  if (grouped) check_members(members);
  // A call is grouped exactly when the quantizer was made for grouped tensors (PlanRequest::grouped,
  // qf_quantizer_create_ex's grouped): what the caller sized its buffers by (grouped_capacity or
  // outputs) follows from that, and a call that says otherwise would run as the other kind.
  if (!grouped && call.num_members != 0)
    throw UserError("member_rows", "null with num_members " + std::to_string(call.num_members) +
                                       ": a grouped call needs the members' device row offsets");
  if (grouped != plan_.grouped)
    throw UserError("member_rows", plan_.grouped ? "this quantizer is for grouped tensors: a call needs the members' "
                                                   "device row offsets [num_members + 1]"
                                                 : "this quantizer is for single tensors: expected no member_rows "
                                                   "(make it grouped for grouped calls)");
  const std::shared_ptr<const Layout> lay = layout(call.shape, members, grouped);

  // Input.
  check_dtype("input", call.input, plan_.input);
  if (!buffer_fits(call.input, lay->input_bytes, 16))
    check_buffer("input", call.input, lay->input_bytes, 16,
                 "input [" + std::to_string(call.shape.m) + ", " + std::to_string(call.shape.k) + "]");

  BoundCall bc;
  QuantizeArgs& args = bc.args;
  args.x = reinterpret_cast<const void*>(call.input.ptr);
  args.m = call.shape.m;
  args.k = call.shape.k;
  args.noop = reinterpret_cast<const float*>(call.noop);
  args.seed = call.seed;
  args.offset = call.offset;
  args.member_rows = reinterpret_cast<const i64*>(call.member_rows);
  args.num_members = members;

  // Every given name must be one of the plan's buffers; each found entry counts once.
  using Entry = std::map<std::string, TensorView>::const_iterator;
  std::array<Entry, BoundCall::kMaxZero> out_it;
  QF_CHECK(lay->outs.size() <= out_it.size(), "plan with ", lay->outs.size(), " outputs");
  size_t found = 0;
  for (size_t i = 0; i < lay->outs.size(); ++i) found += (out_it[i] = call.buffers.find(lay->outs[i].name)) != call.buffers.end();
  for (const auto& b : inputs_) found += call.buffers.count(b.name);
  if (found != call.buffers.size()) {
    for (const auto& [n, v] : call.buffers) {
      bool known = false;
      for (const auto& b : lay->outs) known |= b.name == n;
      for (const auto& b : inputs_) known |= b.name == n;
      if (!known) throw UserError(n, "this plan has no buffer named \"" + n + "\"");
    }
  }
  auto missing = [](const std::string& n) { return UserError(n, "missing buffer argument \"" + n + "\""); };
  // The other device pointers the kernels read: the members' row offsets and the no-op flag,
  // aligned for their loads and outside every buffer the call writes or zeroes first.
  const TensorView rows_view{call.member_rows, grouped ? (int64_t(members) + 1) * 8 : 0, std::nullopt, {}};
  const TensorView noop_view{call.noop, call.noop ? 4 : 0, std::nullopt, {}};
  if (grouped) check_buffer("member_rows", rows_view, rows_view.bytes, 8, "int64 [num_members + 1]");
  if (call.noop) check_buffer("noop", noop_view, 4, 4, "one float");

  for (size_t i = 0; i < lay->outs.size(); ++i) {
    const BufferDesc& b = lay->outs[i];
    if (out_it[i] == call.buffers.end()) throw missing(b.name);
    const TensorView& v = out_it[i]->second;
    const int64_t need = lay->need[i];
    check_buffer(b.name, v, need, b.kind == BufferKind::Data ? 16 : 4);
    for (auto it = call.buffers.begin(); it != call.buffers.end(); ++it)
      if (it != out_it[i]) check_disjoint(b.name, v, it->first, it->second);
    check_disjoint(b.name, v, "input", call.input);
    check_disjoint(b.name, v, "member_rows", rows_view);
    check_disjoint(b.name, v, "noop", noop_view);
    // Amax outputs accumulate atomically from zero; swizzled padding must read as zero. (The
    // scale entries of a grouped launch's empty members are written by the kernel; bytes past
    // the members' concatenation are left as they were.)
    if (b.kind == BufferKind::Amax || (b.kind == BufferKind::ScaleInv && b.zero_padding))
      bc.zero[size_t(bc.num_zero++)] = {v.ptr, need, b.kind == BufferKind::Amax};
    if (b.kind == BufferKind::Data) args.streams[b.stream].data = reinterpret_cast<void*>(v.ptr);
    if (b.kind == BufferKind::ScaleInv) args.streams[b.stream].scale_inv = reinterpret_cast<void*>(v.ptr);
  }
  for (size_t a = 0; a < plan_.amax.size(); ++a)
    if (lay->amax_out[a] >= 0) args.amax[a] = reinterpret_cast<float*>(out_it[size_t(lay->amax_out[a])]->second.ptr);
  for (size_t j = 0; j < inputs_.size(); ++j) {
    const auto it = call.buffers.find(inputs_[j].name);
    if (it == call.buffers.end()) throw missing(inputs_[j].name);
    check_buffer(inputs_[j].name, it->second, 4, 4);
    for (size_t i = 0; i < plan_.streams.size(); ++i)
      if (scale_input_[i] == int(j)) args.streams[i].scale_in = reinterpret_cast<const float*>(it->second.ptr);
  }
  if (lay->workspace > 0) {
    check_buffer("workspace", call.workspace, lay->workspace, 256);
    // Zeroed before the kernels run: it must not hold anything the call reads.
    const TensorView ws{call.workspace.ptr, lay->workspace, std::nullopt, {}};
    check_disjoint("workspace", ws, "input", call.input);
    for (const auto& [n, v] : call.buffers) check_disjoint("workspace", ws, n, v);
    check_disjoint("workspace", ws, "member_rows", rows_view);
    check_disjoint("workspace", ws, "noop", noop_view);
    bc.zero[size_t(bc.num_zero++)] = {call.workspace.ptr, lay->workspace, true};
    uint64_t p = call.workspace.ptr;
    for (size_t a = 0; a < plan_.amax.size(); ++a) {
      if (plan_.amax[a].scope != AmaxScope::Channel) continue;
      args.amax[a] = reinterpret_cast<float*>(p);
      const int64_t n = plan_.amax[a].channel_dir == Direction::Rowwise ? call.shape.m : int64_t(members) * call.shape.k;
      p += round_up(u64(n * 4), 256);
    }
  }
  return bc;
}

namespace {

// One CTA per tile. Grouped: sum(ceil(m_i / rows)) <= ceil(M / rows) + N tile rows, plus one row
// of CTAs for the scale entries of empty members.
Dim3 cast_grid(const TileConfig& t, Shape2D shape, int grouped_members) {
  const uint64_t tile_rows = ceil_div(u64(shape.m), u64(t.rows)) + (grouped_members > 0 ? u64(grouped_members) + 1 : 0);
  const Dim3 grid{unsigned(tile_rows), unsigned(ceil_div(u64(shape.k), u64(t.cols))), 1};
  if (tile_rows > 0x7fffffffu || grid.y > 65535)
    throw UserError("input", "tensor too large for one launch (" + std::to_string(tile_rows) + " x " + std::to_string(grid.y) + " tiles)");
  return grid;
}

}  // namespace

// A single tensor whose tiles all fit on the GPU at once: one cooperative launch of the fused
// kernel, which zeroes the amax outputs and the channel workspace and folds the amax pre-pass
// in. Every stream operation costs microseconds of host and GPU time, which is most of a small
// call. Before the fused kernel is loaded its occupancy is not known, only the lower bound its
// launch bounds give; once loaded, its occupancy decides.
bool Quantizer::fits_one_launch(const Loaded& l, const Form* all, int64_t ctas, bool grouped) const {
  if (!one_launch_ || grouped || l.fused_guaranteed == 0) return false;
  return ctas <= (all ? all->fused_ctas : l.fused_guaranteed);
}

// The warps of row_kernel that own one row of K elements (cast.cuh row_warps, the same rule),
// or 0 where the row does not fit the CTA's registers or its 16-byte chunks.
int Quantizer::row_pass_warps(Shape2D shape) const {
  if (!row_pass_ || shape.m <= 0 || shape.k <= 0) return 0;
  const int64_t elems = 16 / int64_t(traits(plan_.input).bytes);
  constexpr int64_t kThreads = 256, kChunks = 8;  // codegen's CfgRow
  const int64_t chunks = shape.k / elems;
  if (shape.k % elems != 0 || chunks > kThreads * kChunks) return 0;
  int64_t w = 1;
  while (w < kThreads / 32 && 32 * w * kChunks < chunks) w *= 2;
  return int(w);
}

bool Quantizer::row_pass(Shape2D shape) const { return row_pass_warps(shape) > 0; }

bool Quantizer::interior_programs(Shape2D shape) const { return load_for_current_device(&shape).interior; }

bool Quantizer::one_launch(Shape2D shape) const {
  const View v = load_for_current_device(&shape);
  const Dim3 grid = cast_grid(v.device->geometry.tile, shape, 0);
  const int64_t ctas = int64_t(grid.x) * grid.y;
  if (!fits_one_launch(*v.device, v.all.get(), ctas, false)) return false;
  // Loaded, as a call would load it: its occupancy decides.
  const auto all = load_form(*v.device, QuantizeForm::All, v.all, v.interior);
  return fits_one_launch(*v.device, all.get(), ctas, false);
}

void Quantizer::quantize(const QuantizeCall& call, CUstream stream) const {
  const BoundCall bc = bind(call);
  const bool grouped = call.member_rows != 0;
  const View v = load_for_current_device(grouped ? nullptr : &call.shape);
  Loaded& l = *v.device;
  const Driver& d = driver();
  const KernelSource& geo = l.geometry;
  const TileConfig& t = geo.tile;
  const Dim3 grid = cast_grid(t, call.shape, grouped ? bc.args.num_members : 0);
  const int64_t ctas = int64_t(grid.x) * grid.y;
  QuantizeArgs args = bc.args;
  void* params[] = {&args};
  const Dim3 block{unsigned(t.threads)};

  // Which kernels serve the call, decided before anything is enqueued: the row kernel where the
  // rows fit it, else the fused kernel where the grid fits it, else the separate launches. The
  // fused kernel is in the All form's entry, the others in both: the separate form's entry is
  // loaded (compiled on a miss, unless the cache has the All form's) only where the All form is
  // not loaded. Rows that fit a CTA take the one-pass row kernel (no amax pre-pass, no channel
  // workspace). A grouped call's rowwise per-channel outputs are its members' concatenated (one
  // scale entry per row, no padding; the members' offsets end at M), so the kernel takes them as
  // one tensor.
  const int warps = call.input.ptr % 16 != 0 || !geo.row_kernel ? 0 : row_pass_warps(call.shape);
  enum class Take { Row, Fused, Separate } take = Take::Separate;
  if (warps > 0) take = Take::Row;
  else if (fits_one_launch(l, v.all.get(), ctas, grouped) && !(separate_in_capture_ && stream_capturing(stream)))
    take = Take::Fused;
  // A capture loads nothing where a loaded entry can serve the call (both forms write the same bits).
  if (take == Take::Fused && !v.all && v.separate && stream_capturing(stream)) take = Take::Separate;
  std::shared_ptr<const Form> f;
  if (take == Take::Fused) {
    f = load_form(l, QuantizeForm::All, v.all, v.interior);
    if (!fits_one_launch(l, f.get(), ctas, grouped)) take = Take::Separate;  // occupancy below its launch bounds' promise
  } else {
    f = load_form(l, separate_form(l.plan), v.separate, v.interior);
  }

  // The loaded program's shared memory: a program for interior tiles only may ask less than the
  // geometry's (compiler/codegen.cpp, register_pair).
  const size_t smem = f->kernels.source.smem_bytes;
  auto zero_buffers = [&](bool fused_zeroes) {
    for (int i = 0; i < bc.num_zero; ++i)
      if (bc.zero[size_t(i)].fused_zeroes == fused_zeroes)
        check(d.cuMemsetD8Async(CUdeviceptr(bc.zero[size_t(i)].ptr), 0, size_t(bc.zero[size_t(i)].bytes), stream),
              "zeroing amax / padded scales");
  };
  zero_buffers(false);
  if (take == Take::Row) {
    QF_CHECK(geo.row_threads == 256 && geo.row_chunks == 8 && f->row, "row kernel's CTA as row_pass_warps assumes");
    const uint64_t rows_per_cta = uint64_t(256 / 32 / warps);
    launch(f->row, Dim3{unsigned(ceil_div(uint64_t(call.shape.m), rows_per_cta))}, Dim3{256}, 0, stream, params, {},
           SmemLimit::kPrepared);
    return;
  }
  if (take == Take::Fused) {
    CUlaunchAttribute coop{};
    coop.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    coop.value.cooperative = 1;
    try {
      if (refuse_cooperative_)
        throw CudaError(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "cooperative launch refused (QFORGE_TEST_COOPERATIVE_TOO_LARGE=1)");
      args.one_launch = 1;  // read by a kernel that serves both forms (cast_fused_kernel)
      launch(f->fused, grid, block, smem, stream, params, {&coop, 1}, SmemLimit::kPrepared);
      return;
    } catch (const CudaError& e) {
      // Fewer SMs than the device has (MPS, green contexts): the separate launches, whose kernels
      // are in the All form's entry too.
      if (e.code() != CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) throw;
      args.one_launch = 0;
    }
  }
  zero_buffers(true);
  if (f->amax) {
    Dim3 amax_grid = grid;
    amax_grid.y = unsigned(ceil_div(u64(grid.y), amax_group_tiles(grid.x, grid.y, geo.amax_tiles, l.sms)));
    launch(f->amax, amax_grid, block, smem, stream, params, {}, SmemLimit::kPrepared);
  }
  launch(f->cast, grid, block, smem, stream, params, {}, SmemLimit::kPrepared);
}

void check_quantize_arch(const std::string& arch) {
  CompileRequest probe;  // a malformed or unknown arch: compile_options says so, naming it
  probe.arch = arch;
  (void)compile_options(probe);
  int number = 0;
  for (size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9'; ++i) number = number * 10 + (arch[i] - '0');
  if (number < 80)
    throw UserError("arch", "the quantize kernels need sm_80 or newer (bf16 arithmetic), got \"" + arch + "\"");
}

QuantizeKernels build_history_kernel(const PerTensorDelayed& mode, ElemFormat format, const std::string& arch,
                                     KernelCache& cache) {
  check_quantize_arch(arch);
  QuantizeKernels k;
  k.source = emit_history_update(mode, format);
  const CompileRequest req{k.source.source, "qforge_history.cu", {k.source.cast_kernel}, arch};
  k.cached = cache.get_or_compile(req, nlohmann::json{{"kind", "amax_history"}});
  return k;
}

std::vector<std::pair<PerTensorDelayed, ElemFormat>> history_rules(const Plan& plan) {
  std::vector<std::pair<PerTensorDelayed, ElemFormat>> out;
  for (const auto& s : plan.streams)
    if (const auto* d = std::get_if<PerTensorDelayed>(&s.scaling)) {
      const std::pair<PerTensorDelayed, ElemFormat> rule{*d, s.format};
      if (std::find(out.begin(), out.end(), rule) == out.end()) out.push_back(rule);
    }
  return out;
}

void update_amax_history(const PerTensorDelayed& mode, ElemFormat format, const HistoryCall& call,
                         CUstream stream, KernelCache& cache) {
  check_buffer("history", call.history, int64_t(mode.history_length) * 4, 4);
  check_buffer("amax", call.amax, 4, 4);
  check_buffer("scale", call.scale, 4, 4);
  if (call.scale_inv.ptr) check_buffer("scale_inv", call.scale_inv, 4, 4);
  check_disjoint("history", call.history, "scale", call.scale);
  check_disjoint("history", call.history, "amax", call.amax);
  check_disjoint("amax", call.amax, "scale", call.scale);
  if (call.scale_inv.ptr) {  // written after the scale: aliasing either would leave 1 / scale in it
    check_disjoint("scale_inv", call.scale_inv, "history", call.history);
    check_disjoint("scale_inv", call.scale_inv, "scale", call.scale);
    check_disjoint("scale_inv", call.scale_inv, "amax", call.amax);
  }
  const int dev = current_device();
  // A training step updates every delayed-scaling tensor's history: after the first update of a
  // rule on a device, its function comes from here, without codegen, hashing or a cache lookup.
  // The kernel depends on the rule and the format only (and the device's arch), not on the cache
  // that built it. Never destroyed, like the module registry: usable until the process ends.
  struct Loaded {
    std::shared_ptr<const Module> module;
    CUfunction f = nullptr;
    unsigned threads = 0;
  };
  using Key = std::tuple<int, int, int, int, int>;
  static std::mutex& mu = *new std::mutex;
  static std::map<Key, Loaded>& loaded = *new std::map<Key, Loaded>;
  const Key key{dev, mode.margin, mode.history_length, int(mode.amax_compute), int(format)};
  Loaded fn;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = loaded.find(key); it != loaded.end()) fn = it->second;
  }
  if (!fn.f) {
    const QuantizeKernels k = build_history_kernel(mode, format, device_arch(dev), cache);
    fn.module = module_registry().get(dev, k.cached.entry->key, std::string_view(k.cached.entry->image));
    fn.f = fn.module->function(k.cached.entry->lowered(k.source.cast_kernel));
    fn.threads = unsigned(k.source.tile.threads);
    std::lock_guard<std::mutex> lock(mu);
    loaded.emplace(key, fn);
  }
  HistoryArgs args{reinterpret_cast<float*>(call.history.ptr), reinterpret_cast<const float*>(call.amax.ptr),
                   reinterpret_cast<float*>(call.scale.ptr), reinterpret_cast<float*>(call.scale_inv.ptr),
                   reinterpret_cast<const float*>(call.noop)};
  void* params[] = {&args};
  launch(fn.f, Dim3{1}, Dim3{fn.threads}, 0, stream, params);
}

// ------------------------------------------------------------------------ batched history update

namespace {
int history_threads(int length) { return length >= 1024 ? 1024 : 32 * ((length + 31) / 32); }
}  // namespace

KernelSource emit_history_batch(int history_length) {
  QF_CHECK(history_length >= 1 && history_length <= 65536, "history length");
  Emitter e;
  e.comment("Generated by qforge (runtime/quantizer.cpp): batched delayed-scaling amax history update.");
  e.line("#include \"qforge/history.cuh\"");
  e.blank();
  e.open("namespace qf_gen");
  e.open("struct HistoryBatchCfg");
  e.constant("kLength", int64_t(history_length));
  e.constant("kThreads", int64_t(history_threads(history_length)));
  e.close(";");
  e.close("  // namespace qf_gen");
  KernelSource ks;
  ks.source = e.str();
  ks.cast_kernel = "qf::amax_history_batch_kernel<qf_gen::HistoryBatchCfg>";
  ks.tile = TileConfig{1, history_length, history_threads(history_length), 1};
  return ks;
}

QuantizeKernels build_history_batch_kernel(int history_length, const std::string& arch, KernelCache& cache) {
  check_quantize_arch(arch);
  QuantizeKernels k;
  k.source = emit_history_batch(history_length);
  const CompileRequest req{k.source.source, "qforge_history_batch.cu", {k.source.cast_kernel}, arch};
  k.cached = cache.get_or_compile(req, nlohmann::json{{"kind", "amax_history_batch"}});
  return k;
}

void check_history_batch(const std::vector<HistoryBatchItem>& items) {
  if (items.empty()) throw UserError("items", "expected at least one delayed-scaling tensor");
  struct Range {
    uint64_t lo, hi;
    size_t item;
    const char* what;
  };
  std::vector<Range> written;
  for (size_t i = 0; i < items.size(); ++i) {
    const HistoryBatchItem& it = items[i];
    const std::string at = "items[" + std::to_string(i) + "].";
    if (it.format != ElemFormat::E4M3 && it.format != ElemFormat::E5M2)
      throw UserError(at + "format", "delayed scaling is fp8 (e4m3 or e5m2), got " + std::string(traits(it.format).name));
    if (it.mode.history_length < 1 || it.mode.history_length > 65536)
      throw UserError(at + "history", "expected a history length in [1, 65536], got " +
                                          std::to_string(it.mode.history_length));
    // The per-tensor update's checks, each buffer named by its item.
    check_buffer(at + "history", it.history, int64_t(it.mode.history_length) * 4, 4);
    check_buffer(at + "amax", it.amax, 4, 4);
    check_buffer(at + "scale", it.scale, 4, 4);
    if (it.scale_inv.ptr) check_buffer(at + "scale_inv", it.scale_inv, 4, 4);
    check_disjoint(at + "history", it.history, at + "scale", it.scale);
    check_disjoint(at + "history", it.history, at + "amax", it.amax);
    check_disjoint(at + "amax", it.amax, at + "scale", it.scale);
    if (it.scale_inv.ptr) {
      check_disjoint(at + "scale_inv", it.scale_inv, at + "history", it.history);
      check_disjoint(at + "scale_inv", it.scale_inv, at + "scale", it.scale);
      check_disjoint(at + "scale_inv", it.scale_inv, at + "amax", it.amax);
    }
    written.push_back({it.history.ptr, it.history.ptr + uint64_t(it.mode.history_length) * 4, i, "history"});
    written.push_back({it.scale.ptr, it.scale.ptr + 4, i, "scale"});
    if (it.scale_inv.ptr) written.push_back({it.scale_inv.ptr, it.scale_inv.ptr + 4, i, "scale_inv"});
  }
  // Entries run in parallel: what one writes must not be another's buffer (written or read).
  std::sort(written.begin(), written.end(),
            [](const Range& a, const Range& b) { return a.lo != b.lo ? a.lo < b.lo : a.item < b.item; });
  const auto clash = [](const Range& a, const Range& b, const std::string& b_what) {
    return UserError("items[" + std::to_string(b.item) + "]." + b_what,
                     "overlaps items[" + std::to_string(a.item) + "]." + a.what +
                         ", which the same batched update writes");
  };
  for (size_t j = 1; j < written.size(); ++j)
    if (written[j].lo < written[j - 1].hi) throw clash(written[j - 1], written[j], written[j].what);
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t lo = items[i].amax.ptr, hi = lo + 4;
    auto it = std::upper_bound(written.begin(), written.end(), lo, [](uint64_t v, const Range& r) { return v < r.lo; });
    // The range starting at or before lo, and the one after it, are the only ones that can overlap.
    for (auto r = it == written.begin() ? it : it - 1; r != written.end() && r->lo < hi; ++r)
      if (r->item != i && lo < r->hi) throw clash(*r, Range{lo, hi, i, "amax"}, "amax");
  }
}

HistoryBatch::HistoryBatch(std::vector<HistoryBatchItem> items, KernelCache& cache) {
  check_history_batch(items);

  // Entries grouped by history length, one table on the device, one kernel per length.
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return items[a].mode.history_length < items[b].mode.history_length;
  });
  std::vector<HistoryBatchEntry> table;
  for (size_t i : order) {
    const HistoryBatchItem& it = items[i];
    table.push_back(HistoryBatchEntry{reinterpret_cast<float*>(it.history.ptr), reinterpret_cast<const float*>(it.amax.ptr),
                                      reinterpret_cast<float*>(it.scale.ptr), reinterpret_cast<float*>(it.scale_inv.ptr),
                                      traits(it.format).max_finite, i32(it.mode.margin),
                                      i32(it.mode.amax_compute == AmaxCompute::MostRecent ? 1 : 0)});
  }
  device_ = current_device();
  const std::string arch = device_arch(device_);
  size_ = items.size();
  auto& d = driver();
  check(d.cuMemAlloc(&table_, table.size() * sizeof(HistoryBatchEntry)), "cuMemAlloc (history batch table)");
  try {
    check(d.cuMemcpyHtoD(table_, table.data(), table.size() * sizeof(HistoryBatchEntry)),
          "cuMemcpyHtoD (history batch table)");
    for (size_t j = 0; j < order.size();) {
      const int length = items[order[j]].mode.history_length;
      size_t end = j;
      while (end < order.size() && items[order[end]].mode.history_length == length) ++end;
      const QuantizeKernels k = build_history_batch_kernel(length, arch, cache);
      Group g;
      g.length = length;
      g.count = int(end - j);
      g.entries = uint64_t(table_) + j * sizeof(HistoryBatchEntry);
      g.module = module_registry().get(device_, k.cached.entry->key, std::string_view(k.cached.entry->image));
      g.f = g.module->function(k.cached.entry->lowered(k.source.cast_kernel));
      g.threads = unsigned(k.source.tile.threads);
      groups_.push_back(std::move(g));
      j = end;
    }
  } catch (...) {
    d.cuMemFree(table_);
    throw;
  }
}

HistoryBatch::~HistoryBatch() {
  if (table_ && driver_alive()) {
    ScopedContext ctx(primary_context(device_)->get());
    driver().cuMemFree(table_);
  }
}

void HistoryBatch::run(uint64_t noop, CUstream stream) const {
  if (current_device() != device_)
    throw UserError("device", "the batch's table lives on device " + std::to_string(device_) +
                                  ", the current context is device " + std::to_string(current_device()));
  const int64_t cap = int64_t(device_sm_count(device_)) * 4;
  for (const Group& g : groups_) {
    HistoryBatchArgs args{reinterpret_cast<const HistoryBatchEntry*>(g.entries), i32(g.count),
                          reinterpret_cast<const float*>(noop)};
    void* params[] = {&args};
    launch(g.f, Dim3{unsigned(std::min<int64_t>(g.count, cap))}, Dim3{g.threads}, 0, stream, params);
  }
}

}  // namespace qf::rt
