// Tile choices stored by `qforge tune` (runtime/tuning.h): round trip through a cache root,
// keyed by plan (not its tile or recipe name), arch and GPU model; invalid or foreign records
// are ignored; QFORGE_TUNING=0 disables them. No GPU needed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "compiler/passes/select_tiles.h"
#include "compiler/pipeline.h"
#include "compiler/recipe.h"
#include "runtime/tuning.h"

namespace {

namespace fs = std::filesystem;
using namespace qf;

Plan mxfp8_plan() {
  const Recipe r = load_recipe(fs::path(QF_SOURCE_DIR) / "recipes" / "mxfp8.json");
  return compile_plan(r, PlanRequest{"linear:input", DType::BF16, Usage::Training, false});
}

struct TempCache {
  fs::path dir;
  rt::KernelCache cache;
  static rt::CacheOptions options(const fs::path& d) {
    rt::CacheOptions o;
    o.writable_root = d;
    return o;
  }
  TempCache() : dir(fs::temp_directory_path() / ("qforge-tuning-test-" + std::to_string(::getpid()))), cache(options(dir)) {}
  ~TempCache() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

TEST(Tuning, StoredTileIsFoundForTheSamePlanArchAndDevice) {
  TempCache c;
  const Plan p = mxfp8_plan();
  const auto cands = tile_candidates(p);
  ASSERT_GE(cands.size(), 2u);
  const rt::TuningRecord rec{cands[1], 100.0, 120.0, 8192, 8192, "NVIDIA H200", "sm_90a"};
  ASSERT_TRUE(rt::store_tuning(p, rec, c.cache));
  auto got = rt::find_tuning(p, "sm_90a", "NVIDIA H200", c.cache);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tile, cands[1]);
  EXPECT_EQ(got->time_us, 100.0);

  Plan renamed = p;  // the recipe name and the plan's own tile are not part of the key
  renamed.recipe = "other";
  renamed.tile = cands[2 % cands.size()];
  EXPECT_TRUE(rt::find_tuning(renamed, "sm_90a", "NVIDIA H200", c.cache).has_value());
  EXPECT_FALSE(rt::find_tuning(p, "sm_100a", "NVIDIA H200", c.cache).has_value()) << "another arch";
  EXPECT_FALSE(rt::find_tuning(p, "sm_90a", "NVIDIA H100 80GB HBM3", c.cache).has_value()) << "another GPU";

  ::setenv("QFORGE_TUNING", "0", 1);
  EXPECT_FALSE(rt::find_tuning(p, "sm_90a", "NVIDIA H200", c.cache).has_value());
  ::unsetenv("QFORGE_TUNING");
}

TEST(Tuning, RecordsThatDoNotFitThePlanAreIgnored) {
  TempCache c;
  const Plan p = mxfp8_plan();
  rt::TuningRecord rec{p.tile, 1.0, 2.0, 64, 64, "gpu", "sm_90a"};
  ASSERT_TRUE(rt::store_tuning(p, rec, c.cache));
  const fs::path f = c.dir / "qforge-v1" / "tuning" / (rt::tuning_key(p, "sm_90a", "gpu") + ".json");
  ASSERT_TRUE(fs::exists(f));
  {  // a tile of 24 columns does not fit any plan (32-column multiples)
    std::ifstream in(f);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto pos = text.find("\"cols\": " + std::to_string(p.tile.cols));
    ASSERT_NE(pos, std::string::npos) << text;
    text.replace(pos, std::string("\"cols\": " + std::to_string(p.tile.cols)).size(), "\"cols\": 24");
    std::ofstream(f) << text;
  }
  EXPECT_FALSE(rt::find_tuning(p, "sm_90a", "gpu", c.cache).has_value());
  std::ofstream(f) << "{ not json";
  EXPECT_FALSE(rt::find_tuning(p, "sm_90a", "gpu", c.cache).has_value());
  // Numbers past an int are refused, not truncated (4294967360 would read as 64), and a register
  // budget whose CTAs x threads would wrap an int does not fit.
  for (const auto& [field, value] : {std::pair{"rows", std::string("4294967360")}, std::pair{"min_blocks", std::string("16777216")}}) {
    nlohmann::json j;
    ASSERT_TRUE(rt::store_tuning(p, rec, c.cache));
    j = nlohmann::json::parse(std::ifstream(f));
    j["tile"][field] = nlohmann::json::parse(value);
    std::ofstream(f) << j.dump();
    EXPECT_FALSE(rt::find_tuning(p, "sm_90a", "gpu", c.cache).has_value()) << field;
  }
}

// A register-budget choice (min_blocks) round-trips; a record written before the field existed
// (no "min_blocks") reads as the default budget.
TEST(Tuning, RegisterBudgetRoundTripsAndOldRecordsReadAsDefault) {
  TempCache c;
  const Plan p = mxfp8_plan();
  TileConfig t = p.tile;
  t.min_blocks = 2;
  ASSERT_TRUE(tile_fits(p, t));
  ASSERT_TRUE(rt::store_tuning(p, rt::TuningRecord{t, 1.0, 2.0, 64, 64, "gpu", "sm_90a"}, c.cache));
  auto got = rt::find_tuning(p, "sm_90a", "gpu", c.cache);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tile.min_blocks, 2);
  const fs::path f = c.dir / "qforge-v1" / "tuning" / (rt::tuning_key(p, "sm_90a", "gpu") + ".json");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(f));
  j["tile"].erase("min_blocks");
  std::ofstream(f) << j.dump();
  got = rt::find_tuning(p, "sm_90a", "gpu", c.cache);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tile.min_blocks, 0);
  j["tile"]["min_blocks"] = 64;  // 64 CTAs of 256 threads do not fit an SM
  std::ofstream(f) << j.dump();
  EXPECT_FALSE(rt::find_tuning(p, "sm_90a", "gpu", c.cache).has_value());
}

}  // namespace
