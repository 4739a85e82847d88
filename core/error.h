#pragma once
// kiln::Error: the one exception type. Messages name the op and show shapes, dtypes and
// devices: "matmul: [2,3] @ [4,5]: inner sizes 3 and 4 differ".
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kiln

// KILN_CHECK(cond, "op: message {}", args...): throws kiln::Error when cond is false. The
// message is only formatted on failure.
#define KILN_CHECK(cond, ...)        \
  do {                               \
    if (!(cond)) ::kiln::fail(__VA_ARGS__); \
  } while (0)
