// The fused optimizer step of an INT8 parameter (int8 data [rows, cols] + one fp32 scale per row,
// no high-precision copy) on a GPU: one JIT kernel (templates/qforge/optim_int8.cuh) dequantizes
// each row, applies the SGD or AdamW update in fp32, and requantizes the row with the weight
// rowwise stream's scale and stochastic rounding. Bit-exact against the CPU reference
// (reference/optim_int8.h). Kernels go through the kernel cache like every other qforge kernel.
#pragma once
#include <compare>
#include <cstdint>
#include <string>
#include <variant>

#include <cuda.h>

#include "compiler/formats.h"
#include "qforge/optim_int8.cuh"
#include "runtime/kernel_cache.h"
#include "runtime/tensor.h"

namespace qf::rt {

enum class Int8Optimizer { Sgd, AdamW };
const char* name(Int8Optimizer o);  // "sgd" / "adamw"

// Rows longer than this are refused (the kernel holds a row in registers).
constexpr int64_t kInt8OptimMaxCols = 32768;

// Hyper-parameters as torch.optim.SGD / torch.optim.AdamW take them (amsgrad, maximize,
// foreach/fused and the other flags are not supported: the Python layer refuses them).
struct SgdOptions {
  double lr = 1e-3, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};
struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
};
using Int8OptimOptions = std::variant<SgdOptions, AdamWOptions>;
using Int8OptimScalarSet = std::variant<SgdScalars, AdamWScalars>;

// The step's fp32 scalars (step: 1 for the first step); UserError naming the option when it is out
// of range (lr, momentum, dampening, weight_decay, nesterov, betas, eps, step).
Int8OptimScalarSet int8_optim_scalars(const Int8OptimOptions& options, int64_t step);

// Which compiled kernel serves a call: optimizer, CTA shape (threads x iters x vec elements hold a
// row), the gradient's dtype and the scale's rounding dtype.
struct Int8OptimKernelSpec {
  Int8Optimizer optimizer = Int8Optimizer::AdamW;
  int threads = 256, iters = 1, vec = 4;
  DType grad = DType::FP32;
  DType scale_dtype = DType::BF16;
  auto operator<=>(const Int8OptimKernelSpec&) const = default;
};
// The spec for rows of `cols` elements; vec4: 16-byte vector accesses are possible (cols a
// multiple of 4 and every buffer aligned for them).
Int8OptimKernelSpec int8_optim_spec(Int8Optimizer o, int64_t cols, bool vec4, DType grad, DType scale_dtype);

struct Int8OptimKernel {
  std::string source;  // the emitted translation unit
  std::string kernel;  // its name expression
  CacheResult cached;
};
std::string emit_int8_optim(const Int8OptimKernelSpec& spec);
// From the kernel cache (compiled on a miss); needs no GPU.
Int8OptimKernel build_int8_optim_kernel(const Int8OptimKernelSpec& spec, const std::string& arch,
                                        KernelCache& cache = KernelCache::global());

struct Int8OptimCall {
  TensorView q;       // int8 [rows, cols], updated in place
  TensorView scale;   // fp32 [rows], updated in place
  TensorView grad;    // [rows, cols] of grad_dtype (fp32 or bf16)
  TensorView state0;  // fp32 [rows, cols]: SGD's momentum_buffer (unused without momentum), AdamW's exp_avg
  TensorView state1;  // fp32 [rows, cols]: AdamW's exp_avg_sq
  TensorView noop;    // optional fp32 [1]: 1.0 on the device skips the step
  int64_t rows = 0, cols = 0;
  DType grad_dtype = DType::FP32;
  DType scale_dtype = DType::BF16;  // the scale's rounding (the model's dtype, as the quantize's input dtype)
  uint64_t seed = 0, offset = 0;    // stochastic rounding (stream 0)
};

// Validates every argument (UserError naming it), then launches one step on `stream` in the
// current context. The first call per (device, kernel spec) compiles or loads the kernel.
void int8_optim_step(const Int8OptimCall& call, const Int8OptimScalarSet& scalars, CUstream stream,
                     KernelCache& cache = KernelCache::global());
// The argument checks alone (what int8_optim_step runs before anything touches the driver).
void check_int8_optim_call(const Int8OptimCall& call, Int8Optimizer optimizer, bool uses_state0, bool uses_state1);

}  // namespace qf::rt
