// Encoded TMA tensor maps, kept per encoding request (the GEMM's per-call hot path).
//
// cuTensorMapEncodeTiled is a pure host function of its arguments: the same data type, rank,
// global address, dims, byte strides, box, element strides, interleave, swizzle, L2 promotion
// and out-of-bounds fill give the same 128 bytes (no context, device or stream enters it). A GEMM
// call encodes two or three maps, each a driver call of about a microsecond; a training step
// repeats the same operands at the same addresses (torch's caching allocator hands a recurring
// shape the same block), so the map of an equal request is copied instead of encoded again.
//
// The key is every argument the encode takes, the address included: an address reused by the
// caching allocator for another tensor is another key unless every other field matches too, and
// then the map is the same bytes either way. Nothing is invalidated when memory is freed: a map
// holds no reference to the memory, only the numbers it was encoded from. A failed encode is not
// kept (the next request encodes, and fails, again). The cache is bounded: when full it is
// emptied (a steady workload refills it with the maps it uses).
//
// CUDA graphs: a captured launch copies its parameters (the maps among them) at capture; a map
// from the cache is the same bytes a fresh encode gives, so capture and replay are unchanged.
#pragma once
#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace qf::rt {

// One cuTensorMapEncodeTiled request: every argument but the output. Unused trailing entries of
// the arrays (rank < 5) stay zero, so two requests of one rank compare by their used entries.
struct TensorMapKey {
  CUtensorMapDataType type{};
  cuuint32_t rank = 0;  // 1..5
  uint64_t address = 0;
  std::array<cuuint64_t, 5> dims{};
  std::array<cuuint64_t, 4> strides{};  // bytes, of dims 1..rank-1
  std::array<cuuint32_t, 5> box{};
  std::array<cuuint32_t, 5> elem_strides{};
  CUtensorMapInterleave interleave{};
  CUtensorMapSwizzle swizzle{};
  CUtensorMapL2promotion l2_promotion{};
  CUtensorMapFloatOOBfill oob_fill{};

  bool operator==(const TensorMapKey&) const = default;
};

struct TensorMapKeyHash {
  size_t operator()(const TensorMapKey& k) const noexcept;
};

// Encodes a map: the driver's cuTensorMapEncodeTiled with the key's arguments (tests pass their
// own).
using TensorMapEncoder = CUresult (*)(CUtensorMap* out, const TensorMapKey& key);
CUresult encode_tensor_map_with_driver(CUtensorMap* out, const TensorMapKey& key);

class TensorMapCache {
 public:
  explicit TensorMapCache(size_t capacity = 4096, TensorMapEncoder encode = encode_tensor_map_with_driver)
      : capacity_(capacity), encode_(encode) {}
  TensorMapCache(const TensorMapCache&) = delete;
  TensorMapCache& operator=(const TensorMapCache&) = delete;

  // The map of `key` into *out: a copy of the one kept for an equal key, else encoded (and kept
  // on success). Returns the encoder's result; *out is written only on CUDA_SUCCESS.
  // Thread-safe; the lock is not held while encoding.
  CUresult get(const TensorMapKey& key, CUtensorMap* out);

  void clear();
  size_t size() const;
  // Requests answered from the cache / by encoding (failed encodes included), since construction.
  uint64_t hits() const;
  uint64_t misses() const;

 private:
  const size_t capacity_;
  const TensorMapEncoder encode_;
  mutable std::mutex mu_;
  std::unordered_map<TensorMapKey, CUtensorMap, TensorMapKeyHash> maps_;
  uint64_t hits_ = 0, misses_ = 0;
};

// The process-wide cache the GEMMs encode through (never destroyed).
TensorMapCache& tensor_map_cache();

}  // namespace qf::rt
