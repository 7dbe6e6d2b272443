// qforge list | verify | clear: look after the kernel cache (runtime/kernel_cache.h). The cache
// is configured from the environment exactly as the library configures it (QFORGE_CACHE_DIR,
// QFORGE_CACHE_READONLY_DIRS, QFORGE_CACHE_DISABLE).
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/kernel_cache.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace qf::cli {
namespace {

std::string utc(int64_t t) {
  if (!t) return "-";
  std::time_t tt = std::time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm);
  return buf;
}

void print_roots(const rt::KernelCache& cache) {
  if (cache.writable_root())
    std::cout << "cache: " << cache.writable_root()->string() << (cache.disk_writable() ? "" : " (not writable)") << "\n";
  else
    std::cout << "cache: memory only\n";
  for (const auto& r : cache.readonly_roots()) std::cout << "read-only: " << r.string() << "\n";
}

}  // namespace

int cmd_list(const Argv& argv) {
  Args args(argv, {}, {"--json"});
  if (!args.positional().empty()) throw UserError(args.positional()[0], "list takes no positional arguments");
  rt::KernelCache cache;
  auto entries = cache.list();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return std::tie(a.recipe, a.role, a.form, a.arch, a.key) < std::tie(b.recipe, b.role, b.form, b.arch, b.key);
  });
  if (args.flag("--json")) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : entries)
      out.push_back({{"key", e.key}, {"kind", e.kind}, {"arch", e.arch}, {"size", e.size}, {"recipe", e.recipe},
                     {"role", e.role}, {"form", e.form}, {"content", e.content}, {"created_unix", e.created_unix}, {"last_use_unix", e.last_use_unix},
                     {"root", e.root}, {"readonly", e.readonly}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  print_roots(cache);
  // FORM: a quantize plan's program (separate / one-launch: two entries per plan with a global amax).
  // ROLE: a kernel of no role (a GEMM, an INT8 optimizer step, ...) shows what it is instead.
  std::printf("%-16s  %-5s  %-8s  %9s  %-14s  %-14s  %-10s  %-20s  %-20s\n", "KEY", "KIND", "ARCH", "BYTES", "RECIPE",
              "ROLE", "FORM", "CREATED", "LAST USE");
  uint64_t total = 0;
  for (const auto& e : entries) {
    std::printf("%-16s  %-5s  %-8s  %9llu  %-14s  %-14s  %-10s  %-20s  %-20s%s\n", e.key.substr(0, 16).c_str(),
                e.kind.c_str(), e.arch.c_str(), (unsigned long long)e.size, e.recipe.empty() ? "-" : e.recipe.c_str(),
                !e.role.empty() ? e.role.c_str() : !e.content.empty() ? e.content.c_str() : "-", e.form.empty() ? "-" : e.form.c_str(), utc(e.created_unix).c_str(), utc(e.last_use_unix).c_str(),
                e.readonly ? "  (read-only)" : "");
    total += e.size;
  }
  std::printf("%zu kernel%s, %llu bytes\n", entries.size(), entries.size() == 1 ? "" : "s", (unsigned long long)total);
  return 0;
}

int cmd_verify(const Argv& argv) {
  Args args(argv, {}, {});
  if (!args.positional().empty()) throw UserError(args.positional()[0], "verify takes no positional arguments");
  rt::KernelCache cache;
  const auto problems = cache.verify();
  for (const auto& p : problems) std::cout << p.path << ": " << p.what << "\n";
  const size_t n = cache.list().size();
  if (problems.empty()) {
    std::cout << "ok: " << n << " kernel" << (n == 1 ? "" : "s") << " verified\n";
    return 0;
  }
  std::cout << problems.size() << " problem" << (problems.size() == 1 ? "" : "s")
            << " (a damaged entry is recompiled on next use; `qforge clear` removes all)\n";
  return 1;
}

namespace {

// "<n><unit>": a decimal count and one unit letter (the units' factors in `units`), or with
// `bare` (the factor of no letter) the count alone.
uint64_t parse_quantity(const std::string& flag, const std::string& text,
                        const std::vector<std::pair<char, uint64_t>>& units, std::optional<uint64_t> bare,
                        const std::string& expected) {
  const auto bad = [&] { return UserError(flag, "expected " + expected + ", got \"" + text + "\""); };
  if (text.empty()) throw bad();
  const auto unit = std::find_if(units.begin(), units.end(), [&](const auto& u) { return u.first == text.back(); });
  if (unit == units.end() && !bare) throw bad();
  const uint64_t factor = unit == units.end() ? *bare : unit->second;
  const std::optional<int64_t> n = Args::decimal(unit == units.end() ? text : text.substr(0, text.size() - 1));
  if (!n || *n < 0) throw bad();
  if (uint64_t(*n) > (uint64_t(1) << 62) / factor) throw UserError(flag, "expected at most 2^62 (in seconds or bytes), got \"" + text + "\"");
  return uint64_t(*n) * factor;
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

int cmd_clear(const Argv& argv) {
  Args args(argv, {"--unused-for", "--max-size"}, {"--stale", "--dry-run"});
  if (!args.positional().empty()) throw UserError(args.positional()[0], "clear takes no positional arguments");
  rt::EvictPolicy policy;
  if (auto v = args.get("--unused-for"))
    policy.unused_for_s = int64_t(parse_quantity("--unused-for", *v, {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}},
                                                 std::nullopt, "a duration such as 30d, 12h, 90m or 3600s"));
  if (auto v = args.get("--max-size"))
    policy.max_bytes = parse_quantity("--max-size", *v, {{'B', 1}, {'K', 1ull << 10}, {'M', 1ull << 20}, {'G', 1ull << 30}, {'T', 1ull << 40}},
                                      1, "a size such as 500M or 2G (bytes, or B, K, M, G, T: powers of 1024)");
  policy.stale = args.flag("--stale");
  const bool dry_run = args.flag("--dry-run");
  const bool all = !policy.unused_for_s && !policy.max_bytes && !policy.stale;
  if (all && dry_run) throw UserError("--dry-run", "takes --unused-for, --max-size or --stale (plain clear removes everything)");
  rt::KernelCache cache;
  const std::string where = cache.writable_root() ? " from " + cache.writable_root()->string() : "";
  if (all) {
    const size_t n = cache.clear();
    std::cout << "removed " << n << " kernel" << (n == 1 ? "" : "s") << where << "\n";
    return 0;
  }
  const rt::EvictResult r = cache.evict(policy, dry_run);
  std::cout << (dry_run ? "would remove " : "removed ") << r.removed << " kernel" << (r.removed == 1 ? "" : "s") << " ("
            << mib(r.removed_bytes) << ")" << where << ", " << (dry_run ? "keep " : "kept ") << r.kept << " ("
            << mib(r.kept_bytes) << ")\n";
  return 0;
}

}  // namespace qf::cli
