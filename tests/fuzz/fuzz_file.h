#pragma once
// For the fuzz targets whose reader takes a path: writes an input to a file in a folder of
// this process's own ($TMPDIR, else /dev/shm where it exists, else /tmp).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace kiln::fuzz {

// libFuzzer ends with _Exit, which runs no atexit handlers: each run instead removes the
// folders of earlier runs whose process is gone.
inline void remove_stale_folders(const std::filesystem::path& base) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(base, error)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("kiln-fuzz-")) continue;
    const long pid = std::strtol(name.c_str() + 10, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      std::filesystem::remove_all(entry.path(), error);
  }
}

inline const std::filesystem::path& scratch_folder() {
  static const std::filesystem::path folder = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::error_code error;
    const std::filesystem::path base = tmp && *tmp ? tmp
                                       : std::filesystem::is_directory("/dev/shm", error)
                                           ? "/dev/shm"
                                           : "/tmp";
    remove_stale_folders(base);
    std::filesystem::path path = base / ("kiln-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    return path;
  }();
  return folder;
}

// Writes `size` bytes to scratch_folder() / name and returns the path.
inline std::filesystem::path write_input(const std::string& name, const uint8_t* data,
                                         size_t size) {
  const std::filesystem::path path = scratch_folder() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) std::abort();
  return path;
}

}  // namespace kiln::fuzz
