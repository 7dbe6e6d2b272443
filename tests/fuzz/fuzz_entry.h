// The body of the recipe fuzzer, shared by the libFuzzer target (recipe_fuzzer.cpp, clang,
// -DQFORGE_FUZZ=ON, scripts/fuzz.sh) and the unit tests that replay tests/fuzz/regressions/
// under the normal build (tests/unit/fuzz_regressions_test.cpp) and check that no recipe text
// reaches generated code (tests/unit/injection_test.cpp).
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/recipe.h"

namespace qf::fuzz {

// A property of the front end that an input broke. Like any exception other than UserError,
// it escapes run_recipe, and the fuzzer reports it as a crash.
class PropertyFailure : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Runs every stage that recipe bytes reach on the CPU: parse + validate, role resolution for
// every role the recipe can serve, lower + passes (verifier on) for each usage x input dtype x
// grouped, the plan printer, buffer descriptions for a few shapes, codegen of the quantize
// kernels (and of the delayed-scaling history kernel), and the CPU reference on one small
// tensor per role. A UserError at any stage is an expected outcome: it is checked (one
// printable line, pointer first) and run_recipe returns normally. Anything else escapes:
// InternalError, any other exception, or a PropertyFailure, among them
//   - a UserError message over several lines, with control bytes, or not led by its where();
//   - emitted source that depends on the recipe's name, comment or the requested role name;
//   - emitted source with bytes other than printable ASCII and newlines.
void run_recipe(std::string_view bytes);

// The concrete roles to request from a recipe: the standard roles, then each pattern of each
// rule (at most 16 rules) with its "*" parts filled in, so every rule is reached.
std::vector<std::string> roles_to_try(const Recipe& recipe);

// Emitted CUDA source of every kernel the recipe can be asked for: each role of roles_to_try x
// usage (training, inference, memory) x input dtype x {single, grouped}, in that fixed order,
// as ("<role> <usage> <dtype> <single|grouped>", source) pairs; a request the recipe cannot
// serve gives the source "<rejected>". Then, for each delayed-scaling stream, its history
// kernel ("<key> history/<direction>"); last, each "gemms" entry's kernel ("gemm <pointer>").
std::vector<std::pair<std::string, std::string>> emit_all(const Recipe& recipe);

}  // namespace qf::fuzz
