#include "compiler/buffers.h"

#include "compiler/error.h"
#include "qforge/layout.cuh"

namespace qf {

int64_t ScaleGrid::offset(int64_t r, int64_t c) const {
  if (swizzled) return int64_t(swizzled_scale_offset(u64(r), u64(c), u64(padded_cols)));
  if (mn_major) return int64_t(mn_major_scale_offset(u64(r), u64(c), u64(padded_rows)));
  return r * padded_cols + c;
}

void check_extent(Shape2D in, bool grouped, const std::string& arg) {
  const std::string got = "[" + std::to_string(in.m) + ", " + std::to_string(in.k) + "]";
  if (in.m < (grouped ? 0 : 1) || in.k < 1)
    throw UserError(arg, grouped ? "expected a grouped tensor of 0..2^31 rows (all members) and 1..2^31 columns, got " + got
                                 : "expected a non-empty 2-D tensor, got " + got);
  if (in.m > kMaxDim || in.k > kMaxDim) throw UserError(arg, "dimensions above 2^31 are not supported, got " + got);
  if (in.m * in.k > kMaxElems) throw UserError(arg, "more than 2^50 elements are not supported, got " + got);
}

namespace {
// Packed (two per byte) data along the rows of a stream's layout needs an even row length.
void check_packed_rows(const Stream& s, int64_t row_length) {
  if (traits(s.format).elems_per_byte == 2 && row_length % 2 != 0)
    throw UserError("shape", std::string(name(s.dir)) + " " + std::string(traits(s.format).name) +
                                 " data packs two elements per byte along its rows: the row length (" +
                                 std::to_string(row_length) + ") must be even");
}
}  // namespace

void check_shape(const Plan& p, Shape2D in) {
  check_extent(in, false);
  for (const auto& s : p.streams) {
    check_packed_rows(s, data_shape(s, in).k);
    if (s.rht && in.m % 16 != 0)
      throw UserError("shape", "the random Hadamard transform of the " + std::string(name(s.dir)) +
                                   " stream works on groups of 16 rows: M (" + std::to_string(in.m) +
                                   ") must be a multiple of 16");
  }
}

void check_grouped_shape(const Plan& p, Shape2D total) {
  check_extent(total, true);
  for (const auto& s : p.streams)
    if (s.layout != DataLayout::Transposed) check_packed_rows(s, total.k);
}

Shape2D data_shape(const Stream& s, Shape2D in) {
  return s.layout == DataLayout::Transposed ? Shape2D{in.k, in.m} : in;
}

int data_bits(const Stream& s) {
  return s.format == ElemFormat::Identity ? 8 * traits(s.out_dtype).bytes : 8 / traits(s.format).elems_per_byte;
}

bool transposes_wide(const Plan& p) {
  for (const auto& s : p.streams)
    if (s.layout == DataLayout::Transposed && data_bits(s) >= 16) return true;
  return false;
}

bool register_pair_streams(const Plan& p) {
  if (p.streams.size() != 2 || traits(p.input).bytes != 2) return false;
  for (const auto& a : p.amax)
    if (a.rht) return false;
  for (const auto& s : p.streams)
    if (s.rounding != Rounding::Nearest || s.rht || s.format == ElemFormat::Identity || data_bits(s) != 8) return false;
  const Stream& r = p.streams[0];
  const Stream& c = p.streams[1];
  return r.dir == Direction::Rowwise && c.dir == Direction::Columnwise && c.layout == DataLayout::Transposed &&
         r.scaling.index() == c.scaling.index();
}

EntryShape scale_entry_shape(const Stream& s) {
  const bool transposed = s.layout == DataLayout::Transposed;
  return std::visit(
      [&](const auto& m) -> EntryShape {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, NoScaling> || std::is_same_v<M, PerTensorCurrent> ||
                      std::is_same_v<M, PerTensorDelayed>) {
          return {0, 0};
        } else if constexpr (std::is_same_v<M, PerChannel>) {
          // rowwise: one per row of X; columnwise: one per column of X (a row of the
          // transposed data, a column of the [M, K] data).
          const bool per_data_row = s.dir == Direction::Rowwise || transposed;
          return per_data_row ? EntryShape{1, 0} : EntryShape{0, 1};
        } else {
          // FP32 block scaling stores one scale per block or tile; MX and NVFP4 store one per
          // 1D block of the direction even for 2D tiles (the tile's value repeated), as
          // block-scaled GEMMs read them.
          BlockShape b = m.block;
          if constexpr (!std::is_same_v<M, BlockScaling>) {
            if (b.is_2d()) b = s.dir == Direction::Rowwise ? BlockShape{1, b.cols} : BlockShape{b.rows, 1};
          }
          if (transposed) std::swap(b.rows, b.cols);
          return {b.rows, b.cols};
        }
      },
      s.scaling);
}

ScaleGrid scale_grid(const Stream& s, Shape2D in) {
  ScaleGrid g;
  const Shape2D d = data_shape(s, in);
  if (std::holds_alternative<NoScaling>(s.scaling)) return g;
  const EntryShape e = scale_entry_shape(s);
  g.block_rows = e.rows ? e.rows : d.m;
  g.block_cols = e.cols ? e.cols : d.k;
  g.rows = e.rows ? int64_t(ceil_div(u64(d.m), u64(e.rows))) : 1;
  g.cols = e.cols ? int64_t(ceil_div(u64(d.k), u64(e.cols))) : 1;
  g.swizzled = s.scale_layout == ScaleLayout::Swizzled;
  g.mn_major = s.scale_layout == ScaleLayout::MnMajor;
  g.padded_rows = g.swizzled ? int64_t(round_up(u64(g.rows), 128)) : g.mn_major ? int64_t(mn_major_rows(u64(g.rows))) : g.rows;
  g.padded_cols = g.swizzled ? int64_t(round_up(u64(g.cols), 4)) : g.cols;
  return g;
}

std::vector<BufferDesc> output_buffers(const Plan& p, Shape2D in) {
  std::vector<BufferDesc> out;
  for (size_t i = 0; i < p.streams.size(); ++i) {
    const Stream& s = p.streams[i];
    const std::string dir(name(s.dir));
    const Shape2D d = data_shape(s, in);
    BufferDesc data;
    data.name = dir + "_data";
    data.kind = BufferKind::Data;
    data.stream = int(i);
    if (s.format == ElemFormat::Identity) {
      const auto& t = traits(s.out_dtype);
      data.storage = t.bytes == 4 ? Storage::F32 : Storage::U16;
      data.dtype = std::string(t.name);
      data.shape = {d.m, d.k};
      data.bytes = d.m * d.k * t.bytes;
    } else {
      const auto& t = traits(s.format);
      data.storage = Storage::U8;
      data.dtype = std::string(t.name) + (t.elems_per_byte == 2 ? "x2" : "");
      data.shape = {d.m, d.k / t.elems_per_byte};
      data.bytes = d.m * (d.k / t.elems_per_byte);
    }
    out.push_back(data);

    const ScaleStorage ss = traits(s.scaling).scale_storage;
    if (ss != ScaleStorage::None) {
      const ScaleGrid g = scale_grid(s, in);
      BufferDesc sc;
      sc.name = dir + "_scale_inv";
      sc.kind = BufferKind::ScaleInv;
      sc.stream = int(i);
      sc.storage = ss == ScaleStorage::F32 ? Storage::F32 : Storage::U8;
      sc.dtype = std::string(name(ss));
      if (std::holds_alternative<PerTensorCurrent>(s.scaling) || std::holds_alternative<PerTensorDelayed>(s.scaling))
        sc.shape = {1};
      else if (std::holds_alternative<PerChannel>(s.scaling))
        sc.shape = {g.rows * g.cols};
      else if (g.mn_major)
        sc.shape = {g.padded_cols, g.padded_rows};
      else
        sc.shape = {g.padded_rows, g.padded_cols};
      sc.bytes = g.size() * storage_bytes(sc.storage);
      sc.zero_padding = g.swizzled;
      if (block_of(s.scaling)) sc.scale_layout = std::string(name(s.scale_layout));
      out.push_back(sc);
    }
  }
  for (size_t a = 0; a < p.amax.size(); ++a) {
    if (p.amax[a].scope != AmaxScope::Tensor) continue;
    BufferDesc am;
    am.name = amax_output_name(p, int(a));
    am.kind = BufferKind::Amax;
    am.storage = Storage::F32;
    am.dtype = "fp32";
    am.shape = {1};
    am.bytes = 4;
    out.push_back(am);
  }
  return out;
}

std::vector<BufferDesc> input_buffers(const Plan& p) {
  std::vector<BufferDesc> in;
  for (size_t i = 0; i < p.streams.size(); ++i) {
    const Stream& s = p.streams[i];
    if (!std::holds_alternative<PerTensorDelayed>(s.scaling)) continue;
    std::string n = scale_input_name(p, s);
    bool dup = false;
    for (const auto& b : in) dup |= b.name == n;
    if (dup) continue;
    in.push_back(BufferDesc{n, BufferKind::Scale, n == "scale" ? -1 : int(i), Storage::F32, "fp32", {1}, 4, false, ""});
  }
  return in;
}

}  // namespace qf
