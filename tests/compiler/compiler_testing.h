#pragma once
// Helpers shared by the compiler's tests.
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace kiln::testing {

// Points the kernel cache at a fresh directory for one test (and turns the disk cache on)
// and removes the directory afterwards.
struct TempCache {
  std::filesystem::path dir;
  TempCache() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-test-cache-XXXXXX").string();
    dir = mkdtemp(tmpl.data());
    setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    unsetenv("KILN_CACHE");
  }
  ~TempCache() {
    unsetenv("KILN_CACHE_DIR");
    unsetenv("KILN_CACHE");
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempCache(const TempCache&) = delete;
  TempCache& operator=(const TempCache&) = delete;
};

}  // namespace kiln::testing
