#pragma once
// A loopback TCP port no one listens on now (the kernel's pick for port 0): where rank 0's
// store of a job started on this machine listens (kiln-run --master-port 0, kiln-bench ddp,
// the multi-process tests). -1 when none can be had, errno saying why. Plain POSIX, so that
// kiln-run, which needs no kiln, can use it.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace kiln::tools {

inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int error = errno;
  ::close(fd);
  errno = error;
  return ok ? ntohs(addr.sin_port) : -1;
}

}  // namespace kiln::tools
