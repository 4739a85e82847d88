// A whole mixed-precision training step compiled: forward under autocast, the loss scaled,
// gradients unscaled and clipped, the optimizer step skipped on overflow, the scale
// updated. One graph (fullgraph: no host read anywhere), replayed for clean and overflowing
// steps alike, equal to the same steps run eagerly.
#include <algorithm>
#include <limits>

#include "compiler/compile.h"
#include "core/autocast.h"
#include "core/registry.h"
#include "models/small_models.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using Args = std::vector<Tensor>;

namespace {

struct AmpTrainer {
  std::shared_ptr<models::MLP> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  optim::GradScaler scaler{{.init_scale = 1024, .growth_interval = 2}};

  explicit AmpTrainer(bool adamw) {
    manual_seed(21);
    model = std::make_shared<models::MLP>(std::vector<int64_t>{4, 8, 3});
    if (adamw) optimizer = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 0.01});
    else optimizer = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    step({batch(0)});  // an eager step first: the optimizer's state exists before tracing
  }

  Args step(const Args& a) {
    optimizer->zero_grad(false);  // in place: a .grad cleared to none would change the guard
    Tensor loss;
    {
      autocast amp;
      loss = mse_loss((*model)(a[0]), cos(a[0].narrow(1, 0, 3)));
    }
    scaler.scale(loss).backward();
    scaler.unscale_(*optimizer);
    const Tensor norm = optim::clip_grad_norm_(model->parameters(), 0.5);
    scaler.step(*optimizer);
    scaler.update();
    return {loss.detach(), norm};
  }

  // Step s's batch; step 3's holds an infinity, so its gradients overflow.
  static Tensor batch(int s) {
    Tensor x = sin(arange(24).reshape({6, 4}) * (0.3 + 0.1 * s));
    if (s == 3) x.select(0, 2).select(0, 1).fill_(std::numeric_limits<double>::infinity());
    return x;
  }
};

// Compiled, a bf16 GEMM's weight gradient comes out in f32 (the cast fused into the GEMM,
// docs/compiler.md), where eager rounds it to bf16 first: the gradients differ by one bf16
// rounding (2^-8 relative), and six steps of updates by a few of those. 2^-5 of the
// tensor's largest value holds that, and still catches a step applied twice, skipped
// wrongly or unscaled twice (the moments would differ by their whole size).
void check_close(const Tensor& actual, const Tensor& expected) {
  const double scale = std::max(amax(abs(expected)).item<double>(), 1e-30);
  KILN_CHECK_CLOSE(actual, expected, 0.0, scale / 32);
}

void check_compiled_amp_steps(bool adamw) {
  AmpTrainer compiled_trainer(adamw), eager_trainer(adamw);
  compiler::CompiledFunction compiled =
      compiler::compile([&](const Args& a) { return compiled_trainer.step(a); }, {.fullgraph = true});
  int reads = 0;
  for (int s = 1; s <= 6; ++s) {
    INFO("step " << s);
    const Args args{AmpTrainer::batch(s)};
    const Args out = compiled(args);
    const Args expected = eager_trainer.step(args);
    if (s != 3) check_close(out[0], expected[0]);
    CHECK(compiled_trainer.scaler.get_scale() == eager_trainer.scaler.get_scale());
    CHECK(compiled_trainer.scaler.growth_tracker() == eager_trainer.scaler.growth_tracker());
    const auto a = compiled_trainer.model->named_parameters(), b = eager_trainer.model->named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      check_close(a[i].second.detach(), b[i].second.detach());
      for (const auto& [key, t] : compiled_trainer.optimizer->state(a[i].second)) {
        INFO(key);
        check_close(t, eager_trainer.optimizer->state(b[i].second).at(key));
      }
    }
    ++reads;
  }
  // Growth every 2 clean steps, counting the warm-up: 2048 after step 1, halved to 1024 by
  // step 3's overflow, 2048 again after step 5.
  CHECK(eager_trainer.scaler.get_scale() == 2048.0);
  CHECK(compiled.recompiles() == 0);
  CHECK(compiled.graph_breaks() == 0);
  CHECK(compiled.calls() == reads);
  REQUIRE(compiled.traces().size() == 1);
  int unscales = 0, updates = 0;
  for (const compiler::Node& n : compiled.traces()[0]->graph.nodes()) {
    unscales += n.op == "amp_unscale";
    updates += n.op == "amp_update_scale";
  }
  CHECK(unscales == 1);
  CHECK(updates == 1);
}

}  // namespace

TEST_CASE("a compiled AMP step with SGD equals the eager one and skips overflows", "[compile][amp]") {
  check_compiled_amp_steps(false);
}

TEST_CASE("a compiled AMP step with AdamW equals the eager one and skips overflows", "[compile][amp]") {
  check_compiled_amp_steps(true);
}
