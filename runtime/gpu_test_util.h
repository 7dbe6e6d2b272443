// Helpers for GPU tests (header-only; include from GoogleTest sources only).
//
//   TEST(Foo, Bar) {
//     QF_SKIP_WITHOUT_GPU();                          // skips, with the reason, off-GPU
//     auto out = qf::rt::testing::poisoned_buffer(n); // 0xFF everywhere: unwritten bytes show
//     ...
//   }
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/driver.h"
#include "runtime/tensor.h"

namespace qf::rt::testing {

// Why GPU tests cannot run here (no driver, or no device); empty when they can.
inline std::string gpu_skip_reason() {
  const Driver& d = driver();
  if (!d.available()) return d.unavailable_reason();
  if (device_count() == 0) return "no CUDA device";
  return {};
}

// Makes device 0's primary context current on the calling thread (gtest may run a test's body
// on a thread with no context) and returns it.
inline const Context& use_test_device(int device = 0) {
  auto ctx = primary_context(device);
  ctx->make_current();
  return *ctx;  // the process-wide cache keeps it alive
}

// A device buffer filled with 0xFF, so an element the kernel under test never writes fails the
// comparison instead of passing by luck.
inline DeviceBuffer poisoned_buffer(size_t bytes, uint8_t poison = 0xFF) {
  DeviceBuffer b(bytes);
  b.fill(poison);
  return b;
}

// A TensorView of a whole buffer.
inline TensorView view_of(const DeviceBuffer& b) {
  return TensorView{b.address(), static_cast<int64_t>(b.size()), std::nullopt, {}};
}

}  // namespace qf::rt::testing

// GTEST_SKIPs the current test, saying why, unless a CUDA driver and device are usable; then
// makes device 0 current on this thread.
#define QF_SKIP_WITHOUT_GPU()                                                          \
  do {                                                                                 \
    if (std::string qf_skip_reason_ = ::qf::rt::testing::gpu_skip_reason();            \
        !qf_skip_reason_.empty())                                                      \
      GTEST_SKIP() << "needs a GPU: " << qf_skip_reason_;                              \
    ::qf::rt::testing::use_test_device();                                              \
  } while (0)
