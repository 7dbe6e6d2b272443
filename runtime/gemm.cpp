#include "runtime/gemm.h"

#include <algorithm>
#include <cstring>

#include "compiler/buffers.h"
#include "compiler/error.h"
#include "qforge/dequant.cuh"
#include "qforge/gemm.cuh"
#include "runtime/driver.h"
#include "runtime/nvrtc.h"
#include "runtime/tensor_map_cache.h"

namespace qf::rt {
namespace {

// Same bytes (CUDA 13 aligns CUtensorMap to 128, TMA needs 64; the copy is by memcpy).
static_assert(sizeof(CUtensorMap) == sizeof(TmaDescriptor), "TmaDescriptor mirrors CUtensorMap");

constexpr int kMaxGroups = 1 << 20;
constexpr int64_t kMaxMTotal = (int64_t(1) << 31) - 257;  // + block_m (<= 128) + 128 stays in int

// A tensor map of `type` elements: dims / byte strides as cuTensorMapEncodeTiled takes them
// (innermost first, strides of dims 1..), zero fill out of bounds (loads), clipping (stores).
// Through the process's tensor-map cache (an equal request's map is copied, not encoded again);
// the error text is built only when the encode fails.
TmaDescriptor encode_map(const char* what, CUtensorMapDataType type, uint64_t base, std::initializer_list<cuuint64_t> dims,
                         std::initializer_list<cuuint64_t> strides, std::initializer_list<cuuint32_t> box,
                         CUtensorMapSwizzle swizzle) {
  QF_CHECK(dims.size() >= 1 && dims.size() <= 5 && strides.size() + 1 == dims.size() && box.size() == dims.size(),
           "tensor map ", what, " of rank ", dims.size());
  TensorMapKey key;
  key.type = type;
  key.rank = cuuint32_t(dims.size());
  key.address = base;
  std::copy(dims.begin(), dims.end(), key.dims.begin());
  std::copy(strides.begin(), strides.end(), key.strides.begin());
  std::copy(box.begin(), box.end(), key.box.begin());
  std::fill_n(key.elem_strides.begin(), dims.size(), cuuint32_t(1));
  key.interleave = CU_TENSOR_MAP_INTERLEAVE_NONE;
  key.swizzle = swizzle;
  key.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  key.oob_fill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
  CUtensorMap map;
  const CUresult r = tensor_map_cache().get(key, &map);
  if (r != CUDA_SUCCESS) check(r, std::string("cuTensorMapEncodeTiled (") + what + ")");
  TmaDescriptor out;
  std::memcpy(&out, &map, sizeof out);
  return out;
}

// nvfp4 takes each operand's per-tensor amax (fp32 [num_groups], the global decode scales);
// the other scalings take none.
// (The texts are built only when a check fails: this runs on every call.)
void check_amaxes(const GemmSpec& s, const GemmCall& c, const char* a_what, const char* b_what) {
  if (traits(s.scaling).per_tensor_amax) {
    const int64_t bytes = int64_t(c.num_groups) * 4;
    if (!buffer_fits(c.a_amax, bytes, 4))
      check_buffer("a_amax", c.a_amax, bytes, 4, "fp32 [num_groups] (nvfp4: " + std::string(a_what) + ")");
    if (!buffer_fits(c.b_amax, bytes, 4))
      check_buffer("b_amax", c.b_amax, bytes, 4, "fp32 [num_groups] (nvfp4: " + std::string(b_what) + ")");
  } else if (c.a_amax.ptr || c.b_amax.ptr) {
    throw UserError(c.a_amax.ptr ? "a_amax" : "b_amax", "only nvfp4 scaling takes per-tensor amax; " +
                                                            std::string(traits(s.scaling).name) + " scaling has none");
  }
}

// How the operands' K-major rows go through TMA (as bytes): fp8 / int8 rows stage 128 bytes (128
// K) per stage with the 128-byte swizzle, bf16 / fp16 rows likewise (64 K); packed e2m1 (two per
// byte) 64 bytes, A unswizzled (the consumers read it into registers) and B with the 64-byte
// swizzle (its converters read it conflict-free); weight-only int8 B (channel) 64 bytes (the
// stage's 64 K) unswizzled, converted into the 128-byte swizzle on chip.
struct OperandRows {
  const GemmSpec& spec;
  cuuint32_t a_box, b_box;  // bytes of a row per stage
  CUtensorMapSwizzle a_swizzle, b_swizzle;
  const char* packed;  // for messages
  int64_t a_bytes(int64_t k) const { return gemm_row_bytes(spec, spec.a_format, k); }
  int64_t b_bytes(int64_t k) const { return gemm_row_bytes(spec, spec.b_format, k); }
};
OperandRows operand_rows(const GemmSpec& s) {
  if (traits(s.a_format).elems_per_byte == 2)
    return {s, kGemmBlockK / 2, kGemmBlockK / 2, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_SWIZZLE_64B, " packed two per byte"};
  if (traits(s.scaling).b_on_chip)  // weight-only int8: B's 64 K per stage as loaded, for the converters
    return {s, kGemmBlockK, kGemmBlockK / 2, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_SWIZZLE_NONE, ""};
  return {s, kGemmBlockK, kGemmBlockK, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_SWIZZLE_128B, ""};
}

// The scale buffer of an unscaled operand (gemm_a_scaled, gemm_b_scaled) must be absent.
void check_no_scale(const GemmSpec& s, const char* arg, const TensorView& v, ElemFormat f) {
  if (v.ptr)
    throw UserError(arg, std::string(gemm_format_name(s, f)) + " operands (" + std::string(traits(s.scaling).name) +
                             " scaling) take no scales");
}

// A per-device memo (Gemm's loaded kernels): the current device's entry, made by make(dev) on its
// first use, outside the lock (a compile may take seconds); of two racing makers the first stored wins.
template <class T, class Make>
std::shared_ptr<const T> per_device(std::mutex& mu, std::map<int, std::shared_ptr<const T>>& memo, Make make) {
  const int dev = current_device();
  {
    std::lock_guard<std::mutex> g(mu);
    if (auto it = memo.find(dev); it != memo.end()) return it->second;
  }
  std::shared_ptr<const T> made = make(dev);
  std::lock_guard<std::mutex> g(mu);
  return memo.emplace(dev, std::move(made)).first->second;
}

}  // namespace

GemmKernel build_gemm_kernel(const GemmSpec& spec, const std::string& arch, KernelCache& cache) {
  // The members kernel rewrites tensor-map strides on the device with tensormap.replace, whose
  // stride operand is in bytes since CUDA 12.5 (16-byte units before); an older NVRTC would build
  // a kernel that loads with 16x the stride.
  if (spec.layout == GemmLayout::KGroupedMembers && !nvrtc_at_least(12, 5))
    throw UserError("layout", "k_grouped_members needs NVRTC 12.5 or newer (device-side tensor-map strides in "
                              "bytes), found " + nvrtc_version());
  GemmKernel k;
  k.source = emit_gemm(spec);
  nlohmann::json meta = {{"kind", "gemm"}, {"gemm", describe(spec)}};
  const CompileRequest req{k.source.source, "qforge_gemm.cu", {k.source.kernel}, arch};
  k.cached = cache.get_or_compile(req, meta);
  return k;
}

DequantKernels build_dequant_kernels(const GemmSpec& spec, const std::string& arch, KernelCache& cache) {
  DequantKernels k;
  k.source = emit_dequant(spec);
  const CompileRequest req{k.source.source, "qforge_dequant.cu", {k.source.a_kernel, k.source.b_kernel, k.source.prep_kernel},
                           arch};
  k.cached = cache.get_or_compile(req, nlohmann::json{{"kind", "gemm_dequant"}, {"gemm", describe(spec)}});
  return k;
}

struct Gemm::LoadedDequant {
  DequantKernels kernels;
  std::shared_ptr<const Module> module;
  CUfunction a = nullptr, b = nullptr, prep = nullptr;
  int sms = 0;
};

struct Gemm::Loaded {
  GemmKernel kernel;
  std::shared_ptr<const Module> module;
  CUfunction fn = nullptr;
  int grid = 0;  // persistent CTAs (a multiple of the multicast width)
};

Gemm::Gemm(GemmSpec spec, KernelCache& cache) : spec_(std::move(spec)), cache_(cache) {
  validate(spec_);
  settle_gemm_route(spec_);
  spec_.tile = resolve_tile(spec_);
  if (spec_.route == GemmRoute::Dequant) inner_ = std::make_unique<Gemm>(dequant_inner_spec(spec_), cache_);
  if (spec_.route == GemmRoute::Auto)
    for (GemmRoute r : {GemmRoute::Fused, GemmRoute::Dequant})
      routes_[int(r)] = std::make_unique<Gemm>(gemm_route_spec(spec_, r), cache_);
}

CacheHow Gemm::prepare(const std::string& arch) const {
  if (arch != "sm_90a") throw UserError("arch", "the GEMM kernels are wgmma code for sm_90a, got \"" + arch + "\"");
  // Every kernel a run may launch (as prewarm compiles them); the slowest answer (MemoryHit <
  // DiskHit < Compiled).
  const GemmKernelSpecs kernels = gemm_kernel_specs(spec_);
  CacheHow how = CacheHow::MemoryHit;
  for (const GemmSpec& k : kernels.dequant) how = std::max(how, build_dequant_kernels(k, arch, cache_).cached.how);
  for (const GemmSpec& k : kernels.gemm) how = std::max(how, build_gemm_kernel(k, arch, cache_).cached.how);
  return how;
}

int Gemm::persistent_ctas() const {
  if (routes_[0]) return std::max(routes_[0]->persistent_ctas(), routes_[1]->persistent_ctas());
  return inner_ ? inner_->persistent_ctas() : load_for_current_device()->grid;
}

void check_gemm_call_size(const GemmSpec& s, int64_t extent, int64_t num_groups, const std::string& extent_arg) {
  const bool kg = k_grouped(s.layout);
  if (extent < 0 || extent > (kg ? (int64_t(1) << 31) - 1 : kMaxMTotal))
    throw UserError(extent_arg, std::string("expected 0 <= ") + (kg ? "k_total < 2^31" : "m_total <= 2^31 - 257") +
                                  ", got " + std::to_string(extent));
  if (num_groups < 1 || num_groups > kMaxGroups)
    throw UserError("num_groups", "expected 1.." + std::to_string(kMaxGroups) + ", got " + std::to_string(num_groups));
  // Every operand within 2^50 elements, so that the byte counts derived from them fit int64:
  // M-grouped A [extent, K], D [extent, N], B [G, N, K]; K-grouped A [M, extent], B [N, extent],
  // D [G, M, N]. (Dimensions are at most 2^24, so n * k and m * n do not overflow.)
  const int64_t wide = kg ? std::max(s.m, s.n) : std::max(s.n, s.k), per_group = kg ? s.m * s.n : s.n * s.k;
  if (extent > 0 && wide > kMaxElems / extent)
    throw UserError(extent_arg, std::string(kg ? "k_total" : "m_total") + " " + std::to_string(extent) + " x " +
                                  std::to_string(wide) + ": an operand of more than 2^50 elements is not supported");
  if (per_group > kMaxElems / num_groups)
    throw UserError("num_groups", std::to_string(num_groups) + " groups of " + std::to_string(per_group) + " (" +
                                      (kg ? "m x n" : "n x k") +
                                      ") elements: an operand of more than 2^50 elements is not supported");
}

void Gemm::check_call_size(int64_t extent, int64_t num_groups) const { check_gemm_call_size(spec_, extent, num_groups); }

GemmRoute Gemm::route_for(int64_t extent, int num_groups) const {
  check_call_size(extent, num_groups);
  return choose_gemm_route(spec_, extent, num_groups);
}

int64_t Gemm::workspace_bytes() const {
  if (inner_ || routes_[0])
    throw UserError("workspace_bytes", std::string("the ") + (inner_ ? "dequant" : "auto") +
                                           " route's workspace holds the call's operand copies: ask with the call's "
                                           "extent and group count (workspace_bytes(extent, num_groups))");
  if (spec_.layout != GemmLayout::KGroupedMembers) return 0;
  return workspace_bytes(*load_for_current_device());
}

int64_t Gemm::workspace_bytes(int64_t extent, int num_groups) const {
  check_call_size(extent, num_groups);
  if (routes_[0]) return routes_[int(choose_gemm_route(spec_, extent, num_groups))]->workspace_bytes(extent, num_groups);
  if (!inner_) return workspace_bytes();
  if (k_grouped(spec_.layout) && extent >= (int64_t(1) << 30))
    throw UserError("extent", "expected 0 <= k_total < 2^30 (the 16-bit copies' rows), got " + std::to_string(extent));
  return dequant_workspace(spec_, extent, num_groups, inner_workspace_bytes()).total;
}

int64_t Gemm::inner_workspace_bytes() const {
  return spec_.layout == GemmLayout::KGroupedMembers ? inner_->workspace_bytes() : 0;
}

std::shared_ptr<const Gemm::LoadedDequant> Gemm::load_dequant_for_current_device() const {
  return per_device(mu_, loaded_dequant_, [&](int dev) {
    auto l = std::make_shared<LoadedDequant>();
    l->kernels = build_dequant_kernels(spec_, device_arch(dev), cache_);
    const auto& entry = *l->kernels.cached.entry;
    l->module = module_registry().get(dev, entry.key, std::string_view(entry.image));
    l->a = l->module->function(entry.lowered(l->kernels.source.a_kernel));
    l->b = l->module->function(entry.lowered(l->kernels.source.b_kernel));
    l->prep = l->module->function(entry.lowered(l->kernels.source.prep_kernel));
    l->sms = device_sm_count(dev);
    return std::shared_ptr<const LoadedDequant>(std::move(l));
  });
}

// The dequant route: the prep kernel (the per-group alpha of NVFP4 and of members, the grid prefix
// and group starts of M-grouped mn_major A and of members), each operand into its 16-bit copy,
// then the none GEMM on the copies with the caller's D and groups, the workspace's alpha where the
// prep kernel wrote one (else the caller's) and, for members, its tensor maps in the workspace.
// The call was checked as the fused kernel takes it.
void Gemm::run_dequant(const GemmCall& c, CUstream stream) const {
  const GemmSpec& s = spec_;
  const bool kg = k_grouped(s.layout);
  const bool mn = s.scale_layout == ScaleLayout::MnMajor, masked = c.m_max != 0;
  const int64_t g = c.num_groups, extent = kg ? c.k_total : c.m_total;
  const bool members = s.layout == GemmLayout::KGroupedMembers;
  const DequantWorkspace w = dequant_workspace(s, extent, g, inner_workspace_bytes());
  if (!buffer_fits(c.workspace, w.total, 256))  // the text only on failure (this runs on every call)
    check_buffer("workspace", c.workspace, w.total, 256,
                 "dequant route: workspace_bytes(" + std::to_string(extent) + ", " + std::to_string(g) + ") = " +
                     std::to_string(w.total) + " bytes (the operands' 16-bit copies" +
                     (members ? ", the members GEMM's tensor maps)" : ")"));
  const std::pair<const char*, const TensorView*> others[] = {
      {"d", &c.d},         {"a", &c.a},         {"b", &c.b},           {"a_scale", &c.a_scale},
      {"b_scale", &c.b_scale}, {"alpha", &c.alpha}, {"a_amax", &c.a_amax}, {"b_amax", &c.b_amax},
      {"group_offsets", &c.group_offsets}, {"group_counts", &c.group_counts}};
  for (const auto& [name, v] : others) check_disjoint("workspace", c.workspace, name, *v);
  const int dev = current_device();
  if (!c.pointers_checked) {
    check_device_pointer("workspace", c.workspace.ptr, dev);
    for (const auto& [name, v] : others) check_device_pointer(name, v->ptr, dev);
  }
  if (!kg && c.m_total == 0) return;
  // The none GEMM's own limits, before anything is launched: a K-grouped row of the 16-bit copy
  // (2 bytes a token) must stay under 2^31 bytes.
  if (kg && 2 * c.k_total >= (int64_t(1) << 31))
    throw UserError("k_total", "dequant route: the 16-bit copies' rows of " + std::to_string(c.k_total) +
                                   " tokens pass 2^31 bytes; expected fewer than 2^30 tokens");
  auto l = load_dequant_for_current_device();
  u8* ws = reinterpret_cast<u8*>(c.workspace.ptr);

  DequantArgs prep{};
  prep.num_groups = int(g);
  if (w.alpha >= 0) {
    prep.alpha = reinterpret_cast<const float*>(c.alpha.ptr);
    prep.a_amax = reinterpret_cast<const float*>(c.a_amax.ptr);
    prep.b_amax = reinterpret_cast<const float*>(c.b_amax.ptr);
    prep.alpha_out = reinterpret_cast<float*>(ws + w.alpha);
  }
  const bool grouped_grid = w.prefix >= 0 && !masked;  // M-grouped contiguous mn_major A, or members
  if (grouped_grid) {
    prep.offsets = reinterpret_cast<const i64*>(c.group_offsets.ptr);
    prep.prefix = reinterpret_cast<i64*>(ws + w.prefix);
    prep.starts = reinterpret_cast<i64*>(ws + w.starts);
    if (members) {  // the token offsets are clamped to k_total; token blocks per row
      prep.grid = mn ? kGridMembersMnMajor : kGridMembers;
      prep.k = c.k_total;
      prep.rows = s.m;  // A's (NVFP4's odd-grid rule)
      const int64_t b = traits(s.scaling).scale_k;
      prep.cap = (c.k_total + b - 1) / b + g;
    } else {
      prep.grid = kGridGroups;
      prep.rows = c.m_total;  // the offsets are clamped to A's rows
      prep.cap = mn_major_grouped_rows(c.m_total, g);
    }
  }
  if (prep.alpha_out || prep.prefix) {
    void* params[] = {&prep};
    launch(l->prep, Dim3{1}, Dim3{1024}, 0, stream, params);
  }
  auto operand = [&](CUfunction f, const TensorView& data, const TensorView& scale, int64_t out_off, int64_t rows,
                     int64_t k, bool is_a) {
    DequantArgs a{};
    a.data = reinterpret_cast<const u8*>(data.ptr);
    a.scale = reinterpret_cast<const u8*>(scale.ptr);
    a.out = reinterpret_cast<u16*>(ws + out_off);
    a.rows = rows;
    a.k = k;
    a.grid = kGridCompact;
    if (grouped_grid && (members || is_a)) {  // grids per group (M-grouped A) or per member (both operands)
      a.grid = prep.grid;
      a.num_groups = int(g);
      a.offsets = prep.offsets;
      a.prefix = prep.prefix;
      a.starts = prep.starts;
      a.cap = prep.cap;
    } else if (mn) {  // one mn_major grid per tensor, expert or masked slot (MXFP8 only, validate)
      a.grid = kGridMnMajor;
      a.grid_rows = kg ? rows : !is_a ? s.n : c.m_max;
    }
    const int64_t threads = dequant_threads(rows, k, gemm_dequant_packed(is_a ? s.a_format : s.b_format), a.grid != kGridCompact);
    if (threads == 0) return;
    int64_t ctas = std::min<int64_t>((threads + l->kernels.source.threads - 1) / l->kernels.source.threads, int64_t(l->sms) * 16);
    if (c.max_ctas > 0) ctas = std::min<int64_t>(ctas, c.max_ctas);  // SMs left to other streams, as the GEMM's
    void* params[] = {&a};
    launch(f, Dim3{unsigned(ctas)}, Dim3{unsigned(l->kernels.source.threads)}, 0, stream, params);
  };
  const int64_t rows_a = kg ? s.m : c.m_total, rows_b = kg ? s.n : g * s.n, k = kg ? c.k_total : s.k;
  operand(l->a, c.a, c.a_scale, w.a, rows_a, k, true);
  operand(l->b, c.b, c.b_scale, w.b, rows_b, k, false);

  const DType dt = inner_->spec().operand_dtype;
  GemmCall in = c;
  in.a = TensorView{c.workspace.ptr + uint64_t(w.a), rows_a * k * 2, dt, {}};
  in.b = TensorView{c.workspace.ptr + uint64_t(w.b), rows_b * k * 2, dt, {}};
  in.a_scale = in.b_scale = in.a_amax = in.b_amax = TensorView{};
  if (w.alpha >= 0) in.alpha = TensorView{c.workspace.ptr + uint64_t(w.alpha), g * 4, DType::FP32, {}};  // the prep kernel's
  in.workspace = w.inner >= 0 ? TensorView{c.workspace.ptr + uint64_t(w.inner), w.total - w.inner, std::nullopt, {}}
                              : TensorView{};  // members: the none GEMM's tensor maps
  inner_->run(in, stream);
}

int64_t Gemm::workspace_bytes(const Loaded& l) const {
  if (spec_.layout != GemmLayout::KGroupedMembers) return 0;
  return int64_t(l.grid) * gemm_member_map_count(spec_) * 2 * int64_t(sizeof(TmaDescriptor));
}

std::shared_ptr<const Gemm::Loaded> Gemm::load_for_current_device() const {
  return per_device(mu_, loaded_, [&](int dev) {
    auto l = std::make_shared<Loaded>();
    l->kernel = build_gemm_kernel(spec_, device_arch(dev), cache_);
    const auto& entry = *l->kernel.cached.entry;
    l->module = module_registry().get(dev, entry.key, std::string_view(entry.image));
    l->fn = l->module->function(entry.lowered(l->kernel.source.kernel));
    const Driver& d = require_driver();
    const GemmSource& src = l->kernel.source;
    allow_dynamic_smem(l->fn, src.smem_bytes);
    const int sms = device_sm_count(dev);
    if (src.tile.multicast == 1) {
      l->grid = sms;
    } else {
      // Clusters of two need two free SMs of one GPC: ask the driver how many fit at once.
      CUlaunchAttribute attr{};
      attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attr.value.clusterDim.x = unsigned(src.tile.multicast);
      attr.value.clusterDim.y = 1;
      attr.value.clusterDim.z = 1;
      CUlaunchConfig cfg{};
      cfg.gridDimX = unsigned(sms - sms % src.tile.multicast);
      cfg.gridDimY = cfg.gridDimZ = 1;
      cfg.blockDimX = unsigned(src.threads);
      cfg.blockDimY = cfg.blockDimZ = 1;
      cfg.sharedMemBytes = src.smem_bytes;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      check(d.cuOccupancyMaxActiveClusters(&clusters, l->fn, &cfg), "cuOccupancyMaxActiveClusters for the GEMM kernel");
      if (clusters < 1) throw CudaError(CUDA_ERROR_INVALID_CLUSTER_SIZE, "the GEMM kernel's clusters do not fit on this device");
      l->grid = clusters * src.tile.multicast;
    }
    return std::shared_ptr<const Loaded>(std::move(l));
  });
}

void Gemm::run(const GemmCall& c, CUstream stream) const {
  if (routes_[0]) {  // the chosen route's run checks the call; a missing workspace is named here
    const int64_t extent = k_grouped(spec_.layout) ? c.k_total : c.m_total;
    check_gemm_call_size(spec_, extent, c.num_groups, k_grouped(spec_.layout) ? "k_total" : "m_total");
    const GemmRoute r = choose_gemm_route(spec_, extent, c.num_groups);
    const int64_t need = r == GemmRoute::Dequant ? routes_[1]->workspace_bytes(extent, c.num_groups) : 0;
    if (c.workspace.bytes < need)
      throw UserError("workspace", "route auto takes the dequant route for " +
                                       std::string(k_grouped(spec_.layout) ? "k_total " : "m_total ") + std::to_string(extent) +
                                       " over " + std::to_string(c.num_groups) +
                                       " groups (route_for): expected workspace_bytes(extent, num_groups) = " +
                                       std::to_string(need) + " bytes, got " + std::to_string(c.workspace.bytes) +
                                       " (size it for the largest call: it grows with the extent)");
    return routes_[int(r)]->run(c, stream);
  }
  if (k_grouped(spec_.layout)) return run_k_grouped(c, stream);
  const GemmSpec& s = spec_;
  const GemmTile& t = s.tile;
  // num_groups, and m_total within 2^31 - 257 (tile rows are 32-bit in the kernel: the last tile's
  // rows, m_total + block_m, stay below 2^31), every operand's bytes within int64.
  check_gemm_call_size(s, c.m_total, c.num_groups, "m_total");
  if (c.k_total != 0)
    throw UserError("k_total", "m-grouped: K is the spec's k; k_total is the token count of the k-grouped layout: "
                               "expected 0, got " + std::to_string(c.k_total));
  const int64_t g = c.num_groups, m = c.m_total;
  const bool masked = c.m_max != 0;
  if (masked) {
    if (c.m_max < 0) throw UserError("m_max", "expected > 0 (masked layout) or 0 (contiguous), got " + std::to_string(c.m_max));
    if (c.m_max > m / g || g * c.m_max != m)
      throw UserError("m_total", "masked layout: expected num_groups * m_max = " + std::to_string(g) + " * " +
                                     std::to_string(c.m_max) + ", got " + std::to_string(m));
    if (c.group_offsets.ptr) throw UserError("group_offsets", "masked layout (m_max > 0) takes group_counts, not group_offsets");
    check_buffer("group_counts", c.group_counts, g * 8, 8, "int64 [num_groups]");
  } else {
    if (c.group_counts.ptr) throw UserError("group_counts", "contiguous layout takes group_offsets; set m_max for the masked layout");
    check_buffer("group_offsets", c.group_offsets, (g + 1) * 8, 8, "int64 [num_groups + 1]");
  }
  const int64_t n_units = (s.n + t.block_n - 1) / t.block_n / t.multicast;
  const int64_t units = ((m + t.block_m - 1) / t.block_m + g) * n_units;  // upper bound over any split
  if (units >= (int64_t(1) << 31))
    throw UserError("m_total, num_groups", "too many tiles for one launch (" + std::to_string(units) + ")");
  // mn_major A grids: the kernel's row prefix of the groups' grids is a 30-bit int.
  if (s.scale_layout == ScaleLayout::MnMajor && mn_major_grouped_rows(m, g) > (int64_t(1) << 30))
    throw UserError("m_total", "mn_major A scale grids: expected m_total + 3 * num_groups <= 2^30, got " +
                                   std::to_string(mn_major_grouped_rows(m, g)));
  const int ob = traits(s.out_dtype).bytes;
  const OperandRows rows = operand_rows(s);
  const int64_t ka = rows.a_bytes(s.k), kb = rows.b_bytes(s.k);  // bytes per row of A and of B
  // The texts of the messages are built only when a check fails (this runs on every call).
  const auto fits = [](const char* arg, const TensorView& v, int64_t bytes, size_t align, const auto& what) {
    if (!buffer_fits(v, bytes, align)) check_buffer(arg, v, bytes, align, what());
  };
  const std::string_view packed = rows.packed;
  fits("a", c.a, m * ka, 16, [&] {
    return "A [" + std::to_string(m) + ", " + std::to_string(s.k) + "] " + std::string(gemm_format_name(s, s.a_format)) +
           std::string(packed);
  });
  fits("b", c.b, g * s.n * kb, 16, [&] {
    return "B [" + std::to_string(g) + ", " + std::to_string(s.n) + ", " + std::to_string(s.k) + "] " +
           std::string(gemm_format_name(s, s.b_format)) + std::string(packed);
  });
  fits("d", c.d, m * s.n * ob, 16, [&] {
    return "D [" + std::to_string(m) + ", " + std::to_string(s.n) + "] " + std::string(traits(s.out_dtype).name);
  });
  if (c.d.dtype && *c.d.dtype != s.out_dtype) check_dtype("d", c.d, s.out_dtype);
  const GemmScaleElems se = gemm_scale_elems(s, m, c.num_groups);
  const GemmScalingTraits& st = traits(s.scaling);
  const int align = std::max(st.scale_bytes, st.scale_align);  // the scaling table's rule
  // mn_major A grids: per group (the grouped quantizer's members), each padded to 4 rows; MXFP8 B
  // grids per expert.
  const bool mn = s.scale_layout == ScaleLayout::MnMajor;
  const auto scales = [&](bool a) {
    const std::string steps = "ceil(K/" + std::to_string(st.scale_k) + ")";
    const std::string shape = a ? (mn ? "[" + steps + ", m_total + 3 * num_groups] (mn_major: each group's grid [" + steps +
                                           ", rows rounded up to 4] after those of the groups before)"
                                      : std::string(st.a_scale_shape))
                                : (mn && st.mn_major_b ? "[G, " + steps + ", N] (mn_major: each expert's grid)"
                                                       : std::string(st.b_scale_shape));
    return std::string(st.scale_type) + " " + std::string(st.name) + " scales " + shape;
  };
  if (gemm_a_scaled(s)) fits("a_scale", c.a_scale, se.a * st.scale_bytes, align, [&] { return scales(true); });
  else check_no_scale(s, "a_scale", c.a_scale, s.a_format);
  if (gemm_b_scaled(s)) fits("b_scale", c.b_scale, se.b * st.scale_bytes, align, [&] { return scales(false); });
  else check_no_scale(s, "b_scale", c.b_scale, s.b_format);
  check_amaxes(s, c, "per-tensor amax of each group's A", "amax of each B[g]");
  if (c.alpha.ptr) check_buffer("alpha", c.alpha, g * 4, 4, "fp32 [num_groups]");
  if (c.max_ctas < 0) throw UserError("max_ctas", "expected >= 0, got " + std::to_string(c.max_ctas));
  const std::pair<const char*, const TensorView*> inputs[] = {
      {"a", &c.a},         {"b", &c.b}, {"a_scale", &c.a_scale}, {"b_scale", &c.b_scale},
      {"alpha", &c.alpha}, masked ? std::pair{"group_counts", &c.group_counts} : std::pair{"group_offsets", &c.group_offsets},
      {"a_amax", &c.a_amax}, {"b_amax", &c.b_amax}};
  for (const auto& [name, v] : inputs) check_disjoint("d", c.d, name, *v);
  if (inner_) return run_dequant(c, stream);
  if (m == 0) return;  // no rows: nothing to read or write

  const int dev = current_device();
  if (!c.pointers_checked) {
    check_device_pointer("d", c.d.ptr, dev);
    for (const auto& [name, v] : inputs) check_device_pointer(name, v->ptr, dev);
  }

  auto l = load_for_current_device();
  GemmArgs args{};
  // A's box rows: each CTA of a multicast cluster loads its share (nvfp4: no multicast).
  args.a_map = encode_map("a", CU_TENSOR_MAP_DATA_TYPE_UINT8, c.a.ptr, {cuuint64_t(ka), cuuint64_t(m)}, {cuuint64_t(ka)},
                          {rows.a_box, cuuint32_t(t.block_m / t.multicast)}, rows.a_swizzle);
  args.b_map = encode_map("b", CU_TENSOR_MAP_DATA_TYPE_UINT8, c.b.ptr, {cuuint64_t(kb), cuuint64_t(s.n), cuuint64_t(g)},
                          {cuuint64_t(kb), cuuint64_t(s.n * kb)}, {rows.b_box, cuuint32_t(t.block_n), 1u}, rows.b_swizzle);
  args.a_amax = reinterpret_cast<const float*>(c.a_amax.ptr);  // null unless nvfp4 (checked above)
  args.b_amax = reinterpret_cast<const float*>(c.b_amax.ptr);
  args.d = reinterpret_cast<void*>(c.d.ptr);
  args.a_scale = reinterpret_cast<const void*>(c.a_scale.ptr);
  args.b_scale = reinterpret_cast<const void*>(c.b_scale.ptr);
  args.alpha = reinterpret_cast<const float*>(c.alpha.ptr);
  args.group_offsets = reinterpret_cast<const i64*>(c.group_offsets.ptr);
  args.group_counts = reinterpret_cast<const i64*>(c.group_counts.ptr);
  args.m_max = c.m_max;
  args.m_total = m;
  args.num_groups = c.num_groups;

  launch_persistent(*l, args, units, c.max_ctas, stream);
}

void Gemm::launch_persistent(const Loaded& l, GemmArgs& args, int64_t units, int max_ctas, CUstream stream) const {
  const GemmTile& t = spec_.tile;
  int64_t clusters = std::min<int64_t>(units, l.grid / t.multicast);
  if (max_ctas > 0) clusters = std::min<int64_t>(clusters, max_ctas / t.multicast);
  const int64_t want = std::max<int64_t>(1, clusters) * t.multicast;
  void* params[] = {&args};
  CUlaunchAttribute attr{};
  std::span<CUlaunchAttribute> attrs;
  if (t.multicast > 1) {
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = unsigned(t.multicast);
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    attrs = std::span<CUlaunchAttribute>(&attr, 1);
  }
  launch(l.fn, Dim3{unsigned(want)}, Dim3{unsigned(l.kernel.source.threads)}, l.kernel.source.smem_bytes, stream,
         params, attrs, SmemLimit::kPrepared);
}

// K-grouped (wgrad): D[g] [m, N] (+)= alpha[g] * dequant(A[:, ks]) * dequant(B[:, ks])^T over the
// token range ks = [offsets[g], offsets[g+1]) of A [m, k_total] and B [N, k_total]: per-group
// tensor scales, per-channel scales of A's and B's rows, blockwise / MX scales per row along the tokens, or NVFP4 (packed e2m1, e4m3 per 16
// tokens per row, the copies' amax per group) (gemm_scale_elems). Members: the same bytes hold the
// members' own matrices [m, M_g] and [N, M_g] back to back; the kernel rewrites the tensor maps
// encoded here (templates) per member in the workspace.
void Gemm::run_k_grouped(const GemmCall& c, CUstream stream) const {
  const GemmSpec& s = spec_;
  const GemmTile& t = s.tile;
  const OperandRows rows = operand_rows(s);
  const int64_t k_multiple = gemm_k_total_multiple(s);
  if (c.k_total < k_multiple || c.k_total >= (int64_t(1) << 31) || c.k_total % k_multiple != 0)
    throw UserError("k_total", "k-grouped: expected the token dimension as a multiple of " + std::to_string(k_multiple) +
                                   " in [" + std::to_string(k_multiple) + ", 2^31) (16-byte TMA row strides" +
                                   (traits(s.a_format).elems_per_byte == 2 ? " of packed e2m1" : "") + "; pad it), got " +
                                   std::to_string(c.k_total));
  // The kernel's TMA coordinates along a row are 32-bit bytes (bf16 / fp16: two per token).
  if (rows.a_bytes(c.k_total) >= (int64_t(1) << 31))
    throw UserError("k_total", "k-grouped: a row of " + std::to_string(c.k_total) + " " +
                                   std::string(gemm_format_name(s, s.a_format)) + " tokens is " +
                                   std::to_string(rows.a_bytes(c.k_total)) + " bytes; expected fewer than 2^31");
  if (c.m_total != 0 || c.m_max != 0 || c.group_counts.ptr)
    throw UserError(c.m_total != 0 ? "m_total" : c.m_max != 0 ? "m_max" : "group_counts",
                    "k-grouped: rows are the spec's m and groups split K by group_offsets; expected 0 / none");
  check_gemm_call_size(s, c.k_total, c.num_groups, "k_total");  // num_groups; every operand's bytes fit int64
  const int64_t g = c.num_groups, kt = c.k_total;
  const int64_t units = g * ((s.m + t.block_m - 1) / t.block_m) * ((s.n + t.block_n - 1) / t.block_n);
  if (g * s.m >= (int64_t(1) << 31) || units >= (int64_t(1) << 31))
    throw UserError("num_groups", "too many output rows or tiles for one launch (" + std::to_string(g) + " x " +
                                      std::to_string(s.m) + " rows)");
  const int ob = traits(s.out_dtype).bytes;
  const int64_t row_bytes = rows.a_bytes(kt);  // (K-grouped: A's and B's formats agree)
  // The texts of the messages are built only when a check fails (this runs on every call).
  const auto fits = [](const char* arg, const TensorView& v, int64_t bytes, size_t align, const auto& what) {
    if (!buffer_fits(v, bytes, align)) check_buffer(arg, v, bytes, align, what());
  };
  const std::string_view packed = rows.packed;
  fits("a", c.a, s.m * row_bytes, 16, [&] {
    return "A [" + std::to_string(s.m) + ", " + std::to_string(kt) + "] " + std::string(gemm_format_name(s, s.a_format)) +
           std::string(packed);
  });
  fits("b", c.b, s.n * row_bytes, 16, [&] {
    return "B [" + std::to_string(s.n) + ", " + std::to_string(kt) + "] " + std::string(gemm_format_name(s, s.b_format)) +
           std::string(packed);
  });
  fits("d", c.d, g * s.m * s.n * ob, 16, [&] {
    return "D [" + std::to_string(g) + ", " + std::to_string(s.m) + ", " + std::to_string(s.n) + "] " +
           std::string(traits(s.out_dtype).name);
  });
  if (c.d.dtype && *c.d.dtype != s.out_dtype) check_dtype("d", c.d, s.out_dtype);
  const GemmScalingTraits& st = traits(s.scaling);
  const GemmScaleElems se = gemm_scale_elems(s, 0, g, kt);
  if (!gemm_a_scaled(s) || !gemm_b_scaled(s)) {  // none (channel scaling is M-grouped only)
    check_no_scale(s, "a_scale", c.a_scale, s.a_format);
    check_no_scale(s, "b_scale", c.b_scale, s.b_format);
  } else if (st.scale_k == 0) {  // scales constant along the tokens: per group, or per channel of A's and B's rows
    const bool channel = s.scaling == GemmScaling::RowChannel;
    auto shape = [&](const char* op, int64_t rows) {
      const std::string g_dim = s.layout == GemmLayout::KGroupedMembers ? std::to_string(g) + ", " : "";
      return channel ? std::string("fp32 per-channel scales of ") + op + "'s rows [" + g_dim + std::to_string(rows) + "]"
                     : std::string("fp32 per-group scales [G]");
    };
    fits("a_scale", c.a_scale, se.a * 4, 4, [&] { return shape("A", s.m); });
    fits("b_scale", c.b_scale, se.b * 4, 4, [&] { return shape("B", s.n); });
  } else {
    const bool mn_major = s.scale_layout == ScaleLayout::MnMajor;
    const int64_t cols = se.a / mn_major_rows(s, s.m);
    const auto what = [&] { return std::string(st.scale_type) + " " + std::string(st.name) + " scales per row along the tokens "; };
    // e8m0 rows are read four bytes at a time where they allow it (compact: the kernel checks the
    // offsets from the base; mn_major: always, words of 4 rows), so the base must be aligned as for
    // the M-grouped layouts: the table's rule; blockwise mn_major grids are copied by the tensor
    // engine (16 bytes).
    const int align = std::max({st.scale_bytes, st.scale_align, mn_major ? st.k_grouped_mn_major_align : 0});
    auto grid = [&](int64_t rows) {
      return mn_major ? "[" + std::to_string(cols) + ", " + std::to_string(mn_major_rows(s, rows)) + "] (mn_major)"
                      : "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
    };
    fits("a_scale", c.a_scale, se.a * st.scale_bytes, align, [&] { return what() + grid(s.m); });
    fits("b_scale", c.b_scale, se.b * st.scale_bytes, align, [&] { return what() + grid(s.n); });
  }
  check_amaxes(s, c, "the amax of the A copy each group's tokens come from", "the amax of the B copy each group's tokens come from");
  if (c.alpha.ptr) check_buffer("alpha", c.alpha, g * 4, 4, "fp32 [num_groups]");
  if (c.max_ctas < 0) throw UserError("max_ctas", "expected >= 0, got " + std::to_string(c.max_ctas));
  check_buffer("group_offsets", c.group_offsets, (g + 1) * 8, 8, "int64 [num_groups + 1] token offsets");
  const std::pair<const char*, const TensorView*> inputs[] = {
      {"a", &c.a},         {"b", &c.b}, {"a_scale", &c.a_scale}, {"b_scale", &c.b_scale},
      {"alpha", &c.alpha}, {"group_offsets", &c.group_offsets}, {"a_amax", &c.a_amax}, {"b_amax", &c.b_amax}};
  for (const auto& [name, v] : inputs) check_disjoint("d", c.d, name, *v);
  if (inner_) return run_dequant(c, stream);
  const int dev = current_device();
  if (!c.pointers_checked) {
    check_device_pointer("d", c.d.ptr, dev);
    for (const auto& [name, v] : inputs) check_device_pointer(name, v->ptr, dev);
  }
  auto l = load_for_current_device();
  const bool members = s.layout == GemmLayout::KGroupedMembers;
  if (members) {
    const int64_t ws = workspace_bytes(*l);
    fits("workspace", c.workspace, ws, 128,
         [&] { return "workspace_bytes() = " + std::to_string(ws) + " bytes (the members' tensor maps)"; });
    check_disjoint("workspace", c.workspace, "d", c.d);
    for (const auto& [name, v] : inputs) check_disjoint("workspace", c.workspace, name, *v);
    if (!c.pointers_checked) check_device_pointer("workspace", c.workspace.ptr, dev);
  }

  GemmArgs args{};
  if (members) {
    args.member_maps = reinterpret_cast<TmaDescriptor*>(c.workspace.ptr);
    args.a_data = reinterpret_cast<const u8*>(c.a.ptr);
    args.b_data = reinterpret_cast<const u8*>(c.b.ptr);
  }
  const cuuint64_t rb = cuuint64_t(row_bytes);
  args.a_map = encode_map("a", CU_TENSOR_MAP_DATA_TYPE_UINT8, c.a.ptr, {rb, cuuint64_t(s.m)}, {rb},
                          {rows.a_box, cuuint32_t(t.block_m)}, rows.a_swizzle);
  args.b_map = encode_map("b", CU_TENSOR_MAP_DATA_TYPE_UINT8, c.b.ptr, {rb, cuuint64_t(s.n)}, {rb},
                          {rows.b_box, cuuint32_t(t.block_n)}, rows.b_swizzle);
  args.a_amax = reinterpret_cast<const float*>(c.a_amax.ptr);  // null unless nvfp4 (checked above)
  args.b_amax = reinterpret_cast<const float*>(c.b_amax.ptr);
  // D [G][m][N] for the epilogue's tensor stores: boxes of 64 rows x 128 bytes (gemm_epilogue.cuh, epilogue_tma).
  const cuuint64_t d_row = cuuint64_t(s.n * ob);
  args.d_map = encode_map("d", s.out_dtype == DType::FP32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                          c.d.ptr, {cuuint64_t(s.n), cuuint64_t(s.m), cuuint64_t(g)}, {d_row, d_row * cuuint64_t(s.m)},
                          {cuuint32_t(kGemmEpiBoxBytes / ob), 64u, 1u}, CU_TENSOR_MAP_SWIZZLE_128B);
  args.d = reinterpret_cast<void*>(c.d.ptr);
  args.a_scale = reinterpret_cast<const void*>(c.a_scale.ptr);
  args.b_scale = reinterpret_cast<const void*>(c.b_scale.ptr);
  args.alpha = reinterpret_cast<const float*>(c.alpha.ptr);
  args.group_offsets = reinterpret_cast<const i64*>(c.group_offsets.ptr);
  args.k_total = kt;
  args.num_groups = c.num_groups;
  launch_persistent(*l, args, units, c.max_ctas, stream);
}

}  // namespace qf::rt
