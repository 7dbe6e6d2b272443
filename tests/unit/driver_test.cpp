// Tests of runtime/driver.h (driver loading, RAII wrappers, module registry, launches) and
// runtime/tensor.h (argument checks before a launch).
//
// Off-GPU (CI): the driver must be reported unavailable, not crash, and every use must throw a
// CudaError that says why; argument checks name the argument. On a GPU: memory round trips,
// and a kernel compiled here with NVRTC, loaded from CUBIN (and PTX) and launched through
// launch(), whose output is compared bit for bit against a poisoned buffer.
#include <gtest/gtest.h>

#include "error_of.h"
#include <nvrtc.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "compiler/error.h"
#include "runtime/driver.h"
#include "runtime/gpu_test_util.h"
#include "runtime/tensor.h"

namespace qf::rt {
namespace {

// Substring assertions (plain GoogleTest: the unit binary does not link gmock).
::testing::AssertionResult ContainsFmt(const char* s_expr, const char* sub_expr,
                                       const std::string& s, const std::string& sub) {
  if (s.find(sub) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s_expr << " = \"" << s << "\"\n  does not contain "
                                       << sub_expr << " = \"" << sub << "\"";
}
::testing::AssertionResult StartsWithFmt(const char* s_expr, const char* prefix_expr,
                                         const std::string& s, const std::string& prefix) {
  if (s.starts_with(prefix)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s_expr << " = \"" << s << "\"\n  does not start with "
                                       << prefix_expr << " = \"" << prefix << "\"";
}
#define EXPECT_CONTAINS(s, sub) EXPECT_PRED_FORMAT2(ContainsFmt, s, sub)
#define EXPECT_STARTS_WITH(s, prefix) EXPECT_PRED_FORMAT2(StartsWithFmt, s, prefix)

// The members are typed from the versioned prototypes cuda.h's macros select.
static_assert(std::is_same_v<decltype(Driver::cuMemAlloc), decltype(&::cuMemAlloc_v2)>);
static_assert(std::is_same_v<decltype(Driver::cuEventElapsedTime),
                             decltype(&::cuEventElapsedTime_v2)>);
static_assert(std::is_same_v<decltype(Driver::cuLaunchKernelEx), decltype(&::cuLaunchKernelEx)>);

// Each entry point is looked up by the symbol cuda.h binds its name to. cuCtxGetDevice is the
// trap: cuGetProcAddress("cuCtxGetDevice", 13000) answers with the two-argument _v2.
TEST(Driver, EntryPointsUseTheSymbolsCudaHBinds) {
  std::map<std::string, std::string> symbols;
  for (const EntryPoint& e : driver_entry_points()) symbols[e.name] = e.symbol;
  EXPECT_EQ(symbols.at("cuMemAlloc"), "cuMemAlloc_v2");
  EXPECT_EQ(symbols.at("cuMemcpyHtoD"), "cuMemcpyHtoD_v2");
  EXPECT_EQ(symbols.at("cuMemsetD8Async"), "cuMemsetD8Async");
  EXPECT_EQ(symbols.at("cuEventElapsedTime"), "cuEventElapsedTime_v2");
  EXPECT_EQ(symbols.at("cuDevicePrimaryCtxRelease"), "cuDevicePrimaryCtxRelease_v2");
  EXPECT_EQ(symbols.at("cuCtxGetDevice"), "cuCtxGetDevice");
  EXPECT_EQ(symbols.at("cuLaunchKernelEx"), "cuLaunchKernelEx");
  EXPECT_EQ(symbols.size(), driver_entry_points().size());  // no name listed twice
}

using qf::testing::error_of;

// ----------------------------------------------------------------------------- no driver

TEST(DriverWithoutGpu, UnavailableIsReportedNotFatal) {
  const Driver& d = driver();
  if (d.available()) GTEST_SKIP() << "a CUDA driver is present";
  const std::string& reason = d.unavailable_reason();
  EXPECT_TRUE(reason.find("libcuda.so.1") != std::string::npos ||
              reason.find("cuInit") != std::string::npos)
      << reason;
  EXPECT_EQ(device_count(), 0);
  EXPECT_FALSE(driver_alive());
}

TEST(DriverWithoutGpu, EveryUseThrowsTheReason) {
  const Driver& d = driver();
  if (d.available()) GTEST_SKIP() << "a CUDA driver is present";
  const std::string& reason = d.unavailable_reason();
  EXPECT_THROW(require_driver(), CudaError);
  EXPECT_CONTAINS(error_of([] { require_driver(); }), reason);
  EXPECT_CONTAINS(error_of([] { DeviceBuffer b(16); }), reason);
  EXPECT_CONTAINS(error_of([] { Context c(0); }), reason);
  EXPECT_CONTAINS(error_of([] { Module m(std::string_view("\x7f" "ELF")); }), reason);
  EXPECT_CONTAINS(error_of([] { Stream s; }), reason);
  EXPECT_CONTAINS(error_of([] { device_arch(0); }), reason);
  EXPECT_CONTAINS(error_of([] { launch(nullptr, {1}, {1}, 0, nullptr, nullptr); }), reason);
  EXPECT_CONTAINS(error_of([] { module_registry().get(0, "k", std::string_view("x")); }), reason);
  // A direct call through the table reaches a stub, not a null pointer.
  CUdeviceptr p = 0;
  EXPECT_EQ(d.cuMemAlloc(&p, 16), CUDA_ERROR_STUB_LIBRARY);
  EXPECT_STARTS_WITH(error_of([&] { check(d.cuMemAlloc(&p, 16), "cuMemAlloc(16 bytes)"); }), "cuMemAlloc(16 bytes): " + reason);
}

TEST(DriverWithoutGpu, EmptyObjectsDestroyWithoutADriver) {
  DeviceBuffer empty;
  DeviceBuffer moved = std::move(empty);
  EXPECT_EQ(moved.size(), 0u);
  ModuleRegistry registry;
  EXPECT_EQ(registry.size(), 0u);
  EXPECT_EQ(registry.find(0, "none"), nullptr);
}

TEST(Driver, CheckPassesSuccessAndNamesTheCall) {
  EXPECT_NO_THROW(check(CUDA_SUCCESS, "cuInit"));
  try {
    check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(64 bytes)");
    FAIL() << "no throw";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_STARTS_WITH(e.what(), "cuMemAlloc(64 bytes): ");
    if (driver().available()) {
      EXPECT_STREQ(e.what(), "cuMemAlloc(64 bytes): CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
    }
  }
}

TEST(Driver, ArchForComputeCapability) {
  EXPECT_EQ(arch_for_compute_capability({9, 0}), "sm_90a");
  EXPECT_EQ(arch_for_compute_capability({10, 0}), "sm_100a");
  EXPECT_EQ(arch_for_compute_capability({10, 3}), "sm_103a");
  EXPECT_EQ(arch_for_compute_capability({12, 0}), "sm_120a");
  EXPECT_EQ(arch_for_compute_capability({8, 9}), "sm_89");
  EXPECT_EQ(arch_for_compute_capability({8, 0}), "sm_80");
  EXPECT_EQ(arch_for_compute_capability({7, 5}), "sm_75");
}

// ----------------------------------------------------------------------------- tensor checks

TEST(TensorChecks, NullPointerNamesTheArgument) {
  TensorView t{0, 4096, std::nullopt, {}};
  EXPECT_EQ(error_of([&] { check_buffer("rowwise_data", t, 128, 16); }),
            "argument rowwise_data: null pointer; expected a device buffer of 128 bytes");
  // Nothing required: a null (empty) tensor is fine.
  EXPECT_NO_THROW(check_buffer("rowwise_data", t, 0, 16));
}

TEST(TensorChecks, Misaligned) {
  TensorView t{0x7f0000000008, 4096, std::nullopt, {}};
  EXPECT_EQ(error_of([&] { check_buffer("rowwise_data", t, 128, 16); }),
            "argument rowwise_data: pointer 0x7f0000000008 is not 16-byte aligned");
  EXPECT_NO_THROW(check_buffer("rowwise_data", t, 128, 8));
  EXPECT_THROW(check_buffer("rowwise_data", t, 128, 16), UserError);
}

TEST(TensorChecks, TooSmall) {
  TensorView t{0x7f0000000000, 100, std::nullopt, {}};
  const int64_t shape[] = {64, 256};
  EXPECT_EQ(error_of([&] {
              check_buffer("columnwise_scale_inv", t, 128, 16, "input " + format_shape(shape));
            }),
            "argument columnwise_scale_inv: buffer of 100 bytes is smaller than the 128 bytes "
            "required for input [64, 256]");
  EXPECT_EQ(error_of([&] { check_buffer("amax", TensorView{0x1000, 1, {}, {}}, 4, 4); }),
            "argument amax: buffer of 1 byte is smaller than the 4 bytes required");
  EXPECT_NO_THROW(check_buffer("columnwise_scale_inv", t, 100, 16));
  try {
    check_buffer("columnwise_scale_inv", t, 128, 16);
  } catch (const UserError& e) {
    EXPECT_EQ(e.where(), "argument columnwise_scale_inv");
  }
}

TEST(TensorChecks, BadAlignmentIsAnInternalError) {
  TensorView t{0x1000, 16, std::nullopt, {}};
  EXPECT_THROW(check_buffer("x", t, 16, 12), InternalError);
}

TEST(TensorChecks, DtypeAndShape) {
  TensorView t{0x1000, 64 * 128 * 2, DType::BF16, {64, 128}};
  EXPECT_NO_THROW(check_dtype("input", t, DType::BF16));
  EXPECT_EQ(error_of([&] { check_dtype("input", t, DType::FP32); }),
            "argument input: holds bf16, expected fp32");
  EXPECT_EQ(error_of([&] { check_dtype("rowwise_data", t, std::nullopt); }),
            "argument rowwise_data: holds bf16, expected raw bytes");
  const int64_t want[] = {64, 256};
  EXPECT_EQ(error_of([&] { check_shape("input", t, want); }),
            "argument input: shape [64, 128], expected [64, 256]");
  const int64_t same[] = {64, 128};
  EXPECT_NO_THROW(check_shape("input", t, same));
}

TEST(TensorChecks, ElementCount) {
  const int64_t ok[] = {3, 5, 7};
  EXPECT_EQ(element_count("input", ok), 105);
  EXPECT_EQ(element_count("input", std::span<const int64_t>{}), 1);
  const int64_t neg[] = {3, -1};
  EXPECT_EQ(error_of([&] { element_count("input", neg); }),
            "argument input: shape [3, -1] has a negative dimension");
  const int64_t huge[] = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_CONTAINS(error_of([&] { element_count("input", huge); }), "more elements than fit in int64");
}

TEST(TensorChecks, Disjoint) {
  TensorView a{0x1000, 256, std::nullopt, {}};
  TensorView b{0x1100, 16, std::nullopt, {}};
  TensorView c{0x10f0, 32, std::nullopt, {}};
  EXPECT_NO_THROW(check_disjoint("out", a, "in", b));
  EXPECT_EQ(error_of([&] { check_disjoint("rowwise_data", a, "input", c); }),
            "argument rowwise_data: buffer [0x1000, 0x1100) overlaps argument input "
            "[0x10f0, 0x1110)");
}

// ----------------------------------------------------------------------------- GPU

// Compiles `source` with NVRTC for `arch` ("sm_90a": CUBIN; "compute_90a": PTX) and returns the
// image and the lowered name of each name expression.
struct Compiled {
  std::string image;
  std::vector<std::string> lowered;
};
Compiled nvrtc_compile(const std::string& source, const std::string& arch,
                       const std::vector<std::string>& name_exprs) {
  nvrtcProgram prog = nullptr;
  EXPECT_EQ(nvrtcCreateProgram(&prog, source.c_str(), "driver_test.cu", 0, nullptr, nullptr),
            NVRTC_SUCCESS);
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&prog};
  for (const auto& n : name_exprs) nvrtcAddNameExpression(prog, n.c_str());
  std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {arch_opt.c_str(), "-std=c++17"};
  nvrtcResult r = nvrtcCompileProgram(prog, 2, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, log.data());
    ADD_FAILURE() << "NVRTC failed for " << arch << ":\n" << log;
    return {};
  }
  Compiled out;
  size_t n = 0;
  if (arch.starts_with("sm_")) {
    nvrtcGetCUBINSize(prog, &n);
    out.image.resize(n);
    nvrtcGetCUBIN(prog, out.image.data());
  } else {
    nvrtcGetPTXSize(prog, &n);
    out.image.resize(n);
    nvrtcGetPTX(prog, out.image.data());
  }
  for (const auto& ne : name_exprs) {
    const char* lowered = nullptr;
    EXPECT_EQ(nvrtcGetLoweredName(prog, ne.c_str(), &lowered), NVRTC_SUCCESS);
    out.lowered.push_back(lowered ? lowered : "");
  }
  return out;
}

constexpr const char* kKernels = R"(
namespace qft {
template <typename T>
__global__ void fill_const(T* out, T value, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}
}  // namespace qft
extern "C" __global__ void reverse_through_smem(unsigned* out, int n) {
  extern __shared__ unsigned buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = 3u * i + 1u;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buf[n - 1 - i];
}
)";
const std::vector<std::string> kNames = {"qft::fill_const<unsigned int>", "reverse_through_smem"};

// Off-GPU the compile half still runs: the test kernel compiles to an sm_90a CUBIN.
TEST(DriverNvrtc, TestKernelCompilesForHopper) {
  Compiled c = nvrtc_compile(kKernels, "sm_90a", kNames);
  ASSERT_GE(c.image.size(), 4u);
  EXPECT_EQ(c.image.substr(0, 4), "\x7f" "ELF");
  ASSERT_EQ(c.lowered.size(), 2u);
  EXPECT_CONTAINS(c.lowered[0], "fill_const");
  EXPECT_EQ(c.lowered[1], "reverse_through_smem");
}

TEST(DriverGpu, DeviceQueries) {
  QF_SKIP_WITHOUT_GPU();
  EXPECT_GT(device_count(), 0);
  EXPECT_STARTS_WITH(device_arch(0), "sm_");
  EXPECT_GT(device_sm_count(), 0);
  EXPECT_EQ(device_sm_count(), device_sm_count(0));
  EXPECT_EQ(current_device(), 0);
  EXPECT_FALSE(device_name(0).empty());
  EXPECT_TRUE(driver_alive());
  EXPECT_GE(driver().version(), 13000);
}

TEST(DriverGpu, BufferRoundTrip) {
  QF_SKIP_WITHOUT_GPU();
  std::vector<uint8_t> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
  DeviceBuffer buf = testing::poisoned_buffer(host.size());
  EXPECT_EQ(buf.download_as<uint8_t>(), std::vector<uint8_t>(host.size(), 0xFF));
  buf.upload(std::span<const uint8_t>(host));
  EXPECT_EQ(buf.download_as<uint8_t>(), host);

  // Partial copies at an offset.
  uint8_t part[10];
  buf.download(part, sizeof part, 500);
  EXPECT_EQ(0, std::memcmp(part, host.data() + 500, sizeof part));

  buf.fill(0xAB);
  EXPECT_EQ(buf.download_as<uint8_t>(), std::vector<uint8_t>(host.size(), 0xAB));

  EXPECT_CONTAINS(error_of([&] { buf.upload(host.data(), 10, 995); }), "range [995, 1005) is outside the device buffer of 1000 bytes");

  DeviceBuffer moved = std::move(buf);
  EXPECT_EQ(moved.size(), 1000u);
  EXPECT_EQ(buf.size(), 0u);

  DeviceBuffer empty(0);
  EXPECT_EQ(empty.get(), 0u);
  empty.fill(0);
}

TEST(DriverGpu, AsyncCopyFillAndEvents) {
  QF_SKIP_WITHOUT_GPU();
  Stream stream;
  Event start, stop;
  DeviceBuffer src(4096), dst = testing::poisoned_buffer(8192);
  start.record(stream.get());
  src.fill_async(0x5A, stream.get());
  dst.copy_from_async(src, stream.get());
  stop.record(stream.get());
  stop.synchronize();
  stream.synchronize();
  EXPECT_GE(Event::elapsed_ms(start, stop), 0.0f);
  std::vector<uint8_t> got = dst.download_as<uint8_t>();
  std::vector<uint8_t> want(8192, 0xFF);
  std::fill(want.begin(), want.begin() + 4096, 0x5A);
  EXPECT_EQ(got, want);
  EXPECT_THROW(src.copy_from_async(dst, stream.get()), UserError);  // does not fit
}

TEST(DriverGpu, LaunchCubinKernel) {
  QF_SKIP_WITHOUT_GPU();
  Compiled c = nvrtc_compile(kKernels, device_arch(0), kNames);
  ASSERT_FALSE(c.image.empty());
  Module module(primary_context(0), c.image);
  CUfunction fill = module.function(c.lowered[0]);

  const int n = 1000;  // not a multiple of the block
  const int slack = 64;
  DeviceBuffer out = testing::poisoned_buffer((n + slack) * sizeof(unsigned));
  CUdeviceptr ptr = out.get();
  unsigned value = 0x12345678u;
  int count = n;
  void* args[] = {&ptr, &value, &count};
  Stream stream;
  launch(fill, {(n + 127) / 128}, {128}, 0, stream.get(), args);
  stream.synchronize();
  std::vector<unsigned> got = out.download_as<unsigned>();
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], value) << "element " << i;
  for (int i = n; i < n + slack; ++i) ASSERT_EQ(got[i], 0xFFFFFFFFu) << "written past n at " << i;
}

TEST(DriverGpu, LaunchWithMoreThan48KiBOfDynamicSharedMemory) {
  QF_SKIP_WITHOUT_GPU();
  Compiled c = nvrtc_compile(kKernels, device_arch(0), kNames);
  ASSERT_FALSE(c.image.empty());
  Module module(c.image);  // into the current context
  CUfunction f = module.function("reverse_through_smem");
  const int n = 16384;  // 64 KiB of shared memory
  DeviceBuffer out = testing::poisoned_buffer(n * sizeof(unsigned));
  CUdeviceptr ptr = out.get();
  int count = n;
  void* args[] = {&ptr, &count};
  launch(f, {1}, {256}, n * sizeof(unsigned), nullptr, args);
  check(driver().cuCtxSynchronize(), "cuCtxSynchronize");
  std::vector<unsigned> got = out.download_as<unsigned>();
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], 3u * (n - 1 - i) + 1u) << "element " << i;
}

TEST(DriverGpu, LaunchFromPtx) {
  QF_SKIP_WITHOUT_GPU();
  std::string arch = device_arch(0);  // sm_90a -> compute_90a
  Compiled c = nvrtc_compile(kKernels, "compute_" + arch.substr(3), kNames);
  ASSERT_FALSE(c.image.empty());
  Module module(primary_context(0), c.image);
  DeviceBuffer out = testing::poisoned_buffer(32 * sizeof(unsigned));
  CUdeviceptr ptr = out.get();
  unsigned value = 7;
  int count = 32;
  void* args[] = {&ptr, &value, &count};
  launch(module.function(c.lowered[0]), {1}, {32}, 0, nullptr, args);
  EXPECT_EQ(out.download_as<unsigned>(), std::vector<unsigned>(32, 7u));
}

TEST(DriverGpu, ErrorsNameTheCall) {
  QF_SKIP_WITHOUT_GPU();
  EXPECT_CONTAINS(error_of([] { Module m(std::string_view("not an image")); }), "cuModuleLoadDataEx(12-byte PTX image)");
  Compiled c = nvrtc_compile(kKernels, device_arch(0), kNames);
  Module module(c.image);
  EXPECT_CONTAINS(error_of([&] { module.function("no_such_kernel"); }), "cuModuleGetFunction(\"no_such_kernel\"): CUDA_ERROR_NOT_FOUND");
  CUdeviceptr ptr = 0;
  unsigned value = 0;
  int count = 0;
  void* args[] = {&ptr, &value, &count};
  EXPECT_CONTAINS(error_of([&] { launch(module.function(c.lowered[0]), {1}, {4096}, 0, nullptr, args); }), "cuLaunchKernelEx(grid [1, 1, 1], block [4096, 1, 1], 0 bytes");
}

TEST(DriverGpu, PointerChecks) {
  QF_SKIP_WITHOUT_GPU();
  DeviceBuffer buf(256);
  EXPECT_NO_THROW(check_device_pointer("input", buf.address(), 0));
  EXPECT_NO_THROW(check_device_pointer("input", 0, 0));
  PointerInfo info = pointer_info(buf.address());
  EXPECT_TRUE(info.known);
  EXPECT_EQ(info.memory_type, CU_MEMORYTYPE_DEVICE);
  EXPECT_EQ(info.device, 0);
  std::vector<float> host(16);
  std::string e = error_of(
      [&] { check_device_pointer("input", reinterpret_cast<uint64_t>(host.data()), 0); });
  EXPECT_STARTS_WITH(e, "argument input: pointer 0x");
  EXPECT_CONTAINS(e, "is not CUDA memory");
  EXPECT_NO_THROW(check_buffer("input", testing::view_of(buf), 256, 256));
}

TEST(DriverGpu, RegistryLoadsEachKeyOnce) {
  QF_SKIP_WITHOUT_GPU();
  Compiled c = nvrtc_compile(kKernels, device_arch(0), kNames);
  ASSERT_FALSE(c.image.empty());
  ModuleRegistry registry;
  std::atomic<int> loads{0};
  std::vector<std::shared_ptr<const Module>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      got[t] = registry.get(0, "key-a", [&] {
        ++loads;
        return c.image;
      });
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(loads.load(), 1);
  for (const auto& m : got) EXPECT_EQ(m, got[0]);
  EXPECT_EQ(registry.find(0, "key-a"), got[0]);
  EXPECT_EQ(registry.find(0, "key-b"), nullptr);
  auto b = registry.get(0, "key-b", std::string_view(c.image));
  EXPECT_NE(b, got[0]);
  EXPECT_EQ(registry.size(), 2u);

  // A failed load is not remembered.
  EXPECT_THROW(registry.get(0, "bad", std::string_view("garbage")), CudaError);
  EXPECT_EQ(registry.find(0, "bad"), nullptr);
  EXPECT_EQ(registry.get(0, "bad", std::string_view(c.image))->function(c.lowered[0]) != nullptr,
            true);

  // Functions from a registry module launch (from a thread whose current context is unset).
  std::thread([&] {
    DeviceBuffer* out = nullptr;
    {
      testing::use_test_device();
      out = new DeviceBuffer(testing::poisoned_buffer(4 * sizeof(unsigned)));
      CUdeviceptr ptr = out->get();
      unsigned value = 9;
      int count = 4;
      void* args[] = {&ptr, &value, &count};
      launch(got[3]->function(c.lowered[0]), {1}, {4}, 0, nullptr, args);
      EXPECT_EQ(out->download_as<unsigned>(), std::vector<unsigned>(4, 9u));
    }
    delete out;
  }).join();
}

}  // namespace
}  // namespace qf::rt
