#include "compiler/passes/prune_usage.h"

#include "compiler/error.h"

namespace qf {
namespace {

// True when every element's scale is the same in both orientations, so the columnwise data
// is exactly the transposed rowwise data.
bool direction_independent(const Scaling& s) {
  if (std::holds_alternative<NoScaling>(s) || std::holds_alternative<PerTensorCurrent>(s) ||
      std::holds_alternative<PerTensorDelayed>(s))
    return true;
  auto b = block_of(s);
  return b && b->is_2d();
}

bool derivable_from_rowwise(const Stream& row, const Stream& col) {
  return row.format == col.format && row.scaling == col.scaling && row.out_dtype == col.out_dtype &&
         direction_independent(col.scaling) && !col.rht &&
         col.rounding == Rounding::Nearest && row.rounding == Rounding::Nearest;
}

void require(const Plan& p, Direction d) {
  if (!p.stream(d))
    throw UserError("usage", "usage \"" + std::string(name(p.usage)) + "\" needs the " +
                                 std::string(name(d)) + " direction, but the rule for role \"" +
                                 p.role + "\" defines no \"" + std::string(name(d)) + "\"");
}

}  // namespace

Plan prune_usage(Plan p) {
  require(p, Direction::Rowwise);
  std::vector<Stream> keep;
  switch (p.usage) {
    case Usage::Training:
      require(p, Direction::Columnwise);
      keep = p.streams;
      break;
    case Usage::Inference:
      keep = {*p.stream(Direction::Rowwise)};
      break;
    case Usage::Memory: {
      require(p, Direction::Columnwise);
      const Stream& row = *p.stream(Direction::Rowwise);
      const Stream& col = *p.stream(Direction::Columnwise);
      keep = {row};
      if (!derivable_from_rowwise(row, col)) keep.push_back(col);
      break;
    }
  }
  // Drop amax sources no kept stream uses, renumbering the rest.
  std::vector<int> remap(p.amax.size(), -1);
  std::vector<AmaxSource> amax;
  for (auto& s : keep)
    for (int* ref : {&s.tensor_amax, &s.local_amax}) {
      if (*ref < 0) continue;
      if (remap[*ref] < 0) remap[*ref] = int(amax.size()), amax.push_back(p.amax[*ref]);
      *ref = remap[*ref];
    }
  p.streams = std::move(keep);
  p.amax = std::move(amax);
  return p;
}

}  // namespace qf
