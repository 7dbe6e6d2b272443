#include "runtime/dequantize_grouped.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "compiler/dequantize_codegen.h"
#include "compiler/error.h"
#include "runtime/driver.h"

namespace qf::rt {

namespace {
constexpr int kThreads = kDequantizeThreads;
constexpr int kMaxMembers = 1 << 20;  // the grouped quantize's limit
}  // namespace

int64_t dequantize_grouped_workspace_bytes(int num_members) { return 2 * (int64_t(num_members) + 1) * 8; }

QuantizeKernels build_dequantize_grouped_kernel(const qf::Stream& s, DType out, const std::string& arch,
                                                KernelCache& cache) {
  check_quantize_arch(arch);
  QuantizeKernels k;
  k.source = emit_dequantize_grouped(s, out);
  const CompileRequest req{k.source.source, "qforge_dequant_grouped.cu", {k.source.cast_kernel, *k.source.amax_kernel}, arch};
  k.cached = cache.get_or_compile(req, nlohmann::json{{"kind", "dequant_grouped"}});
  return k;
}

DequantGroupedArgs dequantize_grouped_geometry(const qf::Stream& s, Shape2D total, int members) {
  DequantGroupedArgs a{};
  a.m = total.m;
  a.k = total.k;
  a.num_members = members;
  a.transposed = s.layout == DataLayout::Transposed ? 1 : 0;
  if (traits(s.scaling).scale_storage != ScaleStorage::None) {
    const EntryShape e = scale_entry_shape(s);
    a.entry_rows = e.rows;
    a.entry_cols = e.cols;
    a.swizzled = s.scale_layout == ScaleLayout::Swizzled ? 1 : 0;
    a.mn_major = s.scale_layout == ScaleLayout::MnMajor ? 1 : 0;
  }
  return a;
}

void dequantize_grouped(const qf::Stream& s, Shape2D total, const DequantizeGroupedCall& call, DType out,
                        CUstream stream, KernelCache& cache) {
  const int G = call.num_members;
  if (G < 1 || G > kMaxMembers)
    throw UserError("num_members", "expected 1..2^20 members, got " + std::to_string(G));
  check_extent(total, true, "shape");
  const ScaleStorage storage = traits(s.scaling).scale_storage;
  // What the grouped quantize's buffers hold for any split (Quantizer::grouped_capacity's sizes):
  // the data of total.m rows, the scales grouped_scale_capacity's bytes. The texts of the messages
  // are built only when a check fails.
  const auto what = [&](const char* part) {
    return "the " + std::string(name(s.dir)) + " " + part + " of a grouped input " +
           format_shape(std::vector<int64_t>{total.m, total.k}) + " of " + std::to_string(G) + " members";
  };
  const Shape2D d = data_shape(s, total);
  const int64_t data_bytes = d.m * d.k * data_bits(s) / 8;
  if (!buffer_fits(call.data, data_bytes, 1)) check_buffer("data", call.data, data_bytes, 1, what("data"));
  if (storage != ScaleStorage::None) {
    const int64_t sb = traits(storage).bytes;
    const int64_t scale_bytes = grouped_scale_capacity(s, total, G);
    if (!buffer_fits(call.scale, scale_bytes, size_t(sb))) check_buffer("scale", call.scale, scale_bytes, size_t(sb), what("scales"));
  } else if (call.scale.ptr) {
    throw UserError("scale", "an identity stream has no scales: expected none");
  }
  if (storage == ScaleStorage::E4M3) check_buffer("amax", call.amax, 4 * int64_t(G), 4, "NVFP4's per-member amax, fp32 [num_members]");
  check_buffer("member_rows", call.member_rows, 8 * (int64_t(G) + 1), 8, "int64 [num_members + 1] row offsets");
  check_buffer("workspace", call.workspace, dequantize_grouped_workspace_bytes(G), 8,
               "the members' starts and scale bases, int64 [2 (num_members + 1)]");
  const int64_t out_bytes = total.m * total.k * traits(out).bytes;
  check_buffer("out", call.out, out_bytes, size_t(traits(out).bytes),
               "the dequantized " + format_shape(std::vector<int64_t>{total.m, total.k}));
  if (call.alpha_out.ptr) {
    if (storage != ScaleStorage::E4M3)
      throw UserError("alpha_out", "only NVFP4 (e4m3 block scales under a per-member decode scale) leaves a decode "
                                   "scale out of its values");
    check_buffer("alpha_out", call.alpha_out, 4 * int64_t(G), 4, "fp32 [num_members] (each member's S_dec, for a GEMM's alpha)");
  }
  // Outputs (out, workspace, alpha_out) alias neither an input nor each other.
  const std::pair<const char*, const TensorView*> outs[] = {{"out", &call.out}, {"workspace", &call.workspace}, {"alpha_out", &call.alpha_out}};
  const std::pair<const char*, const TensorView*> ins[] = {
      {"data", &call.data}, {"scale", &call.scale}, {"amax", &call.amax}, {"member_rows", &call.member_rows}};
  for (size_t i = 0; i < 3; ++i) {
    for (const auto& [n, v] : ins) check_disjoint(outs[i].first, *outs[i].second, n, *v);
    for (size_t j = i + 1; j < 3; ++j) check_disjoint(outs[i].first, *outs[i].second, outs[j].first, *outs[j].second);
  }

  const int dev = current_device();
  // The program of a kind, loaded once per device. Never destroyed, like the module registry.
  struct Loaded {
    std::shared_ptr<const Module> module;
    CUfunction f = nullptr, prep = nullptr;
    int sms = 0;
  };
  using Key = std::tuple<int, int, int, int, int>;
  static std::mutex& mu = *new std::mutex;
  static std::map<Key, Loaded>& loaded = *new std::map<Key, Loaded>;
  const Key key{dev, int(s.format), int(storage), int(s.format == ElemFormat::Identity ? s.out_dtype : DType::FP32), int(out)};
  Loaded fn;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = loaded.find(key); it != loaded.end()) fn = it->second;
  }
  if (!fn.f) {
    const QuantizeKernels k = build_dequantize_grouped_kernel(s, out, device_arch(dev), cache);
    fn.module = module_registry().get(dev, k.cached.entry->key, std::string_view(k.cached.entry->image));
    fn.f = fn.module->function(k.cached.entry->lowered(k.source.cast_kernel));
    fn.prep = fn.module->function(k.cached.entry->lowered(*k.source.amax_kernel));
    fn.sms = device_sm_count(dev);
    std::lock_guard<std::mutex> lock(mu);
    loaded.emplace(key, fn);
  }
  DequantGroupedArgs args = dequantize_grouped_geometry(s, total, G);
  args.data = reinterpret_cast<const u8*>(call.data.ptr);
  args.scale = reinterpret_cast<const u8*>(call.scale.ptr);
  args.amax = reinterpret_cast<const float*>(call.amax.ptr);
  args.out = reinterpret_cast<void*>(call.out.ptr);
  args.member_rows = reinterpret_cast<const i64*>(call.member_rows.ptr);
  args.starts = reinterpret_cast<i64*>(call.workspace.ptr);
  args.scale_base = args.starts + (G + 1);
  args.alpha_out = reinterpret_cast<float*>(call.alpha_out.ptr);
  void* params[] = {&args};
  launch(fn.prep, Dim3{1}, Dim3{1024}, 0, stream, params);
  const int64_t pairs = (total.m * total.k + 1) / 2;
  const int64_t want = (pairs + kThreads - 1) / kThreads;
  const int64_t cap = int64_t(fn.sms) * 8;
  launch(fn.f, Dim3{unsigned(std::max<int64_t>(1, std::min(want, cap)))}, Dim3{unsigned(kThreads)}, 0, stream, params);
}

}  // namespace qf::rt
