// QFORGE_* switches read from the environment.
#pragma once
#include <cstdlib>
#include <string>

#include "compiler/error.h"

namespace qf {

// A switch: unset or empty gives `unset`, "0" false, "1" true; any other value is a UserError
// naming the variable (a typo must not leave a feature silently on or off).
inline bool env_flag(const char* name, bool unset) {
  const char* v = std::getenv(name);
  if (!v || !*v) return unset;
  const std::string s(v);
  if (s == "0") return false;
  if (s == "1") return true;
  throw UserError(name, "expected 0 or 1 (or unset), got \"" + s + "\"");
}

}  // namespace qf
