#include "tools/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <ostream>
#include <string>

namespace kiln::train {

namespace {

std::string clock_time(double seconds) {
  const auto s = static_cast<int64_t>(std::max(seconds, 0.0) + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02}", s / 60, s % 60);
}

}  // namespace

Progress::Progress(std::ostream& out, ProgressMode mode, int64_t every)
    : out_(out), mode_(mode), every_(std::max<int64_t>(every, 1)) {}

void Progress::start_epoch(int64_t epoch, int64_t epochs, int64_t batches) {
  epoch_ = epoch;
  epochs_ = epochs;
  batches_ = batches;
  first_batch_ = -1;
  start_ = std::chrono::steady_clock::now();
}

void Progress::step(int64_t batch, double loss, double images_per_second) {
  if (mode_ == ProgressMode::off) return;
  if (first_batch_ < 0) first_batch_ = batch - 1;
  // The ETA extrapolates this run's own pace (a resumed epoch starts part way).
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = batch - first_batch_;
  const double eta = done > 0 ? elapsed / done * (batches_ - batch) : 0;
  if (mode_ == ProgressMode::bar) {
    constexpr int64_t width = 24;
    const int64_t filled = batches_ > 0 ? width * batch / batches_ : width;
    out_ << fmt::format("\repoch {}/{} [{}{}] {}/{} loss {:.4f} {:.1f} img/s ETA {}\x1b[K", epoch_ + 1, epochs_,
                        std::string(filled, '#'), std::string(width - filled, '.'), batch, batches_, loss,
                        images_per_second, clock_time(eta))
         << std::flush;
    open_line_ = true;
  } else if (batch % every_ == 0 || batch == batches_) {
    out_ << fmt::format("epoch {}/{} step {}/{} loss {:.4f} {:.1f} img/s ETA {}\n", epoch_ + 1, epochs_, batch,
                        batches_, loss, images_per_second, clock_time(eta))
         << std::flush;
  }
}

void Progress::finish() {
  if (open_line_) out_ << '\n';
  open_line_ = false;
}

}  // namespace kiln::train
