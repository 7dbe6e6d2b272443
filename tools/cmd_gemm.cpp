// qforge gemm: build, run, check and time one grouped fp8 GEMM (runtime/gemm.h).
//
// Without a GPU: --source prints the emitted CUDA, --arch compiles it (kernel cache) and prints
// the tile. With a GPU: random operands (host-generated, uploaded), one run, then --check
// compares sampled rows with the float64 CPU reference (reference/gemm.h; bound per element
// |got - ref| <= out_rel * |ref| + acc_rel * sum|a*b|, plus the relative Frobenius error) and
// --bench times it (CUDA events, median) and prints TFLOP/s.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "compiler/error.h"
#include "compiler/gemm_codegen.h"
#include "reference/gemm.h"
#include "reference/gemm_problem.h"
#include "runtime/driver.h"
#include "qforge/numerics.cuh"
#include "runtime/gemm.h"
#include "tools/args.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace qf::cli {
namespace {

// An operand format; the default is e4m3, e2m1 with nvfp4 scaling, bf16 with none, bf16 x int8
// with channel, or follows the other operand's (default_gemm_format).
GemmOperandFormat format_arg(const Args& args, const std::string& flag, GemmScaling s) {
  const bool b_side = flag == "--b-format";
  const std::string other = args.get(b_side ? "--a-format" : "--b-format").value_or("");
  return parse_gemm_format(args.get(flag).value_or(std::string(default_gemm_format(s, b_side, other))), flag);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

float bits_to_float(const GemmSpec& s, const uint8_t* p) {
  if (s.out_dtype == DType::FP32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return bf16_to_f32(h);
}

}  // namespace

int cmd_gemm(const Argv& argv) {
  Args args(argv,
            {"--a-format", "--b-format", "--scaling", "--groups", "--m", "--n", "--k", "--splits", "--out",
             "--block-m", "--block-n", "--stages", "--multicast", "--raster", "--arch", "--seed", "--check-rows",
             "--iters", "--warmup", "--json", "--zero-groups", "--max-ctas", "--ordered", "--m-max", "--scale-layout", "--route"},
            {"--accumulate", "--alpha", "--fast-accum", "--uneven", "--source", "--check", "--bench", "--k-grouped", "--members"});
  if (!args.positional().empty()) throw UserError(args.positional()[0], "unexpected argument");
  GemmSpec spec;
  const std::string scaling = args.get("--scaling").value_or("blockwise");
  auto sc = parse_gemm_scaling(scaling);
  if (!sc) throw UserError("--scaling", "expected tensor, rowwise, blockwise, mxfp8, nvfp4, none or channel, got \"" + scaling + "\"");
  spec.scaling = *sc;
  set_gemm_formats(spec, format_arg(args, "--a-format", spec.scaling), format_arg(args, "--b-format", spec.scaling),
                   "--b-format");
  spec.n = args.integer("--n", 4096, 8, int64_t(1) << 24);
  spec.k = args.integer("--k", 7168, 16, int64_t(1) << 24);
  // --k-grouped (wgrad): D[g] [M, N] over the group's tokens; --k is the tokens per group.
  const bool k_grouped = args.flag("--k-grouped");
  const int64_t tokens_per_group = spec.k;
  // --members: the grouped quantizer's per-member transposed copies (k_grouped_members).
  const bool members = args.flag("--members");
  if (members && !k_grouped) throw UserError("--members", "per-member operands are a wgrad layout: add --k-grouped");
  if (k_grouped) {
    spec.layout = members ? GemmLayout::KGroupedMembers : GemmLayout::KGrouped;
    spec.m = args.integer("--m", 4096, 1, int64_t(1) << 24);
    spec.k = 0;
  }
  const std::string out = args.get("--out").value_or("bf16");
  if (out != "bf16" && out != "fp32") throw UserError("--out", "expected bf16 or fp32, got \"" + out + "\"");
  spec.out_dtype = out == "bf16" ? DType::BF16 : DType::FP32;
  spec.accumulate = args.flag("--accumulate");
  spec.fast_accum = args.flag("--fast-accum");
  if (auto l = args.get("--scale-layout")) spec.scale_layout = parse_gemm_scale_layout(*l, "--scale-layout");
  if (auto r = args.get("--route")) spec.route = parse_gemm_route(*r, "--route");
  spec.tile.block_m = int(args.integer("--block-m", 0, 0, 1024));
  spec.tile.block_n = int(args.integer("--block-n", 0, 0, 1024));
  spec.tile.stages = int(args.integer("--stages", 0, 0, 64));
  spec.tile.multicast = int(args.integer("--multicast", 0, 0, 16));
  spec.tile.raster_m = int(args.integer("--raster", 0, 0, 4096));
  if (auto o = args.get("--ordered")) {
    if (*o != "on" && *o != "off") throw UserError("--ordered", "expected on or off, got \"" + *o + "\"");
    spec.tile.ordered = *o == "on" ? 2 : 1;
  }
  try {
    validate(spec);
  } catch (const UserError& e) {  // name the flag rather than the spec field
    static const std::map<std::string, std::string> kFlag = {
        {"a_format", "--a-format"}, {"b_format", "--b-format"}, {"n", "--n"}, {"k", "--k"}, {"m", "--m"},
        {"scaling", "--scaling"}, {"layout", "--k-grouped"}, {"operand_dtype", "--a-format"},
        {"out_dtype", "--out"}, {"accumulate", "--accumulate"}, {"fast_accum", "--fast-accum"}, {"scale_layout", "--scale-layout"},
        {"route", "--route"},
        {"tile.block_m", "--block-m"}, {"tile.block_n", "--block-n"}, {"tile.stages", "--stages"},
        {"tile.multicast", "--multicast"}, {"tile.raster_m", "--raster"}, {"tile.ordered", "--ordered"}};
    auto it = kFlag.find(e.where());
    if (it == kFlag.end()) throw;
    throw UserError(it->second, std::string(e.what()).substr(e.where().size() + 2));
  }
  // --source: every kernel the spec may launch (gemm_kernel_specs, as prewarm compiles them; auto:
  // both routes'), the dequant route's operand kernels first.
  if (args.flag("--source")) {
    const GemmKernelSpecs kernels = gemm_kernel_specs(spec);
    for (const GemmSpec& k : kernels.dequant) {
      const DequantSource ds = emit_dequant(k);
      std::cout << ds.source << "// kernels: " << ds.a_kernel << ", " << ds.b_kernel << ", " << ds.prep_kernel << "\n";
    }
    for (const GemmSpec& k : kernels.gemm) {
      const GemmSource gs = emit_gemm(k);
      std::cout << gs.source << "// kernel: " << gs.kernel << "\n";
    }
    return 0;
  }
  // --arch compiles every route's kernels; a run takes the problem's route (auto: below).
  const GemmSpec asked = spec;  // the spec as given (auto stays auto for rt::Gemm)
  // What this invocation runs or shows; for auto, the problem's route once its groups are known.
  auto show_route = [&](GemmRoute r) {
    spec = gemm_route_spec(asked, r);
    spec.tile = resolve_tile(spec);
  };
  show_route(asked.route == GemmRoute::Auto ? GemmRoute::Fused : asked.route);
  bool dequant = spec.route == GemmRoute::Dequant;
  GemmSource src = emit_gemm(dequant ? dequant_inner_spec(spec) : spec);
  auto tile_line = [&] {
    std::ostringstream os;
    os << "tile " << spec.tile.block_m << "x" << spec.tile.block_n << "x"
       << (dequant || gemm_operand_bits(spec, spec.a_format) == 16 ? 64 : 128) << ", " << spec.tile.stages << " stages, multicast "
       << spec.tile.multicast << ", raster " << spec.tile.raster_m << ", ordered issue "
       << (spec.tile.ordered == 2 ? "on" : "off") << ", " << src.threads << " threads, "
       << src.smem_bytes << " bytes of shared memory";
    return os.str();
  };
  if (auto arch = args.get("--arch")) {
    rt::Gemm gemm(asked);
    const auto t0 = std::chrono::steady_clock::now();
    rt::CacheHow how;
    try {
      how = gemm.prepare(*arch);
    } catch (const UserError& e) {  // prepare's arch rule, named as the flag
      if (e.where() != "arch") throw;
      throw UserError("--arch", e.message());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::cout << describe(gemm.spec()) << "\n" << (gemm.spec().route == GemmRoute::Auto ? "fused route: " : "") << tile_line()
              << "\n" << *arch << ": " << rt::name(how) << " in " << ms << " ms\n";
    return 0;
  }

  // Problem.
  const int groups = int(args.integer("--groups", 8, 1, 1 << 20));
  const uint64_t seed = uint64_t(args.integer("--seed", 1, 0, INT64_MAX));
  std::vector<int64_t> rows;
  if (auto s = args.get("--splits")) {
    rows = cli::parse_row_counts("--splits", *s);
  } else {
    const int64_t m = k_grouped ? tokens_per_group : args.integer("--m", 4096, 0, int64_t(1) << 30);
    if (args.flag("--uneven")) {
      const int zero = int(args.integer("--zero-groups", groups > 2 ? 1 : 0, 0, groups - 1));
      const int64_t granule = m % 64 == 0 ? 64 : members ? gemm_k_total_multiple(spec) : 1;
      rows = ref::random_group_rows(groups, m * groups, zero, m % granule == 0 ? granule : 1, seed);
    } else {
      rows.assign(size_t(groups), m);
    }
  }
  {  // the run's extent and operands within what the GEMM takes (host buffers of that size follow)
    int64_t total = 0;
    for (int64_t r : rows) total += r;  // each at most 2^31, at most 2^20 groups
    try {
      rt::check_gemm_call_size(spec, total, int64_t(rows.size()));
    } catch (const UserError& e) {
      throw UserError(args.get("--splits") ? "--splits" : "--m, --groups", e.message());
    }
  }
  if (members) {  // a misaligned member would only give NaN: name it instead
    const int64_t align = gemm_k_total_multiple(spec);
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i] % align != 0)
        throw UserError(args.get("--splits") ? "--splits" : "--k",
                        "--members: each member's token count must be a multiple of " + std::to_string(align) +
                            " (16-byte TMA rows), got " + std::to_string(rows[i]) + " for member " + std::to_string(i));
  }
  const rt::Driver& drv = rt::driver();
  if (!drv.available() || rt::device_count() == 0)
    throw UserError("gemm", "needs a CUDA device (" + (drv.available() ? std::string("none found") : drv.unavailable_reason()) +
                                "); without one, use --source or --arch");
  rt::primary_context(0)->make_current();
  std::cout << "groups " << rows.size() << ":";
  for (size_t i = 0; i < rows.size() && i < 16; ++i) std::cout << " " << rows[i];
  if (rows.size() > 16) std::cout << " ...";
  std::cout << "\n";

  const auto tg = std::chrono::steady_clock::now();
  const bool with_alpha = args.flag("--alpha");
  // --m-max: masked layout [G, m_max, K]; the group sizes become the per-slot counts.
  const int64_t m_max = args.integer("--m-max", 0, 0, int64_t(1) << 30);
  if (k_grouped && m_max > 0) throw UserError("--m-max", "the masked layout is M-grouped; --k-grouped splits K");
  ref::GemmProblem p =
      k_grouped  ? ref::make_k_grouped_gemm_problem(spec, rows, 0, ref::GemmValues::Random, with_alpha, seed)
      : m_max > 0 ? ref::make_masked_gemm_problem(spec, rows, m_max, ref::GemmValues::Random, with_alpha, seed)
                  : ref::make_gemm_problem(spec, rows, 0, ref::GemmValues::Random, with_alpha, seed);
  // Rows [first, second) of group g.
  auto group_range = [&](size_t g) -> std::pair<int64_t, int64_t> {  // rows of D
    if (k_grouped) return {int64_t(g) * spec.m, int64_t(g + 1) * spec.m};
    if (m_max == 0) return {p.offsets[g], p.offsets[g + 1]};
    const int64_t s = int64_t(g) * m_max;
    return {s, s + std::clamp<int64_t>(rows[g], 0, m_max)};
  };
  // Multiply-adds / (N * K): rows times K per group (K-grouped: M times the group's tokens).
  int64_t used_rows = 0;
  for (size_t g = 0; g < rows.size(); ++g) used_rows += group_range(g).second - group_range(g).first;
  const double mk = k_grouped ? double(spec.m) * double(p.offsets.back()) : double(used_rows) * double(spec.k);
  const int64_t m_total = p.m_total, out_rows = p.out_rows, ob = traits(spec.out_dtype).bytes;
  std::cout << "operands generated in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - tg).count() << " s\n";
  const int64_t extent = k_grouped ? p.k_total : m_total;
  if (asked.route == GemmRoute::Auto) {  // this problem's route, as rt::Gemm picks it
    show_route(choose_gemm_route(asked, extent, int64_t(rows.size())));
    dequant = spec.route == GemmRoute::Dequant;
    src = emit_gemm(dequant ? dequant_inner_spec(spec) : spec);
    std::cout << "route auto: " << name(spec.route) << "\n";
  }
  std::cout << describe(spec) << "\n" << tile_line() << "\n";

  auto upload = [](const void* data, size_t bytes) {
    rt::DeviceBuffer b(std::max<size_t>(bytes, 16));
    if (bytes) b.upload(data, bytes);
    return b;
  };
  rt::DeviceBuffer da = upload(p.a.data(), p.a.size()), db = upload(p.b.data(), p.b.size());
  rt::DeviceBuffer dsa = upload(p.a_scale.data(), p.a_scale.size()), dsb = upload(p.b_scale.data(), p.b_scale.size());
  rt::DeviceBuffer dal = with_alpha ? upload(p.alpha.data(), p.alpha.size() * 4) : rt::DeviceBuffer();
  rt::DeviceBuffer dama = upload(p.a_amax.data(), p.a_amax.size() * 4), damb = upload(p.b_amax.data(), p.b_amax.size() * 4);
  rt::DeviceBuffer doff = m_max > 0 ? upload(p.counts.data(), p.counts.size() * 8) : upload(p.offsets.data(), p.offsets.size() * 8);
  rt::DeviceBuffer dd(std::max<size_t>(size_t(out_rows * spec.n * ob), 16));
  auto reset_d = [&] {
    if (spec.accumulate) dd.upload(p.d_init.data(), p.d_init.size() * 4);
    else dd.fill(0xFF);  // poison: an unwritten element reads as NaN
  };
  reset_d();
  auto view = [](const rt::DeviceBuffer& b) { return rt::TensorView{b.address(), int64_t(b.size()), std::nullopt, {}}; };
  rt::GemmCall call;
  call.a = view(da), call.b = view(db), call.d = view(dd);
  if (gemm_a_scaled(spec)) call.a_scale = view(dsa);
  if (gemm_b_scaled(spec)) call.b_scale = view(dsb);
  if (with_alpha) call.alpha = view(dal);
  if (!p.a_amax.empty()) call.a_amax = view(dama), call.b_amax = view(damb);
  if (m_max > 0) call.group_counts = view(doff), call.m_max = m_max;
  else call.group_offsets = view(doff);
  call.m_total = m_total;
  call.k_total = p.k_total;
  call.num_groups = int(rows.size());
  call.max_ctas = int(args.integer("--max-ctas", 0, 0, 1 << 20));
  rt::Gemm gemm(asked);
  std::cout << "persistent CTAs: " << gemm.persistent_ctas() << " (" << rt::device_sm_count(0) << " SMs)"
            << (call.max_ctas ? ", capped at " + std::to_string(call.max_ctas) : std::string()) << "\n";
  // --members: the tensor-map workspace; the dequant route: the operands' copies (and with --members
  // the none GEMM's tensor maps); the fused kernels of the other layouts take none.
  std::optional<rt::DeviceBuffer> dws;
  if (const int64_t wsb = gemm.workspace_bytes(extent, call.num_groups); wsb > 0) call.workspace = view(dws.emplace(size_t(wsb)));
  rt::Stream stream;
  const auto tc = std::chrono::steady_clock::now();
  gemm.run(call, stream.get());
  stream.synchronize();
  std::cout << "first run (compile or cache load + launch): "
            << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tc).count() << " ms\n";

  nlohmann::json result = {{"gemm", describe(spec)},
                           {"route", std::string(name(spec.route))},  // the route run; as asked:
                           {"route_asked", std::string(name(asked.route))},
                           {"tile", {{"block_m", spec.tile.block_m}, {"block_n", spec.tile.block_n},
                                     {"stages", spec.tile.stages}, {"multicast", spec.tile.multicast},
                                     {"raster_m", spec.tile.raster_m}}},
                           {"groups", rows},
                           {"layout", k_grouped ? std::string(name(spec.layout)) : m_max > 0 ? "masked" : "contiguous"},
                           {"scaling", std::string(traits(spec.scaling).name)},
                           {"fast_accum", spec.fast_accum},
                           {"scale_layout", std::string(name(spec.scale_layout))},
                           {"num_groups", rows.size()},
                           {"m", k_grouped ? spec.m : 0},
                           {"n", spec.n},
                           {"k", spec.k},
                           {"flops", 2.0 * mk * double(spec.n)}};
  int rc = 0;
  if (args.flag("--check")) {
    // Rows: each group's first and last, its tile boundaries around 128, and random ones.
    const int per_group = int(args.integer("--check-rows", 8, 1, 1 << 20));
    std::mt19937_64 rng(seed + 99);
    std::vector<int64_t> check;
    for (size_t g = 0; g < rows.size(); ++g) {
      const auto [s, e] = group_range(g);
      if (e == s) continue;
      for (int64_t r : {s, e - 1, s + 127, s + 128}) if (r >= s && r < e) check.push_back(r);
      for (int i = 0; i < per_group; ++i) check.push_back(s + int64_t(rng() % uint64_t(e - s)));
    }
    std::sort(check.begin(), check.end());
    check.erase(std::unique(check.begin(), check.end()), check.end());
    const auto tr = std::chrono::steady_clock::now();
    const ref::GemmRows ref = ref::gemm_reference(spec, p.operands(), check);
    const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();
    const ref::GemmTolerance tol = ref::gemm_tolerance(spec);
    std::vector<uint8_t> row(size_t(spec.n * ob));
    double err2 = 0, ref2 = 0, worst = 0;
    int64_t bad = 0, compared = 0;
    std::string first_bad;
    for (size_t i = 0; i < check.size(); ++i) {
      dd.download(row.data(), row.size(), size_t(check[i] * spec.n * ob));
      for (int64_t c = 0; c < spec.n; ++c) {
        const double prev = spec.accumulate ? double(p.d_init[size_t(check[i] * spec.n + c)]) : 0.0;
        const double want = ref.value[i * size_t(spec.n) + size_t(c)] + prev;
        const double got = bits_to_float(spec, &row[size_t(c * ob)]);
        const double bound = tol.out_rel * std::fabs(want) + tol.acc_rel * ref.magnitude[i * size_t(spec.n) + size_t(c)] +
                             (spec.accumulate ? std::ldexp(std::fabs(prev), -22) : 0.0);
        const double err = std::fabs(got - want);
        ++compared;
        err2 += err * err, ref2 += want * want;
        if (bound > 0) worst = std::max(worst, err / bound);
        if (!(err <= bound)) {
          if (bad++ == 0) {
            std::ostringstream os;
            os << "row " << check[i] << " col " << c << ": got " << got << ", expected " << want << " (bound " << bound << ")";
            first_bad = os.str();
          }
        }
      }
    }
    const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    std::printf("check: %zu rows x %lld columns vs the float64 reference (%.1f s): rel. Frobenius error %.3g, "
                "worst error / bound %.3g, %lld outside the bound (out_rel %.3g, acc_rel %.3g)\n",
                check.size(), (long long)spec.n, ref_s, rel, worst, (long long)bad, tol.out_rel, tol.acc_rel);
    if (bad) std::printf("check: FAILED, first: %s\n", first_bad.c_str());
    else std::printf("check: ok\n");
    result["check"] = {{"rows", check.size()}, {"rel_fro", rel}, {"worst_over_bound", worst}, {"bad", bad}, {"compared", compared}};
    if (bad) rc = 1;
  }
  if (args.flag("--bench")) {
    const int iters = int(args.integer("--iters", 20, 1, 100000));
    const int warmup = int(args.integer("--warmup", 3, 0, 1000));
    for (int i = 0; i < warmup; ++i) gemm.run(call, stream.get());
    std::vector<double> ms;
    rt::Event e0, e1;
    for (int i = 0; i < iters; ++i) {
      e0.record(stream.get());
      gemm.run(call, stream.get());
      e1.record(stream.get());
      e1.synchronize();
      ms.push_back(rt::Event::elapsed_ms(e0, e1));
    }
    const double t = median(ms);
    const double flops = 2.0 * mk * double(spec.n);
    std::printf("bench: median %.3f ms over %d runs (min %.3f), %.1f TFLOP/s\n", t, iters,
                *std::min_element(ms.begin(), ms.end()), flops / (t * 1e-3) / 1e12);
    result["bench"] = {{"median_ms", t}, {"min_ms", *std::min_element(ms.begin(), ms.end())}, {"tflops", flops / (t * 1e-3) / 1e12}};
  }
  if (auto j = args.get("--json")) {
    std::ofstream f(*j, std::ios::app);
    f << result.dump() << "\n";
  }
  return rc;
}

}  // namespace qf::cli
