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
#include <vector>

#include <cuda.h>

#include "compiler/formats.h"
#include "compiler/ir.h"
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

// Every spec int8_optim_spec gives for rows of 1 to kInt8OptimMaxCols elements, for one optimizer,
// gradient dtype and scale dtype; vec4: the 16-byte kernels (every row length a multiple of 4),
// else the scalar ones (any row length). A kernel depends on the row length only through its CTA
// shape, a power-of-two bucket of it, so the set is small and known before any shape is: 9 specs
// with vec4, 11 without. Ordered as the specs compare.
std::vector<Int8OptimKernelSpec> int8_optim_specs(Int8Optimizer o, bool vec4, DType grad, DType scale_dtype);

// Whether a weight plan's rowwise stream is the rule an INT8 parameter is stored and stepped with:
// int8, per_channel, stochastic rounding (recipes/int8_weight_sr.json's weight; what qt.Int8Linear
// requires of its recipe).
bool int8_storage_rule(const Plan& weight_plan);

// What `qforge prewarm` compiles for the INT8 optimizers (qt.Int8AdamW / qt.Int8SGD) of a weight
// plan (role linear:weight) whose rule is int8 storage; none for any other plan, or for a plan of
// a model dtype int8 storage does not train (bf16 only). The kernels those optimizers launch for a
// weight whose rows are a multiple of 4 elements long, whatever its shape: both optimizers, the
// fp32 gradient they pass (main_grad), the plan's input dtype as the scale's rounding, every CTA
// shape of the 16-byte kernels (18 specs). Not included (compiled by the first step that needs
// one, or ahead by qforge._C.int8_optim_prepare): the scalar kernels of rows whose length is not
// a multiple of 4 (or of misaligned buffers) and bf16 gradients (the functional steps only).
std::vector<Int8OptimKernelSpec> int8_optim_prewarm_specs(const Plan& weight_plan);
// "adamw 256x4x4 fp32 grad, bf16 scale": a spec as prewarm's messages name it.
std::string describe(const Int8OptimKernelSpec& spec);

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
