#include "runtime/dequantize.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "compiler/dequantize_codegen.h"
#include "compiler/error.h"
#include "runtime/driver.h"

namespace qf::rt {

DequantizeArgs dequantize_geometry(const qf::Stream& s, Shape2D in) {
  const Shape2D d = data_shape(s, in);
  const ScaleGrid g = scale_grid(s, in);
  DequantizeArgs a{};
  a.rows = d.m;
  a.cols = d.k;
  a.block_rows = g.block_rows;
  a.block_cols = g.block_cols;
  a.grid_padded_rows = g.padded_rows;
  a.grid_padded_cols = g.padded_cols;
  a.swizzled = g.swizzled;
  a.mn_major = g.mn_major;
  return a;
}

QuantizeKernels build_dequantize_kernel(const qf::Stream& s, DType out, const std::string& arch, KernelCache& cache) {
  check_quantize_arch(arch);
  QuantizeKernels k;
  k.source = emit_dequantize(s, out);
  const CompileRequest req{k.source.source, "qforge_dequantize.cu", {k.source.cast_kernel}, arch};
  k.cached = cache.get_or_compile(req, nlohmann::json{{"kind", "dequantize"}});
  return k;
}

void dequantize(const qf::Stream& s, Shape2D in, const DequantizeCall& call, DType out, CUstream stream,
                KernelCache& cache) {
  check_extent(in, false, "shape");
  const Shape2D d = data_shape(s, in);
  const ScaleStorage storage = traits(s.scaling).scale_storage;
  // The stream's own buffers as output_buffers sizes them.
  Plan one;
  one.streams = {s};
  one.streams[0].tensor_amax = -1;
  one.streams[0].local_amax = -1;
  const std::vector<BufferDesc> bufs = output_buffers(one, in);
  // The texts of the messages are built only when a check fails (this runs on every call).
  const auto shape = [&] { return format_shape(std::vector<int64_t>{in.m, in.k}); };
  const auto fits = [](const char* arg, const TensorView& v, int64_t bytes, size_t align, const auto& what) {
    if (!buffer_fits(v, bytes, align)) check_buffer(arg, v, bytes, align, what());
  };
  fits("data", call.data, bufs[0].bytes, 1, [&] { return "the " + std::string(name(s.dir)) + " data of input " + shape(); });
  if (storage != ScaleStorage::None)
    fits("scale", call.scale, bufs[1].bytes, size_t(traits(storage).bytes),
         [&] { return "the " + std::string(name(s.dir)) + " scales of input " + shape(); });
  if (storage == ScaleStorage::E4M3) check_buffer("amax", call.amax, 4, 4, "NVFP4's per-tensor amax");
  const int64_t out_bytes = d.m * d.k * traits(out).bytes;
  fits("out", call.out, out_bytes, size_t(traits(out).bytes), [&] { return "the dequantized " + shape(); });
  check_disjoint("out", call.out, "data", call.data);
  check_disjoint("out", call.out, "scale", call.scale);
  check_disjoint("out", call.out, "amax", call.amax);
  if (call.s_dec_out.ptr) {
    if (storage != ScaleStorage::E4M3)
      throw UserError("s_dec_out", "only NVFP4 (e4m3 block scales under a per-tensor decode scale) leaves a decode "
                                   "scale out of its values");
    check_buffer("s_dec_out", call.s_dec_out, 4, 4, "fp32 [1] (the global decode scale, for a GEMM's alpha)");
    check_disjoint("s_dec_out", call.s_dec_out, "out", call.out);
    check_disjoint("s_dec_out", call.s_dec_out, "data", call.data);
    check_disjoint("s_dec_out", call.s_dec_out, "scale", call.scale);
    check_disjoint("s_dec_out", call.s_dec_out, "amax", call.amax);
  } else if (call.s_dec_multiply) {
    throw UserError("s_dec_out", "s_dec_multiply needs s_dec_out");
  }

  const int dev = current_device();
  // Every dequantize after the first of a kind on a device finds its function here, without
  // codegen, hashing or a cache lookup. Never destroyed, like the module registry.
  struct Loaded {
    std::shared_ptr<const Module> module;
    CUfunction f = nullptr;
    unsigned threads = 0;
    int sms = 0;
  };
  using Key = std::tuple<int, int, int, int, int>;
  static std::mutex& mu = *new std::mutex;
  static std::map<Key, Loaded>& loaded = *new std::map<Key, Loaded>;
  const Key key{dev, int(s.format), int(storage), int(s.format == ElemFormat::Identity ? s.out_dtype : DType::FP32),
                int(out)};
  Loaded fn;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = loaded.find(key); it != loaded.end()) fn = it->second;
  }
  if (!fn.f) {
    const QuantizeKernels k = build_dequantize_kernel(s, out, device_arch(dev), cache);
    fn.module = module_registry().get(dev, k.cached.entry->key, std::string_view(k.cached.entry->image));
    fn.f = fn.module->function(k.cached.entry->lowered(k.source.cast_kernel));
    fn.threads = unsigned(k.source.tile.threads);
    fn.sms = device_sm_count(dev);
    std::lock_guard<std::mutex> lock(mu);
    loaded.emplace(key, fn);
  }
  DequantizeArgs args = dequantize_geometry(s, in);
  args.data = reinterpret_cast<const u8*>(call.data.ptr);
  args.scale = reinterpret_cast<const u8*>(call.scale.ptr);
  args.amax = reinterpret_cast<const float*>(call.amax.ptr);
  args.out = reinterpret_cast<void*>(call.out.ptr);
  args.transposed_out = call.transposed_out ? 1 : 0;
  args.s_dec_out = reinterpret_cast<float*>(call.s_dec_out.ptr);
  args.s_dec_in = call.s_dec_multiply ? args.s_dec_out : nullptr;
  const int64_t pairs = (d.m * d.k + 1) / 2;
  const int64_t want = (pairs + fn.threads - 1) / fn.threads;
  const int64_t cap = int64_t(fn.sms) * 8;
  void* params[] = {&args};
  launch(fn.f, Dim3{unsigned(std::max<int64_t>(1, std::min(want, cap)))}, Dim3{fn.threads}, 0, stream, params);
}

}  // namespace qf::rt
