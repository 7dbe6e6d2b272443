// The two kinds of error qforge raises.
//
// UserError: the caller gave us something wrong (a recipe, a CLI argument, a tensor). The
// message names where (a JSON pointer such as /roles/2/columnwise/block, or an argument name)
// and what was expected instead. Tools exit with code 2 on it.
//
// InternalError: a broken invariant inside qforge (a bug). It carries file:line. Tools exit
// with code 3 on it.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace qf {

class UserError : public std::runtime_error {
 public:
  // `where` is a JSON pointer ("/roles/0/rowwise/format") or an argument name ("--role").
  UserError(std::string where, const std::string& what)
      : std::runtime_error(where.empty() ? what : where + ": " + what), where_(std::move(where)), message_(what) {}
  const std::string& where() const { return where_; }
  const std::string& message() const { return message_; }  // what() without the "where: " prefix

 private:
  std::string where_;
  std::string message_;
};

class InternalError : public std::logic_error {
 public:
  InternalError(const char* file, int line, const std::string& what)
      : std::logic_error(std::string("internal error at ") + file + ":" + std::to_string(line) +
                         ": " + what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace qf

// QF_CHECK(cond, message parts...): throws InternalError with file:line when cond is false.
#define QF_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond))                                                                  \
      throw ::qf::InternalError(__FILE__, __LINE__,                               \
                                ::qf::detail::concat("check failed: " #cond " ",  \
                                                     ##__VA_ARGS__));             \
  } while (0)
