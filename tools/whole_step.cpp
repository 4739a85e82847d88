// The whole optimizer step as one traced function (tools/trainer.h, whole_step_function),
// which of the two step graphs kiln-train compiles, and a step run through the compiled
// whole step.
//
// A micro-batch's weight and the per-token weight are made inside the function with ops
// on the batch's device (full, sum, clamp_min, div), not as host tensors copied over: a
// graph that reads a host tensor cannot be captured as a CUDA graph (docs/cuda.md,
// "reduce-overhead"), and these values are the same for every call of one input signature
// (per-sample) or computed from the targets (per-token).
#include <fmt/format.h>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/reduce.h"
#include "data/dataset.h"
#include "tools/trainer.h"

namespace kiln::train {

compiler::TracedFunction whole_step_function(nn::Module& model, optim::Optimizer& optimizer,
                                             const optim::Accumulation& accumulation, double label_smoothing,
                                             const Precision& precision) {
  return [micro_step = micro_step_function(model, label_smoothing, precision), &optimizer, accumulation,
          precision](const std::vector<Tensor>& args) -> std::vector<Tensor> {
    KILN_CHECK(args.size() == 2 || args.size() == 3,
               "whole_step_function: takes {{input, target[, mask]}}, got {} arguments", args.size());
    const Tensor &input = args[0], &target = args[1];
    const Tensor mask = args.size() > 2 ? args[2] : Tensor();
    const bool per_token = target.dim() == 2;
    KILN_CHECK(input.dim() >= 1 && (target.dim() == 1 || per_token) && target.size(0) == input.size(0),
               "whole_step_function: input {} and target {}: expected a class per sample [N] or per token [N, L]",
               input.meta_str(), target.meta_str());
    KILN_CHECK(!mask.defined() || (per_token && mask.shape() == input.shape() && input.dim() == 2),
               "whole_step_function: a mask {} goes with token batches [N, L] of its shape, got input {}",
               mask.defined() ? mask.meta_str() : "", input.meta_str());
    // In place: clearing .grad to none inside a compiled function would change its guard.
    optimizer.zero_grad(/*set_to_none=*/false);
    const Device device = input.device();
    const int64_t n = input.size(0);
    // Per-token targets: every token of the batch weighs 1 / (its predicted tokens), as in
    // train_step (1 / max(count, 1): no token to predict gives a loss of 0).
    Tensor token_weight, predicted;
    if (per_token) {
      NoGradGuard no_grad;
      predicted = sum(ne(target, data::kIgnoreIndex)).to(DType::f64);
      token_weight = 1.0 / clamp_min(predicted, 1.0);
    }
    Tensor loss_sum, correct_sum;
    int64_t start = 0;
    for (const int64_t size : optim::balanced_sizes(n, accumulation.options().micro_batch)) {
      // A micro-batch's share of the batch, as Accumulation::split computes it.
      const Tensor weight =
          per_token ? token_weight
                    : full({}, static_cast<double>(size) / static_cast<double>(n), {.dtype = DType::f64, .device = device});
      std::vector<Tensor> micro_args{input.narrow(0, start, size), target.narrow(0, start, size), weight};
      if (mask.defined()) micro_args.push_back(mask.narrow(0, start, size));
      const std::vector<Tensor> out = micro_step(micro_args);
      NoGradGuard no_grad;
      const Tensor weighted = out[0].to(DType::f64) * weight;
      loss_sum = loss_sum.defined() ? loss_sum + weighted : weighted;
      correct_sum = correct_sum.defined() ? correct_sum + out[1] : out[1];
      start += size;
    }
    finish_step(optimizer, precision);
    if (per_token) return {loss_sum, correct_sum, predicted};
    return {loss_sum, correct_sum};
  };
}

StepGraphChoice choose_step_graph(const Config& c, int world_size) {
  if (!c.compile) return {false, "eager"};
  const bool graphs = c.device == "cuda" && (c.compile_mode == "reduce-overhead" || c.compile_mode == "max-autotune");
  if (world_size > 1)
    return {false, fmt::format("micro-steps compiled, update eager (data parallel: the gradients' all-reduce runs "
                               "in eager hooks before the update){}",
                               c.compile_whole_step ? "; --compile-whole-step does not apply" : "")};
  if (c.compile_whole_step) return {true, "the whole step as one graph (--compile-whole-step)"};
  if (graphs)
    return {true, fmt::format("the whole step as one graph (micro-steps and the {} update): one CUDA graph replay "
                              "per optimizer step",
                              c.optimizer)};
  return {false, c.device == "cuda"
                     ? "micro-steps compiled, update eager (--compile default launches kernel by kernel; "
                       "reduce-overhead replays the whole step as one CUDA graph)"
                     : "micro-steps compiled, update eager (on the CPU the whole-step graph is no faster and holds "
                       "the gradients longer; --compile-whole-step asks for it)"};
}

PendingStepStats run_whole_step(const compiler::TracedFunction& whole, const Tensor& input, const Tensor& target,
                                const Tensor& mask) {
  std::vector<Tensor> args{input, target};
  if (mask.defined()) args.push_back(mask);
  const std::vector<Tensor> out = whole(args);
  return {out[0], out[1], out.size() > 2 ? out[2] : Tensor(), input.size(0)};
}

StepStats train_step_whole(const compiler::TracedFunction& whole, const Tensor& input, const Tensor& target,
                           const Tensor& mask) {
  return read_steps({run_whole_step(whole, input, target, mask)}).front();
}

}  // namespace kiln::train
