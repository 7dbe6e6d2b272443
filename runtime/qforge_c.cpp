// The C API (runtime/qforge.h) over Recipe / compile_plan / rt::Quantizer. Every entry point
// catches every exception and turns it into a qf_status plus a thread-local message.
#include "runtime/qforge.h"

#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "compiler/buffers.h"
#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "runtime/driver.h"
#include "runtime/gemm.h"
#include "runtime/kernel_cache.h"
#include "runtime/log.h"
#include "runtime/quantizer.h"

struct qf_context {
  std::vector<qf::Recipe> recipes;
};

struct qf_quantizer {
  std::unique_ptr<qf::rt::Quantizer> q;
  // Interned strings handed out as const char* (std::set nodes never move).
  mutable std::mutex mu;
  mutable std::set<std::string> strings;
  const char* intern(const std::string& s) const {
    std::lock_guard lock(mu);
    return strings.insert(s).first->c_str();
  }
};

struct qf_gemm {
  std::unique_ptr<qf::rt::Gemm> g;
  std::string description;
};

namespace {

thread_local std::string g_last_error;

qf_status fail(qf_status s, std::string msg) {
  g_last_error = std::move(msg);
  return s;
}

// Runs f, mapping exceptions to statuses. f returns nothing; success clears the message.
template <typename F>
qf_status guarded(F&& f) noexcept {
  try {
    g_last_error.clear();
    f();
    return QF_OK;
  } catch (const qf::UserError& e) {
    return fail(QF_ERR_USER, e.what());
  } catch (const qf::rt::CudaError& e) {
    return fail(QF_ERR_CUDA, e.what());
  } catch (const qf::InternalError& e) {
    return fail(QF_ERR_INTERNAL, e.what());
  } catch (const std::bad_alloc&) {
    return fail(QF_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return fail(QF_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(QF_ERR_INTERNAL, "internal error: unknown exception");
  }
}

void require(const void* p, const char* arg) {
  if (!p) throw qf::UserError(arg, "must not be NULL");
}

// An int field or argument that is a flag: 0 or 1, anything else named.
bool flag01(int v, const char* field) {
  if (v != 0 && v != 1) throw qf::UserError(field, "expected 0 or 1, got " + std::to_string(v));
  return v == 1;
}

qf::DType to_dtype(qf_dtype d) {
  switch (d) {
    case QF_DTYPE_FP32: return qf::DType::FP32;
    case QF_DTYPE_BF16: return qf::DType::BF16;
    case QF_DTYPE_FP16: return qf::DType::FP16;
  }
  throw qf::UserError("input", "unknown qf_dtype " + std::to_string(int(d)) +
                                   " (expected QF_DTYPE_FP32, QF_DTYPE_BF16 or QF_DTYPE_FP16)");
}

std::optional<qf::Usage> to_usage(qf_usage u) {
  switch (u) {
    case QF_USAGE_DEFAULT: return std::nullopt;
    case QF_USAGE_TRAINING: return qf::Usage::Training;
    case QF_USAGE_INFERENCE: return qf::Usage::Inference;
    case QF_USAGE_MEMORY: return qf::Usage::Memory;
  }
  throw qf::UserError("usage", "unknown qf_usage " + std::to_string(int(u)) +
                                   " (expected QF_USAGE_DEFAULT, _TRAINING, _INFERENCE or _MEMORY)");
}

void fill_info(const qf_quantizer* q, const qf::BufferDesc& b, qf_buffer_info* out) {
  if (b.shape.size() > 4)
    throw qf::InternalError(__FILE__, __LINE__, "buffer " + b.name + " has more than 4 dims");
  qf_buffer_info info{};
  info.name = q->intern(b.name);
  info.dtype = q->intern(b.dtype);
  info.kind = static_cast<qf_buffer_kind>(static_cast<int>(b.kind));
  info.element_size = int(qf::storage_bytes(b.storage));
  info.stream = b.stream;
  info.zero_padding = b.zero_padding ? 1 : 0;
  info.ndim = int(b.shape.size());
  for (size_t i = 0; i < b.shape.size(); ++i) info.shape[i] = b.shape[i];
  info.bytes = b.bytes;
  info.scale_layout = b.scale_layout.empty() ? nullptr : q->intern(b.scale_layout);
  *out = info;
}

void check_index(int index, size_t count, const char* what) {
  if (index < 0 || size_t(index) >= count)
    throw qf::UserError("index", "index " + std::to_string(index) + " out of range: the quantizer has " +
                                     std::to_string(count) + " " + what);
}

const qf::Recipe& find_recipe(const qf_context* ctx, const char* recipe_name) {
  if (!recipe_name) {
    if (ctx->recipes.size() != 1)
      throw qf::UserError("recipe_name", "NULL needs a context of exactly one recipe; this one has " +
                                             std::to_string(ctx->recipes.size()));
    return ctx->recipes[0];
  }
  std::string names;
  for (const auto& r : ctx->recipes) {
    if (r.name == recipe_name) return r;
    names += (names.empty() ? "" : ", ") + r.name;
  }
  throw qf::UserError("recipe_name", std::string("no recipe named \"") + recipe_name +
                                         "\" in the context (have: " + names + ")");
}

qf::GemmSpec to_gemm_spec(const qf_gemm_spec& c) {
  qf::GemmSpec s;
  require(c.scaling, "spec->scaling");
  const auto sc = qf::parse_gemm_scaling(c.scaling);
  if (!sc)
    throw qf::UserError("spec->scaling",
                        std::string("expected tensor, rowwise, blockwise, mxfp8, nvfp4, none or channel, got \"") + c.scaling + "\"");
  s.scaling = *sc;
  auto format = [&](const char* name, const char* field, bool b_side) {
    // which combinations a scaling takes: qf::validate
    const char* other = b_side ? c.a_format : c.b_format;
    return qf::parse_gemm_format(name ? std::string_view(name)
                                      : qf::default_gemm_format(s.scaling, b_side, other ? std::string_view(other) : std::string_view()),
                                 field);
  };
  qf::set_gemm_formats(s, format(c.a_format, "spec->a_format", false), format(c.b_format, "spec->b_format", true),
                       "spec->b_format");
  s.n = c.n, s.k = c.k;
  if (c.out_dtype) {
    const auto d = qf::parse_dtype(c.out_dtype);
    if (!d || (*d != qf::DType::BF16 && *d != qf::DType::FP32))
      throw qf::UserError("spec->out_dtype", std::string("expected bf16 or fp32, got \"") + c.out_dtype + "\"");
    s.out_dtype = *d;
  }
  s.accumulate = flag01(c.accumulate, "spec->accumulate");
  s.fast_accum = flag01(c.fast_accum, "spec->fast_accum");
  s.tile = {c.block_m, c.block_n, c.stages, c.multicast, c.raster_m, c.ordered};
  if (c.scale_layout) s.scale_layout = qf::parse_gemm_scale_layout(c.scale_layout, "spec->scale_layout");
  if (c.route) s.route = qf::parse_gemm_route(c.route, "spec->route");
  if (c.layout) s.layout = qf::parse_gemm_layout(c.layout, "spec->layout");
  s.m = c.m;  // (validate: k-grouped rows, or 0)
  try {  // the spec's own rules, named as the caller's fields ("spec->tile.block_n: ...")
    qf::validate(s);
  } catch (const qf::UserError& e) {
    throw qf::UserError("spec->" + e.where(), e.message());
  }
  return s;
}

qf_gemm* new_gemm(const qf::GemmSpec& spec) {
  auto g = std::make_unique<qf_gemm>();
  g->g = std::make_unique<qf::rt::Gemm>(spec);
  g->description = qf::describe(g->g->spec());
  return g.release();
}

}  // namespace

extern "C" {

const char* qf_last_error(void) { return g_last_error.c_str(); }

const char* qf_version(void) { return QFORGE_VERSION; }

qf_status qf_context_create(const char* const* recipe_paths, int n, qf_context** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    if (n <= 0) throw qf::UserError("n", "expected at least one recipe path, got " + std::to_string(n));
    require(recipe_paths, "recipe_paths");
    auto ctx = std::make_unique<qf_context>();
    for (int i = 0; i < n; ++i) {
      if (!recipe_paths[i])
        throw qf::UserError("recipe_paths[" + std::to_string(i) + "]", "must not be NULL");
      const std::string path = recipe_paths[i];
      std::error_code ec;
      if (!std::filesystem::is_regular_file(path, ec))
        throw qf::UserError(path, "no such recipe file (recipe_paths[" + std::to_string(i) + "])");
      ctx->recipes.push_back(qf::load_recipe(path));
    }
    for (size_t i = 0; i < ctx->recipes.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (ctx->recipes[i].name == ctx->recipes[j].name)
          throw qf::UserError(recipe_paths[i], "recipe name \"" + ctx->recipes[i].name +
                                                   "\" is also the name of " + recipe_paths[j]);
    *out = ctx.release();
  });
}

qf_status qf_context_create_from_json(const char* json, qf_context** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    require(json, "json");
    auto ctx = std::make_unique<qf_context>();
    ctx->recipes.push_back(qf::parse_recipe(json));
    *out = ctx.release();
  });
}

void qf_context_destroy(qf_context* ctx) { delete ctx; }

qf_status qf_context_num_recipes(const qf_context* ctx, int* out) {
  return guarded([&] {
    require(ctx, "ctx");
    require(out, "out");
    *out = int(ctx->recipes.size());
  });
}

qf_status qf_context_recipe_name(const qf_context* ctx, int index, const char** out) {
  return guarded([&] {
    require(ctx, "ctx");
    require(out, "out");
    if (index < 0 || size_t(index) >= ctx->recipes.size())
      throw qf::UserError("index", "index " + std::to_string(index) + " out of range: the context has " +
                                       std::to_string(ctx->recipes.size()) + " recipes");
    *out = ctx->recipes[size_t(index)].name.c_str();
  });
}

qf_status qf_quantizer_create_ex(qf_context* ctx, const char* recipe_name, const char* role,
                                 qf_dtype input, qf_usage usage, int grouped, qf_quantizer** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    require(ctx, "ctx");
    require(role, "role");
    const qf::Recipe* recipe = &find_recipe(ctx, recipe_name);
    const bool is_grouped = flag01(grouped, "grouped");
    qf::PlanRequest req{role, to_dtype(input), to_usage(usage), is_grouped};
    auto q = std::make_unique<qf_quantizer>();
    q->q = std::make_unique<qf::rt::Quantizer>(qf::compile_plan(*recipe, req));
    *out = q.release();
  });
}

qf_status qf_quantizer_create(qf_context* ctx, const char* recipe_name, const char* role,
                              qf_dtype input, qf_usage usage, qf_quantizer** out) {
  return qf_quantizer_create_ex(ctx, recipe_name, role, input, usage, 0, out);
}

void qf_quantizer_destroy(qf_quantizer* q) { delete q; }

qf_status qf_quantizer_num_outputs(const qf_quantizer* q, int* out) {
  return guarded([&] {
    require(q, "q");
    require(out, "out");
    *out = int(q->q->outputs(qf::Shape2D{256, 256}).size());
  });
}

qf_status qf_quantizer_output_info(const qf_quantizer* q, int64_t m, int64_t k, int index,
                                   qf_buffer_info* out) {
  return guarded([&] {
    require(q, "q");
    require(out, "out");
    const qf::Shape2D shape{m, k};
    qf::check_shape(q->q->plan(), shape);
    const auto bufs = q->q->outputs(shape);
    check_index(index, bufs.size(), "outputs");
    fill_info(q, bufs[size_t(index)], out);
  });
}

qf_status qf_quantizer_grouped_output_info(const qf_quantizer* q, int64_t m_total, int64_t k,
                                           int num_members, int index, qf_buffer_info* out) {
  return guarded([&] {
    require(q, "q");
    require(out, "out");
    const auto bufs = q->q->grouped_capacity(qf::Shape2D{m_total, k}, num_members);
    check_index(index, bufs.size(), "outputs");
    fill_info(q, bufs[size_t(index)], out);
  });
}

qf_status qf_quantizer_num_inputs(const qf_quantizer* q, int* out) {
  return guarded([&] {
    require(q, "q");
    require(out, "out");
    *out = int(q->q->inputs().size());
  });
}

qf_status qf_quantizer_input_info(const qf_quantizer* q, int index, qf_buffer_info* out) {
  return guarded([&] {
    require(q, "q");
    require(out, "out");
    const auto bufs = q->q->inputs();
    check_index(index, bufs.size(), "inputs");
    fill_info(q, bufs[size_t(index)], out);
  });
}

qf_status qf_quantizer_workspace_bytes(const qf_quantizer* q, int64_t m, int64_t k,
                                       int num_members, int64_t* out) {
  return guarded([&] {
    require(q, "q");
    require(out, "out");
    if (num_members < 1 || num_members > (1 << 20))
      throw qf::UserError("num_members", "expected 1..2^20, got " + std::to_string(num_members));
    const qf::Shape2D shape{m, k};
    if (q->q->plan().grouped) qf::check_grouped_shape(q->q->plan(), shape);
    else qf::check_shape(q->q->plan(), shape);
    *out = q->q->workspace_bytes(shape, num_members);
  });
}

qf_status qf_quantizer_prepare(qf_quantizer* q, const char* arch) {
  return guarded([&] {
    require(q, "q");
    require(arch, "arch");
    (void)q->q->prepare(arch);
  });
}

qf_status qf_quantize(qf_quantizer* q, const qf_quantize_args* args, void* cuda_stream) {
  return guarded([&] {
    require(q, "q");
    require(args, "args");
    if (args->num_buffers < 0)
      throw qf::UserError("args->num_buffers", "must be >= 0, got " + std::to_string(args->num_buffers));
    if (args->num_buffers > 0) require(args->buffers, "args->buffers");
    if (args->num_members < 0)
      throw qf::UserError("args->num_members", "must be >= 0, got " + std::to_string(args->num_members));
    if (args->workspace_bytes < 0)
      throw qf::UserError("args->workspace_bytes", "must be >= 0");

    qf::rt::QuantizeCall call;
    call.shape = qf::Shape2D{args->m, args->k};
    call.input.ptr = reinterpret_cast<uint64_t>(args->input);
    call.input.dtype = q->q->plan().input;
    call.input.shape = {args->m, args->k};
    // Bytes of the input: the caller states only the shape; bound it before multiplying (the
    // per-member rules of grouped tensors are the caller's, as in rt::Quantizer; their total M
    // may be 0).
    qf::check_extent(call.shape, q->q->plan().grouped, "args->m, args->k");
    call.input.bytes = args->m * args->k * qf::traits(q->q->plan().input).bytes;
    for (int i = 0; i < args->num_buffers; ++i) {
      const qf_named_buffer& b = args->buffers[i];
      // Built only for a message: this runs for every buffer of every call.
      auto where = [i](const char* field) { return "args->buffers[" + std::to_string(i) + "]." + field; };
      if (!b.name) throw qf::UserError(where("name"), "must not be NULL");
      if (b.bytes < 0) throw qf::UserError(where("bytes"), "must be >= 0");
      qf::rt::TensorView v;
      v.ptr = reinterpret_cast<uint64_t>(b.ptr);
      v.bytes = b.bytes;
      if (!call.buffers.emplace(b.name, v).second)
        throw qf::UserError(where("name"), std::string("buffer \"") + b.name + "\" given twice");
    }
    call.workspace.ptr = reinterpret_cast<uint64_t>(args->workspace);
    call.workspace.bytes = args->workspace_bytes;
    call.noop = reinterpret_cast<uint64_t>(args->noop);
    call.seed = args->seed;
    call.offset = args->offset;
    call.member_rows = reinterpret_cast<uint64_t>(args->member_rows);
    call.num_members = args->num_members;
    q->q->quantize(call, static_cast<CUstream>(cuda_stream));
  });
}

namespace {

// The delayed-scaling stream whose scale input is `scale_name` (NULL: the quantizer's only one).
// The names are the plan's scale inputs (input_buffers: one per distinct delayed scale).
const qf::Stream& delayed_stream(const qf_quantizer* q, const char* scale_name) {
  const qf::Plan& plan = q->q->plan();
  const std::vector<qf::BufferDesc> scales = qf::input_buffers(plan);
  if (scales.empty())
    throw qf::UserError("q", "role \"" + plan.role + "\" of recipe \"" + plan.recipe +
                                 "\" has no delayed-scaling stream, so no amax history");
  std::string names;
  for (const auto& b : scales) names += (names.empty() ? "\"" : ", \"") + b.name + "\"";
  if (!scale_name && scales.size() > 1)
    throw qf::UserError("scale_name", "NULL needs a quantizer of one scale input; this one has " + names);
  const std::string want = scale_name ? scale_name : scales[0].name;
  for (const auto& s : plan.streams)
    if (std::holds_alternative<qf::PerTensorDelayed>(s.scaling) && qf::scale_input_name(plan, s) == want) return s;
  throw qf::UserError("scale_name", "no scale input \"" + want + "\"; expected " + names);
}

qf::rt::TensorView history_view(const void* ptr, int64_t bytes, const char* field) {
  if (bytes < 0) throw qf::UserError(field, "must be >= 0, got " + std::to_string(bytes));
  qf::rt::TensorView v;
  v.ptr = reinterpret_cast<uint64_t>(ptr);
  v.bytes = bytes;
  return v;
}

}  // namespace

qf_status qf_quantizer_history_length(const qf_quantizer* q, const char* scale_name, int* out) {
  return guarded([&] {
    require(q, "q");
    require(out, "out");
    *out = std::get<qf::PerTensorDelayed>(delayed_stream(q, scale_name).scaling).history_length;
  });
}

qf_status qf_quantizer_update_amax_history(const qf_quantizer* q, const char* scale_name,
                                           const qf_history_args* args, void* cuda_stream) {
  return guarded([&] {
    require(q, "q");
    require(args, "args");
    const qf::Stream& s = delayed_stream(q, scale_name);
    qf::rt::HistoryCall call;
    call.history = history_view(args->history, args->history_bytes, "args->history_bytes");
    call.amax = history_view(args->amax, args->amax_bytes, "args->amax_bytes");
    call.scale = history_view(args->scale, args->scale_bytes, "args->scale_bytes");
    call.scale_inv = history_view(args->scale_inv, args->scale_inv_bytes, "args->scale_inv_bytes");
    call.noop = reinterpret_cast<uint64_t>(args->noop);
    qf::rt::update_amax_history(std::get<qf::PerTensorDelayed>(s.scaling), s.format, call,
                                static_cast<CUstream>(cuda_stream));
  });
}

qf_status qf_gemm_create(const qf_gemm_spec* spec, qf_gemm** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    require(spec, "spec");
    *out = new_gemm(to_gemm_spec(*spec));
  });
}

qf_status qf_context_num_gemms(const qf_context* ctx, const char* recipe_name, int* out) {
  return guarded([&] {
    require(ctx, "ctx");
    require(out, "out");
    *out = int(find_recipe(ctx, recipe_name).gemms.size());
  });
}

qf_status qf_gemm_create_from_recipe(const qf_context* ctx, const char* recipe_name, int index, qf_gemm** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    require(ctx, "ctx");
    const qf::Recipe& r = find_recipe(ctx, recipe_name);
    if (index < 0 || size_t(index) >= r.gemms.size())
      throw qf::UserError("index", "index " + std::to_string(index) + " out of range: recipe \"" + r.name + "\" lists " +
                                       std::to_string(r.gemms.size()) + " gemms");
    *out = new_gemm(r.gemms[size_t(index)].spec);
  });
}

void qf_gemm_destroy(qf_gemm* g) { delete g; }

const char* qf_gemm_describe(const qf_gemm* g) { return g ? g->description.c_str() : ""; }

qf_status qf_gemm_scale_bytes(const qf_gemm* g, int64_t extent, int num_groups, int64_t* a_bytes, int64_t* b_bytes) {
  return guarded([&] {
    require(g, "g");
    require(a_bytes, "a_bytes");
    require(b_bytes, "b_bytes");
    const qf::GemmSpec& s = g->g->spec();
    const bool kg = qf::k_grouped(s.layout);
    qf::rt::check_gemm_call_size(s, extent, num_groups);
    const qf::GemmScaleElems e = kg ? qf::gemm_scale_elems(s, 0, num_groups, extent)
                                    : qf::gemm_scale_elems(s, extent, num_groups);
    const int bytes = qf::traits(s.scaling).scale_bytes;
    *a_bytes = e.a * bytes;
    *b_bytes = e.b * bytes;
  });
}

qf_status qf_gemm_workspace_bytes(const qf_gemm* g, int64_t* bytes) {
  return guarded([&] {
    require(g, "g");
    require(bytes, "bytes");
    *bytes = g->g->workspace_bytes();
  });
}

qf_status qf_gemm_workspace_bytes_for(const qf_gemm* g, int64_t extent, int num_groups, int64_t* bytes) {
  return guarded([&] {
    require(g, "g");
    require(bytes, "bytes");
    *bytes = g->g->workspace_bytes(extent, num_groups);
  });
}

qf_status qf_gemm_route_for(const qf_gemm* g, int64_t extent, int num_groups, const char** route) {
  return guarded([&] {
    require(g, "g");
    require(route, "route");
    *route = qf::name(g->g->route_for(extent, num_groups)).data();  // (static strings)
  });
}

qf_status qf_gemm_prepare(qf_gemm* g, const char* arch) {
  return guarded([&] {
    require(g, "g");
    require(arch, "arch");
    (void)g->g->prepare(arch);
  });
}

qf_status qf_gemm_run(qf_gemm* g, const qf_gemm_args* args, void* cuda_stream) {
  return guarded([&] {
    require(g, "g");
    require(args, "args");
    auto view = [](const void* p, int64_t bytes, const char* field) {
      if (bytes < 0) throw qf::UserError(field, "must be >= 0, got " + std::to_string(bytes));
      return qf::rt::TensorView{reinterpret_cast<uint64_t>(p), bytes, std::nullopt, {}};
    };
    qf::rt::GemmCall c;
    c.a = view(args->a, args->a_bytes, "args->a_bytes");
    c.b = view(args->b, args->b_bytes, "args->b_bytes");
    c.d = view(args->d, args->d_bytes, "args->d_bytes");
    c.a_scale = view(args->a_scale, args->a_scale_bytes, "args->a_scale_bytes");
    c.b_scale = view(args->b_scale, args->b_scale_bytes, "args->b_scale_bytes");
    if (args->alpha) c.alpha = view(args->alpha, int64_t(args->num_groups > 0 ? args->num_groups : 0) * 4, "args->alpha");
    const int64_t g_n = args->num_groups > 0 ? args->num_groups : 0;
    if (args->group_offsets) c.group_offsets = view(args->group_offsets, (g_n + 1) * 8, "args->group_offsets");
    if (args->group_counts) c.group_counts = view(args->group_counts, g_n * 8, "args->group_counts");
    if (args->a_amax) c.a_amax = view(args->a_amax, g_n * 4, "args->a_amax");
    if (args->b_amax) c.b_amax = view(args->b_amax, g_n * 4, "args->b_amax");
    c.m_max = args->m_max;
    c.m_total = args->m_total;
    c.k_total = args->k_total;
    c.num_groups = args->num_groups;
    c.max_ctas = args->max_ctas;
    c.workspace = view(args->workspace, args->workspace_bytes, "args->workspace_bytes");
    g->g->run(c, static_cast<CUstream>(cuda_stream));
  });
}

qf_status qf_cache_evict(const qf_cache_evict_policy* policy, qf_cache_evict_result* out) {
  return guarded([&] {
    require(policy, "policy");
    require(out, "out");
    *out = qf_cache_evict_result{};
    auto nonnegative = [](int64_t v, const char* field) {
      if (v < 0) throw qf::UserError(field, "expected 0 (no such rule) or a positive count, got " + std::to_string(v));
      return v;
    };
    qf::rt::EvictPolicy p;
    if (nonnegative(policy->unused_for_s, "policy->unused_for_s") > 0) p.unused_for_s = policy->unused_for_s;
    if (nonnegative(policy->max_bytes, "policy->max_bytes") > 0) p.max_bytes = uint64_t(policy->max_bytes);
    p.stale = flag01(policy->stale, "policy->stale");
    const bool dry_run = flag01(policy->dry_run, "policy->dry_run");
    if (!p.unused_for_s && !p.max_bytes && !p.stale)
      throw qf::UserError("policy", "no rule set: expected unused_for_s > 0, max_bytes > 0 or stale = 1");
    const qf::rt::EvictResult r = qf::rt::KernelCache::global().evict(p, dry_run);
    out->removed = int64_t(r.removed), out->kept = int64_t(r.kept);
    out->removed_bytes = int64_t(r.removed_bytes), out->kept_bytes = int64_t(r.kept_bytes);
  });
}

static_assert(QF_LOG_OFF == int(qf::log::Level::Off) && QF_LOG_ERROR == int(qf::log::Level::Error) &&
              QF_LOG_WARN == int(qf::log::Level::Warn) && QF_LOG_INFO == int(qf::log::Level::Info) &&
              QF_LOG_DEBUG == int(qf::log::Level::Debug));

qf_status qf_set_log_callback(qf_log_callback cb, void* user) {
  return guarded([&] {
    if (!qf::log::set_callback(cb, user))
      throw qf::UserError("qf_set_log_callback", "called from inside the log callback (it would wait for itself)");
  });
}

qf_status qf_set_log_level(int level) {
  return guarded([&] {
    if (level < QF_LOG_OFF || level > QF_LOG_DEBUG)
      throw qf::UserError("level", "expected QF_LOG_OFF (0) .. QF_LOG_DEBUG (4), got " + std::to_string(level));
    qf::log::set_level(qf::log::Level(level));
  });
}

int qf_get_log_level(void) {
  try {
    return int(qf::log::level());
  } catch (...) {
    return QF_LOG_WARN;
  }
}

}  // extern "C"
