// The JIT runtime below the driver: SHA-256, the NVRTC front end and the kernel cache.
// No GPU needed: NVRTC compiles CUBIN for any arch. Compiles are slow (~1 s), so the tests share
// a few small kernels and count compiles through KernelCache::stats().
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

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

  EXPECT_EQ(fresh.clear(), 1u);
  EXPECT_TRUE(fresh.list().empty());
  EXPECT_TRUE(fs::exists(dir.path() / "qforge-v1"));
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
  }
}

TEST(KernelCache, ConcurrentRequestsForOneKeyCompileOnce) {
  TempDir dir;
  KernelCache cache(at(dir.path()));
  CompileRequest req = tiny("sm_100a");
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<const CacheEntry>> got(8);
  for (int i = 0; i < 8; ++i) threads.emplace_back([&, i] { got[i] = cache.get_or_compile(req).entry; });
  for (auto& t : threads) t.join();
  EXPECT_EQ(cache.stats().compiles, 1u);
  EXPECT_EQ(cache.stats().memory_hits, 7u);
  for (const auto& e : got) EXPECT_EQ(e, got[0]);
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
    ScopedEnv env({{"QFORGE_CACHE_DIR", "/some/where"}, {"QFORGE_CACHE_READONLY_DIRS", "/a::/b"}});
    const CacheOptions o = CacheOptions::from_env();
    EXPECT_EQ(o.writable_root, fs::path("/some/where"));
    EXPECT_EQ(o.readonly_roots, (std::vector<fs::path>{"/a", "/b"}));
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

}  // namespace
}  // namespace qf::rt
