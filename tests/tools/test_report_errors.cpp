// tools/report_errors.h: whatever a program's body throws becomes one line on stderr, named
// by the program once, and the exit status given; a body that returns gives its status.
#include "testing.h"

#include <filesystem>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "tools/report_errors.h"

using namespace kiln;

namespace {

// What report_errors writes on stderr for `body`, and the status it returns.
template <class Body>
std::pair<int, std::string> reported(Body body) {
  std::ostringstream captured;
  std::streambuf* original = std::cerr.rdbuf(captured.rdbuf());
  const int status = tools::report_errors("kiln-x", 7, body);
  std::cerr.rdbuf(original);
  return {status, captured.str()};
}

}  // namespace

TEST_CASE("report_errors: any exception is one line and the status", "[trainer][report_errors]") {
  CHECK(reported([] { return 3; }) == std::pair<int, std::string>{3, ""});
  CHECK(reported([]() -> int { throw Error("kiln-x: --batch 0 must be positive"); }) ==
        std::pair<int, std::string>{7, "kiln-x: --batch 0 must be positive\n"});
  CHECK(reported([]() -> int { throw Error("kiln-x train: --layout nhwc"); }).second ==
        "kiln-x train: --layout nhwc\n");
  CHECK(reported([]() -> int { throw Error("Loader: workers -1"); }).second == "kiln-x: Loader: workers -1\n");
  CHECK(reported([]() -> int { throw Error("kiln-xy: not our name"); }).second == "kiln-x: kiln-xy: not our name\n");
  CHECK(reported([]() -> int { throw std::bad_alloc(); }).second ==
        "kiln-x: out of memory (std::bad_alloc): a smaller batch, image size or model may fit\n");
  const auto [fs_status, fs_line] = reported([]() -> int {
    throw std::filesystem::filesystem_error("cannot create directories", "/dev/null/x",
                                            std::make_error_code(std::errc::not_a_directory));
  });
  CHECK(fs_status == 7);
  CHECK_THAT(fs_line, Catch::Matchers::StartsWith("kiln-x: file system: ") &&
                          Catch::Matchers::Contains("/dev/null/x") && Catch::Matchers::EndsWith("\n"));
  const auto [system_status, system_line] = reported([]() -> int {
    throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  });
  CHECK(system_status == 7);
  CHECK_THAT(system_line, Catch::Matchers::StartsWith("kiln-x: system: "));
  CHECK(reported([]() -> int { throw std::out_of_range("stoll"); }).second == "kiln-x: unexpected error: stoll\n");
  CHECK(reported([]() -> int { throw 42; }) ==
        std::pair<int, std::string>{7, "kiln-x: unexpected error of an unknown type\n"});
}
