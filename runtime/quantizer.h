// Quantize a role's tensor on a GPU: the plan's kernels, compiled (or loaded from the kernel
// cache) for the current device's arch, validated arguments, launched on a stream.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <cuda.h>

#include "compiler/buffers.h"
#include "compiler/codegen.h"
#include "compiler/ir.h"
#include "qforge/args.cuh"
#include "runtime/kernel_cache.h"
#include "runtime/tensor.h"

namespace qf::rt {

struct Dim3;
class Module;

// One program's kernels for one arch, from the cache (compiled on a miss).
struct QuantizeKernels {
  KernelSource source;
  CacheResult cached;
};
// UserError("arch", ...) unless the quantize kernels can be built for `arch`: sm_<number>[a|f]
// that NVRTC knows (or newer, as PTX), sm_80 or newer.
void check_quantize_arch(const std::string& arch);
// One form of the plan (codegen.h QuantizeForm: a cache entry of its own), compiled or loaded,
// for any tiles or interior tiles only (codegen.h Tiles). The entry's metadata names the form
// ("form": "separate" / "all") and a program for interior tiles ("tiles": "interior").
QuantizeKernels build_quantize_kernels(const Plan& plan, QuantizeForm form, const std::string& arch, KernelCache& cache,
                                       Tiles tiles = Tiles::Any);
// The same where the cache has it without compiling (KernelCache::find), else nullopt.
std::optional<QuantizeKernels> find_quantize_kernels(const Plan& plan, QuantizeForm form, const std::string& arch,
                                                     KernelCache& cache, Tiles tiles = Tiles::Any);

struct QuantizeCall {
  TensorView input;                           // [M, K], the plan's input dtype
  Shape2D shape;                              // [M, K] (grouped: total rows)
  std::map<std::string, TensorView> buffers;  // outputs and scale inputs, by buffer name
                                              // (grouped: each output holds the members' outputs
                                              // concatenated; the bytes past them are unspecified)
  TensorView workspace;                       // workspace_bytes() (may be empty when 0)
  uint64_t noop = 0;                          // optional device float: 1.0 makes the call a no-op
                                              // (outputs untouched, but amax outputs read zero)
  uint64_t seed = 0, offset = 0;              // stochastic rounding
  // Grouped: device int64 [num_members + 1] row offsets (member_rows[0] == 0, last == M).
  uint64_t member_rows = 0;
  int num_members = 0;
};

// A call after its arguments were checked: the kernels' argument struct and the buffers the
// launch zeroes first (amax outputs, swizzled scale padding, the per-channel workspace).
struct BoundCall {
  struct Zero {
    uint64_t ptr = 0;
    int64_t bytes = 0;
    bool fused_zeroes = false;  // an amax output or the channel-amax workspace: the one-launch form zeroes it itself
  };
  // At most one per output (two streams' data and scales, the amax outputs) plus the workspace.
  static constexpr int kMaxZero = 2 * kMaxStreams + kMaxAmaxSlots + 1;

  QuantizeArgs args{};
  std::array<Zero, kMaxZero> zero{};
  int num_zero = 0;
};

// The bytes stream `s`'s scale buffer of a grouped call (`members` members over total.m rows)
// must hold whatever the split, the members' scales back to back: a per-tensor scale per member
// (likewise a per-channel grid of one entry), else the grid of total.m rows with one partial
// block per member and blocked dim and each member's own swizzle (mn_major) padding; 0 for a
// stream without scales. Quantizer::grouped_capacity sizes the scale outputs by it and
// dequantize_grouped checks its scale input against it.
int64_t grouped_scale_capacity(const qf::Stream& s, Shape2D total, int members);

// Tiles of a tile row per CTA of the amax pre-pass, for a cast grid of tile_rows x tile_cols
// tiles whose program reads segments of `segment` tiles (KernelSource::amax_tiles; 1: one tile
// per CTA, always), on a device of `sms` SMs: 1 where the cast's tiles fit one wave of 4 CTAs per
// SM; else `segment`, or twice that where one segment per CTA would put more than 16 CTAs on a
// tile row (each issues one atomic per row, together) and twice keeps more than 4 CTAs per SM.
uint64_t amax_group_tiles(uint64_t tile_rows, uint64_t tile_cols, int segment, int sms);

class Quantizer {
 public:
  // With use_tuning, the first load on a device takes the tile `qforge tune` stored for this
  // plan on that device (runtime/tuning.h), if any; otherwise the plan's own tile.
  explicit Quantizer(Plan plan, KernelCache& cache = KernelCache::global(), bool use_tuning = true);

  const Plan& plan() const { return plan_; }
  // Output buffers for a single tensor of this shape (see compiler/buffers.h).
  std::vector<BufferDesc> outputs(Shape2D shape) const { return output_buffers(plan_, shape); }
  std::vector<BufferDesc> inputs() const { return input_buffers(plan_); }
  // Grouped: buffers sized for members of exactly these row counts (host-known splits).
  std::vector<BufferDesc> grouped_outputs(std::span<const int64_t> member_rows_counts, int64_t k) const;
  // What quantize() requires of a grouped call of `members` members over total.m rows, whatever
  // the split (the member sizes live on the device): output_buffers' buffers, each with the bytes
  // it is checked against (one partial block per member and blocked dim, each member's own
  // swizzle padding, an amax and a per-tensor scale per member) and a flat shape. Allocate these;
  // grouped_outputs gives what a known split fills.
  std::vector<BufferDesc> grouped_capacity(Shape2D total, int members) const;
  // Scratch the kernels need (per-channel amaxes), in bytes.
  int64_t workspace_bytes(Shape2D shape, int num_members = 1) const;

  // Validates every argument (UserError naming it), then launches on `stream` in the current
  // context. A plan with a fused kernel has two programs (codegen.h QuantizeForm), two cache
  // entries: its complete program (All: every kernel) and its separate form (the same without
  // the fused kernel). A call that launches the fused kernel loads the All entry (compiled on a
  // miss); any other call loads the All entry where it is loaded or the cache has it, else the
  // separate one, compiled on a miss in about 0.58 of the complete program's time (docs/jit.md,
  // step 5). prepare() compiles the All entry, so a prepared quantizer never compiles. A call is
  // one launch
  // (memsets included) where it can be: plans with tensor or per-channel amaxes (current /
  // delayed scaling, NVFP4, per-channel fp8 and int8) on a single tensor whose tiles all fit on
  // the GPU at once run the cooperative fused_kernel, which zeroes the amax outputs and the
  // channel workspace and reduces the amax pre-pass itself; larger or grouped calls zero them
  // with memsets and launch the amax and cast kernels. Plans with a row kernel (row_pass below)
  // take it instead wherever a call's rows fit it: one launch, the input read once.
  // QFORGE_ONE_LAUNCH=0 (read at construction) always takes the second way, and so does a call
  // captured into a CUDA graph for a plan with per-column channel amaxes (fp8 per-channel and
  // int8 SR weights in training), where the extra launches cost less than the fused form's grid
  // barriers (separate_in_capture).
  //
  // Which grids take the fused kernel: before the All entry is loaded on the device, those of at
  // most its guaranteed capacity (KernelSource::fused_min_blocks x the SM count: what its launch
  // bounds guarantee, known before compiling it), which load it; once loaded, those of at most
  // its occupancy (cuOccupancyMaxActiveBlocksPerMultiprocessor x the SM count), recorded then.
  // A cooperative launch the device refuses as too large (fewer SMs for this context: MPS, green
  // contexts) falls back to the separate launches of the same entry. Both ways write the same
  // bits, so which one serves a call changes no result. A call being captured into a CUDA graph
  // takes the separate launches where the All entry is not loaded but the separate one is,
  // rather than loading it.
  //
  // A single tensor whose tiles are all interior (codegen.h interior_tiles: M and K multiples of
  // the tile and of 16) may take a program compiled for interior tiles only (codegen.h Tiles),
  // which leaves out the edge tiles' code: where no program of its form is loaded, the cache's
  // program for interior tiles serves it, else the cache's program for any tiles (so a prepared
  // quantizer or a prewarmed cache still compiles nothing), else the interior one is compiled.
  // Both write the same bits. QFORGE_INTERIOR_PROGRAMS=0 (read at construction) turns this off.
  void quantize(const QuantizeCall& call, CUstream stream) const;

  // Whether a direct call of this single-tensor shape takes the one-launch form on the current
  // device (false for plans without it, QFORGE_ONE_LAUNCH=0 or a grid larger than one wave);
  // loads the All entry where a call would (a grid within the fused kernel's guaranteed
  // capacity). A capture may still take the separate form (above).
  bool one_launch(Shape2D shape) const;

  // Whether a direct call of this shape (16-byte aligned input; a single tensor or a grouped
  // call of M rows in all) takes the one-pass form: plans with a row kernel (compiler
  // has_row_pass: rowwise per-channel streams only) on rows of at most 16384 16-bit / 8192 fp32
  // elements, K a multiple of 16 bytes. It reads the input once; the amax pre-pass and the
  // channel workspace go unused. QFORGE_ROW_PASS=0 (read at construction) turns it off.
  bool row_pass(Shape2D shape) const;

  // Whether a direct single-tensor call of this shape may take the programs for interior tiles
  // only (quantize above): QFORGE_INTERIOR_PROGRAMS is not 0 and M and K are whole tiles (the
  // device's tile, as `qforge tune` left it) and whole 16s. Such a call takes them where they are
  // loaded or cached or nothing else is; loads nothing.
  bool interior_programs(Shape2D shape) const;

  // The argument checks of quantize() and the launch arguments they yield, without a GPU:
  // UserError naming the argument on anything wrong. What a call shape needs (buffer sizes,
  // names, the workspace) is derived once per (shape, members) and kept for the shapes used
  // last, so a repeated call checks pointers and sizes against it without recomputing it.
  BoundCall bind(const QuantizeCall& call) const;

  // Compiles (or finds in the cache) the plan's complete program (codegen.h complete_form: every
  // kernel, both forms) for any tiles and for interior tiles only (unless
  // QFORGE_INTERIOR_PROGRAMS=0), and the history kernels of its delayed-scaling streams for
  // `arch`, without a GPU, so that no later call compiles (a CUDA-graph capture included; a
  // device's first call still loads the module); returns how the cache answered for the complete
  // program for any tiles.
  CacheHow prepare(const std::string& arch) const;

 private:
  struct Form;    // one form's cache entry loaded on a device: its module and functions
  struct Loaded;  // a device's state: the plan with its tile, the launch geometry, the forms loaded
  // The current device's state (created on its first call: the tile `qforge tune` stored, the
  // geometry from codegen, no compile) and the entries loaded there so far, read under one lock.
  struct View {
    std::shared_ptr<Loaded> device;
    std::shared_ptr<const Form> separate;  // what serves the separate launches: the separate or the All entry, or null
    std::shared_ptr<const Form> all;       // the All entry (the fused kernel's), or null
    bool interior = false;                 // the call's tiles are all interior: programs for them may serve it
  };
  // `single`: the shape of a single-tensor call (null for grouped calls), whose tiles decide
  // whether programs for interior tiles may serve it.
  View load_for_current_device(const Shape2D* single = nullptr) const;
  static View view(const std::shared_ptr<Loaded>& l, bool interior);  // with mu_ held
  // The form's entry on the device: `have` if loaded, else found in the cache or compiled now
  // (for interior tiles only where `interior`), outside every lock (racing threads may both do
  // it; the cache compiles once and the first one kept wins).
  std::shared_ptr<const Form> load_form(Loaded& l, QuantizeForm f, std::shared_ptr<const Form> have, bool interior) const;
  // Whether a grid of `ctas` CTAs takes the one-launch form by what is known: the fused kernel's
  // occupancy once the All entry is loaded (`all`), else its guaranteed capacity.
  bool fits_one_launch(const Loaded& l, const Form* all, int64_t ctas, bool grouped) const;
  int row_pass_warps(Shape2D shape) const;
  struct Layout;
  std::shared_ptr<const Layout> layout(Shape2D shape, int members, bool grouped) const;

  Plan plan_;
  KernelCache& cache_;
  bool use_tuning_ = true;
  bool one_launch_ = true;  // QFORGE_ONE_LAUNCH=0 turns the fused form off (A/B, debugging)
  bool row_pass_ = false;   // the plan has a row kernel and QFORGE_ROW_PASS is not 0
  bool interior_programs_ = true;  // QFORGE_INTERIOR_PROGRAMS=0 keeps every call on the programs for any tiles
  bool separate_in_capture_ = false;  // separate_in_capture(plan_)
  // QFORGE_TEST_COOPERATIVE_TOO_LARGE=1 (read at construction; tests only): every cooperative
  // launch of the fused kernel is refused, before launching, as CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
  // (what a context with fewer SMs than the device returns), so the fallback runs on any GPU.
  bool refuse_cooperative_ = false;
  mutable std::mutex mu_;  // guards loaded_ and each Loaded's forms
  mutable std::map<int, std::shared_ptr<Loaded>> loaded_;  // by device
  std::vector<BufferDesc> inputs_;  // input_buffers(plan_)
  std::array<int, kMaxStreams> scale_input_{};  // per stream: index into inputs_ of its delayed scale, or -1
  mutable std::mutex layouts_mu_;
  mutable std::vector<std::shared_ptr<const Layout>> layouts_;  // most recently added first
};

// Delayed scaling: after a quantize, roll the caller's amax history [history_length] with the
// amax output, recompute the scale (and 1/scale if scale_inv is given) on `stream`.
struct HistoryCall {
  TensorView history;    // fp32 [history_length]
  TensorView amax;       // fp32 [1]: the quantize's amax output
  TensorView scale;      // fp32 [1], in/out
  TensorView scale_inv;  // optional fp32 [1]
  uint64_t noop = 0;
};
void update_amax_history(const PerTensorDelayed& mode, ElemFormat format, const HistoryCall& call,
                         CUstream stream, KernelCache& cache = KernelCache::global());
// The history-update kernel of one delayed-scaling rule, compiled (or found) for `arch`, no GPU
// needed: what update_amax_history launches, and what Quantizer::prepare and `qforge prewarm`
// put into the cache for every delayed-scaling stream of a plan.
QuantizeKernels build_history_kernel(const PerTensorDelayed& mode, ElemFormat format, const std::string& arch,
                                     KernelCache& cache = KernelCache::global());
// The distinct (rule, format) pairs of a plan's delayed-scaling streams: the history kernels it needs.
std::vector<std::pair<PerTensorDelayed, ElemFormat>> history_rules(const Plan& plan);

// Delayed scaling for a whole model, once per step: every tensor's history rolled and its scale
// recomputed in one launch per history length (one for a model whose recipes share a length),
// each entry by its own rule and format, bit-identical to update_amax_history on that entry.
struct HistoryBatchItem {
  PerTensorDelayed mode;
  ElemFormat format = ElemFormat::E4M3;  // e4m3 or e5m2
  TensorView history;    // fp32 [mode.history_length]
  TensorView amax;       // fp32 [1]: the step's amax
  TensorView scale;      // fp32 [1], in/out
  TensorView scale_inv;  // optional fp32 [1]
};
// The batched kernel's source for histories of `history_length` slots (templates/qforge/history.cuh
// amax_history_batch_kernel; the rule is per entry, at run time).
KernelSource emit_history_batch(int history_length);
QuantizeKernels build_history_batch_kernel(int history_length, const std::string& arch,
                                           KernelCache& cache = KernelCache::global());

// UserError naming "items[i].<buffer>" unless the items can run as one batch: each buffer as the
// per-tensor update checks it, and the buffers one entry writes disjoint from every other entry's.
// Needs no GPU.
void check_history_batch(const std::vector<HistoryBatchItem>& items);

// Built once for a fixed set of tensors (their buffers' addresses stay: module buffers), then run
// every step. The constructor validates the items (check_history_batch), uploads the entry table
// to the current context's device and loads the kernels there: run() only launches, so it can be
// captured into a CUDA graph. The table is freed with the object.
class HistoryBatch {
 public:
  explicit HistoryBatch(std::vector<HistoryBatchItem> items, KernelCache& cache = KernelCache::global());
  ~HistoryBatch();
  HistoryBatch(const HistoryBatch&) = delete;
  HistoryBatch& operator=(const HistoryBatch&) = delete;

  // noop: optional device float, 1.0 skips the whole update.
  void run(uint64_t noop, CUstream stream) const;
  size_t size() const { return size_; }
  int launches() const { return int(groups_.size()); }
  int device() const { return device_; }

 private:
  struct Group {
    int length = 0;
    int count = 0;
    uint64_t entries = 0;  // device address of this group's first entry
    std::shared_ptr<const Module> module;
    CUfunction f = nullptr;
    unsigned threads = 0;
  };
  int device_ = -1;
  CUdeviceptr table_ = 0;
  size_t size_ = 0;
  std::vector<Group> groups_;
};

}  // namespace qf::rt
