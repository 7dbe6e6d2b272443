#include "runtime/driver.h"

#include <dlfcn.h>

#include <atomic>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "compiler/error.h"

namespace qf::rt {
namespace {

// Stands in for every entry point while the driver is unavailable, so a stray call returns an
// error instead of jumping through a null pointer.
template <typename F>
struct Stub;
template <typename... Args>
struct Stub<CUresult (*)(Args...)> {
  static CUresult CUDAAPI call(Args...) { return CUDA_ERROR_STUB_LIBRARY; }
};

// Set by an atexit handler registered right after cuInit: from then on the process is exiting and
// driver objects are leaked rather than released (libcuda may already be tearing down).
std::atomic<bool> g_exiting{false};
void mark_exiting() { g_exiting.store(true, std::memory_order_relaxed); }

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

std::string version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

#define QF_STRINGIFY_EXPANDED(x) QF_STRINGIFY_(x)
#define QF_STRINGIFY_(x) #x

}  // namespace

std::span<const EntryPoint> driver_entry_points() {
  // #name keeps the base name; QF_STRINGIFY_EXPANDED(name) spells it after cuda.h's macros.
#define QF_DRIVER_ENTRY(name) {#name, QF_STRINGIFY_EXPANDED(name)},
  static constexpr EntryPoint kEntryPoints[] = {QF_DRIVER_ENTRY_POINTS(QF_DRIVER_ENTRY)};
#undef QF_DRIVER_ENTRY
  return kEntryPoints;
}

Driver::Driver() {
#define QF_DRIVER_STUB(name) name = &Stub<decltype(&::name)>::call;
  QF_DRIVER_ENTRY_POINTS(QF_DRIVER_STUB)
#undef QF_DRIVER_STUB

  dlerror();
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    reason_ = std::string("no CUDA driver: libcuda.so.1 not found (") + (e ? e : "unknown error") +
              ")";
    return;
  }
  // Never dlclose: function pointers into the library outlive any point where closing is safe.

  // Each entry point is looked up by the symbol its name expands to in cuda.h, so the exported
  // function is exactly the one whose prototype typed the member.
  std::vector<void*> resolved;
  std::string missing;
  for (const EntryPoint& e : driver_entry_points()) {
    void* fn = dlsym(lib, e.symbol);
    if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(e.symbol);
    resolved.push_back(fn);
  }
  if (!missing.empty()) {
    reason_ = "no usable CUDA driver: libcuda.so.1 lacks " + missing +
              " (driver too old for the CUDA " + version_string(CUDA_VERSION) +
              " headers qforge was built with; update the NVIDIA driver)";
    return;
  }
  // All found: install them, in list order.
  size_t i = 0;
#define QF_DRIVER_INSTALL(name) name = reinterpret_cast<decltype(&::name)>(resolved[i++]);
  QF_DRIVER_ENTRY_POINTS(QF_DRIVER_INSTALL)
#undef QF_DRIVER_INSTALL

  if (cuDriverGetVersion(&version_) != CUDA_SUCCESS) version_ = 0;
  if (version_ / 1000 < CUDA_VERSION / 1000) {
    reason_ = "no usable CUDA driver: libcuda.so.1 is CUDA " + version_string(version_) +
              ", older than the CUDA " + version_string(CUDA_VERSION) +
              " qforge was built with; update the NVIDIA driver";
    code_ = CUDA_ERROR_NOT_SUPPORTED;
    return;
  }

  CUresult r = cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* n = nullptr;
    const char* s = nullptr;
    cuGetErrorName(r, &n);
    cuGetErrorString(r, &s);
    reason_ = std::string("CUDA driver unusable: cuInit failed: ") + (n ? n : "?") + " (" +
              (s ? s : "unknown") + ")";
    code_ = r;
    return;
  }
  std::atexit(mark_exiting);
  available_ = true;
  code_ = CUDA_SUCCESS;
}

const Driver& driver() {
  // Constructed once, thread-safely; intentionally never destroyed.
  static const Driver* const d = new Driver();
  return *d;
}

const Driver& require_driver() {
  const Driver& d = driver();
  if (!d.available()) throw CudaError(d.unavailable_code(), d.unavailable_reason());
  return d;
}

bool driver_alive() {
  const Driver& d = driver();
  if (!d.available() || g_exiting.load(std::memory_order_relaxed)) return false;
  CUcontext c = nullptr;
  return d.cuCtxGetCurrent(&c) != CUDA_ERROR_DEINITIALIZED;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const Driver& d = driver();
  if (!d.available() && (r == CUDA_ERROR_STUB_LIBRARY || d.unavailable_code() == r))
    throw CudaError(r, std::string(what) + ": " + d.unavailable_reason());
  const char* name = nullptr;
  const char* desc = nullptr;
  if (d.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (d.cuGetErrorString(r, &desc) != CUDA_SUCCESS) desc = nullptr;
  std::string msg = std::string(what) + ": " +
                    (name ? std::string(name) : "CUresult " + std::to_string(static_cast<int>(r)));
  if (desc) msg += std::string(" (") + desc + ")";
  throw CudaError(r, msg);
}

// ------------------------------------------------------------------------------- devices

int device_count() {
  const Driver& d = driver();
  if (!d.available()) return 0;
  int n = 0;
  if (d.cuDeviceGetCount(&n) != CUDA_SUCCESS) return 0;
  return n;
}

namespace {
CUdevice get_device(int ordinal) {
  const Driver& d = require_driver();
  CUdevice dev = 0;
  check(d.cuDeviceGet(&dev, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
  return dev;
}
int attribute(int ordinal, CUdevice_attribute a, const char* what) {
  CUdevice dev = get_device(ordinal);
  int v = 0;
  check(driver().cuDeviceGetAttribute(&v, a, dev), what);
  return v;
}
}  // namespace

ComputeCapability compute_capability(int device) {
  return {attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                    "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)"),
          attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                    "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)")};
}

std::string arch_for_compute_capability(ComputeCapability cc) {
  // Arch-specific ('a') targets NVRTC 13 knows: the kernel is compiled on and for this exact
  // device, so the features that only exist there (wgmma, setmaxnreg, tcgen05) are usable.
  static constexpr ComputeCapability kArchSpecific[] = {{9, 0},  {10, 0}, {10, 3},
                                                        {11, 0}, {12, 0}, {12, 1}};
  std::string arch = "sm_" + std::to_string(cc.major) + std::to_string(cc.minor);
  for (const auto& a : kArchSpecific)
    if (a.major == cc.major && a.minor == cc.minor) return arch + "a";
  return arch;
}

std::string device_arch(int device) {
  return arch_for_compute_capability(compute_capability(device));
}

std::string device_name(int device) {
  CUdevice dev = get_device(device);
  char buf[256] = {};
  check(driver().cuDeviceGetName(buf, sizeof buf - 1, dev), "cuDeviceGetName");
  return buf;
}

int device_sm_count(int device) {
  return attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                   "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
}

int current_device() {
  const Driver& d = require_driver();
  CUdevice dev = 0;
  check(d.cuCtxGetDevice(&dev), "cuCtxGetDevice (is a CUDA context current on this thread?)");
  // A CUdevice handle is its ordinal.
  return static_cast<int>(dev);
}

int device_sm_count() { return device_sm_count(current_device()); }

// ------------------------------------------------------------------------------- contexts

Context::Context(int device, bool make_current) {
  dev_ = get_device(device);
  check(driver().cuDevicePrimaryCtxRetain(&ctx_, dev_),
        "cuDevicePrimaryCtxRetain(device " + std::to_string(device) + ")");
  ordinal_ = device;
  if (make_current) this->make_current();
}

Context::~Context() { reset(); }

Context::Context(Context&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)), dev_(o.dev_), ordinal_(std::exchange(o.ordinal_, -1)) {}

Context& Context::operator=(Context&& o) noexcept {
  if (this != &o) {
    reset();
    ctx_ = std::exchange(o.ctx_, nullptr);
    dev_ = o.dev_;
    ordinal_ = std::exchange(o.ordinal_, -1);
  }
  return *this;
}

void Context::reset() noexcept {
  if (ctx_ && driver_alive()) driver().cuDevicePrimaryCtxRelease(dev_);
  ctx_ = nullptr;
}

void Context::make_current() const {
  QF_CHECK(ctx_, "make_current on a moved-from Context");
  check(driver().cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
}

std::shared_ptr<const Context> primary_context(int device) {
  static std::mutex* mu = new std::mutex;
  static auto* contexts = new std::map<int, std::shared_ptr<const Context>>;
  {
    std::lock_guard<std::mutex> lock(*mu);
    auto it = contexts->find(device);
    if (it != contexts->end()) return it->second;
  }
  // Retaining is idempotent per process; two racing threads both retain and one reference is
  // dropped (released) below.
  auto ctx = std::make_shared<const Context>(device, /*make_current=*/false);
  std::lock_guard<std::mutex> lock(*mu);
  return contexts->try_emplace(device, std::move(ctx)).first->second;
}

ScopedContext::ScopedContext(CUcontext ctx) {
  const Driver& d = require_driver();
  check(d.cuCtxGetCurrent(&prev_), "cuCtxGetCurrent");
  if (prev_ != ctx) {
    check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    switched_ = true;
  }
}

ScopedContext::~ScopedContext() {
  if (switched_) driver().cuCtxSetCurrent(prev_);
}

namespace {
// For destructors: switch to ctx if needed, run f, switch back; never throws.
template <typename F>
void in_context_noexcept(CUcontext ctx, F&& f) noexcept {
  const Driver& d = driver();
  CUcontext prev = nullptr;
  if (d.cuCtxGetCurrent(&prev) != CUDA_SUCCESS) return;
  bool switched = false;
  if (ctx && prev != ctx) {
    if (d.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return;
    switched = true;
  }
  f();
  if (switched) d.cuCtxSetCurrent(prev);
}

CUcontext current_context(const char* for_what) {
  const Driver& d = require_driver();
  CUcontext ctx = nullptr;
  check(d.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (!ctx)
    throw CudaError(CUDA_ERROR_INVALID_CONTEXT,
                    std::string(for_what) +
                        ": no CUDA context is current on this thread (create a qf::rt::Context "
                        "or call make_current() on one)");
  return ctx;
}
}  // namespace

// ------------------------------------------------------------------------------- modules

Module::Module(std::shared_ptr<const Context> ctx, std::string_view image) : ctx_(std::move(ctx)) {
  QF_CHECK(ctx_ && ctx_->get(), "Module needs a context");
  ctx_raw_ = ctx_->get();
  ScopedContext scope(ctx_raw_);
  load(image);
}

Module::Module(std::string_view image) {
  ctx_raw_ = current_context("loading a module");
  load(image);
}

void Module::load(std::string_view image) {
  // PTX must be NUL-terminated; a CUBIN is self-describing. Copying also guarantees alignment.
  std::string owned(image);
  char error_log[8192] = {};
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* vals[] = {error_log, reinterpret_cast<void*>(static_cast<uintptr_t>(sizeof error_log - 1))};
  CUresult r = driver().cuModuleLoadDataEx(&mod_, owned.c_str(), 2, opts, vals);
  if (r != CUDA_SUCCESS) {
    mod_ = nullptr;
    std::string what = "cuModuleLoadDataEx(" + std::to_string(image.size()) + "-byte " +
                       (image.starts_with("\x7f" "ELF") ? "CUBIN" : "PTX") + " image)";
    if (error_log[0]) what += std::string(" [JIT log: ") + error_log + "]";
    check(r, what);
  }
}

Module::~Module() { reset(); }

Module::Module(Module&& o) noexcept
    : ctx_(std::move(o.ctx_)),
      ctx_raw_(std::exchange(o.ctx_raw_, nullptr)),
      mod_(std::exchange(o.mod_, nullptr)) {}

Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    reset();
    ctx_ = std::move(o.ctx_);
    ctx_raw_ = std::exchange(o.ctx_raw_, nullptr);
    mod_ = std::exchange(o.mod_, nullptr);
  }
  return *this;
}

void Module::reset() noexcept {
  if (mod_ && driver_alive())
    in_context_noexcept(ctx_raw_, [&] { driver().cuModuleUnload(mod_); });
  mod_ = nullptr;
  ctx_.reset();
}

CUfunction Module::function(const std::string& lowered_name) const {
  QF_CHECK(mod_, "function() on a moved-from Module");
  CUfunction f = nullptr;
  check(driver().cuModuleGetFunction(&f, mod_, lowered_name.c_str()),
        "cuModuleGetFunction(\"" + lowered_name + "\")");
  return f;
}

ModuleRegistry::~ModuleRegistry() = default;

std::shared_ptr<const Module> ModuleRegistry::get(int device, const std::string& image_key,
                                                  const std::function<std::string()>& load_image) {
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& s = slots_[{device, image_key}];
    if (!s) s = std::make_shared<Slot>();
    if (s->published) return s->published;
    slot = s;
  }
  std::lock_guard<std::mutex> load_lock(slot->load_mutex);
  if (slot->module) return slot->module;
  auto module = std::make_shared<const Module>(primary_context(device), load_image());
  slot->module = module;
  std::lock_guard<std::mutex> lock(mutex_);
  slot->published = module;
  return module;
}

std::shared_ptr<const Module> ModuleRegistry::get(int device, const std::string& image_key,
                                                  std::string_view image) {
  return get(device, image_key, [image] { return std::string(image); });
}

std::shared_ptr<const Module> ModuleRegistry::find(int device, const std::string& image_key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = slots_.find({device, image_key});
  return it == slots_.end() ? nullptr : it->second->published;
}

size_t ModuleRegistry::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& [key, slot] : slots_) n += slot->published != nullptr;
  return n;
}

ModuleRegistry& module_registry() {
  static ModuleRegistry* r = new ModuleRegistry;
  return *r;
}

// ------------------------------------------------------------------------------- memory

DeviceBuffer::DeviceBuffer(size_t bytes) {
  ctx_ = current_context("allocating a DeviceBuffer");
  if (bytes == 0) return;
  check(driver().cuMemAlloc(&ptr_, bytes), "cuMemAlloc(" + std::to_string(bytes) + " bytes)");
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, 0)),
      bytes_(std::exchange(o.bytes_, 0)),
      ctx_(std::exchange(o.ctx_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (ptr_ && driver_alive()) in_context_noexcept(ctx_, [&] { driver().cuMemFree(ptr_); });
  ptr_ = 0;
  bytes_ = 0;
}

void DeviceBuffer::check_range(const char* op, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw UserError(op, detail::concat("range [", offset, ", ", offset + bytes,
                                       ") is outside the device buffer of ", bytes_, " bytes"));
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  check_range("DeviceBuffer::upload", bytes, offset);
  if (bytes == 0) return;
  ScopedContext scope(ctx_);
  check(driver().cuMemcpyHtoD(ptr_ + offset, host, bytes),
        "cuMemcpyHtoD(" + std::to_string(bytes) + " bytes)");
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  check_range("DeviceBuffer::download", bytes, offset);
  if (bytes == 0) return;
  ScopedContext scope(ctx_);
  check(driver().cuMemcpyDtoH(host, ptr_ + offset, bytes),
        "cuMemcpyDtoH(" + std::to_string(bytes) + " bytes)");
}

void DeviceBuffer::fill(uint8_t byte) {
  if (bytes_ == 0) return;
  ScopedContext scope(ctx_);
  check(driver().cuMemsetD8(ptr_, byte, bytes_), "cuMemsetD8");
  // cuMemsetD8 on device memory may return before it completes, and non-blocking streams do
  // not order after it: wait, so "synchronous" holds for every later stream.
  check(driver().cuCtxSynchronize(), "cuCtxSynchronize after cuMemsetD8");
}

void DeviceBuffer::fill_async(uint8_t byte, CUstream stream) {
  if (bytes_ == 0) return;
  ScopedContext scope(ctx_);
  check(driver().cuMemsetD8Async(ptr_, byte, bytes_, stream), "cuMemsetD8Async");
}

void DeviceBuffer::copy_from_async(const DeviceBuffer& src, CUstream stream) {
  check_range("DeviceBuffer::copy_from_async", src.size(), 0);
  if (src.size() == 0) return;
  ScopedContext scope(ctx_);
  check(driver().cuMemcpyDtoDAsync(ptr_, src.get(), src.size(), stream),
        "cuMemcpyDtoDAsync(" + std::to_string(src.size()) + " bytes)");
}

PointerInfo pointer_info(uint64_t address) {
  const Driver& d = require_driver();
  // cuPointerGetAttributes (unlike cuPointerGetAttribute) answers CUDA_SUCCESS with a zero memory
  // type for an address CUDA does not know, so rejecting a host pointer is not a failed driver
  // call (which compute-sanitizer would report as an API error).
  CUmemorytype type{};
  int ordinal = -1;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* data[] = {&type, &ordinal};
  check(d.cuPointerGetAttributes(2, attrs, data, static_cast<CUdeviceptr>(address)),
        "cuPointerGetAttributes(MEMORY_TYPE, DEVICE_ORDINAL, " + hex(address) + ")");
  PointerInfo info;
  if (type == CUmemorytype{}) return info;  // not known to CUDA
  info.known = true;
  info.memory_type = type;
  info.device = ordinal;
  return info;
}

void check_device_pointer(const std::string& arg_name, uint64_t address, int device) {
  if (address == 0) return;
  PointerInfo info = pointer_info(address);
  if (info.known && info.memory_type != CU_MEMORYTYPE_HOST &&
      !(info.memory_type == CU_MEMORYTYPE_DEVICE && info.device >= 0 && info.device != device))
    return;  // the message below is built only on failure
  const std::string where = "argument " + arg_name;
  if (!info.known)
    throw UserError(where, "pointer " + hex(address) +
                               " is not CUDA memory (a plain host pointer?); expected device "
                               "memory of device " +
                               std::to_string(device));
  if (info.memory_type == CU_MEMORYTYPE_HOST)
    throw UserError(where, "pointer " + hex(address) +
                               " is host memory; expected device memory of device " +
                               std::to_string(device));
  if (info.memory_type == CU_MEMORYTYPE_DEVICE && info.device >= 0 && info.device != device)
    throw UserError(where, "pointer " + hex(address) + " is memory of device " +
                               std::to_string(info.device) + "; expected device " +
                               std::to_string(device));
}

// ------------------------------------------------------------------------------- streams

Stream::Stream(unsigned flags) {
  ctx_ = current_context("creating a Stream");
  check(driver().cuStreamCreate(&stream_, flags), "cuStreamCreate");
}

Stream::~Stream() { reset(); }

Stream::Stream(Stream&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)), ctx_(std::exchange(o.ctx_, nullptr)) {}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    reset();
    stream_ = std::exchange(o.stream_, nullptr);
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void Stream::reset() noexcept {
  if (stream_ && driver_alive())
    in_context_noexcept(ctx_, [&] { driver().cuStreamDestroy(stream_); });
  stream_ = nullptr;
}

void Stream::synchronize() const { check(driver().cuStreamSynchronize(stream_), "cuStreamSynchronize"); }

Event::Event(unsigned flags) {
  ctx_ = current_context("creating an Event");
  check(driver().cuEventCreate(&event_, flags), "cuEventCreate");
}

Event::~Event() { reset(); }

Event::Event(Event&& o) noexcept
    : event_(std::exchange(o.event_, nullptr)), ctx_(std::exchange(o.ctx_, nullptr)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    reset();
    event_ = std::exchange(o.event_, nullptr);
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void Event::reset() noexcept {
  if (event_ && driver_alive())
    in_context_noexcept(ctx_, [&] { driver().cuEventDestroy(event_); });
  event_ = nullptr;
}

void Event::record(CUstream stream) const { check(driver().cuEventRecord(event_, stream), "cuEventRecord"); }

void Event::synchronize() const { check(driver().cuEventSynchronize(event_), "cuEventSynchronize"); }

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.0f;
  check(driver().cuEventElapsedTime(&ms, start.event_, end.event_), "cuEventElapsedTime");
  return ms;
}

// ------------------------------------------------------------------------------- graphs

Graph::Graph(CUstream stream, const std::function<void()>& record) {
  ctx_ = current_context("capturing a Graph");
  const Driver& d = require_driver();
  check(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  try {
    record();
  } catch (...) {
    CUgraph partial = nullptr;
    if (d.cuStreamEndCapture(stream, &partial) == CUDA_SUCCESS && partial) d.cuGraphDestroy(partial);
    throw;
  }
  check(d.cuStreamEndCapture(stream, &graph_), "cuStreamEndCapture");
  const CUresult r = d.cuGraphInstantiate(&exec_, graph_, 0);
  if (r != CUDA_SUCCESS) {
    reset();
    check(r, "cuGraphInstantiate");
  }
}

Graph::~Graph() { reset(); }

size_t Graph::nodes() const {
  size_t n = 0;
  check(require_driver().cuGraphGetNodes(graph_, nullptr, &n), "cuGraphGetNodes");
  return n;
}

Graph::Graph(Graph&& o) noexcept
    : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)), ctx_(std::exchange(o.ctx_, nullptr)) {}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    reset();
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void Graph::reset() noexcept {
  if ((graph_ || exec_) && driver_alive())
    in_context_noexcept(ctx_, [&] {
      if (exec_) driver().cuGraphExecDestroy(exec_);
      if (graph_) driver().cuGraphDestroy(graph_);
    });
  graph_ = nullptr;
  exec_ = nullptr;
}

void Graph::launch(CUstream stream) const { check(driver().cuGraphLaunch(exec_, stream), "cuGraphLaunch"); }

// ------------------------------------------------------------------------------- launches

void allow_dynamic_smem(CUfunction f, size_t smem_bytes) {
  constexpr size_t kDefaultDynamicSmem = 48 * 1024;
  if (smem_bytes <= kDefaultDynamicSmem) return;
  if (smem_bytes > INT_MAX) check(CUDA_ERROR_INVALID_VALUE, detail::concat("dynamic shared memory of ", smem_bytes, " bytes"));
  check(require_driver().cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(smem_bytes)),
        detail::concat("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, ", smem_bytes, ")"));
}

void launch(CUfunction f, Dim3 grid, Dim3 block, size_t smem_bytes, CUstream stream, void** args,
            std::span<CUlaunchAttribute> attrs, SmemLimit limit) {
  const Driver& d = require_driver();
  auto describe = [&](const char* call) {
    return detail::concat(call, "(grid [", grid.x, ", ", grid.y, ", ", grid.z, "], block [",
                          block.x, ", ", block.y, ", ", block.z, "], ", smem_bytes,
                          " bytes of dynamic shared memory)");
  };
  if (smem_bytes > UINT_MAX) check(CUDA_ERROR_INVALID_VALUE, describe("launch"));
  constexpr size_t kDefaultDynamicSmem = 48 * 1024;
  if (limit == SmemLimit::kRaise && smem_bytes > kDefaultDynamicSmem) {
    CUresult r = d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      static_cast<int>(smem_bytes));
    if (r != CUDA_SUCCESS) check(r, describe("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)"));
  }
  CUlaunchConfig config{};
  config.gridDimX = grid.x;
  config.gridDimY = grid.y;
  config.gridDimZ = grid.z;
  config.blockDimX = block.x;
  config.blockDimY = block.y;
  config.blockDimZ = block.z;
  config.sharedMemBytes = static_cast<unsigned>(smem_bytes);
  config.hStream = stream;
  config.attrs = attrs.empty() ? nullptr : attrs.data();
  config.numAttrs = static_cast<unsigned>(attrs.size());
  CUresult r = d.cuLaunchKernelEx(&config, f, args, nullptr);
  if (r != CUDA_SUCCESS) check(r, describe("cuLaunchKernelEx"));
}

}  // namespace qf::rt
