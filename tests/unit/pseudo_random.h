// pseudo_random(n, r, seed): n floats uniform in [-r, r) from a 32-bit LCG, the same on every
// machine (no <random> distribution, whose output the standard leaves to the library).
#pragma once
#include <cstdint>
#include <vector>

namespace qf::testing {

inline std::vector<float> pseudo_random(int64_t n, float r, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = (float(s >> 8) / float(1u << 24) * 2.0f - 1.0f) * r;
  }
  return v;
}

}  // namespace qf::testing
