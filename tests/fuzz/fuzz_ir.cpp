// libFuzzer target: the graph IR's text parser (compiler/ir/parse.cpp). Any input either
// parses or throws kiln::Error; a graph that parses prints to text that parses back to a
// graph printing the same text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "compiler/ir/graph.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string printed;
  try {
    printed = kiln::compiler::print(kiln::compiler::parse(text));
  } catch (const kiln::Error&) {
    return 0;
  }
  std::string again;
  try {
    again = kiln::compiler::print(kiln::compiler::parse(printed));
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "the printed graph does not parse: %s\n%s\n", e.what(), printed.c_str());
    std::abort();
  }
  if (again != printed) {
    std::fprintf(stderr, "print(parse(print(g))) differs from print(g):\n%s\n---\n%s\n",
                 printed.c_str(), again.c_str());
    std::abort();
  }
  return 0;
}
