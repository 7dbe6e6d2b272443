// qforge_first_call: one quantize plan's first call through the C++ API, in a fresh process, on
// the local GPU: what a C++ framework's first step waits for (bench/first_call.py runs it once
// per recipe, shape and cache state; docs/jit.md has the goals).
//
//   qforge_first_call RECIPE.json ROLE USAGE MxK
//
// The context and a bf16 input (random normal) are made first, untimed. first_ms is the host time
// from reading the recipe to the output on the device (stream synchronized): plan, Quantizer,
// output buffers, kernel program (a compile, a shipped or a disk-cache hit, as the cache
// environment makes it: QFORGE_CACHE_DIR, QFORGE_CACHE_SHIPPED_DIRS), module load and the call.
// warm_us is a later call's share of 20 back to back (as bench/first_call.py's torch child times
// them), after 3 more. Prints one JSON object on stdout, with the program's tiles (interior / any).
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/buffers.h"
#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "runtime/driver.h"
#include "runtime/quantizer.h"
#include "tools/cli_common.h"
#include "tools/quantize_timing.h"

using namespace qf;
using namespace qf::cli;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) try {
  if (argc != 5) throw UserError("arguments", "expected RECIPE.json ROLE USAGE MxK, got " + std::to_string(argc - 1) + " arguments");
  const Shape2D shape = parse_shape("MxK", argv[4]);
  const std::optional<Usage> usage = parse_usage(argv[3]);
  if (!usage) throw UserError("USAGE", std::string("expected training, inference or memory, got '") + argv[3] + "'");

  rt::primary_context(0)->make_current();
  rt::Stream stream;
  const int64_t in_bytes = shape.m * shape.k * 2;
  rt::DeviceBuffer input{size_t(in_bytes)};
  input.upload(normal_bf16(size_t(shape.m * shape.k), 7).data(), size_t(in_bytes));
  const rt::Driver& d = rt::driver();
  rt::check(d.cuStreamSynchronize(stream.get()), "sync");

  const auto t0 = Clock::now();
  const Recipe r = load_recipe(argv[1]);
  const Plan plan = compile_plan(r, PlanRequest{argv[2], DType::BF16, *usage, false});
  const rt::Quantizer q(plan);
  check_shape(plan, shape);
  const Case c{argv[1], r.name, argv[2], *usage, shape, {}};
  CallSet set = make_set(q, c, input.address(), in_bytes, 0);
  q.quantize(set.call, stream.get());
  rt::check(d.cuStreamSynchronize(stream.get()), "sync");
  const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

  for (int i = 0; i < 3; ++i) q.quantize(set.call, stream.get());
  rt::check(d.cuStreamSynchronize(stream.get()), "sync");
  constexpr int kCalls = 20;
  const auto t2 = Clock::now();
  for (int i = 0; i < kCalls; ++i) q.quantize(set.call, stream.get());
  rt::check(d.cuStreamSynchronize(stream.get()), "sync");
  const double warm_us = std::chrono::duration<double, std::micro>(Clock::now() - t2).count() / kCalls;
  const nlohmann::json out = {{"first_ms", first_ms},
                              {"warm_us", warm_us},
                              {"tiles", q.interior_programs(shape) ? "interior" : "any"}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "qforge_first_call: %s\n", e.what());
  return 1;
}
