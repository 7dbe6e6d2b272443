// qforge inspect <recipe> --role R: print the plan (after all passes, or after chosen passes
// with --dump-after) and the buffers it writes for an example shape; with --source, also the
// emitted CUDA source of its kernels and their name expressions (the complete program, then, for
// plans with the one-launch fused kernel, the separate form's program: codegen.h QuantizeForm);
// with --resources, what ptxas gives each kernel for sm_90a (registers, stack, spills), no GPU
// needed.
#include <iostream>
#include <string_view>

#include "compiler/buffers.h"
#include "compiler/codegen.h"
#include "compiler/pipeline.h"
#include "runtime/nvrtc.h"
#include "tools/args.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace qf::cli {

DType parse_dtype_arg(const Args& args, const std::string& flag) {
  std::string s = args.get(flag).value_or("bf16");
  auto d = parse_dtype(s);
  if (!d) throw UserError(flag, "expected bf16, fp16 or fp32, got \"" + s + "\"");
  return *d;
}

std::optional<Usage> parse_usage_arg(const Args& args) {
  auto s = args.get("--usage");
  if (!s) return std::nullopt;
  auto u = parse_usage(*s);
  if (!u) throw UserError("--usage", "expected training, inference or memory, got \"" + *s + "\"");
  return u;
}

namespace {

// Compiles the plan's kernels for sm_90a with `ptxas -v` and prints, per kernel, its registers,
// stack frame, spill stores / loads, threads and the cast kernel's launch-bound min blocks.
void print_resources(const KernelSource& ks) {
  std::vector<std::string> names;
  for (const auto& k : ks.kernels()) names.push_back(*k.name);
  const rt::CompileResult r =
      rt::compile_cuda(rt::CompileRequest{ks.source, "qforge_kernel.cu", names, "sm_90a", {"--ptxas-options=-v"}});
  const std::vector<rt::KernelResources> res = rt::ptxas_resources(r.log);
  std::cout << "  resources (sm_90a, ptxas):\n";
  for (const auto& k : ks.kernels())
    for (const rt::KernelResources& kr : res) {
      if (kr.entry != r.lowered_names.at(*k.name)) continue;
      const bool cast = std::string_view(k.kind) == "cast_kernel";
      std::cout << "    " << k.kind << ": " << kr.registers << " registers, " << kr.stack_bytes << " B stack, spills "
                << kr.spill_store_bytes << " B stored / " << kr.spill_load_bytes << " B loaded; " << ks.tile.threads
                << " threads"
                << (cast ? ", min blocks " + std::to_string(ks.min_blocks) : "") << "\n";
    }
}

}  // namespace

int cmd_inspect(const Argv& argv) {
  Args args(argv, {"--role", "--dtype", "--usage", "--dump-after", "--shape"}, {"--grouped", "--source", "--resources"});
  if (args.positional().size() != 1) throw UserError("recipe", "expected one recipe file");
  const Recipe r = load_recipe(args.positional()[0]);
  PlanRequest req{args.require("--role"), parse_dtype_arg(args, "--dtype"), parse_usage_arg(args),
                  args.flag("--grouped")};
  PipelineOptions opt;
  opt.dump_after = args.all("--dump-after");
  opt.log = &std::cout;
  const Plan p = compile_plan(r, req, opt);
  if (opt.dump_after.empty()) std::cout << print(p);

  const Shape2D shape = parse_shape("--shape", args.get("--shape").value_or("256x512"));
  check_shape(p, shape);
  std::cout << "  buffers for [" << shape.m << ", " << shape.k << "]:\n";
  for (const auto& b : input_buffers(p)) {
    std::cout << "    in  " << b.name << " " << b.dtype << "[1]\n";
  }
  for (const auto& b : output_buffers(p, shape)) {
    std::cout << "    out " << b.name << " " << b.dtype << "[";
    for (size_t i = 0; i < b.shape.size(); ++i) std::cout << (i ? ", " : "") << b.shape[i];
    std::cout << "] " << b.bytes << " B" << (b.zero_padding ? " (zero-padded)" : "") << "\n";
  }
  if (args.flag("--resources")) print_resources(emit_quantize(p, complete_form(p)));
  if (args.flag("--source")) {
    // Everything after this marker comes from emit_quantize alone (no recipe text).
    const KernelSource ks = emit_quantize(p, complete_form(p));
    std::cout << "// ---- source\n";
    // Name expressions in launch order: the phase-0 reduction (if any), then the cast.
    if (ks.amax_kernel) std::cout << "// amax_kernel: " << *ks.amax_kernel << "\n";
    std::cout << "// cast_kernel: " << ks.cast_kernel << "\n";
    // Instead of both, for a single tensor whose grid fits on the GPU at once (runtime/quantizer.h).
    if (ks.fused_kernel)
      std::cout << "// fused_kernel: "
                << (*ks.fused_kernel == ks.cast_kernel ? "the cast kernel, launched with one_launch = 1" : *ks.fused_kernel) << "\n";
    std::cout << "// smem_bytes: " << ks.smem_bytes << "\n";
    std::cout << ks.source;
    if (!ks.source.empty() && ks.source.back() != '\n') std::cout << "\n";
    if (separate_form(p) != complete_form(p)) {
      // The same without the fused kernel: a cache entry of its own, which a first call that does
      // not launch the fused kernel compiles where the complete program is not in the cache.
      const KernelSource sep = emit_quantize(p, QuantizeForm::Separate);
      std::cout << "// ---- separate form\n";
      if (sep.amax_kernel) std::cout << "// amax_kernel: " << *sep.amax_kernel << "\n";
      std::cout << "// cast_kernel: " << sep.cast_kernel << "\n";
      std::cout << "// smem_bytes: " << sep.smem_bytes << "\n";
      std::cout << sep.source;
      if (!sep.source.empty() && sep.source.back() != '\n') std::cout << "\n";
    }
  }
  return 0;
}

}  // namespace qf::cli
