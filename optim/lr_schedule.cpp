#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "core/error.h"

namespace kiln::optim {

LinearWarmup::LinearWarmup(int64_t warmup_steps, double start_factor)
    : warmup_steps_(warmup_steps), start_factor_(start_factor) {
  KILN_CHECK(warmup_steps >= 0, "LinearWarmup: warmup_steps must be >= 0, got {}", warmup_steps);
}

double LinearWarmup::lr(int64_t step, double base_lr) const {
  if (step >= warmup_steps_) return base_lr;
  const double progress = static_cast<double>(std::max<int64_t>(step, 0)) / static_cast<double>(warmup_steps_);
  return base_lr * (start_factor_ + (1.0 - start_factor_) * progress);
}

Cosine::Cosine(int64_t total_steps, double eta_min) : total_steps_(total_steps), eta_min_(eta_min) {
  KILN_CHECK(total_steps > 0, "Cosine: total_steps must be positive, got {}", total_steps);
}

double Cosine::lr(int64_t step, double base_lr) const {
  if (step >= total_steps_) return eta_min_;
  const double t = static_cast<double>(std::max<int64_t>(step, 0)) / static_cast<double>(total_steps_);
  return eta_min_ + (base_lr - eta_min_) * (1.0 + std::cos(std::numbers::pi * t)) / 2.0;
}

LinearDecay::LinearDecay(int64_t total_steps) : total_steps_(total_steps) {
  KILN_CHECK(total_steps > 0, "LinearDecay: total_steps must be positive, got {}", total_steps);
}

double LinearDecay::lr(int64_t step, double base_lr) const {
  if (step >= total_steps_) return 0.0;
  return base_lr * static_cast<double>(total_steps_ - std::max<int64_t>(step, 0)) / static_cast<double>(total_steps_);
}

StepDecay::StepDecay(int64_t step_size, double gamma) : step_size_(step_size), gamma_(gamma) {
  KILN_CHECK(step_size > 0, "StepDecay: step_size must be positive, got {}", step_size);
}

double StepDecay::lr(int64_t step, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(std::max<int64_t>(step, 0) / step_size_));
}

MultiStep::MultiStep(std::vector<int64_t> milestones, double gamma)
    : milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
}

double MultiStep::lr(int64_t step, double base_lr) const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), step) - milestones_.begin();
  return base_lr * std::pow(gamma_, static_cast<double>(passed));
}

OneCycle::OneCycle(int64_t total_steps, double pct_start, double div_factor, double final_div_factor)
    : total_steps_(total_steps), pct_start_(pct_start), div_factor_(div_factor),
      final_div_factor_(final_div_factor) {
  KILN_CHECK(total_steps > 1, "OneCycle: total_steps must be > 1, got {}", total_steps);
  KILN_CHECK(pct_start > 0 && pct_start < 1, "OneCycle: pct_start must be in (0, 1), got {}", pct_start);
  KILN_CHECK(pct_start * static_cast<double>(total_steps) - 1 > 0 &&
                 pct_start * static_cast<double>(total_steps) < static_cast<double>(total_steps - 1),
             "OneCycle: pct_start {} leaves an empty phase over {} steps", pct_start, total_steps);
}

double OneCycle::lr(int64_t step, double base_lr) const {
  // Cosine from `start` (pct 0) to `end` (pct 1).
  const auto anneal = [](double start, double end, double pct) {
    return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
  };
  const double initial = base_lr / div_factor_, min_lr = initial / final_div_factor_;
  const double peak_step = pct_start_ * static_cast<double>(total_steps_) - 1.0;
  const double last_step = static_cast<double>(total_steps_ - 1);
  const double t = std::clamp(static_cast<double>(step), 0.0, last_step);
  if (t <= peak_step) return anneal(initial, base_lr, t / peak_step);
  return anneal(base_lr, min_lr, (t - peak_step) / (last_step - peak_step));
}

Sequential::Sequential(std::vector<std::shared_ptr<LRSchedule>> schedules, std::vector<int64_t> milestones)
    : schedules_(std::move(schedules)), milestones_(std::move(milestones)) {
  KILN_CHECK(!schedules_.empty() && milestones_.size() + 1 == schedules_.size(),
             "Sequential: needs one milestone fewer than schedules, got {} schedules and {} milestones",
             schedules_.size(), milestones_.size());
  for (const auto& s : schedules_) KILN_CHECK(s != nullptr, "Sequential: a schedule is null");
  KILN_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()),
             "Sequential: milestones must increase");
}

double Sequential::lr(int64_t step, double base_lr) const {
  const size_t index = std::upper_bound(milestones_.begin(), milestones_.end(), step) - milestones_.begin();
  const int64_t start = index == 0 ? 0 : milestones_[index - 1];
  return schedules_[index]->lr(step - start, base_lr);
}

std::shared_ptr<LRSchedule> chain(int64_t warmup_steps, std::shared_ptr<LRSchedule> after,
                                  double warmup_start_factor) {
  return std::make_shared<Sequential>(
      std::vector<std::shared_ptr<LRSchedule>>{
          std::make_shared<LinearWarmup>(warmup_steps, warmup_start_factor), std::move(after)},
      std::vector<int64_t>{warmup_steps});
}

Scheduler::Scheduler(Optimizer& optimizer, std::shared_ptr<LRSchedule> schedule)
    : optimizer_(optimizer), schedule_(std::move(schedule)) {
  KILN_CHECK(schedule_ != nullptr, "Scheduler: the schedule is null");
  for (const auto& group : optimizer_.param_groups()) base_lrs_.push_back(group.lr());
  apply();
}

void Scheduler::step() {
  ++step_;
  apply();
}

void Scheduler::set_step(int64_t step) {
  KILN_CHECK(step >= 0, "Scheduler::set_step: step {} is negative", step);
  step_ = step;
  apply();
}

void Scheduler::apply() {
  auto& groups = optimizer_.param_groups();
  KILN_CHECK(groups.size() == base_lrs_.size(),
             "Scheduler: the optimizer had {} groups when the scheduler was made, now {}",
             base_lrs_.size(), groups.size());
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_lr(schedule_->lr(step_, base_lrs_[g]));
}

std::vector<double> Scheduler::last_lr() const {
  std::vector<double> lrs;
  for (const auto& group : optimizer_.param_groups()) lrs.push_back(group.lr());
  return lrs;
}

double scale_lr(double base_lr, int64_t base_batch, int64_t batch, ScaleRule rule) {
  KILN_CHECK(base_batch > 0 && batch > 0, "scale_lr: batch sizes must be positive, got {} and {}",
             base_batch, batch);
  const double ratio = static_cast<double>(batch) / static_cast<double>(base_batch);
  return base_lr * (rule == ScaleRule::linear ? ratio : std::sqrt(ratio));
}

}  // namespace kiln::optim
