#include "compiler/passes/share_amax.h"

namespace qf {
namespace {
// Same reduction, regardless of when it is needed.
bool same_reduction(AmaxSource a, AmaxSource b) {
  a.before_cast = b.before_cast = false;
  return a == b;
}
}  // namespace

Plan share_amax(Plan p) {
  std::vector<AmaxSource> merged;
  std::vector<int> remap(p.amax.size());
  for (size_t i = 0; i < p.amax.size(); ++i) {
    size_t j = 0;
    while (j < merged.size() && !same_reduction(merged[j], p.amax[i])) ++j;
    if (j == merged.size()) merged.push_back(p.amax[i]);
    // A reduction needed before the cast also serves one that is merely reported.
    merged[j].before_cast = merged[j].before_cast || p.amax[i].before_cast;
    remap[i] = int(j);
  }
  for (auto& s : p.streams) {
    if (s.tensor_amax >= 0) s.tensor_amax = remap[s.tensor_amax];
    if (s.local_amax >= 0) s.local_amax = remap[s.local_amax];
  }
  p.amax = std::move(merged);
  return p;
}

}  // namespace qf
