// qforge._C's INT8-parameter optimizer step (runtime/optim_int8.h): the fused dequantize ->
// SGD / AdamW -> stochastic requantize kernel on device addresses, its compile without a GPU, and
// the CPU reference (reference/optim_int8.h) on host values for tests. The torch layer
// (python/qforge/torch/int8_training.py) checks its tensors and passes their addresses and torch's
// current stream.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>
#include <vector>

#include "compiler/error.h"
#include "reference/optim_int8.h"
#include "runtime/driver.h"
#include "runtime/optim_int8.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace qf::py {

namespace {

DType dtype_arg(const std::string& s, const char* arg) {
  if (auto d = qf::parse_dtype(s)) return *d;
  throw UserError(arg, "expected bf16, fp16 or fp32, got \"" + s + "\"");
}

rt::Int8OptimCall make_call(uint64_t q, uint64_t scale, uint64_t grad, uint64_t state0, uint64_t state1, uint64_t noop,
                            int64_t rows, int64_t cols, const std::string& grad_dtype, const std::string& scale_dtype,
                            uint64_t seed, uint64_t offset) {
  rt::Int8OptimCall c;
  c.rows = rows, c.cols = cols;
  c.grad_dtype = dtype_arg(grad_dtype, "grad_dtype");
  c.scale_dtype = dtype_arg(scale_dtype, "scale_dtype");
  // The extents the step uses (the torch layer has checked the tensors' shapes and dtypes); the
  // runtime checks the addresses, alignment and overlaps.
  const int64_t n = rows > 0 && cols > 0 ? rows * cols : 0;
  const auto view = [](uint64_t ptr, int64_t bytes) {
    rt::TensorView v;
    v.ptr = ptr, v.bytes = bytes;
    return v;
  };
  c.q = view(q, n);
  c.scale = view(scale, rows > 0 ? rows * 4 : 0);
  c.grad = view(grad, n * traits(c.grad_dtype).bytes);
  c.state0 = view(state0, state0 ? n * 4 : 0);
  c.state1 = view(state1, state1 ? n * 4 : 0);
  c.noop = view(noop, noop ? 4 : 0);
  c.seed = seed, c.offset = offset;
  return c;
}

void launch_step(const rt::Int8OptimCall& c, const rt::Int8OptimOptions& o, int64_t step, uintptr_t stream, int device) {
  const rt::Int8OptimScalarSet s = rt::int8_optim_scalars(o, step);  // option errors before the context
  const bool sgd = std::holds_alternative<SgdScalars>(s);
  rt::check_int8_optim_call(c, sgd ? rt::Int8Optimizer::Sgd : rt::Int8Optimizer::AdamW,
                            sgd ? std::get<SgdScalars>(s).has_momentum != 0 : true, !sgd);
  rt::ScopedContext ctx(rt::primary_context(device)->get());
  rt::int8_optim_step(c, s, reinterpret_cast<CUstream>(stream));
}

rt::Int8Optimizer optimizer_arg(const std::string& s) {
  if (s == "sgd") return rt::Int8Optimizer::Sgd;
  if (s == "adamw") return rt::Int8Optimizer::AdamW;
  throw UserError("optimizer", "expected \"sgd\" or \"adamw\", got \"" + s + "\"");
}

// The CPU reference on host values: q as int8 bytes, the rest as fp32 lists.
ref::Int8Param host_param(const nb::bytes& q, const std::vector<float>& scale, std::vector<float> state0,
                          std::vector<float> state1, int64_t rows, int64_t cols) {
  if (rows < 1 || cols < 1) throw UserError("rows", "expected a non-empty [rows, cols]");
  if (int64_t(q.size()) != rows * cols)
    throw UserError("q", "expected " + std::to_string(rows * cols) + " bytes, got " + std::to_string(q.size()));
  if (int64_t(scale.size()) != rows)
    throw UserError("scale", "expected " + std::to_string(rows) + " values, got " + std::to_string(scale.size()));
  ref::Int8Param p;
  p.rows = rows, p.cols = cols;
  p.q.resize(size_t(rows * cols));
  std::memcpy(p.q.data(), q.c_str(), p.q.size());
  p.scale = scale;
  p.state0 = std::move(state0);
  p.state1 = std::move(state1);
  return p;
}

void check_len(const char* arg, const std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) != n)
    throw UserError(arg, "expected " + std::to_string(n) + " values, got " + std::to_string(v.size()));
}

using RefResult = std::tuple<nb::bytes, std::vector<float>, std::vector<float>, std::vector<float>>;

RefResult ref_result(const ref::Int8Param& p) {
  return {nb::bytes(reinterpret_cast<const char*>(p.q.data()), p.q.size()), p.scale, p.state0, p.state1};
}

}  // namespace

void register_optim(nb::module_& m) {
  m.attr("INT8_OPTIM_MAX_COLS") = rt::kInt8OptimMaxCols;
  m.def(
      "int8_sgd_step",
      [](uint64_t q, uint64_t scale, uint64_t grad, uint64_t momentum_buffer, uint64_t noop, int64_t rows, int64_t cols,
         const std::string& grad_dtype, const std::string& scale_dtype, uint64_t seed, uint64_t offset, int64_t step,
         double lr, double momentum, double dampening, double weight_decay, bool nesterov, uintptr_t stream,
         int device) {
        const rt::Int8OptimCall c =
            make_call(q, scale, grad, momentum_buffer, 0, noop, rows, cols, grad_dtype, scale_dtype, seed, offset);
        launch_step(c, rt::SgdOptions{lr, momentum, dampening, weight_decay, nesterov}, step, stream, device);
      },
      "q"_a, "scale"_a, "grad"_a, "momentum_buffer"_a, "noop"_a, "rows"_a, "cols"_a, "grad_dtype"_a, "scale_dtype"_a,
      "seed"_a, "offset"_a, "step"_a, "lr"_a, "momentum"_a, "dampening"_a, "weight_decay"_a, "nesterov"_a, "stream"_a,
      "device"_a, nb::call_guard<nb::gil_scoped_release>(),
      "one fused SGD step of an int8 parameter (device addresses), launched on `stream`");
  m.def(
      "int8_adamw_step",
      [](uint64_t q, uint64_t scale, uint64_t grad, uint64_t exp_avg, uint64_t exp_avg_sq, uint64_t noop, int64_t rows,
         int64_t cols, const std::string& grad_dtype, const std::string& scale_dtype, uint64_t seed, uint64_t offset,
         int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay, uintptr_t stream,
         int device) {
        const rt::Int8OptimCall c =
            make_call(q, scale, grad, exp_avg, exp_avg_sq, noop, rows, cols, grad_dtype, scale_dtype, seed, offset);
        launch_step(c, rt::AdamWOptions{lr, beta1, beta2, eps, weight_decay}, step, stream, device);
      },
      "q"_a, "scale"_a, "grad"_a, "exp_avg"_a, "exp_avg_sq"_a, "noop"_a, "rows"_a, "cols"_a, "grad_dtype"_a,
      "scale_dtype"_a, "seed"_a, "offset"_a, "step"_a, "lr"_a, "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a,
      "stream"_a, "device"_a, nb::call_guard<nb::gil_scoped_release>(),
      "one fused AdamW step of an int8 parameter (device addresses), launched on `stream`");
  m.def(
      "int8_optim_prepare",
      [](const std::string& optimizer, int64_t cols, const std::string& grad_dtype, const std::string& scale_dtype,
         const std::string& arch) {
        if (cols < 1 || cols > rt::kInt8OptimMaxCols)
          throw UserError("cols", "expected 1 to " + std::to_string(rt::kInt8OptimMaxCols) + " elements per row, got " +
                                      std::to_string(cols));
        const DType g = dtype_arg(grad_dtype, "grad_dtype");
        if (g != DType::FP32 && g != DType::BF16) throw UserError("grad_dtype", "expected fp32 or bf16");
        const rt::Int8OptimKernelSpec spec =
            rt::int8_optim_spec(optimizer_arg(optimizer), cols, cols % 4 == 0, g, dtype_arg(scale_dtype, "scale_dtype"));
        return rt::build_int8_optim_kernel(spec, arch).source;
      },
      "optimizer"_a, "cols"_a, "grad_dtype"_a = "fp32", "scale_dtype"_a = "bf16", "arch"_a = "sm_90a",
      nb::call_guard<nb::gil_scoped_release>(),
      "compiles (or loads) the fused step's kernel for rows of `cols` elements into the kernel cache; no GPU needed; "
      "returns the emitted source");
  m.def(
      "reference_int8_quantize",
      [](const std::vector<float>& w, int64_t rows, int64_t cols, const std::string& scale_dtype, uint64_t seed,
         uint64_t offset) {
        if (rows < 1 || cols < 1) throw UserError("rows", "expected a non-empty [rows, cols]");
        check_len("w", w, rows * cols);
        return ref_result(ref::int8_quantize(w, rows, cols, dtype_arg(scale_dtype, "scale_dtype"), seed, offset));
      },
      "w"_a, "rows"_a, "cols"_a, "scale_dtype"_a = "bf16", "seed"_a = 0, "offset"_a = 0,
      "the CPU reference of the int8 storage of an fp32 weight: (q bytes, scales, [], [])");
  m.def(
      "reference_int8_sgd_step",
      [](const nb::bytes& q, const std::vector<float>& scale, const std::vector<float>& grad,
         std::vector<float> momentum_buffer, int64_t rows, int64_t cols, const std::string& scale_dtype, uint64_t seed,
         uint64_t offset, int64_t step, double lr, double momentum, double dampening, double weight_decay,
         bool nesterov) {
        const auto s = std::get<SgdScalars>(
            rt::int8_optim_scalars(rt::SgdOptions{lr, momentum, dampening, weight_decay, nesterov}, step));
        if (s.has_momentum) check_len("momentum_buffer", momentum_buffer, rows * cols);
        ref::Int8Param p = host_param(q, scale, s.has_momentum ? std::move(momentum_buffer) : std::vector<float>{}, {},
                                      rows, cols);
        check_len("grad", grad, rows * cols);
        ref::int8_sgd_step(p, grad, s, dtype_arg(scale_dtype, "scale_dtype"), seed, offset);
        return ref_result(p);
      },
      "q"_a, "scale"_a, "grad"_a, "momentum_buffer"_a, "rows"_a, "cols"_a, "scale_dtype"_a, "seed"_a, "offset"_a,
      "step"_a, "lr"_a, "momentum"_a = 0.0, "dampening"_a = 0.0, "weight_decay"_a = 0.0, "nesterov"_a = false,
      "the CPU reference of one fused SGD step: (q bytes, scales, momentum_buffer, [])");
  m.def(
      "reference_int8_adamw_step",
      [](const nb::bytes& q, const std::vector<float>& scale, const std::vector<float>& grad, std::vector<float> exp_avg,
         std::vector<float> exp_avg_sq, int64_t rows, int64_t cols, const std::string& scale_dtype, uint64_t seed,
         uint64_t offset, int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay) {
        const auto s =
            std::get<AdamWScalars>(rt::int8_optim_scalars(rt::AdamWOptions{lr, beta1, beta2, eps, weight_decay}, step));
        check_len("exp_avg", exp_avg, rows * cols);
        check_len("exp_avg_sq", exp_avg_sq, rows * cols);
        ref::Int8Param p = host_param(q, scale, std::move(exp_avg), std::move(exp_avg_sq), rows, cols);
        check_len("grad", grad, rows * cols);
        ref::int8_adamw_step(p, grad, s, dtype_arg(scale_dtype, "scale_dtype"), seed, offset);
        return ref_result(p);
      },
      "q"_a, "scale"_a, "grad"_a, "exp_avg"_a, "exp_avg_sq"_a, "rows"_a, "cols"_a, "scale_dtype"_a, "seed"_a,
      "offset"_a, "step"_a, "lr"_a, "beta1"_a = 0.9, "beta2"_a = 0.999, "eps"_a = 1e-8, "weight_decay"_a = 1e-2,
      "the CPU reference of one fused AdamW step: (q bytes, scales, exp_avg, exp_avg_sq)");
}

}  // namespace qf::py
