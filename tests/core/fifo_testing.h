#pragma once
// A FIFO for the tests that check that readers refuse one without blocking. If a reader
// regresses and blocks in open() or read(), a thread opens the write end (which lets open()
// return) and closes it again (so read() sees the end of the file): the test then fails on
// its assertion instead of hanging forever.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

namespace kiln::testing {

class Fifo {
 public:
  explicit Fifo(std::filesystem::path path) : path_(std::move(path)) {
    if (::mkfifo(path_.c_str(), 0600) != 0)
      throw std::runtime_error("mkfifo " + path_.string() + " failed");
    writer_ = std::thread([this] {
      while (!done_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        // Succeeds only while a reader has the FIFO open (or is blocked opening it).
        const int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) ::close(fd);
      }
    });
  }
  ~Fifo() {
    done_.store(true);
    writer_.join();
    ::unlink(path_.c_str());
  }
  Fifo(const Fifo&) = delete;
  Fifo& operator=(const Fifo&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::atomic<bool> done_{false};
  std::thread writer_;
};

}  // namespace kiln::testing
