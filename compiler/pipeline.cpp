#include "compiler/pipeline.h"

#include <chrono>
#include <cstdlib>
#include <sstream>

#include "compiler/env.h"
#include "compiler/error.h"
#include "compiler/lower.h"
#include "compiler/passes/prune_usage.h"
#include "compiler/passes/schedule_phases.h"
#include "compiler/passes/select_tiles.h"
#include "compiler/passes/share_amax.h"
#include "runtime/log.h"

namespace qf {

const std::vector<std::string>& pass_names() {
  static const std::vector<std::string> kNames = {"lower", "prune_usage", "share_amax",
                                                  "schedule_phases", "select_tiles"};
  return kNames;
}

namespace {

class Runner {
 public:
  explicit Runner(const PipelineOptions& o) : opt_(o) {
    // Pass names from the caller (qforge inspect --dump-after) and from QFORGE_DUMP_AFTER, each
    // checked under the name the user gave it.
    std::string names;
    for (const auto& n : pass_names()) names += (names.empty() ? "" : ", ") + n;
    auto add = [&](const std::string& d, const char* where) {
      bool known = d == "all";
      for (const auto& n : pass_names()) known |= n == d;
      if (!known) throw UserError(where, "unknown pass \"" + d + "\"; expected all or one of " + names);
      dump_.push_back(d);
    };
    for (const auto& d : opt_.dump_after) add(d, "--dump-after");
    if (const char* env = std::getenv("QFORGE_DUMP_AFTER")) {
      std::stringstream ss(env);
      for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) add(item, "QFORGE_DUMP_AFTER");
    }
    time_ = opt_.time_passes || env_flag("QFORGE_TIME_PASSES", false);
  }

  template <class F>
  Plan run(const std::string& pass, const Plan* before, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    Plan after = f();
    const auto t1 = std::chrono::steady_clock::now();
    if (opt_.verify) verify(after);
    if (time_) {
      std::ostringstream os;
      os << "pass " << pass << " took " << std::chrono::duration<double, std::micro>(t1 - t0).count() << " us";
      emit(opt_.log ? "qforge: " + os.str() + "\n" : os.str());
    }
    if (wants(pass)) {
      std::string text = "// ---- after " + pass + (before && *before == after ? " (unchanged)" : "") + "\n";
      if (!(before && *before == after)) text += print(after);
      emit(text);
    }
    return after;
  }

 private:
  bool wants(const std::string& pass) const {
    for (const auto& d : dump_)
      if (d == "all" || d == pass) return true;
    return false;
  }
  // To the caller's stream, else to the library's log (asked for by a switch: whatever its level).
  void emit(const std::string& text) {
    if (opt_.log) *opt_.log << text;
    else log::write_requested(log::Level::Info, std::string_view(text).substr(0, text.find_last_not_of('\n') + 1));
  }
  const PipelineOptions& opt_;
  std::vector<std::string> dump_;
  bool time_ = false;
};

}  // namespace

Plan compile_plan(const Recipe& recipe, const PlanRequest& req, const PipelineOptions& options) {
  Runner r(options);
  Plan p = r.run("lower", nullptr, [&] { return lower(recipe, req); });
  // Pruning first: later passes must not share or schedule work for dropped outputs.
  p = r.run("prune_usage", &p, [&] { return prune_usage(p); });
  // Sharing before scheduling: a shared reduction is scheduled once.
  p = r.run("share_amax", &p, [&] { return share_amax(p); });
  p = r.run("schedule_phases", &p, [&] { return schedule_phases(p); });
  // Tiles last: they depend on the final set of block amaxes and streams.
  p = r.run("select_tiles", &p, [&] { return select_tiles(p); });
  return p;
}

}  // namespace qf
