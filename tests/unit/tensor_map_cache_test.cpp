// Tests of runtime/tensor_map_cache.h: the GEMMs' cache of encoded TMA tensor maps.
//
// Off-GPU: the key compares (and hashes) every encode argument, so a request that differs in any
// one of them, the address included, is encoded anew; an equal request is answered with the bytes
// the encoder gave, without calling it; failures are not kept; the bound empties the cache. The
// encoder is a stand-in that writes bytes derived from the whole key and counts its calls. With a
// driver: the cache's maps are byte for byte what cuTensorMapEncodeTiled gives, also for an
// address that the allocator hands out again for a tensor of another shape.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/driver.h"
#include "runtime/gpu_test_util.h"
#include "runtime/tensor_map_cache.h"

namespace qf::rt {
namespace {

std::atomic<int> g_encodes{0};
std::atomic<uint64_t> g_fail_address{~uint64_t(0)};

// A stand-in for the driver: the map's bytes are the key's hash and address repeated (so maps of
// different keys differ), or an error for the address g_fail_address.
CUresult fake_encode(CUtensorMap* out, const TensorMapKey& key) {
  ++g_encodes;
  if (key.address == g_fail_address.load()) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t words[2] = {uint64_t(TensorMapKeyHash{}(key)), key.address};
  for (size_t at = 0; at + sizeof words <= sizeof(CUtensorMap); at += sizeof words)
    std::memcpy(reinterpret_cast<char*>(out) + at, words, sizeof words);
  return CUDA_SUCCESS;
}

// A rank-2 request as the GEMM's A operand makes it.
TensorMapKey a_key(uint64_t address = 0x7f0000000000) {
  TensorMapKey k;
  k.type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  k.rank = 2;
  k.address = address;
  k.dims = {1024, 1024, 0, 0, 0};
  k.strides = {1024, 0, 0, 0};
  k.box = {128, 128, 0, 0, 0};
  k.elem_strides = {1, 1, 0, 0, 0};
  k.interleave = CU_TENSOR_MAP_INTERLEAVE_NONE;
  k.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  k.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  k.oob_fill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
  return k;
}

bool same_bytes(const CUtensorMap& a, const CUtensorMap& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// One change of each field the encode takes.
std::vector<std::function<void(TensorMapKey&)>> each_field_changed() {
  return {
      [](TensorMapKey& k) { k.type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; },
      [](TensorMapKey& k) { k.rank = 3; },
      [](TensorMapKey& k) { k.address += 256; },
      [](TensorMapKey& k) { k.dims[0] = 512; },
      [](TensorMapKey& k) { k.dims[1] = 2048; },
      [](TensorMapKey& k) { k.dims[4] = 1; },
      [](TensorMapKey& k) { k.strides[0] = 2048; },
      [](TensorMapKey& k) { k.strides[3] = 16; },
      [](TensorMapKey& k) { k.box[0] = 64; },
      [](TensorMapKey& k) { k.box[1] = 64; },
      [](TensorMapKey& k) { k.elem_strides[1] = 2; },
      [](TensorMapKey& k) { k.interleave = CU_TENSOR_MAP_INTERLEAVE_16B; },
      [](TensorMapKey& k) { k.swizzle = CU_TENSOR_MAP_SWIZZLE_64B; },
      [](TensorMapKey& k) { k.l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_NONE; },
      [](TensorMapKey& k) { k.oob_fill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA; },
  };
}

TEST(TensorMapKey, EqualKeysHashEqual) {
  EXPECT_EQ(a_key(), a_key());
  EXPECT_EQ(TensorMapKeyHash{}(a_key()), TensorMapKeyHash{}(a_key()));
}

TEST(TensorMapKey, EveryFieldTakesPart) {
  const auto changes = each_field_changed();
  for (size_t i = 0; i < changes.size(); ++i) {
    TensorMapKey k = a_key();
    changes[i](k);
    EXPECT_FALSE(k == a_key()) << "change " << i;
    // Not a guarantee of any hash, but these single-field changes must not all collide.
    EXPECT_NE(TensorMapKeyHash{}(k), TensorMapKeyHash{}(a_key())) << "change " << i;
  }
}

TEST(TensorMapCache, EqualRequestIsCopiedNotEncoded) {
  TensorMapCache cache(16, fake_encode);
  g_encodes = 0;
  CUtensorMap first, again, direct;
  ASSERT_EQ(cache.get(a_key(), &first), CUDA_SUCCESS);
  ASSERT_EQ(cache.get(a_key(), &again), CUDA_SUCCESS);
  ASSERT_EQ(fake_encode(&direct, a_key()), CUDA_SUCCESS);
  EXPECT_EQ(g_encodes.load(), 2);  // the cache's one, and the direct one
  EXPECT_TRUE(same_bytes(first, direct));
  EXPECT_TRUE(same_bytes(again, direct));
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 1u);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(TensorMapCache, AnyChangedFieldIsEncodedAnew) {
  TensorMapCache cache(64, fake_encode);
  CUtensorMap base, m, direct;
  ASSERT_EQ(cache.get(a_key(), &base), CUDA_SUCCESS);
  const auto changes = each_field_changed();
  for (size_t i = 0; i < changes.size(); ++i) {
    TensorMapKey k = a_key();
    changes[i](k);
    g_encodes = 0;
    ASSERT_EQ(cache.get(k, &m), CUDA_SUCCESS);
    EXPECT_EQ(g_encodes.load(), 1) << "change " << i;
    ASSERT_EQ(fake_encode(&direct, k), CUDA_SUCCESS);
    EXPECT_TRUE(same_bytes(m, direct)) << "change " << i;
  }
  EXPECT_EQ(cache.size(), 1 + changes.size());
  EXPECT_EQ(cache.hits(), 0u);
}

// The caching allocator reuses an address for a tensor of another shape: another key, its own
// map; the first tensor's map is still the right one for the first shape at that address.
TEST(TensorMapCache, ReusedAddressWithAnotherShapeIsAnotherMap) {
  TensorMapCache cache(16, fake_encode);
  TensorMapKey wide = a_key(0x7f0000100000), narrow = wide;
  narrow.dims[1] = 256;
  CUtensorMap mw, mn, mw2;
  ASSERT_EQ(cache.get(wide, &mw), CUDA_SUCCESS);
  ASSERT_EQ(cache.get(narrow, &mn), CUDA_SUCCESS);
  EXPECT_FALSE(same_bytes(mw, mn));
  ASSERT_EQ(cache.get(wide, &mw2), CUDA_SUCCESS);
  EXPECT_TRUE(same_bytes(mw, mw2));
  EXPECT_EQ(cache.misses(), 2u);
  EXPECT_EQ(cache.hits(), 1u);
}

TEST(TensorMapCache, FailuresAreNotKept) {
  TensorMapCache cache(16, fake_encode);
  g_fail_address = 0x1234;
  g_encodes = 0;
  CUtensorMap out;
  std::memset(&out, 0xAB, sizeof out);
  CUtensorMap untouched = out;
  EXPECT_EQ(cache.get(a_key(0x1234), &out), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cache.get(a_key(0x1234), &out), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(g_encodes.load(), 2);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_TRUE(same_bytes(out, untouched));
  g_fail_address = ~uint64_t(0);
}

TEST(TensorMapCache, FullCacheIsEmptied) {
  TensorMapCache cache(4, fake_encode);
  CUtensorMap m;
  for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(cache.get(a_key(0x10000 * (i + 1)), &m), CUDA_SUCCESS);
  EXPECT_EQ(cache.size(), 4u);
  ASSERT_EQ(cache.get(a_key(0x10000 * 9), &m), CUDA_SUCCESS);
  EXPECT_EQ(cache.size(), 1u);
  g_encodes = 0;
  ASSERT_EQ(cache.get(a_key(0x10000 * 9), &m), CUDA_SUCCESS);
  EXPECT_EQ(g_encodes.load(), 0);
  ASSERT_EQ(cache.get(a_key(0x10000), &m), CUDA_SUCCESS);  // emptied: encoded again
  EXPECT_EQ(g_encodes.load(), 1);
}

TEST(TensorMapCache, CapacityZeroKeepsNothing) {
  TensorMapCache cache(0, fake_encode);
  g_encodes = 0;
  CUtensorMap m;
  ASSERT_EQ(cache.get(a_key(), &m), CUDA_SUCCESS);
  ASSERT_EQ(cache.get(a_key(), &m), CUDA_SUCCESS);
  EXPECT_EQ(g_encodes.load(), 2);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(TensorMapCache, ConcurrentRequestsGetTheirOwnMaps) {
  TensorMapCache cache(1024, fake_encode);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const TensorMapKey k = a_key(0x100000 + 256 * uint64_t((i * 7 + t) % 97));
        CUtensorMap m, direct;
        if (cache.get(k, &m) != CUDA_SUCCESS || fake_encode(&direct, k) != CUDA_SUCCESS || !same_bytes(m, direct)) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(cache.size(), 97u);
  EXPECT_EQ(cache.hits() + cache.misses(), 8000u);
}

// Without a driver the real encoder says so (as the GEMM's check reports it), and nothing is kept.
TEST(TensorMapCache, DriverEncoderWithoutDriver) {
  if (driver().available()) GTEST_SKIP() << "a driver is loaded (the GPU test below covers it)";
  TensorMapCache cache(16);
  CUtensorMap m;
  EXPECT_EQ(cache.get(a_key(), &m), driver().unavailable_code());
  EXPECT_EQ(cache.size(), 0u);
}

// The cache's maps are the driver's bytes, also for an address handed out again for a tensor
// of another shape (a caching allocator's reuse, here cuMemFree + cuMemAlloc).
TEST(TensorMapCacheGpu, MapsAreTheDriversBytes) {
  QF_SKIP_WITHOUT_GPU();
  TensorMapCache cache(16);
  uint64_t address = 0;
  {
    DeviceBuffer b(1 << 20);
    address = b.address();
    TensorMapKey k = a_key(address);
    CUtensorMap cached, again, direct;
    ASSERT_EQ(cache.get(k, &cached), CUDA_SUCCESS);
    ASSERT_EQ(cache.get(k, &again), CUDA_SUCCESS);
    ASSERT_EQ(encode_tensor_map_with_driver(&direct, k), CUDA_SUCCESS);
    EXPECT_TRUE(same_bytes(cached, direct));
    EXPECT_TRUE(same_bytes(again, direct));
    EXPECT_EQ(cache.hits(), 1u);
  }
  DeviceBuffer b2(1 << 19);  // often the same address
  TensorMapKey k2 = a_key(b2.address());
  k2.dims[1] = 512;
  CUtensorMap cached, direct;
  ASSERT_EQ(cache.get(k2, &cached), CUDA_SUCCESS);
  ASSERT_EQ(encode_tensor_map_with_driver(&direct, k2), CUDA_SUCCESS);
  EXPECT_TRUE(same_bytes(cached, direct));
  EXPECT_EQ(cache.misses(), 2u);
  (void)address;
}

}  // namespace
}  // namespace qf::rt
