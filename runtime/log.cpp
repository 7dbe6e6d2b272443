#include "runtime/log.h"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>

namespace qf::log {
namespace {

constexpr int kUnread = -1;  // QFORGE_LOG_LEVEL not read yet
constexpr Level kDefault = Level::Warn;
std::atomic<int> g_level{kUnread};

// The callback and its argument; writers of messages hold it shared while calling the callback,
// set_callback exclusively (so it returns only once no call of the old callback is in progress).
std::shared_mutex g_sink_mu;
Callback g_callback = nullptr;
void* g_user = nullptr;
thread_local bool t_in_callback = false;

void to_stderr(Level l, std::string_view message) {
  const char* word = l == Level::Warn ? "warning" : name(l);
  std::string line = "qforge: ";
  line.append(word).append(": ").append(message);
  if (line.empty() || line.back() != '\n') line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);  // one call: lines of several threads never interleave
  std::fflush(stderr);
}

void deliver(Level l, std::string_view message) {
  if (t_in_callback) return to_stderr(l, message);  // from inside the callback: no recursion into it
  std::shared_lock lk(g_sink_mu);
  if (!g_callback) return to_stderr(l, message);
  const std::string text(message);  // NUL-terminated for C
  t_in_callback = true;
  try {
    g_callback(int(l), text.c_str(), g_user);
  } catch (...) {  // a C callback cannot throw, but a C++ one given as a C pointer might
  }
  t_in_callback = false;
}

}  // namespace

const char* name(Level l) {
  switch (l) {
    case Level::Off: return "off";
    case Level::Error: return "error";
    case Level::Warn: return "warn";
    case Level::Info: return "info";
    case Level::Debug: return "debug";
  }
  return "?";
}

std::optional<Level> parse_level(std::string_view s) {
  std::string lower;
  for (char c : s) lower += char(std::tolower(static_cast<unsigned char>(c)));
  for (Level l : {Level::Off, Level::Error, Level::Warn, Level::Info, Level::Debug})
    if (lower == name(l)) return l;
  if (lower == "warning") return Level::Warn;
  return std::nullopt;
}

Level level() {
  int v = g_level.load(std::memory_order_relaxed);
  if (v != kUnread) return Level(v);
  const char* env = std::getenv("QFORGE_LOG_LEVEL");
  const std::optional<Level> parsed = env && *env ? parse_level(env) : std::optional<Level>(kDefault);
  int expected = kUnread;
  // The first reader decides (set_level() may have won the race: then that stays).
  g_level.compare_exchange_strong(expected, int(parsed.value_or(kDefault)));
  if (!parsed && expected == kUnread)  // only the thread that stored the default warns, once
    write(Level::Warn, std::string("QFORGE_LOG_LEVEL: expected off, error, warn, info or debug, got \"") + env +
                           "\"; using " + name(kDefault));
  return Level(g_level.load(std::memory_order_relaxed));
}

void set_level(Level l) { g_level.store(int(l), std::memory_order_relaxed); }

void reset_level_for_tests() { g_level.store(kUnread); }

bool set_callback(Callback cb, void* user) {
  if (t_in_callback) return false;
  std::unique_lock lk(g_sink_mu);
  g_callback = cb;
  g_user = user;
  return true;
}

void write(Level l, std::string_view message) {
  if (enabled(l)) deliver(l, message);
}

void write_requested(Level l, std::string_view message) {
  if (l != Level::Off && level() != Level::Off) deliver(l, message);
}

}  // namespace qf::log
