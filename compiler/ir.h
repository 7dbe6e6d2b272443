// The kernel plan: qforge's IR. A plan says, for one role of one recipe, one input dtype and
// one shape class (single tensor or grouped), what a fused quantize must do:
//
//   amax sources  - the reductions scales depend on (tensor, channel or block scope, over
//                   raw or RHT-rotated values);
//   streams       - the outputs (direction, element format, scaling, rounding, RHT, layouts);
//   phases        - the kernels to run in order: global amax reductions, then the cast;
//   tile          - the cast kernel's tile configuration.
//
// Plans are values: passes take one and return a new one (compiler/passes/). Every plan a pass
// returns is checked by verify() in debug and test builds. print() is the one printer
// (`qforge inspect`, golden tests).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "compiler/formats.h"
#include "compiler/recipe.h"

namespace qf {

struct AmaxSource {
  AmaxScope scope = AmaxScope::Tensor;  // Tensor, Channel or Block
  BlockShape block;                     // Block scope: the block; Channel: {1,K} or {M,1} as {1,0}/{0,1}
  Direction channel_dir = Direction::Rowwise;  // Channel scope: per row (rowwise) or per column
  std::optional<Rht> rht;               // taken over RHT-rotated values
  bool before_cast = false;             // needed before any element is cast (global reduction)
  bool operator==(const AmaxSource&) const = default;
};

struct Stream {
  Direction dir = Direction::Rowwise;
  ElemFormat format = ElemFormat::Identity;
  Scaling scaling = NoScaling{};
  Rounding rounding = Rounding::Nearest;
  std::optional<Rht> rht;
  DataLayout layout = DataLayout::RowMajor;
  ScaleLayout scale_layout = ScaleLayout::Compact;
  DType out_dtype = DType::BF16;  // identity streams: the element dtype written
  int tensor_amax = -1;           // index into Plan::amax (Tensor scope), -1 if none
  int local_amax = -1;            // index into Plan::amax (Block or Channel scope), -1 if none
  bool operator==(const Stream&) const = default;
};

enum class PhaseKind : uint8_t { AmaxReduce, Cast };
struct Phase {
  PhaseKind kind = PhaseKind::Cast;
  std::vector<int> amax;  // AmaxReduce: the sources it computes
  bool operator==(const Phase&) const = default;
};

struct TileConfig {
  int rows = 0;     // tile extent along M
  int cols = 0;     // tile extent along K
  int threads = 0;  // threads per block
  int vec = 0;      // input elements per vector load
  // CTAs per SM the cast kernel's registers are sized for (__launch_bounds__ min blocks): fewer
  // gives each thread more registers. 0: codegen's default (cast_min_blocks: by threads and
  // shared memory). A `qforge tune` dimension.
  int min_blocks = 0;
  // Whether min_blocks CTAs of this tile's threads fit an SM's 2048 threads (0: the default).
  bool min_blocks_fit() const { return min_blocks >= 0 && int64_t(min_blocks) * threads <= 2048; }
  bool operator==(const TileConfig&) const = default;
};

struct PlanRequest {
  std::string role;              // "linear:weight"
  DType input = DType::BF16;
  std::optional<Usage> usage;    // empty: the recipe's default
  bool grouped = false;
};

struct Plan {
  std::string recipe;  // recipe name (metadata only; never reaches generated source)
  std::string role;
  DType input = DType::BF16;
  Usage usage = Usage::Training;
  bool grouped = false;
  std::vector<AmaxSource> amax;
  std::vector<Stream> streams;  // at most one per direction, rowwise first
  std::vector<Phase> phases;    // empty until schedule_phases
  TileConfig tile;              // zero until select_tiles
  bool operator==(const Plan&) const = default;

  const Stream* stream(Direction d) const {
    for (const auto& s : streams)
      if (s.dir == d) return &s;
    return nullptr;
  }
};

// Factory: a stream for one direction spec, with its amax sources appended to `amax`.
Stream make_stream(Direction dir, const DirectionSpec& spec, DType input,
                   std::vector<AmaxSource>& amax);

// Throws InternalError describing the first broken invariant.
void verify(const Plan& plan);

// The textual form of a plan (stable; golden tests depend on it).
std::string print(const Plan& plan);

// Names of the amax outputs and scale inputs (derived from sharing), used by buffers and the
// printer: "amax" when both streams share one source, else "<direction>_amax".
std::string amax_output_name(const Plan& plan, int amax_index);
// Delayed scaling: "scale" when both streams read one scale, else "<direction>_scale".
std::string scale_input_name(const Plan& plan, const Stream& s);

}  // namespace qf
