#include "compiler/recipe.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "compiler/error.h"

namespace qf {

using json = nlohmann::json;

std::string_view name(Direction d) { return d == Direction::Rowwise ? "rowwise" : "columnwise"; }
std::string_view name(Rounding r) { return r == Rounding::Nearest ? "nearest" : "stochastic"; }
std::string_view name(DataLayout l) { return l == DataLayout::RowMajor ? "same" : "transposed"; }
std::string_view name(ScaleLayout l) {
  return l == ScaleLayout::Compact ? "compact" : l == ScaleLayout::Swizzled ? "swizzled" : "mn_major";
}
std::string_view name(Usage u) {
  switch (u) {
    case Usage::Training: return "training";
    case Usage::Inference: return "inference";
    case Usage::Memory: return "memory";
  }
  QF_CHECK(false, "bad Usage");
}
std::optional<Usage> parse_usage(std::string_view s) {
  for (Usage u : {Usage::Training, Usage::Inference, Usage::Memory})
    if (name(u) == s) return u;
  return std::nullopt;
}

namespace {

std::string join(std::span<const std::string_view> items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += i + 1 == items.size() ? " or " : ", ";
    out += '"';
    out += items[i];
    out += '"';
  }
  return out;
}

std::string type_name(const json& j) {
  if (j.is_number_integer() || j.is_number_unsigned()) return "an integer";
  if (j.is_number_float()) return "a number";
  return std::string(j.is_object() ? "an object" : j.is_array() ? "an array" : j.is_string() ? "a string"
                     : j.is_boolean() ? "a boolean" : "null");
}

bool valid_name(std::string_view s, size_t max_len) {
  if (s.empty() || s.size() > max_len) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.';
  });
}

// A JSON value together with its JSON pointer, with typed, checked accessors.
class Node {
 public:
  Node(const json& j, std::string ptr) : j_(j), ptr_(std::move(ptr)) {}
  const std::string& ptr() const { return ptr_; }
  const json& raw() const { return j_; }

  [[noreturn]] void fail(const std::string& what) const { throw UserError(ptr_, what); }

  // Checks that this is an object whose keys are all in `allowed`.
  void expect_object(std::initializer_list<std::string_view> allowed) const {
    if (!j_.is_object()) fail("expected an object, got " + type_name(j_));
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
        std::vector<std::string_view> v(allowed);
        throw UserError(ptr_ + "/" + escape(it.key()),
                        "unknown key \"" + printable(it.key()) + "\"; allowed keys here: " +
                            join(v));
      }
    }
  }
  bool has(std::string_view key) const { return j_.contains(key); }
  Node at(std::string_view key) const {
    if (!j_.contains(key)) fail("missing required key \"" + std::string(key) + "\"");
    return Node(j_.at(std::string(key)), ptr_ + "/" + escape(std::string(key)));
  }
  std::optional<Node> find(std::string_view key) const {
    if (!j_.contains(key)) return std::nullopt;
    return Node(j_.at(std::string(key)), ptr_ + "/" + escape(std::string(key)));
  }
  Node index(size_t i) const { return Node(j_.at(i), ptr_ + "/" + std::to_string(i)); }

  std::string str() const {
    if (!j_.is_string()) fail("expected a string, got " + type_name(j_));
    return j_.get<std::string>();
  }
  bool boolean() const {
    if (!j_.is_boolean()) fail("expected true or false, got " + type_name(j_));
    return j_.get<bool>();
  }
  int64_t integer(int64_t lo, int64_t hi) const {
    int64_t v = 0;
    if (j_.is_number_integer() || j_.is_number_unsigned()) {
      if (j_.is_number_unsigned() && j_.get<uint64_t>() > uint64_t(INT64_MAX))
        fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + j_.dump());
      v = j_.get<int64_t>();
    } else if (j_.is_number_float()) {
      // A number without a fractional part is an integer, as JSON Schema (and the schema) say: 4096.0.
      const double d = j_.get<double>();
      if (!(d == std::floor(d)) || !(std::fabs(d) < 9.0e18) || d < double(lo) || d > double(hi))
        fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + j_.dump());
      v = int64_t(d);
    } else {
      fail("expected an integer, got " + type_name(j_));
    }
    if (v < lo || v > hi)
      fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
           "], got " + std::to_string(v));
    return v;
  }
  double number() const {
    if (!j_.is_number()) fail("expected a number, got " + type_name(j_));
    return j_.get<double>();
  }
  template <class E>
  E choice(std::initializer_list<std::pair<std::string_view, E>> options) const {
    std::string s = str();
    for (auto& [n, e] : options)
      if (n == s) return e;
    std::vector<std::string_view> names;
    for (auto& [n, e] : options) names.push_back(n);
    fail("unknown value \"" + printable(s) + "\"; expected " + join(names));
  }

  // Keeps user text out of messages' control characters (one-line errors).
  static std::string printable(std::string_view s, size_t max_len = 64) {
    std::string out;
    for (char c : s.substr(0, max_len)) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        out += '?';
      else
        out += c;
    }
    if (s.size() > max_len) out += "...";
    return out;
  }

 private:
  static std::string escape(const std::string& key) {  // RFC 6901
    std::string out;
    for (char c : key) {
      if (c == '~') out += "~0";
      else if (c == '/') out += "~1";
      else out += c;
    }
    return printable(out);
  }
  const json& j_;
  std::string ptr_;
};

BlockShape parse_block(const Node& n) {
  if (!n.raw().is_array() || n.raw().size() != 2)
    n.fail("expected [rows, cols], an array of two integers, got " + type_name(n.raw()));
  return BlockShape{int(n.index(0).integer(1, 4096)), int(n.index(1).integer(1, 4096))};
}

std::string block_str(BlockShape b) {
  return "[" + std::to_string(b.rows) + "," + std::to_string(b.cols) + "]";
}

bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

// Checks the block geometry of a mode against the direction it is used in.
void check_block(const Node& n, const Scaling& s, BlockShape b, Direction dir) {
  const auto& t = traits(s);
  const std::string got = "got " + block_str(b) + "; allowed: " + std::string(t.allowed_blocks);
  auto oriented = [&](BlockShape one_d) {
    if (dir == Direction::Rowwise) return b == one_d;
    return b == BlockShape{one_d.cols, one_d.rows};
  };
  if (std::holds_alternative<MxScaling>(s)) {
    if (!(oriented({1, 32}) || b == BlockShape{32, 32})) n.fail("bad MX block for " + std::string(name(dir)) + ": " + got);
  } else if (std::holds_alternative<Nvfp4Scaling>(s)) {
    if (!(oriented({1, 16}) || b == BlockShape{16, 16})) n.fail("bad NVFP4 block for " + std::string(name(dir)) + ": " + got);
  } else {
    if (b.rows == 1 && b.cols == 1) n.fail("a block of one element is not a block; " + got);
    if (!b.is_2d()) {
      const bool along_k = b.rows == 1;
      if (along_k != (dir == Direction::Rowwise))
        n.fail(std::string(name(dir)) + " 1D blocks run along " +
               (dir == Direction::Rowwise ? "K ([1,L])" : "M ([L,1])") + "; " + got);
    }
    for (int v : {b.rows, b.cols})
      if (v != 1 && (!is_pow2(v) || v < 16 || v > 512))
        n.fail("block sides must be powers of two in [16, 512] (they must divide the kernel tile); " + got);
  }
}

Scaling parse_scaling(const Node& n, ElemFormat fmt, Direction dir) {
  if (n.raw().is_string()) {
    // Shorthand for modes without parameters: "per_tensor_current", "per_channel", ...
  } else {
    n.expect_object({"mode", "epsilon", "pow2", "margin", "history_length", "amax_compute",
                     "block", "rule"});
  }
  const Node mode_node = n.raw().is_string() ? n : n.at("mode");
  const std::string mode = mode_node.str();

  Scaling s;
  std::vector<std::string_view> keys;  // the keys this mode accepts
  if (mode == "none") {
    s = NoScaling{};
  } else if (mode == "per_tensor_current") {
    s = PerTensorCurrent{};
    keys = {"epsilon", "pow2"};
  } else if (mode == "per_tensor_delayed") {
    s = PerTensorDelayed{};
    keys = {"margin", "history_length", "amax_compute"};
  } else if (mode == "per_channel") {
    s = PerChannel{};
    keys = {"epsilon", "pow2"};
    if (traits(fmt).is_int)
      for (const char* k : {"epsilon", "pow2"})
        if (n.raw().is_object() && n.raw().contains(k))
          n.at(k).fail(std::string("int8 per_channel scales follow torchao's rule (amax / 127 in the input dtype); \"") +
                       k + "\" applies to fp8 per_channel scaling");
  } else if (mode == "block") {
    s = BlockScaling{};
    keys = {"block", "epsilon", "pow2"};
  } else if (mode == "mx") {
    s = MxScaling{};
    keys = {"block", "rule"};
  } else if (mode == "nvfp4") {
    s = Nvfp4Scaling{};
    keys = {"block"};
  } else {
    mode_node.fail("unknown scaling mode \"" + Node::printable(mode) +
                   "\"; expected \"none\", \"per_tensor_current\", \"per_tensor_delayed\", "
                   "\"per_channel\", \"block\", \"mx\" or \"nvfp4\"");
  }

  if (n.raw().is_object()) {
    for (auto it = n.raw().begin(); it != n.raw().end(); ++it) {
      if (it.key() == "mode") continue;
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end())
        n.at(it.key()).fail("key \"" + it.key() + "\" does not apply to scaling mode \"" + mode +
                            "\"" + (keys.empty() ? "" : "; allowed: " + join(keys)));
    }
    std::visit(
        [&](auto& m) {
          using M = std::decay_t<decltype(m)>;
          if constexpr (requires { m.epsilon; }) {
            if (auto e = n.find("epsilon")) {
              double v = e->number();
              if (!(v >= 0 && v < 1e30)) e->fail("epsilon must be >= 0 and below 1e30, got " + e->raw().dump());
              m.epsilon = float(v);
            }
          }
          if constexpr (requires { m.pow2; }) {
            if (auto p = n.find("pow2")) m.pow2 = p->boolean();
          }
          if constexpr (std::is_same_v<M, PerTensorDelayed>) {
            if (auto v = n.find("margin")) m.margin = int(v->integer(0, 64));
            if (auto v = n.find("history_length")) m.history_length = int(v->integer(1, 65536));
            if (auto v = n.find("amax_compute"))
              m.amax_compute = v->choice<AmaxCompute>(
                  {{"max", AmaxCompute::Max}, {"most_recent", AmaxCompute::MostRecent}});
          }
          if constexpr (std::is_same_v<M, MxScaling>) {
            if (auto v = n.find("rule"))
              m.rule = v->choice<MxRule>({{"rceil", MxRule::RCeil}, {"floor", MxRule::Floor}});
          }
          if constexpr (requires { m.block; }) {
            // Default: the direction's 1D block of the mode's natural length.
            int len = std::is_same_v<M, MxScaling> ? 32 : std::is_same_v<M, Nvfp4Scaling> ? 16 : 128;
            m.block = dir == Direction::Rowwise ? BlockShape{1, len} : BlockShape{len, 1};
            if (auto v = n.find("block")) {
              m.block = parse_block(*v);
              check_block(*v, s, m.block, dir);
            }
          }
        },
        s);
  } else if (!keys.empty() && (mode == "block" || mode == "mx" || mode == "nvfp4")) {
    // String shorthand for block modes uses the default 1D block of the direction.
    std::visit(
        [&](auto& m) {
          using M = std::decay_t<decltype(m)>;
          if constexpr (requires { m.block; }) {
            int len = std::is_same_v<M, MxScaling> ? 32 : std::is_same_v<M, Nvfp4Scaling> ? 16 : 128;
            m.block = dir == Direction::Rowwise ? BlockShape{1, len} : BlockShape{len, 1};
          }
        },
        s);
  }

  const auto& t = traits(s);
  if (std::find(t.formats.begin(), t.formats.end(), fmt) == t.formats.end()) {
    std::vector<std::string_view> ok;
    for (ElemFormat f : t.formats) ok.push_back(traits(f).name);
    mode_node.fail("scaling mode \"" + mode + "\" cannot be used with format \"" +
                   std::string(traits(fmt).name) + "\"; it takes " + join(ok));
  }
  return s;
}

DirectionSpec parse_direction(const Node& n, Direction dir) {
  n.expect_object({"format", "scaling", "rounding", "rht", "layout", "scale_layout", "dtype",
                   "comment"});
  DirectionSpec d;
  const Node fmt = n.at("format");
  const std::string fname = fmt.str();
  auto f = parse_format(fname);
  if (!f) {
    std::vector<std::string_view> names;
    for (const auto& t : all_formats()) names.push_back(t.name);
    fmt.fail("unknown format \"" + Node::printable(fname) + "\"; expected " + join(names));
  }
  d.format = *f;
  if (auto c = n.find("comment")) (void)c->str();

  if (d.format == ElemFormat::Identity) {
    if (auto s = n.find("scaling")) d.scaling = parse_scaling(*s, d.format, dir);
    if (auto t = n.find("dtype")) {
      std::string dn = t->str();
      if (dn != "input") {
        auto dt = parse_dtype(dn);
        if (!dt) t->fail("unknown dtype \"" + Node::printable(dn) + "\"; expected \"input\", \"bf16\", \"fp16\" or \"fp32\"");
        d.out_dtype = *dt;
      }
    }
  } else {
    d.scaling = parse_scaling(n.at("scaling"), d.format, dir);
    if (auto t = n.find("dtype")) t->fail("\"dtype\" applies to format \"identity\" only");
  }

  if (auto r = n.find("rounding")) {
    d.rounding = r->choice<Rounding>({{"nearest", Rounding::Nearest}, {"stochastic", Rounding::Stochastic}});
    if (d.rounding == Rounding::Stochastic && !traits(d.format).stochastic_rounding_ok) {
      std::vector<std::string_view> ok;
      for (const auto& t : all_formats())
        if (t.stochastic_rounding_ok) ok.push_back(t.name);
      r->fail("stochastic rounding is not defined for format \"" +
              std::string(traits(d.format).name) + "\"; it is for " + join(ok));
    }
  }

  if (auto r = n.find("rht")) {
    bool on = false;
    Rht rht;
    if (r->raw().is_boolean()) {
      on = r->boolean();
    } else {
      r->expect_object({"sign_mask"});
      on = true;
      if (auto m = r->find("sign_mask")) {
        std::string s = m->str();
        char* end = nullptr;
        unsigned long v = 0;
        bool ok = s.size() > 2 && s.size() <= 6 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
        // strtoul alone would also take a sign or spaces ("0x-1" -> 0xFFFFFFFF).
        ok = ok && std::all_of(s.begin() + 2, s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
        if (ok) {
          v = std::strtoul(s.c_str() + 2, &end, 16);
          ok = end && *end == '\0';
        }
        if (!ok) m->fail("expected a 16-bit hex string such as \"0xD7E8\", got \"" + Node::printable(s) + "\"");
        rht.sign_mask = uint32_t(v);
      }
    }
    if (on) {
      if (dir == Direction::Rowwise)
        r->fail("the random Hadamard transform runs along M, in groups of 16: it applies to "
                "the columnwise direction only");
      if (d.format == ElemFormat::Identity || d.format == ElemFormat::Int8)
        r->fail("the random Hadamard transform needs a floating-point quantized format, not \"" +
                std::string(traits(d.format).name) + "\"");
      if (std::holds_alternative<BlockScaling>(d.scaling) ||
          std::holds_alternative<PerChannel>(d.scaling))
        r->fail("the random Hadamard transform is supported with per-tensor, mx and nvfp4 scaling, "
                "not \"" + std::string(scaling_name(d.scaling)) + "\"");
      if (auto b = block_of(d.scaling); b && b->is_2d())
        r->fail("the random Hadamard transform cannot be combined with 2D block scaling (" +
                block_str(*b) + "): each rotated group would straddle the shared tiles");
      d.rht = rht;
    }
  }

  if (auto l = n.find("layout")) {
    if (dir == Direction::Rowwise)
      l->fail("\"layout\" applies to the columnwise direction only (rowwise data is always [M, K])");
    d.layout = l->choice<DataLayout>({{"transposed", DataLayout::Transposed}, {"same", DataLayout::RowMajor}});
    // The kernels' same-layout columnwise walk writes one element per thread; e2m1 packs two
    // elements of a row into a byte (elements of two columns), so its copy must be transposed.
    if (d.layout == DataLayout::RowMajor && traits(d.format).elems_per_byte == 2)
      l->fail("a same-layout " + std::string(traits(d.format).name) +
              " copy packs two columns' elements in a byte, which the columnwise walk writes one at a time; "
              "expected \"transposed\" (the default) for this format");
  } else {
    d.layout = dir == Direction::Rowwise ? DataLayout::RowMajor : DataLayout::Transposed;
  }

  if (auto l = n.find("scale_layout")) {
    d.scale_layout = l->choice<ScaleLayout>(
        {{"compact", ScaleLayout::Compact}, {"swizzled", ScaleLayout::Swizzled}, {"mn_major", ScaleLayout::MnMajor}});
    if (d.scale_layout == ScaleLayout::Swizzled && !traits(d.scaling).swizzle_ok)
      l->fail("the GEMM-swizzled 128x4 scale layout exists for \"mx\" and \"nvfp4\" scaling only, not \"" +
              std::string(scaling_name(d.scaling)) + "\"");
    if (d.scale_layout == ScaleLayout::MnMajor) {
      const auto b = block_of(d.scaling);
      const bool ok = traits(d.scaling).mn_major_ok && b && !b->is_2d();
      if (!ok)
        l->fail("the mn_major scale layout exists for \"block\" and \"mx\" scaling with 1D blocks (1x128, 128x1, 1x32, 32x1) only, not \"" +
                std::string(scaling_name(d.scaling)) + "\"" + (b && traits(d.scaling).mn_major_ok ? " with " + block_str(*b) + " blocks" : ""));
      if (dir == Direction::Columnwise && d.layout != DataLayout::Transposed)
        l->fail("the mn_major scale layout is for K-major data: a columnwise copy needs \"layout\": \"transposed\"");
    }
  }
  return d;
}

RolePattern parse_pattern(const Node& n) {
  std::string s = n.str();
  RolePattern p;
  try {
    p.parts = parse_role(s, n.ptr());
  } catch (const UserError&) {
    n.fail("bad role pattern \"" + Node::printable(s) +
           "\"; expected module_type:tensor_type[:name], each part a name of 1-64 characters ([A-Za-z0-9_.-]) or \"*\", "
           "e.g. \"linear:weight\" or \"*:grad_output\"");
  }
  return p;
}

// nlohmann's parse error, for a one-line message: from "syntax error" on, with the text it
// quotes ("last read: '...'", the input up to the error, which may be a whole long string with
// DEL or other raw bytes) cut and made printable like every other piece of recipe text.
std::string syntax_message(const std::string& what) {
  const auto start = what.find("syntax error");
  std::string msg = start == std::string::npos ? what : what.substr(start);
  static constexpr std::string_view kRead = "; last read: '";
  if (const auto r = msg.find(kRead); r != std::string::npos) {
    const size_t from = r + kRead.size();
    // nlohmann may end with "'; expected <token kind>", a few words; the text read, quoted between,
    // can hold that same phrase (the fuzzer put it in a string), so a longer tail is not it.
    size_t to = msg.rfind("'; expected ");
    if (to == std::string::npos || to < from || msg.size() - to > 64) to = msg.size() - (msg.back() == '\'' ? 1 : 0);
    msg = msg.substr(0, from) + Node::printable(std::string_view(msg).substr(from, to - from)) + msg.substr(to);
  }
  return Node::printable(msg, 400);
}

// nlohmann keeps the last of duplicated keys silently; a recipe with a duplicated key is
// almost certainly a mistake, so reject it.
json parse_strict(std::string_view text) {
  // One frame per open container: its keys so far (objects), the current key or index, so
  // that a duplicated key is reported with its JSON pointer.
  struct Frame {
    bool array = false;
    size_t index = 0;
    std::string key;
    std::set<std::string> keys;
  };
  std::vector<Frame> stack;
  std::optional<std::string> duplicate;  // JSON pointer of the first duplicated key
  auto element_done = [&] {
    if (!stack.empty() && stack.back().array) ++stack.back().index;
  };
  // The JSON pointer of the current key or element.
  auto pointer = [&] {
    std::string ptr;
    for (const Frame& g : stack) {
      std::string part = g.array ? std::to_string(g.index) : g.key;
      std::string esc;  // RFC 6901
      for (char c : part) esc += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
      ptr += "/" + esc;
    }
    return ptr;
  };
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    (void)depth;
    switch (ev) {
      case json::parse_event_t::object_start: stack.push_back(Frame{}); break;
      case json::parse_event_t::array_start: stack.emplace_back().array = true; break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        element_done();
        break;
      case json::parse_event_t::value: element_done(); break;
      case json::parse_event_t::key:
        if (!stack.empty()) {
          Frame& f = stack.back();
          f.key = parsed.get<std::string>();
          if (!f.keys.insert(f.key).second && !duplicate) duplicate = pointer();
        }
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::parse_error& e) {
    size_t byte = e.byte == 0 ? 0 : e.byte - 1;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < byte && i < text.size(); ++i) {
      if (text[i] == '\n') { ++line; col = 1; } else { ++col; }
    }
    throw UserError("", "JSON syntax error at line " + std::to_string(line) + ", column " +
                            std::to_string(col) + ": " + syntax_message(e.what()));
  } catch (const json::out_of_range& e) {
    // A number literal beyond double range (1e999): nlohmann fails at that value, so the
    // stack still points at it.
    std::string what = e.what();
    static constexpr std::string_view kNum = "number overflow parsing '";
    const auto n = what.find(kNum);
    const std::string literal = n == std::string::npos ? std::string() : what.substr(n + kNum.size());
    throw UserError(Node::printable(pointer()),
                    "number " + Node::printable(literal.empty() ? literal : literal.substr(0, literal.size() - 1)) +
                        " is out of range (beyond a double)");
  }
  if (duplicate) {
    const std::string key = duplicate->substr(duplicate->rfind('/') + 1);
    throw UserError(Node::printable(*duplicate),
                    "duplicated key \"" + Node::printable(key) + "\" in a JSON object (JSON keeps only one of them)");
  }
  return j;
}

}  // namespace

int RolePattern::specificity() const {
  return int(std::count_if(parts.begin(), parts.end(), [](const std::string& p) { return p != "*"; }));
}
bool RolePattern::matches(const std::array<std::string, 3>& role) const {
  for (int i = 0; i < 3; ++i)
    if (parts[i] != "*" && parts[i] != role[i]) return false;
  return true;
}
std::string RolePattern::str() const {
  std::string s = parts[0] + ":" + parts[1];
  if (parts[2] != "*") s += ":" + parts[2];
  return s;
}

std::array<std::string, 3> parse_role(std::string_view role, std::string_view where) {
  std::array<std::string, 3> parts{"*", "*", "*"};
  size_t n = 0, start = 0;
  for (size_t i = 0; i <= role.size(); ++i) {
    if (i == role.size() || role[i] == ':') {
      if (n == 3) throw UserError(std::string(where), "role \"" + Node::printable(role) + "\" has more than three parts");
      std::string part(role.substr(start, i - start));
      if (part != "*" && !valid_name(part, 64))
        throw UserError(std::string(where), "bad role \"" + Node::printable(role) +
                                                "\"; expected module_type:tensor_type[:name] with parts of [A-Za-z0-9_.-]");
      parts[n++] = part;
      start = i + 1;
    }
  }
  if (n < 2)
    throw UserError(std::string(where), "bad role \"" + Node::printable(role) +
                                            "\"; expected module_type:tensor_type[:name], e.g. linear:weight");
  return parts;
}

// One "gemms" entry: every field of a GemmSpec under its own name (tile fields under "tile");
// the spec's own validation runs here, its field name turned into this entry's JSON pointer.
RecipeGemm parse_gemm(const Node& g) {
  g.expect_object({"scaling", "a_format", "b_format", "layout", "m", "n", "k", "out_dtype", "accumulate", "fast_accum",
                   "scale_layout", "route", "tile", "comment"});
  RecipeGemm out;
  out.pointer = g.ptr();
  GemmSpec& s = out.spec;
  const Node sc = g.at("scaling");
  const std::string scaling = sc.str();
  const auto parsed = parse_gemm_scaling(scaling);
  if (!parsed) {
    std::vector<std::string_view> names;
    for (const auto& t : all_gemm_scalings()) names.push_back(t.name);
    sc.fail("unknown value \"" + Node::printable(scaling) + "\"; expected " + join(names));
  }
  s.scaling = *parsed;
  // fp8 or int8 operands (default e4m3), e2m1 with nvfp4 scaling (the default there), bf16 or
  // fp16 (the identity copies) with none (default bf16), bf16 / fp16 x int8 with channel (default
  // bf16 x int8).
  const bool fp4 = s.scaling == GemmScaling::Nvfp4;
  auto format = [&](const char* key) {
    if (auto n = g.find(key)) {
      if (fp4) n->choice<ElemFormat>({{"e2m1", ElemFormat::E2M1}});
      else if (n->str() == "e2m1")
        n->fail("e2m1 operands take \"scaling\": \"nvfp4\" (got \"" + scaling + "\"); expected e4m3, e5m2, int8, bf16 or fp16 here");
      else
        n->choice<int>({{"e4m3", 0}, {"e5m2", 0}, {"int8", 0}, {"bf16", 0}, {"fp16", 0}});
      return parse_gemm_format(n->str(), key);
    }
    const bool b_side = std::string_view(key) == "b_format";
    const auto other = g.find(b_side ? "a_format" : "b_format");
    return parse_gemm_format(default_gemm_format(s.scaling, b_side, other ? other->str() : ""), key);
  };
  const GemmOperandFormat a_format = format("a_format"), b_format = format("b_format");
  try {
    set_gemm_formats(s, a_format, b_format, "b_format");
  } catch (const UserError& e) {  // a bf16 A with an fp16 B
    throw UserError(g.ptr() + "/" + e.where(), e.message());
  }
  // "m_grouped" (fprop, dgrad; the default): K fixed, token rows at run time. "k_grouped" (wgrad):
  // the output rows m fixed, the tokens (K) split per group at run time; "k_grouped_members": the
  // same on the grouped quantizer's per-member transposed copies.
  if (auto l = g.find("layout"))
    s.layout = l->choice<GemmLayout>({{"m_grouped", GemmLayout::MGrouped},
                                      {"k_grouped", GemmLayout::KGrouped},
                                      {"k_grouped_members", GemmLayout::KGroupedMembers}});
  s.n = g.at("n").integer(1, int64_t(1) << 24);
  if (k_grouped(s.layout)) {
    s.m = g.at("m").integer(1, int64_t(1) << 24);
    if (auto k = g.find("k")) k->fail("a k_grouped GEMM reduces over each group's tokens, given at run time: no \"k\"");
  } else {
    if (auto m = g.find("m")) m->fail("an m_grouped GEMM takes its rows at run time: no \"m\" (it is for \"layout\": \"k_grouped\")");
    s.k = g.at("k").integer(1, int64_t(1) << 24);
  }
  if (auto o = g.find("out_dtype")) s.out_dtype = o->choice<DType>({{"bf16", DType::BF16}, {"fp32", DType::FP32}});
  if (auto a = g.find("accumulate")) s.accumulate = a->boolean();
  if (auto f = g.find("fast_accum")) s.fast_accum = f->boolean();
  if (auto l = g.find("scale_layout"))
    s.scale_layout = l->choice<ScaleLayout>({{"compact", ScaleLayout::Compact}, {"mn_major", ScaleLayout::MnMajor}});
  if (auto r = g.find("route")) s.route = r->choice<GemmRoute>(
      {{"fused", GemmRoute::Fused}, {"dequant", GemmRoute::Dequant}, {"auto", GemmRoute::Auto}});
  if (auto t = g.find("tile")) {
    t->expect_object({"block_m", "block_n", "stages", "multicast", "raster_m", "ordered"});
    auto field = [&](const char* key, int& dst, int hi) {
      if (auto n = t->find(key)) dst = int(n->integer(1, hi));
    };
    field("block_m", s.tile.block_m, 1024);
    field("block_n", s.tile.block_n, 1024);
    field("stages", s.tile.stages, 64);
    field("multicast", s.tile.multicast, 16);
    field("raster_m", s.tile.raster_m, 4096);
    if (auto o = t->find("ordered")) s.tile.ordered = o->boolean() ? 2 : 1;
  }
  if (auto c = g.find("comment")) (void)c->str();
  try {
    validate(s);
  } catch (const UserError& e) {
    // "tile.block_n" -> /gemms/i/tile/block_n
    std::string field = e.where();
    std::replace(field.begin(), field.end(), '.', '/');
    throw UserError(g.ptr() + "/" + field, e.message());
  }
  settle_gemm_route(s);  // auto with nothing to dequantize: the fused kernel, as rt::Gemm runs it
  return out;
}

Recipe parse_recipe(std::string_view text) {
  const json j = parse_strict(text);
  const Node root(j, "");
  root.expect_object({"$schema", "qforge_recipe", "name", "comment", "usage", "roles", "gemms"});
  Recipe r;
  const Node ver = root.at("qforge_recipe");
  const int64_t v = ver.integer(0, 1 << 30);
  if (v != Recipe::kVersion)
    ver.fail("unsupported recipe version " + std::to_string(v) + "; this qforge reads version " +
             std::to_string(Recipe::kVersion));
  const Node nm = root.at("name");
  r.name = nm.str();
  if (!valid_name(r.name, 64)) nm.fail("expected a name of 1-64 characters from [A-Za-z0-9_.-]");
  if (auto c = root.find("comment")) r.comment = c->str();
  if (auto u = root.find("usage"))
    r.usage = u->choice<Usage>({{"training", Usage::Training}, {"inference", Usage::Inference}, {"memory", Usage::Memory}});
  if (auto s = root.find("$schema")) (void)s->str();

  const Node roles = root.at("roles");
  if (!roles.raw().is_array()) roles.fail("expected an array of role rules, got " + type_name(roles.raw()));
  if (roles.raw().empty()) roles.fail("a recipe needs at least one role rule");
  for (size_t i = 0; i < roles.raw().size(); ++i) {
    const Node rn = roles.index(i);
    rn.expect_object({"match", "rowwise", "columnwise", "comment"});
    RoleRule rule;
    rule.pointer = rn.ptr();
    const Node m = rn.at("match");
    if (m.raw().is_array()) {
      if (m.raw().empty()) m.fail("expected at least one role pattern");
      for (size_t k = 0; k < m.raw().size(); ++k) rule.patterns.push_back(parse_pattern(m.index(k)));
    } else {
      rule.patterns.push_back(parse_pattern(m));
    }
    if (auto c = rn.find("comment")) (void)c->str();
    if (auto d = rn.find("rowwise")) rule.rowwise = parse_direction(*d, Direction::Rowwise);
    if (auto d = rn.find("columnwise")) rule.columnwise = parse_direction(*d, Direction::Columnwise);
    if (!rule.rowwise && !rule.columnwise)
      rn.fail("a role rule needs \"rowwise\", \"columnwise\" or both");
    r.roles.push_back(std::move(rule));
  }
  if (auto gs = root.find("gemms")) {
    if (!gs->raw().is_array()) gs->fail("expected an array of GEMM specs, got " + type_name(gs->raw()));
    for (size_t i = 0; i < gs->raw().size(); ++i) r.gemms.push_back(parse_gemm(gs->index(i)));
  }
  // A blockwise or MXFP8 GEMM reads the recipe's 1D block scales in its own scale_layout, so the
  // copies it reads must be written so (else it would read every scale from the wrong place,
  // silently): a K-grouped one (wgrad) the transposed copies (128x1, 32x1) of the input and
  // grad_output roles; an M-grouped one (fprop, dgrad) every role's rowwise copies (1x128, 1x32:
  // A, and MXFP8 fprop's B) and, where B's grids follow the layout too (mn_major_b: MXFP8), the
  // weights' transposed copies (dgrad's B). Checked on every role a rule can serve: the standard
  // roles and each pattern's own, its wildcards standing for a name no pattern gives (and for each
  // standard tensor type), resolved as a call would resolve them.
  std::set<std::string> served(standard_roles().begin(), standard_roles().end());
  if (!r.gemms.empty())
    for (const RoleRule& rule : r.roles)
      for (const RolePattern& p : rule.patterns) {
        const std::string any = "qforge-any";
        const std::string module = p.parts[0] == "*" ? any : p.parts[0], name = p.parts[2] == "*" ? "" : ":" + p.parts[2];
        const std::vector<std::string> tensors =
            p.parts[1] == "*" ? std::vector<std::string>{"weight", "input", "grad_output", any} : std::vector<std::string>{p.parts[1]};
        for (const std::string& t : tensors) served.insert(module + ":" + t + name);
      }
  for (const RecipeGemm& g : r.gemms) {
    const GemmScalingTraits& gt = traits(g.spec.scaling);
    if (!gt.mn_major_ok) continue;  // GEMMs that read 1D block grids as given
    const bool kg = k_grouped(g.spec.layout);
    for (const std::string& role : served) {
      const bool weight = parse_role(role)[1] == "weight";
      const RoleRule* rule = nullptr;
      try {
        rule = resolve_role(r, role).rule;
      } catch (const UserError&) {
        continue;  // a role the recipe does not cover (or not unambiguously): asked for, it fails then
      }
      for (const Direction dir : {Direction::Rowwise, Direction::Columnwise}) {
        const bool transposed = dir == Direction::Columnwise;
        const bool read = kg ? transposed && !weight : !transposed || (gt.mn_major_b && weight);
        const auto& d = transposed ? rule->columnwise : rule->rowwise;
        // The streams this GEMM's operands come from: its scaling's 1D blocks (of scale_k), K-major.
        const auto b = d ? block_of(d->scaling) : std::nullopt;
        const bool feeds = read && d && b && !b->is_2d() && b->rows * b->cols == gt.scale_k &&
                           scaling_name(d->scaling) == gt.stream_scaling;
        if (!feeds || d->layout != (transposed ? DataLayout::Transposed : DataLayout::RowMajor) ||
            d->scale_layout == g.spec.scale_layout)
          continue;
        const std::string where = rule->pointer + (transposed ? "/columnwise" : "/rowwise");
        throw UserError(g.pointer + "/scale_layout", std::string(kg ? "this wgrad" : "this m_grouped GEMM") + " reads " +
                                                         std::string(name(g.spec.scale_layout)) + " scale grids, but " + where +
                                                         " writes " + std::string(name(d->scale_layout)) +
                                                         " ones (its operands are those copies): give both the same \"scale_layout\"");
      }
    }
  }
  // The same pattern twice can never be resolved: reject it here, naming both places.
  for (size_t a = 0; a < r.roles.size(); ++a)
    for (size_t b = 0; b <= a; ++b)
      for (size_t pa = 0; pa < r.roles[a].patterns.size(); ++pa)
        for (size_t pb = 0; pb < r.roles[b].patterns.size(); ++pb) {
          if (a == b && pb >= pa) continue;
          if (r.roles[a].patterns[pa].parts == r.roles[b].patterns[pb].parts)
            throw UserError(r.roles[a].pointer + "/match",
                            "pattern \"" + r.roles[a].patterns[pa].str() + "\" is also given at " +
                                r.roles[b].pointer + "; each pattern may appear once");
        }
  return r;
}

Recipe load_recipe(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UserError(path.string(), "is a directory; expected a recipe file (qforge prewarm and tune take directories)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path.string(), "cannot open recipe file");
  // At most 1 MiB and one byte: a huge file, a device or a pipe that never ends is refused
  // without being read whole.
  constexpr size_t kMaxBytes = size_t(1) << 20;
  std::string text(kMaxBytes + 1, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  if (text.size() > kMaxBytes) throw UserError(path.string(), "recipe file is larger than 1 MiB");
  try {
    return parse_recipe(text);
  } catch (const UserError& e) {
    throw UserError(path.string() + (e.where().empty() ? "" : ": " + e.where()),
                    std::string(e.what()).substr(e.where().empty() ? 0 : e.where().size() + 2));
  }
}

ResolvedRole resolve_role(const Recipe& recipe, std::string_view role) {
  const auto parts = parse_role(role);
  const RoleRule* best = nullptr;
  const RolePattern* best_p = nullptr;
  const RoleRule* tie = nullptr;
  const RolePattern* tie_p = nullptr;
  for (const auto& rule : recipe.roles) {
    for (const auto& p : rule.patterns) {
      if (!p.matches(parts)) continue;
      if (!best || p.specificity() > best_p->specificity()) {
        best = &rule, best_p = &p, tie = nullptr;
      } else if (p.specificity() == best_p->specificity() && &rule != best) {
        tie = &rule, tie_p = &p;
      }
    }
  }
  if (!best)
    throw UserError("role", "no rule of recipe \"" + recipe.name + "\" matches role \"" +
                                std::string(role) + "\"");
  if (tie)
    throw UserError("role", "role \"" + std::string(role) + "\" matches \"" + best_p->str() + "\" (" +
                                best->pointer + ") and \"" + tie_p->str() + "\" (" + tie->pointer +
                                ") equally specifically; add a more specific pattern");
  return {best, best_p};
}

std::span<const std::string_view> standard_roles() {
  static constexpr std::string_view kRoles[] = {
      "linear:input",         "linear:weight",         "linear:grad_output",
      "grouped_linear:input", "grouped_linear:weight", "grouped_linear:grad_output",
  };
  return kRoles;
}

}  // namespace qf
