// qforge list | verify | clear: look after the kernel cache (runtime/kernel_cache.h). The cache
// is configured from the environment exactly as the library configures it (QFORGE_CACHE_DIR,
// QFORGE_CACHE_READONLY_DIRS, QFORGE_CACHE_DISABLE).
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iostream>

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
    return std::tie(a.recipe, a.role, a.arch, a.key) < std::tie(b.recipe, b.role, b.arch, b.key);
  });
  if (args.flag("--json")) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : entries)
      out.push_back({{"key", e.key}, {"kind", e.kind}, {"arch", e.arch}, {"size", e.size}, {"recipe", e.recipe},
                     {"role", e.role}, {"created_unix", e.created_unix}, {"last_use_unix", e.last_use_unix},
                     {"root", e.root}, {"readonly", e.readonly}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  print_roots(cache);
  std::printf("%-16s  %-5s  %-8s  %9s  %-14s  %-14s  %-20s  %-20s\n", "KEY", "KIND", "ARCH", "BYTES", "RECIPE",
              "ROLE", "CREATED", "LAST USE");
  uint64_t total = 0;
  for (const auto& e : entries) {
    std::printf("%-16s  %-5s  %-8s  %9llu  %-14s  %-14s  %-20s  %-20s%s\n", e.key.substr(0, 16).c_str(), e.kind.c_str(),
                e.arch.c_str(), (unsigned long long)e.size, e.recipe.empty() ? "-" : e.recipe.c_str(),
                e.role.empty() ? "-" : e.role.c_str(), utc(e.created_unix).c_str(), utc(e.last_use_unix).c_str(),
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

int cmd_clear(const Argv& argv) {
  Args args(argv, {}, {});
  if (!args.positional().empty()) throw UserError(args.positional()[0], "clear takes no positional arguments");
  rt::KernelCache cache;
  const size_t n = cache.clear();
  std::cout << "removed " << n << " kernel" << (n == 1 ? "" : "s");
  if (cache.writable_root()) std::cout << " from " << cache.writable_root()->string();
  std::cout << "\n";
  return 0;
}

}  // namespace qf::cli
