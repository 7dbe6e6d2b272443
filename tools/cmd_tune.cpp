// qforge tune <recipes...|dir> [--role R]... [--usage training,inference] [--dtype bf16]
//             [--shape MxK] [--ms MS] [--search all|tiles|registers] [--dry-run] [--verbose]
// Times every candidate tile (compiler/passes/select_tiles.h tile_candidates; --search: tile
// shapes, the default tile's register budgets, or both) of each plan on
// GPU 0, on a tensor of --shape (default 8192x8192, random normal input), and stores the
// fastest in the kernel cache (runtime/tuning.h) when it beats the default by more than 2%;
// later Quantizer loads on a GPU of the same model use it. Prints one line per plan and a
// summary; --dry-run times and reports without storing; --verbose also prints every candidate's
// time.
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>

#include "compiler/codegen.h"
#include "compiler/passes/select_tiles.h"
#include "compiler/pipeline.h"
#include "qforge/numerics.cuh"
#include "runtime/driver.h"
#include "runtime/quantizer.h"
#include "runtime/tuning.h"
#include "tools/args.h"
#include "tools/cli_common.h"
#include "tools/commands.h"
#include "tools/quantize_timing.h"

namespace qf::cli {
namespace {

std::string tile_str(const TileConfig& t) {
  return std::to_string(t.rows) + "x" + std::to_string(t.cols) + "/" + std::to_string(t.threads) +
         (t.min_blocks ? "/mb" + std::to_string(t.min_blocks) : "");
}

}  // namespace

int cmd_tune(const Argv& argv) {
  Args args(argv, {"--role", "--usage", "--dtype", "--shape", "--ms", "--search"}, {"--dry-run", "--verbose"});
  if (args.positional().empty()) throw UserError("recipes", "expected recipe files or a directory of them");
  const std::vector<std::filesystem::path> files = recipe_files(args.positional());
  std::vector<std::string> roles = args.all("--role");
  if (roles.empty()) roles = {"linear:input", "linear:weight", "linear:grad_output"};
  std::vector<Usage> usages;
  for (const auto& u : split_list(args.get("--usage").value_or("training,inference"))) {
    auto t = parse_usage(u);
    if (!t) throw UserError("--usage", "expected training, inference or memory, got \"" + u + "\"");
    usages.push_back(*t);
  }
  const std::string dt = args.get("--dtype").value_or("bf16");
  const DType dtype = parse_dtype_arg(args, "--dtype");
  const Shape2D shape = parse_shape("--shape", args.get("--shape").value_or("8192x8192"));
  if (shape.m * shape.k > (int64_t(1) << 32)) throw UserError("--shape", "expected M*K <= 2^32");
  const std::string ms_arg = args.get("--ms").value_or("20");
  double target_ms = 0.0;
  {
    // Milliseconds of timing per candidate: a positive finite number, the whole argument.
    char* end = nullptr;
    target_ms = std::strtod(ms_arg.c_str(), &end);
    if (ms_arg.empty() || end != ms_arg.c_str() + ms_arg.size() || !std::isfinite(target_ms) || target_ms <= 0.0 ||
        target_ms > 60000.0)
      throw UserError("--ms", "expected milliseconds of timing per candidate in (0, 60000], got \"" + ms_arg + "\"");
  }
  const bool dry = args.flag("--dry-run"), verbose = args.flag("--verbose");
  const std::string search_arg = args.get("--search").value_or("all");
  TileSearch search = TileSearch::All;
  if (search_arg == "tiles") search = TileSearch::Tiles;
  else if (search_arg == "registers") search = TileSearch::Registers;
  else if (search_arg != "all") throw UserError("--search", "expected all, tiles or registers, got \"" + search_arg + "\"");

  if (rt::device_count() == 0) throw UserError("device", "qforge tune times kernels on GPU 0, and there is no CUDA device");
  rt::primary_context(0)->make_current();
  const std::string arch = rt::device_arch(0), device = rt::device_name(0);
  rt::Stream stream;
  const int64_t in_bytes = shape.m * shape.k * traits(dtype).bytes;
  rt::DeviceBuffer input{size_t(in_bytes)};
  {
    std::vector<uint8_t> h(static_cast<size_t>(in_bytes));
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < shape.m * shape.k; ++i) {
      const float v = nd(rng);
      if (dtype == DType::FP32) std::memcpy(&h[size_t(i) * 4], &v, 4);
      else {
        const uint16_t b = dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(&h[size_t(i) * 2], &b, 2);
      }
    }
    input.upload(h.data(), h.size());
  }
  std::printf("qforge tune on %s (%s), %lldx%lld %s\n", device.c_str(), arch.c_str(), (long long)shape.m,
              (long long)shape.k, dt.c_str());
  int tuned = 0, kept = 0, plans = 0;
  for (const auto& f : files) {
    const Recipe r = load_recipe(f);
    for (const auto& role : roles) {
      for (Usage u : usages) {
        Plan plan;
        try {
          plan = compile_plan(r, PlanRequest{role, dtype, u, false});
          check_shape(plan, shape);
        } catch (const UserError&) {
          continue;  // role or usage the recipe does not define for this shape
        }
        if (plan.streams.empty()) continue;
        ++plans;
        const Case c{f.string(), r.name, role, u, shape, {}};
        double best_us = 0, default_us = 0;
        TileConfig best = plan.tile;
        int tried = 0;
        bool one_wave = false;  // whether the shape runs the one-launch form (asked of the default tile)
        // The default first; register variants with the launch bounds of a tile already listed
        // (the default's own, e.g.) in the program this shape takes are the same kernel.
        for (const TileConfig& t : distinct_tiles(plan, tile_candidates(plan, search), shape.m, shape.k)) {
          Plan p = plan;
          p.tile = t;
          const rt::Quantizer q(p, rt::KernelCache::global(), /*use_tuning=*/false);
          if (t == plan.tile) one_wave = q.one_launch(shape);
          CallSet set = make_set(q, c, input.address(), in_bytes, 0);
          const double us = time_us(stream.get(), [&](int) { q.quantize(set.call, stream.get()); }, target_ms);
          if (verbose) std::printf("    %-12s %8.1f us\n", tile_str(t).c_str(), us);
          if (tried++ == 0) default_us = us, best_us = us;
          if (us < best_us) best_us = us, best = t;
        }
        // A shape whose grid is one wave times the one-launch form: the tile stored still serves
        // every shape.
        const bool store = best != plan.tile && best_us < 0.98 * default_us;
        std::printf("  %-28s %-20s %-9s default %-12s %8.1f us  best %-12s %8.1f us  (%d tiles)%s\n", r.name.c_str(),
                    role.c_str(), std::string(name(u)).c_str(), tile_str(plan.tile).c_str(), default_us,
                    tile_str(best).c_str(), best_us, tried, store ? (dry ? "  [dry run]" : "  stored") : "");
        if (one_wave)
          std::printf("    note: at %lldx%lld this plan runs its one-launch form (one wave of tiles); the tile a tune stores "
                      "applies to every shape, so tune at the sizes that dominate (default 8192x8192)\n",
                      (long long)shape.m, (long long)shape.k);
        std::fflush(stdout);  // one line per plan as it finishes (tuning takes minutes)
        if (store && !dry) {
          rt::TuningRecord rec{best, best_us, default_us, shape.m, shape.k, device, arch};
          if (rt::store_tuning(plan, rec)) ++tuned;
        } else {
          ++kept;
        }
      }
    }
  }
  std::printf("tune: %d plans, %d tuned tiles stored, %d keep the default\n", plans, tuned, kept);
  return 0;
}

}  // namespace qf::cli
