#include "core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "core/error.h"

namespace kiln {

namespace {

std::string errno_message(int error) { return std::generic_category().message(error); }

// What a non-regular file is, for the error: "a FIFO", "a directory", ...
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

}  // namespace

RegularFile::RegularFile(const std::filesystem::path& path, std::string_view who)
    : path_(path), who_(who) {
  // A first look by path: a device or a FIFO is refused before it is even opened (opening
  // some devices has side effects). The fstat below, on what was opened, is the check that
  // holds when the path changes in between.
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode))
    fail("{}: {} is not a regular file ({})", who_, path_.string(), file_kind(info.st_mode));
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) fail("{}: cannot open {}: {}", who_, path_.string(), errno_message(errno));
  if (::fstat(fd_, &info) != 0) {
    const int error = errno;
    ::close(fd_);
    fail("{}: cannot stat {}: {}", who_, path_.string(), errno_message(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd_);
    fail("{}: {} is not a regular file ({})", who_, path_.string(), file_kind(info.st_mode));
  }
  // Regular files never block; clearing the flag keeps later readers (zlib) on plain reads.
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int error = errno;
    ::close(fd_);
    fail("{}: cannot clear O_NONBLOCK on {}: {}", who_, path_.string(), errno_message(error));
  }
  size_ = static_cast<int64_t>(info.st_size);
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

int RegularFile::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void RegularFile::read_at(void* out, size_t nbytes, int64_t offset) const {
  KILN_CHECK(fd_ >= 0, "{}: {} was released before a read", who_, path_.string());
  auto* p = static_cast<char*>(out);
  const int64_t begin = offset, total = static_cast<int64_t>(nbytes);
  while (nbytes > 0) {
    const ssize_t n = ::pread(fd_, p, std::min<size_t>(nbytes, size_t{1} << 30), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: cannot read {}: {}", who_, path_.string(), errno_message(errno));
    if (n == 0)
      fail(
          "{}: {} ended at byte {}, {} bytes into a read of {} at byte {} (changed while reading?)",
          who_, path_.string(), offset, offset - begin, total, begin);
    p += n;
    nbytes -= static_cast<size_t>(n);
    offset += n;
  }
}

std::string read_regular_file(const std::filesystem::path& path, std::string_view who,
                              int64_t max_bytes) {
  const RegularFile file(path, who);
  KILN_CHECK(file.size() <= max_bytes,
             "{}: {} holds {} bytes, more than the {} bytes this reader accepts", who,
             path.string(), file.size(), max_bytes);
  std::string bytes(static_cast<size_t>(file.size()), '\0');
  file.read_at(bytes.data(), bytes.size(), 0);
  return bytes;
}

}  // namespace kiln
