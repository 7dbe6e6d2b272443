#include "compiler/passes/select_tiles.h"

#include <algorithm>
#include <numeric>

namespace qf {

Plan select_tiles(Plan p) {
  bool transposes = false;
  int rows = 1, cols = 1;
  for (const auto& s : p.streams) {
    transposes |= s.layout == DataLayout::Transposed;
    if (s.rht) rows = std::lcm(rows, 16);
    if (s.dir == Direction::Columnwise && s.layout == DataLayout::RowMajor) rows = std::lcm(rows, 32);
  }
  for (const auto& a : p.amax)
    if (a.scope == AmaxScope::Block) rows = std::lcm(rows, a.block.rows), cols = std::lcm(cols, a.block.cols);

  TileConfig t;
  if (transposes) {
    t.rows = std::lcm(rows, 64);
    t.cols = std::lcm(cols, 64);
  } else {
    t.rows = std::lcm(rows, 4);
    t.cols = std::lcm(cols, 256);
  }
  t.vec = 16 / traits(p.input).bytes;
  t.threads = 256;
  p.tile = t;
  return p;
}

}  // namespace qf
