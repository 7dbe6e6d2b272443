// Malformed recipes: each file in tests/recipes/bad/ must be rejected with a qf::UserError whose
// message names the JSON pointer of the mistake and says what is wrong, on one line (tools
// print it as one stderr line). The parser rejects unknown keys, so the expectations live in
// this table rather than in the files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "compiler/error.h"
#include "compiler/recipe.h"

namespace {

namespace fs = std::filesystem;

struct BadRecipe {
  const char* file;     // under tests/recipes/bad/
  const char* pointer;  // JSON pointer the message names ("" for whole-document errors)
  const char* message;  // substring of the message
};

// Printed by gtest for parameter names.
std::ostream& operator<<(std::ostream& os, const BadRecipe& b) { return os << b.file; }

const BadRecipe kBadRecipes[] = {
    {"syntax_error.json", "", "JSON syntax error at line 3, column 17"},
    {"syntax_truncated.json", "", "JSON syntax error at line 5"},
    {"wrong_version.json", "/qforge_recipe", "unsupported recipe version 2"},
    {"version_string.json", "/qforge_recipe", "expected an integer, got a string"},
    {"missing_version.json", "", "missing required key \"qforge_recipe\""},
    {"missing_name.json", "", "missing required key \"name\""},
    {"missing_roles.json", "", "missing required key \"roles\""},
    {"empty_roles.json", "/roles", "at least one role rule"},
    {"roles_not_array.json", "/roles", "expected an array of role rules, got an object"},
    {"not_an_object.json", "", "expected an object, got an array"},
    {"unknown_top_key.json", "/rolez", "unknown key \"rolez\""},
    {"unknown_direction_key.json", "/roles/0/rowwise/scale", "unknown key \"scale\""},
    {"unknown_rule_key.json", "/roles/0/columnwize", "unknown key \"columnwize\""},
    {"unknown_format.json", "/roles/0/rowwise/format", "unknown format \"e4m4\""},
    {"format_number.json", "/roles/0/rowwise/format", "expected a string, got an integer"},
    {"missing_format.json", "/roles/0/rowwise", "missing required key \"format\""},
    {"missing_scaling.json", "/roles/0/rowwise", "missing required key \"scaling\""},
    {"unknown_scaling_mode.json", "/roles/0/rowwise/scaling/mode", "unknown scaling mode \"per_tensor_currnet\""},
    {"unknown_scaling_shorthand.json", "/roles/0/rowwise/scaling", "unknown scaling mode \"tensorwise\""},
    {"rule_on_block.json", "/roles/0/rowwise/scaling/rule", "key \"rule\" does not apply to scaling mode \"block\""},
    {"epsilon_on_delayed.json", "/roles/0/rowwise/scaling/epsilon", "key \"epsilon\" does not apply to scaling mode \"per_tensor_delayed\""},
    {"block_on_per_tensor.json", "/roles/0/rowwise/scaling/block", "key \"block\" does not apply"},
    {"sr_on_e4m3.json", "/roles/0/rowwise/rounding", "stochastic rounding is not defined for format \"e4m3\""},
    {"sr_on_e5m2.json", "/roles/0/columnwise/rounding", "stochastic rounding is not defined for format \"e5m2\""},
    {"sr_on_identity.json", "/roles/0/rowwise/rounding", "not defined for format \"identity\""},
    {"rounding_unknown.json", "/roles/0/rowwise/rounding", "unknown value \"up\""},
    {"rht_on_rowwise.json", "/roles/0/rowwise/rht", "columnwise direction only"},
    {"rht_on_int8.json", "/roles/0/columnwise/rht", "needs a floating-point quantized format, not \"int8\""},
    {"rht_on_identity.json", "/roles/0/columnwise/rht", "not \"identity\""},
    {"rht_with_2d_block.json", "/roles/0/columnwise/rht", "2D block scaling ([16,16])"},
    {"rht_with_fp32_block.json", "/roles/0/columnwise/rht", "not \"block\""},
    {"rht_bad_sign_mask.json", "/roles/0/columnwise/rht/sign_mask", "expected a 16-bit hex string such as \"0xD7E8\", got \"D7E8\""},
    {"rht_negative_sign_mask.json", "/roles/0/columnwise/rht/sign_mask", "got \"0x-1\""},
    {"rht_long_sign_mask.json", "/roles/0/columnwise/rht/sign_mask", "16-bit hex string"},
    {"rht_unknown_key.json", "/roles/0/columnwise/rht/signs", "unknown key \"signs\""},
    {"layout_on_rowwise.json", "/roles/0/rowwise/layout", "\"layout\" applies to the columnwise direction only"},
    {"layout_unknown.json", "/roles/0/columnwise/layout", "unknown value \"k_major\""},
    {"swizzled_with_block.json", "/roles/0/rowwise/scale_layout", "not \"block\""},
    {"swizzled_with_per_tensor.json", "/roles/0/rowwise/scale_layout", "not \"per_tensor_current\""},
    {"mn_major_with_nvfp4.json", "/roles/0/rowwise/scale_layout", "1D blocks (1x128, 128x1, 1x32, 32x1) only, not \"nvfp4\""},
    {"mn_major_with_mx_2d.json", "/roles/0/rowwise/scale_layout", "not \"mx\" with [32,32] blocks"},
    {"mn_major_with_2d_block.json", "/roles/0/rowwise/scale_layout", "not \"block\" with [128,128] blocks"},
    {"mn_major_same_layout.json", "/roles/0/columnwise/scale_layout", "needs \"layout\": \"transposed\""},
    {"wgrad_scale_layout_mismatch.json", "/gemms/1/scale_layout",
     "this wgrad reads compact scale grids, but /roles/0/columnwise writes mn_major ones"},
    {"fprop_scale_layout_mismatch.json", "/gemms/0/scale_layout",
     "this m_grouped GEMM reads compact scale grids, but /roles/0/rowwise writes mn_major ones (its operands are those "
     "copies): give both the same \"scale_layout\""},
    {"dgrad_mn_major_on_compact_rowwise.json", "/gemms/0/scale_layout",
     "this m_grouped GEMM reads mn_major scale grids, but /roles/0/rowwise writes compact ones"},
    {"mxfp8_dgrad_mn_major_on_compact_weights.json", "/gemms/0/scale_layout",
     "this m_grouped GEMM reads mn_major scale grids, but /roles/0/columnwise writes compact ones"},
    {"mxfp8_wgrad_compact_on_mn_major_grads.json", "/gemms/0/scale_layout",
     "this wgrad reads compact scale grids, but /roles/1/columnwise writes mn_major ones"},
    {"mx_block_1x16.json", "/roles/0/rowwise/scaling/block", "bad MX block for rowwise: got [1,16]"},
    {"mx_block_32x1_rowwise.json", "/roles/0/rowwise/scaling/block", "bad MX block for rowwise: got [32,1]"},
    {"mx_block_1x32_columnwise.json", "/roles/0/columnwise/scaling/block", "bad MX block for columnwise: got [1,32]"},
    {"mx_rule_unknown.json", "/roles/0/rowwise/scaling/rule", "unknown value \"round\"; expected \"rceil\" or \"floor\""},
    {"mx_with_int8.json", "/roles/0/rowwise/scaling", "scaling mode \"mx\" cannot be used with format \"int8\""},
    {"nvfp4_with_e4m3.json", "/roles/0/rowwise/scaling/mode", "scaling mode \"nvfp4\" cannot be used with format \"e4m3\""},
    {"nvfp4_block_1x32.json", "/roles/0/rowwise/scaling/block", "bad NVFP4 block for rowwise: got [1,32]"},
    {"block_not_pow2.json", "/roles/0/rowwise/scaling/block", "powers of two in [16, 512] (they must divide the kernel tile); got [1,100]"},
    {"block_too_long.json", "/roles/0/rowwise/scaling/block", "got [1,1024]"},
    {"block_huge.json", "/roles/0/rowwise/scaling/block/1", "expected an integer in [1, 4096], got 1000000"},
    {"block_128x1_rowwise.json", "/roles/0/rowwise/scaling/block", "rowwise 1D blocks run along K"},
    {"block_one_element.json", "/roles/0/rowwise/scaling/block", "a block of one element is not a block"},
    {"block_three_elements.json", "/roles/0/rowwise/scaling/block", "expected [rows, cols], an array of two integers"},
    {"block_not_integer.json", "/roles/0/rowwise/scaling/block/1", "expected an integer in [1, 4096], got 128.5"},
    {"block_zero.json", "/roles/0/rowwise/scaling/block/0", "expected an integer in [1, 4096], got 0"},
    {"epsilon_negative.json", "/roles/0/rowwise/scaling/epsilon", "epsilon must be >= 0 and below 1e30, got -"},
    {"epsilon_string.json", "/roles/0/rowwise/scaling/epsilon", "expected a number, got a string"},
    {"pow2_not_bool.json", "/roles/0/rowwise/scaling/pow2", "expected true or false, got an integer"},
    {"history_length_zero.json", "/roles/0/rowwise/scaling/history_length", "expected an integer in [1, 65536], got 0"},
    {"margin_negative.json", "/roles/0/rowwise/scaling/margin", "expected an integer in [0, 64], got -1"},
    {"amax_compute_unknown.json", "/roles/0/rowwise/scaling/amax_compute", "unknown value \"mean\""},
    {"delayed_with_int8.json", "/roles/0/rowwise/scaling", "scaling mode \"per_tensor_delayed\" cannot be used with format \"int8\""},
    {"duplicate_pattern.json", "/roles/1/match", "pattern \"*:weight\" is also given at /roles/0"},
    {"duplicate_pattern_same_rule.json", "/roles/0/match", "pattern \"linear:weight\" is also given at /roles/0"},
    {"duplicate_json_key.json", "/roles/0/rowwise/format", "duplicated key \"format\""},
    {"pattern_one_part.json", "/roles/0/match", "bad role pattern \"linear\""},
    {"pattern_four_parts.json", "/roles/0/match", "bad role pattern \"linear:input:qkv:x\""},
    {"pattern_bad_char.json", "/roles/0/match/1", "bad role pattern \"linear:wei ght\""},
    {"pattern_empty_part.json", "/roles/0/match", "bad role pattern \"linear::qkv\""},
    {"pattern_not_string.json", "/roles/0/match", "expected a string, got an integer"},
    {"match_empty_array.json", "/roles/0/match", "expected at least one role pattern"},
    {"missing_match.json", "/roles/0", "missing required key \"match\""},
    {"identity_with_mx.json", "/roles/0/rowwise/scaling", "scaling mode \"mx\" cannot be used with format \"identity\""},
    {"dtype_on_e4m3.json", "/roles/0/rowwise/dtype", "\"dtype\" applies to format \"identity\" only"},
    {"dtype_unknown.json", "/roles/0/rowwise/dtype", "unknown dtype \"fp64\""},
    {"rule_without_directions.json", "/roles/0", "a role rule needs \"rowwise\", \"columnwise\" or both"},
    {"per_channel_with_e2m1.json", "/roles/0/rowwise/scaling", "scaling mode \"per_channel\" cannot be used with format \"e2m1\""},
    {"per_channel_int8_pow2.json", "/roles/0/rowwise/scaling/pow2", "int8 per_channel scales follow torchao's rule (amax / 127 in the input dtype); \"pow2\" applies to fp8 per_channel scaling"},
    {"usage_unknown.json", "/usage", "unknown value \"serving\"; expected \"training\", \"inference\" or \"memory\""},
    {"name_with_spaces.json", "/name", "expected a name of 1-64 characters"},
    {"name_empty.json", "/name", "expected a name of 1-64 characters"},
    {"name_too_long.json", "/name", "expected a name of 1-64 characters"},
    {"name_with_quote.json", "/name", "expected a name of 1-64 characters"},
    {"name_with_newline.json", "/name", "expected a name of 1-64 characters"},
    {"name_with_include.json", "/name", "expected a name of 1-64 characters"},
    {"name_with_asm.json", "/name", "expected a name of 1-64 characters"},
    {"key_with_newline.json", "/bad?key", "unknown key \"bad?key\""},
    {"value_with_newline.json", "/roles/0/rowwise/format", "unknown format \"e4m3?#include <x>\""},
    {"comment_not_string.json", "/comment", "expected a string, got an array"},
    {"identity_sr_scaling_none_on_e4m3.json", "/roles/0/rowwise/scaling", "scaling mode \"none\" cannot be used with format \"e4m3\""},
    // Found by the recipe fuzzer (tests/fuzz/regressions/): nlohmann quoted the raw DEL byte
    // in its message; a number beyond double range escaped as an internal error.
    {"syntax_error_del_byte.json", "", "JSON syntax error at line 10, column 1: syntax error while parsing object - invalid literal; last read: '\"per_tensor_current\"<U+000A>?'"},
    {"number_out_of_range.json", "/roles/0/rowwise/scaling/epsilon", "number 1e999 is out of range (beyond a double)"},
    // "gemms": GEMM specs, checked by the GEMM spec validation, errors at the entry's field.
    {"gemm_unknown_scaling.json", "/gemms/0/scaling", "unknown value \"int8\"; expected \"tensor\", \"rowwise\", \"blockwise\", \"mxfp8\", \"nvfp4\", \"none\" or \"channel\""},
    {"gemm_n_not_multiple.json", "/gemms/1/n", "expected a multiple of 8 in [8, 2^24] (16-byte output rows), got 100"},
    {"gemm_mxfp8_k.json", "/gemms/0/k", "mxfp8 scaling reads the scales of 128 of K at once: expected a multiple of 128, got 7200"},
    {"gemm_tile_block_n.json", "/gemms/0/tile/block_n", "block_n <= 128, got 256"},
    {"gemm_unknown_key.json", "/gemms/0/rows", "unknown key \"rows\""},
    {"gemm_m_on_m_grouped.json", "/gemms/0/m", "an m_grouped GEMM takes its rows at run time: no \"m\""},
    {"gemm_k_grouped_missing_m.json", "/gemms/0", "missing required key \"m\""},
    {"gemm_k_grouped_with_k.json", "/gemms/0/k", "a k_grouped GEMM reduces over each group's tokens, given at run time: no \"k\""},
    {"gemm_layout_unknown.json", "/gemms/0/layout", "unknown value \"n_grouped\"; expected \"m_grouped\", \"k_grouped\" or \"k_grouped_members\""},
    {"gemms_not_array.json", "/gemms", "expected an array of GEMM specs, got an object"},
    {"gemm_missing_k.json", "/gemms/0", "missing required key \"k\""},
    {"gemm_format_int8_mixed.json", "/gemms/0/b_format", "int8 a_format takes int8 here too (s8 x s8 MMAs), got e4m3"},
    {"gemm_int8_mxfp8.json", "/gemms/0/scaling", "int8 operands: expected tensor, rowwise or blockwise"},
    {"gemm_nvfp4_fp8_operand.json", "/gemms/0/b_format", "unknown value \"e4m3\"; expected \"e2m1\""},
    {"gemm_fp8_e2m1_operand.json", "/gemms/0/a_format", "e2m1 operands take \"scaling\": \"nvfp4\" (got \"blockwise\"); expected e4m3, e5m2, int8, bf16 or fp16 here"},
    {"gemm_bf16_fp16_mixed.json", "/gemms/0/b_format", "a bf16 A takes a bf16 B (one MMA type), got fp16"},
    {"columnwise_e2m1_same_layout.json", "/roles/0/columnwise/layout", "a same-layout e2m1 copy packs two columns' elements in a byte"},
    {"gemm_route_blockwise.json", "/gemms/0/route", "dequant: expected mxfp8 or nvfp4 scaling"},
    {"gemm_route_unknown.json", "/gemms/0/route", "unknown value \"fast\"; expected \"fused\", \"dequant\" or \"auto\""},
    {"gemm_channel_k_grouped.json", "/gemms/0/layout", "channel scaling (int8 weights x 16-bit activations) is an fprop / dgrad GEMM: expected m_grouped, got k_grouped"},
    {"gemm_nvfp4_four_stages.json", "/gemms/0/tile/stages", "4 stages need 232608 bytes of shared memory (limit 232448)"},
};

fs::path bad_dir() { return fs::path(QF_SOURCE_DIR) / "tests" / "recipes" / "bad"; }

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class BadRecipeTest : public ::testing::TestWithParam<BadRecipe> {};

TEST_P(BadRecipeTest, LoadRecipeNamesPointerAndReason) {
  const BadRecipe& b = GetParam();
  const fs::path path = bad_dir() / b.file;
  ASSERT_TRUE(fs::exists(path)) << path;
  try {
    (void)qf::load_recipe(path);
    FAIL() << b.file << " was accepted";
  } catch (const qf::UserError& e) {
    const std::string what = e.what();
    // load_recipe prefixes the path, then the pointer: "<path>: /roles/0/rowwise: ...".
    EXPECT_EQ(what.rfind(path.string() + ": ", 0), 0u) << what;
    if (*b.pointer) {
      EXPECT_NE(what.find(": " + std::string(b.pointer) + ": "), std::string::npos)
          << "pointer " << b.pointer << " missing from: " << what;
    }
    EXPECT_NE(what.find(b.message), std::string::npos)
        << "expected \"" << b.message << "\" in: " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "multi-line message: " << what;
    EXPECT_EQ(what.find('\r'), std::string::npos) << what;
  }
}

TEST_P(BadRecipeTest, ParseRecipeReportsPointerAsWhere) {
  const BadRecipe& b = GetParam();
  const std::string text = read_file(bad_dir() / b.file);
  try {
    (void)qf::parse_recipe(text);
    FAIL() << b.file << " was accepted";
  } catch (const qf::UserError& e) {
    EXPECT_EQ(e.where(), b.pointer) << e.what();
    EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(All, BadRecipeTest, ::testing::ValuesIn(kBadRecipes),
                         [](const ::testing::TestParamInfo<BadRecipe>& info) {
                           std::string n = fs::path(info.param.file).stem().string();
                           std::replace_if(n.begin(), n.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
                           return n;
                         });

// Every file in the directory has an expectation (a file without one would test nothing), and
// the table asks for at least the cases the test plan lists.
TEST(BadRecipes, EveryFileIsInTheTable) {
  std::set<std::string> listed;
  for (const auto& b : kBadRecipes) EXPECT_TRUE(listed.insert(b.file).second) << "listed twice: " << b.file;
  std::set<std::string> on_disk;
  for (const auto& entry : fs::directory_iterator(bad_dir()))
    if (entry.path().extension() == ".json") on_disk.insert(entry.path().filename().string());
  EXPECT_EQ(listed, on_disk);
  EXPECT_GE(on_disk.size(), 35u);
}

// Text that must never reach generated code is rejected, not echoed raw: the message keeps
// control characters out (one line) and cuts long values.
TEST(BadRecipes, LongUserTextIsCutInMessages) {
  const std::string fmt(500, 'x');
  const std::string text = R"({"qforge_recipe": 1, "name": "n", "roles": [{"match": "*:*", "rowwise": {"format": ")" +
                           fmt + R"(", "scaling": "per_tensor_current"}}]})";
  try {
    (void)qf::parse_recipe(text);
    FAIL();
  } catch (const qf::UserError& e) {
    EXPECT_EQ(e.where(), "/roles/0/rowwise/format");
    EXPECT_NE(std::string(e.what()).find(std::string(64, 'x') + "..."), std::string::npos) << e.what();
    EXPECT_LT(std::string(e.what()).size(), 400u);
  }
}

// A syntax error quotes what the parser last read, which can be a whole long string with raw
// bytes: the message keeps it short and printable.
TEST(BadRecipes, SyntaxErrorQuotesAreCut) {
  const std::string text = "{\"qforge_recipe\": 1, \"name\": \"" + std::string(100000, 'x') + "\x7f\x01\"}";
  try {
    (void)qf::parse_recipe(text);
    FAIL();
  } catch (const qf::UserError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.where(), "");
    EXPECT_NE(what.find("JSON syntax error at line 1"), std::string::npos) << what;
    EXPECT_NE(what.find(std::string(20, 'x') + "..."), std::string::npos) << what;
    EXPECT_LT(what.size(), 400u) << what;
    EXPECT_TRUE(std::none_of(what.begin(), what.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) << what;
  }
}

// The text read may itself hold "'; expected ", the phrase that starts nlohmann's suffix: the quote
// is still cut (a recipe fuzzer input made a 2842-byte message of it).
TEST(BadRecipes, SyntaxErrorQuoteHoldingTheSuffixPhraseIsCut) {
  const std::string text = "{\"qforge_recipe\": 1, \"name\": \"" + std::string(300, '8') + "'; expected " +
                           std::string(3000, '7') + "\\u00\"}";
  try {
    (void)qf::parse_recipe(text);
    FAIL();
  } catch (const qf::UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("JSON syntax error at line 1"), std::string::npos) << what;
    EXPECT_NE(what.find("last read: '"), std::string::npos) << what;
    EXPECT_LE(what.size(), 460u) << what;
  }
}

// A number beyond double range is a user error at its pointer, in arrays too.
TEST(BadRecipes, NumberOutOfRangeNamesItsPointer) {
  try {
    (void)qf::parse_recipe(R"({"qforge_recipe": 1, "name": "n", "roles": [{"match": "*:*", "rowwise": {"format": "e4m3", "scaling": {"mode": "block", "block": [1, -2e400]}}}]})");
    FAIL();
  } catch (const qf::UserError& e) {
    EXPECT_EQ(e.where(), "/roles/0/rowwise/scaling/block/1") << e.what();
    EXPECT_NE(std::string(e.what()).find("number -2e400 is out of range"), std::string::npos) << e.what();
  }
}

TEST(BadRecipes, MissingFileIsAUserError) {
  const fs::path p = bad_dir() / "does_not_exist.json";
  try {
    (void)qf::load_recipe(p);
    FAIL();
  } catch (const qf::UserError& e) {
    EXPECT_EQ(e.where(), p.string());
    EXPECT_NE(std::string(e.what()).find("cannot open recipe file"), std::string::npos);
  }
}

TEST(BadRecipes, OversizedFileIsRejected) {
  const fs::path p = fs::temp_directory_path() / "qforge_bad_recipes_test_big.json";
  {
    std::ofstream out(p, std::ios::binary);
    out << std::string((1u << 20) + 1, ' ');
  }
  EXPECT_THROW((void)qf::load_recipe(p), qf::UserError);
  fs::remove(p);
}

TEST(BadRecipes, EndlessFileIsRejectedWithoutReadingItWhole) {
  // A device (or a pipe) that never ends: refused after 1 MiB and a byte, not read to exhaustion.
  if (!fs::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero";
  try {
    (void)qf::load_recipe("/dev/zero");
    FAIL();
  } catch (const qf::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("recipe file is larger than 1 MiB"), std::string::npos) << e.what();
  }
}

}  // namespace
