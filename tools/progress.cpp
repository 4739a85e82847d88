#include "tools/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>

namespace kiln::train {

namespace {

std::string clock_time(double seconds) {
  const auto s = static_cast<int64_t>(std::clamp(std::isfinite(seconds) ? seconds : 0.0, 0.0, 1e15) + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02}", s / 60, s % 60);
}

}  // namespace

Progress::Progress(std::ostream& out, ProgressMode mode, int64_t every, std::string unit)
    : out_(out), mode_(mode), every_(std::max<int64_t>(every, 1)), unit_(std::move(unit)) {}

void Progress::start_run(int64_t first_step, int64_t total_steps) {
  first_step_ = first_step;
  total_steps_ = total_steps;
  run_start_ = std::chrono::steady_clock::now();
}

void Progress::start_epoch(int64_t epoch, int64_t epochs, int64_t batches) {
  epoch_ = epoch;
  epochs_ = epochs;
  batches_ = batches;
}

bool Progress::due(int64_t batch) const {
  if (mode_ == ProgressMode::off) return false;
  if (batch == batches_) return true;
  if (mode_ == ProgressMode::lines) return batch % every_ == 0;
  return std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100);
}

void Progress::step(int64_t batch, int64_t step, double mean_loss, double rate, std::optional<double> accuracy) {
  if (mode_ == ProgressMode::off) return;
  const std::string figures = fmt::format("mean loss {:.4f}{} {:.1f} {}", mean_loss,
                                          accuracy ? fmt::format(" accuracy {:.1f}%", 100 * *accuracy) : "", rate, unit_);
  // The ETA extrapolates this run's own pace over the steps left (a resumed run starts part
  // way); the time spent validating so far counts in the pace.
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start_).count();
  const int64_t done = step - first_step_;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_steps_ - step) : 0;
  if (mode_ == ProgressMode::bar) {
    constexpr int64_t width = 24;
    const int64_t filled = batches_ > 0 ? std::clamp<int64_t>(width * batch / batches_, 0, width) : width;
    out_ << fmt::format("\repoch {}/{} [{}{}] {}/{} {} run ETA {}\x1b[K", epoch_ + 1, epochs_,
                        std::string(filled, '#'), std::string(width - filled, '.'), batch, batches_, figures,
                        clock_time(eta))
         << std::flush;
    open_line_ = true;
    last_draw_ = std::chrono::steady_clock::now();
  } else if (batch % every_ == 0 || batch == batches_) {
    out_ << fmt::format("epoch {}/{} step {}/{} {} run ETA {}\n", epoch_ + 1, epochs_, batch, batches_, figures,
                        clock_time(eta))
         << std::flush;
  }
}

void Progress::finish() {
  if (open_line_) out_ << '\n';
  open_line_ = false;
}

}  // namespace kiln::train
