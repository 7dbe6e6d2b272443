// qf_convert: element conversions of templates/qforge/numerics.cuh over a raw file, for the
// Python numerics tests (tests/numerics/test_conversions.py).
//
// Usage:
//   qf_convert [--bf16-input] <format> <input> <output>
//
//   <input>   raw little-endian float32 values (default), or raw little-endian uint16 bf16 bit
//             patterns with --bf16-input (widened exactly to fp32 first).
//   <format>  e4m3 | e5m2 | e2m1 | e2m3 | e3m2 | int8   encode_rn<F>   -> 1 byte per element
//             (e2m1 in the low 4 bits, e2m3/e3m2 in the low 6 bits, int8 two's complement)
//             e8m0_rne | e8m0_rceil                     e8m0_rne / e8m0_rceil -> 1 byte
//             bf16 | f16                                f32_to_bf16 / f32_to_f16
//                                                       -> 2 bytes little-endian per element
//   <output>  raw bytes as above, elements in input order.
// Exit status 0 on success, 2 on a usage or I/O error.
#include "qforge/numerics.cuh"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: qf_convert [--bf16-input] "
               "<e4m3|e5m2|e2m1|e2m3|e3m2|int8|e8m0_rne|e8m0_rceil|bf16|f16> <input> <output>\n");
  return 2;
}

template <class Fn>
std::vector<unsigned char> map_bytes(const std::vector<float>& in, Fn fn) {
  std::vector<unsigned char> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = fn(in[i]);
  return out;
}

template <class Fn>
std::vector<unsigned char> map_u16(const std::vector<float>& in, Fn fn) {
  std::vector<unsigned char> out(in.size() * 2);
  for (size_t i = 0; i < in.size(); ++i) {
    const qf::u16 h = fn(in[i]);
    out[2 * i] = static_cast<unsigned char>(h & 0xFF);
    out[2 * i + 1] = static_cast<unsigned char>(h >> 8);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int a = 1;
  bool bf16_input = false;
  if (a < argc && std::strcmp(argv[a], "--bf16-input") == 0) {
    bf16_input = true;
    ++a;
  }
  if (argc - a != 3) return usage();
  const std::string fmt = argv[a], in_path = argv[a + 1], out_path = argv[a + 2];

  std::ifstream fin(in_path, std::ios::binary);
  if (!fin) {
    std::fprintf(stderr, "qf_convert: cannot read %s\n", in_path.c_str());
    return 2;
  }
  const std::vector<unsigned char> raw((std::istreambuf_iterator<char>(fin)),
                                       std::istreambuf_iterator<char>());
  const size_t esize = bf16_input ? 2 : 4;
  if (raw.size() % esize != 0) {
    std::fprintf(stderr, "qf_convert: %s: size %zu is not a multiple of %zu\n", in_path.c_str(),
                 raw.size(), esize);
    return 2;
  }
  std::vector<float> in(raw.size() / esize);
  for (size_t i = 0; i < in.size(); ++i) {
    const unsigned char* p = raw.data() + i * esize;
    if (bf16_input) {
      in[i] = qf::bf16_to_f32(static_cast<qf::u16>(p[0] | (p[1] << 8)));
    } else {
      const qf::u32 u = static_cast<qf::u32>(p[0]) | (static_cast<qf::u32>(p[1]) << 8) |
                        (static_cast<qf::u32>(p[2]) << 16) | (static_cast<qf::u32>(p[3]) << 24);
      in[i] = qf::f32_from_bits(u);
    }
  }

  std::vector<unsigned char> out;
  if (fmt == "e4m3") out = map_bytes(in, qf::encode_rn<qf::E4M3>);
  else if (fmt == "e5m2") out = map_bytes(in, qf::encode_rn<qf::E5M2>);
  else if (fmt == "e2m1") out = map_bytes(in, qf::encode_rn<qf::E2M1>);
  else if (fmt == "e2m3") out = map_bytes(in, qf::encode_rn<qf::E2M3>);
  else if (fmt == "e3m2") out = map_bytes(in, qf::encode_rn<qf::E3M2>);
  else if (fmt == "int8") out = map_bytes(in, qf::encode_rn<qf::Int8>);
  else if (fmt == "e8m0_rne") out = map_bytes(in, qf::e8m0_rne);
  else if (fmt == "e8m0_rceil") out = map_bytes(in, qf::e8m0_rceil);
  else if (fmt == "bf16") out = map_u16(in, qf::f32_to_bf16);
  else if (fmt == "f16") out = map_u16(in, qf::f32_to_f16);
  else return usage();

  std::ofstream fout(out_path, std::ios::binary);
  fout.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  if (!fout) {
    std::fprintf(stderr, "qf_convert: cannot write %s\n", out_path.c_str());
    return 2;
  }
  return 0;
}
