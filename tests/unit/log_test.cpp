// The library log (runtime/log.h, qf_set_log_callback / qf_set_log_level in the C API): a JIT
// compile reaches the callback at info with its kernels, arch and time, hits at debug; the
// threshold filters; QFORGE_LOG_LEVEL is parsed and a bad value is named; the callback is
// thread-safe and never called after it is replaced. No GPU needed (NVRTC only).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/kernel_cache.h"
#include "runtime/log.h"
#include "runtime/qforge.h"

namespace qf {
namespace {

struct Collected {
  std::mutex mu;
  std::vector<std::pair<int, std::string>> messages;
  std::vector<std::pair<int, std::string>> take() {
    std::lock_guard lk(mu);
    return std::exchange(messages, {});
  }
};

void collect(int level, const char* message, void* user) {
  auto* c = static_cast<Collected*>(user);
  std::lock_guard lk(c->mu);
  c->messages.emplace_back(level, message);
}

// Each test starts and ends with no callback, no QFORGE_LOG_LEVEL and the threshold unread.
class Log : public ::testing::Test {
 protected:
  void SetUp() override { reset(); }
  void TearDown() override { reset(); }
  static void reset() {
    ASSERT_EQ(qf_set_log_callback(nullptr, nullptr), QF_OK);
    ::unsetenv("QFORGE_LOG_LEVEL");
    log::reset_level_for_tests();
  }
};

rt::CompileRequest tiny_request() {
  rt::CompileRequest r;
  r.source = "extern \"C\" __global__ void qf_log_test_kernel(unsigned* out) { out[0] = 7u; }\n";
  r.name_expressions = {"qf_log_test_kernel"};
  r.arch = "sm_90a";
  return r;
}

rt::CacheOptions memory_only() {
  rt::CacheOptions o;
  o.disabled = true;
  return o;
}

TEST_F(Log, ACompileReachesTheCallbackAtInfoAndHitsAtDebug) {
  Collected c;
  ASSERT_EQ(qf_set_log_callback(collect, &c), QF_OK);
  ASSERT_EQ(qf_set_log_level(QF_LOG_DEBUG), QF_OK);
  rt::KernelCache cache(memory_only());
  const nlohmann::json meta = {{"kind", "test"}, {"recipe", "r1"}};
  ASSERT_EQ(cache.get_or_compile(tiny_request(), meta).how, rt::CacheHow::Compiled);
  auto got = c.take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, QF_LOG_INFO);
  const std::string& m = got[0].second;
  EXPECT_EQ(m.rfind("compiled test kernel (recipe r1) [qf_log_test_kernel] for sm_90a in ", 0), 0u) << m;
  EXPECT_NE(m.find(" ms (NVRTC "), std::string::npos) << m;

  ASSERT_EQ(cache.get_or_compile(tiny_request(), meta).how, rt::CacheHow::MemoryHit);
  got = c.take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, QF_LOG_DEBUG);
  EXPECT_EQ(got[0].second.rfind("memory cache hit: test kernel (recipe r1) [qf_log_test_kernel] for sm_90a in ", 0), 0u)
      << got[0].second;
}

TEST_F(Log, TheThresholdFilters) {
  Collected c;
  ASSERT_EQ(qf_set_log_callback(collect, &c), QF_OK);
  ASSERT_EQ(qf_set_log_level(QF_LOG_WARN), QF_OK);
  rt::KernelCache cache(memory_only());
  ASSERT_EQ(cache.get_or_compile(tiny_request()).how, rt::CacheHow::Compiled);
  ASSERT_EQ(cache.get_or_compile(tiny_request()).how, rt::CacheHow::MemoryHit);
  EXPECT_TRUE(c.take().empty());  // info and debug are below warn

  log::warn("w");
  log::error("e");
  log::info("i");
  ASSERT_EQ(qf_set_log_level(QF_LOG_INFO), QF_OK);
  log::info("i2");
  log::debug("d");
  ASSERT_EQ(qf_set_log_level(QF_LOG_OFF), QF_OK);
  log::error("e2");
  log::write_requested(log::Level::Info, "asked for, but off");
  ASSERT_EQ(qf_set_log_level(QF_LOG_ERROR), QF_OK);
  log::warn("w2");
  log::write_requested(log::Level::Info, "asked for");
  const auto got = c.take();
  const std::vector<std::pair<int, std::string>> want = {
      {QF_LOG_WARN, "w"}, {QF_LOG_ERROR, "e"}, {QF_LOG_INFO, "i2"}, {QF_LOG_INFO, "asked for"}};
  EXPECT_EQ(got, want);

  EXPECT_EQ(qf_set_log_level(5), QF_ERR_USER);
  EXPECT_NE(std::string(qf_last_error()).find("QF_LOG_OFF (0) .. QF_LOG_DEBUG (4), got 5"), std::string::npos)
      << qf_last_error();
  EXPECT_EQ(qf_set_log_level(-1), QF_ERR_USER);
  EXPECT_EQ(qf_get_log_level(), QF_LOG_ERROR);  // unchanged by the refused calls
}

TEST_F(Log, LevelNamesParse) {
  EXPECT_EQ(log::parse_level("off"), log::Level::Off);
  EXPECT_EQ(log::parse_level("ERROR"), log::Level::Error);
  EXPECT_EQ(log::parse_level("Warn"), log::Level::Warn);
  EXPECT_EQ(log::parse_level("warning"), log::Level::Warn);
  EXPECT_EQ(log::parse_level("info"), log::Level::Info);
  EXPECT_EQ(log::parse_level("debug"), log::Level::Debug);
  EXPECT_EQ(log::parse_level("verbose"), std::nullopt);
  EXPECT_EQ(log::parse_level(""), std::nullopt);
  EXPECT_EQ(log::parse_level("3"), std::nullopt);
}

TEST_F(Log, QforgeLogLevelIsReadAndABadValueIsNamed) {
  EXPECT_EQ(qf_get_log_level(), QF_LOG_WARN);  // the default
  log::reset_level_for_tests();
  ::setenv("QFORGE_LOG_LEVEL", "DEBUG", 1);
  EXPECT_EQ(qf_get_log_level(), QF_LOG_DEBUG);
  log::reset_level_for_tests();
  ::setenv("QFORGE_LOG_LEVEL", "off", 1);
  EXPECT_EQ(log::level(), log::Level::Off);

  Collected c;
  ASSERT_EQ(qf_set_log_callback(collect, &c), QF_OK);
  log::reset_level_for_tests();
  ::setenv("QFORGE_LOG_LEVEL", "verbose", 1);
  EXPECT_EQ(log::level(), log::Level::Warn);
  EXPECT_EQ(log::level(), log::Level::Warn);  // read once: one warning
  const auto got = c.take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, QF_LOG_WARN);
  EXPECT_EQ(got[0].second,
            "QFORGE_LOG_LEVEL: expected off, error, warn, info or debug, got \"verbose\"; using warn");
}

TEST_F(Log, WithoutACallbackStderrGetsOneLinePerMessage) {
  ASSERT_EQ(qf_set_log_level(QF_LOG_DEBUG), QF_OK);
  ::testing::internal::CaptureStderr();
  log::warn("disk full");
  log::info("compiled x");
  log::debug("hit y");
  log::error("bad z\n");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "qforge: warning: disk full\nqforge: info: compiled x\nqforge: debug: hit y\nqforge: error: bad z\n");
}

// From inside the callback: a message goes to stderr (no recursion) and replacing the callback is
// refused (it would wait for itself).
struct Reentrant {
  qf_status set_status = QF_OK;
  int calls = 0;
};
void reenter(int, const char*, void* user) {
  auto* r = static_cast<Reentrant*>(user);
  ++r->calls;
  log::warn("from inside");
  r->set_status = qf_set_log_callback(nullptr, nullptr);
}

TEST_F(Log, TheCallbackMayCallQforgeButNotReplaceItself) {
  Reentrant r;
  ASSERT_EQ(qf_set_log_callback(reenter, &r), QF_OK);
  ::testing::internal::CaptureStderr();
  log::warn("outer");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "qforge: warning: from inside\n");
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.set_status, QF_ERR_USER);
}

// Several threads log at once; the callback is replaced meanwhile. Every message reaches exactly
// one sink, and once qf_set_log_callback has returned the old callback is never entered again.
struct Counting {
  std::atomic<int> calls{0};
  std::atomic<bool> retired{false};
  std::atomic<int> after_retired{0};
};
void count(int, const char*, void* user) {
  auto* c = static_cast<Counting*>(user);
  if (c->retired) ++c->after_retired;
  ++c->calls;
  std::this_thread::yield();
}

TEST_F(Log, ThreadsLogWhileTheCallbackIsReplaced) {
  ASSERT_EQ(qf_set_log_level(QF_LOG_INFO), QF_OK);
  Counting a, b;
  ASSERT_EQ(qf_set_log_callback(count, &a), QF_OK);
  constexpr int kThreads = 8, kEach = 2000;
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      while (!go) std::this_thread::yield();
      for (int i = 0; i < kEach; ++i) log::info("message");
    });
  go = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(qf_set_log_callback(count, &b), QF_OK);
  a.retired = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(a.after_retired.load(), 0);
  EXPECT_EQ(a.calls + b.calls, kThreads * kEach);
}

}  // namespace
}  // namespace qf
