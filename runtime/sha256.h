// SHA-256 (FIPS 180-4), incremental. Used for content-addressed kernel-cache keys and to check
// cached images on load; not a security boundary.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qf::rt {

class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, size_t size);
  Sha256& update(std::string_view s) { return update(s.data(), s.size()); }
  // Hashes the length (8 bytes, little endian) then the bytes: unambiguous framing for a sequence
  // of fields, so ("ab","c") and ("a","bc") differ.
  Sha256& field(std::string_view s);
  std::array<uint8_t, 32> digest();  // finishes; the object must not be updated afterwards
  std::string hex_digest();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
  bool done_ = false;
};

std::string sha256_hex(std::string_view data);

}  // namespace qf::rt
