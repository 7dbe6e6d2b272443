// error_of(f): the what() of the exception f() throws, "(no exception)" if none: error tests
// assert on the message text.
#pragma once
#include <exception>
#include <string>

namespace qf::testing {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace qf::testing
