// The kernel cache: content-addressed, two layers (process memory, then disk). docs/cache.md
// says what it guarantees and what it does not.
//
// Key = SHA-256 of (schema version, emitted source, source name, name expressions, hash of every
// embedded header, NVRTC version, full option list, exact arch): any change that could change
// the image changes the key, so a stale kernel is never reused (see compile_options()).
//
// Disk layout, one directory per entry:
//   <root>/qforge-v1/<key[0:2]>/<key>/{image.bin, meta.json, source.cu, last_use}
// Entries are written into <root>/qforge-v1/tmp/<key>.<pid>.<random>/, every file and the
// directory fsync'ed, then renamed into place (the loser of a race deletes its copy). Loading
// checks meta.json's key and the image's size and SHA-256; a corrupt entry is moved aside and
// removed, and counts as a miss.
//
// Across processes: whoever compiles a key holds an flock(2) on <root>/qforge-v1/tmp/<key>.lock
// from just before the compile until just after the publish; others wanting the key wait for it
// (then load the published entry) instead of compiling too. The kernel drops the lock of a
// process that dies. Where flock is not supported, or after CacheOptions::lock_timeout, a
// process compiles without the lock (correct, only no longer "once"). A writer also holds an
// flock on its temp dir, so the temp dir of a killed writer is recognised and removed.
//
// Roots: one writable root ($QFORGE_CACHE_DIR, else $XDG_CACHE_HOME/qforge, else
// ~/.cache/qforge) and read-only roots ($QFORGE_CACHE_READONLY_DIRS, colon separated), looked up
// after the writable one. An unusable writable root (read-only, not a directory, full) degrades
// to memory only, with one warning per process and directory; QFORGE_CACHE_DISABLE=1 means
// memory only, silently.
//
// Shipped roots ($QFORGE_CACHE_SHIPPED_DIRS): read-only roots prewarmed when a release was built
// (a wheel's bundled kernels), looked up as read-only roots and then, on a miss, by the key the
// request would have had under the NVRTC that built their entries, where that NVRTC has this
// one's major version and is not newer: the one relaxation of "another NVRTC is a miss", for
// CUBIN images of the exact arch, built from the same source, headers, options and schema
// (docs/jit.md, "First calls"). Unset, the variable defaults to the installed shipped root, where
// there is one (installed_kernel_roots); set and empty, there are none.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/nvrtc.h"

namespace qf::rt {

inline constexpr int kCacheSchemaVersion = 1;
inline constexpr const char* kCacheDirName = "qforge-v1";

struct CacheKey {
  std::string hex;  // 64 lowercase hex digits
  bool operator==(const CacheKey&) const = default;
};

// Everything besides the request that goes into a key: what could change the image of the same
// source. current() is this build's schema, NVRTC and embedded headers; tests pass others.
struct KeyContext {
  int schema = kCacheSchemaVersion;
  std::string nvrtc_version, templates_hash;
  static KeyContext current();
};
CacheKey make_key(const CompileRequest& req, const KeyContext& ctx);
CacheKey make_key(const CompileRequest& req);  // with KeyContext::current()

struct CacheEntry {
  std::string key;
  ImageKind kind = ImageKind::Cubin;
  std::string arch;    // requested, e.g. "sm_90a"
  std::string target;  // built, e.g. "sm_90a" or "compute_120" (PTX fallback)
  std::string image;   // CUBIN or PTX bytes (c_str() is NUL-terminated for PTX loaders)
  std::map<std::string, std::string> lowered_names;
  nlohmann::json metadata = nlohmann::json::object();  // caller's (recipe, role, dtype, ...)
  std::string nvrtc_version;
  std::string templates_hash;  // of the device headers it was built from (meta.json; "" in entries of older versions)
  std::string note;  // PTX-fallback explanation, if any
  std::string log;   // NVRTC warnings, if any
  std::vector<std::string> options;  // full NVRTC option list (see compile_options())
  int64_t created_unix = 0;
  // The mangled symbol of a name expression given in the request; InternalError if absent.
  const std::string& lowered(const std::string& name_expression) const;
};

enum class CacheHow { MemoryHit, DiskHit, Compiled };
const char* name(CacheHow h);

struct CacheResult {
  std::shared_ptr<const CacheEntry> entry;
  CacheHow how;
};

struct CacheStats {
  uint64_t memory_hits = 0, disk_hits = 0, misses = 0, compiles = 0, corrupt = 0, store_failures = 0;
  uint64_t lock_waits = 0;     // keys another process was compiling when we wanted them
  uint64_t lock_timeouts = 0;  // ... for longer than lock_timeout (we compiled it too)
  uint64_t shipped_hits = 0;   // disk hits (counted there too) on a shipped root's entry built by another NVRTC
};

// Test seams, set from QFORGE_TEST_* by CacheOptions::from_env() (or directly by unit tests).
// Production leaves them empty.
struct CacheTestHooks {
  // QFORGE_TEST_FAULT: make the cache's file operations fail with this errno, as a full disk
  // (ENOSPC: every write(2)), a read-only filesystem (EROFS: every mkdir, file creation and write)
  // or a filesystem without flock (ENOLCK: every flock(2)) would.
  int fault = 0;
  // QFORGE_TEST_PAUSE=compile|write|publish: print "qforge: test: paused at <point> (pid N)" to
  // stderr and sleep QFORGE_TEST_PAUSE_SECONDS (default 600) there, so a test can kill -9 the
  // process at that point. compile: key lock held, nothing written yet; write: image.bin written
  // into the temp dir, meta.json not yet; publish: temp dir complete, before the rename.
  std::string pause_at;
  double pause_seconds = 600;
  // QFORGE_TEST_COMPILE_LOG: append "<key> <pid>" to this file for every NVRTC compile, so
  // compiles can be counted per key across processes.
  std::filesystem::path compile_log;
  // Unit tests only: compute keys as another toolkit / schema would.
  std::optional<KeyContext> key_context;
};

struct CacheOptions {
  std::optional<std::filesystem::path> writable_root;  // none: memory only (plus read-only roots)
  std::vector<std::filesystem::path> readonly_roots;
  // Also read-only roots (the cache adds them to readonly_roots), whose CUBIN entries built by an
  // older NVRTC of the same major version serve this one (see the top of this file).
  std::vector<std::filesystem::path> shipped_roots;
  bool disabled = false;  // memory only, no disk at all, no warning
  // How long to wait for another process compiling the same key before compiling it here too.
  std::chrono::milliseconds lock_timeout{std::chrono::minutes(2)};
  CacheTestHooks test;
  static CacheOptions from_env();  // UserError for a malformed QFORGE_TEST_* value
};

// The installed shipped root: `DATADIR/qforge/kernels` of the prefix this code was installed into
// (a build configured with -DQFORGE_INSTALL_KERNELS=ON installs the shipped recipes' prewarmed
// kernels there), found from the loaded file that holds this code, `image`: libqforge.so in
// LIBDIR, or a program that links the runtime statically (the CLI) in BINDIR. Those of
// image's directory / installed_kernels_relative() that are directories; none for an empty image.
std::vector<std::filesystem::path> installed_kernel_roots(const std::filesystem::path& image);
// The build's install-relative paths from LIBDIR and from BINDIR to DATADIR/qforge/kernels.
std::vector<std::string> installed_kernels_relative();
// The absolute path of the loaded file (shared library or program) that holds this code; empty
// where the loader does not say.
std::filesystem::path loaded_image_path();

struct CacheListing {
  std::string key, kind, arch, recipe, role;  // recipe/role from metadata, "" if absent
  std::string form;                           // a quantize plan's program: "separate" / "all" (metadata), "/interior"
                                              // added for a program of interior tiles only; else ""
  std::string content;                        // metadata's kind: "quantize", "gemm", "optim_int8", ...; "" if absent
  uint64_t size = 0;                          // image bytes
  int64_t created_unix = 0, last_use_unix = 0;
  std::string root;
  bool readonly = false;
};

struct CacheProblem {
  std::string path, what;
};

// What KernelCache::evict removes from the writable root (qforge clear's flags). An entry goes
// when any rule picks it; with none set, nothing goes.
struct EvictPolicy {
  std::optional<int64_t> unused_for_s;  // last used (disk hit or compile) more than this long ago
  std::optional<uint64_t> max_bytes;    // then the least recently used until the rest fit in this
  bool stale = false;                   // entries this build cannot hit: another NVRTC, other device
                                        // headers (another qforge version), or damaged (verify's problems)
};
struct EvictResult {
  size_t removed = 0, kept = 0;
  uint64_t removed_bytes = 0, kept_bytes = 0;  // the entries' files on disk
};

class KernelCache {
 public:
  explicit KernelCache(CacheOptions options = CacheOptions::from_env());
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The process-wide cache, configured from the environment on first use.
  static KernelCache& global();

  // Returns the entry for `req`, compiling it at most once per process and key. No lock is held
  // while compiling: callers wanting the same key wait for the one compile; other keys compile
  // in parallel. Across processes sharing the writable root, a key is compiled once while the
  // others wait for it (see the top of this file). CompileError propagates (to every waiter).
  CacheResult get_or_compile(const CompileRequest& req,
                             const nlohmann::json& metadata = nlohmann::json::object());
  // The entry for `req` if it can be had without compiling: from memory (waiting for a compile
  // of it under way in this process), else from a root on disk (a shipped root's older-NVRTC
  // entry included), counted and kept in memory as get_or_compile would; nullopt otherwise. No
  // key lock is taken and nothing is written, repaired or compiled (a damaged entry is a miss).
  std::optional<CacheResult> find(const CompileRequest& req,
                                  const nlohmann::json& metadata = nlohmann::json::object());

  // Maintenance (the CLI's list / verify / clear). Entries of every root.
  std::vector<CacheListing> list() const;
  std::vector<CacheProblem> verify() const;
  // Removes every entry of the writable root's qforge-v1 dir, the leftovers of killed writers
  // in tmp/ (a writer still working is left alone) and the memory layer; returns the number of
  // entries removed. The root itself is kept.
  size_t clear();
  // Removes the writable root's entries `policy` picks (dry_run: only counts them), then what
  // killed writers left in tmp/, as clear does; read-only roots and the memory layer are left as
  // they are. Safe beside running processes, as clear is: an entry goes by one rename (one that
  // cannot be renamed stays), one used since it was judged stays, and a process that wanted a
  // removed one compiles it again. UserError when the root is not writable by this process.
  EvictResult evict(const EvictPolicy& policy, bool dry_run = false);

  CacheStats stats() const;
  bool disk_writable() const { return writable_.load(); }
  const std::optional<std::filesystem::path>& writable_root() const { return opts_.writable_root; }
  const std::vector<std::filesystem::path>& readonly_roots() const { return opts_.readonly_roots; }
  const std::vector<std::filesystem::path>& shipped_roots() const { return opts_.shipped_roots; }

 private:
  // `settle`: this is the decisive look (key lock held, or none to be had): count a corrupt
  // entry and move it aside. Otherwise a corrupt entry is just a miss.
  std::shared_ptr<const CacheEntry> load_from_disk(const CacheKey& key, const std::vector<std::string>& names, bool settle);
  void store_to_disk(const CacheEntry& e, const std::string& source);
  // A shipped root's entry for `req` built by another NVRTC this one may use (top of this file),
  // or null. A damaged one is a miss (read-only roots are never repaired).
  std::shared_ptr<const CacheEntry> load_shipped(const CompileRequest& req);
  void disable_disk(const std::string& why);
  CacheKey key_of(const CompileRequest& req) const;
  KeyContext key_context() const;  // this build's, or the test's (CacheTestHooks::key_context)
  void sweep_tmp(const std::filesystem::path& tmp) const;  // clear's and evict's sweep of tmp/'s leftovers

  CacheOptions opts_;
  std::atomic<bool> writable_{false};
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const CacheEntry>> memory_;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<const CacheEntry>>> in_flight_;
  std::atomic<uint64_t> memory_hits_{0}, disk_hits_{0}, misses_{0}, compiles_{0}, corrupt_{0}, store_failures_{0};
  std::atomic<uint64_t> lock_waits_{0}, lock_timeouts_{0}, shipped_hits_{0};
};

// "qforge: warning: <message>" on stderr, once per tag per process.
void warn_once(const std::string& tag, const std::string& message);

}  // namespace qf::rt
