// The JIT runtime below the driver: SHA-256, the NVRTC front end and the kernel cache.
// No GPU needed: NVRTC compiles CUBIN for any arch. Compiles are slow (~1 s), so the tests share
// a few small kernels and count compiles through KernelCache::stats(). Cross-process behaviour
// (8 concurrent prewarms, kill -9, real read-only / full filesystems) is tested by the scripts
// in tests/cache/.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "compiler/error.h"
#include "runtime/kernel_cache.h"
#include "runtime/nvrtc.h"
#include "runtime/sha256.h"

namespace qf::rt {
namespace {
namespace fs = std::filesystem;

// A kernel that pulls in the embedded numerics header, so header embedding is exercised.
const char* kTinyKernel = R"(#include "qforge/numerics.cuh"
namespace qf::kernels {
template <int N>
__global__ void bits(const float* in, unsigned* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) out[i] = qf::f32_bits(in[i]);
}
}  // namespace qf::kernels
extern "C" __global__ void plain(unsigned* out) { out[0] = 1u; }
)";

CompileRequest tiny(const std::string& arch = "sm_90a") {
  CompileRequest r;
  r.source = kTinyKernel;
  r.name_expressions = {"qf::kernels::bits<256>", "plain"};
  r.arch = arch;
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// A fresh directory under the test's temp location, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::path(::testing::TempDir()) /
            (std::string("qforge-") + info->test_suite_name() + "-" + info->name() + "-" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    for (auto& d : fs::recursive_directory_iterator(path_, ec))
      fs::permissions(d.path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Sets environment variables for one scope and restores the previous values.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) {
      const char* old = std::getenv(k);
      saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
      v ? ::setenv(k, v, 1) : ::unsetenv(k);
    }
  }
  ~ScopedEnv() {
    for (auto& [k, v] : saved_) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

CacheOptions at(const fs::path& root) {
  CacheOptions o;
  o.writable_root = root;
  return o;
}

fs::path tmp_of(const fs::path& root) { return root / "qforge-v1" / "tmp"; }

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool is_elf(const std::string& image) { return image.size() > 4 && image.substr(0, 4) == "\x7f" "ELF"; }

// Holds an flock on a file or directory, as another qforge process compiling or writing would.
class HeldLock {
 public:
  explicit HeldLock(const fs::path& p)
      : fd_(::open(p.c_str(), O_RDONLY | O_CLOEXEC | (fs::is_directory(p) ? 0 : O_CREAT), 0644)) {
    if (fd_ < 0 || ::flock(fd_, LOCK_EX | LOCK_NB) != 0) ADD_FAILURE() << "cannot lock " << p;
  }
  ~HeldLock() { ::close(fd_); }
  HeldLock(const HeldLock&) = delete;
  HeldLock& operator=(const HeldLock&) = delete;

 private:
  int fd_;
};

// ---------------------------------------------------------------------------------------------
// SHA-256: FIPS 180-4 / NIST CAVP vectors.
// ---------------------------------------------------------------------------------------------
TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalEqualsOneShot) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data += char(i * 7);
  for (size_t split : {0, 1, 55, 56, 63, 64, 65, 999}) {
    Sha256 h;
    h.update(std::string_view(data).substr(0, split)).update(std::string_view(data).substr(split));
    EXPECT_EQ(h.hex_digest(), sha256_hex(data)) << "split at " << split;
  }
  EXPECT_NE(Sha256().field("ab").field("c").hex_digest(), Sha256().field("a").field("bc").hex_digest());
}

// ---------------------------------------------------------------------------------------------
// NVRTC
// ---------------------------------------------------------------------------------------------
TEST(Nvrtc, VersionArchsAndTemplateHash) {
  EXPECT_EQ(nvrtc_version(), "13.0");
  const auto archs = supported_archs();
  EXPECT_NE(std::find(archs.begin(), archs.end(), "sm_90"), archs.end());
  EXPECT_NE(std::find(archs.begin(), archs.end(), "sm_100"), archs.end());
  EXPECT_EQ(templates_hash().size(), 64u);
}

TEST(Nvrtc, OptionsKeepIeeeNumerics) {
  const auto opts = compile_options(tiny("sm_100a"));
  EXPECT_NE(std::find(opts.begin(), opts.end(), "--fmad=false"), opts.end());
  EXPECT_NE(std::find(opts.begin(), opts.end(), "--gpu-architecture=sm_100a"), opts.end());
  for (const auto& o : opts) {
    EXPECT_EQ(o.find("fast"), std::string::npos) << o;
    EXPECT_EQ(o.find("ftz"), std::string::npos) << o;
  }
  CompileRequest bad = tiny();
  bad.options = {"--use_fast_math"};
  EXPECT_THROW(compile_options(bad), InternalError);
  bad.options = {"-I/usr/include"};
  EXPECT_THROW(compile_options(bad), InternalError);
  EXPECT_THROW(compile_options(tiny("sm90")), UserError);
  EXPECT_THROW(compile_options(tiny("sm_90x")), UserError);
}

TEST(Nvrtc, CompilesCubinForHopperAndBlackwell) {
  for (const std::string arch : {"sm_90a", "sm_100a"}) {
    const CompileResult r = compile_cuda(tiny(arch));
    EXPECT_EQ(r.kind, ImageKind::Cubin) << arch;
    EXPECT_EQ(r.target, arch);
    EXPECT_TRUE(r.note.empty());
    ASSERT_GT(r.image.size(), 4u) << arch;
    EXPECT_EQ(r.image.substr(0, 4), "\x7f" "ELF") << arch;
    ASSERT_EQ(r.lowered_names.count("qf::kernels::bits<256>"), 1u);
    const std::string& mangled = r.lowered_names.at("qf::kernels::bits<256>");
    EXPECT_EQ(mangled.rfind("_Z", 0), 0u) << mangled;
    EXPECT_NE(r.image.find(mangled), std::string::npos) << "symbol not in the cubin";
    EXPECT_EQ(r.lowered_names.at("plain"), "plain");
  }
}

TEST(Nvrtc, ArchNewerThanNvrtcFallsBackToPtx) {
  // sm_990 is far beyond any NVRTC 13: PTX for the newest supported compute arch, said so.
  const auto opts = compile_options(tiny("sm_990"));
  const std::string newest = supported_archs().back().substr(3);
  EXPECT_NE(std::find(opts.begin(), opts.end(), "--gpu-architecture=compute_" + newest), opts.end());
  const CompileResult r = compile_cuda(tiny("sm_990"));
  EXPECT_EQ(r.kind, ImageKind::Ptx);
  EXPECT_EQ(r.target, "compute_" + newest);
  EXPECT_NE(r.note.find("sm_990 is newer than NVRTC"), std::string::npos) << r.note;
  EXPECT_NE(r.image.find(".entry " + r.lowered_names.at("qf::kernels::bits<256>")), std::string::npos);
}

TEST(Nvrtc, CompileErrorCarriesLogOptionsAndDumpedSource) {
  TempDir dir;
  ScopedEnv env({{"QFORGE_DUMP_DIR", dir.path().c_str()}});
  CompileRequest r = tiny();
  r.source = "#include \"qforge/numerics.cuh\"\n__global__ void k() { undeclared_thing(); }\n";
  r.name_expressions = {};
  try {
    compile_cuda(r);
    FAIL() << "expected CompileError";
  } catch (const CompileError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("undeclared_thing"), std::string::npos) << msg;
    EXPECT_NE(msg.find("NVRTC 13.0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--fmad=false"), std::string::npos) << msg;
    EXPECT_NE(e.log().find("undeclared_thing"), std::string::npos);
    ASSERT_FALSE(e.source_path().empty());
    EXPECT_NE(msg.find(e.source_path()), std::string::npos);
    EXPECT_EQ(fs::path(e.source_path()).parent_path(), dir.path());
    EXPECT_EQ(fs::path(e.source_path()).filename().string().rfind("qforge-failed-", 0), 0u);
    EXPECT_EQ(slurp(e.source_path()), r.source);
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel cache
// ---------------------------------------------------------------------------------------------
TEST(KernelCache, KeyFollowsContent) {
  const CacheKey base = make_key(tiny());
  EXPECT_EQ(base.hex.size(), 64u);
  EXPECT_EQ(make_key(tiny()), base);
  CompileRequest r = tiny();
  r.source += "\n";
  EXPECT_NE(make_key(r), base);
  EXPECT_NE(make_key(tiny("sm_90")), base);
  EXPECT_NE(make_key(tiny("sm_100a")), base);
  r = tiny();
  r.options = {"-lineinfo"};
  EXPECT_NE(make_key(r), base);
  r = tiny();
  r.name_expressions.pop_back();
  EXPECT_NE(make_key(r), base);
}

// A toolkit, header or schema change must be a miss, never a stale hit: each is in the key.
TEST(KernelCache, KeyFollowsToolkitHeadersAndSchema) {
  const KeyContext now = KeyContext::current();
  EXPECT_EQ(now.schema, kCacheSchemaVersion);
  EXPECT_EQ(now.nvrtc_version, nvrtc_version());
  EXPECT_EQ(now.templates_hash, templates_hash());
  const CacheKey base = make_key(tiny(), now);
  EXPECT_EQ(make_key(tiny()), base);
  KeyContext other = now;
  other.nvrtc_version = "12.8";
  EXPECT_NE(make_key(tiny(), other), base);
  other = now;
  other.schema = kCacheSchemaVersion + 1;
  EXPECT_NE(make_key(tiny(), other), base);
  other = now;
  other.templates_hash = sha256_hex("other headers");
  EXPECT_NE(make_key(tiny(), other), base);
}

// End to end: an entry written by "NVRTC 12.8" (or schema 2) sits in the cache; this build
// computes another key, so it compiles instead of loading it. Both entries stay valid.
TEST(KernelCache, AnotherToolkitsOrSchemasEntryIsAMissNotAStaleHit) {
  TempDir dir;
  KeyContext old_toolkit = KeyContext::current(), new_schema = KeyContext::current();
  old_toolkit.nvrtc_version = "12.8";
  new_schema.schema = kCacheSchemaVersion + 1;
  for (const KeyContext& ctx : {old_toolkit, new_schema}) {
    CacheOptions o = at(dir.path());
    o.test.key_context = ctx;
    KernelCache cache(o);
    ASSERT_EQ(cache.get_or_compile(tiny()).how, CacheHow::Compiled);
  }
  KernelCache cache(at(dir.path()));
  EXPECT_EQ(cache.get_or_compile(tiny()).how, CacheHow::Compiled);
  EXPECT_EQ(cache.stats().disk_hits, 0u);
  EXPECT_EQ(cache.list().size(), 3u);
  EXPECT_TRUE(cache.verify().empty());
  KernelCache again(at(dir.path()));
  EXPECT_EQ(again.get_or_compile(tiny()).how, CacheHow::DiskHit);
  // qforge clear --stale: the other toolkit's entry can never be hit by this build and goes; ours
  // stays. (The other schema's is a test artifact: a real schema change moves the directory.)
  EvictPolicy stale;
  stale.stale = true;
  const EvictResult r = again.evict(stale);
  EXPECT_EQ(r.removed, 1u);
  EXPECT_EQ(r.kept, 2u);
  EXPECT_EQ(KernelCache(at(dir.path())).get_or_compile(tiny()).how, CacheHow::DiskHit);
}

// qforge clear's other rules: entries unused for longer than a duration, then the least
// recently used until the rest fit a size; a dry run only counts; a damaged entry is stale.
TEST(KernelCache, EvictsByLastUseAndSize) {
  TempDir dir;
  auto req = [](int i) {
    CompileRequest r = tiny();
    r.source += "\n// variant " + std::to_string(i) + "\n";
    return r;
  };
  std::vector<fs::path> entry;
  {
    KernelCache cache(at(dir.path()));
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(cache.get_or_compile(req(i)).how, CacheHow::Compiled);
      const std::string key = make_key(req(i)).hex;
      entry.push_back(dir.path() / "qforge-v1" / key.substr(0, 2) / key);
      ASSERT_TRUE(fs::is_directory(entry.back()));
    }
  }
  const int64_t now = int64_t(::time(nullptr));
  const int64_t ago[3] = {40 * 86400, 2 * 86400, 60};  // last used 40 days, 2 days, a minute ago
  uint64_t bytes[3] = {};
  for (int i = 0; i < 3; ++i) {
    const fs::path stamp = entry[size_t(i)] / "last_use";
    std::ofstream(stamp, std::ios::app).close();
    const timespec ts[2] = {{time_t(now - ago[i]), 0}, {time_t(now - ago[i]), 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, stamp.c_str(), ts, 0), 0);
    for (const auto& f : fs::directory_iterator(entry[size_t(i)])) bytes[i] += f.is_regular_file() ? f.file_size() : 0;
  }
  KernelCache cache(at(dir.path()));
  EvictPolicy month;
  month.unused_for_s = 30 * 86400;
  EvictResult r = cache.evict(month, /*dry_run=*/true);
  EXPECT_EQ(r.removed, 1u);
  EXPECT_EQ(r.removed_bytes, bytes[0]);
  EXPECT_EQ(r.kept, 2u);
  EXPECT_EQ(r.kept_bytes, bytes[1] + bytes[2]);
  EXPECT_TRUE(fs::exists(entry[0])) << "a dry run removed an entry";
  EXPECT_EQ(cache.evict(month).removed, 1u);
  EXPECT_FALSE(fs::exists(entry[0]));
  EvictPolicy fit;  // room for the newest only: the older one goes
  fit.max_bytes = bytes[2];
  r = cache.evict(fit);
  EXPECT_EQ(r.removed, 1u);
  EXPECT_EQ(r.kept_bytes, bytes[2]);
  EXPECT_FALSE(fs::exists(entry[1]));
  EXPECT_TRUE(fs::exists(entry[2]));
  EXPECT_TRUE(cache.verify().empty());
  EXPECT_TRUE(fs::is_empty(tmp_of(dir.path()))) << "the removed entries were left in tmp/";
  if (entry[0].parent_path() != entry[2].parent_path()) {
    EXPECT_FALSE(fs::exists(entry[0].parent_path())) << "an emptied prefix directory was kept";
  }
  EvictPolicy stale;
  stale.stale = true;
  EXPECT_EQ(cache.evict(stale).removed, 0u);
  // Links are not followed: a key-named link in a prefix directory is not an entry (its target
  // stays), and an entry holding a link is stale (damaged), its target untouched.
  const fs::path outside = dir.path() / "outside";  // beside the cache's qforge-v1, not in it
  fs::create_directories(outside / "victim");
  std::ofstream(outside / "victim" / "keep").put('x');
  const fs::path planted = entry[2].parent_path() / std::string(64, 'f');
  fs::create_directory_symlink(outside / "victim", planted);
  fs::remove(entry[2] / "last_use");
  fs::create_symlink(outside / "victim" / "keep", entry[2] / "last_use");
  EvictPolicy everything;
  everything.max_bytes = 0;
  everything.stale = true;
  r = cache.evict(everything);
  EXPECT_EQ(r.removed, 1u);
  EXPECT_EQ(r.kept, 0u);
  EXPECT_FALSE(fs::exists(entry[2]));
  EXPECT_TRUE(fs::exists(outside / "victim" / "keep"));
  EXPECT_TRUE(fs::is_symlink(planted));
  fs::remove(planted);
  EXPECT_EQ(KernelCache(at(dir.path())).get_or_compile(req(2)).how, CacheHow::Compiled);
  fs::resize_file(entry[2] / "image.bin", 10);
  EXPECT_EQ(cache.evict(stale).removed, 1u);
  EXPECT_FALSE(fs::exists(entry[2]));
}

// list, verify, clear and evict walk the entries one way (for_each_entry): a linked prefix, a
// key-named directory under another key's prefix and a key-named link are strays, which verify
// names, list and evict skip, and clear leaves (with whatever a link points at).
TEST(KernelCache, EveryWalkSkipsStraysAndFollowsNoLinks) {
  TempDir dir;
  const fs::path base = dir.path() / "qforge-v1";
  {
    KernelCache cache(at(dir.path()));
    ASSERT_EQ(cache.get_or_compile(tiny()).how, CacheHow::Compiled);
  }
  const std::string key = make_key(tiny()).hex;
  const std::string other_prefix = key.substr(0, 2) == "ab" ? "cd" : "ab";
  const std::string linked_prefix = key.substr(0, 2) == "ee" ? "dd" : "ee";
  const fs::path outside = dir.path() / "outside";  // beside qforge-v1, not in it
  fs::create_directories(outside / "victim");
  std::ofstream(outside / "victim" / "keep").put('x');
  fs::create_directory_symlink(outside, base / linked_prefix);              // a linked prefix
  fs::create_directories(base / other_prefix / key);                        // misplaced: not its prefix
  fs::create_directory_symlink(outside / "victim", base / key.substr(0, 2) / std::string(64, 'f'));
  KernelCache cache(at(dir.path()));
  const auto listing = cache.list();
  ASSERT_EQ(listing.size(), 1u);
  EXPECT_EQ(listing[0].key, key);
  const auto problems = cache.verify();
  std::set<std::string> named;
  for (const auto& pr : problems) named.insert(pr.path);
  const std::set<std::string> strays = {(base / linked_prefix).string(), (base / other_prefix / key).string(),
                                        (base / key.substr(0, 2) / std::string(64, 'f')).string()};
  EXPECT_EQ(named, strays) << "verify names the strays, and only them";
  EvictPolicy everything;
  everything.max_bytes = 0;
  EXPECT_EQ(cache.evict(everything, /*dry_run=*/true).removed, 1u) << "evict judged a stray";
  EXPECT_EQ(cache.clear(), 1u);
  EXPECT_FALSE(fs::exists(base / key.substr(0, 2) / key));
  EXPECT_TRUE(fs::is_symlink(base / linked_prefix));
  EXPECT_TRUE(fs::is_directory(base / other_prefix / key));
  EXPECT_TRUE(fs::exists(outside / "victim" / "keep")) << "a link was followed";
}

TEST(KernelCache, MemoryHitThenDiskHitInANewCache) {
  TempDir dir;
  const nlohmann::json md = {{"recipe", "nvfp4"}, {"role", "weight"}, {"dtype", "bf16"}};
  {
    KernelCache cache(at(dir.path()));
    ASSERT_TRUE(cache.disk_writable());
    auto a = cache.get_or_compile(tiny(), md);
    EXPECT_EQ(a.how, CacheHow::Compiled);
    auto b = cache.get_or_compile(tiny(), md);
    EXPECT_EQ(b.how, CacheHow::MemoryHit);
    EXPECT_EQ(a.entry, b.entry);
    EXPECT_EQ(cache.stats().compiles, 1u);
    EXPECT_EQ(cache.stats().memory_hits, 1u);
  }
  const std::string key = make_key(tiny()).hex;
  const fs::path entry = dir.path() / "qforge-v1" / key.substr(0, 2) / key;
  for (const char* f : {"image.bin", "meta.json", "source.cu", "last_use"}) EXPECT_TRUE(fs::exists(entry / f)) << f;
  EXPECT_TRUE(fs::is_empty(dir.path() / "qforge-v1" / "tmp"));

  KernelCache fresh(at(dir.path()));
  auto c = fresh.get_or_compile(tiny());
  EXPECT_EQ(c.how, CacheHow::DiskHit);
  EXPECT_EQ(fresh.stats().compiles, 0u);
  EXPECT_EQ(c.entry->metadata, md);
  EXPECT_EQ(c.entry->kind, ImageKind::Cubin);
  EXPECT_EQ(c.entry->arch, "sm_90a");
  EXPECT_EQ(c.entry->lowered("plain"), "plain");
  EXPECT_EQ(c.entry->lowered("qf::kernels::bits<256>").rfind("_Z", 0), 0u);
  EXPECT_THROW(c.entry->lowered("nope"), InternalError);

  const auto listing = fresh.list();
  ASSERT_EQ(listing.size(), 1u);
  EXPECT_EQ(listing[0].key, key);
  EXPECT_EQ(listing[0].kind, "cubin");
  EXPECT_EQ(listing[0].recipe, "nvfp4");
  EXPECT_EQ(listing[0].role, "weight");
  EXPECT_EQ(listing[0].size, c.entry->image.size());
  EXPECT_TRUE(fresh.verify().empty());

  // qforge tune's records go with the kernels; files that are not ours stay.
  const fs::path tuning = dir.path() / "qforge-v1" / "tuning";
  fs::create_directories(tuning);
  std::ofstream(tuning / (key + ".json")) << "{}";
  std::ofstream(tuning / "notes.txt") << "mine";
  EXPECT_TRUE(fresh.verify().empty());  // tuning/ is not a kernel prefix: nothing to report
  EXPECT_EQ(fresh.list().size(), 1u);
  // A killed `qforge tune`'s temporary record goes once it is ten minutes old; a live one stays.
  const fs::path old_tmp = tuning / (key + ".json.tmp.4242"), new_tmp = tuning / (key + ".json.tmp.4243");
  std::ofstream(old_tmp) << "{";
  std::ofstream(new_tmp) << "{";
  fs::last_write_time(old_tmp, fs::file_time_type::clock::now() - std::chrono::minutes(11));
  EXPECT_EQ(fresh.clear(), 1u);
  EXPECT_TRUE(fresh.list().empty());
  EXPECT_TRUE(fs::exists(dir.path() / "qforge-v1"));
  EXPECT_FALSE(fs::exists(tuning / (key + ".json")));
  EXPECT_TRUE(fs::exists(tuning / "notes.txt"));
  EXPECT_FALSE(fs::exists(old_tmp));
  EXPECT_TRUE(fs::exists(new_tmp));
}

// A damaged meta.json whose fields have the wrong types lists as unknown ("?"): list and
// verify report it instead of failing.
TEST(KernelCache, ListingSurvivesMetaFieldsOfTheWrongType) {
  TempDir dir;
  {
    KernelCache cache(at(dir.path()));
    ASSERT_EQ(cache.get_or_compile(tiny()).how, CacheHow::Compiled);
  }
  const std::string key = make_key(tiny()).hex;
  const fs::path meta = dir.path() / "qforge-v1" / key.substr(0, 2) / key / "meta.json";
  nlohmann::json m = nlohmann::json::parse(std::ifstream(meta));
  m["kind"] = 5, m["arch"] = nullptr, m["image_size"] = "47296", m["created_unix"] = "yesterday";
  std::ofstream(meta) << m.dump();
  KernelCache cache(at(dir.path()));
  std::vector<CacheListing> listing;
  ASSERT_NO_THROW(listing = cache.list());
  ASSERT_EQ(listing.size(), 1u);
  EXPECT_EQ(listing[0].kind, "?");
  EXPECT_EQ(listing[0].arch, "?");
  EXPECT_EQ(listing[0].size, 0u);
  EXPECT_NO_THROW((void)cache.verify());
}

// QFORGE_* switches take 0 or 1 (a typo is named, not read as "off"); cache roots are made
// absolute (a relative one would follow the working directory); a read-only root that is not a
// directory is kept (it may be mounted later) and the writable root is not listed twice.
TEST(CacheOptions, SwitchesAndRootsFromTheEnvironment) {
  TempDir dir;
  ::setenv("QFORGE_CACHE_DISABLE", "true", 1);
  try {
    (void)CacheOptions::from_env();
    ADD_FAILURE() << "QFORGE_CACHE_DISABLE=true was accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(e.where(), "QFORGE_CACHE_DISABLE");
    EXPECT_NE(std::string(e.what()).find("expected 0 or 1 (or unset), got \"true\""), std::string::npos) << e.what();
  }
  ::setenv("QFORGE_CACHE_DISABLE", "1", 1);
  EXPECT_TRUE(CacheOptions::from_env().disabled);
  ::setenv("QFORGE_CACHE_DISABLE", "", 1);
  EXPECT_FALSE(CacheOptions::from_env().disabled);
  ::unsetenv("QFORGE_CACHE_DISABLE");
  ::setenv("QFORGE_CACHE_DIR", "relative/cache", 1);
  ::setenv("QFORGE_CACHE_READONLY_DIRS", ("ro:" + dir.path().string()).c_str(), 1);
  const CacheOptions o = CacheOptions::from_env();
  ::unsetenv("QFORGE_CACHE_DIR");
  ::unsetenv("QFORGE_CACHE_READONLY_DIRS");
  ASSERT_TRUE(o.writable_root.has_value());
  EXPECT_TRUE(o.writable_root->is_absolute()) << *o.writable_root;
  ASSERT_EQ(o.readonly_roots.size(), 2u);
  EXPECT_EQ(o.readonly_roots[0], fs::current_path() / "ro");
  CacheOptions same = at(dir.path());
  same.readonly_roots = {dir.path(), dir.path() / "missing"};
  const KernelCache cache(same);
  ASSERT_EQ(cache.readonly_roots().size(), 1u);
  EXPECT_EQ(cache.readonly_roots()[0], dir.path() / "missing");
}

void edit_meta(const fs::path& entry, const std::function<void(nlohmann::json&)>& f) {
  nlohmann::json m = nlohmann::json::parse(slurp(entry / "meta.json"));
  f(m);
  std::ofstream(entry / "meta.json", std::ios::trunc) << m.dump(2);
}

// Corruption: each case damages the stored entry, then a new cache must notice, report it via
// verify(), recompile and republish a good entry.
TEST(KernelCache, CorruptEntriesAreDetectedAndRecompiled) {
  TempDir dir;
  const std::string key = make_key(tiny()).hex;
  const fs::path entry = dir.path() / "qforge-v1" / key.substr(0, 2) / key;
  {
    KernelCache cache(at(dir.path()));
    ASSERT_EQ(cache.get_or_compile(tiny()).how, CacheHow::Compiled);
  }
  const std::string good_image = slurp(entry / "image.bin");
  struct Damage {
    const char* name;
    std::function<void()> apply;
  };
  const Damage damages[] = {
      {"truncated image", [&] { fs::resize_file(entry / "image.bin", good_image.size() / 2); }},
      {"flipped byte",
       [&] {
         std::string img = good_image;
         img[img.size() / 2] ^= 0x01;
         std::ofstream(entry / "image.bin", std::ios::binary | std::ios::trunc) << img;
       }},
      {"missing meta.json", [&] { fs::remove(entry / "meta.json"); }},
      {"missing image.bin", [&] { fs::remove(entry / "image.bin"); }},
      {"missing source.cu", [&] { fs::remove(entry / "source.cu"); }},
      {"empty image.bin", [&] { fs::resize_file(entry / "image.bin", 0); }},
      {"meta.json cut short", [&] { fs::resize_file(entry / "meta.json", fs::file_size(entry / "meta.json") / 2); }},
      {"meta.json of another schema",
       [&] {
         std::string m = slurp(entry / "meta.json");
         const std::string from = "\"schema\": " + std::to_string(kCacheSchemaVersion);
         ASSERT_NE(m.find(from), std::string::npos) << m;
         m.replace(m.find(from), from.size(), "\"schema\": " + std::to_string(kCacheSchemaVersion + 1));
         std::ofstream(entry / "meta.json", std::ios::trunc) << m;
       }},
      {"lowered_names emptied", [&] { edit_meta(entry, [](nlohmann::json& m) { m["lowered_names"] = nlohmann::json::object(); }); }},
      {"a lowered name that is not in the image",
       [&] { edit_meta(entry, [](nlohmann::json& m) { m["lowered_names"]["plain"] = "plain_but_not_in_the_image"; }); }},
      {"empty entry directory",
       [&] {
         for (const char* f : {"image.bin", "meta.json", "source.cu", "last_use"}) fs::remove(entry / f);
       }},
  };
  for (const auto& d : damages) {
    SCOPED_TRACE(d.name);
    d.apply();
    KernelCache cache(at(dir.path()));
    EXPECT_EQ(cache.verify().size(), 1u);
    auto r = cache.get_or_compile(tiny());
    EXPECT_EQ(r.how, CacheHow::Compiled);
    EXPECT_EQ(cache.stats().corrupt, 1u);
    EXPECT_EQ(r.entry->image, good_image);
    EXPECT_TRUE(cache.verify().empty());
    EXPECT_EQ(slurp(entry / "image.bin"), good_image);
    EXPECT_TRUE(fs::is_empty(tmp_of(dir.path()))) << "the damaged copy was not removed";
  }
  // A name expression the request does not make (verify cannot tell, having no request): the
  // decisive look sees it and recompiles.
  edit_meta(entry, [](nlohmann::json& m) {
    m["lowered_names"]["qf::kernels::bits<512>"] = m["lowered_names"]["qf::kernels::bits<256>"];
    m["lowered_names"].erase("qf::kernels::bits<256>");
  });
  {
    KernelCache cache(at(dir.path()));
    EXPECT_TRUE(cache.verify().empty());
    auto r = cache.get_or_compile(tiny());
    EXPECT_EQ(r.how, CacheHow::Compiled);
    EXPECT_EQ(cache.stats().corrupt, 1u);
    EXPECT_EQ(r.entry->lowered_names.count("qf::kernels::bits<256>"), 1u);
  }
  // last_use is only a stamp: without it the entry is still a hit, and the stamp comes back.
  fs::remove(entry / "last_use");
  KernelCache cache(at(dir.path()));
  EXPECT_TRUE(cache.verify().empty());
  EXPECT_EQ(cache.get_or_compile(tiny()).how, CacheHow::DiskHit);
  EXPECT_TRUE(fs::exists(entry / "last_use"));
}

TEST(KernelCache, ConcurrentRequestsForOneKeyCompileOnce) {
  TempDir dir;
  CacheOptions o = at(dir.path());
  o.test.compile_log = dir.path() / "compiles.log";
  KernelCache cache(o);
  CompileRequest req = tiny("sm_100a");
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<const CacheEntry>> got(8);
  for (int i = 0; i < 8; ++i) threads.emplace_back([&, i] { got[i] = cache.get_or_compile(req).entry; });
  for (auto& t : threads) t.join();
  EXPECT_EQ(cache.stats().compiles, 1u);
  EXPECT_EQ(cache.stats().memory_hits, 7u);
  for (const auto& e : got) EXPECT_EQ(e, got[0]);
  EXPECT_EQ(slurp(dir.path() / "compiles.log"), make_key(req).hex + " " + std::to_string(::getpid()) + "\n");
}

// Two caches on one root stand for two processes (flock conflicts between open files, not only
// between processes): while one compiles and publishes a key, the other waits for its lock and
// then loads the published entry instead of compiling.
TEST(KernelCache, OneCompilesAKeyWhileAnotherWaitsThenHits) {
  TempDir dir;
  const CompileRequest req = tiny("sm_100a");
  CacheOptions slow = at(dir.path());
  slow.test.pause_at = "publish";  // hold the key lock a while after compiling
  slow.test.pause_seconds = 1.0;
  KernelCache first(slow), second(at(dir.path()));
  ::testing::internal::CaptureStderr();
  std::thread t([&] { EXPECT_EQ(first.get_or_compile(req).how, CacheHow::Compiled); });
  const fs::path lock = tmp_of(dir.path()) / (make_key(req).hex + ".lock");
  for (int i = 0; i < 2000 && !fs::exists(lock); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(fs::exists(lock)) << "the first cache never took the key lock";
  const auto r = second.get_or_compile(req);
  t.join();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("paused at publish"), std::string::npos) << err;
  EXPECT_EQ(r.how, CacheHow::DiskHit);
  EXPECT_EQ(second.stats().compiles, 0u);
  EXPECT_EQ(second.stats().lock_waits, 1u);
  EXPECT_EQ(first.stats().compiles, 1u);
  EXPECT_FALSE(fs::exists(lock)) << "the lock file outlived its holder";
  EXPECT_TRUE(fs::is_empty(tmp_of(dir.path())));
}

// A child forked while a key lock is held shares the lock's open file (flock locks belong to the
// open file, not the process). Releasing must still free the lock at once, not when the child
// exits (a training process forking data-loader workers while a kernel compiles).
TEST(KernelCache, AForkedChildDoesNotKeepAKeyLock) {
  TempDir dir;
  const CompileRequest req = tiny("sm_100a");
  CacheOptions slow = at(dir.path());
  slow.test.pause_at = "publish";
  slow.test.pause_seconds = 0.5;
  CacheOptions patient = at(dir.path());
  patient.lock_timeout = std::chrono::seconds(4);
  KernelCache first(slow), second(patient);
  ::testing::internal::CaptureStderr();
  std::thread t([&] { EXPECT_EQ(first.get_or_compile(req).how, CacheHow::Compiled); });
  const fs::path lock = tmp_of(dir.path()) / (make_key(req).hex + ".lock");
  for (int i = 0; i < 2000 && !fs::exists(lock); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(fs::exists(lock));
  const pid_t child = ::fork();
  if (child == 0) {  // holds copies of every open file, the lock's included, for 6 s
    ::sleep(6);
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = second.get_or_compile(req);
  const auto waited = std::chrono::steady_clock::now() - t0;
  t.join();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.how, CacheHow::DiskHit);
  EXPECT_EQ(second.stats().lock_timeouts, 0u);
  EXPECT_LT(waited, std::chrono::seconds(3));
}

// A holder that never finishes (stopped, or on a hung filesystem) delays others by
// lock_timeout at most; then they compile the key themselves, with one warning.
TEST(KernelCache, LockHeldTooLongIsCompiledAnyway) {
  TempDir dir;
  CacheOptions o = at(dir.path());
  o.lock_timeout = std::chrono::milliseconds(300);
  KernelCache cache(o);
  const fs::path lock = tmp_of(dir.path()) / (make_key(tiny()).hex + ".lock");
  {
    HeldLock stuck(lock);
    ::testing::internal::CaptureStderr();
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = cache.get_or_compile(tiny());
    const auto waited = std::chrono::steady_clock::now() - t0;
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(r.how, CacheHow::Compiled);
    EXPECT_TRUE(is_elf(r.entry->image));
    EXPECT_GE(waited, std::chrono::milliseconds(300));
    EXPECT_EQ(cache.stats().lock_timeouts, 1u);
    EXPECT_EQ(count(err, "warning"), 1u) << err;
    EXPECT_NE(err.find("waited 0.3 s for another process to compile kernel " + make_key(tiny()).hex.substr(0, 16)),
              std::string::npos) << err;
  }
  fs::remove(lock);
  EXPECT_TRUE(cache.verify().empty());
  EXPECT_EQ(KernelCache(at(dir.path())).get_or_compile(tiny()).how, CacheHow::DiskHit);
}

// Without flock (some network filesystems): no waiting, every process compiles, publishing
// stays atomic; one warning says so.
TEST(KernelCache, NoFlockStillCompilesAndPublishes) {
  TempDir dir;
  CacheOptions o = at(dir.path());
  o.test.fault = ENOLCK;
  KernelCache cache(o);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cache.get_or_compile(tiny()).how, CacheHow::Compiled);
  EXPECT_EQ(cache.get_or_compile(tiny("sm_100a")).how, CacheHow::Compiled);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(err, "warning"), 1u) << err;
  EXPECT_NE(err.find("No locks available"), std::string::npos) << err;
  EXPECT_NE(err.find("may compile the same kernel more than once"), std::string::npos) << err;
  EXPECT_TRUE(cache.disk_writable());
  EXPECT_TRUE(cache.verify().empty());
  EXPECT_EQ(cache.list().size(), 2u);
  EXPECT_TRUE(fs::is_empty(tmp_of(dir.path())));
}

// What a killed writer leaves in tmp/ (its temp dir, its lock file) is removed by the next
// writer of that key and by clear(); what a live writer holds (flock) is left alone, and
// neither is ever taken for an entry.
TEST(KernelCache, AbandonedTempDirsAndLockFilesAreRemoved) {
  TempDir dir;
  KernelCache cache(at(dir.path()));
  const std::string key = make_key(tiny()).hex, other = make_key(tiny("sm_100a")).hex;
  const fs::path tmp = tmp_of(dir.path());
  const fs::path dead = tmp / (key + ".999999.00000000deadbeef.0"), alive = tmp / (key + ".888888.00000000000a11fe.0");
  const fs::path dead_lock = tmp / (other + ".lock"), staging = tmp / ("." + other + ".777777.0000000000000000.0");
  for (const auto& d : {dead, alive, staging}) {
    fs::create_directories(d);
    std::ofstream(d / "image.bin") << "half a cubin";
  }
  std::ofstream(dead_lock) << "";
  EXPECT_TRUE(cache.verify().empty());
  EXPECT_TRUE(cache.list().empty());
  {
    HeldLock writer(alive);
    EXPECT_EQ(cache.get_or_compile(tiny()).how, CacheHow::Compiled);
    EXPECT_FALSE(fs::exists(dead)) << "a killed writer's temp dir of this key survived its publish";
    EXPECT_TRUE(fs::exists(alive)) << "a live writer's temp dir was removed";
    EXPECT_TRUE(fs::exists(dead_lock)) << "another key's leftovers are not this publish's business";
    EXPECT_EQ(cache.clear(), 1u);
    EXPECT_TRUE(fs::exists(alive));
    EXPECT_FALSE(fs::exists(dead_lock));
    EXPECT_TRUE(fs::exists(staging)) << "a fresh staging dir may belong to a writer about to lock it";
  }
  cache.clear();
  EXPECT_FALSE(fs::exists(alive));
  std::vector<std::string> left;
  for (const auto& d : fs::directory_iterator(tmp)) left.push_back(d.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{staging.filename().string()});
}

TEST(KernelCache, UnwritableRootFallsBackToMemoryWithOneWarning) {
  TempDir dir;
  // A path below a regular file fails with ENOTDIR even for root (who ignores permissions).
  std::ofstream(dir.path() / "file.txt") << "x";
  const fs::path root = dir.path() / "file.txt" / "sub";
  ::testing::internal::CaptureStderr();
  KernelCache a(at(root));
  KernelCache b(at(root));  // same directory again: no second warning
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(a.disk_writable());
  EXPECT_NE(err.find(root.string()), std::string::npos) << err;
  EXPECT_NE(err.find("Not a directory"), std::string::npos) << err;
  EXPECT_EQ(err.find("warning"), err.rfind("warning")) << "warned twice:\n" << err;
  // Still works, from memory.
  CompileRequest req = tiny();
  EXPECT_EQ(a.get_or_compile(req).how, CacheHow::Compiled);
  EXPECT_EQ(a.get_or_compile(req).how, CacheHow::MemoryHit);

  // chmod 0500: only meaningful when not root.
  if (::geteuid() != 0) {
    const fs::path ro = dir.path() / "ro";
    fs::create_directories(ro);
    ::chmod(ro.c_str(), 0500);
    ::testing::internal::CaptureStderr();
    KernelCache c(at(ro));
    const std::string err2 = ::testing::internal::GetCapturedStderr();
    EXPECT_FALSE(c.disk_writable());
    EXPECT_NE(err2.find("Permission denied"), std::string::npos) << err2;
  }
}

// A full disk (here: every write fails with ENOSPC): the first store fails, one warning, the
// disk is not tried again, every kernel still compiles and is served from memory.
TEST(KernelCache, FullDiskFallsBackToMemoryWithOneWarning) {
  TempDir dir;
  CacheOptions o = at(dir.path());
  o.test.fault = ENOSPC;
  KernelCache cache(o);
  EXPECT_TRUE(cache.disk_writable()) << "a full disk still takes a mkdir";
  ::testing::internal::CaptureStderr();
  const auto a = cache.get_or_compile(tiny());
  const auto b = cache.get_or_compile(tiny("sm_100a"));
  const auto c = cache.get_or_compile(tiny());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(a.how, CacheHow::Compiled);
  EXPECT_EQ(b.how, CacheHow::Compiled);
  EXPECT_EQ(c.how, CacheHow::MemoryHit);
  for (const auto& r : {a, b}) {
    EXPECT_TRUE(is_elf(r.entry->image));
    EXPECT_EQ(r.entry->lowered("plain"), "plain");
  }
  EXPECT_FALSE(cache.disk_writable());
  EXPECT_EQ(cache.stats().store_failures, 1u);
  EXPECT_EQ(count(err, "warning"), 1u) << err;
  EXPECT_NE(err.find("kernel cache directory " + dir.path().string() + " is not usable"), std::string::npos) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_TRUE(fs::is_empty(tmp_of(dir.path()))) << "a failed store left its temp dir";
  EXPECT_TRUE(cache.list().empty());
}

// A read-only filesystem (root ignores chmod, so: EROFS from the seam; tests/cache/ uses a real
// read-only mount): one warning at start-up, entries already there are still loaded, new
// kernels compile into memory.
TEST(KernelCache, ReadOnlyFilesystemServesWhatIsThereAndCompilesTheRest) {
  TempDir dir;
  ASSERT_EQ(KernelCache(at(dir.path())).get_or_compile(tiny()).how, CacheHow::Compiled);
  CacheOptions o = at(dir.path());
  o.test.fault = EROFS;
  ::testing::internal::CaptureStderr();
  KernelCache cache(o);
  const auto hit = cache.get_or_compile(tiny());
  const auto compiled = cache.get_or_compile(tiny("sm_100a"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(cache.disk_writable());
  EXPECT_EQ(hit.how, CacheHow::DiskHit);
  EXPECT_EQ(compiled.how, CacheHow::Compiled);
  EXPECT_TRUE(is_elf(compiled.entry->image));
  EXPECT_EQ(count(err, "warning"), 1u) << err;
  EXPECT_NE(err.find("Read-only file system"), std::string::npos) << err;
  EXPECT_EQ(cache.list().size(), 1u);
}

TEST(KernelCache, TestHooksFromEnvironment) {
  {
    ScopedEnv env({{"QFORGE_TEST_FAULT", "ENOSPC"}, {"QFORGE_TEST_PAUSE", "write"},
                   {"QFORGE_TEST_PAUSE_SECONDS", "2.5"}, {"QFORGE_TEST_COMPILE_LOG", "/tmp/c.log"}});
    const CacheOptions o = CacheOptions::from_env();
    EXPECT_EQ(o.test.fault, ENOSPC);
    EXPECT_EQ(o.test.pause_at, "write");
    EXPECT_EQ(o.test.pause_seconds, 2.5);
    EXPECT_EQ(o.test.compile_log, fs::path("/tmp/c.log"));
  }
  {
    ScopedEnv env({{"QFORGE_TEST_FAULT", nullptr}, {"QFORGE_TEST_PAUSE", nullptr}, {"QFORGE_TEST_COMPILE_LOG", nullptr}});
    const CacheOptions o = CacheOptions::from_env();
    EXPECT_EQ(o.test.fault, 0);
    EXPECT_TRUE(o.test.pause_at.empty());
    EXPECT_TRUE(o.test.compile_log.empty());
  }
  for (auto [k, v] : {std::pair{"QFORGE_TEST_FAULT", "ENOMEM"}, std::pair{"QFORGE_TEST_PAUSE", "never"},
                      std::pair{"QFORGE_TEST_PAUSE_SECONDS", "soon"}}) {
    ScopedEnv env({{k, v}});
    try {
      CacheOptions::from_env();
      ADD_FAILURE() << k << "=" << v << " accepted";
    } catch (const UserError& e) {
      EXPECT_EQ(e.where(), k);
      EXPECT_NE(std::string(e.what()).find(v), std::string::npos) << e.what();
    }
  }
}

TEST(KernelCache, ReadOnlyRootIsLookedUpAfterTheWritableOne) {
  TempDir dir;
  const fs::path baked = dir.path() / "baked", mine = dir.path() / "mine";
  {
    KernelCache prewarm(at(baked));
    ASSERT_EQ(prewarm.get_or_compile(tiny(), {{"recipe", "mxfp8"}}).how, CacheHow::Compiled);
  }
  CacheOptions o = at(mine);
  o.readonly_roots = {baked};
  KernelCache cache(o);
  auto r = cache.get_or_compile(tiny());
  EXPECT_EQ(r.how, CacheHow::DiskHit);
  EXPECT_EQ(cache.stats().compiles, 0u);
  const auto l = cache.list();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_TRUE(l[0].readonly);
  EXPECT_EQ(l[0].recipe, "mxfp8");
  EXPECT_EQ(cache.clear(), 0u);  // clear never touches read-only roots
  EXPECT_EQ(cache.list().size(), 1u);
}

// A shipped root (a release's prewarmed kernels) serves a process whose NVRTC is a newer minor
// version of the one that built it, and only that: as a plain read-only root it is a miss
// (guarantee 1), and an NVRTC older than the builder's or of another major, other headers or a
// damaged image compile instead.
TEST(KernelCache, ShippedRootServesAnOlderMinorNvrtcsCubins) {
  TempDir dir;
  const fs::path shipped = dir.path() / "shipped";
  KeyContext builder = KeyContext::current();
  builder.nvrtc_version = "13.1";
  std::string image;
  {
    CacheOptions o = at(shipped);
    o.test.key_context = builder;
    KernelCache prewarm(o);
    auto r = prewarm.get_or_compile(tiny(), {{"recipe", "mxfp8"}});
    ASSERT_EQ(r.how, CacheHow::Compiled);
    image = r.entry->image;
  }
  auto reader = [&](const std::string& nvrtc, bool as_shipped, const std::string& templates_hash = "") {
    CacheOptions o = at(dir.path() / ("mine-" + nvrtc));
    (as_shipped ? o.shipped_roots : o.readonly_roots) = {shipped};
    KeyContext ctx = KeyContext::current();
    ctx.nvrtc_version = nvrtc;
    if (!templates_hash.empty()) ctx.templates_hash = templates_hash;
    o.test.key_context = ctx;
    return std::make_unique<KernelCache>(o);
  };
  {
    auto cache = reader("13.3", true);
    const auto r = cache->get_or_compile(tiny());
    EXPECT_EQ(r.how, CacheHow::DiskHit);
    EXPECT_EQ(r.entry->image, image);
    EXPECT_EQ(r.entry->nvrtc_version, "13.1");
    EXPECT_EQ(cache->stats().compiles, 0u);
    EXPECT_EQ(cache->stats().shipped_hits, 1u);
    EXPECT_EQ(cache->get_or_compile(tiny()).how, CacheHow::MemoryHit);
    ASSERT_EQ(cache->list().size(), 1u);  // listed (and verified) as a read-only root
    EXPECT_TRUE(cache->list()[0].readonly);
    EXPECT_TRUE(cache->verify().empty());
    // The other kernel of the source is not in the entry: a miss, compiled into the writable root.
    CompileRequest other = tiny();
    other.name_expressions = {"plain"};
    EXPECT_EQ(cache->get_or_compile(other).how, CacheHow::Compiled);
  }
  EXPECT_EQ(reader("13.1", false)->get_or_compile(tiny()).how, CacheHow::DiskHit);  // its own NVRTC: a plain hit
  EXPECT_EQ(reader("13.3", false)->get_or_compile(tiny()).how, CacheHow::Compiled);  // read-only, not shipped
  EXPECT_EQ(reader("13.0", true)->get_or_compile(tiny()).how, CacheHow::Compiled);   // built by a newer NVRTC
  EXPECT_EQ(reader("14.2", true)->get_or_compile(tiny()).how, CacheHow::Compiled);   // another major
  EXPECT_EQ(reader("13.3", true, "other headers")->get_or_compile(tiny()).how, CacheHow::Compiled);
  EXPECT_EQ(reader("13.3", true)->get_or_compile(tiny("sm_100a")).how, CacheHow::Compiled);  // another arch
  // A damaged image is a miss and stays where it is (shipped roots are read-only).
  fs::path image_path;
  for (const auto& f : fs::recursive_directory_iterator(shipped / "qforge-v1"))
    if (f.path().filename() == "image.bin") image_path = f.path();
  ASSERT_FALSE(image_path.empty());
  {
    std::fstream f(image_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put(char(image[100] ^ 0x01));
  }
  auto damaged = reader("13.4", true);
  EXPECT_EQ(damaged->get_or_compile(tiny()).how, CacheHow::Compiled);
  EXPECT_EQ(damaged->stats().shipped_hits, 0u);
  EXPECT_EQ(damaged->verify().size(), 1u);
  EXPECT_TRUE(fs::exists(image_path));
}

TEST(KernelCache, DisabledIsMemoryOnlyAndSilent) {
  const CacheOptions o = [] {
    ScopedEnv env({{"QFORGE_CACHE_DISABLE", "1"}});
    return CacheOptions::from_env();
  }();
  EXPECT_TRUE(o.disabled);
  ::testing::internal::CaptureStderr();
  KernelCache cache(o);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_FALSE(cache.disk_writable());
  EXPECT_TRUE(cache.list().empty());
}

TEST(KernelCache, RootsFromEnvironment) {
  {
    ScopedEnv env({{"QFORGE_CACHE_DIR", "/some/where"}, {"QFORGE_CACHE_READONLY_DIRS", "/a::/b"},
                   {"QFORGE_CACHE_SHIPPED_DIRS", "/s:"}});
    const CacheOptions o = CacheOptions::from_env();
    EXPECT_EQ(o.writable_root, fs::path("/some/where"));
    EXPECT_EQ(o.readonly_roots, (std::vector<fs::path>{"/a", "/b"}));
    EXPECT_EQ(o.shipped_roots, (std::vector<fs::path>{"/s"}));
  }
  {
    ScopedEnv env({{"QFORGE_CACHE_DIR", nullptr}, {"XDG_CACHE_HOME", "/xdg"}, {"HOME", "/home/u"}});
    EXPECT_EQ(CacheOptions::from_env().writable_root, fs::path("/xdg/qforge"));
  }
  {
    ScopedEnv env({{"QFORGE_CACHE_DIR", nullptr}, {"XDG_CACHE_HOME", nullptr}, {"HOME", "/home/u"}});
    EXPECT_EQ(CacheOptions::from_env().writable_root, fs::path("/home/u/.cache/qforge"));
  }
}

// An installed library or CLI finds the installed shipped kernels beside its prefix's LIBDIR or
// BINDIR; unset, QFORGE_CACHE_SHIPPED_DIRS defaults to them, and set and empty means none.
TEST(KernelCache, InstalledShippedRootIsFoundFromTheLoadedFile) {
  const fs::path image = loaded_image_path();
  ASSERT_FALSE(image.empty());
  EXPECT_TRUE(image.is_absolute()) << image;
  EXPECT_TRUE(fs::is_regular_file(image)) << image;  // this test program (the runtime is linked in)
  EXPECT_TRUE(installed_kernel_roots(fs::path()).empty());

  TempDir dir;
  const std::vector<std::string> rel = installed_kernels_relative();
  ASSERT_EQ(rel.size(), 2u);
  // A prefix laid out as the install lays it out: the image in LIBDIR (or BINDIR), the kernels
  // in DATADIR/qforge/kernels. Without the directory, no root.
  for (const std::string& r : rel) {
    const fs::path prefix = dir.path() / ("p" + std::to_string(&r - rel.data()));
    const fs::path fake_image = prefix / "x" / "y" / "z" / "libqforge.so";
    const fs::path kernels = (fake_image.parent_path() / r).lexically_normal();
    EXPECT_TRUE(installed_kernel_roots(fake_image).empty()) << r;
    fs::create_directories(kernels);
    const std::vector<fs::path> found = installed_kernel_roots(fake_image);
    EXPECT_NE(std::find(found.begin(), found.end(), kernels), found.end()) << r;
  }
  // The environment: set and empty turns the default off; set names the roots; unset takes the
  // installed root of this test program's own prefix (none in a build tree).
  {
    ScopedEnv env({{"QFORGE_CACHE_SHIPPED_DIRS", ""}});
    EXPECT_TRUE(CacheOptions::from_env().shipped_roots.empty());
  }
  {
    ScopedEnv env({{"QFORGE_CACHE_SHIPPED_DIRS", nullptr}});
    EXPECT_EQ(CacheOptions::from_env().shipped_roots, installed_kernel_roots(image));
  }
}

}  // namespace
}  // namespace qf::rt
