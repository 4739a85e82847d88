#pragma once
// Learning-rate schedules (torch.optim.lr_scheduler's shapes) as pure functions of the
// step, and a Scheduler that writes them into an optimizer's groups.
#include <cstdint>
#include <memory>
#include <vector>

#include "optim/optimizer.h"

namespace kiln::optim {

// A schedule: the learning rate at `step` (0 = before the first update) for a group whose
// base learning rate is `base_lr`.
class LRSchedule {
 public:
  virtual ~LRSchedule() = default;
  virtual double lr(int64_t step, double base_lr) const = 0;
  // The multiplier of base_lr at `step`.
  double factor(int64_t step) const { return lr(step, 1.0); }
};

// Linear from start_factor * base_lr at step 0 to base_lr at warmup_steps, then constant
// (torch's LinearLR with end_factor 1).
class LinearWarmup : public LRSchedule {
 public:
  explicit LinearWarmup(int64_t warmup_steps, double start_factor = 0.0);
  double lr(int64_t step, double base_lr) const override;
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  int64_t warmup_steps_;
  double start_factor_;
};

// eta_min + (base_lr - eta_min) (1 + cos(pi t / T)) / 2 for t <= T, eta_min after
// (torch's CosineAnnealingLR, closed form).
class Cosine : public LRSchedule {
 public:
  explicit Cosine(int64_t total_steps, double eta_min = 0.0);
  double lr(int64_t step, double base_lr) const override;

 private:
  int64_t total_steps_;
  double eta_min_;
};

// base_lr (1 - t / T) for t <= T, 0 after: linear decay to zero (torch's LinearLR from
// factor 1 to 0 over T steps; after chain()'s warmup, Hugging Face's
// get_linear_schedule_with_warmup, the usual schedule for transformers).
class LinearDecay : public LRSchedule {
 public:
  explicit LinearDecay(int64_t total_steps);
  double lr(int64_t step, double base_lr) const override;

 private:
  int64_t total_steps_;
};

// base_lr * gamma^floor(t / step_size) (torch's StepLR).
class StepDecay : public LRSchedule {
 public:
  StepDecay(int64_t step_size, double gamma = 0.1);
  double lr(int64_t step, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// base_lr * gamma^(number of milestones <= t) (torch's MultiStepLR).
class MultiStep : public LRSchedule {
 public:
  MultiStep(std::vector<int64_t> milestones, double gamma = 0.1);
  double lr(int64_t step, double base_lr) const override;

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// torch's OneCycleLR (two phases, cosine annealing) with max_lr = base_lr: from
// base_lr / div_factor up to base_lr over pct_start * total_steps - 1 steps, then down to
// base_lr / (div_factor * final_div_factor) at step total_steps - 1 (held after).
class OneCycle : public LRSchedule {
 public:
  explicit OneCycle(int64_t total_steps, double pct_start = 0.3, double div_factor = 25.0,
                    double final_div_factor = 1e4);
  double lr(int64_t step, double base_lr) const override;

 private:
  int64_t total_steps_;
  double pct_start_, div_factor_, final_div_factor_;
};

// schedules[i] runs from milestones[i - 1] on, seeing steps counted from its milestone
// (torch's SequentialLR); milestones.size() == schedules.size() - 1, increasing.
class Sequential : public LRSchedule {
 public:
  Sequential(std::vector<std::shared_ptr<LRSchedule>> schedules, std::vector<int64_t> milestones);
  double lr(int64_t step, double base_lr) const override;

 private:
  std::vector<std::shared_ptr<LRSchedule>> schedules_;
  std::vector<int64_t> milestones_;
};

// A linear warmup over warmup_steps, then `after` counted from the end of the warmup.
std::shared_ptr<LRSchedule> chain(int64_t warmup_steps, std::shared_ptr<LRSchedule> after,
                                  double warmup_start_factor = 0.0);

// Applies a schedule to every group of an optimizer: on construction each group's lr
// becomes schedule(0, its lr then), and each step() advances one step.
class Scheduler {
 public:
  Scheduler(Optimizer& optimizer, std::shared_ptr<LRSchedule> schedule);
  // Advances to the next step and writes the new lr into every group.
  void step();
  int64_t last_step() const { return step_; }
  // Jumps to `step` (>= 0) and writes its lr, as after that many step() calls: resuming
  // from a checkpoint.
  void set_step(int64_t step);
  // The lr of each group now.
  std::vector<double> last_lr() const;
  const std::vector<double>& base_lrs() const { return base_lrs_; }

 private:
  void apply();
  Optimizer& optimizer_;
  std::shared_ptr<LRSchedule> schedule_;
  std::vector<double> base_lrs_;
  int64_t step_ = 0;
};

enum class ScaleRule { linear, sqrt };
// The learning rate for `batch` given one tuned for `base_batch`: scaled by batch / base_batch
// (linear) or its square root (sqrt).
double scale_lr(double base_lr, int64_t base_batch, int64_t batch, ScaleRule rule = ScaleRule::linear);

}  // namespace kiln::optim
