#pragma once
// kiln-train's progress output: a bar redrawn in place on a terminal, or one plain line
// every N steps (for logs and CI). Each shows the epoch's running mean loss and the time
// left of the whole run.
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

namespace kiln::train {

enum class ProgressMode { off, bar, lines };

class Progress {
 public:
  // `unit` names the rate: "img/s", or "tok/s" for the transformers.
  Progress(std::ostream& out, ProgressMode mode, int64_t every, std::string unit = "img/s");
  // The run goes from step `first_step` (done before: a resumed run) to `total_steps`.
  void start_run(int64_t first_step, int64_t total_steps);
  // A new epoch (from 0) of `batches` batches.
  void start_epoch(int64_t epoch, int64_t epochs, int64_t batches);
  // Batch `batch` (counted from 1 within the epoch), the run's step `step` (from 1), is
  // done; `mean_loss` is the epoch's mean loss so far, `accuracy` (shown when given) its
  // accuracy so far, `rate` the epoch's samples (or tokens) per second.
  void step(int64_t batch, int64_t step, double mean_loss, double rate, std::optional<double> accuracy = {});
  // Whether step(batch, ...) would show anything: every `every` batches and the epoch's last
  // in lines mode; on a terminal at most every 0.1 s and at the epoch's last batch. The
  // caller reads the step's numbers from the device only then.
  bool due(int64_t batch) const;
  // Ends the bar's line.
  void finish();

 private:
  std::ostream& out_;
  ProgressMode mode_;
  int64_t every_;
  std::string unit_;
  int64_t epoch_ = 0, epochs_ = 0, batches_ = 0;
  int64_t first_step_ = 0, total_steps_ = 0;
  std::chrono::steady_clock::time_point run_start_ = std::chrono::steady_clock::now();
  bool open_line_ = false;
  std::chrono::steady_clock::time_point last_draw_{};  // the bar's last redraw
};

}  // namespace kiln::train
