/* qforge C API: embed the recipe compiler, the fused quantization kernels and the grouped GEMMs
 * that consume them from C or C++.
 *
 * A qf_context holds one or more parsed recipes. A qf_quantizer is one role of one recipe for one
 * input dtype, usage and grouped flag, compiled into a kernel plan; it answers buffer queries,
 * can compile its kernels ahead of time (qf_quantizer_prepare, no GPU needed) and launches them
 * (qf_quantize).
 *
 * Errors: every function returns a qf_status. On anything but QF_OK, qf_last_error() returns a
 * one-line message (thread-local, valid until the next qf_* call on the same thread) that names
 * the JSON pointer, file path or argument at fault. No C++ exception ever crosses this API.
 *
 * Threads: contexts and quantizers are immutable after creation except for the quantizer's
 * per-device kernel cache, which is internally locked; one quantizer may be used from several
 * threads. Destroy a context only after every quantizer created from it (quantizers keep a
 * reference to their recipe, so destroying the context first is also safe).
 *
 * CUDA: qf_quantize launches in the caller's *current* CUDA context (the primary context of the
 * device, as the runtime API uses) on the given CUstream / cudaStream_t (NULL = legacy default
 * stream). It does not change the current context. All pointers in qf_quantize_args are device
 * addresses in that context.
 */
#ifndef QFORGE_H
#define QFORGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qf_status {
  QF_OK = 0,
  QF_ERR_USER = 2,     /* bad argument, recipe, role, shape or buffer */
  QF_ERR_INTERNAL = 3, /* a bug in qforge (or out of memory) */
  QF_ERR_CUDA = 4      /* no driver / no GPU / a CUDA driver call failed */
} qf_status;

typedef enum qf_dtype { QF_DTYPE_FP32 = 0, QF_DTYPE_BF16 = 1, QF_DTYPE_FP16 = 2 } qf_dtype;

typedef enum qf_usage {
  QF_USAGE_DEFAULT = -1, /* the recipe's "usage" */
  QF_USAGE_TRAINING = 0,
  QF_USAGE_INFERENCE = 1,
  QF_USAGE_MEMORY = 2
} qf_usage;

typedef enum qf_buffer_kind {
  QF_BUFFER_DATA = 0,
  QF_BUFFER_SCALE_INV = 1,
  QF_BUFFER_AMAX = 2,
  QF_BUFFER_SCALE = 3
} qf_buffer_kind;

typedef struct qf_context qf_context;
typedef struct qf_quantizer qf_quantizer;

typedef struct qf_buffer_info {
  const char* name;  /* "rowwise_data", "columnwise_scale_inv", "amax", ...; valid while the
                        quantizer lives */
  const char* dtype; /* what the bytes mean: "e4m3", "e2m1x2", "e8m0", "fp32", ...; same lifetime */
  qf_buffer_kind kind;
  int element_size; /* storage element size in bytes (1, 2 or 4) */
  int stream;       /* plan stream index, -1 for amax outputs / shared inputs */
  int zero_padding; /* 1: padding entries must be zero (swizzled scales) */
  int ndim;
  int64_t shape[4];
  int64_t bytes;
  const char* scale_layout; /* block scale grids (block, mx, nvfp4 scaling): "compact", "swizzled" or
                               "mn_major", the order a GEMM must read them in (qf_gemm_spec.scale_layout);
                               NULL for every other buffer; same lifetime as name */
} qf_buffer_info;

typedef struct qf_named_buffer {
  const char* name; /* a buffer name from qf_quantizer_output_info / qf_quantizer_input_info */
  void* ptr;        /* device address */
  int64_t bytes;    /* bytes owned from ptr */
} qf_named_buffer;

typedef struct qf_quantize_args {
  const void* input; /* device [m, k] in the quantizer's input dtype (grouped: total rows) */
  int64_t m, k;      /* 1..2^31 each, m * k <= 2^50; grouped: m (all members' rows) may be 0 */
  const qf_named_buffer* buffers; /* every output (and input, e.g. delayed "scale") buffer */
  int num_buffers;
  void* workspace; /* qf_quantizer_workspace_bytes(); may be NULL when that is 0 */
  int64_t workspace_bytes;
  const float* noop;    /* optional device float: 1.0 skips the launch; NULL = never */
  uint64_t seed, offset; /* stochastic rounding */
  const int64_t* member_rows; /* grouped: device int64 [num_members + 1] row offsets; required exactly
                                 when the quantizer was created grouped (NULL with num_members 0 otherwise;
                                 enforced since 0.2.0) */
  int num_members;
} qf_quantize_args;

/* The last error on this thread ("" if none). */
const char* qf_last_error(void);

/* The library's version, "MAJOR.MINOR.PATCH" (static storage). While MAJOR is 0, a MINOR change may
   change this API; the Python package loads only a library of its own MAJOR.MINOR. */
const char* qf_version(void);

qf_status qf_context_create(const char* const* recipe_paths, int n, qf_context** out);
qf_status qf_context_create_from_json(const char* json, qf_context** out);
void qf_context_destroy(qf_context* ctx); /* NULL is fine */
/* Number of recipes and the name of recipe i (valid while ctx lives). */
qf_status qf_context_num_recipes(const qf_context* ctx, int* out);
qf_status qf_context_recipe_name(const qf_context* ctx, int index, const char** out);

/* recipe_name NULL: the context must hold exactly one recipe. grouped: 0 or 1. */
qf_status qf_quantizer_create(qf_context* ctx, const char* recipe_name, const char* role,
                              qf_dtype input, qf_usage usage, qf_quantizer** out);
qf_status qf_quantizer_create_ex(qf_context* ctx, const char* recipe_name, const char* role,
                                 qf_dtype input, qf_usage usage, int grouped, qf_quantizer** out);
void qf_quantizer_destroy(qf_quantizer* q); /* NULL is fine */

/* Outputs for one tensor of shape [m, k]. The count does not depend on the shape. */
qf_status qf_quantizer_num_outputs(const qf_quantizer* q, int* out);
qf_status qf_quantizer_output_info(const qf_quantizer* q, int64_t m, int64_t k, int index,
                                   qf_buffer_info* out);
/* Grouped: what qf_quantize requires of each output of a call of num_members members over m_total
 * rows, whatever the split (the sizes live on the device): bytes is the bound the buffer is checked
 * against, shape is flat ([bytes / element_size]). Same order and names as qf_quantizer_output_info. */
qf_status qf_quantizer_grouped_output_info(const qf_quantizer* q, int64_t m_total, int64_t k,
                                           int num_members, int index, qf_buffer_info* out);
/* Inputs besides the tensor itself (delayed scaling's "scale"). */
qf_status qf_quantizer_num_inputs(const qf_quantizer* q, int* out);
qf_status qf_quantizer_input_info(const qf_quantizer* q, int index, qf_buffer_info* out);
qf_status qf_quantizer_workspace_bytes(const qf_quantizer* q, int64_t m, int64_t k,
                                       int num_members, int64_t* out);

/* Compile (or load) the kernels for arch ("sm_90a", "sm_100a", ...) into the kernel cache, delayed
   scaling's amax-history update included. Needs no GPU. */
qf_status qf_quantizer_prepare(qf_quantizer* q, const char* arch);

/* Validate every argument, then launch on cuda_stream (a CUstream / cudaStream_t) in the
   caller's current CUDA context. */
qf_status qf_quantize(qf_quantizer* q, const qf_quantize_args* args, void* cuda_stream);

/* ---- Delayed scaling: after qf_quantize, roll the caller's amax history with the call's amax output
 * and recompute the scale from it (the recipe's margin, history length and amax rule; the CPU
 * reference's rule, docs/numerics.md), on the device: the next call reads the new scale. scale_name
 * names the quantizer input the scale is ("scale", or "rowwise_scale" / "columnwise_scale" when the
 * two directions keep their own; NULL = the quantizer's only one). Its amax is the output the
 * quantize call reported for that scale's streams ("amax", or the direction's own amax output).
 * Zero the struct ({0} / memset) before filling it; the buffers must not overlap. */
typedef struct qf_history_args {
  void* history; int64_t history_bytes;     /* fp32 [history_length] (at least), in/out */
  const void* amax; int64_t amax_bytes;     /* fp32 [1]: the quantize call's amax output */
  void* scale; int64_t scale_bytes;         /* fp32 [1], in/out: the scale input of the next call */
  void* scale_inv; int64_t scale_inv_bytes; /* optional fp32 [1]: 1 / scale; NULL = not written */
  const float* noop;                        /* optional device float: 1.0 skips the update; NULL = never */
} qf_history_args;

/* The history length the scale's recipe rule keeps (history_bytes >= 4 * that). */
qf_status qf_quantizer_history_length(const qf_quantizer* q, const char* scale_name, int* out);
qf_status qf_quantizer_update_amax_history(const qf_quantizer* q, const char* scale_name,
                                           const qf_history_args* args, void* cuda_stream);

/* ---- Grouped GEMM (sm_90a) on the quantized operands: docs/gemm.md.
 *
 * A qf_gemm is one GEMM spec compiled into one kernel: formats, scaling, N, K, output, tile.
 * Group sizes are run-time data on the device, so one qf_gemm serves every token split:
 *   contiguous layout: group g owns rows [group_offsets[g], group_offsets[g+1]) of A and D;
 *   masked layout (m_max > 0): group g owns rows [g*m_max, g*m_max + group_counts[g]).
 *   D[rows] (+)= alpha[g] * dequant(A[rows]) @ dequant(B[g])^T,
 *   A [m_total, K] and B [G, N, K] fp8 or int8 K-major (nvfp4: packed e2m1, K/2 bytes per row), D [m_total, N]
 *   bf16 or fp32. K-grouped specs (wgrad; spec->layout, or a recipe's): A [m, k_total], B [N, k_total],
 *   group_offsets split k_total, D [G, m, N]; "k_grouped_members": the grouped quantizer's
 *   per-member copies [m, M_g] and [N, M_g] back to back in the same bytes. */
typedef struct qf_gemm qf_gemm;

typedef struct qf_gemm_spec {
  const char* scaling;   /* "tensor", "rowwise", "blockwise", "mxfp8", "nvfp4", "none" (bf16 / fp16
                            operands) or "channel" (bf16 / fp16 A x int8 B, per-channel B scales) */
  const char* a_format;  /* "e4m3" or "e5m2" (nvfp4: "e2m1"; int8 x int8: "int8" for both, with
                            tensor, rowwise or blockwise scaling; "bf16" or "fp16" with none and
                            channel); NULL = "e4m3" ("e2m1" with nvfp4, "bf16" with none / channel) */
  const char* b_format;
  int64_t n, k;
  const char* out_dtype; /* "bf16" or "fp32"; NULL = "bf16" */
  int accumulate;        /* 1: D += result (fp32 output) */
  int fast_accum;        /* 1: no fp32 promotion (fp8, tensor / rowwise scaling) */
  /* Tile; 0 = chosen by qforge. ordered: 1 off, 2 on. */
  int block_m, block_n, stages, multicast, raster_m, ordered;
  /* "compact" or "mn_major" (blockwise and mxfp8: the 1D scale grids as a recipe's "scale_layout":
     "mn_major" streams write them; A's one per group, as the grouped quantizer writes its members,
     mxfp8 B's one per expert; docs/gemm.md); NULL = "compact". The shipped mxfp8_hopper recipe
     writes mn_major grids: a spec for its operands needs "mn_major". */
  const char* scale_layout;
  /* mxfp8 and nvfp4 (every layout; k_grouped_members since 0.4.0): "fused" (one kernel dequantizes on chip), "dequant"
     (both operands dequantized once into bf16 / fp16 copies in args->workspace, sized by
     qf_gemm_workspace_bytes_for, then the bf16 / fp16 GEMM with this tile: faster where many tokens
     meet the weights, slower where few do; docs/gemm.md) or "auto" (per call, the one expected to
     be faster: qf_gemm_route_for; the tile is the fused kernel's; size args->workspace with
     qf_gemm_workspace_bytes_for at the largest call; the routes round differently, so pin one where
     outputs must not depend on the batch size); NULL = "fused". Appended in 0.2.0 ("auto" since
     0.3.0): zero the struct before filling it. */
  const char* route;
  /* "m_grouped" (fprop, dgrad: K fixed, each group's rows at run time), "k_grouped" (wgrad: m output
     rows per group, k = 0, each group's tokens at run time: args->k_total split by group_offsets) or
     "k_grouped_members" (the same on the grouped quantizer's per-member copies); NULL =
     "m_grouped". m: a K-grouped spec's output rows (A's rows), 0 for m_grouped. Appended in 0.4.0
     (a recipe's "layout" and "m" before): zero the struct before filling it. */
  const char* layout;
  int64_t m;
} qf_gemm_spec;

/* Every pointer is device memory of the current context, 16-byte aligned for a, b and d (TMA),
   4-byte for fp32 / e8m0 scales, 16-byte for nvfp4's e4m3 scales (a row's 8 bytes of a k-block
   are read at once) and for K-grouped blockwise mn_major grids (copied by the tensor engine). Fields were appended in 0.1.0 (a_amax, b_amax, k_total, then workspace): zero the
   struct ({0} / memset) before filling it so that fields a caller does not know stay 0. */
typedef struct qf_gemm_args {
  const void* a; int64_t a_bytes;             /* fp8 / int8 [m_total, K] (bf16 / fp16 with none and
                                                 channel: 2 bytes each); nvfp4: e2m1 [m_total, K/2] packed,
                                                 element 2i in the low nibble of byte i;
                                                 K-grouped: [m, k_total] (members: [m, M_g] each,
                                                 back to back, the same bytes) */
  const void* b; int64_t b_bytes;             /* fp8 / int8 [num_groups, N, K] (bf16 / fp16 with none);
                                                 nvfp4: e2m1 [num_groups, N, K/2];
                                                 K-grouped: [N, k_total] (members: [N, M_g] each) */
  void* d; int64_t d_bytes;                   /* [m_total, N] in the spec's out_dtype */
  const void* a_scale; int64_t a_scale_bytes; /* qf_gemm_scale_bytes(); NULL for bf16 / fp16 operands */
  const void* b_scale; int64_t b_scale_bytes; /* (NULL with none; fp32 [num_groups, N] with channel) */
  const float* alpha;                         /* optional device fp32 [num_groups]; NULL = 1 */
  const int64_t* group_offsets;               /* contiguous: device int64 [num_groups + 1] */
  const int64_t* group_counts;                /* masked: device int64 [num_groups] */
  int64_t m_max;                              /* masked: rows per group slot; 0 = contiguous */
  int64_t m_total;                            /* M-grouped: rows of A and D (<= 2^31 - 257); K-grouped: 0 */
  int num_groups;
  int max_ctas;                               /* 0 = one CTA per SM */
  const float* a_amax;                        /* nvfp4: device fp32 [num_groups], amax of each group's A */
  const float* b_amax;                        /* nvfp4: device fp32 [num_groups], amax of each B[g] */
  int64_t k_total;                            /* K-grouped: the token dimension; 0 otherwise */
  void* workspace; int64_t workspace_bytes;   /* k_grouped_members: qf_gemm_workspace_bytes() of device
                                                 memory, 128-byte aligned, one run at a time; the
                                                 dequant route (and "auto" where it takes it):
                                                 qf_gemm_workspace_bytes_for() for this call,
                                                 256-byte aligned */
} qf_gemm_args;

/* Validates the spec (errors name the field: "n", "tile.block_n", ...). */
qf_status qf_gemm_create(const qf_gemm_spec* spec, qf_gemm** out);
/* The GEMMs a recipe lists ("gemms"); recipe_name NULL: the context's only recipe. */
qf_status qf_context_num_gemms(const qf_context* ctx, const char* recipe_name, int* out);
qf_status qf_gemm_create_from_recipe(const qf_context* ctx, const char* recipe_name, int index, qf_gemm** out);
void qf_gemm_destroy(qf_gemm* g); /* NULL is fine */
/* One line describing the spec ("e4m3 x e4m3 blockwise N=4096 K=7168 -> bf16"), valid while g lives. */
const char* qf_gemm_describe(const qf_gemm* g);
/* Bytes of the A and B scale buffers for num_groups groups and `extent`: the rows m_total of an
   M-grouped spec, the token dimension k_total of a K-grouped one (its blockwise / mxfp8 / nvfp4
   scales run along the tokens; members: num_groups more columns per row, each member's grid
   ending in a partial block). */
qf_status qf_gemm_scale_bytes(const qf_gemm* g, int64_t extent, int num_groups, int64_t* a_bytes,
                              int64_t* b_bytes);
/* Device workspace bytes a run needs on the current device (qf_gemm_args.workspace): 0 except for
   recipes' "k_grouped_members" specs, whose kernel builds each member's tensor maps there (their
   size depends on the device: it loads the kernel, so needs a GPU; 0 needs none). */
qf_status qf_gemm_workspace_bytes(const qf_gemm* g, int64_t* bytes);
/* The same for a call of num_groups groups over `extent` (m_total, or k_total for a K-grouped spec):
   for the dequant route (spec->route "dequant", or "auto" where qf_gemm_route_for says "dequant"),
   2 bytes per element of A and of B (their 16-bit copies) plus a few per group, no GPU needed but
   for "k_grouped_members" specs (whose 16-bit GEMM builds its tensor maps in the workspace too:
   their size depends on the device); qf_gemm_workspace_bytes refuses "dequant" and "auto"; for
   the others, what qf_gemm_workspace_bytes says. */
qf_status qf_gemm_workspace_bytes_for(const qf_gemm* g, int64_t extent, int num_groups, int64_t* bytes);
/* The route ("fused" or "dequant", a static string) a run of num_groups groups over `extent`
   (m_total, or k_total for a K-grouped spec) takes: the spec's, or for "auto" the dequant route
   where the operands' copies pay for themselves (many tokens per expert; docs/gemm.md). Size the
   workspace with qf_gemm_workspace_bytes_for, which follows the same choice. Since 0.3.0. */
qf_status qf_gemm_route_for(const qf_gemm* g, int64_t extent, int num_groups, const char** route);
/* Compile (or load) the kernel(s) for arch (only "sm_90a"; "auto": both routes') into the kernel cache; no GPU needed. */
qf_status qf_gemm_prepare(qf_gemm* g, const char* arch);
/* Validate every argument, then launch on cuda_stream in the caller's current CUDA context. */
qf_status qf_gemm_run(qf_gemm* g, const qf_gemm_args* args, void* cuda_stream);

/* ---- Kernel cache: trim the writable root of the process's kernel cache (QFORGE_CACHE_DIR, else
 * $XDG_CACHE_HOME/qforge or ~/.cache/qforge), as `qforge clear --unused-for / --max-size / --stale`
 * does; read-only roots are never touched. An entry goes when any rule picks it. Each goes by one
 * rename out of the readers' way (no process sees half an entry), one that another process used
 * while the others were judged stays (unless stale), and links are never followed. Kernels this
 * process has loaded stay usable. Zero the struct, then set the rules wanted: a policy with no rule
 * is an error (to empty the cache, `qforge clear`). Since 0.5.0. */
typedef struct qf_cache_evict_policy {
  int64_t unused_for_s; /* > 0: entries last used (a disk hit or a compile) more than this many seconds ago; 0: no such rule */
  int64_t max_bytes;    /* > 0: then the least recently used entries until the rest fit in this many bytes; 0: no such rule */
  int stale;            /* 1: entries this build cannot hit (another NVRTC, another qforge's device headers) and damaged ones */
  int dry_run;          /* 1: count what would go, remove nothing */
} qf_cache_evict_policy;
typedef struct qf_cache_evict_result {
  int64_t removed, kept;             /* entries of the writable root */
  int64_t removed_bytes, kept_bytes; /* their files' bytes */
} qf_cache_evict_result;
/* A memory-only cache (QFORGE_CACHE_DISABLE=1, or no cache directory) has nothing to evict: all zero.
   An unwritable root is QF_ERR_USER. */
qf_status qf_cache_evict(const qf_cache_evict_policy* policy, qf_cache_evict_result* out);

/* ---- Logging: every message the library prints (warnings such as the kernel cache falling back
 * to memory, one line per JIT compile at info, one per cache hit at debug) goes to stderr as
 * "qforge: <level>: <message>", or to a callback. Since 0.6.0.
 *
 * Level: QFORGE_LOG_LEVEL (off, error, warn, info, debug; any case; default warn, which prints
 * warnings and errors only), read at the first message; qf_set_log_level overrides it. A bad
 * QFORGE_LOG_LEVEL is named in one warning and warn is used. A message is delivered when its level
 * is at most the threshold (QF_LOG_OFF delivers none). Levels map onto Python's logging as
 * error 40, warn 30, info 20, debug 10. */
typedef enum qf_log_level {
  QF_LOG_OFF = 0,
  QF_LOG_ERROR = 1,
  QF_LOG_WARN = 2,
  QF_LOG_INFO = 3,
  QF_LOG_DEBUG = 4
} qf_log_level;
/* level: a qf_log_level (QF_LOG_ERROR..QF_LOG_DEBUG); message: one line, UTF-8, NUL-terminated,
 * valid only during the call (copy it to keep it); user: qf_set_log_callback's argument.
 *
 * Threads: the callback runs on the thread that logs, which is whichever thread compiles or loads
 * a kernel (the caller of qf_quantizer_prepare / qf_quantize / qf_gemm_prepare / ..., or several
 * of them at once), so it must be thread-safe. It is never called while qforge holds a lock of its
 * own (no other thread waits on qforge for it to return), so it may block, e.g. to take an
 * interpreter lock. It must not throw or unwind through qforge. A message the callback itself
 * causes (it calls qforge) goes to stderr, not back into the callback. */
typedef void (*qf_log_callback)(int level, const char* message, void* user);
/* cb NULL: back to stderr. Returns once no call of the previous callback is in progress on another
 * thread; from then on the previous callback is never called, so its user data may be freed. It
 * waits for those calls: a binding must not hold a lock they need (release the interpreter lock
 * around this call). Called from inside a callback: QF_ERR_USER, nothing changed. */
qf_status qf_set_log_callback(qf_log_callback cb, void* user);
/* level: QF_LOG_OFF..QF_LOG_DEBUG, else QF_ERR_USER. */
qf_status qf_set_log_level(int level);
/* The threshold now in force (QFORGE_LOG_LEVEL's, read now if it has not been). */
int qf_get_log_level(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QFORGE_H */
