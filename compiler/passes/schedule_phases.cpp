#include "compiler/passes/schedule_phases.h"

namespace qf {

Plan schedule_phases(Plan p) {
  p.phases.clear();
  Phase reduce{PhaseKind::AmaxReduce, {}};
  for (size_t i = 0; i < p.amax.size(); ++i)
    if (p.amax[i].before_cast) reduce.amax.push_back(int(i));
  if (!reduce.amax.empty()) p.phases.push_back(reduce);
  p.phases.push_back(Phase{PhaseKind::Cast, {}});
  return p;
}

}  // namespace qf
