// The compiler pipeline, top to bottom: recipe -> lower -> passes -> plan.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "compiler/ir.h"

namespace qf {

struct PipelineOptions {
  std::vector<std::string> dump_after;  // pass names, or "all"; QFORGE_DUMP_AFTER adds to it
  bool time_passes = false;             // QFORGE_TIME_PASSES=1
  bool verify = true;                   // run verify() after every pass
  std::ostream* log = nullptr;          // where dumps and timings go (default: the library log, runtime/log.h)
};

// Names of the passes, in pipeline order (for --dump-after validation and docs).
const std::vector<std::string>& pass_names();

Plan compile_plan(const Recipe& recipe, const PlanRequest& request,
                  const PipelineOptions& options = {});

}  // namespace qf
