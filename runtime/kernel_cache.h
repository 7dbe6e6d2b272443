// The kernel cache: content-addressed, two layers (process memory, then disk).
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
// Roots: one writable root ($QFORGE_CACHE_DIR, else $XDG_CACHE_HOME/qforge, else
// ~/.cache/qforge) and read-only roots ($QFORGE_CACHE_READONLY_DIRS, colon separated), looked up
// after the writable one. An unusable writable root degrades to memory only, with one warning per
// process and directory; QFORGE_CACHE_DISABLE=1 means memory only, silently.
#pragma once
#include <atomic>
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
CacheKey make_key(const CompileRequest& req);

struct CacheEntry {
  std::string key;
  ImageKind kind = ImageKind::Cubin;
  std::string arch;    // requested, e.g. "sm_90a"
  std::string target;  // built, e.g. "sm_90a" or "compute_120" (PTX fallback)
  std::string image;   // CUBIN or PTX bytes (c_str() is NUL-terminated for PTX loaders)
  std::map<std::string, std::string> lowered_names;
  nlohmann::json metadata = nlohmann::json::object();  // caller's (recipe, role, dtype, ...)
  std::string nvrtc_version;
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
};

struct CacheOptions {
  std::optional<std::filesystem::path> writable_root;  // none: memory only (plus read-only roots)
  std::vector<std::filesystem::path> readonly_roots;
  bool disabled = false;  // memory only, no disk at all, no warning
  static CacheOptions from_env();
};

struct CacheListing {
  std::string key, kind, arch, recipe, role;  // recipe/role from metadata, "" if absent
  uint64_t size = 0;                          // image bytes
  int64_t created_unix = 0, last_use_unix = 0;
  std::string root;
  bool readonly = false;
};

struct CacheProblem {
  std::string path, what;
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
  // in parallel. CompileError propagates (to every waiter).
  CacheResult get_or_compile(const CompileRequest& req,
                             const nlohmann::json& metadata = nlohmann::json::object());

  // Maintenance (the CLI's list / verify / clear). Entries of every root.
  std::vector<CacheListing> list() const;
  std::vector<CacheProblem> verify() const;
  // Removes every entry (and leftover temp dir) of the writable root's qforge-v1 dir and the
  // memory layer; returns the number of entries removed. The root itself is kept.
  size_t clear();

  CacheStats stats() const;
  bool disk_writable() const { return writable_.load(); }
  const std::optional<std::filesystem::path>& writable_root() const { return opts_.writable_root; }
  const std::vector<std::filesystem::path>& readonly_roots() const { return opts_.readonly_roots; }

 private:
  std::shared_ptr<const CacheEntry> load_from_disk(const CacheKey& key);
  void store_to_disk(const CacheEntry& e, const std::string& source);
  void disable_disk(const std::string& why);

  CacheOptions opts_;
  std::atomic<bool> writable_{false};
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const CacheEntry>> memory_;
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<const CacheEntry>>> in_flight_;
  std::atomic<uint64_t> memory_hits_{0}, disk_hits_{0}, misses_{0}, compiles_{0}, corrupt_{0}, store_failures_{0};
};

}  // namespace qf::rt
