// qforge_bench: quantize-kernel bandwidth on the local GPU, as a ratio to the device's copy
// bandwidth measured in the same run.
//
//   qforge_bench [--recipes DIR] [--out FILE.json] [--quick] [--filter SUBSTR] [--iters-ms MS]
//                [--sizes MxK,MxK] [--groups ROWS,ROWS,...]
//
// For every shipped recipe x role x usage (training: rowwise + columnwise; inference: rowwise
// only) and every size, with bf16 input:
//   time_us  - device time of one quantize call (every launch it makes, memsets included),
//              median of 5 timed batches after warm-up; small sizes rotate over enough input and
//              output sets (>= 256 MiB) that L2 does not serve them;
//   bytes    - the minimal traffic: the input read once per pass the plan needs (2 with a global
//              amax phase, else 1; 1 where the call takes the one-pass row kernel) plus every
//              output (data, scales, amax) written once;
//   gbps     - bytes / time; ratio = gbps / copy_gbps;
//   form     - what a direct call runs: "row_pass" (the one-pass row kernel of rowwise
//              per-channel plans), "one_launch" (the cooperative fused kernel: a single tensor of
//              one wave of tiles) or "separate" (memsets, amax kernel, cast kernel);
//   tiles    - the program that kind of call takes where the cache holds both kinds (the
//              prewarm compiles both): "interior" (a single tensor of whole tiles: the plan's
//              program for interior tiles only) or "any";
//   e2e_us   - (small sizes) host wall time of one call + stream sync, launch overhead included;
//   host_us  - (small sizes) host wall time of the call alone (argument checks, memsets and
//              launches enqueued), against op_floor_us: one 4-byte cuMemsetD8Async + sync, the
//              round trip of a single stream operation, measured in the same run;
//   graph_us - (small sizes) device time per call with 20 calls captured in a CUDA graph and
//              replayed: the GPU's share of a call without the host's launch work (time_us of
//              a small call is bound by whichever of the two is slower);
//   launch_floor - an empty kernel taking the quantize kernels' argument struct, launched plainly
//              and cooperatively (as the one-launch fused kernels are): host_us of the launch,
//              e2e_us of launch + sync, b2b_us per launch back to back, graph_us per launch
//              replayed from a graph; the floors of a call's host_us, e2e_us, time_us, graph_us.
// Copy bandwidth: cuMemcpyDtoDAsync of 1 GiB, counting bytes read + written.
// Grouped cases: 8 uneven members (multiples of 1024 rows) x 2048 columns against one tensor of
// the same total; --groups sets the member rows (also with --sizes, which otherwise drops them).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/buffers.h"
#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "qforge/args.cuh"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/quantizer.h"
#include "tools/args.h"
#include "tools/cli_common.h"
#include "tools/quantize_timing.h"

namespace fs = std::filesystem;
using namespace qf;
using namespace qf::cli;

namespace {

// Host time of fn() alone and of fn() + stream sync, each the median of 200 calls (every call
// starts on an idle stream).
struct HostTimes {
  double host_us = 0, e2e_us = 0;
};
template <class F>
HostTimes host_times(CUstream stream, F&& fn) {
  const rt::Driver& d = rt::driver();
  std::vector<double> w, h;
  for (int i = 0; i < 220; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(i);
    const auto t1 = std::chrono::steady_clock::now();
    rt::check(d.cuStreamSynchronize(stream), "sync");
    if (i < 20) continue;  // warm-up
    w.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    h.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return {median(h), median(w)};
}

// An empty kernel with QuantizeArgs' size of parameters, launched plainly and cooperatively.
nlohmann::json launch_floor(CUstream stream, double target_ms) {
  rt::CompileRequest req;
  req.source = "struct Params { unsigned long long words[" + std::to_string((sizeof(QuantizeArgs) + 7) / 8) +
               "]; };\nextern \"C\" __global__ void qforge_empty_kernel(Params) {}\n";
  req.source_name = "qforge_empty.cu";
  req.name_expressions = {"qforge_empty_kernel"};
  const int dev = rt::current_device();
  req.arch = rt::device_arch(dev);
  const rt::CacheResult r = rt::KernelCache::global().get_or_compile(req, nlohmann::json{{"kind", "bench_empty"}});
  auto module = rt::module_registry().get(dev, r.entry->key, std::string_view(r.entry->image));
  CUfunction f = module->function(r.entry->lowered("qforge_empty_kernel"));
  QuantizeArgs args{};
  void* params[] = {&args};
  nlohmann::json out;
  for (const bool coop : {false, true}) {
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value.cooperative = 1;
    const std::span<CUlaunchAttribute> attrs = coop ? std::span<CUlaunchAttribute>(&attr, 1) : std::span<CUlaunchAttribute>();
    auto go = [&](int) { rt::launch(f, rt::Dim3{1}, rt::Dim3{32}, 0, stream, params, attrs, rt::SmemLimit::kPrepared); };
    const HostTimes t = host_times(stream, go);
    const double b2b = time_us(stream, go, target_ms);
    constexpr int kCalls = 20;
    const rt::Graph g(stream, [&] {
      for (int i = 0; i < kCalls; ++i) go(i);
    });
    const double graph = time_us(stream, [&](int) { g.launch(stream); }, target_ms) / kCalls;
    out[coop ? "cooperative" : "plain"] = {{"host_us", t.host_us}, {"e2e_us", t.e2e_us}, {"b2b_us", b2b}, {"graph_us", graph}};
    std::fprintf(stderr, "empty kernel, %s launch: host %.1f us, launch + sync %.1f us, back to back %.1f us, in a graph %.1f us\n",
                 coop ? "cooperative" : "plain", t.host_us, t.e2e_us, b2b, graph);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  const cli::Args args(std::vector<std::string>(argv + 1, argv + argc), {"--recipes", "--out", "--filter", "--iters-ms", "--sizes", "--groups"},
                       {"--quick"});
  const fs::path recipes_dir = args.get("--recipes").value_or("recipes");
  const std::string out_path = args.get("--out").value_or("qforge_bench.json");
  const std::string filter = args.get("--filter").value_or("");
  const bool quick = args.flag("--quick");
  const double target_ms = std::stod(args.get("--iters-ms").value_or("40"));

  std::vector<Shape2D> sizes = {{1024, 1024}, {2048, 2048}, {4096, 4096}, {8192, 8192}, {16384, 16384}, {65536, 7168}};
  if (quick) sizes = {{1024, 1024}, {16384, 16384}};
  bool grouped_cases = true;
  if (auto list = args.get("--sizes")) {  // "MxK,MxK": only these (grouped cases only with --groups)
    sizes.clear();
    grouped_cases = false;
    for (const std::string& item : split_list(*list)) sizes.push_back(parse_shape("--sizes", item));
  }
  std::vector<int64_t> uneven = {2048, 6144, 3072, 5120, 4096, 1024, 7168, 4096};  // 32768 rows
  if (auto list = args.get("--groups")) {
    uneven = cli::parse_row_counts("--groups", *list);
    grouped_cases = true;
  }
  int64_t grouped_rows = 0;
  for (int64_t v : uneven) grouped_rows += v;
  if (grouped_rows == 0) throw UserError("--groups", "the members add up to 0 rows");

  rt::primary_context(0)->make_current();
  rt::Stream stream;
  const std::string device = rt::device_name(0);
  const double copy_gbps = copy_bandwidth_gbps(stream.get());
  std::fprintf(stderr, "%s: copy bandwidth %.0f GB/s (read + write)\n", device.c_str(), copy_gbps);
  double op_floor_us = 0;
  {
    rt::DeviceBuffer word(256);
    std::vector<double> w;
    for (int i = 0; i < 300; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      rt::check(rt::driver().cuMemsetD8Async(CUdeviceptr(word.address()), 0, 4, stream.get()), "cuMemsetD8Async");
      rt::check(rt::driver().cuStreamSynchronize(stream.get()), "sync");
      if (i >= 100) w.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    op_floor_us = median(w);
    std::fprintf(stderr, "one stream operation + sync: %.1f us\n", op_floor_us);
  }
  const nlohmann::json floor = launch_floor(stream.get(), target_ms);

  const char* roles[] = {"linear:input", "linear:weight", "linear:grad_output"};

  std::vector<Case> cases;
  const std::vector<fs::path> files = recipe_files({recipes_dir.string()});
  for (const auto& f : files) {
    const Recipe r = load_recipe(f);
    for (const char* role : roles) {
      for (Usage u : {Usage::Training, Usage::Inference}) {
        if (quick && u != Usage::Training) continue;
        for (Shape2D s : sizes) cases.push_back({f.string(), r.name, role, u, s, {}});
        if (u == Usage::Training && grouped_cases) {
          cases.push_back({f.string(), r.name, role, u, {grouped_rows, 2048}, {}});
          cases.push_back({f.string(), r.name, std::string("grouped_") + role, u, {grouped_rows, 2048}, uneven});
        }
      }
    }
  }

  // One input pool, random normal bf16, large enough for the biggest case.
  int64_t pool_bytes = kRotateBytes;
  for (const auto& c : cases) pool_bytes = std::max(pool_bytes, c.shape.m * c.shape.k * 2);
  rt::DeviceBuffer pool{size_t(pool_bytes)};
  {
    std::vector<uint16_t> h = normal_bf16(std::min<size_t>(size_t(pool_bytes / 2), size_t(1) << 24), 7);
    h.resize(size_t(pool_bytes / 2));
    for (size_t i = size_t(1) << 24; i < h.size(); ++i) h[i] = h[(i * 2654435761u) & ((size_t(1) << 24) - 1)];
    pool.upload(h.data(), h.size() * 2);
  }

  nlohmann::json results = nlohmann::json::array();
  for (const auto& c : cases) {
    const std::string label = c.recipe + " " + c.role + " " + std::string(name(c.usage));
    if (!filter.empty() && label.find(filter) == std::string::npos) continue;
    try {
      const Recipe r = load_recipe(c.recipe_path);
      const Plan plan = compile_plan(r, PlanRequest{c.role, DType::BF16, c.usage, !c.members.empty()});
      const rt::Quantizer q(plan);
      check_shape(plan, c.shape);
      for (int64_t rows : c.members)  // the per-member rules the kernel relies on (e.g. 16-row RHT groups)
        if (rows > 0) check_shape(plan, Shape2D{rows, c.shape.k});
      const int64_t in_bytes = c.shape.m * c.shape.k * 2;
      const int64_t bytes = minimal_bytes(q, plan, c);
      const int sets = int(std::clamp<int64_t>((kRotateBytes + bytes - 1) / bytes, 1, 32));
      rt::DeviceBuffer offsets;
      if (!c.members.empty()) {
        std::vector<int64_t> rows(c.members.size() + 1, 0);
        for (size_t i = 0; i < c.members.size(); ++i) rows[i + 1] = rows[i] + c.members[i];
        offsets = rt::DeviceBuffer(rows.size() * 8);
        offsets.upload(rows.data(), rows.size() * 8);
      }
      std::vector<CallSet> set;
      for (int i = 0; i < sets; ++i) {
        const int64_t off = (int64_t(i) * in_bytes) % std::max<int64_t>(pool_bytes - in_bytes + 1, 1) / 256 * 256;
        set.push_back(make_set(q, c, pool.address() + uint64_t(off), in_bytes, offsets.address()));
      }
      const double us = time_us(stream.get(), [&](int i) { q.quantize(set[size_t(i % sets)].call, stream.get()); }, target_ms);
      HostTimes ht;
      double graph_us = 0;
      std::string graph_error;
      if (c.shape.m * c.shape.k <= 2048 * 2048) {
        ht = host_times(stream.get(), [&](int i) { q.quantize(set[size_t(i % sets)].call, stream.get()); });
        try {
          constexpr int kCalls = 20;
          const rt::Graph g(stream.get(), [&] {
            for (int i = 0; i < kCalls; ++i) q.quantize(set[size_t(i % sets)].call, stream.get());
          });
          graph_us = time_us(stream.get(), [&](int) { g.launch(stream.get()); }, target_ms) / kCalls;
        } catch (const std::exception& e) {
          graph_error = e.what();
        }
      }
      int kernels = 0;
      for (const auto& ph : plan.phases) kernels += ph.kind == PhaseKind::AmaxReduce ? 1 : 0;
      kernels += 1;
      const double gbps = double(bytes) / (us * 1e3);
      std::string dirs = plan.streams.size() == 2 ? "row+col" : plan.streams.empty() ? "none" : std::string(name(plan.streams[0].dir));
      nlohmann::json j = {{"recipe", c.recipe},      {"role", c.role},   {"usage", std::string(name(c.usage))},
                          {"directions", dirs},      {"shape", {c.shape.m, c.shape.k}},
                          {"grouped", !c.members.empty()}, {"time_us", us}, {"bytes", bytes},
                          {"gbps", gbps},            {"ratio", gbps / copy_gbps}, {"kernels", kernels},
                          {"tile", {plan.tile.rows, plan.tile.cols, plan.tile.threads}},
                          {"form", q.row_pass(c.shape) ? "row_pass" : c.members.empty() && q.one_launch(c.shape) ? "one_launch" : "separate"},
                          {"tiles", c.members.empty() && q.interior_programs(c.shape) ? "interior" : "any"}};
      if (!c.members.empty()) j["groups"] = c.members;
      if (ht.e2e_us > 0) j["e2e_us"] = ht.e2e_us, j["host_us"] = ht.host_us;
      if (graph_us > 0) j["graph_us"] = graph_us;
      if (!graph_error.empty()) j["graph_error"] = graph_error;
      results.push_back(j);
      std::fprintf(stderr, "%-60s %6lldx%-6lld %9.1f us %7.0f GB/s %5.1f%%%s", label.c_str(), (long long)c.shape.m,
                   (long long)c.shape.k, us, gbps, 100.0 * gbps / copy_gbps, c.members.empty() ? "" : " (grouped)");
      if (ht.e2e_us > 0) std::fprintf(stderr, "  call+sync %.1f us (host %.1f)", ht.e2e_us, ht.host_us);
      if (graph_us > 0) std::fprintf(stderr, "  graph %.1f us", graph_us);
      if (!graph_error.empty()) std::fprintf(stderr, "  graph capture failed: %s", graph_error.c_str());
      std::fprintf(stderr, "\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%-60s skipped: %s\n", label.c_str(), e.what());
      results.push_back({{"recipe", c.recipe}, {"role", c.role}, {"usage", std::string(name(c.usage))},
                         {"shape", {c.shape.m, c.shape.k}}, {"grouped", !c.members.empty()}, {"error", e.what()}});
    }
  }
  const nlohmann::json doc = {{"device", device}, {"copy_gbps", copy_gbps}, {"op_floor_us", op_floor_us}, {"launch_floor", floor}, {"results", results}};
  std::ofstream(out_path) << doc.dump(1) << "\n";
  std::fprintf(stderr, "wrote %s (%zu results)\n", out_path.c_str(), results.size());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "qforge_bench: %s\n", e.what());
  return 1;
}
