#include "runtime/kernel_cache.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <system_error>
#include <thread>
#include <tuple>

#include "compiler/env.h"
#include "compiler/error.h"
#include "runtime/log.h"
#include "runtime/sha256.h"

namespace qf::rt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ------------------------------------------------------------------------------------------------
// Files: plain POSIX so every write can be fsync'ed.
// ------------------------------------------------------------------------------------------------
[[noreturn]] void throw_errno(const std::string& what, const fs::path& p) {
  throw std::system_error(errno, std::generic_category(), what + " " + p.string());
}

class Fd {  // RAII file descriptor
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(), fd_ = o.release();
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// The operations CacheTestHooks::fault can make fail (see kernel_cache.h), each as the real
// failure would: errno set, -1 returned.
int fail_with(int err) {
  errno = err;
  return -1;
}

int make_dir(const fs::path& p, mode_t mode, const CacheTestHooks& t) {
  return t.fault == EROFS ? fail_with(EROFS) : ::mkdir(p.c_str(), mode);
}

int try_lock(int fd, const CacheTestHooks& t) {  // flock(LOCK_EX | LOCK_NB), retried on EINTR
  if (t.fault == ENOLCK) return fail_with(ENOLCK);
  int rc;
  while ((rc = ::flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  return rc;
}

bool same_file(int fd, const fs::path& p) {  // does `p` still name the file open as `fd`?
  struct stat a, b;
  return ::fstat(fd, &a) == 0 && ::lstat(p.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

void write_file_synced(const fs::path& p, std::string_view data, const CacheTestHooks& t) {
  Fd fd(t.fault == EROFS ? fail_with(EROFS) : ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw_errno("cannot create", p);
  if (t.fault == ENOSPC) {
    errno = ENOSPC;
    throw_errno("cannot write", p);
  }
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("cannot write", p);
    done += size_t(n);
  }
  if (::fsync(fd.get()) != 0) throw_errno("cannot fsync", p);
  if (::close(fd.release()) != 0) throw_errno("cannot close", p);
}

void fsync_dir(const fs::path& p) {
  Fd fd(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_errno("cannot open directory", p);
  if (::fsync(fd.get()) != 0) throw_errno("cannot fsync directory", p);
}

std::optional<std::string> read_file(const fs::path& p) {
  Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return std::nullopt;
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return out;
    out.append(buf, size_t(n));
  }
}

int64_t mtime_unix(const fs::path& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 ? int64_t(st.st_mtime) : 0;
}

std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%d.%016llx.%llu", int(::getpid()), (unsigned long long)rng(),
                (unsigned long long)counter++);
  return buf;
}

// What the log says a kernel is: its metadata's kind and other fields, then its entry names.
std::string describe_kernels(const CompileRequest& req, const json& metadata) {
  std::string kind = "kernel", fields;
  for (const auto& [k, v] : metadata.items()) {
    if (!v.is_string()) continue;
    if (k == "kind") kind = v.get<std::string>() + " kernel";
    else fields += (fields.empty() ? "" : ", ") + k + " " + v.get<std::string>();
  }
  std::string names;
  for (const auto& n : req.name_expressions) names += (names.empty() ? "" : ", ") + n;
  return kind + (fields.empty() ? "" : " (" + fields + ")") + " [" + (names.empty() ? req.source_name : names) + "]";
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", double(d.count()) / 1000);
  return buf;
}

bool is_key(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

fs::path entry_dir(const fs::path& root, const std::string& key) {
  return root / kCacheDirName / key.substr(0, 2) / key;
}

// The entry directories under a cache directory `base` (<base>/<key[0:2]>/<key>), for list, verify,
// clear and evict: entry(dir, key) for each directory named by a key under its own prefix, and
// other(path, why) for anything else beside them, but tmp/ and tuning/ (which hold no kernels).
// Links are never followed: a linked prefix or entry is `other`. Each prefix is read whole before
// its entries are visited, so `entry` may move its directory away.
template <class Entry, class Other>
void for_each_entry(const fs::path& base, Entry&& entry, Other&& other) {
  std::error_code ec;
  for (const auto& prefix : fs::directory_iterator(base, ec)) {
    const std::string p = prefix.path().filename().string();
    if (p == "tmp" || p == "tuning") continue;
    if (prefix.is_symlink() || !prefix.is_directory() || p.size() != 2) {
      other(prefix.path(), "unexpected entry in the cache directory");
      continue;
    }
    std::error_code ec2;
    std::vector<fs::directory_entry> dirs;
    for (const auto& d : fs::directory_iterator(prefix.path(), ec2)) dirs.push_back(d);
    for (const auto& d : dirs) {
      const std::string key = d.path().filename().string();
      if (!is_key(key) || key.compare(0, 2, p) != 0)
        other(d.path(), "name is not a cache key of this prefix");
      else if (d.is_symlink() || !d.is_directory())
        other(d.path(), "not a directory (links are not followed)");
      else
        entry(d.path(), key);
    }
  }
}

// An entry's last use: the mtime of its `last_use` stamp, else of its meta.json (regular files
// only: links are not followed); 0 when neither is there.
int64_t last_use_unix(const fs::path& dir) {
  struct stat st;
  for (const char* f : {"last_use", "meta.json"})
    if (::lstat((dir / f).c_str(), &st) == 0 && S_ISREG(st.st_mode)) return int64_t(st.st_mtime);
  return 0;
}

// Moves a directory out of the way (into tmp/, so no reader sees it half-deleted), then deletes it.
void remove_dir_safely(const fs::path& dir, const fs::path& tmp, const std::string& tag) {
  std::error_code ec;
  const fs::path aside = tmp / (tag + "." + unique_suffix());
  fs::rename(dir, aside, ec);
  fs::remove_all(ec ? dir : aside, ec);
}

// Test seams (CacheTestHooks): a pause a test can kill the process in, and a compile log.
void pause_point(const CacheTestHooks& t, const char* point) {
  if (t.pause_at != point) return;
  // Straight to stderr, not through the log: test scripts wait for this line whatever the log
  // level or callback.
  std::fprintf(stderr, "qforge: test: paused at %s (pid %d)\n", point, int(::getpid()));
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::duration<double>(t.pause_seconds));
}

void log_compile(const CacheTestHooks& t, const std::string& key) {
  if (t.compile_log.empty()) return;
  const std::string line = key + " " + std::to_string(::getpid()) + "\n";  // one O_APPEND write: atomic
  Fd fd(::open(t.compile_log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0 || ::write(fd.get(), line.data(), line.size()) != ssize_t(line.size()))
    log::warn("cannot append to QFORGE_TEST_COMPILE_LOG " + t.compile_log.string());
}

// ------------------------------------------------------------------------------------------------
// Cross-process locks (flock(2): per open file, dropped by the kernel when the holder dies).
// ------------------------------------------------------------------------------------------------

// The lock of one key: an exclusive flock on tmp/<key>.lock, a file that exists only while held.
// The holder unlinks it before unlocking; whoever locks it next checks that the path still names
// the file it locked, and otherwise starts over. So a lock file left by a killed process is just
// reused, and tmp/ is empty when nothing is being compiled.
class KeyLock {
 public:
  enum class Outcome { Held, TimedOut, Unavailable };
  struct Attempt {
    Outcome outcome = Outcome::Held;
    bool waited = false;  // someone else held the lock at first
    // Unavailable: flock is not supported here (says so), or empty: the lock file cannot be
    // created (the disk is full or read-only, which storing the entry will report).
    std::string problem;
  };

  KeyLock() = default;
  KeyLock(KeyLock&&) = default;
  KeyLock& operator=(KeyLock&& o) noexcept {
    if (this != &o) release(), fd_ = std::move(o.fd_), path_ = std::move(o.path_);
    return *this;
  }
  ~KeyLock() { release(); }
  void release() {
    if (fd_.get() < 0) return;
    ::unlink(path_.c_str());
    ::flock(fd_.get(), LOCK_UN);  // not just close: a child forked meanwhile shares the open file
    fd_.reset();
  }

  // Waits up to `timeout` for the lock; says how it went in `attempt`.
  static KeyLock acquire(const fs::path& path, std::chrono::milliseconds timeout, const CacheTestHooks& t,
                         Attempt& attempt) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::milliseconds(2);
    attempt = Attempt{};
    for (;;) {
      Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
      if (fd.get() < 0) {
        attempt.outcome = Outcome::Unavailable;
        return {};
      }
      bool locked;
      while (!(locked = try_lock(fd.get(), t) == 0)) {
        if (errno != EWOULDBLOCK) {
          attempt.outcome = Outcome::Unavailable;
          attempt.problem = "cannot lock " + path.string() + " (" + std::strerror(errno) + ")";
          ::unlink(path.c_str());  // nobody can hold it here
          return {};
        }
        if (Clock::now() >= deadline) {
          attempt.outcome = Outcome::TimedOut;
          return {};
        }
        attempt.waited = true;
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(50));
        if (!same_file(fd.get(), path)) break;  // the holder is done and unlinked it
      }
      // Locked, and the path still names our file: ours. Otherwise the holder unlinked it after
      // we opened it; open the current one.
      if (locked && same_file(fd.get(), path)) {
        KeyLock l;
        l.fd_ = std::move(fd), l.path_ = path;
        return l;
      }
      attempt.waited = true;
    }
  }

 private:
  Fd fd_;
  fs::path path_;
};

// What a writer leaves in tmp/ while it works: its temp dir "<key>.<pid>.<random>.<n>" (created
// as "." + that name, renamed to it once flock'ed, so a name without the dot is always locked
// by a live writer or abandoned) and, while compiling, "<key>.lock".
enum class Owner { Gone, Alive, Unknown };

// Removes `p` (a temp dir or lock file in tmp/) if its owner is gone, i.e. we can take its flock.
// Unknown: flock is not supported here, so we cannot tell.
Owner remove_if_abandoned(const fs::path& p, const CacheTestHooks& t) {
  Fd fd(::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return errno == ENOENT ? Owner::Gone : Owner::Unknown;
  if (try_lock(fd.get(), t) != 0) return errno == EWOULDBLOCK ? Owner::Alive : Owner::Unknown;
  if (!same_file(fd.get(), p)) return Owner::Alive;  // a lock file unlinked and recreated meanwhile
  std::error_code ec;
  if (fs::is_directory(fs::symlink_status(p, ec)))
    fs::remove_all(p, ec);
  else
    ::unlink(p.c_str());
  return Owner::Gone;
}

bool is_temp_name(const std::string& n) {  // "<key>.lock" or "<key>.<pid>.<random>.<n>"
  return n.size() > 65 && n[64] == '.' && is_key(n.substr(0, 64));
}

// Removes the abandoned temp dirs and lock files of one key (or of all keys: prefix "").
void remove_abandoned(const fs::path& tmp, const std::string& prefix, const CacheTestHooks& t) {
  std::error_code ec;
  std::vector<fs::path> found;
  for (const auto& d : fs::directory_iterator(tmp, ec)) {
    const std::string n = d.path().filename().string();
    if (is_temp_name(n) && n.compare(0, prefix.size(), prefix) == 0) found.push_back(d.path());
  }
  for (const auto& p : found) remove_if_abandoned(p, t);
}

}  // namespace

void warn_once(const std::string& tag, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> warned;
  {
    std::lock_guard lk(mu);
    if (!warned.insert(tag).second) return;
  }
  log::warn(message);  // outside the lock: the log's callback may take its time
}

namespace {

// ------------------------------------------------------------------------------------------------
// meta.json
// ------------------------------------------------------------------------------------------------
json to_meta(const CacheEntry& e, const std::string& source, const std::string& templates) {
  return json{{"schema", kCacheSchemaVersion},
              {"key", e.key},
              {"kind", name(e.kind)},
              {"arch", e.arch},
              {"target", e.target},
              {"nvrtc_version", e.nvrtc_version},
              {"templates_hash", templates},
              {"lowered_names", e.lowered_names},
              {"image_size", e.image.size()},
              {"image_sha256", sha256_hex(e.image)},
              {"source_size", source.size()},
              {"metadata", e.metadata},
              {"note", e.note},
              {"log", e.log},
              {"options", e.options},
              {"created_unix", e.created_unix}};
}

// Loads and checks the entry in `dir` for `key`; on any problem returns null with `problem` set.
// With `names` (a request's name expressions) the entry must also lower exactly those.
std::shared_ptr<CacheEntry> load_entry(const fs::path& dir, const std::string& key, std::string& problem,
                                       const std::vector<std::string>* names = nullptr) {
  const auto meta_text = read_file(dir / "meta.json");
  if (!meta_text) return problem = "meta.json missing or unreadable", nullptr;
  json m = json::parse(*meta_text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return problem = "meta.json is not valid JSON", nullptr;
  try {
    if (m.at("schema").get<int>() != kCacheSchemaVersion) return problem = "meta.json has another schema", nullptr;
    if (m.at("key").get<std::string>() != key)
      return problem = "meta.json key " + m.at("key").get<std::string>() + " does not match", nullptr;
    auto e = std::make_shared<CacheEntry>();
    e->key = key;
    const std::string kind = m.at("kind").get<std::string>();
    if (kind != "cubin" && kind != "ptx") return problem = "meta.json has unknown kind \"" + kind + "\"", nullptr;
    e->kind = kind == "cubin" ? ImageKind::Cubin : ImageKind::Ptx;
    e->arch = m.at("arch").get<std::string>();
    e->target = m.at("target").get<std::string>();
    e->nvrtc_version = m.at("nvrtc_version").get<std::string>();
    e->templates_hash = m.value("templates_hash", "");
    e->lowered_names = m.at("lowered_names").get<std::map<std::string, std::string>>();
    e->metadata = m.at("metadata");
    e->note = m.value("note", "");
    e->log = m.value("log", "");
    e->options = m.value("options", std::vector<std::string>{});
    e->created_unix = m.at("created_unix").get<int64_t>();
    auto image = read_file(dir / "image.bin");
    if (!image) return problem = "image.bin missing or unreadable", nullptr;
    if (image->size() != m.at("image_size").get<uint64_t>())
      return problem = "image.bin has " + std::to_string(image->size()) + " bytes, meta.json says " +
                       std::to_string(m.at("image_size").get<uint64_t>()),
             nullptr;
    if (sha256_hex(*image) != m.at("image_sha256").get<std::string>())
      return problem = "image.bin SHA-256 does not match meta.json", nullptr;
    // The lowered names pick the kernels out of the image (CUBIN symbol names, PTX .entry
    // names): each must be there, or a load would fail or pick another kernel.
    if (e->lowered_names.empty()) return problem = "meta.json lists no kernels (lowered_names is empty)", nullptr;
    for (const auto& [expr, lowered] : e->lowered_names) {
      if (expr.empty() || lowered.empty()) return problem = "meta.json lists a kernel with an empty name", nullptr;
      if (image->find(lowered) == std::string::npos)
        return problem = "meta.json's lowered name \"" + lowered + "\" for \"" + expr + "\" is not in image.bin", nullptr;
    }
    std::error_code ec;
    const auto source_size = fs::file_size(dir / "source.cu", ec);
    if (ec) return problem = "source.cu missing", nullptr;
    if (source_size != m.at("source_size").get<uint64_t>()) return problem = "source.cu size does not match", nullptr;
    if (names) {  // as sets: a request naming a kernel twice compiles (and stores) it once
      const std::set<std::string> asked(names->begin(), names->end());
      bool same = e->lowered_names.size() == asked.size();
      for (const auto& n : asked) same &= e->lowered_names.count(n) == 1;
      if (!same) return problem = "meta.json's kernels are not the ones the request names", nullptr;
    }
    e->image = std::move(*image);
    return e;
  } catch (const json::exception& ex) {
    return problem = std::string("meta.json field missing or mistyped: ") + ex.what(), nullptr;
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------

const std::string& CacheEntry::lowered(const std::string& name_expression) const {
  auto it = lowered_names.find(name_expression);
  QF_CHECK(it != lowered_names.end(), "kernel ", key, " has no lowered name for \"", name_expression, "\"");
  return it->second;
}

const char* name(CacheHow h) {
  switch (h) {
    case CacheHow::MemoryHit: return "memory_hit";
    case CacheHow::DiskHit: return "disk_hit";
    case CacheHow::Compiled: return "compiled";
  }
  return "?";
}

KeyContext KeyContext::current() {
  return KeyContext{kCacheSchemaVersion, rt::nvrtc_version(), rt::templates_hash()};
}

CacheKey make_key(const CompileRequest& req, const KeyContext& ctx) {
  const std::vector<std::string> options = compile_options(req);
  Sha256 h;
  h.field("qforge-kernel-cache").field(std::to_string(ctx.schema));
  h.field(req.source).field(req.source_name);
  h.field(std::to_string(req.name_expressions.size()));
  for (const auto& n : req.name_expressions) h.field(n);
  h.field(ctx.templates_hash).field(ctx.nvrtc_version);
  h.field(std::to_string(options.size()));
  for (const auto& o : options) {
    QF_CHECK(o.empty() || o[0] != '/', "absolute path in NVRTC options: ", o);
    h.field(o);
  }
  h.field(req.arch);
  return CacheKey{h.hex_digest()};
}

CacheKey make_key(const CompileRequest& req) { return make_key(req, KeyContext::current()); }

#ifndef QFORGE_KERNELS_FROM_LIBDIR  // set by runtime/CMakeLists.txt from GNUInstallDirs
#define QFORGE_KERNELS_FROM_LIBDIR "../share/qforge/kernels"
#endif
#ifndef QFORGE_KERNELS_FROM_BINDIR
#define QFORGE_KERNELS_FROM_BINDIR "../share/qforge/kernels"
#endif

std::vector<std::string> installed_kernels_relative() { return {QFORGE_KERNELS_FROM_LIBDIR, QFORGE_KERNELS_FROM_BINDIR}; }

std::vector<fs::path> installed_kernel_roots(const fs::path& image) {
  std::vector<fs::path> out;
  if (image.empty()) return out;
  for (const std::string& rel : installed_kernels_relative()) {
    const fs::path dir = (image.parent_path() / rel).lexically_normal();
    std::error_code e;
    if (fs::is_directory(dir, e) && std::find(out.begin(), out.end(), dir) == out.end()) out.push_back(dir);
  }
  return out;
}

fs::path loaded_image_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&loaded_image_path), &info) == 0 || !info.dli_fname) return {};
  std::error_code e;
  fs::path p(info.dli_fname);
  // The main program's own entry names no file on some loaders: its code is /proc/self/exe's.
  if (p.empty() || !p.has_parent_path() || !fs::exists(p, e)) p = fs::read_symlink("/proc/self/exe", e);
  if (e || p.empty()) return {};
  p = fs::weakly_canonical(fs::absolute(p, e), e);
  return e ? fs::path() : p;
}

CacheOptions CacheOptions::from_env() {
  CacheOptions o;
  auto env = [](const char* k) -> std::string {
    const char* v = std::getenv(k);
    return v ? v : "";
  };
  if (auto f = env("QFORGE_TEST_FAULT"); !f.empty()) {
    if (f == "ENOSPC") o.test.fault = ENOSPC;
    else if (f == "EROFS") o.test.fault = EROFS;
    else if (f == "ENOLCK") o.test.fault = ENOLCK;
    else throw UserError("QFORGE_TEST_FAULT", "expected ENOSPC, EROFS or ENOLCK, got \"" + f + "\"");
  }
  if (auto p = env("QFORGE_TEST_PAUSE"); !p.empty()) {
    if (p != "compile" && p != "write" && p != "publish")
      throw UserError("QFORGE_TEST_PAUSE", "expected compile, write or publish, got \"" + p + "\"");
    o.test.pause_at = p;
  }
  if (auto s = env("QFORGE_TEST_PAUSE_SECONDS"); !s.empty()) {
    char* end = nullptr;
    o.test.pause_seconds = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end || !(o.test.pause_seconds >= 0) || !std::isfinite(o.test.pause_seconds))
      throw UserError("QFORGE_TEST_PAUSE_SECONDS", "expected a number of seconds >= 0, got \"" + s + "\"");
  }
  o.test.compile_log = env("QFORGE_TEST_COMPILE_LOG");
  if (env_flag("QFORGE_CACHE_DISABLE", false)) {
    o.disabled = true;
    return o;
  }
  // Roots are absolute: a relative one would move with the process's working directory.
  if (auto d = env("QFORGE_CACHE_DIR"); !d.empty())
    o.writable_root = fs::absolute(fs::path(d));
  else if (auto x = env("XDG_CACHE_HOME"); !x.empty() && x[0] == '/')
    o.writable_root = fs::path(x) / "qforge";
  else if (auto h = env("HOME"); !h.empty())
    o.writable_root = fs::path(h) / ".cache" / "qforge";
  auto roots = [&](const char* var, std::vector<fs::path>& out) {
    const std::string ro = env(var);
    for (size_t start = 0; start <= ro.size();) {
      size_t end = ro.find(':', start);
      if (end == std::string::npos) end = ro.size();
      if (end > start) out.emplace_back(fs::absolute(fs::path(ro.substr(start, end - start))));
      start = end + 1;
    }
  };
  roots("QFORGE_CACHE_READONLY_DIRS", o.readonly_roots);
  // Unset: the installed shipped root, if this code was installed with one; set and empty: none.
  if (std::getenv("QFORGE_CACHE_SHIPPED_DIRS")) roots("QFORGE_CACHE_SHIPPED_DIRS", o.shipped_roots);
  else o.shipped_roots = installed_kernel_roots(loaded_image_path());
  return o;
}

KernelCache::KernelCache(CacheOptions options) : opts_(std::move(options)) {
  if (opts_.disabled) {
    opts_.writable_root.reset();
    opts_.readonly_roots.clear();
    opts_.shipped_roots.clear();
    return;
  }
  // Shipped roots are read-only roots too (looked up, listed and verified as those are).
  for (const auto& r : opts_.shipped_roots) opts_.readonly_roots.push_back(r);
  // Read-only roots: a mistyped one is named (and kept: it may be mounted later); the writable
  // root among them once only.
  std::vector<fs::path> ro;
  for (const auto& r : opts_.readonly_roots) {
    std::error_code e;
    if (opts_.writable_root && fs::equivalent(r, *opts_.writable_root, e)) continue;
    if (std::find(ro.begin(), ro.end(), r) != ro.end()) continue;
    if (!fs::is_directory(r, e)) warn_once("readonly " + r.string(), "read-only kernel cache " + r.string() + " is not a directory");
    ro.push_back(r);
  }
  opts_.readonly_roots = std::move(ro);
  if (!opts_.writable_root) {
    disable_disk("no cache directory (set QFORGE_CACHE_DIR or HOME)");
    return;
  }
  // Create the layout and prove we can write there (a directory that exists is not enough).
  const fs::path tmp = *opts_.writable_root / kCacheDirName / "tmp";
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) {
    disable_disk(ec.message());
    return;
  }
  const fs::path probe = tmp / ("probe." + unique_suffix());
  if (make_dir(probe, 0700, opts_.test) != 0) {
    disable_disk(std::strerror(errno));
    return;
  }
  ::rmdir(probe.c_str());
  writable_ = true;
}

KernelCache& KernelCache::global() {
  static KernelCache cache;  // thread-safe initialisation
  return cache;
}

void KernelCache::disable_disk(const std::string& why) {
  writable_ = false;
  const std::string dir = opts_.writable_root ? opts_.writable_root->string() : std::string("(none)");
  warn_once("unusable " + dir, "kernel cache directory " + dir + " is not usable (" + why +
                                   "); compiled kernels are kept in memory only for this process");
}

CacheKey KernelCache::key_of(const CompileRequest& req) const {
  return make_key(req, key_context());
}

KeyContext KernelCache::key_context() const {
  return opts_.test.key_context ? *opts_.test.key_context : KeyContext::current();
}

CacheResult KernelCache::get_or_compile(const CompileRequest& req, const json& metadata) {
  QF_CHECK(metadata.is_object(), "kernel metadata must be a JSON object");
  const auto t0 = std::chrono::steady_clock::now();
  const CacheKey key = key_of(req);
  // Messages are logged with no lock of ours held and no waiter left waiting on this call.
  auto log_hit = [&](const char* where) {
    if (log::enabled(log::Level::Debug))
      log::debug(std::string(where) + " hit: " + describe_kernels(req, metadata) + " for " + req.arch + " in " +
                 fixed(ms_since(t0), 3) + " ms (key " + key.hex.substr(0, 16) + ")");
  };
  std::promise<std::shared_ptr<const CacheEntry>> promise;
  {
    std::unique_lock lk(mu_);
    if (auto it = memory_.find(key.hex); it != memory_.end()) {
      ++memory_hits_;
      auto e = it->second;
      lk.unlock();
      log_hit("memory cache");
      return {e, CacheHow::MemoryHit};
    }
    if (auto it = in_flight_.find(key.hex); it != in_flight_.end()) {
      auto pending = it->second;
      lk.unlock();
      auto e = pending.get();  // rethrows the compiler's exception
      ++memory_hits_;
      log_hit("memory cache (after waiting for another thread's compile)");
      return {e, CacheHow::MemoryHit};
    }
    in_flight_.emplace(key.hex, promise.get_future().share());
  }
  try {
    CacheHow how = CacheHow::DiskHit;
    double compile_ms = 0;
    // Without a writable root there is no key lock, so the first look is the decisive one.
    std::shared_ptr<const CacheEntry> entry = load_from_disk(key, req.name_expressions, /*settle=*/!writable_);
    // Before the key lock: shipped roots are read-only, so this look needs none.
    if (!entry && !opts_.shipped_roots.empty()) entry = load_shipped(req);
    KeyLock lock;  // held from here until the entry is published (or the compile failed)
    if (!entry && writable_) {
      // Another process may be compiling this key: wait for it, then look again.
      const fs::path lock_path = *opts_.writable_root / kCacheDirName / "tmp" / (key.hex + ".lock");
      KeyLock::Attempt attempt;
      lock = KeyLock::acquire(lock_path, opts_.lock_timeout, opts_.test, attempt);
      if (attempt.waited) ++lock_waits_;
      if (attempt.outcome == KeyLock::Outcome::TimedOut) {
        ++lock_timeouts_;
        warn_once("lock timeout " + opts_.writable_root->string(),
                  "waited " + seconds(opts_.lock_timeout) + " for another process to compile kernel " +
                      key.hex.substr(0, 16) + " (" + lock_path.string() + "); compiling it here too");
      } else if (!attempt.problem.empty()) {
        warn_once("lock " + opts_.writable_root->string(),
                  attempt.problem + "; processes sharing this kernel cache may compile the same kernel more than once");
      }
      entry = load_from_disk(key, req.name_expressions, /*settle=*/true);
    }
    if (entry) {
      ++disk_hits_;
    } else {
      ++misses_;
      pause_point(opts_.test, "compile");
      const auto c0 = std::chrono::steady_clock::now();
      CompileResult r = compile_cuda(req);
      compile_ms = ms_since(c0);
      ++compiles_;
      log_compile(opts_.test, key.hex);
      auto e = std::make_shared<CacheEntry>();
      e->key = key.hex;
      e->kind = r.kind;
      e->arch = req.arch;
      e->target = r.target;
      e->image = std::move(r.image);
      e->lowered_names = std::move(r.lowered_names);
      e->metadata = metadata;
      e->nvrtc_version = key_context().nvrtc_version;  // (this NVRTC's, but in tests)
      e->note = std::move(r.note);
      e->log = std::move(r.log);
      e->options = std::move(r.options);
      e->created_unix = now_unix();
      store_to_disk(*e, req.source);
      entry = std::move(e);
      how = CacheHow::Compiled;
    }
    lock.release();
    {
      std::lock_guard lk(mu_);
      memory_.emplace(key.hex, entry);
      in_flight_.erase(key.hex);
    }
    promise.set_value(entry);
    if (how == CacheHow::DiskHit) {
      log_hit(entry->key == key.hex ? "disk cache" : ("shipped kernel (built by NVRTC " + entry->nvrtc_version + ")").c_str());
    } else if (log::enabled(log::Level::Info)) {
      log::info("compiled " + describe_kernels(req, metadata) + " for " + req.arch + " in " + fixed(compile_ms, 0) +
                " ms (NVRTC " + entry->nvrtc_version + ", key " + key.hex.substr(0, 16) + ")" +
                (entry->note.empty() ? "" : "; " + entry->note));
    }
    return {entry, how};
  } catch (...) {
    {
      std::lock_guard lk(mu_);
      in_flight_.erase(key.hex);
    }
    promise.set_exception(std::current_exception());
    throw;
  }
}

std::optional<CacheResult> KernelCache::find(const CompileRequest& req, const json& metadata) {
  const auto t0 = std::chrono::steady_clock::now();
  const CacheKey key = key_of(req);
  std::shared_future<std::shared_ptr<const CacheEntry>> pending;
  {
    std::unique_lock lk(mu_);
    if (auto it = memory_.find(key.hex); it != memory_.end()) {
      ++memory_hits_;
      return CacheResult{it->second, CacheHow::MemoryHit};
    }
    if (auto it = in_flight_.find(key.hex); it != in_flight_.end()) pending = it->second;
  }
  if (pending.valid()) {
    ++memory_hits_;
    return CacheResult{pending.get(), CacheHow::MemoryHit};  // rethrows the compiler's exception
  }
  std::shared_ptr<const CacheEntry> entry = load_from_disk(key, req.name_expressions, /*settle=*/false);
  if (!entry && !opts_.shipped_roots.empty()) entry = load_shipped(req);
  if (!entry) return std::nullopt;
  ++disk_hits_;
  {
    std::lock_guard lk(mu_);
    entry = memory_.emplace(key.hex, entry).first->second;  // another thread's copy, if it was first
  }
  if (log::enabled(log::Level::Debug))
    log::debug(std::string(entry->key == key.hex ? "disk cache" : "shipped kernel (built by NVRTC " + entry->nvrtc_version + ")") +
               " hit: " + describe_kernels(req, metadata) + " for " + req.arch + " in " + fixed(ms_since(t0), 3) +
               " ms (key " + key.hex.substr(0, 16) + ")");
  return CacheResult{entry, CacheHow::DiskHit};
}

namespace {

// "13.2" -> {13, 2}; {-1, -1} when it is not that shape.
std::pair<int, int> major_minor(const std::string& v) {
  int major = -1, minor = -1;
  char dot = 0, rest = 0;
  if (std::sscanf(v.c_str(), "%d%c%d%c", &major, &dot, &minor, &rest) != 3 || dot != '.' || major < 0 || minor < 0)
    return {-1, -1};
  return {major, minor};
}

}  // namespace

std::shared_ptr<const CacheEntry> KernelCache::load_shipped(const CompileRequest& req) {
  const KeyContext here = key_context();
  const auto [major, minor] = major_minor(here.nvrtc_version);
  if (major < 0) return nullptr;
  // Each older NVRTC of this major, the nearest first: its CUBINs load wherever this NVRTC's own
  // would (a newer one may have built an image this process's driver cannot load). A key is a
  // hash and a look one lstat per root, so the versions are tried, not read from the entries.
  for (int m = minor - 1; m >= 0; --m) {
    const std::string v = std::to_string(major) + "." + std::to_string(m);
    KeyContext then = here;
    then.nvrtc_version = v;
    const CacheKey key = make_key(req, then);
    for (const auto& root : opts_.shipped_roots) {
      const fs::path dir = entry_dir(root, key.hex);
      struct stat st;
      if (::lstat(dir.c_str(), &st) != 0) continue;
      std::string problem;
      auto e = load_entry(dir, key.hex, problem, &req.name_expressions);
      if (!e || e->kind != ImageKind::Cubin || e->arch != req.arch || e->nvrtc_version != v) continue;
      ++shipped_hits_;
      return e;
    }
  }
  return nullptr;
}

std::shared_ptr<const CacheEntry> KernelCache::load_from_disk(const CacheKey& key, const std::vector<std::string>& names,
                                                              bool settle) {
  if (opts_.disabled) return nullptr;
  std::vector<std::pair<fs::path, bool>> roots;  // (root, writable)
  if (opts_.writable_root) roots.emplace_back(*opts_.writable_root, true);
  for (const auto& r : opts_.readonly_roots) roots.emplace_back(r, false);
  for (const auto& [root, writable] : roots) {
    const fs::path dir = entry_dir(root, key.hex);
    struct stat st;
    if (::lstat(dir.c_str(), &st) != 0) continue;  // not there: the common miss
    std::string problem;
    if (auto e = load_entry(dir, key.hex, problem, &names)) {
      if (writable && writable_) {
        // Cheap last-use stamp for eviction tools: bump the mtime of an empty file.
        const fs::path stamp = dir / "last_use";
        if (::utimensat(AT_FDCWD, stamp.c_str(), nullptr, 0) != 0 && errno == ENOENT) {
          int fd = ::open(stamp.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
          if (fd >= 0) ::close(fd);
        }
      }
      return e;
    }
    // Only the decisive look (normally under the key lock) removes: an unlocked look could
    // otherwise move aside a good entry another process has just published in its place.
    if (!settle) continue;
    ++corrupt_;
    if (writable && writable_) remove_dir_safely(dir, root / kCacheDirName / "tmp", "corrupt." + key.hex);
  }
  return nullptr;
}

void KernelCache::store_to_disk(const CacheEntry& e, const std::string& source) {
  if (!writable_ || !opts_.writable_root) return;
  const CacheTestHooks& t = opts_.test;
  const fs::path base = *opts_.writable_root / kCacheDirName, tmp_root = base / "tmp";
  const std::string name = e.key + "." + unique_suffix();
  fs::path tmp = tmp_root / ("." + name);  // until flock'ed (see the comment on Owner)
  Fd owner;  // our flock on the temp dir: tells cleaners that its writer is alive
  std::error_code ec;
  try {
    if (make_dir(tmp, 0755, t) != 0) throw_errno("cannot create", tmp);
    owner = Fd(::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (owner.get() >= 0 && try_lock(owner.get(), t) != 0) owner.reset();  // no flock: nobody can tell
    if (::rename(tmp.c_str(), (tmp_root / name).c_str()) != 0) throw_errno("cannot rename", tmp);
    tmp = tmp_root / name;
    write_file_synced(tmp / "image.bin", e.image, t);
    pause_point(t, "write");
    write_file_synced(tmp / "source.cu", source, t);
    write_file_synced(tmp / "meta.json", to_meta(e, source, key_context().templates_hash).dump(2) + "\n", t);
    write_file_synced(tmp / "last_use", "", t);
    fsync_dir(tmp);
    pause_point(t, "publish");
    const fs::path parent = base / e.key.substr(0, 2);
    const fs::path final_dir = parent / e.key;
    // `qforge clear` in another process may remove the (empty) prefix directory between its
    // creation and the rename: ENOENT then means "create it again", not an unusable cache.
    int rc = -1;
    for (int attempt = 0; attempt < 8 && rc != 0; ++attempt) {
      if (make_dir(parent, 0755, t) != 0 && errno != EEXIST) throw_errno("cannot create", parent);
      rc = ::rename(tmp.c_str(), final_dir.c_str());
      if (rc != 0 && errno != ENOENT) break;
    }
    if (rc != 0) {
      if (errno != EEXIST && errno != ENOTEMPTY) throw_errno("cannot rename into", final_dir);
      fs::remove_all(tmp, ec);  // another process published the same key first
    } else {
      fsync_dir(parent);
    }
  } catch (const std::exception& ex) {
    ++store_failures_;
    fs::remove_all(tmp, ec);
    disable_disk(ex.what());
    return;
  }
  remove_abandoned(tmp_root, e.key + ".", t);  // what killed writers of this key left
}

std::vector<CacheListing> KernelCache::list() const {
  std::vector<CacheListing> out;
  std::vector<std::pair<fs::path, bool>> roots;
  if (opts_.writable_root) roots.emplace_back(*opts_.writable_root, false);
  for (const auto& r : opts_.readonly_roots) roots.emplace_back(r, true);
  for (const auto& [root, readonly] : roots) {
    auto listing = [&](const fs::path& dir, const std::string& key) {
      CacheListing l;
      l.key = key, l.root = root.string(), l.readonly = readonly;
      if (auto text = read_file(dir / "meta.json")) {
        json m = json::parse(*text, nullptr, false);
        if (m.is_object()) {
          // A field of the wrong type (a damaged entry) reads as unknown: listing must not fail.
          auto str = [&](const char* k) { return m.contains(k) && m[k].is_string() ? m[k].get<std::string>() : "?"; };
          l.kind = str("kind");
          l.arch = str("arch");
          l.size = m.contains("image_size") && m["image_size"].is_number_unsigned() ? m["image_size"].get<uint64_t>() : 0;
          l.created_unix = m.contains("created_unix") && m["created_unix"].is_number_integer() ? m["created_unix"].get<int64_t>() : 0;
          if (auto md = m.find("metadata"); md != m.end() && md->is_object()) {
            if (md->contains("recipe") && (*md)["recipe"].is_string()) l.recipe = (*md)["recipe"];
            if (md->contains("role") && (*md)["role"].is_string()) l.role = (*md)["role"];
            if (md->contains("form") && (*md)["form"].is_string()) l.form = (*md)["form"];
            if (md->contains("tiles") && (*md)["tiles"].is_string() && !l.form.empty())
              l.form += "/" + (*md)["tiles"].get<std::string>();
            if (md->contains("kind") && (*md)["kind"].is_string()) l.content = (*md)["kind"];
          }
        }
      }
      if (l.kind.empty()) l.kind = "?";
      l.last_use_unix = last_use_unix(dir);
      out.push_back(std::move(l));
    };
    for_each_entry(root / kCacheDirName, listing, [](const fs::path&, const char*) {});
  }
  return out;
}

std::vector<CacheProblem> KernelCache::verify() const {
  std::vector<CacheProblem> problems;
  std::vector<fs::path> roots;
  if (opts_.writable_root) roots.push_back(*opts_.writable_root);
  for (const auto& r : opts_.readonly_roots) roots.push_back(r);
  for (const auto& root : roots)
    for_each_entry(
        root / kCacheDirName,
        [&](const fs::path& dir, const std::string& key) {
          std::string problem;
          if (!load_entry(dir, key, problem)) problems.push_back({dir.string(), problem});
        },
        [&](const fs::path& path, const char* why) { problems.push_back({path.string(), why}); });
  return problems;
}

size_t KernelCache::clear() {
  {
    std::lock_guard lk(mu_);
    memory_.clear();
  }
  if (opts_.disabled || !opts_.writable_root) return 0;
  const fs::path base = *opts_.writable_root / kCacheDirName, tmp = base / "tmp";
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(base, ec))) return 0;
  fs::create_directories(tmp, ec);
  size_t removed = 0;
  for_each_entry(
      base,
      [&](const fs::path& dir, const std::string&) {
        remove_dir_safely(dir, tmp, "cleared");
        ++removed;
        std::error_code ec2;
        fs::remove(dir.parent_path(), ec2);  // (the prefix, once empty)
      },
      [](const fs::path&, const char*) {});  // not ours: left as it is
  // qforge tune's tile choices (tuning/<key>.json) go too, and a record's temporary
  // (<key>.json.tmp.<pid>) that a killed `qforge tune` left: a live writer renames its own within
  // moments, so only one ten minutes old goes.
  if (const fs::path tuning = base / "tuning"; fs::is_directory(fs::symlink_status(tuning, ec))) {
    std::error_code ec2;
    std::vector<fs::path> records;
    for (const auto& d : fs::directory_iterator(tuning, ec2)) {
      if (d.is_symlink()) continue;
      const std::string n = d.path().filename().string();
      if (d.path().extension() == ".json" && is_key(d.path().stem().string()))
        records.push_back(d.path());
      else if (n.size() > 64 && is_key(n.substr(0, 64)) && n.compare(64, 9, ".json.tmp") == 0 &&
               now_unix() - mtime_unix(d.path()) > 600)
        records.push_back(d.path());
    }
    for (const auto& r : records) fs::remove(r, ec2);
  }
  sweep_tmp(tmp);
  return removed;
}

// Leftovers in tmp/: what clear / evict moved aside, and what killed writers left. A live writer
// holds an flock on its temp dir and lock file, so those are kept; where flock is not supported,
// only what is older than ten minutes goes.
void KernelCache::sweep_tmp(const fs::path& tmp) const {
  const int64_t now = now_unix();
  std::error_code ec;
  std::vector<fs::path> leftovers;
  for (const auto& t : fs::directory_iterator(tmp, ec)) leftovers.push_back(t.path());
  for (const auto& t : leftovers) {
    const std::string n = t.filename().string();
    std::error_code ec2;
    if (n.rfind("cleared.", 0) == 0 || n.rfind("corrupt.", 0) == 0)
      fs::remove_all(t, ec2);
    else if ((!is_temp_name(n) || remove_if_abandoned(t, opts_.test) == Owner::Unknown) && now - mtime_unix(t) > 600)
      fs::remove_all(t, ec2);
  }
}

EvictResult KernelCache::evict(const EvictPolicy& policy, bool dry_run) {
  EvictResult r;
  if (opts_.disabled || !opts_.writable_root) return r;
  if (!writable_)
    throw UserError("cache", "the kernel cache directory " + opts_.writable_root->string() +
                                 " is not writable by this process: nothing can be evicted from it");
  const fs::path base = *opts_.writable_root / kCacheDirName, tmp = base / "tmp";
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(base, ec))) return r;  // (a symlink: not ours, as for clear)
  struct Entry {
    fs::path dir;
    std::string key;
    uint64_t bytes = 0;
    int64_t last_use = 0;
    bool plain = true;  // only regular files (no links, devices or pipes)
    bool stale = false, go = false;
  };
  const KeyContext context = key_context();
  const int64_t now = now_unix();
  std::vector<Entry> entries;
  auto judge = [&](const fs::path& dir, const std::string& key) {
    Entry e;
    e.dir = dir, e.key = key;
    std::error_code ec3;
    for (const auto& f : fs::directory_iterator(e.dir, ec3)) {
      struct stat st;
      if (::lstat(f.path().c_str(), &st) != 0) continue;  // gone meanwhile
      if (S_ISREG(st.st_mode)) e.bytes += uint64_t(st.st_size);
      else e.plain = false;
    }
    e.last_use = last_use_unix(e.dir);
    if (policy.unused_for_s && now - e.last_use > *policy.unused_for_s) e.go = true;
    if (policy.stale) {  // damaged, or built by another NVRTC or from other headers
      std::string problem;
      const auto loaded = e.plain ? load_entry(e.dir, e.key, problem) : nullptr;
      e.stale = !loaded || loaded->nvrtc_version != context.nvrtc_version || loaded->templates_hash != context.templates_hash;
      e.go |= e.stale;
    }
    entries.push_back(std::move(e));
  };
  for_each_entry(base, judge, [](const fs::path&, const char*) {});
  if (policy.max_bytes) {  // least recently used first (then by key: a stable order)
    std::vector<Entry*> kept;
    uint64_t total = 0;
    for (auto& e : entries)
      if (!e.go) kept.push_back(&e), total += e.bytes;
    std::sort(kept.begin(), kept.end(), [](const Entry* a, const Entry* b) {
      return std::tie(a->last_use, a->key) < std::tie(b->last_use, b->key);
    });
    for (Entry* e : kept) {
      if (total <= *policy.max_bytes) break;
      e->go = true;
      total -= e->bytes;
    }
  }
  if (!dry_run) fs::create_directories(tmp, ec);
  for (auto& e : entries) {
    // Used since it was judged (a running process loaded it while the others were read): kept,
    // unless it is stale. Otherwise one rename takes it out of every reader's way; an entry that
    // cannot be renamed aside stays (it is not deleted in place).
    if (e.go && !dry_run && !e.stale && last_use_unix(e.dir) > e.last_use) e.go = false;
    if (e.go && !dry_run) {
      const fs::path aside = tmp / ("cleared." + unique_suffix());
      std::error_code ec2;
      fs::rename(e.dir, aside, ec2);
      if (ec2) e.go = false;
      else fs::remove_all(aside, ec2), fs::remove(e.dir.parent_path(), ec2);  // (the prefix, once empty)
    }
    (e.go ? r.removed : r.kept) += 1;
    (e.go ? r.removed_bytes : r.kept_bytes) += e.bytes;
  }
  if (!dry_run) sweep_tmp(tmp);
  return r;
}

CacheStats KernelCache::stats() const {
  CacheStats s;
  s.memory_hits = memory_hits_, s.disk_hits = disk_hits_, s.misses = misses_, s.compiles = compiles_;
  s.corrupt = corrupt_, s.store_failures = store_failures_;
  s.lock_waits = lock_waits_, s.lock_timeouts = lock_timeouts_, s.shipped_hits = shipped_hits_;
  return s;
}

}  // namespace qf::rt
