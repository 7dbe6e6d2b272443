// NVRTC front end: compiles one generated CUDA translation unit, with every embedded device
// header (templates/) supplied in memory, to a CUBIN for an exact arch (or to PTX when the arch
// is newer than this NVRTC knows).
//
// A compile failure of generated source is a qforge bug, not a user error: it throws
// CompileError, whose message carries the NVRTC log, version, options and the path of the dumped
// source ($QFORGE_DUMP_DIR, else the system temp dir, as qforge-failed-<hash>.cu).
#pragma once
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nvrtc.h>

namespace qf::rt {

struct CompileRequest {
  std::string source;                          // the emitted translation unit
  std::string source_name = "qforge_kernel.cu";
  std::vector<std::string> name_expressions;   // "qf::kernels::cast<...>" or extern "C" names
  std::string arch;                            // exact target: "sm_90a", "sm_100a", "sm_90"
  std::vector<std::string> options;            // extra NVRTC options (no absolute paths)
};

enum class ImageKind { Cubin, Ptx };
const char* name(ImageKind k);  // "cubin" / "ptx"

struct CompileResult {
  ImageKind kind = ImageKind::Cubin;
  std::string image;                                 // CUBIN or PTX bytes
  std::string target;                                // what was built: "sm_90a" or "compute_120"
  std::map<std::string, std::string> lowered_names;  // name expression -> mangled symbol
  std::string log;                                   // NVRTC log (warnings), may be empty
  std::string note;                                  // non-empty when PTX fallback happened
  std::vector<std::string> options;                  // the full option list passed to NVRTC
};

class CompileError : public std::runtime_error {
 public:
  CompileError(const std::string& what, std::string log, std::string source_path)
      : std::runtime_error(what), log_(std::move(log)), source_path_(std::move(source_path)) {}
  const std::string& log() const { return log_; }
  const std::string& source_path() const { return source_path_; }  // empty if the dump failed

 private:
  std::string log_, source_path_;
};

// RAII owner of an nvrtcProgram.
class NvrtcProgram {
 public:
  NvrtcProgram(const std::string& source, const std::string& name);
  ~NvrtcProgram();
  NvrtcProgram(const NvrtcProgram&) = delete;
  NvrtcProgram& operator=(const NvrtcProgram&) = delete;
  NvrtcProgram(NvrtcProgram&& o) noexcept : prog_(o.prog_) { o.prog_ = nullptr; }
  NvrtcProgram& operator=(NvrtcProgram&& o) noexcept;
  nvrtcProgram get() const { return prog_; }

 private:
  nvrtcProgram prog_ = nullptr;
};

// The full, deterministic option list compile_cuda passes for `req` (fixed options, the
// resolved --gpu-architecture, then req.options). Part of the cache key. Throws UserError for a
// malformed or unsupported arch and InternalError for a forbidden extra option (absolute path,
// fast math, ftz, fmad).
std::vector<std::string> compile_options(const CompileRequest& req);

CompileResult compile_cuda(const CompileRequest& req);

// What ptxas reports per kernel when a compile passes "--ptxas-options=-v", in the log's order.
struct KernelResources {
  std::string entry;  // the mangled entry function
  int registers = 0;
  int stack_bytes = 0, spill_store_bytes = 0, spill_load_bytes = 0;
};
std::vector<KernelResources> ptxas_resources(const std::string& log);

std::string nvrtc_version();                // "13.0"
bool nvrtc_at_least(int major, int minor);  // the linked NVRTC is major.minor or newer
std::vector<std::string> supported_archs();  // "sm_75", ..., as reported by NVRTC
// SHA-256 over every embedded header's name and text (all of them, so transitive includes are
// covered whatever includes what).
const std::string& templates_hash();

}  // namespace qf::rt
