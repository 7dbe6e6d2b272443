#include "tests/fuzz/fuzz_entry.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>

#include "compiler/buffers.h"
#include "compiler/codegen.h"
#include "compiler/error.h"
#include "compiler/gemm_codegen.h"
#include "compiler/pipeline.h"
#include "qforge/gemm.cuh"
#include "reference/executor.h"

namespace qf::fuzz {
namespace {

// Escapes bytes for a PropertyFailure message (which may be printed by the fuzzer).
std::string shown(std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (char c : s.substr(0, 300)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  if (s.size() > 300) out += "...";
  return out;
}

[[noreturn]] void broken(const std::string& what) { throw PropertyFailure(what); }

// The error convention (compiler/error.h): one printable line, led by its where() (a JSON
// pointer while parsing, an argument name after).
void check_user_error(const UserError& e, bool parsing) {
  const std::string what = e.what();
  for (char c : what) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) broken("UserError message with a control byte: " + shown(what));
  }
  if (what.size() > 2000) broken("UserError message of " + std::to_string(what.size()) + " bytes");
  const std::string& where = e.where();
  if (!where.empty() && what.rfind(where + ": ", 0) != 0)
    broken("UserError message does not start with its where(): " + shown(what));
  if (parsing && !where.empty() && where[0] != '/')
    broken("parse error whose where() is not a JSON pointer: " + shown(what));
}

void check_source(const std::string& src, const char* what) {
  if (src.empty()) broken(std::string("empty ") + what);
  for (char c : src) {
    const auto u = static_cast<unsigned char>(c);
    if (!(u == '\n' || (u >= 0x20 && u < 0x7f)))
      broken(std::string(what) + " has a byte outside printable ASCII: " + shown(src));
  }
}

// A small bf16 tensor with normal, zero, denormal, max and non-finite values, the same for
// every input (the fuzzer varies the recipe, not the data).
ref::HostTensor small_input(Shape2D shape) {
  ref::HostTensor x;
  x.dtype = DType::BF16;
  x.shape = shape;
  x.bytes.resize(size_t(shape.m * shape.k) * 2);
  uint32_t state = 12345;
  for (int64_t i = 0; i < shape.m * shape.k; ++i) {
    state = state * 1664525u + 1013904223u;
    float v = float(int32_t(state >> 8) - (1 << 23)) / float(1 << 20);  // about [-8, 8)
    switch (i % 61) {
      case 7: v = 0.0f; break;
      case 13: v = -0.0f; break;
      case 19: v = 1e-40f; break;  // fp32 denormal; bf16 keeps it
      case 29: v = 3.0e38f; break;
      case 37: v = INFINITY; break;
      case 43: v = -INFINITY; break;
      case 53: v = NAN; break;
      default: break;
    }
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    const auto b16 = uint16_t(bits >> 16);
    x.bytes[size_t(i) * 2] = uint8_t(b16 & 0xff);
    x.bytes[size_t(i) * 2 + 1] = uint8_t(b16 >> 8);
  }
  return x;
}

void check_outputs(const std::vector<ref::Output>& outs, size_t expected_count) {
  if (outs.size() != expected_count)
    broken("reference wrote " + std::to_string(outs.size()) + " buffers, output_buffers() lists " +
           std::to_string(expected_count));
  for (const auto& o : outs)
    if (o.desc.bytes < 0 || o.bytes.size() != size_t(o.desc.bytes))
      broken("reference buffer " + o.desc.name + " has " + std::to_string(o.bytes.size()) +
             " bytes, its descriptor says " + std::to_string(o.desc.bytes));
}

// Runs the CPU reference on a small tensor (and, for grouped plans, a grouped tensor with an
// empty member). Shapes the plan cannot take are UserErrors.
void run_reference(const Plan& p) {
  if (p.input != DType::BF16) return;
  ref::QuantizeParams params;
  params.seed = 7;
  params.offset = 3;
  for (const auto& b : input_buffers(p)) params.scales[b.name] = 0.5f;
  const Shape2D shape{32, 64};
  const ref::HostTensor x = small_input(shape);
  try {
    if (p.grouped) {
      const std::array<int64_t, 3> splits{16, 0, 16};
      check_outputs(ref::quantize_grouped(p, x, splits, params), output_buffers(p, shape).size());
    } else {
      check_outputs(ref::quantize(p, x, params), output_buffers(p, shape).size());
    }
  } catch (const UserError& e) {
    check_user_error(e, false);
  }
}

void check_buffers(const Plan& p) {
  static constexpr Shape2D kShapes[] = {{1, 1}, {16, 16}, {31, 33}, {128, 4224}, {4096, 4096}};
  for (const auto& b : input_buffers(p))
    if (b.bytes <= 0) broken("input buffer " + b.name + " of " + std::to_string(b.bytes) + " bytes");
  for (Shape2D s : kShapes) {
    try {
      check_shape(p, s);
    } catch (const UserError& e) {
      check_user_error(e, false);
      continue;
    }
    std::set<std::string> names;
    for (const auto& b : output_buffers(p, s)) {
      if (b.bytes < 0) broken("output buffer " + b.name + " of " + std::to_string(b.bytes) + " bytes");
      if (!names.insert(b.name).second) broken("two output buffers named " + b.name);
    }
  }
}

// Everything after the pipeline, for one compiled plan.
void check_plan(const Plan& p, bool run_ref) {
  if (print(p).empty()) broken("empty plan printout");
  std::string previous;  // the forms' sources differ (each is a cache entry of its own)
  for (QuantizeForm f : quantize_forms(p)) {
    const KernelSource ks = emit_quantize(p, f);
    check_source(ks.source, "emitted source");
    if (ks.source == previous) broken("two forms of a plan with the same source");
    previous = ks.source;
    if ((f == QuantizeForm::All) != ks.fused_kernel.has_value()) broken("a fused kernel outside the all form");
    check_source(ks.cast_kernel, "cast kernel name expression");
    if (ks.amax_kernel) check_source(*ks.amax_kernel, "amax kernel name expression");
    if (ks.fused_kernel) check_source(*ks.fused_kernel, "fused kernel name expression");
    if (ks.row_kernel) check_source(*ks.row_kernel, "row kernel name expression");
    // The source depends on the plan's structure only: not on recipe text or the role's name.
    Plan anon = p;
    anon.recipe = "r";
    anon.role = "m:t";
    const KernelSource ka = emit_quantize(anon, f);
    if (ka.source != ks.source || ka.cast_kernel != ks.cast_kernel || ka.amax_kernel != ks.amax_kernel ||
        ka.fused_kernel != ks.fused_kernel || ka.row_kernel != ks.row_kernel)
      broken("emitted source depends on the recipe name or role name");
  }
  // A one-launch form without a fused kernel of its own: one program, whose cast kernel serves
  // both forms, and which the separate launches take too.
  if (has_one_launch(p) && !own_fused_kernel(p)) {
    if (quantize_forms(p).size() != 1) broken("two programs of a plan whose one kernel serves both forms");
    const KernelSource all = emit_quantize(p, QuantizeForm::All);
    if (!all.fused_kernel || *all.fused_kernel != all.cast_kernel) broken("a fused kernel beside the cast kernel serving both forms");
    if (emit_quantize(p, QuantizeForm::Separate).source != all.source) broken("a separate form of a plan with one program");
  }
  for (const auto& s : p.streams)
    if (const auto* d = std::get_if<PerTensorDelayed>(&s.scaling))
      check_source(emit_history_update(*d, s.format).source, "history kernel source");
  check_buffers(p);
  if (run_ref) run_reference(p);
}

struct Request {
  std::optional<Usage> usage;
  DType dtype;
  bool grouped;
};

// The recipe's usage with every dtype and grouped, then every usage explicitly.
constexpr Request kRequests[] = {
    {std::nullopt, DType::BF16, false}, {std::nullopt, DType::BF16, true},
    {std::nullopt, DType::FP16, false}, {std::nullopt, DType::FP32, false},
    {Usage::Training, DType::BF16, false}, {Usage::Inference, DType::BF16, false},
    {Usage::Memory, DType::BF16, false},
};

}  // namespace

std::vector<std::string> roles_to_try(const Recipe& recipe) {
  std::vector<std::string> roles;
  std::set<std::string> seen;
  auto add = [&](std::string r) {
    if (seen.insert(r).second) roles.push_back(std::move(r));
  };
  for (auto r : standard_roles()) add(std::string(r));
  size_t rules = 0;
  for (const auto& rule : recipe.roles) {
    if (++rules > 16) break;
    for (const auto& pat : rule.patterns) {
      std::string r = (pat.parts[0] == "*" ? "any" : pat.parts[0]) + ":" +
                      (pat.parts[1] == "*" ? "any" : pat.parts[1]);
      if (pat.parts[2] != "*") r += ":" + pat.parts[2];
      add(std::move(r));
    }
  }
  return roles;
}

void run_recipe(std::string_view bytes) {
  Recipe recipe;
  try {
    recipe = parse_recipe(bytes);
  } catch (const UserError& e) {
    check_user_error(e, true);
    return;
  }
  if (recipe.roles.empty()) broken("a recipe without rules was accepted");

  PipelineOptions options;
  options.verify = true;
  // Roles that resolve to the same rule give the same plans (but for the role's name, which
  // check_plan shows does not matter): compile each rule once.
  std::set<const RoleRule*> done;
  for (const auto& role : roles_to_try(recipe)) {
    const RoleRule* rule = nullptr;
    try {
      rule = resolve_role(recipe, role).rule;
    } catch (const UserError& e) {
      check_user_error(e, false);
      continue;
    }
    if (!done.insert(rule).second) continue;
    for (const Request& rq : kRequests) {
      Plan p;
      try {
        p = compile_plan(recipe, PlanRequest{role, rq.dtype, rq.usage, rq.grouped}, options);
      } catch (const UserError& e) {
        check_user_error(e, false);
        continue;
      }
      if (p.streams.empty()) broken("a plan without streams for role " + role);
      check_plan(p, /*run_ref=*/!rq.usage && rq.dtype == DType::BF16);
    }
  }
  // Accepted "gemms" entries are valid specs: they emit a kernel whose shared memory fits.
  for (const auto& g : recipe.gemms) {
    const GemmKernelSpecs kernels = gemm_kernel_specs(g.spec);  // every route's
    for (const GemmSpec& k : kernels.gemm) {
      const GemmSource src = emit_gemm(k);
      check_source(src.source, "emitted GEMM source");
      if (src.smem_bytes > kGemmSmemLimit) broken("GEMM " + g.pointer + " needs " + std::to_string(src.smem_bytes) + " bytes of shared memory");
    }
    for (const GemmSpec& k : kernels.dequant) check_source(emit_dequant(k).source, "emitted dequant source");
  }
}

std::vector<std::pair<std::string, std::string>> emit_all(const Recipe& recipe) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& role : roles_to_try(recipe))
    for (Usage u : {Usage::Training, Usage::Inference, Usage::Memory})
      for (DType d : {DType::BF16, DType::FP16, DType::FP32})
        for (bool grouped : {false, true}) {
          const std::string key = role + " " + std::string(name(u)) + " " +
                                  std::string(traits(d).name) + (grouped ? " grouped" : " single");
          Plan p;
          try {
            p = compile_plan(recipe, PlanRequest{role, d, u, grouped});
          } catch (const UserError&) {
            out.emplace_back(key, "<rejected>");
            continue;
          }
          for (QuantizeForm f : quantize_forms(p)) {
            const KernelSource ks = emit_quantize(p, f);
            // The name expressions reach NVRTC too.
            out.emplace_back(key + " " + std::string(name(f)),
                             ks.source + "// cast_kernel: " + ks.cast_kernel + "\n// amax_kernel: " +
                                 ks.amax_kernel.value_or("-") + "\n// fused_kernel: " + ks.fused_kernel.value_or("-") +
                                 "\n// row_kernel: " + ks.row_kernel.value_or("-") + "\n");
          }
          for (const auto& s : p.streams)
            if (const auto* m = std::get_if<PerTensorDelayed>(&s.scaling))
              out.emplace_back(key + " history/" + std::string(name(s.dir)),
                               emit_history_update(*m, s.format).source);
        }
  for (const auto& g : recipe.gemms) {
    const GemmKernelSpecs kernels = gemm_kernel_specs(g.spec);
    for (size_t i = 0; i < kernels.gemm.size(); ++i) {
      const GemmSource src = emit_gemm(kernels.gemm[i]);
      out.emplace_back("gemm " + g.pointer + " " + std::to_string(i), src.source + "// kernel: " + src.kernel + "\n");
    }
    for (size_t i = 0; i < kernels.dequant.size(); ++i)
      out.emplace_back("gemm " + g.pointer + " dequant " + std::to_string(i), emit_dequant(kernels.dequant[i]).source);
  }
  return out;
}

}  // namespace qf::fuzz
