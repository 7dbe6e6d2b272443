// The buffers a plan reads and writes for a given input shape: names, element types, shapes
// and byte sizes. One description serves the CPU reference, the runtime's argument checks and
// allocation queries, and the CLI's .npy outputs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/ir.h"

namespace qf {

struct Shape2D {
  int64_t m = 0;  // rows (tokens)
  int64_t k = 0;  // columns (reduction dim of the forward GEMM)
};

enum class BufferKind : uint8_t { Data, ScaleInv, Amax, Scale };
enum class Storage : uint8_t { U8, U16, F32 };
constexpr int64_t storage_bytes(Storage s) { return s == Storage::F32 ? 4 : s == Storage::U16 ? 2 : 1; }

// Where each scale of a stream lives: a logical grid [rows, cols] (rows follow the data
// layout's rows), stored compact (row-major), padded + swizzled, or mn_major (column-major, the
// rows padded to a multiple of 4: stored as [cols, padded_rows]).
struct ScaleGrid {
  int64_t rows = 0, cols = 0;            // logical grid
  int64_t padded_rows = 0, padded_cols = 0;
  bool swizzled = false;
  bool mn_major = false;
  int64_t block_rows = 1, block_cols = 1;  // data elements (in data-layout coords) per entry
  int64_t size() const { return padded_rows * padded_cols; }
  int64_t offset(int64_t r, int64_t c) const;
};

struct BufferDesc {
  std::string name;     // "rowwise_data", "columnwise_scale_inv", "amax", "scale"
  BufferKind kind;
  int stream = -1;      // index into Plan::streams, -1 for amax outputs / shared inputs
  Storage storage;
  std::string dtype;    // what the bytes mean: "e4m3", "e2m1x2", "e8m0", "bf16", "fp32", ...
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  bool zero_padding = false;  // padding entries must be written as zero (swizzled scales)
  // Scale grids of blocks (block, mx, nvfp4 scaling): "compact", "swizzled" or "mn_major", the
  // order a GEMM must read them in (GemmSpec::scale_layout); empty for every other buffer.
  std::string scale_layout;
};

// The largest call: each dimension at most 2^31, M * K at most 2^50 elements, so that every
// byte count derived from a shape fits int64.
inline constexpr int64_t kMaxDim = int64_t(1) << 31, kMaxElems = int64_t(1) << 50;

// Throws UserError (argument `arg`, default "shape") unless 1 <= M, K <= 2^31 (grouped: M, the
// members' total, may be 0) and M * K <= 2^50.
void check_extent(Shape2D shape, bool grouped, const std::string& arg = "shape");
// Throws UserError (argument "shape") if the plan cannot quantize this shape.
void check_shape(const Plan& plan, Shape2D shape);
// The rules of check_shape a grouped call's K must meet on the host (each member's rows are
// device data): packed rowwise data along K needs an even K.
void check_grouped_shape(const Plan& plan, Shape2D total);

// The data elements one scale entry covers, in data-layout coordinates [rows, cols]; 0 means
// the whole extent of that dimension (per-tensor: {0, 0}; per-channel rowwise: {1, 0}).
// Kernels (cast.cuh) and scale_grid() both derive the grid from this.
struct EntryShape {
  int64_t rows = 0, cols = 0;
};
EntryShape scale_entry_shape(const Stream& s);

// Data-layout shape of a stream's output: [M, K] or [K, M] (elements, not bytes).
Shape2D data_shape(const Stream& s, Shape2D in);
// Bits one element of a stream's data takes in its buffer: the dtype's width for identity
// streams, 4 for packed fp4, else 8 (fp6 and int8 take a byte). templates/qforge/cast_encode.cuh
// StoreBits is the device-side twin.
int data_bits(const Stream& s);
// Whether the plan writes a transposed copy of 16 or 32 bits per element (the identity
// passthrough): it takes its own tile shape (select_tiles) and CTA order (codegen, kRowFastest).
bool transposes_wide(const Plan& p);
// Whether the plan is a row + transposed pair that the register paths can cast (cast_pair.cuh):
// a rowwise stream and its transposed columnwise copy of one scaling mode, 8-bit elements
// rounded to nearest, no RHT, a 16-bit input. Which modes, blocks and tiles take them:
// codegen.cpp (register_pair) and select_tiles.cpp (known_scale_pair).
bool register_pair_streams(const Plan& p);
ScaleGrid scale_grid(const Stream& s, Shape2D in);

std::vector<BufferDesc> output_buffers(const Plan& plan, Shape2D shape);
// Inputs besides the tensor itself (delayed scaling's scale).
std::vector<BufferDesc> input_buffers(const Plan& plan);

}  // namespace qf
