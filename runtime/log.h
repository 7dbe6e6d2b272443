// The library's messages: every one goes through write() (no other stderr output in runtime/
// and compiler/, but the test seams' pause line, which test scripts wait for).
//
// Threshold: QFORGE_LOG_LEVEL (off, error, warn, info, debug; case-insensitive; default warn),
// read on first use; set_level() overrides it. A bad value is named in one warning and the
// default is kept. What each level adds:
//   error  nothing today (errors are thrown to the caller, never only logged)
//   warn   the kernel cache falling back to memory only, lock problems, unstored tuning results
//   info   one line per JIT compile: its kernels, arch and compile time in ms
//   debug  one line per kernel cache hit (memory or disk) and how long the lookup took
//
// Sink: stderr as "qforge: <level>: <message>\n" (one write per line), or the callback set by
// set_callback() (qf_set_log_callback in the C API). The callback runs on the thread that logs
// (a compiling thread: a caller's, or a `qforge prewarm` worker), possibly on several threads at
// once, and never while qforge holds a lock of its own (the cache's lock, a key's file lock, a
// pending compile other threads wait for): it may take its time. set_callback() waits for the
// callbacks in progress on other threads to return; afterwards the old callback is never called
// again. A message logged from inside the callback (on its thread) goes to stderr, and
// set_callback() from inside a callback is refused (it would wait for itself).
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace qf::log {

// The C API's values (QF_LOG_*): a more verbose level is a larger number.
enum class Level : int { Off = 0, Error = 1, Warn = 2, Info = 3, Debug = 4 };

const char* name(Level l);  // "off", "error", "warn", "info", "debug"
// "off" | "error" | "warn" | "warning" | "info" | "debug" (any case), or nullopt.
std::optional<Level> parse_level(std::string_view s);

// The threshold: messages of level <= level() are written. The first call reads QFORGE_LOG_LEVEL.
Level level();
void set_level(Level l);
inline bool enabled(Level l) { return l != Level::Off && int(l) <= int(level()); }

using Callback = void (*)(int level, const char* message, void* user);
// nullptr: back to stderr. Returns false (and changes nothing) when called from inside a callback.
bool set_callback(Callback cb, void* user);

// Writes `message` (one line, no trailing newline needed) if enabled(l).
void write(Level l, std::string_view message);
inline void error(std::string_view m) { write(Level::Error, m); }
inline void warn(std::string_view m) { write(Level::Warn, m); }
inline void info(std::string_view m) { write(Level::Info, m); }
inline void debug(std::string_view m) { write(Level::Debug, m); }

// Output the user asked for by a switch of its own (QFORGE_TIME_PASSES, QFORGE_DUMP_AFTER): to
// the same sink at level `l`, whatever the threshold, unless logging is off.
void write_requested(Level l, std::string_view message);

// Tests only: forget the threshold, so the next level() reads QFORGE_LOG_LEVEL again.
void reset_level_for_tests();

}  // namespace qf::log
