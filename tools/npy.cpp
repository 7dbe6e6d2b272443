#include "tools/npy.h"

#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <system_error>

#include "compiler/error.h"

namespace qf::npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr int64_t kMaxHeader = 1 << 20;  // numpy itself refuses headers above 10000 bytes by default

std::string printable(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out += char(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out + "\"";
}

// A parser for the one Python literal an .npy header holds:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string where) : s_(text), where_(std::move(where)) {}

  void parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') {
        ++i_;
        break;
      }
      const std::string key = string_lit();
      expect(':');
      if (key == "descr") {
        skip_ws();
        if (peek() != '\'' && peek() != '"')
          fail("'descr' must be a simple dtype string such as '<f4' (structured dtypes are not supported)");
        descr = string_lit();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        have_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        have_shape = true;
      } else {
        fail("unexpected header key " + printable(key) + " (expected descr, fortran_order, shape)");
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      break;
    }
    skip_ws();
    if (i_ != s_.size()) fail("trailing characters after the header dictionary");
    if (!have_descr || !have_fortran || !have_shape)
      fail(std::string("header lacks the key '") + (!have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape") +
           "'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw UserError(where_, "malformed .npy header: " + what);
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(std::string("expected '") + c + "' at offset " + std::to_string(i_));
    ++i_;
  }
  std::string string_lit() {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string at offset " + std::to_string(i_));
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\') fail("escapes in header strings are not supported");
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  bool boolean() {
    skip_ws();
    if (s_.substr(i_, 4) == "True") return i_ += 4, true;
    if (s_.substr(i_, 5) == "False") return i_ += 5, false;
    fail("'fortran_order' must be True or False");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    while (true) {
      skip_ws();
      if (peek() == ')') {
        ++i_;
        break;
      }
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("'shape' must be a tuple of non-negative integers");
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) fail("a dimension of 'shape' is too large");
        v = v * 10 + (s_[i_++] - '0');
      }
      if (peek() == 'L') ++i_;  // Python 2 longs
      dims.push_back(v);
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect(')');
      break;
    }
    return dims;
  }

  std::string_view s_;
  size_t i_ = 0;
  std::string where_;
};

// Normalizes '=' (native, little-endian here) and the byte order of 1-byte types.
std::string normalize(const std::string& d) {
  if (d.size() < 3) return d;
  std::string n = d;
  if (n[0] == '=') n[0] = '<';
  if ((n[0] == '<' || n[0] == '>') && n.substr(2) == "1") n[0] = '|';
  return n;
}

}  // namespace

int64_t Array::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int itemsize(const std::string& descr) {
  static const std::map<std::string, int> sizes = {
      {"|b1", 1}, {"|u1", 1}, {"|i1", 1}, {"<u2", 2}, {"<i2", 2}, {"<f2", 2}, {"<u4", 4},
      {"<i4", 4}, {"<f4", 4}, {"<u8", 8}, {"<i8", 8}, {"<f8", 8}};
  auto it = sizes.find(descr);
  return it == sizes.end() ? 0 : it->second;
}

Array read(const std::filesystem::path& path, const std::function<void(const std::vector<int64_t>&)>& check_shape) {
  const std::string where = path.string();
  // A pipe or device would block or never end: only regular files (checked before opening).
  std::error_code rc;
  if (std::filesystem::exists(path, rc) && !std::filesystem::is_regular_file(path, rc))
    throw UserError(where, "not a regular file: expected a .npy file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(where, std::string("cannot open for reading: ") + std::strerror(errno));
  std::error_code ec;
  const auto fsize = std::filesystem::file_size(path, ec);
  if (ec) throw UserError(where, "cannot determine the file size: " + ec.message());
  const int64_t file_size = int64_t(fsize);

  char pre[kMagicLen + 2];
  if (file_size < int64_t(sizeof pre) || !f.read(pre, sizeof pre))
    throw UserError(where, "not a .npy file: expected the magic string \\x93NUMPY, but the file has only " +
                               std::to_string(file_size) + " bytes");
  if (std::memcmp(pre, kMagic, kMagicLen) != 0)
    throw UserError(where, "not a .npy file: the magic string \\x93NUMPY is missing");
  const int major = static_cast<unsigned char>(pre[6]), minor = static_cast<unsigned char>(pre[7]);
  if (major < 1 || major > 3)
    throw UserError(where, ".npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                               " is not supported (expected 1.0, 2.0 or 3.0)");
  const int len_bytes = major == 1 ? 2 : 4;
  unsigned char lb[4] = {0, 0, 0, 0};
  if (!f.read(reinterpret_cast<char*>(lb), len_bytes))
    throw UserError(where, "truncated .npy file: the header length is missing");
  int64_t header_len = int64_t(lb[0]) | int64_t(lb[1]) << 8 | int64_t(lb[2]) << 16 | int64_t(lb[3]) << 24;
  const int64_t data_start = int64_t(kMagicLen) + 2 + len_bytes + header_len;
  if (header_len > kMaxHeader)
    throw UserError(where, "the header claims " + std::to_string(header_len) + " bytes: headers above " +
                               std::to_string(kMaxHeader) + " bytes are not supported");
  if (data_start > file_size)
    throw UserError(where, "truncated or malformed .npy file: the header claims " + std::to_string(header_len) +
                               " bytes, the file has " + std::to_string(file_size) + " bytes in all");
  std::string header(size_t(header_len), '\0');
  if (!f.read(header.data(), header_len)) throw UserError(where, "truncated .npy file: cannot read the header");
  for (char c : header)
    if (static_cast<unsigned char>(c) >= 0x80 || c == '\0')
      throw UserError(where, "malformed .npy header: non-ASCII bytes");

  Array a;
  bool fortran = false;
  std::string raw_descr;
  HeaderParser(header, where).parse(raw_descr, fortran, a.shape);
  a.descr = normalize(raw_descr);
  if (!a.descr.empty() && a.descr[0] == '>')
    throw UserError(where, "big-endian data (descr " + printable(raw_descr) +
                               ") is not supported: expected little-endian, e.g. '<f4'");
  const int isz = itemsize(a.descr);
  if (isz == 0)
    throw UserError(where, "unsupported dtype descr " + printable(raw_descr) +
                               ": expected one of '<f4', '<f2', '<u2', '|u1', '<i4' (numeric little-endian types)");
  if (fortran)
    throw UserError(where, "fortran_order True (column-major data) is not supported: expected a C-order array "
                           "(numpy.ascontiguousarray)");

  if (check_shape) check_shape(a.shape);
  // Bytes the shape needs (without overflow), against what the file holds.
  const int64_t avail = file_size - data_start;
  int64_t n = 1, need = 0;
  bool too_big = false;
  for (int64_t d : a.shape) too_big |= __builtin_mul_overflow(n, d, &n);
  too_big |= __builtin_mul_overflow(n, int64_t(isz), &need);
  if (n == 0) too_big = false, need = 0;
  std::string shape_str = "(";
  for (size_t i = 0; i < a.shape.size(); ++i) shape_str += (i ? ", " : "") + std::to_string(a.shape[i]);
  shape_str += a.shape.size() == 1 ? ",)" : ")";
  if (too_big || need != avail)
    throw UserError(where, "the data size does not match the header: shape " + shape_str + " of " + a.descr +
                               " needs " + (too_big ? std::string("more than 2^63") : std::to_string(need)) +
                               " bytes, the file holds " + std::to_string(avail) + " after the header");
  a.data.resize(size_t(n * isz));
  if (n > 0 && !f.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(a.data.size())))
    throw UserError(where, "truncated .npy file: cannot read the data");
  return a;
}

void write(const std::filesystem::path& path, const std::string& descr, std::span<const int64_t> shape,
           std::span<const uint8_t> data) {
  const std::string where = path.string();
  const int isz = itemsize(descr);
  if (isz == 0) throw InternalError(__FILE__, __LINE__, "npy::write: unsupported descr " + descr);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n * isz != int64_t(data.size()))
    throw InternalError(__FILE__, __LINE__,
                        "npy::write: " + std::to_string(data.size()) + " bytes for " + std::to_string(n) + " elements");

  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(shape[i]);
  dict += shape.size() == 1 ? ",), }" : "), }";
  // Pad with spaces so that magic + version + length + header + '\n' is a multiple of 64.
  int version = 1;
  size_t prefix = kMagicLen + 2 + 2;
  size_t total = prefix + dict.size() + 1;
  if ((total + 63) / 64 * 64 - prefix > 0xFFFF) version = 2, prefix = kMagicLen + 2 + 4, total = prefix + dict.size() + 1;
  const size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict += '\n';
  const uint32_t hlen = uint32_t(dict.size());

  std::string head(kMagic, kMagicLen);
  head += char(version);
  head += char(0);
  head += char(hlen & 0xFF);
  head += char((hlen >> 8) & 0xFF);
  if (version == 2) {
    head += char((hlen >> 16) & 0xFF);
    head += char((hlen >> 24) & 0xFF);
  }
  head += dict;

  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw UserError(where, std::string("cannot open for writing: ") + std::strerror(errno));
    f.write(head.data(), std::streamsize(head.size()));
    if (!data.empty()) f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
    f.close();
    if (!f) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw UserError(where, "write failed (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw UserError(where, "cannot rename the temporary file into place: " + ec.message());
  }
}

}  // namespace qf::npy
