// The CUDA driver, loaded at run time.
//
// qforge never links libcuda: the library and CLI must load and compile kernels on machines
// without a GPU. `driver()` dlopens libcuda.so.1 on first use (thread-safe) and resolves every
// entry point with dlsym. Each member is typed from the real prototype (`decltype(&::cuX)`), so a
// wrong argument is a compile error.
//
// Naming trap handled here: cuda.h #defines many names to versioned symbols (cuMemAlloc ->
// cuMemAlloc_v2, cuEventElapsedTime -> cuEventElapsedTime_v2, cuMemcpyHtoD ->
// __CUDA_API_PTDS(cuMemcpyHtoD_v2) -> cuMemcpyHtoD_v2, ...). The member declared as `cuMemAlloc`
// is therefore really `cuMemAlloc_v2`, typed from cuMemAlloc_v2's prototype, and a call
// `driver().cuMemAlloc(...)` expands the same way. The symbol looked up is the name stringified
// *after* that expansion ("cuMemAlloc_v2"), so the exported function is by construction the one
// whose prototype typed the member (driver_entry_points() lists both spellings).
//
// Why not cuGetProcAddress(base name, CUDA_VERSION): it maps a base name to the variant current
// at that version, which is not always the one cuda.h binds the plain name to. With CUDA 13.0,
// cuGetProcAddress("cuCtxGetDevice", 13000) returns cuCtxGetDevice_v2(CUdevice*, CUcontext)
// while cuda.h's cuCtxGetDevice is the one-argument v1: a call through the v1 type crashes
// (seen on an H100 with driver 580). Pinning a version per entry point by hand would be a table
// that silently rots; the expanded-name dlsym cannot disagree with the header.
//
// Without a usable driver, `driver().available()` is false, every member points at a stub that
// returns CUDA_ERROR_STUB_LIBRARY (never a null pointer), and `check()` turns that into a
// CudaError whose message starts with the reason, e.g.
//   "no CUDA driver: libcuda.so.1 not found (libcuda.so.1: cannot open shared object file: ...)".
//
// Modules: cuModuleLoadDataEx (not cuLibraryLoadData). A module belongs to one context, which is
// exactly how the registry below keys them (per device, whose primary context we use), its
// CUfunction comes straight from cuModuleGetFunction with no per-context cuKernelGetFunction
// step, and the Ex form gives us the JIT error log when a PTX image fails to load.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qf::rt {

// Every driver entry point qforge uses, by base name. X(name) is expanded once for the member
// declarations and once for the lookup (driver.cpp).
#define QF_DRIVER_ENTRY_POINTS(X) \
  X(cuInit)                       \
  X(cuDriverGetVersion)           \
  X(cuGetErrorName)               \
  X(cuGetErrorString)             \
  X(cuDeviceGet)                  \
  X(cuDeviceGetCount)             \
  X(cuDeviceGetAttribute)         \
  X(cuDeviceGetName)              \
  X(cuDevicePrimaryCtxRetain)     \
  X(cuDevicePrimaryCtxRelease)    \
  X(cuCtxGetCurrent)              \
  X(cuCtxSetCurrent)              \
  X(cuCtxGetDevice)               \
  X(cuCtxSynchronize)             \
  X(cuModuleLoadDataEx)           \
  X(cuModuleUnload)               \
  X(cuModuleGetFunction)          \
  X(cuFuncSetAttribute)           \
  X(cuLaunchKernelEx)             \
  X(cuMemAlloc)                   \
  X(cuMemFree)                    \
  X(cuMemcpyHtoD)                 \
  X(cuMemcpyDtoH)                 \
  X(cuMemsetD8)                   \
  X(cuMemsetD8Async)              \
  X(cuMemcpyDtoDAsync)            \
  X(cuStreamCreate)               \
  X(cuStreamDestroy)              \
  X(cuStreamSynchronize)          \
  X(cuEventCreate)                \
  X(cuEventRecord)                \
  X(cuEventSynchronize)           \
  X(cuEventElapsedTime)           \
  X(cuEventDestroy)               \
  X(cuStreamBeginCapture)         \
  X(cuStreamEndCapture)           \
  X(cuStreamIsCapturing)          \
  X(cuGraphInstantiate)           \
  X(cuGraphLaunch)                \
  X(cuGraphExecDestroy)           \
  X(cuGraphDestroy)               \
  X(cuGraphGetNodes)              \
  X(cuPointerGetAttributes)       \
  X(cuTensorMapEncodeTiled)       \
  X(cuOccupancyMaxActiveClusters)  \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor)

// One entry point: its name in qforge's source and the libcuda symbol it resolves to.
struct EntryPoint {
  const char* name;    // "cuMemAlloc"
  const char* symbol;  // "cuMemAlloc_v2"
};
std::span<const EntryPoint> driver_entry_points();

class Driver {
 public:
#define QF_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  QF_DRIVER_ENTRY_POINTS(QF_DRIVER_MEMBER)
#undef QF_DRIVER_MEMBER

  // libcuda loaded, every entry point resolved, driver new enough, cuInit(0) succeeded.
  bool available() const { return available_; }
  // Why not, as a full sentence; empty when available.
  const std::string& unavailable_reason() const { return reason_; }
  // The CUresult that made it unavailable (CUDA_ERROR_STUB_LIBRARY when libcuda is missing).
  CUresult unavailable_code() const { return code_; }
  // cuDriverGetVersion, e.g. 13000; 0 when the library was not found.
  int version() const { return version_; }

  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

 private:
  Driver();
  friend const Driver& driver();
  bool available_ = false;
  std::string reason_;
  CUresult code_ = CUDA_ERROR_STUB_LIBRARY;
  int version_ = 0;
};

// The process-wide driver, loaded on first call (thread-safe; never unloaded). Never throws.
const Driver& driver();
// Same, but throws CudaError with the reason when the driver is unavailable.
const Driver& require_driver();
// Whether it is still safe to release driver objects: available and not torn down by process
// exit. Destructors of the RAII types below skip the release (leak) when this is false.
bool driver_alive();

class CudaError : public std::runtime_error {
 public:
  CudaError(CUresult code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  CUresult code() const { return code_; }

 private:
  CUresult code_;
};

// Throws CudaError("<what>: CUDA_ERROR_X (description)") unless r is CUDA_SUCCESS. Without a
// driver the message is "<what>: no CUDA driver: ...".
void check(CUresult r, const char* what);
inline void check(CUresult r, const std::string& what) { check(r, what.c_str()); }

// ------------------------------------------------------------------------------- devices

// Number of CUDA devices; 0 without a driver (never throws).
int device_count();
struct ComputeCapability {
  int major = 0;
  int minor = 0;
};
ComputeCapability compute_capability(int device);
// NVRTC --gpu-architecture for a compute capability: the arch-specific 'a' variant where one
// exists (sm_90a: wgmma/setmaxnreg; sm_100a, sm_103a, sm_110a, sm_120a, sm_121a), else "sm_89".
std::string arch_for_compute_capability(ComputeCapability cc);
std::string device_arch(int device);
std::string device_name(int device);
int device_sm_count(int device);
// The device of the calling thread's current context.
int current_device();
int device_sm_count();

// ------------------------------------------------------------------------------- contexts

// A retained primary context of one device. Move-only; released in the destructor.
class Context {
 public:
  // Retains the device's primary context and, when make_current, makes it current on the
  // calling thread.
  explicit Context(int device, bool make_current = true);
  ~Context();
  Context(Context&& o) noexcept;
  Context& operator=(Context&& o) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  void make_current() const;
  CUcontext get() const { return ctx_; }
  int device() const { return ordinal_; }

 private:
  void reset() noexcept;
  CUcontext ctx_ = nullptr;
  CUdevice dev_ = 0;
  int ordinal_ = -1;
};

// The process-wide retained primary context of a device (retained once, kept for the life of
// the process). Does not change the current context.
std::shared_ptr<const Context> primary_context(int device);

// Makes `ctx` current for the scope and restores the previous current context after.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  CUcontext prev_ = nullptr;
  bool switched_ = false;
};

// ------------------------------------------------------------------------------- modules

// A loaded CUBIN or PTX image. Move-only; unloaded in the destructor (if the driver is alive).
class Module {
 public:
  // Loads `image` (CUBIN bytes or PTX text) into ctx's context. Keeps the context retained.
  Module(std::shared_ptr<const Context> ctx, std::string_view image);
  // Loads into the calling thread's current context (throws if there is none).
  explicit Module(std::string_view image);
  ~Module();
  Module(Module&& o) noexcept;
  Module& operator=(Module&& o) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The kernel with that lowered (mangled, as from nvrtcGetLoweredName) name.
  CUfunction function(const std::string& lowered_name) const;
  CUmodule get() const { return mod_; }
  CUcontext context() const { return ctx_raw_; }

 private:
  void load(std::string_view image);
  void reset() noexcept;
  std::shared_ptr<const Context> ctx_;
  CUcontext ctx_raw_ = nullptr;
  CUmodule mod_ = nullptr;
};

// Loaded modules per (device, image key), each loaded once. Thread-safe: the registry mutex is
// held only for map lookups; a load holds only its own key's mutex, so different kernels load
// in parallel and concurrent requests for one key wait for a single load. A failed load is not
// remembered (the next request retries). The image key must identify the image's content (the
// compile cache key).
class ModuleRegistry {
 public:
  ModuleRegistry() = default;
  ~ModuleRegistry();  // drops its references; modules unload (driver alive) or leak (exit)
  ModuleRegistry(const ModuleRegistry&) = delete;
  ModuleRegistry& operator=(const ModuleRegistry&) = delete;

  // The module for (device, image_key), loading load_image() into the device's primary context
  // on first request. load_image is called at most once per successful load.
  std::shared_ptr<const Module> get(int device, const std::string& image_key,
                                    const std::function<std::string()>& load_image);
  std::shared_ptr<const Module> get(int device, const std::string& image_key,
                                    std::string_view image);
  // Already loaded, or nullptr.
  std::shared_ptr<const Module> find(int device, const std::string& image_key) const;
  size_t size() const;  // modules loaded

 private:
  struct Slot {
    std::mutex load_mutex;
    std::shared_ptr<const Module> module;  // guarded by load_mutex (written once)
    std::shared_ptr<const Module> published;  // guarded by the registry mutex
  };
  mutable std::mutex mutex_;
  std::map<std::pair<int, std::string>, std::shared_ptr<Slot>> slots_;
};

// The process-wide registry (never destroyed: its modules leak at exit).
ModuleRegistry& module_registry();

// ------------------------------------------------------------------------------- memory

// Device memory from cuMemAlloc in the context current at construction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);  // bytes == 0: an empty buffer, no allocation
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr get() const { return ptr_; }
  uint64_t address() const { return static_cast<uint64_t>(ptr_); }
  size_t size() const { return bytes_; }

  // Synchronous copies; [offset, offset + bytes) must lie inside the buffer.
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  template <typename T>
  void upload(std::span<const T> host) { upload(host.data(), host.size_bytes()); }
  template <typename T>
  std::vector<T> download_as() const {
    std::vector<T> v(bytes_ / sizeof(T));
    download(v.data(), v.size() * sizeof(T));
    return v;
  }
  void fill(uint8_t byte);                        // synchronous
  void fill_async(uint8_t byte, CUstream stream);
  // Copies src (whole, must fit) to the start of this buffer on `stream`.
  void copy_from_async(const DeviceBuffer& src, CUstream stream);

 private:
  void check_range(const char* op, size_t bytes, size_t offset) const;
  void reset() noexcept;
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
  CUcontext ctx_ = nullptr;
};

// What a device address is, per cuPointerGetAttributes.
struct PointerInfo {
  bool known = false;  // allocated or registered with CUDA
  CUmemorytype memory_type = CU_MEMORYTYPE_HOST;
  int device = -1;
};
PointerInfo pointer_info(uint64_t address);
// Throws UserError("argument <arg_name>: pointer 0x... is not device memory of device N ...")
// unless address is null or device/managed memory usable on `device`.
void check_device_pointer(const std::string& arg_name, uint64_t address, int device);

// ------------------------------------------------------------------------------- streams

class Stream {
 public:
  explicit Stream(unsigned flags = CU_STREAM_NON_BLOCKING);  // in the current context
  ~Stream();
  Stream(Stream&& o) noexcept;
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream get() const { return stream_; }
  void synchronize() const;

 private:
  void reset() noexcept;
  CUstream stream_ = nullptr;
  CUcontext ctx_ = nullptr;
};

class Event {
 public:
  explicit Event(unsigned flags = CU_EVENT_DEFAULT);  // in the current context
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  CUevent get() const { return event_; }
  void record(CUstream stream) const;
  void synchronize() const;
  // Milliseconds from start to end (both recorded and complete).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  void reset() noexcept;
  CUevent event_ = nullptr;
  CUcontext ctx_ = nullptr;
};

// The work `record` enqueues on `stream`, captured into a CUDA graph (thread-local capture
// mode: other threads' CUDA calls are not affected) and instantiated. Move-only; both the graph
// and its executable are destroyed with it. If `record` throws, the capture is ended and the
// exception passes on, the stream back to normal.
class Graph {
 public:
  Graph(CUstream stream, const std::function<void()>& record);
  ~Graph();
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void launch(CUstream stream) const;
  // Nodes of the captured graph (kernel launches, memsets, ...).
  size_t nodes() const;

 private:
  void reset() noexcept;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  CUcontext ctx_ = nullptr;
};

// ------------------------------------------------------------------------------- launches

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// Raises f's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to smem_bytes when that is above the
// 48 KiB default (once per loaded function: the driver call costs microseconds per launch).
void allow_dynamic_smem(CUfunction f, size_t smem_bytes);

// Whether launch() raises the dynamic shared-memory limit itself (kRaise) or the caller did it
// once with allow_dynamic_smem() when it loaded the function (kPrepared: the per-call path).
enum class SmemLimit { kRaise, kPrepared };

// Launches f through cuLaunchKernelEx. The CUlaunchConfig is built on this call's stack; extra
// launch attributes (cluster dimensions, PDL, ...) come from the caller's own storage. With
// SmemLimit::kRaise, a dynamic shared-memory size above the 48 KiB default also raises the
// function's limit (allow_dynamic_smem). `args` is the kernel's parameter array, as for
// cuLaunchKernel. Errors name the grid, block and shared-memory size.
void launch(CUfunction f, Dim3 grid, Dim3 block, size_t smem_bytes, CUstream stream,
            void** args, std::span<CUlaunchAttribute> attrs = {}, SmemLimit limit = SmemLimit::kRaise);

}  // namespace qf::rt
