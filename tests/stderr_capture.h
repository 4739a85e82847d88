#pragma once
// StderrCapture: what the code under test writes to stderr (file descriptor 2, so C and C++
// streams alike) while it lives; for tests of warnings.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/disk_cache.h"

namespace kiln::testing {

struct StderrCapture {
  disk_cache::ScratchDir dir{"test"};
  int saved = -1;
  StderrCapture() {
    std::fflush(stderr);
    saved = dup(2);
    const int fd = open((dir.path() / "stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
  }
  std::string text() {
    std::fflush(stderr);
    return disk_cache::read_file(dir.path() / "stderr");
  }
  ~StderrCapture() {
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
};

}  // namespace kiln::testing
