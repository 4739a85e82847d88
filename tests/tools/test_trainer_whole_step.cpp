// kiln-train's whole-step graph (tools/whole_step.cpp): the optimizer step with its
// micro-steps and update compiled as one function gives the eager step's losses, counts
// and weights, for a class per sample and for per-token targets with padding masks; the
// learning rate a schedule writes between steps reaches the graph without a recompile;
// the loss scaler skips an overflowing step inside the graph, and clipping holds there;
// kiln-train --compile-whole-step trains as eager does (SGD, AdamW, clipping, the
// transformers); choose_step_graph's choices; the flag's parsing.
//
// Tolerances: in f64 the compiled kernels sum the same terms as the eager ones in other
// orders; the longest sum is BERT-tiny's 128-wide hidden layer (or the 40-token vocabulary,
// the batch's 6 rows): within summation_bound(128, 2^-53) = 2.8e-14 per step, which four
// steps of momentum SGD (lr at most 0.5) compound to under 1e-12. The f32 runs compare
// with the bounds the compiled-against-eager tests of test_trainer.cpp and
// test_trainer_text.cpp derive for the same configurations.
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "compiler/compile.h"
#include "core/cuda.h"
#include "data/dataset.h"
#include "models/bert.h"
#include "models/small_models.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tolerance.h"
#include "tools/trainer_testing.h"

using namespace kiln;
using namespace kiln::testing;
using Catch::Matchers::Contains;

namespace {

constexpr double kF64Steps = 1e-12;
// test_trainer.cpp's bound for small_cnn() compiled against eager (its 1152-term sums).
constexpr double kSmallCnnSums = summation_bound(128 * 3 * 3);

struct Batch {
  Tensor input, target, mask;
};

// Ids [6, 9] in [5, 40) with padding at the end of rows 1 and 2, and per-token targets at a
// few positions that move with `seed` (row 1 predicts nothing; kIgnoreIndex elsewhere).
Batch token_batch(uint64_t seed) {
  const TokenBatch b = testing::token_batch(6, 9, 40, seed, [seed](int64_t i, int64_t j) {
    return (i + 2 * j + static_cast<int64_t>(seed)) % 4 == 0;
  });
  return {b.ids, b.targets, b.mask};
}

Batch image_batch(uint64_t seed) {
  Generator gen(seed);
  return {randn({6, 1, 4, 4}, {.dtype = DType::f64}, &gen), randint(0, 4, {6}, {}, &gen), Tensor()};
}

// image_batch, but the third step's (seed 5) has an infinite pixel: its gradients overflow.
Batch image_batch_overflowing(uint64_t seed) {
  Batch b = image_batch(seed);
  if (seed == 5) b.input.data_ptr<double>()[7] = std::numeric_limits<double>::infinity();
  return b;
}

struct Steps {
  std::vector<train::StepStats> stats;
  StateDict model;
  int64_t graphs = 0, recompiles = 0;
};

// Four optimizer steps of `model` (f64) in micro-batches of 2, the lr changed before each:
// with `whole`, the first (which makes the optimizer's state) through whole_step_function
// called eagerly and the others through it compiled (fullgraph: no break allowed), else all
// of them by train_step.
Steps four_steps(nn::Module& model, optim::Optimizer& optimizer, Batch (*batch)(uint64_t), bool whole,
                 const train::Precision& precision = {}) {
  const optim::Accumulation accumulation({.batch = 6, .micro_batch = 2});
  const compiler::TracedFunction eager_whole =
      train::whole_step_function(model, optimizer, accumulation, 0.1, precision);
  std::optional<compiler::CompiledFunction> compiled;
  if (whole) compiled = compiler::compile(eager_whole, {.fullgraph = true});
  Steps out;
  for (uint64_t step = 0; step < 4; ++step) {
    optimizer.param_groups().front().set_lr(0.5 / static_cast<double>(step + 1));
    const Batch b = batch(step + 3);
    if (!whole)
      out.stats.push_back(
          train::train_step(model, optimizer, accumulation, b.input, b.target, 0.1, precision, nullptr, b.mask));
    else if (step == 0)
      out.stats.push_back(train::train_step_whole(eager_whole, b.input, b.target, b.mask));
    else
      out.stats.push_back(train::train_step_whole([&](const std::vector<Tensor>& a) { return (*compiled)(a); },
                                                  b.input, b.target, b.mask));
  }
  out.model = model.state_dict();
  if (compiled) {
    out.graphs = compiled->cache_size();
    out.recompiles = compiled->recompiles();
  }
  return out;
}

void check_same_steps(const Steps& whole, const Steps& eager) {
  REQUIRE(whole.stats.size() == eager.stats.size());
  for (size_t i = 0; i < eager.stats.size(); ++i) {
    INFO("step " << i);
    if (std::isfinite(eager.stats[i].loss)) CHECK(whole.stats[i].loss == Approx(eager.stats[i].loss).epsilon(kF64Steps));
    else CHECK_FALSE(std::isfinite(whole.stats[i].loss));
    CHECK(whole.stats[i].correct == eager.stats[i].correct);
    CHECK(whole.stats[i].samples == eager.stats[i].samples);
    CHECK(whole.stats[i].predicted == eager.stats[i].predicted);
  }
  CHECK(relative_difference(whole.model, eager.model) <= kF64Steps);
  // The eager first step leaves .grad defined: one graph, and the lr written between steps
  // is an input of it, not a reason to trace again.
  CHECK(whole.graphs == 1);
  CHECK(whole.recompiles == 0);
}

// Every step's loss of a compiled run within `epsilon` (relative) of the eager run's.
void check_step_losses(const train::Result& compiled, const train::Result& eager, double epsilon) {
  REQUIRE(compiled.step_losses.size() == eager.step_losses.size());
  for (size_t i = 0; i < eager.step_losses.size(); ++i)
    CHECK(compiled.step_losses[i] == Approx(eager.step_losses[i]).epsilon(epsilon));
}

std::string run_printing(const train::Config& c, train::Result& result) {
  std::ostringstream out;
  train::Config loud = c;
  loud.quiet = false;
  result = train::run(loud, out);
  return out.str();
}

}  // namespace

TEST_CASE("whole step: per-token targets with masks give the eager step's losses and weights in f64",
          "[trainer][whole_step]") {
  models::BertConfig config = models::BertConfig::tiny(40);
  config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0;
  auto steps = [&](bool whole) {
    manual_seed(5);
    models::BertForMaskedLM model(config);
    model.to(DType::f64);
    optim::SGD sgd(model.parameters(), {.lr = 0.5, .momentum = 0.9, .weight_decay = 1e-3});
    return four_steps(model, sgd, token_batch, whole);
  };
  const Steps eager = steps(false), whole = steps(true);
  // Row 1 predicts nothing, the others a few tokens each: the loss is their mean.
  for (const train::StepStats& s : eager.stats) CHECK(s.predicted > 0);
  check_same_steps(whole, eager);
}

TEST_CASE("whole step: a class per sample gives the eager step's losses and weights in f64, SGD and AdamW",
          "[trainer][whole_step]") {
  // AdamW capturable too (kiln-train's on a GPU): its step counts are state the graph bumps.
  for (const char* which : {"sgd", "adamw", "adamw capturable"}) {
    INFO(which);
    const std::string name = which;
    auto steps = [&](bool whole) {
      manual_seed(6);
      models::MLP model({16, 8, 4});
      model.to(DType::f64);
      std::unique_ptr<optim::Optimizer> optimizer;
      if (name != "sgd")
        optimizer = std::make_unique<optim::AdamW>(
            model.parameters(), optim::AdamWOptions{.lr = 0.5, .capturable = name == "adamw capturable"});
      else optimizer = std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions{.lr = 0.5, .momentum = 0.9});
      return four_steps(model, *optimizer, image_batch, whole);
    };
    const Steps eager = steps(false), whole = steps(true);
    for (const train::StepStats& s : eager.stats) CHECK(s.predicted == 6);
    check_same_steps(whole, eager);
  }
}

TEST_CASE("whole step: the loss scaler skips an overflowing step and clipping holds inside the graph, in f64",
          "[trainer][whole_step]") {
  // The scale multiplies the loss, unscale finds the infinite gradients of the third step,
  // the update is skipped (parameters and momentum as they were: a graph that stepped would
  // carry NaN into every weight) and the scale backs off; clipping at 0.5 binds on the
  // other steps. All of it read on the device at each replay, not decided at the trace.
  // Capturable AdamW: the skipped step leaves its step counts too, bumped by 1 - found_inf
  // in the graph.
  for (const bool adamw : {false, true}) {
    INFO((adamw ? "adamw capturable" : "sgd"));
    auto steps = [&](bool whole) {
      manual_seed(6);
      models::MLP model({16, 8, 4});
      model.to(DType::f64);
      std::unique_ptr<optim::Optimizer> optimizer;
      if (adamw) optimizer = std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = 0.5, .capturable = true});
      else optimizer = std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions{.lr = 0.5, .momentum = 0.9});
      optim::GradScaler scaler;
      Steps out =
          four_steps(model, *optimizer, image_batch_overflowing, whole, {.scaler = &scaler, .clip_grad_norm = 0.5});
      CHECK(scaler.get_scale() == 32768.0);  // backed off once, from 2^16
      if (adamw)
        for (const Tensor& p : model.parameters()) CHECK(optimizer->state(p).at("step").item<double>() == 3.0);
      return out;
    };
    const Steps eager = steps(false), whole = steps(true);
    CHECK_FALSE(std::isfinite(eager.stats[2].loss));
    check_same_steps(whole, eager);
  }
}

TEST_CASE("whole step: kiln-train --compile-whole-step trains like eager", "[trainer][whole_step]") {
  struct Variant {
    const char* name;
    void (*set)(train::Config&);
  };
  const Variant variants[] = {
      {"sgd, cosine", [](train::Config&) {}},
      {"adamw", [](train::Config& c) { c.optimizer = "adamw", c.lr = 1e-3; }},
      {"clipped", [](train::Config& c) { c.clip_grad_norm = 0.5; }},
  };
  // Not --amp fp16 here: its compiled steps, micro-steps and whole step alike, part from the
  // eager run by more than these f32 bounds (f16 roundings of values summed in another order
  // flip: 2.4e-3 normwise after the 10 steps, measured for both), so the scaler is checked
  // in f64 above.
  for (const Variant& v : variants) {
    INFO(v.name);
    train::Config c = small_cnn();
    v.set(c);
    const train::Result eager = run(c);
    c.compile = true;
    c.compile_whole_step = true;
    train::Result whole;
    const std::string printed = run_printing(c, whole);
    CHECK_THAT(printed, Contains("compiled step: the whole step as one graph (--compile-whole-step)"));
    // The first step eager (the optimizer's state), then one graph for the 9 steps of one
    // batch shape: the schedule's lr is no reason to trace again, nothing breaks the graph.
    CHECK_THAT(printed, Contains("compiled: 1 training graphs of the whole step (0 recompiles), "));
    check_step_losses(whole, eager, kSmallCnnSums);
    CHECK(relative_difference(whole.model, eager.model) <= kSmallCnnSums);
    REQUIRE(whole.epochs.size() == eager.epochs.size());
    for (size_t e = 0; e < eager.epochs.size(); ++e) {
      CHECK(whole.epochs[e].train_loss == Approx(eager.epochs[e].train_loss).epsilon(kSmallCnnSums));
      CHECK(whole.epochs[e].train_accuracy == eager.epochs[e].train_accuracy);
    }
  }
}

TEST_CASE("whole step: kiln-train --compile-whole-step trains the transformers like eager", "[trainer][whole_step][text]") {
  // small_bert (trainer_testing.h): bert-tiny masked LM with AdamW, clipping, dropout (the
  // same Philox numbers in both) and test_trainer_text.cpp's bound, summation_bound(512).
  train::Config c = small_bert();
  const train::Result eager = run(c);
  c.compile = true;
  c.compile_whole_step = true;
  train::Result whole;
  CHECK_THAT(run_printing(c, whole), Contains("compiled: 1 training graphs of the whole step (0 recompiles), "));
  check_step_losses(whole, eager, summation_bound(512));
  CHECK(relative_difference(whole.model, eager.model) <= summation_bound(512));
}

TEST_CASE("whole step: which step graph kiln-train compiles, and why", "[trainer][whole_step]") {
  train::Config c;
  CHECK(train::choose_step_graph(c, 1).why == "eager");
  c.compile = true;
  CHECK_FALSE(train::choose_step_graph(c, 1).whole);  // the CPU's default
  CHECK_THAT(train::choose_step_graph(c, 1).why, Contains("--compile-whole-step asks for it"));
  c.compile_mode = "reduce-overhead";
  CHECK_FALSE(train::choose_step_graph(c, 1).whole);  // no CUDA graphs on the CPU
  c.device = "cuda";
  // Both optimizers: AdamW's update, capturable, reads nothing on the host either.
  for (const char* optimizer : {"sgd", "adamw"}) {
    c.optimizer = optimizer;
    for (const char* mode : {"reduce-overhead", "max-autotune"}) {
      c.compile_mode = mode;
      CHECK(train::choose_step_graph(c, 1).whole);
      CHECK_THAT(train::choose_step_graph(c, 1).why, Contains("one CUDA graph replay per optimizer step") &&
                                                          Contains("the " + std::string(optimizer) + " update"));
    }
  }
  c.optimizer = "sgd";
  // Data parallel keeps the micro-steps (the all-reduce is eager hooks), forced or not.
  CHECK_FALSE(train::choose_step_graph(c, 2).whole);
  c.compile_whole_step = true;
  CHECK_FALSE(train::choose_step_graph(c, 2).whole);
  CHECK_THAT(train::choose_step_graph(c, 2).why, Contains("--compile-whole-step does not apply"));
  c.device = "cpu";
  c.compile_mode = "default";
  CHECK(train::choose_step_graph(c, 1).whole);
}

TEST_CASE("whole step: --compile-whole-step is parsed and needs --compile", "[trainer][whole_step][train_args]") {
  const char* with[] = {"kiln-train", "--compile", "--compile-whole-step"};
  CHECK(train::parse_args(3, with).compile_whole_step);
  const char* without[] = {"kiln-train", "--compile-whole-step"};
  CHECK_THROWS_WITH(train::parse_args(2, without), Contains("--compile-whole-step needs --compile"));
  CHECK_THAT(train::usage(), Contains("--compile-whole-step"));
}

TEST_CASE("whole step: on a GPU, reduce-overhead replays one captured graph per optimizer step",
          "[trainer][whole_step][cuda]") {
  // Needs a GPU (none has run it yet). The whole step with the optimizer's hyperparameters
  // (and AdamW's step counts, capturable) on the device: captured once (after its warm-up
  // run), replayed for every later step, and the cosine schedule's lr reaching every
  // replay: the losses follow the eager GPU run's as the micro-step runs do in
  // test_trainer.cpp (cuDNN's and cuBLAS's orders of sums).
  for (const char* optimizer : {"sgd", "adamw"}) {
    INFO(optimizer);
    train::Config c = small_cnn();
    c.device = "cuda";
    c.optimizer = optimizer;
    if (c.optimizer == "adamw") c.lr = 1e-3;
    if (!cuda::is_available()) {
      REQUIRE_THROWS_WITH(run(c), Contains("--device cuda: CUDA is not available"));
      return;
    }
    const train::Result eager = run(c);
    c.compile = true;
    c.compile_mode = "reduce-overhead";
    train::Result graphed;
    const std::string printed = run_printing(c, graphed);
    CHECK_THAT(printed, Contains("compiled step: the whole step as one graph"));
    // 10 steps: the first eager, the second traces and runs the program (warm-up), the third
    // captures, seven replays.
    CHECK_THAT(printed, Contains("CUDA graphs: 1 captured, 7 replays"));
    check_step_losses(graphed, eager, 1e-2);
  }
}
