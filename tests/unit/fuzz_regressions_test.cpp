// Replays, under the normal build, the inputs the recipe fuzzer (tests/fuzz/, scripts/fuzz.sh)
// once crashed on, and its seeds (the shipped and the malformed recipes), through the fuzzer's
// own body: CI checks every regression without clang or sanitizers. run_recipe returns
// normally on a UserError; any other exception (InternalError, a nlohmann exception, a broken
// property such as a multi-line error message) fails the test with the input's name.
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_entry.h"

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "README.md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void replay(const fs::path& dir, size_t at_least) {
  const auto files = files_in(dir);
  EXPECT_GE(files.size(), at_least) << dir;
  for (const auto& f : files) {
    try {
      qf::fuzz::run_recipe(read_bytes(f));
    } catch (const std::exception& e) {
      ADD_FAILURE() << f.filename() << ": " << e.what();
    }
  }
}

const fs::path kSource(QF_SOURCE_DIR);

TEST(FuzzRegressions, SavedCrashes) { replay(kSource / "tests" / "fuzz" / "regressions", 1); }
TEST(FuzzRegressions, ShippedRecipes) { replay(kSource / "recipes", 8); }
TEST(FuzzRegressions, MalformedRecipes) { replay(kSource / "tests" / "recipes" / "bad", 35); }

}  // namespace
