// A small structured writer for generated CUDA: scopes with indentation, named constants,
// comments. Values reach the text only through typed overloads (numbers, bools, enum-derived
// identifiers), never as raw recipe strings.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace qf {

class Emitter {
 public:
  // One line at the current indentation.
  void line(std::string_view text);
  void blank() { out_ += "\n"; }
  void comment(std::string_view text);
  // "head {" ... "}tail"
  void open(std::string_view head);
  void close(std::string_view tail = "");

  // static constexpr <type> <name> = <value>;
  void constant(std::string_view name, int64_t v);
  void constant(std::string_view name, bool v);
  void constant(std::string_view name, float v);    // exact hex-float literal
  void constant_u32(std::string_view name, uint32_t v);
  // static constexpr int <name> = <identifier>;  (identifier from a fixed table)
  void constant_ident(std::string_view type, std::string_view name, std::string_view ident);
  // using <name> = <type>;  (type from a fixed table)
  void alias(std::string_view name, std::string_view type);

  const std::string& str() const { return out_; }

  // Exact C++ literal for a float ("0x1.8p+3f", "INFINITY" never occurs: values are finite).
  static std::string float_literal(float v);

 private:
  void indent();
  std::string out_;
  int depth_ = 0;
};

}  // namespace qf
