#include "compiler/emitter.h"

#include <cmath>
#include <cstdio>

#include "compiler/error.h"

namespace qf {

void Emitter::indent() { out_.append(size_t(depth_) * 2, ' '); }

void Emitter::line(std::string_view text) {
  QF_CHECK(text.find('\n') == std::string_view::npos, "one line at a time");
  indent();
  out_ += text;
  out_ += '\n';
}

void Emitter::comment(std::string_view text) {
  QF_CHECK(text.find('\n') == std::string_view::npos && text.find("*/") == std::string_view::npos,
           "comment text is one line");
  line(std::string("// ") + std::string(text));
}

void Emitter::open(std::string_view head) {
  line(std::string(head) + " {");
  ++depth_;
}

void Emitter::close(std::string_view tail) {
  QF_CHECK(depth_ > 0, "unbalanced close");
  --depth_;
  line("}" + std::string(tail));
}

void Emitter::constant(std::string_view name, int64_t v) {
  line("static constexpr long long " + std::string(name) + " = " + std::to_string(v) + ";");
}
void Emitter::constant(std::string_view name, bool v) {
  line("static constexpr bool " + std::string(name) + " = " + (v ? "true" : "false") + ";");
}
void Emitter::constant(std::string_view name, float v) {
  line("static constexpr float " + std::string(name) + " = " + float_literal(v) + ";");
}
void Emitter::constant_u32(std::string_view name, uint32_t v) {
  line("static constexpr unsigned " + std::string(name) + " = " + std::to_string(v) + "u;");
}
void Emitter::constant_ident(std::string_view type, std::string_view name, std::string_view ident) {
  line("static constexpr " + std::string(type) + " " + std::string(name) + " = " + std::string(ident) + ";");
}
void Emitter::alias(std::string_view name, std::string_view type) {
  line("using " + std::string(name) + " = " + std::string(type) + ";");
}

std::string Emitter::float_literal(float v) {
  QF_CHECK(std::isfinite(v), "non-finite constant in generated code");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%af", double(v));
  return buf;
}

}  // namespace qf
