// Recipe parsing and role resolution: every shipped recipe parses to the structure its comment
// describes; role patterns resolve most-specific-first with ties reported; the defaults that
// recipes may leave out are the documented ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "compiler/error.h"
#include "compiler/recipe.h"

namespace {

namespace fs = std::filesystem;
using namespace qf;

fs::path recipes_dir() { return fs::path(QF_SOURCE_DIR) / "recipes"; }
Recipe shipped(const std::string& name) { return load_recipe(recipes_dir() / (name + ".json")); }

// Parses a one-rule recipe whose rule body is `rule` (the JSON members after "match").
Recipe one_rule(const std::string& rule, const std::string& match = "\"*:*\"") {
  return parse_recipe(R"({"qforge_recipe": 1, "name": "t", "roles": [{"match": )" + match + ", " + rule + "}]}");
}

std::string expect_user_error(const std::string& text, const std::string& where) {
  try {
    (void)parse_recipe(text);
  } catch (const UserError& e) {
    EXPECT_EQ(e.where(), where) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

// ---- shipped recipes ----

TEST(ShippedRecipes, AllParse) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(recipes_dir())) {
    const auto p = entry.path();
    if (p.extension() != ".json" || p.filename() == "recipe.schema.json") continue;
    SCOPED_TRACE(p.string());
    Recipe r;
    ASSERT_NO_THROW(r = load_recipe(p));
    EXPECT_EQ(r.name, p.stem().string()) << "recipe name matches its file name";
    EXPECT_FALSE(r.roles.empty());
    EXPECT_FALSE(r.comment.empty()) << "each shipped recipe says what it reproduces";
    for (const auto& rule : r.roles) {
      EXPECT_TRUE(rule.rowwise || rule.columnwise);
      EXPECT_FALSE(rule.patterns.empty());
    }
    ++n;
  }
  EXPECT_EQ(n, 10);
}

TEST(ShippedRecipes, Fp8Rowwise) {
  // torchao's rowwise fp8: e4m3 per channel, power-of-two scales, amax floored at 1e-12, both
  // directions; the fprop, dgrad and wgrad (one tensor and members) rowwise GEMMs.
  const Recipe r = shipped("fp8_rowwise");
  const auto w = resolve_role(r, "grouped_linear:weight");
  ASSERT_TRUE(w.rule->rowwise && w.rule->columnwise);
  EXPECT_EQ(w.rule->rowwise->format, ElemFormat::E4M3);
  EXPECT_EQ(w.rule->rowwise->scaling, Scaling(PerChannel{1e-12f, true}));
  EXPECT_EQ(w.rule->columnwise->scaling, Scaling(PerChannel{1e-12f, true}));
  EXPECT_EQ(w.rule->columnwise->layout, DataLayout::Transposed);
  ASSERT_EQ(r.gemms.size(), 8u);
  for (const auto& g : r.gemms) EXPECT_EQ(g.spec.scaling, GemmScaling::RowChannel);
  EXPECT_EQ(r.gemms[7].spec.layout, GemmLayout::KGroupedMembers);
}

TEST(ShippedRecipes, CurrentScaling) {
  const Recipe r = shipped("current_scaling");
  EXPECT_EQ(r.usage, Usage::Training);
  ASSERT_EQ(r.roles.size(), 2u);
  const auto in = resolve_role(r, "linear:input");
  ASSERT_TRUE(in.rule->rowwise && in.rule->columnwise);
  EXPECT_EQ(in.rule->rowwise->format, ElemFormat::E4M3);
  EXPECT_EQ(in.rule->rowwise->scaling, Scaling(PerTensorCurrent{0.0f, false}));
  EXPECT_EQ(in.rule->columnwise->layout, DataLayout::Transposed);
  const auto go = resolve_role(r, "linear:grad_output");
  EXPECT_EQ(go.rule->rowwise->format, ElemFormat::E5M2);
  EXPECT_EQ(go.rule->columnwise->format, ElemFormat::E5M2);
  EXPECT_EQ(go.rule->pointer, "/roles/1");
}

TEST(ShippedRecipes, DelayedScaling) {
  const Recipe r = shipped("delayed_scaling");
  const auto w = resolve_role(r, "linear:weight");
  EXPECT_EQ(w.rule->rowwise->scaling, Scaling(PerTensorDelayed{0, 1024, AmaxCompute::Max}));
  EXPECT_EQ(w.pattern->str(), "*:weight");
}

TEST(ShippedRecipes, Float8BlockScaling) {
  const Recipe r = shipped("float8_block_scaling");
  const auto in = resolve_role(r, "linear:input");
  EXPECT_EQ(in.rule->rowwise->scaling, Scaling(BlockScaling{{1, 128}, 0.0f, true}));
  EXPECT_EQ(in.rule->columnwise->scaling, Scaling(BlockScaling{{128, 1}, 0.0f, true}));
  const auto w = resolve_role(r, "linear:weight");
  EXPECT_EQ(w.rule->rowwise->scaling, Scaling(BlockScaling{{128, 128}, 0.0f, true}));
  EXPECT_EQ(w.rule->columnwise->scaling, Scaling(BlockScaling{{128, 128}, 0.0f, true}));
}

TEST(ShippedRecipes, Mxfp8) {
  const Recipe r = shipped("mxfp8");
  const auto any = resolve_role(r, "dpa:qkv");
  EXPECT_EQ(any.pattern->str(), "*:*");
  EXPECT_EQ(any.rule->rowwise->scaling, Scaling(MxScaling{{1, 32}, MxRule::RCeil}));
  EXPECT_EQ(any.rule->columnwise->scaling, Scaling(MxScaling{{32, 1}, MxRule::RCeil}));
  EXPECT_EQ(any.rule->columnwise->layout, DataLayout::RowMajor);
  EXPECT_EQ(any.rule->columnwise->scale_layout, ScaleLayout::Compact);
}

// Hopper's K-major dgrad and wgrad GEMMs read the columnwise copy transposed; the numerics are
// mxfp8's; every e8m0 grid mn_major, and every GEMM reads them so.
TEST(ShippedRecipes, Mxfp8Hopper) {
  const Recipe h = shipped("mxfp8_hopper"), b = shipped("mxfp8");
  const auto hr = resolve_role(h, "grouped_linear:weight"), br = resolve_role(b, "grouped_linear:weight");
  EXPECT_EQ(hr.rule->rowwise->scaling, br.rule->rowwise->scaling);
  EXPECT_EQ(hr.rule->columnwise->scaling, br.rule->columnwise->scaling);
  EXPECT_EQ(hr.rule->columnwise->layout, DataLayout::Transposed);
  EXPECT_EQ(hr.rule->rowwise->scale_layout, ScaleLayout::MnMajor);
  EXPECT_EQ(hr.rule->columnwise->scale_layout, ScaleLayout::MnMajor);
  ASSERT_EQ(h.gemms.size(), 8u);
  int shared = 0, members = 0;
  for (const auto& g : h.gemms) {
    EXPECT_EQ(g.spec.scaling, GemmScaling::Mx32);
    EXPECT_EQ(g.spec.scale_layout, ScaleLayout::MnMajor);
    shared += g.spec.layout == GemmLayout::KGrouped;
    members += g.spec.layout == GemmLayout::KGroupedMembers;
  }
  EXPECT_EQ(shared, 2);   // wgrad on one tensor's transposed copies
  EXPECT_EQ(members, 2);  // wgrad on the grouped quantizer's per-member copies
}

// The GEMM entries' scale_layout is checked against the copies each GEMM reads, no more: fprop /
// dgrad on compact grids (every rowwise copy, the weights' transposed ones) and the wgrad on
// mn_major ones (the activations' and gradients' transposed copies) are one valid recipe; a
// blockwise GEMM is not checked against MX streams.
TEST(RecipeGemms, ScaleLayoutIsCheckedAgainstTheCopiesEachGemmReads) {
  const char* mixed = R"({"qforge_recipe": 1, "name": "t", "roles": [
    {"match": "*:weight",
     "rowwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [1, 32]}},
     "columnwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [32, 1]}, "layout": "transposed"}},
    {"match": "*:*",
     "rowwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [1, 32]}},
     "columnwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [32, 1]}, "layout": "transposed", "scale_layout": "mn_major"}}],
    "gemms": [{"scaling": "mxfp8", "n": 256, "k": 512},
              {"scaling": "mxfp8", "layout": "k_grouped", "m": 256, "n": 512, "scale_layout": "mn_major"},
              {"scaling": "blockwise", "n": 256, "k": 512, "scale_layout": "mn_major"}]})";
  const Recipe r = parse_recipe(mixed);
  ASSERT_EQ(r.gemms.size(), 3u);
  EXPECT_EQ(r.gemms[1].spec.scale_layout, ScaleLayout::MnMajor);
}

TEST(RecipeGemms, ScaleLayoutIsCheckedOnRolesOutsideTheStandardOnes) {
  // A rule only a framework's own role names reach (here "experts:input") feeds the GEMM as
  // much as a standard one: its grids must be in the GEMM's layout too.
  const std::string rule = R"({"qforge_recipe": 1, "name": "t", "usage": "inference", "roles": [
    {"match": "experts:input", "rowwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [1, 32]}, "scale_layout": "mn_major"}}],
    "gemms": [{"scaling": "mxfp8", "n": 256, "k": 512)";
  const std::string m = expect_user_error(rule + "}]}", "/gemms/0/scale_layout");
  EXPECT_NE(m.find("/roles/0/rowwise writes mn_major ones"), std::string::npos) << m;
  EXPECT_EQ(parse_recipe(rule + R"(, "scale_layout": "mn_major"}]})").gemms.size(), 1u);
  // A wildcard rule is checked for the roles it can still serve: "*:*" below serves no weight
  // ("*:weight" is more specific), so its transposed copies are not the dgrad's B.
  const Recipe r = parse_recipe(R"({"qforge_recipe": 1, "name": "t", "roles": [
    {"match": "*:weight", "rowwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [1, 32]}},
     "columnwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [32, 1]}}},
    {"match": "*:*", "rowwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [1, 32]}},
     "columnwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [32, 1]}, "scale_layout": "mn_major"}}],
    "gemms": [{"scaling": "mxfp8", "n": 256.0, "k": 512}]})");
  EXPECT_EQ(r.gemms[0].spec.n, 256) << "a whole number written 256.0 is an integer, as JSON Schema says";
}

TEST(ShippedRecipes, Nvfp4) {
  const Recipe r = shipped("nvfp4");
  const auto in = resolve_role(r, "linear:input");
  EXPECT_FALSE(in.rule->rowwise->rht);
  ASSERT_TRUE(in.rule->columnwise->rht);
  EXPECT_EQ(in.rule->columnwise->rht->sign_mask, 0xD7E8u);
  EXPECT_EQ(in.rule->rowwise->rounding, Rounding::Nearest);
  const auto w = resolve_role(r, "linear:weight");
  EXPECT_EQ(w.rule->rowwise->scaling, Scaling(Nvfp4Scaling{{16, 16}}));
  EXPECT_FALSE(w.rule->columnwise->rht);
  const auto g = resolve_role(r, "linear:grad_output");
  EXPECT_EQ(g.rule->rowwise->rounding, Rounding::Stochastic);
  EXPECT_EQ(g.rule->columnwise->rounding, Rounding::Stochastic);
  EXPECT_TRUE(g.rule->columnwise->rht);
}

TEST(ShippedRecipes, Hybrid) {
  const Recipe r = shipped("hybrid_mxfp8_fwd_nvfp4_bwd");
  const auto in = resolve_role(r, "grouped_linear:input");
  EXPECT_EQ(in.rule->rowwise->format, ElemFormat::E4M3);
  EXPECT_TRUE(std::holds_alternative<MxScaling>(in.rule->rowwise->scaling));
  EXPECT_EQ(in.rule->rowwise->scale_layout, ScaleLayout::MnMajor);  // as the MXFP8 GEMMs read it
  EXPECT_EQ(in.rule->columnwise->format, ElemFormat::E2M1);
  EXPECT_EQ(in.rule->columnwise->scale_layout, ScaleLayout::Compact);  // NVFP4 grids are compact
  EXPECT_EQ(in.rule->columnwise->scaling, Scaling(Nvfp4Scaling{{16, 1}}));
  EXPECT_EQ(in.rule->columnwise->rht, Rht{0xD7E8});  // "rht": true takes the default mask
  EXPECT_EQ(resolve_role(r, "linear:grad_output").rule->columnwise->rounding, Rounding::Stochastic);
}

TEST(ShippedRecipes, Int8AndW8A8) {
  const Recipe r = shipped("int8_weight_sr");
  const auto w = resolve_role(r, "linear:weight");
  EXPECT_EQ(w.rule->rowwise->format, ElemFormat::Int8);
  EXPECT_EQ(w.rule->rowwise->scaling, Scaling(PerChannel{}));
  EXPECT_EQ(w.rule->rowwise->rounding, Rounding::Stochastic);
  const auto in = resolve_role(r, "linear:input");
  EXPECT_EQ(in.rule->rowwise->format, ElemFormat::Identity);
  EXPECT_EQ(in.rule->rowwise->scaling, Scaling(NoScaling{}));
  EXPECT_FALSE(in.rule->rowwise->out_dtype) << "\"dtype\": \"input\" means the input dtype";

  const Recipe q = shipped("w8a8_int8_inference");
  EXPECT_EQ(q.usage, Usage::Inference);
  EXPECT_FALSE(resolve_role(q, "linear:weight").rule->columnwise);
  EXPECT_THROW(resolve_role(q, "linear:grad_output"), UserError);
}

// ---- role resolution ----

const char* kResolveRecipe = R"({
  "qforge_recipe": 1, "name": "resolve",
  "roles": [
    {"match": "*:*",                          "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"}},
    {"match": ["*:weight", "dpa:qkv"],        "rowwise": {"format": "e5m2", "scaling": "per_tensor_current"}},
    {"match": "linear:weight",                "rowwise": {"format": "e2m1", "scaling": "nvfp4"}},
    {"match": "linear:input:qkv",             "rowwise": {"format": "int8", "scaling": "per_channel"}},
    {"match": ["grouped_linear:*", "*:grad_output"], "rowwise": {"format": "e4m3", "scaling": "mx"}}
  ]})";

TEST(ResolveRole, MostSpecificWins) {
  const Recipe r = parse_recipe(kResolveRecipe);
  EXPECT_EQ(resolve_role(r, "linear:weight").rule->pointer, "/roles/2");
  EXPECT_EQ(resolve_role(r, "layernorm_linear:weight").rule->pointer, "/roles/1");
  EXPECT_EQ(resolve_role(r, "linear:input").rule->pointer, "/roles/0");
  EXPECT_EQ(resolve_role(r, "linear:input").pattern->str(), "*:*");
}

TEST(ResolveRole, ArrayPatternsEachMatch) {
  const Recipe r = parse_recipe(kResolveRecipe);
  const auto a = resolve_role(r, "dpa:qkv");
  EXPECT_EQ(a.rule->pointer, "/roles/1");
  EXPECT_EQ(a.pattern->str(), "dpa:qkv");
  EXPECT_EQ(resolve_role(r, "mlp:weight").pattern->str(), "*:weight");
}

TEST(ResolveRole, NamePart) {
  const Recipe r = parse_recipe(kResolveRecipe);
  const auto q = resolve_role(r, "linear:input:qkv");
  EXPECT_EQ(q.rule->pointer, "/roles/3");
  EXPECT_EQ(q.pattern->specificity(), 3);
  EXPECT_EQ(q.pattern->str(), "linear:input:qkv");
  // Another name falls back to the two-part / wildcard rules.
  EXPECT_EQ(resolve_role(r, "linear:input:proj").rule->pointer, "/roles/0");
  EXPECT_EQ(resolve_role(r, "linear:weight:fc1").rule->pointer, "/roles/2");
}

TEST(ResolveRole, WildcardMatchesEverything) {
  const Recipe r = one_rule(R"("rowwise": {"format": "e4m3", "scaling": "per_tensor_current"})");
  for (const char* role : {"linear:input", "a:b", "a:b:c", "grouped_linear:weight:expert.3"})
    EXPECT_EQ(resolve_role(r, role).rule->pointer, "/roles/0") << role;
  const Recipe r3 = one_rule(R"("rowwise": {"format": "e4m3", "scaling": "per_tensor_current"})", "\"*:*:*\"");
  EXPECT_EQ(resolve_role(r3, "linear:input:x").pattern->specificity(), 0);
}

TEST(ResolveRole, TieNamesBothPointers) {
  const Recipe r = parse_recipe(kResolveRecipe);
  // grouped_linear:* (rule 4) and *:weight (rule 1) are equally specific.
  try {
    (void)resolve_role(r, "grouped_linear:weight");
    FAIL() << "tie not reported";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.where(), "role");
    EXPECT_NE(m.find("/roles/1"), std::string::npos) << m;
    EXPECT_NE(m.find("/roles/4"), std::string::npos) << m;
    EXPECT_NE(m.find("\"*:weight\""), std::string::npos) << m;
    EXPECT_NE(m.find("\"grouped_linear:*\""), std::string::npos) << m;
    EXPECT_NE(m.find("equally specific"), std::string::npos) << m;
  }
  // A more specific pattern elsewhere breaks the tie.
  const Recipe r2 = parse_recipe(R"({"qforge_recipe": 1, "name": "t", "roles": [
    {"match": "a:*", "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"}},
    {"match": "*:b", "rowwise": {"format": "e5m2", "scaling": "per_tensor_current"}},
    {"match": "a:b", "rowwise": {"format": "int8", "scaling": "per_channel"}}]})");
  EXPECT_EQ(resolve_role(r2, "a:b").rule->pointer, "/roles/2");
  EXPECT_EQ(resolve_role(r2, "a:b:c").rule->pointer, "/roles/2") << "a:b also covers a:b:c";
  EXPECT_EQ(resolve_role(r2, "a:x").rule->pointer, "/roles/0");
}

TEST(ResolveRole, TwoPatternsOfOneRuleAreNotATie) {
  const Recipe r = one_rule(R"("rowwise": {"format": "e4m3", "scaling": "per_tensor_current"})",
                            R"(["linear:*", "*:input"])");
  EXPECT_EQ(resolve_role(r, "linear:input").rule->pointer, "/roles/0");
}

TEST(ResolveRole, NoMatch) {
  const Recipe r = one_rule(R"("rowwise": {"format": "e4m3", "scaling": "per_tensor_current"})", "\"linear:weight\"");
  try {
    (void)resolve_role(r, "linear:input");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(e.where(), "role");
    EXPECT_NE(std::string(e.what()).find("no rule of recipe \"t\" matches role \"linear:input\""), std::string::npos)
        << e.what();
  }
}

TEST(ResolveRole, BadRoleStrings) {
  const Recipe r = one_rule(R"("rowwise": {"format": "e4m3", "scaling": "per_tensor_current"})");
  for (const char* bad : {"linear", "", "a:b:c:d", "a::c", "a:b c", "a:b\n", "a:\"b\""}) {
    SCOPED_TRACE(bad);
    try {
      (void)resolve_role(r, bad);
      ADD_FAILURE() << "accepted";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}

TEST(ParseRole, Parts) {
  EXPECT_EQ(parse_role("linear:weight"), (std::array<std::string, 3>{"linear", "weight", "*"}));
  EXPECT_EQ(parse_role("dpa:qkv:layer.3-x_y"), (std::array<std::string, 3>{"dpa", "qkv", "layer.3-x_y"}));
  try {
    (void)parse_role("x", "--role");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(e.where(), "--role");
  }
}

TEST(RolePattern, SpecificityAndStr) {
  RolePattern p;
  EXPECT_EQ(p.specificity(), 0);
  EXPECT_EQ(p.str(), "*:*");
  p.parts = {"linear", "*", "qkv"};
  EXPECT_EQ(p.specificity(), 2);
  EXPECT_EQ(p.str(), "linear:*:qkv");
  EXPECT_TRUE(p.matches({"linear", "input", "qkv"}));
  EXPECT_FALSE(p.matches({"linear", "input", "*"}));
  EXPECT_FALSE(p.matches({"dpa", "input", "qkv"}));
}

// ---- defaults ----

TEST(Defaults, DirectionDefaults) {
  const Recipe r = one_rule(R"("rowwise": {"format": "e4m3", "scaling": "per_tensor_current"},
                               "columnwise": {"format": "e4m3", "scaling": "per_tensor_current"})");
  EXPECT_EQ(r.usage, Usage::Training);
  const auto& row = *r.roles[0].rowwise;
  const auto& col = *r.roles[0].columnwise;
  EXPECT_EQ(row.layout, DataLayout::RowMajor);
  EXPECT_EQ(col.layout, DataLayout::Transposed) << "columnwise defaults to the transposed [K, M] copy";
  EXPECT_EQ(row.rounding, Rounding::Nearest);
  EXPECT_EQ(col.rounding, Rounding::Nearest);
  EXPECT_EQ(row.scale_layout, ScaleLayout::Compact);
  EXPECT_FALSE(col.rht);
  EXPECT_FALSE(row.out_dtype);
  EXPECT_EQ(row.scaling, Scaling(PerTensorCurrent{0.0f, false}));
}

TEST(Defaults, BlockDefaultsFollowTheDirection) {
  struct Case {
    const char* mode;
    Scaling row, col;
  };
  const Case cases[] = {
      {"block", BlockScaling{{1, 128}, 0.0f, true}, BlockScaling{{128, 1}, 0.0f, true}},
      {"mx", MxScaling{{1, 32}, MxRule::RCeil}, MxScaling{{32, 1}, MxRule::RCeil}},
      {"nvfp4", Nvfp4Scaling{{1, 16}}, Nvfp4Scaling{{16, 1}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.mode);
    const std::string fmt = std::string(c.mode) == "nvfp4" ? "e2m1" : "e4m3";
    // Object form without "block".
    const std::string obj = R"({"mode": ")" + std::string(c.mode) + R"("})";
    const Recipe a = one_rule(R"("rowwise": {"format": ")" + fmt + R"(", "scaling": )" + obj +
                              R"(}, "columnwise": {"format": ")" + fmt + R"(", "scaling": )" + obj + "}");
    EXPECT_EQ(a.roles[0].rowwise->scaling, c.row);
    EXPECT_EQ(a.roles[0].columnwise->scaling, c.col);
    // String shorthand.
    const std::string str = "\"" + std::string(c.mode) + "\"";
    const Recipe b = one_rule(R"("rowwise": {"format": ")" + fmt + R"(", "scaling": )" + str +
                              R"(}, "columnwise": {"format": ")" + fmt + R"(", "scaling": )" + str + "}");
    EXPECT_EQ(b.roles[0].rowwise->scaling, c.row);
    EXPECT_EQ(b.roles[0].columnwise->scaling, c.col);
  }
}

TEST(Defaults, StringShorthandEqualsObjectForm) {
  for (const char* mode : {"per_tensor_current", "per_tensor_delayed"}) {
    SCOPED_TRACE(mode);
    const Recipe a = one_rule(std::string(R"("rowwise": {"format": "e4m3", "scaling": ")") + mode + "\"}");
    const Recipe b = one_rule(std::string(R"("rowwise": {"format": "e4m3", "scaling": {"mode": ")") + mode + "\"}}");
    EXPECT_EQ(a.roles[0].rowwise, b.roles[0].rowwise);
  }
  EXPECT_EQ(one_rule(R"("rowwise": {"format": "e4m3", "scaling": "per_tensor_delayed"})").roles[0].rowwise->scaling,
            Scaling(PerTensorDelayed{0, 1024, AmaxCompute::Max}));
  EXPECT_EQ(one_rule(R"("rowwise": {"format": "int8", "scaling": "per_channel"})").roles[0].rowwise->scaling,
            Scaling(PerChannel{}));
  EXPECT_EQ(one_rule(R"("rowwise": {"format": "identity", "scaling": "none"})").roles[0].rowwise->scaling,
            Scaling(NoScaling{}));
}

TEST(Defaults, IdentityAndExplicitValues) {
  const Recipe r = one_rule(R"("rowwise": {"format": "identity", "dtype": "fp32"},
                               "columnwise": {"format": "identity", "layout": "same"})");
  EXPECT_EQ(r.roles[0].rowwise->out_dtype, DType::FP32);
  EXPECT_EQ(r.roles[0].rowwise->scaling, Scaling(NoScaling{}));
  EXPECT_EQ(r.roles[0].columnwise->layout, DataLayout::RowMajor);

  const Recipe m = one_rule(R"("columnwise": {"format": "e2m1", "scaling": {"mode": "nvfp4", "block": [16, 1]},
                                              "rht": {"sign_mask": "0x00ff"}, "scale_layout": "swizzled",
                                              "rounding": "stochastic"})");
  EXPECT_FALSE(m.roles[0].rowwise);
  EXPECT_EQ(m.roles[0].columnwise->rht, Rht{0x00FF});
  EXPECT_EQ(m.roles[0].columnwise->scale_layout, ScaleLayout::Swizzled);
  EXPECT_EQ(m.roles[0].columnwise->rounding, Rounding::Stochastic);

  const Recipe d = one_rule(R"("rowwise": {"format": "e5m2", "scaling": {"mode": "per_tensor_delayed", "margin": 2,
                                           "history_length": 16, "amax_compute": "most_recent"}})");
  EXPECT_EQ(d.roles[0].rowwise->scaling, Scaling(PerTensorDelayed{2, 16, AmaxCompute::MostRecent}));
  const Recipe b = one_rule(R"("rowwise": {"format": "e4m3", "scaling": {"mode": "block", "block": [32, 64],
                                           "epsilon": 1e-12, "pow2": false}})");
  EXPECT_EQ(b.roles[0].rowwise->scaling, Scaling(BlockScaling{{32, 64}, 1e-12f, false}));
  const Recipe x = one_rule(R"("rowwise": {"format": "e2m3", "scaling": {"mode": "mx", "block": [32, 32], "rule": "floor"}})");
  EXPECT_EQ(x.roles[0].rowwise->scaling, Scaling(MxScaling{{32, 32}, MxRule::Floor}));
}

TEST(Defaults, RhtFalseIsOffEvenOnRowwise) {
  const Recipe r = one_rule(R"("rowwise": {"format": "e2m1", "scaling": "nvfp4", "rht": false})");
  EXPECT_FALSE(r.roles[0].rowwise->rht);
}

TEST(Parse, TopLevelOptionalKeys) {
  const Recipe r = parse_recipe(R"J({"$schema": "./recipe.schema.json", "qforge_recipe": 1, "name": "a.b-c_1",
    "comment": "anything \"quoted\"\n#include <x> asm(\"trap;\")", "usage": "memory",
    "roles": [{"match": "*:*", "comment": "c", "rowwise": {"format": "e4m3", "scaling": "per_tensor_current", "comment": "c"}}]})J");
  EXPECT_EQ(r.name, "a.b-c_1");
  EXPECT_EQ(r.usage, Usage::Memory);
  EXPECT_NE(r.comment.find("#include"), std::string::npos) << "comments are kept as metadata only";
}

TEST(Parse, ErrorsAtPointers) {
  // A few checks of where() beyond tests/recipes/bad/, for paths deeper in arrays.
  expect_user_error(R"({"qforge_recipe": 1, "name": "t", "roles": [
      {"match": "*:*", "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"}},
      {"match": "a:b", "columnwise": {"format": "e4m3", "scaling": {"mode": "mx", "block": [32, 2]}}}]})",
                    "/roles/1/columnwise/scaling/block");
  expect_user_error(R"({"qforge_recipe": 1, "name": "t", "roles": [
      {"match": ["a:b", "c:d"], "rowwise": {"format": "e4m3", "scaling": "per_tensor_current", "dtype": "bf16", "dtype": "fp16"}}]})",
                    "/roles/0/rowwise/dtype");
  expect_user_error(R"({"qforge_recipe": 1, "name": "t", "roles": [
      {"match": ["a:b", "c:d"], "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"}},
      {"match": ["e:f", "c:d"], "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"}}]})",
                    "/roles/1/match");
  const std::string m = expect_user_error(R"({"qforge_recipe": 1, "name": "t", "roles": [{"match": "*:*",
      "rowwise": {"format": "e4m3", "scaling": "per_tensor_current"}, "a/b~c": 1}]})",
                                          "/roles/0/a~1b~0c");
  EXPECT_NE(m.find("unknown key \"a/b~c\""), std::string::npos) << m;
}

TEST(Names, EnumNamesRoundTrip) {
  for (Usage u : {Usage::Training, Usage::Inference, Usage::Memory}) EXPECT_EQ(parse_usage(name(u)), u);
  EXPECT_FALSE(parse_usage("serving"));
  EXPECT_EQ(name(Direction::Rowwise), "rowwise");
  EXPECT_EQ(name(DataLayout::Transposed), "transposed");
  EXPECT_EQ(name(DataLayout::RowMajor), "same");
  EXPECT_EQ(standard_roles().size(), 6u);
}

}  // namespace
