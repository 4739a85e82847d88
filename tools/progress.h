#pragma once
// kiln-train's progress output: a bar redrawn in place on a terminal, or one plain line
// every N steps (for logs and CI).
#include <chrono>
#include <cstdint>
#include <iosfwd>

namespace kiln::train {

enum class ProgressMode { off, bar, lines };

class Progress {
 public:
  Progress(std::ostream& out, ProgressMode mode, int64_t every);
  // A new epoch (from 0) of `batches` batches.
  void start_epoch(int64_t epoch, int64_t epochs, int64_t batches);
  // Batch `batch` (counted from 1 within the epoch) is done.
  void step(int64_t batch, double loss, double images_per_second);
  // Ends the bar's line.
  void finish();

 private:
  std::ostream& out_;
  ProgressMode mode_;
  int64_t every_;
  int64_t epoch_ = 0, epochs_ = 0, batches_ = 0, first_batch_ = -1;
  std::chrono::steady_clock::time_point start_;
  bool open_line_ = false;
};

}  // namespace kiln::train
