// The device's fp16 -> fp32 (numerics.cuh f16_to_f32: the hardware cvt.f32.f16, NaN fixed up by
// a select) against the software definition (f16_to_f32_soft, which the CPU reference runs),
// bit for bit over all 65536 fp16 patterns, on the GPU; also through the input loads of the
// quantize kernels (cast_load.cuh unpack2 / load4 / load1 for fp16), which is how the kernels use it.
// The compile test runs everywhere.
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <vector>

#include "qforge/numerics.cuh"
#include "runtime/gpu_test_util.h"
#include "runtime/nvrtc.h"

namespace {

const char* kSource = R"(
#include "qforge/cast.cuh"
// out[5 * h + i]: the fp32 bits of fp16 pattern h widened by f16_to_f32 (i = 0), by the packed
// word loads (unpack2, h in the low then the high half: i = 1, 2), by the 8-byte load of four
// (load4, h at slot h % 4: i = 3) and by the scalar load (load1: i = 4).
extern "C" __global__ void widen(const unsigned short* in, unsigned int* out) {
  const unsigned int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= 65536u) return;
  unsigned int* o = out + 5u * h;
  o[0] = qf::f32_bits(qf::f16_to_f32((unsigned short)h));
  float lo, hi;
  qf::detail::unpack2<2>(h | ((h ^ 0x8001u) << 16), lo, hi);
  o[1] = qf::f32_bits(lo);
  qf::detail::unpack2<2>((h ^ 0x8001u) | (h << 16), lo, hi);
  o[2] = qf::f32_bits(hi);
  const float4 v = qf::detail::load4<2>(in, (long long)(h & ~3u));
  const float s[4] = {v.x, v.y, v.z, v.w};
  o[3] = qf::f32_bits(s[h & 3u]);
  o[4] = qf::f32_bits(qf::detail::load1<2>(in, (long long)h));
}
)";

qf::rt::CompileRequest request(const std::string& arch) {
  return qf::rt::CompileRequest{kSource, "fp16_widen_test.cu", {"widen"}, arch, {}};
}

TEST(Fp16Widening, CompileForHopperAndBlackwell) {
  for (const char* arch : {"sm_90a", "sm_100a"}) EXPECT_FALSE(qf::rt::compile_cuda(request(arch)).image.empty()) << arch;
}

TEST(Fp16Widening, GpuEqualsSoftwareOnAll65536Patterns) {
  QF_SKIP_WITHOUT_GPU();
  using namespace qf::rt;
  const CompileResult r = compile_cuda(request(device_arch(current_device())));
  Module m(r.image);
  CUfunction f = m.function(r.lowered_names.at("widen"));
  std::vector<uint16_t> patterns(65536);
  for (uint32_t h = 0; h < 65536; ++h) patterns[h] = uint16_t(h);
  DeviceBuffer in(patterns.size() * 2);
  in.upload(patterns.data(), patterns.size() * 2);
  DeviceBuffer out = qf::rt::testing::poisoned_buffer(size_t(65536) * 5 * 4);
  uint64_t pin = in.address(), pout = out.address();
  void* args[] = {&pin, &pout};
  Stream s;
  launch(f, Dim3{256}, Dim3{256}, 0, s.get(), args);
  s.synchronize();
  const auto got = out.download_as<uint32_t>();
  const char* paths[] = {"f16_to_f32", "unpack2 low", "unpack2 high", "load4", "load1"};
  for (int i = 0; i < 5; ++i) {
    int bad = 0;
    std::ostringstream first;
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint32_t want = qf::f32_bits(qf::f16_to_f32_soft(uint16_t(h)));
      if (got[5 * h + i] != want && bad++ == 0)
        first << std::hex << "0x" << h << ": got 0x" << got[5 * h + i] << ", want 0x" << want;
    }
    EXPECT_EQ(bad, 0) << paths[i] << ": " << bad << " patterns differ, first " << first.str();
  }
}

}  // namespace
