#include "runtime/tensor_map_cache.h"

#include "runtime/driver.h"

namespace qf::rt {

namespace {
// 64-bit mix (splitmix64's finalizer) folded over the fields.
inline uint64_t mix(uint64_t h, uint64_t v) {
  v += 0x9e3779b97f4a7c15ull + h;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
  return v ^ (v >> 31);
}
}  // namespace

size_t TensorMapKeyHash::operator()(const TensorMapKey& k) const noexcept {
  uint64_t h = mix(0, uint64_t(k.type));
  h = mix(h, k.rank);
  h = mix(h, k.address);
  for (cuuint64_t d : k.dims) h = mix(h, d);
  for (cuuint64_t s : k.strides) h = mix(h, s);
  for (size_t i = 0; i < 5; ++i) h = mix(h, (uint64_t(k.box[i]) << 32) | k.elem_strides[i]);
  h = mix(h, (uint64_t(k.interleave) << 48) ^ (uint64_t(k.swizzle) << 32) ^ (uint64_t(k.l2_promotion) << 16) ^
                 uint64_t(k.oob_fill));
  return size_t(h);
}

CUresult encode_tensor_map_with_driver(CUtensorMap* out, const TensorMapKey& k) {
  const Driver& d = driver();
  if (!d.available()) return d.unavailable_code();
  return d.cuTensorMapEncodeTiled(out, k.type, k.rank, reinterpret_cast<void*>(k.address), k.dims.data(),
                                  k.strides.data(), k.box.data(), k.elem_strides.data(), k.interleave, k.swizzle,
                                  k.l2_promotion, k.oob_fill);
}

CUresult TensorMapCache::get(const TensorMapKey& key, CUtensorMap* out) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (auto it = maps_.find(key); it != maps_.end()) {
      ++hits_;
      *out = it->second;
      return CUDA_SUCCESS;
    }
    ++misses_;
  }
  CUtensorMap map;
  const CUresult r = encode_(&map, key);
  if (r != CUDA_SUCCESS) return r;
  *out = map;
  if (capacity_ == 0) return r;
  std::lock_guard<std::mutex> g(mu_);
  if (maps_.size() >= capacity_) maps_.clear();
  maps_.emplace(key, map);  // a racing request's equal map may be there already: the same bytes
  return r;
}

void TensorMapCache::clear() {
  std::lock_guard<std::mutex> g(mu_);
  maps_.clear();
}

size_t TensorMapCache::size() const {
  std::lock_guard<std::mutex> g(mu_);
  return maps_.size();
}

uint64_t TensorMapCache::hits() const {
  std::lock_guard<std::mutex> g(mu_);
  return hits_;
}

uint64_t TensorMapCache::misses() const {
  std::lock_guard<std::mutex> g(mu_);
  return misses_;
}

TensorMapCache& tensor_map_cache() {
  static TensorMapCache* c = new TensorMapCache;
  return *c;
}

}  // namespace qf::rt
