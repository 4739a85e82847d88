// Learning-rate schedules against their closed forms, composition, the Scheduler and scale_lr.
#include <cmath>
#include <numbers>

#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using optim::LRSchedule;

namespace {
constexpr double kTol = 1e-15;  // closed forms evaluated the same way: only rounding differs
const double pi = std::numbers::pi;

void require_lrs(const LRSchedule& schedule, double base_lr,
                 const std::vector<std::pair<int64_t, double>>& expected, double tol = kTol) {
  for (const auto& [step, lr] : expected) {
    INFO("step " << step);
    REQUIRE(schedule.lr(step, base_lr) == Approx(lr).margin(tol).epsilon(1e-13));
  }
}
}  // namespace

TEST_CASE("LinearWarmup rises linearly then holds", "[optim]") {
  require_lrs(optim::LinearWarmup(4), 0.1, {{0, 0.0}, {1, 0.025}, {2, 0.05}, {3, 0.075}, {4, 0.1}, {9, 0.1}});
  // torch's LinearLR defaults: start_factor 1/3 over 5 steps.
  require_lrs(optim::LinearWarmup(5, 1.0 / 3), 0.3, {{0, 0.1}, {1, 0.3 * (1.0 / 3 + 2.0 / 15)}, {5, 0.3}});
  REQUIRE(optim::LinearWarmup(4).factor(2) == 0.5);
}

TEST_CASE("Cosine anneals to eta_min", "[optim]") {
  optim::Cosine cosine(10, 0.01);
  require_lrs(cosine, 0.1, {{0, 0.1}, {5, 0.055}, {10, 0.01}, {12, 0.01},
                            {3, 0.01 + 0.09 * (1 + std::cos(pi * 0.3)) / 2}});
}

TEST_CASE("LinearDecay falls linearly to zero, after a warmup as Hugging Face's linear schedule", "[optim]") {
  require_lrs(optim::LinearDecay(4), 0.1, {{0, 0.1}, {1, 0.075}, {2, 0.05}, {4, 0.0}, {7, 0.0}});
  // get_linear_schedule_with_warmup(warmup 2, total 10): t / 2 up to step 2, then (10 - t) / 8.
  auto warm = optim::chain(2, std::make_shared<optim::LinearDecay>(8));
  require_lrs(*warm, 1.0, {{0, 0.0}, {1, 0.5}, {2, 1.0}, {3, 7.0 / 8}, {6, 0.5}, {10, 0.0}, {11, 0.0}});
  REQUIRE_THROWS_AS(optim::LinearDecay(0), Error);
}

TEST_CASE("StepDecay and MultiStep multiply by gamma", "[optim]") {
  require_lrs(optim::StepDecay(3, 0.5), 1.0, {{0, 1.0}, {2, 1.0}, {3, 0.5}, {5, 0.5}, {6, 0.25}});
  require_lrs(optim::MultiStep({5, 2}, 0.1), 1.0, {{1, 1.0}, {2, 0.1}, {4, 0.1}, {5, 0.01}, {50, 0.01}});
}

TEST_CASE("OneCycle follows torch's two cosine phases", "[optim]") {
  // 100 steps, pct_start 0.3: up from 1/25 to 1 at step 29, down to 1/25/1e4 at step 99.
  optim::OneCycle one_cycle(100);
  const double initial = 1.0 / 25, final_lr = initial / 1e4;
  const auto anneal = [](double start, double end, double pct) {
    return end + (start - end) / 2 * (std::cos(pi * pct) + 1);
  };
  require_lrs(one_cycle, 1.0, {{0, initial}, {10, anneal(initial, 1.0, 10.0 / 29)}, {29, 1.0},
                               {64, (1.0 + final_lr) / 2}, {80, anneal(1.0, final_lr, 51.0 / 70)},
                               {99, final_lr}, {120, final_lr}});
  REQUIRE_THROWS_AS(optim::OneCycle(100, 1.5), Error);
}

TEST_CASE("Sequential and chain compose schedules", "[optim]") {
  // Warmup over 3 steps, then a cosine over 10 counted from step 3.
  auto warm_cosine = optim::chain(3, std::make_shared<optim::Cosine>(10));
  require_lrs(*warm_cosine, 1.0, {{0, 0.0}, {1, 1.0 / 3}, {3, 1.0}, {8, 0.5}, {13, 0.0}});
  optim::Sequential three({std::make_shared<optim::LinearWarmup>(2), std::make_shared<optim::StepDecay>(1, 0.5),
                           std::make_shared<optim::LinearWarmup>(0)},
                          {2, 4});
  require_lrs(three, 2.0, {{1, 1.0}, {2, 2.0}, {3, 1.0}, {4, 2.0}, {9, 2.0}});
  REQUIRE_THROWS_AS(optim::Sequential({std::make_shared<optim::LinearWarmup>(2)}, {3}), Error);
}

TEST_CASE("Scheduler writes the schedule into every group and the step uses it", "[optim]") {
  Tensor a = from_vector<double>({0.0}).requires_grad_(), b = from_vector<double>({0.0}).requires_grad_();
  optim::SGD sgd(std::vector<optim::ParamGroupSpec>{{{a}, {}}, {{b}, {{"lr", 0.2}}}}, {.lr = 0.1});
  optim::Scheduler scheduler(sgd, std::make_shared<optim::LinearWarmup>(2));
  REQUIRE(scheduler.last_lr() == std::vector<double>{0.0, 0.0});  // step 0 applied at construction
  scheduler.step();
  REQUIRE(scheduler.last_step() == 1);
  REQUIRE(scheduler.last_lr()[0] == Approx(0.05).epsilon(1e-15));
  REQUIRE(scheduler.last_lr()[1] == Approx(0.1).epsilon(1e-15));
  a.set_grad(from_vector<double>({1.0}));
  b.set_grad(from_vector<double>({1.0}));
  sgd.step();
  REQUIRE(a.item<double>() == Approx(-0.05).epsilon(1e-15));
  REQUIRE(b.item<double>() == Approx(-0.1).epsilon(1e-15));
  scheduler.step();
  REQUIRE(scheduler.last_lr() == std::vector<double>{0.1, 0.2});
  REQUIRE(scheduler.base_lrs() == std::vector<double>{0.1, 0.2});
  scheduler.set_step(1);  // as a resumed run does
  REQUIRE(scheduler.last_step() == 1);
  REQUIRE(scheduler.last_lr()[0] == Approx(0.05).epsilon(1e-15));
  REQUIRE_THROWS_AS(scheduler.set_step(-1), Error);
}

TEST_CASE("scale_lr scales linearly or by the square root", "[optim]") {
  REQUIRE(optim::scale_lr(0.1, 256, 1024) == Approx(0.4).epsilon(1e-15));
  REQUIRE(optim::scale_lr(0.1, 256, 1024, optim::ScaleRule::sqrt) == Approx(0.2).epsilon(1e-15));
  REQUIRE_THROWS_AS(optim::scale_lr(0.1, 0, 8), Error);
}
