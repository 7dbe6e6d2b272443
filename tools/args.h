// Minimal, strict command-line parsing for the qforge subcommands: --flag value, --flag=value,
// boolean --flag, positionals. Unknown flags are user errors naming the flag.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "compiler/error.h"

namespace qf::cli {

class Args {
 public:
  // `valued`: flags that take a value; `boolean`: flags that do not.
  Args(const std::vector<std::string>& argv, std::set<std::string> valued, std::set<std::string> boolean)
      : valued_(std::move(valued)), boolean_(std::move(boolean)) {
    for (size_t i = 0; i < argv.size(); ++i) {
      std::string a = argv[i];
      // Short options with an attached value: -j8 -> -j 8.
      if (a.size() > 2 && a[0] == '-' && a[1] != '-' && valued_.count(a.substr(0, 2))) {
        flags_[a.substr(0, 2)].push_back(a.substr(2));
        continue;
      }
      const bool is_flag = (a.rfind("--", 0) == 0 && a != "--") || (a.size() == 2 && a[0] == '-' && a[1] != '-');
      if (!is_flag) {
        positional_.push_back(a);
        continue;
      }
      std::string key = a, value;
      bool has_value = false;
      if (auto eq = a.find('='); eq != std::string::npos) {
        key = a.substr(0, eq), value = a.substr(eq + 1), has_value = true;
      }
      if (boolean_.count(key)) {
        if (has_value) throw UserError(key, "takes no value");
        flags_[key].push_back("1");
      } else if (valued_.count(key)) {
        if (!has_value) {
          if (i + 1 >= argv.size()) throw UserError(key, "expects a value");
          value = argv[++i];
        }
        flags_[key].push_back(value);
      } else {
        std::string known;
        for (const auto& k : valued_) known += " " + k;
        for (const auto& k : boolean_) known += " " + k;
        throw UserError(key, "unknown option; this command takes:" + (known.empty() ? std::string(" none") : known));
      }
    }
  }
  const std::vector<std::string>& positional() const { return positional_; }
  bool flag(const std::string& k) const { return flags_.count(k) > 0; }
  std::optional<std::string> get(const std::string& k) const {
    auto it = flags_.find(k);
    if (it == flags_.end()) return std::nullopt;
    return it->second.back();
  }
  std::vector<std::string> all(const std::string& k) const {
    auto it = flags_.find(k);
    return it == flags_.end() ? std::vector<std::string>{} : it->second;
  }
  std::string require(const std::string& k) const {
    auto v = get(k);
    if (!v) throw UserError(k, "is required");
    return *v;
  }
  // A decimal integer in [lo, hi]: digits with an optional leading '-', nothing else (no
  // spaces, no '+', no octal or hex: "0100" is one hundred).
  int64_t integer(const std::string& k, int64_t def, int64_t lo, int64_t hi) const {
    auto v = get(k);
    if (!v) return def;
    const std::optional<int64_t> x = decimal(*v);
    if (!x || *x < lo || *x > hi)
      throw UserError(k, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got \"" + *v + "\"");
    return *x;
  }
  static std::optional<int64_t> decimal(const std::string& s) {
    const size_t first = !s.empty() && s[0] == '-' ? 1 : 0;
    if (s.size() == first || s.size() - first > 18) return std::nullopt;  // 18 digits fit int64
    int64_t x = 0;
    for (size_t i = first; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      x = x * 10 + (s[i] - '0');
    }
    return first ? -x : x;
  }

 private:
  std::set<std::string> valued_, boolean_;
  std::map<std::string, std::vector<std::string>> flags_;
  std::vector<std::string> positional_;
};

}  // namespace qf::cli
