#include "runtime/optim_int8.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "compiler/emitter.h"
#include "compiler/error.h"
#include "runtime/driver.h"
#include "runtime/quantizer.h"

namespace qf::rt {

const char* name(Int8Optimizer o) { return o == Int8Optimizer::Sgd ? "sgd" : "adamw"; }

namespace {

void check_finite(const char* arg, double v) {
  if (!std::isfinite(v)) throw UserError(arg, "expected a finite value, got " + std::to_string(v));
}
void check_range(const char* arg, double v, double lo, bool lo_closed, double hi, bool hi_closed) {
  check_finite(arg, v);
  const bool ok = (lo_closed ? v >= lo : v > lo) && (hi_closed ? v <= hi : v < hi);
  if (!ok)
    throw UserError(arg, std::string("expected a value in ") + (lo_closed ? "[" : "(") + std::to_string(lo) + ", " +
                             (std::isinf(hi) ? "inf" : std::to_string(hi)) + (hi_closed ? "]" : ")") + ", got " +
                             std::to_string(v));
}

int scale_code(DType d) { return d == DType::BF16 ? 1 : d == DType::FP16 ? 2 : 0; }

TensorView range(uint64_t ptr, int64_t bytes) {
  TensorView v;
  v.ptr = ptr;
  v.bytes = bytes;
  return v;
}

unsigned next_pow2(int64_t v) {
  unsigned p = 1;
  while (int64_t(p) < v) p <<= 1;
  return p;
}

}  // namespace

Int8OptimScalarSet int8_optim_scalars(const Int8OptimOptions& options, int64_t step) {
  if (step < 1) throw UserError("step", "expected the step number, 1 or more, got " + std::to_string(step));
  const double inf = HUGE_VAL;
  if (const auto* s = std::get_if<SgdOptions>(&options)) {
    check_range("lr", s->lr, 0.0, true, inf, false);
    check_range("momentum", s->momentum, 0.0, true, inf, false);
    check_range("dampening", s->dampening, 0.0, true, inf, false);
    check_range("weight_decay", s->weight_decay, 0.0, true, inf, false);
    if (s->nesterov && (s->momentum <= 0.0 || s->dampening != 0.0))
      throw UserError("nesterov", "Nesterov momentum needs momentum > 0 and dampening 0");
    return int8_sgd_scalars(s->lr, s->momentum, s->dampening, s->weight_decay, s->nesterov, step);
  }
  const auto& a = std::get<AdamWOptions>(options);
  check_range("lr", a.lr, 0.0, true, inf, false);
  check_range("betas[0]", a.beta1, 0.0, true, 1.0, false);
  check_range("betas[1]", a.beta2, 0.0, true, 1.0, false);
  check_range("eps", a.eps, 0.0, false, inf, false);
  check_range("weight_decay", a.weight_decay, 0.0, true, inf, false);
  return int8_adamw_scalars(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, step);
}

Int8OptimKernelSpec int8_optim_spec(Int8Optimizer o, int64_t cols, bool vec4, DType grad, DType scale_dtype) {
  QF_CHECK(cols >= 1 && cols <= kInt8OptimMaxCols, "int8 optimizer: row length");
  Int8OptimKernelSpec s;
  s.optimizer = o;
  s.vec = vec4 && cols % 4 == 0 ? 4 : 1;
  s.grad = grad;
  s.scale_dtype = scale_dtype;
  const int64_t vectors = (cols + s.vec - 1) / s.vec;
  // About four vectors per thread, 32 to 1024 threads (long rows: more warps per SM, fewer of the
  // row's values per thread); the iterations a power of two (few kernels).
  s.threads = int(std::clamp<unsigned>(next_pow2((vectors + 3) / 4), 32u, 1024u));
  s.iters = int(next_pow2((vectors + s.threads - 1) / s.threads));
  return s;
}

std::vector<Int8OptimKernelSpec> int8_optim_specs(Int8Optimizer o, bool vec4, DType grad, DType scale_dtype) {
  // Every row length through int8_optim_spec itself, so the set cannot drift from what a step picks.
  std::set<Int8OptimKernelSpec> specs;
  for (int64_t cols = vec4 ? 4 : 1; cols <= kInt8OptimMaxCols; cols += vec4 ? 4 : 1)
    specs.insert(int8_optim_spec(o, cols, vec4, grad, scale_dtype));
  return {specs.begin(), specs.end()};
}

bool int8_storage_rule(const Plan& weight_plan) {
  const qf::Stream* s = weight_plan.stream(Direction::Rowwise);
  return s && s->format == ElemFormat::Int8 && std::holds_alternative<PerChannel>(s->scaling) &&
         s->rounding == Rounding::Stochastic;
}

std::vector<Int8OptimKernelSpec> int8_optim_prewarm_specs(const Plan& weight_plan) {
  // qt.Int8Linear trains bf16 models: its scales round as a bf16 weight's do.
  if (!int8_storage_rule(weight_plan) || weight_plan.input != DType::BF16) return {};
  std::vector<Int8OptimKernelSpec> out;
  for (Int8Optimizer o : {Int8Optimizer::AdamW, Int8Optimizer::Sgd})
    for (const auto& s : int8_optim_specs(o, /*vec4=*/true, DType::FP32, weight_plan.input)) out.push_back(s);
  return out;
}

std::string describe(const Int8OptimKernelSpec& spec) {
  return std::string(name(spec.optimizer)) + " " + std::to_string(spec.threads) + "x" + std::to_string(spec.iters) +
         "x" + std::to_string(spec.vec) + " " + std::string(traits(spec.grad).name) + " grad, " +
         std::string(traits(spec.scale_dtype).name) + " scale";
}

std::string emit_int8_optim(const Int8OptimKernelSpec& spec) {
  QF_CHECK(spec.vec == 1 || spec.vec == 4, "int8 optimizer: vector width");
  QF_CHECK(spec.threads % 32 == 0 && spec.threads <= 1024 && spec.iters >= 1, "int8 optimizer: CTA shape");
  QF_CHECK(spec.grad == DType::FP32 || spec.grad == DType::BF16, "int8 optimizer: gradient dtype");
  Emitter e;
  e.comment("Generated by qforge (runtime/optim_int8.cpp): fused INT8 parameter optimizer step.");
  e.line("#include \"qforge/optim_int8.cuh\"");
  e.blank();
  e.open("namespace qf_gen");
  e.open("struct Int8OptimCfg");
  e.alias("Step", spec.optimizer == Int8Optimizer::Sgd ? "qf::SgdStep" : "qf::AdamWStep");
  e.constant("kThreads", int64_t(spec.threads));
  e.constant("kIters", int64_t(spec.iters));
  e.constant("kVec", int64_t(spec.vec));
  e.constant("kGradBf16", spec.grad == DType::BF16);
  e.constant("kScaleDtype", int64_t(scale_code(spec.scale_dtype)));
  e.close(";");
  e.close("  // namespace qf_gen");
  return e.str();
}

Int8OptimKernel build_int8_optim_kernel(const Int8OptimKernelSpec& spec, const std::string& arch, KernelCache& cache) {
  check_quantize_arch(arch);
  Int8OptimKernel k;
  k.source = emit_int8_optim(spec);
  k.kernel = "qf::int8_optim_kernel<qf_gen::Int8OptimCfg>";
  const CompileRequest req{k.source, "qforge_optim_int8.cu", {k.kernel}, arch};
  const std::string cta = std::to_string(spec.threads) + "x" + std::to_string(spec.iters) + "x" + std::to_string(spec.vec);
  k.cached = cache.get_or_compile(req, nlohmann::json{{"kind", "optim_int8"},
                                                      {"optimizer", name(spec.optimizer)},
                                                      {"cta", cta},
                                                      {"grad", std::string(traits(spec.grad).name)},
                                                      {"scale", std::string(traits(spec.scale_dtype).name)}});
  return k;
}

void check_int8_optim_call(const Int8OptimCall& c, Int8Optimizer optimizer, bool uses_state0, bool uses_state1) {
  if (c.rows < 1) throw UserError("argument rows", "expected at least one row, got " + std::to_string(c.rows));
  if (c.cols < 1 || c.cols > kInt8OptimMaxCols)
    throw UserError("argument cols", "expected 1 to " + std::to_string(kInt8OptimMaxCols) +
                                " elements per row (the fused step holds a row on chip), got " + std::to_string(c.cols));
  if (c.rows > (int64_t(1) << 40) / c.cols) throw UserError("argument rows", "the parameter is too large");
  if (c.grad_dtype != DType::FP32 && c.grad_dtype != DType::BF16)
    throw UserError("argument grad", "expected an fp32 or bf16 gradient, got " + std::string(traits(c.grad_dtype).name));
  const int64_t n = c.rows * c.cols;
  const std::string shape = format_shape(std::vector<int64_t>{c.rows, c.cols});
  const int gbytes = traits(c.grad_dtype).bytes;
  check_buffer("q", c.q, n, 1, "int8 " + shape);
  check_buffer("scale", c.scale, c.rows * 4, 4, "fp32 [" + std::to_string(c.rows) + "]");
  check_buffer("grad", c.grad, n * gbytes, size_t(gbytes), std::string(traits(c.grad_dtype).name) + " " + shape);
  const char* s0 = optimizer == Int8Optimizer::Sgd ? "momentum_buffer" : "exp_avg";
  if (uses_state0) check_buffer(s0, c.state0, n * 4, 4, "fp32 " + shape);
  if (uses_state1) check_buffer("exp_avg_sq", c.state1, n * 4, 4, "fp32 " + shape);
  if (c.noop.ptr) check_buffer("noop", c.noop, 4, 4, "one fp32 flag");
  // What the step reads and writes, each range as long as the step uses it: no two may overlap.
  std::vector<std::pair<std::string, TensorView>> used = {
      {"q", range(c.q.ptr, n)}, {"scale", range(c.scale.ptr, c.rows * 4)}, {"grad", range(c.grad.ptr, n * gbytes)}};
  if (uses_state0) used.push_back({s0, range(c.state0.ptr, n * 4)});
  if (uses_state1) used.push_back({"exp_avg_sq", range(c.state1.ptr, n * 4)});
  if (c.noop.ptr) used.push_back({"noop", range(c.noop.ptr, 4)});
  for (size_t i = 0; i < used.size(); ++i)
    for (size_t j = i + 1; j < used.size(); ++j) check_disjoint(used[j].first, used[j].second, used[i].first, used[i].second);
}

void int8_optim_step(const Int8OptimCall& c, const Int8OptimScalarSet& scalars, CUstream stream, KernelCache& cache) {
  const bool sgd = std::holds_alternative<SgdScalars>(scalars);
  const Int8Optimizer o = sgd ? Int8Optimizer::Sgd : Int8Optimizer::AdamW;
  const bool st0 = sgd ? std::get<SgdScalars>(scalars).has_momentum != 0 : true;
  const bool st1 = !sgd;
  check_int8_optim_call(c, o, st0, st1);

  const int gbytes = traits(c.grad_dtype).bytes;
  const bool vec4 = c.cols % 4 == 0 && c.q.ptr % 4 == 0 && c.grad.ptr % uint64_t(4 * gbytes) == 0 &&
                    (!st0 || c.state0.ptr % 16 == 0) && (!st1 || c.state1.ptr % 16 == 0);
  const Int8OptimKernelSpec spec = int8_optim_spec(o, c.cols, vec4, c.grad_dtype, c.scale_dtype);

  const int dev = current_device();
  // Every step after the first of a kind on a device finds its function here, without codegen,
  // hashing or a cache lookup. Never destroyed, like the module registry.
  struct Loaded {
    std::shared_ptr<const Module> module;
    CUfunction f = nullptr;
  };
  using Key = std::tuple<int, Int8OptimKernelSpec>;
  static std::mutex& mu = *new std::mutex;
  static std::map<Key, Loaded>& loaded = *new std::map<Key, Loaded>;
  const Key key{dev, spec};
  Loaded fn;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = loaded.find(key); it != loaded.end()) fn = it->second;
  }
  if (!fn.f) {
    const Int8OptimKernel k = build_int8_optim_kernel(spec, device_arch(dev), cache);
    fn.module = module_registry().get(dev, k.cached.entry->key, std::string_view(k.cached.entry->image));
    fn.f = fn.module->function(k.cached.entry->lowered(k.kernel));
    std::lock_guard<std::mutex> lock(mu);
    loaded.emplace(key, fn);
  }
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(c.rows, int64_t(device_sm_count(dev)) * 8));
  const auto fill = [&](auto& args) {
    args.q = reinterpret_cast<u8*>(c.q.ptr);
    args.scale = reinterpret_cast<float*>(c.scale.ptr);
    args.grad = reinterpret_cast<const void*>(c.grad.ptr);
    args.state0 = st0 ? reinterpret_cast<float*>(c.state0.ptr) : nullptr;
    args.state1 = st1 ? reinterpret_cast<float*>(c.state1.ptr) : nullptr;
    args.noop = reinterpret_cast<const float*>(c.noop.ptr);
    args.rows = c.rows;
    args.cols = c.cols;
    args.seed = c.seed;
    args.offset = c.offset;
  };
  if (sgd) {
    Int8OptimArgs<SgdScalars> args{};
    fill(args);
    args.s = std::get<SgdScalars>(scalars);
    void* params[] = {&args};
    launch(fn.f, Dim3{unsigned(grid)}, Dim3{unsigned(spec.threads)}, 0, stream, params);
  } else {
    Int8OptimArgs<AdamWScalars> args{};
    fill(args);
    args.s = std::get<AdamWScalars>(scalars);
    void* params[] = {&args};
    launch(fn.f, Dim3{unsigned(grid)}, Dim3{unsigned(spec.threads)}, 0, stream, params);
  }
}

}  // namespace qf::rt
