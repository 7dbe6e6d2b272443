// qforge prewarm <recipes...|dir> [--arch sm_90a,sm_100a] [-j N] [--dtype ...] [--usage ...] [--tiles ...]
// Compiles every quantize kernel the recipes can need into the kernel cache: each standard
// role x usage (direction set) x input dtype, for each arch, as each plan's complete program
// (codegen.h complete_form: every kernel, so no call compiles; a plan's separate form, which a
// first call without the fused kernel compiles where this is missing, is not needed then).
// Grouped and single-tensor calls
// share one kernel (member sizes are read on the device), so "grouped" adds no kernels. The
// recipes' "gemms" entries are compiled too, for sm_90a (the GEMM kernels are wgmma code),
// unless --role restricts the run to some roles' quantize kernels. So are the INT8 optimizer
// step's kernels (runtime/optim_int8.h, int8_optim_prewarm_specs) of a recipe whose bf16 weight
// rule is int8 storage's (int8_weight_sr), when training is among the usages and no --role is
// given: every kernel shape qt.Int8AdamW / qt.Int8SGD launch for rows a multiple of 4 long.
// Each plan's complete program is compiled for any tiles (the program every call can take) and
// for interior tiles only (codegen.h Tiles: single tensors whose M and K are multiples of the tile
// and of 16 take it; smaller and faster kernels), unless --tiles names one of them.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <sched.h>
#include <unistd.h>

#include "compiler/codegen.h"
#include "compiler/gemm_codegen.h"
#include "compiler/pipeline.h"
#include "runtime/driver.h"
#include "runtime/gemm.h"
#include "runtime/optim_int8.h"
#include "runtime/quantizer.h"
#include "tools/args.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace qf::cli {
namespace {

// One kernel to build: a quantize plan's, a GEMM's, a history update's or an INT8 optimizer step's.
struct Job {
  std::string recipe;  // for the summary
  std::optional<Plan> plan;
  std::optional<GemmSpec> gemm;
  std::string arch;
  std::optional<std::pair<PerTensorDelayed, ElemFormat>> history;  // delayed scaling's history update
  std::optional<rt::Int8OptimKernelSpec> optim;                     // the INT8 parameter's optimizer step
  Tiles tiles = Tiles::Any;                                          // a quantize plan's program: for which tiles
  double cost = 1;  // estimated compile time, relative (estimated_cost): the longest start first
  std::string what() const {
    if (history) return "amax history (" + std::string(traits(history->second).name) + ")";
    if (optim) return "int8 optimizer step (" + rt::describe(*optim) + ")";
    return plan ? plan->role : gemm->route == GemmRoute::Dequant ? describe(*gemm) + ": operand kernels" : describe(*gemm);
  }
};

constexpr const char* kGemmArch = "sm_90a";  // wgmma: the GEMM kernels' only target

// A job's compile time, relative, so the longest start first and the last ones to finish are
// short. Fitted to the CPU times NVRTC 13.0 takes for the shipped recipes' sm_90a kernels
// (bench/jit_time.py, docs/jit.md; CI's JIT report on 15baa3c, medians): a quantize program grows
// with its streams, a transposed one (staged through shared memory) costing about twice as much,
// and with its amax sources; the program for any tiles (edge tiles in compact loops) at about
// 0.55 of that sum, one for interior tiles only at about 0.3 (883 and 489 ms against a GEMM's
// 632); an fp16 input about 1.1x (fp32 1.0x); a GEMM or the dequant route's operand kernels 0.9;
// the history update a tenth of that; an INT8 optimizer step about half (344 ms).
double estimated_cost(const Job& j) {
  if (j.history) return 0.1;
  if (j.optim) return 0.5;
  if (j.gemm) return 0.9;
  double c = 0.0;
  for (const auto& s : j.plan->streams) c += s.layout == DataLayout::Transposed ? 2.0 : 1.0;
  c += 0.25 * double(j.plan->amax.size());
  c *= j.tiles == Tiles::Interior ? 0.3 : 0.55;  // docs/jit.md, steps 8 and 9
  return j.plan->input == DType::FP16 ? 1.1 * c : c;
}

// The CPUs this process may run on (its affinity mask: a container's or taskset's share), else
// what the system reports.
int usable_cpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

struct Tally {
  int plans = 0, gemms = 0, optim = 0, kernels = 0, compiled = 0, memory_hits = 0, disk_hits = 0, failed = 0;
  double seconds = 0;
};

}  // namespace

int cmd_prewarm(const Argv& argv) {
  Args args(argv, {"--arch", "-j", "--dtype", "--usage", "--role", "--tiles"}, {"--quiet"});
  if (args.positional().empty()) throw UserError("recipes", "expected recipe files or a directory of them");

  const std::vector<std::filesystem::path> files = recipe_files(args.positional());

  std::vector<std::string> archs = split_list(args.get("--arch").value_or(""));
  if (archs.empty()) archs = {rt::device_count() > 0 ? rt::device_arch(0) : std::string("sm_90a")};
  for (const auto& a : archs) {  // before any job: a bad arch is the command line's error, not a job's
    try {
      rt::check_quantize_arch(a);
    } catch (const UserError& e) {
      throw UserError("--arch", e.message());
    }
  }
  std::vector<DType> dtypes;
  for (const auto& d : split_list(args.get("--dtype").value_or("bf16,fp16,fp32"))) {
    auto t = parse_dtype(d);
    if (!t) throw UserError("--dtype", "expected bf16, fp16 or fp32, got \"" + d + "\"");
    dtypes.push_back(*t);
  }
  std::vector<Usage> usages;
  for (const auto& u : split_list(args.get("--usage").value_or("training,inference,memory"))) {
    auto t = parse_usage(u);
    if (!t) throw UserError("--usage", "expected training, inference or memory, got \"" + u + "\"");
    usages.push_back(*t);
  }
  if (dtypes.empty()) throw UserError("--dtype", "expected a list of bf16, fp16 or fp32, got none");
  if (usages.empty()) throw UserError("--usage", "expected a list of training, inference or memory, got none");
  std::vector<Tiles> tiles;
  for (const auto& t : split_list(args.get("--tiles").value_or("any,interior"))) {
    if (t != "any" && t != "interior") throw UserError("--tiles", "expected any or interior, got \"" + t + "\"");
    const Tiles v = t == "any" ? Tiles::Any : Tiles::Interior;
    if (std::find(tiles.begin(), tiles.end(), v) == tiles.end()) tiles.push_back(v);
  }
  if (tiles.empty()) throw UserError("--tiles", "expected a list of any or interior, got none");
  std::vector<std::string> roles = args.all("--role");
  for (const auto& r : roles) (void)parse_role(r, "--role");  // a malformed role names itself here
  const bool with_gemms = roles.empty();  // --role asks for those roles' quantize kernels only
  const bool with_optim = roles.empty() && std::find(usages.begin(), usages.end(), Usage::Training) != usages.end();
  if (roles.empty())
    for (auto r : standard_roles()) roles.emplace_back(r);
  const int jobs_n = int(args.integer("-j", usable_cpus(), 1, 256));

  // Plans, deduplicated by (source, arch): recipes that need the same kernel share it.
  const auto t_start = std::chrono::steady_clock::now();
  std::vector<Job> jobs;
  std::map<std::string, Tally> tally;
  std::set<std::pair<std::string, std::string>> seen;
  std::vector<std::string> order;
  std::set<std::filesystem::path> read;
  for (const auto& f : files) {
    // One file once (listed twice, or a directory and a file in it); two files of one recipe
    // name are two rows.
    std::error_code ec;
    const std::filesystem::path canon = std::filesystem::weakly_canonical(f, ec);
    if (!read.insert(ec ? f : canon).second) continue;
    const Recipe r = load_recipe(f);
    const std::string label = tally.count(r.name) ? r.name + " (" + f.string() + ")" : r.name;
    order.push_back(label);
    Tally& t = tally[label];
    for (const auto& role : roles)
      for (Usage u : usages)
        for (DType d : dtypes) {
          Plan p;
          try {
            p = compile_plan(r, PlanRequest{role, d, u, false});
          } catch (const UserError&) {
            continue;  // role not covered, or a usage its rule cannot serve
          }
          ++t.plans;
          for (Tiles tl : tiles) {
            const std::string src = emit_quantize(p, complete_form(p), tl).source;
            for (const auto& a : archs)
              if (seen.insert({src, a}).second) {
                Job j{label, p, std::nullopt, a, std::nullopt};
                j.tiles = tl;
                jobs.push_back(std::move(j));
                ++t.kernels;
              }
          }
          // Delayed scaling's history update, which the training step launches after each quantize.
          for (const auto& rule : rt::history_rules(p)) {
            const std::string hsrc = emit_history_update(rule.first, rule.second).source;
            for (const auto& a : archs)
              if (seen.insert({hsrc, a}).second) {
                jobs.push_back({label, std::nullopt, std::nullopt, a, rule});
                ++t.kernels;
              }
          }
        }
    // The INT8 optimizer step of a weight stored as int8 (qt.Int8Linear's weight quantizer is the
    // inference usage's; the step is training's, hence the usage condition above).
    if (with_optim)
      for (DType d : dtypes) {
        Plan wp;
        try {
          wp = compile_plan(r, PlanRequest{"linear:weight", d, Usage::Inference, false});
        } catch (const UserError&) {
          continue;
        }
        for (const auto& spec : rt::int8_optim_prewarm_specs(wp)) {
          ++t.optim;
          const std::string osrc = rt::emit_int8_optim(spec);
          for (const auto& a : archs)
            if (seen.insert({osrc, a}).second) {
              Job j{label, std::nullopt, std::nullopt, a, std::nullopt};
              j.optim = spec;
              jobs.push_back(std::move(j));
              ++t.kernels;
            }
        }
      }
    for (const auto& g : r.gemms) {
      if (!with_gemms || std::find(archs.begin(), archs.end(), kGemmArch) == archs.end()) continue;
      ++t.gemms;
      // Every route's kernels (auto: both): the dequant route's operand kernels are a job of their
      // own, its none GEMM on the copies another.
      const GemmKernelSpecs kernels = gemm_kernel_specs(g.spec);
      for (const auto* specs : {&kernels.dequant, &kernels.gemm})
        for (const GemmSpec& spec : *specs) {
          const std::string src = specs == &kernels.dequant ? emit_dequant(spec).source : emit_gemm(spec).source;
          if (seen.insert({src, kGemmArch}).second) {
            jobs.push_back({label, std::nullopt, spec, kGemmArch, std::nullopt});
            ++t.kernels;
          }
        }
    }
  }

  // Longest first (stable: equal estimates keep the recipes' order).
  for (auto& j : jobs) j.cost = estimated_cost(j);
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.cost > b.cost; });

  std::atomic<size_t> next{0}, done{0};
  double compile_seconds = 0, longest = 0;  // over the jobs that compiled
  std::string longest_what;
  std::mutex mu;
  std::vector<std::string> failures;
  const bool tty = isatty(2) && !args.flag("--quiet");
  auto worker = [&] {
    for (size_t i; (i = next++) < jobs.size();) {
      const auto t0 = std::chrono::steady_clock::now();
      std::string err;
      rt::CacheHow how = rt::CacheHow::Compiled;
      try {
        const Job& j = jobs[i];
        how = j.history ? rt::build_history_kernel(j.history->first, j.history->second, j.arch).cached.how
              : j.optim ? rt::build_int8_optim_kernel(*j.optim, j.arch, rt::KernelCache::global()).cached.how
              : j.plan  ? rt::build_quantize_kernels(*j.plan, complete_form(*j.plan), j.arch, rt::KernelCache::global(), j.tiles)
                              .cached.how
              : j.gemm->route == GemmRoute::Dequant
                  ? rt::build_dequant_kernels(*j.gemm, j.arch, rt::KernelCache::global()).cached.how
                  : rt::build_gemm_kernel(*j.gemm, j.arch, rt::KernelCache::global()).cached.how;
      } catch (const std::exception& e) {
        err = e.what();
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> g(mu);
      Tally& t = tally[jobs[i].recipe];
      t.seconds += s;
      if (err.empty() && how == rt::CacheHow::Compiled) {
        compile_seconds += s;
        if (s > longest) longest = s, longest_what = jobs[i].recipe + " " + jobs[i].what() + " " + jobs[i].arch;
      }
      if (!err.empty()) {
        ++t.failed;
        failures.push_back(jobs[i].recipe + " " + jobs[i].what() + " " + jobs[i].arch + ": " + err);
      } else if (how == rt::CacheHow::Compiled) {
        ++t.compiled;
      } else if (how == rt::CacheHow::DiskHit) {
        ++t.disk_hits;
      } else {
        ++t.memory_hits;
      }
      const size_t d = ++done;
      if (tty) {
        const int width = 30, filled = int(width * d / std::max<size_t>(jobs.size(), 1));
        std::fprintf(stderr, "\r[%s%s] %zu/%zu kernels", std::string(size_t(filled), '#').c_str(),
                     std::string(size_t(width - filled), '.').c_str(), d, jobs.size());
        std::fflush(stderr);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < std::min<int>(jobs_n, int(std::max<size_t>(jobs.size(), 1))); ++i) pool.emplace_back(worker);
  for (auto& th : pool) th.join();
  if (tty) std::fprintf(stderr, "\n");
  const int threads = int(pool.size());

  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  // plans: quantize plans (role x usage x dtype); gemms: the recipe's "gemms" entries; optim: INT8
  // optimizer step kernels; kernels: what those need, each counted for the first recipe needing it.
  std::printf("%-28s %6s %6s %6s %8s %9s %10s %7s %10s\n", "recipe", "plans", "gemms", "optim", "kernels", "compiled",
              "cache hits", "failed", "kernel s");
  Tally sum;
  for (const auto& n : order) {
    const Tally& t = tally[n];
    std::printf("%-28s %6d %6d %6d %8d %9d %10d %7d %10.2f\n", n.c_str(), t.plans, t.gemms, t.optim, t.kernels,
                t.compiled, t.disk_hits + t.memory_hits, t.failed, t.seconds);
    sum.plans += t.plans, sum.gemms += t.gemms, sum.optim += t.optim, sum.kernels += t.kernels, sum.compiled += t.compiled;
    sum.disk_hits += t.disk_hits + t.memory_hits, sum.failed += t.failed, sum.seconds += t.seconds;
  }
  std::string arch_list;
  for (const auto& a : archs) arch_list += (arch_list.empty() ? "" : ",") + a;
  std::printf("%-28s %6d %6d %6d %8d %9d %10d %7d %10.2f\n", "total", sum.plans, sum.gemms, sum.optim, sum.kernels,
              sum.compiled, sum.disk_hits, sum.failed, sum.seconds);
  // Kernel-seconds over wall seconds: how busy the threads were (the rest is waiting for the
  // last, longest compiles, or for other processes compiling the same kernels).
  std::printf("time: %.2f kernel-s in %.2f s wall on %d thread%s (%.2f busy on average)", sum.seconds, total, threads,
              threads == 1 ? "" : "s", total > 0 ? sum.seconds / total : 0.0);
  if (sum.compiled) std::printf("; compiles %.2f s, longest %.2f s (%s)", compile_seconds, longest, longest_what.c_str());
  std::printf("\n");
  const auto& cache = rt::KernelCache::global();
  std::printf("prewarm: %d kernels for %s: %d compiled, %d cache hits, %d failed in %.2f s (cache: %s)\n",
              sum.kernels, arch_list.c_str(), sum.compiled, sum.disk_hits, sum.failed, total,
              cache.disk_writable() && cache.writable_root() ? cache.writable_root()->string().c_str() : "memory only");
  std::fflush(stdout);  // the summary before what follows on stderr
  for (const auto& f : failures) std::fprintf(stderr, "qforge prewarm: failed: %s\n", f.c_str());
  if (sum.plans == 0)  // every role x usage x dtype was one its recipes' rules do not serve
    std::fprintf(stderr, "qforge prewarm: warning: no quantize plan matched the recipes' rules for the --role / --usage / "
                         "--dtype given\n");
  return failures.empty() ? 0 : 3;
}

}  // namespace qf::cli
