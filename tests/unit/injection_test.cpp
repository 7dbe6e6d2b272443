// No recipe text reaches generated code. The emitted CUDA source (and the name expressions
// given to NVRTC) may depend on a recipe only through validated enums and numbers: a recipe
// file must not be able to inject code into the translation unit, and identical kernels of
// differently named recipes must share one cache entry. tests/lit/emit_no_recipe_text.test
// shows it for one recipe and one role; this test, for every shipped recipe:
//   - replaces every string value (found by walking the JSON, whatever its key) with hostile
//     payloads: quotes, backslashes, newlines, "*/", #include, asm, a __global__ function,
//     NUL, control bytes, 200 KB, bidi/line-separator code points, the original value with
//     code appended, and raw (unescaped) bytes that are not valid JSON or UTF-8. Each is either
//     rejected with a UserError naming that string's JSON pointer (raw bytes: a JSON syntax
//     error naming its line), or accepted, and then every kernel source of the recipe (every
//     role x usage x dtype x grouped, history kernels included) is byte-identical to the
//     original's and holds none of the payload's markers;
//   - puts the payloads in a "comment" in every object (where a comment is allowed, it is
//     free text and changes nothing; elsewhere it is rejected at that key) and in object keys
//     (always rejected at that key, on one line);
//   - renames the recipe and requests roles with extra name parts: the same sources.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "compiler/codegen.h"
#include "compiler/error.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "tests/fuzz/fuzz_entry.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Sources = std::vector<std::pair<std::string, std::string>>;

constexpr const char* kPlaceholder = "@@QFINJ_PLACEHOLDER@@";

struct Payload {
  std::string label;
  std::string text;                // the decoded string (raw: the bytes put between the quotes)
  std::vector<std::string> marks;  // substrings no kernel source may contain
  bool raw = false;                // bytes written unescaped: not valid JSON string content
};

std::vector<Payload> payloads(const std::string& original) {
  std::vector<Payload> p = {
      {"quote", "QFINJ_a\" + \"QFINJ_b", {"QFINJ"}},
      {"backslash", "QFINJ\\\" \\\\ \\n \\", {"QFINJ"}},
      {"newline_define", "QFINJ\n#define kRht true\n", {"QFINJ", "#define"}},
      {"comment_close", "QFINJ */ static int qfinj_after_comment; /*", {"QFINJ", "*/", "qfinj_after_comment"}},
      {"include", "#include <x> // QFINJ", {"#include <x>", "QFINJ"}},
      {"asm", "asm(\"trap;\"); // QFINJ", {"asm(", "trap", "QFINJ"}},
      {"global_function", "}; __global__ void k(){} // QFINJ", {"__global__ void k", "void k()", "QFINJ"}},
      {"line_pragma", "\n#line 1 \"QFINJ\"\n#pragma once\n", {"#line", "#pragma", "QFINJ"}},
      {"nul", std::string("QFINJ\0after_nul", 15), {"QFINJ", "after_nul", std::string(1, '\0')}},
      {"control", "QFINJ\r\t\x1b[31m\x7f\x01", {"QFINJ", "\r", "\t", "\x1b", "\x7f"}},
      {"long", "QFINJ" + std::string(200000, 'A'), {"QFINJ", std::string(32, 'A')}},
      {"unicode", "QFINJ\u202Eevil\u2028x\uFEFF", {"QFINJ", "\u202E", "\u2028", "\uFEFF"}},
      {"raw_non_utf8", "QFINJ\xff\xfe\xc0\x80", {"QFINJ", "\xff"}, true},
      {"raw_nul", std::string("QFINJ\0x", 7), {"QFINJ"}, true},
      {"raw_newline", "QFINJ\n#include <x>", {"QFINJ", "#include <x>"}, true},
      // The original value with something appended: validation must match whole strings.
      {"value_newline_include", original + "\n#include <x>", {"#include <x>"}},
      {"value_nul_asm", original + std::string(1, '\0') + "asm(\"trap;\")", {"asm(", "trap"}},
      {"value_quote_global", original + "\"; __global__ void k(){} //", {"__global__ void k", "void k()"}},
      {"value_space", original + " ", {}},
  };
  return p;
}

fs::path source_dir() { return fs::path(QF_SOURCE_DIR); }

std::vector<fs::path> shipped_recipes() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(source_dir() / "recipes"))
    if (e.path().extension() == ".json" && e.path().filename() != "recipe.schema.json") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::string pointer_token(const std::string& key) {  // RFC 6901
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

// JSON pointers of every string value and of every object, in document order.
void walk(const json& j, const std::string& ptr, std::vector<std::string>& strings, std::vector<std::string>& objects) {
  if (j.is_string()) {
    strings.push_back(ptr);
  } else if (j.is_object()) {
    objects.push_back(ptr);
    for (auto it = j.begin(); it != j.end(); ++it) walk(it.value(), ptr + "/" + pointer_token(it.key()), strings, objects);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) walk(j[i], ptr + "/" + std::to_string(i), strings, objects);
  }
}

// The document's text with the placeholder string (quotes included) replaced by the payload,
// escaped as JSON or raw; `line` gets the line the payload is on.
std::string with_payload(const json& doc, const Payload& p, int* line = nullptr) {
  std::string text = doc.dump(2);
  const std::string quoted = std::string("\"") + kPlaceholder + "\"";
  const size_t at = text.find(quoted);
  EXPECT_NE(at, std::string::npos);
  EXPECT_EQ(text.find(quoted, at + 1), std::string::npos) << "one placeholder at a time";
  if (line) *line = 1 + int(std::count(text.begin(), text.begin() + std::ptrdiff_t(at), '\n'));
  const std::string value = p.raw ? "\"" + p.text + "\"" : json(p.text).dump();
  text.replace(at, quoted.size(), value);
  return text;
}

std::string shown(const std::string& s) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (char c : s.substr(0, 200)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) out += c;
    else out += std::string("\\x") + kHex[u >> 4] + kHex[u & 15];
  }
  return s.size() > 200 ? out + "..." : out;
}

// A rejection must name where, on one printable line of reasonable length.
void expect_good_message(const qf::UserError& e, const std::string& label) {
  const std::string what = e.what();
  EXPECT_LT(what.size(), 1000u) << label << ": " << shown(what);
  EXPECT_TRUE(std::none_of(what.begin(), what.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  })) << label << ": control byte in: " << shown(what);
  EXPECT_EQ(what.find("QFINJ_PLACEHOLDER"), std::string::npos) << what;
}

void expect_no_marks(const Sources& sources, const Payload& p, const std::string& label) {
  for (const auto& [key, src] : sources)
    for (const auto& m : p.marks)
      ASSERT_EQ(src.find(m), std::string::npos) << label << ": \"" << shown(m) << "\" reached the source of " << key;
}

class InjectionTest : public ::testing::TestWithParam<fs::path> {
 protected:
  void SetUp() override {
    doc_ = read_json(GetParam());
    original_ = qf::fuzz::emit_all(qf::parse_recipe(doc_.dump(2)));
    int compiled = 0;
    for (const auto& [key, src] : original_) compiled += src != "<rejected>";
    ASSERT_GT(compiled, 0) << "the recipe compiles for some role";
    walk(doc_, "", strings_, objects_);
  }

  // Parses `text`; on success, its sources must be the original's and hold no marks.
  // Returns the error, if it was rejected.
  std::optional<qf::UserError> check(const std::string& text, const Payload& p, const std::string& label) {
    qf::Recipe r;
    try {
      r = qf::parse_recipe(text);
    } catch (const qf::UserError& e) {
      expect_good_message(e, label);
      return e;
    }
    const Sources got = qf::fuzz::emit_all(r);
    expect_no_marks(got, p, label);
    EXPECT_TRUE(got == original_) << label << ": accepted, and the kernel sources changed";
    ++accepted_;
    return std::nullopt;
  }

  json doc_;
  Sources original_;
  std::vector<std::string> strings_, objects_;
  int accepted_ = 0;
};

// The markers are not in the sources to begin with (else the checks below would prove nothing).
TEST_P(InjectionTest, MarkersAreNotInTheOriginalSources) {
  for (const auto& p : payloads("e4m3")) expect_no_marks(original_, p, p.label);
}

TEST_P(InjectionTest, EveryStringValue) {
  ASSERT_GE(strings_.size(), 5u);
  int rejected = 0;
  for (const auto& ptr : strings_) {
    const std::string original = doc_[json::json_pointer(ptr)].get<std::string>();
    json doc = doc_;
    doc[json::json_pointer(ptr)] = kPlaceholder;
    for (const Payload& p : payloads(original)) {
      const std::string label = ptr + " <- " + p.label;
      SCOPED_TRACE(label);
      int line = 0;
      const std::string text = with_payload(doc, p, &line);
      const auto err = check(text, p, label);
      if (!err) {
        EXPECT_FALSE(p.raw) << label << ": invalid JSON accepted";
        continue;
      }
      ++rejected;
      if (p.raw) {
        // Not valid JSON: a syntax error at the payload's line (no pointer exists yet).
        EXPECT_EQ(err->where(), "") << err->what();
        EXPECT_NE(std::string(err->what()).find("JSON syntax error at line " + std::to_string(line) + ","),
                  std::string::npos) << err->what();
      } else {
        EXPECT_EQ(err->where(), ptr) << err->what();
        EXPECT_NE(std::string(err->what()).find(ptr + ": "), std::string::npos) << err->what();
      }
    }
  }
  EXPECT_GT(rejected, 0);
  // Free text ($schema, comments) takes any valid string.
  EXPECT_GT(accepted_, 0);
}

// A "comment" in every object: free text where allowed, else rejected at that key.
TEST_P(InjectionTest, CommentInEveryObject) {
  int allowed = 0;
  for (const auto& obj : objects_) {
    json doc = doc_;
    doc[json::json_pointer(obj)]["comment"] = kPlaceholder;
    for (const Payload& p : payloads("")) {
      if (p.raw) continue;
      const std::string label = obj + "/comment <- " + p.label;
      SCOPED_TRACE(label);
      const auto err = check(with_payload(doc, p), p, label);
      if (err) {
        EXPECT_EQ(err->where(), obj + "/comment") << err->what();
      } else {
        ++allowed;
      }
    }
  }
  EXPECT_GT(allowed, 0) << "the root, rules and directions take comments";
}

// Hostile object keys are never accepted; the message names the key's pointer on one line.
TEST_P(InjectionTest, HostileKeys) {
  for (const auto& obj : objects_) {
    for (const Payload& p : payloads("format")) {
      if (p.raw) continue;
      const std::string label = obj + " key <- " + p.label;
      SCOPED_TRACE(label);
      json doc = doc_;
      doc[json::json_pointer(obj)][p.text] = 1;
      const auto err = check(doc.dump(2), p, label);
      ASSERT_TRUE(err.has_value()) << label << ": accepted";
      EXPECT_EQ(err->where().rfind(obj + "/", 0), 0u) << err->what();
    }
  }
}

// Renaming the recipe, rewriting every comment and adding comments everywhere they are allowed
// changes no byte of any kernel source.
TEST_P(InjectionTest, FreeTextChangesNothing) {
  json doc = doc_;
  doc["name"] = "renamed-recipe.v2";
  doc["comment"] = "a different comment";
  doc["$schema"] = "https://example.com/other.schema.json";
  for (auto& rule : doc["roles"]) {
    rule["comment"] = "rule comment";
    for (const char* dir : {"rowwise", "columnwise"})
      if (rule.contains(dir)) rule[dir]["comment"] = "direction comment";
  }
  const qf::Recipe r = qf::parse_recipe(doc.dump());
  EXPECT_EQ(r.name, "renamed-recipe.v2");
  EXPECT_TRUE(qf::fuzz::emit_all(r) == original_);
}

qf::PlanRequest request(const std::string& role) {
  return qf::PlanRequest{role, qf::DType::BF16, std::nullopt, false};
}

// The role's own name part (linear:input:<name>) and module names reach the plan's metadata,
// not the source.
TEST_P(InjectionTest, RoleNamesDoNotReachTheSource) {
  const qf::Recipe r = qf::parse_recipe(doc_.dump());
  for (auto role : qf::standard_roles()) {
    qf::Plan plain, named;
    try {
      plain = qf::compile_plan(r, request(std::string(role)));
    } catch (const qf::UserError&) {
      continue;  // not covered
    }
    const std::string with_name = std::string(role) + ":qfinj_layer.17-qkv";
    try {
      named = qf::compile_plan(r, request(with_name));
    } catch (const qf::UserError&) {
      continue;  // a recipe may give named roles a rule of their own (or a tie)
    }
    EXPECT_EQ(named.role, with_name);
    if (plain.streams != named.streams) continue;  // another rule
    for (qf::QuantizeForm f : qf::quantize_forms(plain)) {
      EXPECT_EQ(qf::emit_quantize(plain, f).source, qf::emit_quantize(named, f).source) << role;
      EXPECT_EQ(qf::emit_quantize(named, f).source.find("qfinj"), std::string::npos) << role;
    }
  }
  // Hostile role requests never get past parse_role.
  for (const Payload& p : payloads("linear:input")) {
    if (p.raw) continue;
    EXPECT_THROW((void)qf::compile_plan(r, request(p.text)), qf::UserError) << p.label;
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, InjectionTest, ::testing::ValuesIn(shipped_recipes()),
                         [](const ::testing::TestParamInfo<fs::path>& info) { return info.param.stem().string(); });

}  // namespace
