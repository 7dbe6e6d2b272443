#include "runtime/nvrtc.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "compiler/error.h"
#include "runtime/sha256.h"
#include "templates/embedded.h"

namespace qf::rt {
namespace {

// Only what the numerics contract needs (docs/numerics.md): one IEEE binary32 operation per
// float operation, so no FMA contraction; fast math and ftz stay off (their defaults).
const char* const kFixedOptions[] = {"--std=c++17", "--fmad=false"};

void check_nvrtc(nvrtcResult r, const char* what) {
  QF_CHECK(r == NVRTC_SUCCESS, what, " failed: ", nvrtcGetErrorString(r));
}

std::vector<int> supported_arch_numbers() {
  static const std::vector<int> archs = [] {
    int n = 0;
    check_nvrtc(nvrtcGetNumSupportedArchs(&n), "nvrtcGetNumSupportedArchs");
    std::vector<int> v(n);
    if (n) check_nvrtc(nvrtcGetSupportedArchs(v.data()), "nvrtcGetSupportedArchs");
    std::sort(v.begin(), v.end());
    return v;
  }();
  return archs;
}

struct Target {
  bool ptx = false;
  std::string name;  // value of --gpu-architecture
  std::string note;
};

Target resolve_target(const std::string& arch) {
  // sm_<number>[a|f]
  size_t i = 3;
  bool ok = arch.rfind("sm_", 0) == 0 && arch.size() > 3;
  int number = 0;
  for (; ok && i < arch.size() && arch[i] >= '0' && arch[i] <= '9' && i < 7; ++i) number = number * 10 + (arch[i] - '0');
  ok = ok && i > 3 && (i == arch.size() || (i + 1 == arch.size() && (arch[i] == 'a' || arch[i] == 'f')));
  if (!ok) throw UserError("arch", "expected sm_<number> with an optional a/f suffix (e.g. sm_90a), got \"" + arch + "\"");
  const std::vector<int> archs = supported_arch_numbers();
  QF_CHECK(!archs.empty(), "NVRTC reports no supported architectures");
  if (number > archs.back()) {
    const std::string ptx = "compute_" + std::to_string(archs.back());
    return {true, ptx,
            arch + " is newer than NVRTC " + nvrtc_version() + " supports (newest sm_" + std::to_string(archs.back()) +
                "); built PTX for " + ptx + ", to be JIT-compiled by the driver"};
  }
  if (!std::binary_search(archs.begin(), archs.end(), number)) {
    std::string known;
    for (int a : archs) known += " sm_" + std::to_string(a);
    throw UserError("arch", arch + " is not supported by NVRTC " + nvrtc_version() + "; supported:" + known);
  }
  return {false, arch, ""};
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// Writes the failed source where a human can find it; returns the path, or "" (with the reason
// in `why`) when it cannot be written.
std::string dump_failed_source(const CompileRequest& req, std::string& why) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir;
  if (const char* d = std::getenv("QFORGE_DUMP_DIR"); d && *d) {
    dir = d;
    fs::create_directories(dir, ec);
  } else {
    dir = fs::temp_directory_path(ec);
  }
  if (ec) {
    why = "cannot prepare dump dir " + dir.string() + ": " + ec.message();
    return "";
  }
  const fs::path path = dir / ("qforge-failed-" + sha256_hex(req.source).substr(0, 16) + ".cu");
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << req.source;
  f.close();
  if (!f) {
    why = "cannot write " + path.string();
    return "";
  }
  return path.string();
}

}  // namespace

const char* name(ImageKind k) { return k == ImageKind::Cubin ? "cubin" : "ptx"; }

NvrtcProgram::NvrtcProgram(const std::string& source, const std::string& name) {
  const auto files = templates::all();
  std::vector<std::string> texts, names;  // NVRTC wants NUL-terminated strings
  texts.reserve(files.size()), names.reserve(files.size());
  for (const auto& f : files) texts.emplace_back(f.text), names.emplace_back(f.name);
  std::vector<const char*> tp, np;
  for (size_t i = 0; i < files.size(); ++i) tp.push_back(texts[i].c_str()), np.push_back(names[i].c_str());
  check_nvrtc(nvrtcCreateProgram(&prog_, source.c_str(), name.c_str(), int(files.size()), tp.data(), np.data()),
              "nvrtcCreateProgram");
}

NvrtcProgram::~NvrtcProgram() {
  if (prog_) nvrtcDestroyProgram(&prog_);
}

NvrtcProgram& NvrtcProgram::operator=(NvrtcProgram&& o) noexcept {
  if (this != &o) {
    if (prog_) nvrtcDestroyProgram(&prog_);
    prog_ = o.prog_;
    o.prog_ = nullptr;
  }
  return *this;
}

std::vector<std::string> compile_options(const CompileRequest& req) {
  const Target t = resolve_target(req.arch);
  std::vector<std::string> opts(std::begin(kFixedOptions), std::end(kFixedOptions));
  opts.push_back("--gpu-architecture=" + t.name);
  for (const auto& o : req.options) {
    // Absolute paths would make the cache key machine-specific; headers come from memory anyway.
    QF_CHECK(!o.empty() && o[0] != '/' && o.find("=/") == std::string::npos && o.rfind("-I", 0) != 0 &&
                 o.rfind("--include-path", 0) != 0,
             "NVRTC option \"", o, "\" names a path; device headers are embedded");
    QF_CHECK(o.find("fast_math") == std::string::npos && o.find("fast-math") == std::string::npos &&
                 o.find("ftz") == std::string::npos && o.find("fmad") == std::string::npos &&
                 o.find("prec-div") == std::string::npos && o.find("prec-sqrt") == std::string::npos &&
                 o.find("gpu-architecture") == std::string::npos && o.rfind("-arch", 0) != 0,
             "NVRTC option \"", o, "\" would change numerics or the target; it is fixed by qforge");
    opts.push_back(o);
  }
  return opts;
}

CompileResult compile_cuda(const CompileRequest& req) {
  const Target t = resolve_target(req.arch);
  CompileResult out;
  out.options = compile_options(req);
  out.kind = t.ptx ? ImageKind::Ptx : ImageKind::Cubin;
  out.target = t.name;
  out.note = t.note;

  NvrtcProgram prog(req.source, req.source_name);
  for (const auto& e : req.name_expressions)
    check_nvrtc(nvrtcAddNameExpression(prog.get(), e.c_str()), "nvrtcAddNameExpression");
  std::vector<const char*> argv;
  for (const auto& o : out.options) argv.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(prog.get(), int(argv.size()), argv.data());

  size_t log_size = 0;
  check_nvrtc(nvrtcGetProgramLogSize(prog.get(), &log_size), "nvrtcGetProgramLogSize");
  out.log.resize(log_size);
  if (log_size) check_nvrtc(nvrtcGetProgramLog(prog.get(), out.log.data()), "nvrtcGetProgramLog");
  while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n')) out.log.pop_back();

  if (r != NVRTC_SUCCESS) {
    std::string why;
    const std::string path = dump_failed_source(req, why);
    throw CompileError("NVRTC " + nvrtc_version() + " failed to compile generated source " +
                           req.source_name + " for " + req.arch + " (" + nvrtcGetErrorString(r) + ")\n  options: " +
                           join(out.options) + "\n  source: " + (path.empty() ? "(not dumped: " + why + ")" : path) +
                           "\n  log:\n" + out.log,
                       out.log, path);
  }

  size_t size = 0;
  if (t.ptx) {
    check_nvrtc(nvrtcGetPTXSize(prog.get(), &size), "nvrtcGetPTXSize");
    out.image.resize(size);
    check_nvrtc(nvrtcGetPTX(prog.get(), out.image.data()), "nvrtcGetPTX");
    while (!out.image.empty() && out.image.back() == '\0') out.image.pop_back();  // text, no NUL
  } else {
    check_nvrtc(nvrtcGetCUBINSize(prog.get(), &size), "nvrtcGetCUBINSize");
    out.image.resize(size);
    check_nvrtc(nvrtcGetCUBIN(prog.get(), out.image.data()), "nvrtcGetCUBIN");
  }
  QF_CHECK(!out.image.empty(), "NVRTC produced an empty ", name(out.kind), " for ", req.arch);

  for (const auto& e : req.name_expressions) {
    const char* lowered = nullptr;
    check_nvrtc(nvrtcGetLoweredName(prog.get(), e.c_str(), &lowered), "nvrtcGetLoweredName");
    QF_CHECK(lowered, "no lowered name for ", e);
    out.lowered_names[e] = lowered;
  }
  return out;
}

bool nvrtc_at_least(int major, int minor) {
  int have_major = 0, have_minor = 0;
  check_nvrtc(nvrtcVersion(&have_major, &have_minor), "nvrtcVersion");
  return have_major > major || (have_major == major && have_minor >= minor);
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check_nvrtc(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return std::to_string(major) + "." + std::to_string(minor);
}

std::vector<std::string> supported_archs() {
  std::vector<std::string> v;
  for (int a : supported_arch_numbers()) v.push_back("sm_" + std::to_string(a));
  return v;
}

const std::string& templates_hash() {
  static const std::string h = [] {
    Sha256 s;
    s.field("qforge-templates-v1");
    for (const auto& f : templates::all()) s.field(f.name).field(f.text);
    return s.hex_digest();
  }();
  return h;
}

std::vector<KernelResources> ptxas_resources(const std::string& log) {
  // ptxas -v: "Compiling entry function 'NAME' for 'sm_90a'", then "N bytes stack frame, N bytes
  // spill stores, N bytes spill loads", then "Used N registers, ...".
  static const std::regex entry(R"(Compiling entry function '([^']+)')");
  static const std::regex frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex regs(R"(Used (\d+) registers)");
  std::vector<KernelResources> out;
  std::istringstream in(log);
  std::string line;
  std::smatch m;
  bool open = false;
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, entry)) {
      out.push_back(KernelResources{m[1], 0, 0, 0, 0});
      open = true;
    } else if (open && std::regex_search(line, m, frame)) {
      out.back().stack_bytes = std::stoi(m[1]);
      out.back().spill_store_bytes = std::stoi(m[2]);
      out.back().spill_load_bytes = std::stoi(m[3]);
    } else if (open && std::regex_search(line, m, regs)) {
      out.back().registers = std::stoi(m[1]);
      open = false;
    }
  }
  return out;
}

}  // namespace qf::rt
