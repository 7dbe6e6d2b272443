#include "compiler/codegen.h"

#include <algorithm>

#include "compiler/buffers.h"
#include "compiler/emitter.h"
#include "compiler/error.h"
#include "compiler/passes/select_tiles.h"
#include "qforge/cast.cuh"
#include "qforge/history.cuh"

namespace qf {
namespace {

// How a stream walks the tile (see cast.cuh). Rowwise: runs of 4 elements, kGroup lanes per 1D
// scale block (blocks longer than 128 are reduced like 2D blocks, in shared memory first).
// Columnwise: one thread per kEpt rows of a column: the whole 1D block along M, else 16 rows.
struct RunShape {
  int ept = 4;
  int group = 1;
  bool smem_amax = false;  // block amax precomputed in shared memory (2D or long 1D blocks)
};

RunShape run_shape(const Stream& s) {
  RunShape rs;
  const auto b = block_of(s.scaling);
  if (s.dir == Direction::Rowwise) {
    rs.ept = 4;
    if (b && b->is_2d()) rs.smem_amax = true;
    else if (b && b->cols > 128) rs.smem_amax = true;
    else if (b) rs.group = b->cols / 4;
  } else {
    rs.ept = 16;
    if (b && b->is_2d()) rs.smem_amax = true;
    else if (b) rs.ept = b->rows;
  }
  return rs;
}

// Which row + transposed pair, if any, interior tiles of the plan cast from registers
// (cast_pair.cuh, kPairDirect / kMxPairDirect; the kernel's static_assert on kSmemBytes checks
// that both sides agree): a rowwise stream and its transposed copy, both with 1D blocks along
// their direction (1x128 fp32 scales on 128 x 128 tiles, or MX 1x32 byte entries, not swizzled,
// on 64 x 128 tiles) or both with 128x128 blocks (128 x 128 tiles: one block), 8-bit elements
// rounded to nearest, no RHT, a 16-bit input, 256 threads.
enum class RegisterPair { None, Block, Mx };
RegisterPair register_pair(const Plan& p) {
  if (p.tile.threads != 256 || !register_pair_streams(p)) return RegisterPair::None;
  const Stream& r = p.streams[0];
  const Stream& c = p.streams[1];
  const int n = std::holds_alternative<BlockScaling>(r.scaling) ? 128 : std::holds_alternative<MxScaling>(r.scaling) ? 32 : 0;
  const bool blocks_1d = n != 0 && *block_of(r.scaling) == BlockShape{1, n} && *block_of(c.scaling) == BlockShape{n, 1};
  const bool blocks_2d = n == 128 && *block_of(r.scaling) == BlockShape{128, 128} && *block_of(c.scaling) == BlockShape{128, 128};
  if (!blocks_1d && !blocks_2d) return RegisterPair::None;
  if (n == 128) return p.tile.rows == 128 && p.tile.cols == 128 ? RegisterPair::Block : RegisterPair::None;
  const bool swizzled = r.scale_layout == ScaleLayout::Swizzled || c.scale_layout == ScaleLayout::Swizzled;
  return p.tile.rows == 64 && p.tile.cols == 128 && !swizzled ? RegisterPair::Mx : RegisterPair::None;
}

// A per-channel row + transposed pair on 128-column tiles reduces its per-row and per-column
// amaxes in segments of 4 tiles of a tile row, read as one 512-column tile, one or two segments
// per pre-pass CTA (cast.cuh amax_kernel), so that a row takes one atomic per 512 or 1024
// columns: with one tile per CTA, the 128 atomics per row of a 16384-column input, arriving
// together from the CTAs of one tile row, took the pre-pass from 176 to 397 us on an H200
// (docs/quantize.md).
int amax_tiles(const Plan& p, const std::vector<int>& reduced) {
  bool rows = false, cols = false;
  for (int idx : reduced) {
    const AmaxSource& a = p.amax[size_t(idx)];
    if (a.scope == AmaxScope::Channel && !a.rht) (a.channel_dir == Direction::Rowwise ? rows : cols) = true;
  }
  return rows && cols && register_pair_streams(p) && p.tile.cols == 128 ? 4 : 1;
}

std::string format_type(const Stream& s) {
  if (s.format == ElemFormat::Identity)
    return "qf::Identity<" + std::to_string(traits(s.out_dtype).numerics_code) + ">";
  return std::string(traits(s.format).device_type);
}

void emit_stream(Emitter& e, const Plan& p, int index, int& scratch_entries) {
  const Stream& s = p.streams[size_t(index)];
  const RunShape rs = run_shape(s);
  const auto b = block_of(s.scaling);
  const EntryShape entry = scale_entry_shape(s);
  const bool block2d = rs.smem_amax;
  float eps = 0.0f;
  bool pow2 = false, mx_floor = false;
  if (auto* m = std::get_if<PerTensorCurrent>(&s.scaling)) eps = m->epsilon, pow2 = m->pow2;
  if (auto* m = std::get_if<BlockScaling>(&s.scaling)) eps = m->epsilon, pow2 = m->pow2;
  if (auto* m = std::get_if<PerChannel>(&s.scaling)) eps = m->epsilon, pow2 = m->pow2;
  if (auto* m = std::get_if<MxScaling>(&s.scaling)) mx_floor = m->rule == MxRule::Floor;
  scratch_entries += cast_scratch_entries(p.tile.rows, p.tile.cols, s.dir == Direction::Columnwise,
                                          s.layout == DataLayout::Transposed, rs.ept, block2d, b ? b->rows : 1,
                                          b ? b->cols : 1, data_bits(s), std::holds_alternative<PerChannel>(s.scaling),
                                          traits(traits(s.scaling).scale_storage).bytes == 1);
  QF_CHECK((s.dir == Direction::Rowwise ? p.tile.cols : p.tile.rows) % (rs.ept * rs.group) == 0,
           "tile fits the stream's runs");
  QF_CHECK(p.tile.cols % 32 == 0 && (!block2d || (p.tile.rows % b->rows == 0 && p.tile.cols % b->cols == 0)),
           "tile fits the stream's blocks");

  e.open("struct S" + std::to_string(index));
  e.comment(std::string(name(s.dir)) + " " + std::string(traits(s.format).name) + ", " +
            std::string(scaling_name(s.scaling)) +
            (s.dir == Direction::Columnwise ? ", layout " + std::string(name(s.layout)) : ""));
  e.alias("Format", format_type(s));
  e.constant("kIndex", int64_t(index));
  e.constant("kDir", int64_t(s.dir == Direction::Rowwise ? 0 : 1));
  e.constant("kTransposed", s.layout == DataLayout::Transposed);
  e.constant_ident("int", "kMode", traits(s.scaling).device_mode);
  e.constant("kBlockRows", int64_t(b ? b->rows : 1));
  e.constant("kBlockCols", int64_t(b ? b->cols : 1));
  e.constant("kBlock2d", block2d);
  e.constant("kEntryRows", entry.rows);
  e.constant("kEntryCols", entry.cols);
  e.constant("kSwizzled", s.scale_layout == ScaleLayout::Swizzled);
  e.constant("kMnMajor", s.scale_layout == ScaleLayout::MnMajor);
  e.constant("kEpsilon", eps);
  e.constant("kPow2", pow2);
  e.constant("kMxFloor", mx_floor);
  e.constant("kStochastic", s.rounding == Rounding::Stochastic);
  e.constant("kRht", s.rht.has_value());
  e.constant("kTensorAmax", int64_t(s.tensor_amax));
  e.constant("kLocalAmax", int64_t(s.local_amax));
  e.constant("kEpt", int64_t(rs.ept));
  e.constant("kGroup", int64_t(rs.group));
  e.close(";");
}

}  // namespace

std::string_view name(QuantizeForm f) { return f == QuantizeForm::Separate ? "separate" : "all"; }
std::string_view name(Tiles t) { return t == Tiles::Any ? "any" : "interior"; }

bool interior_tiles(const TileConfig& tile, int64_t m, int64_t k) {
  return tile.rows > 0 && tile.cols > 0 && m > 0 && k > 0 && m % tile.rows == 0 && k % tile.cols == 0 && m % 16 == 0 &&
         k % 16 == 0;
}

std::vector<KernelSource::Kernel> KernelSource::kernels() const {
  std::vector<Kernel> out = {{"cast_kernel", &cast_kernel}};
  if (amax_kernel) out.push_back({"amax_kernel", &*amax_kernel});
  if (fused_kernel && *fused_kernel != cast_kernel) out.push_back({"fused_kernel", &*fused_kernel});
  if (row_kernel) out.push_back({"row_kernel", &*row_kernel});
  return out;
}

bool has_row_pass(const Plan& p) {
  if (p.streams.empty() || p.amax.empty()) return false;
  for (const auto& s : p.streams)
    if (s.dir != Direction::Rowwise || s.layout != DataLayout::RowMajor || s.rht ||
        !std::holds_alternative<PerChannel>(s.scaling))
      return false;
  for (const auto& a : p.amax)
    if (a.scope != AmaxScope::Channel || a.channel_dir != Direction::Rowwise || a.rht) return false;
  return true;
}

// The one-launch form for single tensors that fit on the GPU at once: the plan has a tensor amax
// (reduced in the pre-pass, or reported during the cast into an output the kernel zeroes) or
// per-channel amaxes (reduced in the pre-pass into the workspace, which the kernel zeroes).
bool has_one_launch(const Plan& p) {
  for (const auto& a : p.amax)
    if (a.scope == AmaxScope::Tensor || a.scope == AmaxScope::Channel) return true;
  return false;
}

bool own_fused_kernel(const Plan& p) {
  const bool pair = register_pair_streams(p) && p.tile.rows == 128 && p.tile.cols == 128 && p.tile.threads == 256;
  return has_one_launch(p) && (pair || p.streams.size() == 1);
}

QuantizeForm complete_form(const Plan& p) { return has_one_launch(p) ? QuantizeForm::All : QuantizeForm::Separate; }

QuantizeForm separate_form(const Plan& p) { return own_fused_kernel(p) ? QuantizeForm::Separate : complete_form(p); }

std::vector<QuantizeForm> quantize_forms(const Plan& p) {
  if (separate_form(p) == complete_form(p)) return {complete_form(p)};
  return {separate_form(p), complete_form(p)};
}

KernelSource emit_quantize(const Plan& p, QuantizeForm form, Tiles tiles) {
  verify(p);
  QF_CHECK(p.tile.rows > 0 && !p.phases.empty(), "emit_quantize needs a fully compiled plan");
  QF_CHECK(form == QuantizeForm::Separate || has_one_launch(p), "the all form of a plan without a fused kernel");
  // A plan whose one kernel serves both forms has one program: its separate launches' too.
  if (form == QuantizeForm::Separate) form = separate_form(p);
  // The fused kernel and its config: in the All form only. The separate form of a plan that has
  // no fused kernel is its complete program.
  const bool with_fused = form == QuantizeForm::All;
  QF_CHECK(p.amax.size() <= size_t(kMaxAmaxSlots), "at most ", kMaxAmaxSlots, " amax sources");
  QF_CHECK(p.streams.size() <= size_t(kMaxStreams), "at most ", kMaxStreams, " streams");

  std::optional<Rht> rht;
  for (const auto& s : p.streams)
    if (s.rht) rht = s.rht;
  for (const auto& a : p.amax)
    if (a.rht) {
      QF_CHECK(!rht || *rht == *a.rht, "one RHT per plan");
      rht = a.rht;
    }

  std::vector<int> reduced;
  for (const auto& ph : p.phases)
    if (ph.kind == PhaseKind::AmaxReduce) reduced.insert(reduced.end(), ph.amax.begin(), ph.amax.end());
  const bool row_pass = has_row_pass(p);

  Emitter e;
  // A plan's complete program (complete_form) keeps the first line it has always had, so its
  // source, key and code are what they were before the separate form existed; the separate form
  // of a plan with a fused kernel names itself and its kernels there, so its source (and key)
  // differs from the complete program's also where they would define the same configs.
  // A program for interior tiles only names that too (its Cfg differs as well).
  const std::string interior = tiles == Tiles::Interior ? ", for interior tiles only" : "";
  if (with_fused || !has_one_launch(p)) {
    e.comment("Generated by qforge (compiler/codegen.cpp) from a quantize plan" + interior + ". Do not edit.");
  } else {
    std::string kinds = "cast_kernel";
    if (!reduced.empty()) kinds += ", amax_kernel";
    if (row_pass) kinds += ", row_kernel";
    e.comment("Generated by qforge (compiler/codegen.cpp) from a quantize plan: its separate form (" + kinds + ")" +
              interior + ". Do not edit.");
  }
  e.line("#include \"qforge/cast.cuh\"");
  e.blank();
  e.open("namespace qf_gen");

  int scratch_entries = 0;
  for (size_t i = 0; i < p.streams.size(); ++i) emit_stream(e, p, int(i), scratch_entries);

  for (int idx : reduced) {
    const AmaxSource& a = p.amax[size_t(idx)];
    QF_CHECK(a.scope == AmaxScope::Tensor || a.scope == AmaxScope::Channel, "global reductions only");
    e.open("struct A" + std::to_string(idx));
    e.constant("kSlot", int64_t(idx));
    e.constant_ident("int", "kScope",
                     a.scope == AmaxScope::Tensor ? "qf::kScopeTensor"
                     : a.channel_dir == Direction::Rowwise ? "qf::kScopeChannelRows"
                                                           : "qf::kScopeChannelCols");
    e.constant("kRht", a.rht.has_value());
    e.close(";");
  }

  KernelSource ks;
  ks.tile = p.tile;
  // 16-bit inputs are staged as their own bits where fp32 staging would hold the SM below the
  // CTAs its threads allow (cast_min_blocks: 128-row tiles of 128x128 blocks), and the register
  // target is then 4 CTAs of 256 threads, not 5 (spills below 64 registers). Measured on an H100
  // at 16384^2 (docs/quantize.md): 128x128 row + transposed 77 -> 80 % of copy
  // bandwidth. Tiles with transposed 1D blocks longer than 16 rows stay fp32 (1x128 row +
  // transposed: 61 -> 58 % with 16-bit staging; after the staged transposed output, 457 us with
  // fp32 against 448 / 469 us with 16-bit staging at 3 / 4 CTAs per SM). Elsewhere fp32, which
  // reads take as they are.
  const bool in16 = traits(p.input).bytes == 2;
  const u32 smem32 = cast_smem_bytes(p.tile.rows, p.tile.cols, rht.has_value(), scratch_entries, false);
  const u32 smem16 = cast_smem_bytes(p.tile.rows, p.tile.cols, rht.has_value(), scratch_entries, true);
  bool long_transposed_blocks = false;
  for (const auto& st : p.streams)
    if (auto b = block_of(st.scaling); b && st.layout == DataLayout::Transposed && !b->is_2d() && std::max(b->rows, b->cols) > 16)
      long_transposed_blocks = true;
  const bool stage16 = in16 && !long_transposed_blocks &&
                       cast_min_blocks(p.tile.threads, smem16) > cast_min_blocks(p.tile.threads, smem32);
  ks.smem_bytes = stage16 ? smem16 : smem32;
  // A program for interior tiles only of a register_pair plan stages nothing: the SM's CTAs are
  // then bounded by registers, sized as below unless the tile names its own: 3 CTAs of 256
  // threads for 1x128 blocks (80 registers; 2 at 128 before: 320 -> 292 us at 16384^2 on an H200,
  // docs/quantize.md), 4 for MX (64 registers, as the staged path's shared memory allowed).
  const RegisterPair pair = tiles == Tiles::Interior ? register_pair(p) : RegisterPair::None;
  if (pair != RegisterPair::None) ks.smem_bytes = cast_pair_smem_bytes(pair == RegisterPair::Mx);
  // The CTAs per SM registers are sized for, by threads and shared memory (16-bit staging aims at
  // 1024 threads per SM).
  auto default_min_blocks = [&](int threads) {
    return stage16 ? cast_min_blocks(threads, smem16, 1024) : cast_min_blocks(threads, smem32);
  };
  int min_blocks = p.tile.min_blocks;
  if (min_blocks <= 0)
    min_blocks = pair == RegisterPair::Block ? 3 : pair == RegisterPair::Mx ? 4 : default_min_blocks(p.tile.threads);
  ks.min_blocks = min_blocks;
  e.open("struct Cfg");
  e.constant("kInDtype", int64_t(traits(p.input).numerics_code));
  e.constant("kInMaxFinite", traits(p.input).max_finite);
  e.constant("kTileRows", int64_t(p.tile.rows));
  e.constant("kTileCols", int64_t(p.tile.cols));
  e.constant("kThreads", int64_t(p.tile.threads));
  e.constant("kRht", rht.has_value());
  e.constant_u32("kRhtMask", rht ? rht->sign_mask : 0u);
  e.constant("kStage16", stage16);
  // CTA order over the tiles (cast_schedule.cuh, tile_pos): column-fastest, except for plans with a
  // transposed copy of 16-bit or wider elements (bf16 passthrough + transpose, measured 592 us
  // row-fastest against 872 us column-fastest at 16384^2 on an H100).
  e.constant("kRowFastest", transposes_wide(p));
  e.constant("kMinBlocks", int64_t(min_blocks));
  e.constant_u32("kSmemBytes", ks.smem_bytes);
  if (tiles == Tiles::Interior) e.constant("kInteriorOnly", true);
  ks.amax_tiles = amax_tiles(p, reduced);
  if (ks.amax_tiles > 1) e.constant("kAmaxTiles", int64_t(ks.amax_tiles));
  e.close(";");
  // The one-launch form runs on the cast's CTA and launch bounds.
  if (has_one_launch(p)) ks.fused_min_blocks = min_blocks;
  // The one-pass form's CTA: 8 warps, each thread holding up to 8 16-byte chunks of its row (a
  // bf16 row of up to 16384 elements on 8 warps), 4 CTAs per SM (64 registers; 128 KB of loads in
  // flight per SM).
  if (row_pass) {
    ks.row_threads = 256;
    ks.row_chunks = 8;
    e.open("struct CfgRow : Cfg");
    e.constant("kThreads", int64_t(ks.row_threads));
    e.constant("kRowChunks", int64_t(ks.row_chunks));
    e.constant("kMinBlocks", int64_t(4));
    e.close(";");
  }
  e.close("  // namespace qf_gen");

  std::string streams;
  for (size_t i = 0; i < p.streams.size(); ++i) streams += ", qf_gen::S" + std::to_string(i);
  std::string pre = "qf::PrePass<";
  for (size_t i = 0; i < reduced.size(); ++i) pre += (i ? ", qf_gen::A" : "qf_gen::A") + std::to_string(reduced[i]);
  pre += ">";
  // A plan with a one-launch form has one kernel for both forms' casts (cast_fused_kernel) unless
  // its cast kernel casts interior tiles other than from its staged tile (own_fused_kernel).
  if (with_fused && !own_fused_kernel(p)) {
    ks.cast_kernel = "qf::cast_fused_kernel<qf_gen::Cfg, " + pre + streams + ">";
    ks.fused_kernel = ks.cast_kernel;
  } else {
    ks.cast_kernel = "qf::cast_kernel<qf_gen::Cfg" + streams + ">";
    if (with_fused) ks.fused_kernel = "qf::fused_kernel<qf_gen::Cfg, " + pre + streams + ">";
  }
  if (!reduced.empty()) {
    std::string amax = "qf::amax_kernel<qf_gen::Cfg";
    for (int idx : reduced) amax += ", qf_gen::A" + std::to_string(idx);
    ks.amax_kernel = amax + ">";
  }
  if (row_pass) {
    std::string row = "qf::row_kernel<qf_gen::CfgRow";
    for (size_t i = 0; i < p.streams.size(); ++i) row += ", qf_gen::S" + std::to_string(i);
    ks.row_kernel = row + ">";
  }
  ks.source = e.str();
  return ks;
}

KernelSource emit_history_update(const PerTensorDelayed& mode, ElemFormat format) {
  QF_CHECK(format == ElemFormat::E4M3 || format == ElemFormat::E5M2, "delayed scaling is fp8");
  QF_CHECK(mode.history_length >= 1 && mode.history_length <= 65536, "history length");
  Emitter e;
  e.comment("Generated by qforge (compiler/codegen.cpp): delayed-scaling amax history update.");
  e.line("#include \"qforge/history.cuh\"");
  e.blank();
  e.open("namespace qf_gen");
  e.open("struct HistoryCfg");
  e.constant("kLength", int64_t(mode.history_length));
  e.constant("kThreads", int64_t(mode.history_length >= 1024 ? 1024 : 32 * ((mode.history_length + 31) / 32)));
  e.constant("kMargin", int64_t(mode.margin));
  e.constant("kMostRecent", mode.amax_compute == AmaxCompute::MostRecent);
  e.constant("kFmax", traits(format).max_finite);
  e.close(";");
  e.close("  // namespace qf_gen");
  KernelSource ks;
  ks.source = e.str();
  ks.cast_kernel = "qf::amax_history_kernel<qf_gen::HistoryCfg>";
  ks.tile = TileConfig{1, mode.history_length, mode.history_length >= 1024 ? 1024 : 32 * ((mode.history_length + 31) / 32), 1};
  return ks;
}

std::vector<TileConfig> distinct_tiles(const Plan& plan, const std::vector<TileConfig>& candidates, int64_t m, int64_t k) {
  std::vector<TileConfig> out;
  std::vector<TileConfig> launched;  // each kept tile with its effective min blocks
  for (const TileConfig& t : candidates) {
    Plan p = plan;
    p.tile = t;
    TileConfig eff = t;
    const Tiles tiles = interior_tiles(t, m, k) ? Tiles::Interior : Tiles::Any;
    eff.min_blocks = emit_quantize(p, separate_form(p), tiles).min_blocks;
    if (std::find(launched.begin(), launched.end(), eff) != launched.end()) continue;
    launched.push_back(eff);
    out.push_back(t);
  }
  return out;
}

}  // namespace qf
