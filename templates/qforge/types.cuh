// Fixed-width integer types and the host/device function qualifier shared by every qforge
// device header and by the CPU reference. NVRTC has no host headers (<cstdint> etc.), so the
// typedefs are spelled out here instead of taken from <stdint.h>.
#pragma once

#if defined(__CUDACC__)
#define QF_HD __host__ __device__ __forceinline__
#else
#define QF_HD inline
#endif

namespace qf {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
using i8 = signed char;
using i32 = int;
using i64 = long long;

static_assert(sizeof(u8) == 1 && sizeof(u16) == 2 && sizeof(u32) == 4 && sizeof(u64) == 8,
              "qforge assumes LP64/LLP64-like integer widths");

}  // namespace qf
