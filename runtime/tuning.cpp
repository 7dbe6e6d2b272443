#include "runtime/tuning.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "compiler/env.h"
#include "compiler/passes/select_tiles.h"
#include "runtime/log.h"
#include "runtime/nvrtc.h"
#include "runtime/sha256.h"

namespace qf::rt {
namespace fs = std::filesystem;

namespace {

fs::path record_path(const fs::path& root, const std::string& key) { return root / "qforge-v1" / "tuning" / (key + ".json"); }

bool tuning_disabled() { return !env_flag("QFORGE_TUNING", true); }

}  // namespace

std::string tuning_key(const Plan& plan, const std::string& arch, const std::string& device) {
  Plan p = plan;
  p.tile = TileConfig{};
  p.recipe.clear();  // metadata only
  std::ostringstream os;
  os << "qforge-tuning-v1\n" << print(p) << "\narch=" << arch << "\ndevice=" << device << "\ntemplates=" << templates_hash();
  return sha256_hex(os.str());
}

std::optional<TuningRecord> find_tuning(const Plan& plan, const std::string& arch, const std::string& device,
                                        const KernelCache& cache) {
  if (tuning_disabled()) return std::nullopt;
  const std::string key = tuning_key(plan, arch, device);
  std::vector<fs::path> roots;
  if (cache.writable_root()) roots.push_back(*cache.writable_root());
  for (const auto& r : cache.readonly_roots()) roots.push_back(r);
  for (const auto& root : roots) {
    const fs::path path = record_path(root, key);
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    try {
      std::ifstream in(path);
      const nlohmann::json j = nlohmann::json::parse(in);
      TuningRecord r;
      // Tile fields are small integers: a hand-edited 4294967360 must not wrap to 64.
      auto small = [](const nlohmann::json& v) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 65536)
          throw std::runtime_error("tile field out of range: " + v.dump());
        return int(v.get<int64_t>());
      };
      const nlohmann::json& t = j.at("tile");
      r.tile = TileConfig{small(t.at("rows")), small(t.at("cols")), small(t.at("threads")), small(t.at("vec")),
                          t.contains("min_blocks") ? small(t.at("min_blocks")) : 0};
      r.time_us = j.value("time_us", 0.0);
      r.default_us = j.value("default_us", 0.0);
      r.m = j.value("m", int64_t(0));
      r.k = j.value("k", int64_t(0));
      r.device = j.value("device", "");
      r.arch = j.value("arch", "");
      if (j.value("key", "") != key || !tile_fits(plan, r.tile)) throw std::runtime_error("key or tile does not fit the plan");
      return r;
    } catch (const std::exception& e) {
      warn_once("tuning " + path.string(), "ignoring tuning record " + path.string() + ": " + e.what());
    }
  }
  return std::nullopt;
}

bool store_tuning(const Plan& plan, const TuningRecord& rec, const KernelCache& cache) {
  if (!cache.writable_root() || !cache.disk_writable()) {
    log::warn("no writable cache directory; the tuning result is not stored");
    return false;
  }
  const std::string key = tuning_key(plan, rec.arch, rec.device);
  const fs::path path = record_path(*cache.writable_root(), key);
  const nlohmann::json j = {{"key", key},
                            {"recipe", plan.recipe},
                            {"role", plan.role},
                            {"input", std::string(traits(plan.input).name)},
                            {"usage", std::string(name(plan.usage))},
                            {"tile", {{"rows", rec.tile.rows}, {"cols", rec.tile.cols}, {"threads", rec.tile.threads},
                                      {"vec", rec.tile.vec}, {"min_blocks", rec.tile.min_blocks}}},
                            {"time_us", rec.time_us},
                            {"default_us", rec.default_us},
                            {"m", rec.m},
                            {"k", rec.k},
                            {"device", rec.device},
                            {"arch", rec.arch}};
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << j.dump(1) << "\n";
    if (!out) {
      log::warn("cannot write " + tmp.string() + "; the tuning result is not stored");
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    log::warn("cannot publish " + path.string() + ": " + ec.message());
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace qf::rt
