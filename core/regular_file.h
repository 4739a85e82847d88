#pragma once
// Reading the files a user names (checkpoints, data sets, images) safely: a path that is a
// FIFO, a device, a socket or a directory is refused with a kiln::Error instead of blocking
// in open() or read(), and every read is checked to return the bytes asked for. Every
// reader of user files (safetensors, IDX, JPEG) opens them through here.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace kiln {

// A regular file open for reading; closed by the destructor.
class RegularFile {
 public:
  // Opens `path` with O_NONBLOCK (so that opening a FIFO returns at once), checks with fstat
  // that it is a regular file, then clears O_NONBLOCK. Errors start with `who` and name the
  // path: "who: cannot open PATH: No such file or directory", "who: PATH is not a regular
  // file (a FIFO)".
  RegularFile(const std::filesystem::path& path, std::string_view who);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  // The size fstat reported when the file was opened.
  int64_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  int fd() const { return fd_; }

  // Reads exactly `nbytes` bytes at `offset` into `out`; a file that ends first (it shrank
  // since it was opened) or a failed read is an error naming the file.
  void read_at(void* out, size_t nbytes, int64_t offset) const;

  // Hands the descriptor to the caller (gzdopen takes ownership of it); the destructor then
  // closes nothing.
  int release();

 private:
  std::filesystem::path path_;
  std::string who_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// The whole of the regular file at `path`, refused before anything is allocated when it
// holds more than `max_bytes` bytes. Errors as for RegularFile, plus the size and the bound.
std::string read_regular_file(const std::filesystem::path& path, std::string_view who,
                              int64_t max_bytes);

}  // namespace kiln
