// One optimizer step of kiln-train (tools/trainer.h): the micro-step as a traceable
// function, the micro-steps of a global batch with exact accumulation (eager or compiled,
// data parallel or not), the optimizer's part after them, and the reading of the steps'
// statistics, which the steps leave where they computed them. The whole step as one
// function is tools/whole_step.cpp; the loop around the steps is tools/trainer.cpp.
#include <optional>

#include "core/autocast.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/join.h"
#include "core/ops/loss.h"
#include "core/ops/reduce.h"
#include "core/registry.h"
#include "data/dataset.h"
#include "dist/process_group.h"
#include "optim/clip.h"
#include "tools/trainer.h"

namespace kiln::train {

compiler::TracedFunction micro_step_function(nn::Module& model, double label_smoothing, const Precision& precision) {
  return [&model, label_smoothing, precision](const std::vector<Tensor>& args) -> std::vector<Tensor> {
    // Per-token targets: the sum over the predicted tokens, each weighted 1 / (the global
    // batch's count) by args[2]; per-sample targets: the micro-batch's mean.
    const bool per_token = args[1].dim() == 2;
    Tensor logits, loss;
    {
      // Forward and loss under autocast; backward outside it, as PyTorch recommends (its ops
      // run in the dtypes their forward chose).
      autocast amp({.device_type = args[0].device().type,
                    .dtype = precision.autocast,
                    .enabled = precision.autocast.has_value()});
      logits = call_model(model, args[0], args.size() > 3 ? args[3] : Tensor());
      loss = per_token ? cross_entropy(logits.reshape({-1, logits.size(-1)}), args[1].reshape({-1}),
                                       {.reduction = "sum", .label_smoothing = label_smoothing})
                       : cross_entropy(logits, args[1], {.label_smoothing = label_smoothing});
    }
    const Tensor weighted = loss * args[2].to(loss.dtype());
    (precision.scaler ? precision.scaler->scale(weighted) : weighted).backward();
    NoGradGuard no_grad;
    // An ignored token's target (kIgnoreIndex) is never the argmax.
    return {loss.detach(), sum(eq(argmax(logits.detach(), -1), args[1]))};
  };
}

void finish_step(optim::Optimizer& optimizer, const Precision& precision) {
  if (precision.clip_grad_norm > 0) {
    if (precision.scaler) precision.scaler->unscale_(optimizer);
    std::vector<Tensor> params;
    for (const optim::ParamGroup& group : optimizer.param_groups())
      params.insert(params.end(), group.params.begin(), group.params.end());
    optim::clip_grad_norm_(params, precision.clip_grad_norm);
  }
  if (precision.scaler) {
    precision.scaler->step(optimizer);
    precision.scaler->update();
  } else {
    optimizer.step();
  }
}

PendingStepStats run_micro_steps(const compiler::TracedFunction& micro_step, optim::Optimizer& optimizer,
                                 const optim::Accumulation& accumulation, const Tensor& input, const Tensor& target,
                                 const Precision& precision, const DataParallelStep* dp, const Tensor& mask) {
  PendingStepStats stats;
  KILN_CHECK(!mask.defined() || (mask.dim() == 2 && input.dim() == 2 && mask.shape() == input.shape()),
             "train_step: a mask {} goes with token batches [N, L] of its shape, got input {}",
             mask.defined() ? mask.meta_str() : "", input.meta_str());
  // Per-token targets: every micro-step weighs a token W / (the global batch's count of
  // predicted tokens), counted on the device (and summed over the ranks), so the step reads
  // nothing back before its end. With no token to predict the weight is W (the loss is 0).
  const bool per_token = target.dim() == 2;
  Tensor token_weight, predicted;
  if (per_token) {
    NoGradGuard no_grad;
    predicted = sum(ne(target, data::kIgnoreIndex)).to(DType::f64);
    if (dp) {
      const Tensor global = predicted.to(Device::cpu()).reshape({1}).contiguous();
      dist::all_reduce(global).wait();
      predicted = global.reshape({}).to(target.device());
    }
    token_weight = div(scalar_tensor(static_cast<double>(dp ? dp->world_size : 1), DType::f64, target.device()),
                       maximum(predicted, scalar_tensor(1.0, DType::f64, target.device())));
  }
  // The step's loss is the mean over the global batch: each micro-batch's mean loss
  // weighted by its share of the samples (the weight the gradient used). Summed where the
  // micro-steps run, and read when the caller reads them (read_steps): neither a micro-step
  // nor the step reads anything back (on a GPU, a read would wait for the device each time).
  Tensor loss_sum, correct_sum;
  const std::vector<optim::MicroBatch> micros =
      dp ? accumulation.split_shard(input, target, {.samples = dp->global_samples, .world_size = dp->world_size})
         : accumulation.split(input, target, optim::balanced_sizes(input.size(0), accumulation.options().micro_batch));
  for (const optim::MicroBatch& micro : micros) {
    // Data parallel: the gradients are all-reduced on the last micro-step only.
    std::optional<dist::DistributedDataParallel::NoSync> no_sync;
    if (dp) no_sync.emplace(*dp->ddp, !micro.is_last);
    const Tensor weight = per_token ? token_weight : micro.weight;
    std::vector<Tensor> args{micro.x, micro.y, weight};
    if (mask.defined()) args.push_back(mask.narrow(0, micro.start, micro.size));
    const std::vector<Tensor> out = micro_step(args);
    micro.finish();
    NoGradGuard no_grad;
    const Tensor weighted = out[0].to(DType::f64) * weight.to(out[0].device());
    loss_sum = loss_sum.defined() ? loss_sum + weighted : weighted;
    correct_sum = correct_sum.defined() ? correct_sum + out[1] : out[1];
    stats.samples += micro.size;
  }
  finish_step(optimizer, precision);
  optimizer.zero_grad();
  if (dp) {
    // Every rank's sums in one all-reduce. With split_shard's weights (W size / N) the
    // ranks' weighted losses add up to W times the global batch's mean.
    NoGradGuard no_grad;
    const Tensor local = stack({loss_sum.to(DType::f64).to(Device::cpu()), correct_sum.to(DType::f64).to(Device::cpu()),
                                scalar_tensor(static_cast<double>(stats.samples), DType::f64)})
                             .contiguous();
    dist::all_reduce(local).wait();
    stats.loss = local.select(0, 0) / static_cast<double>(dp->world_size);
    stats.correct = local.select(0, 1);
    stats.samples = static_cast<int64_t>(local.data_ptr<double>()[2]);
    stats.predicted = per_token ? predicted : Tensor();
    return stats;
  }
  stats.loss = loss_sum.to(DType::f64);
  stats.correct = correct_sum;
  stats.predicted = per_token ? predicted : Tensor();
  return stats;
}

std::vector<StepStats> read_steps(const std::vector<PendingStepStats>& steps) {
  if (steps.empty()) return {};
  NoGradGuard no_grad;
  // Every number in f64 (counts are exact in it up to 2^53), stacked on the device, one copy.
  const Device device = steps.front().loss.device();
  std::vector<Tensor> values;
  for (const PendingStepStats& s : steps) {
    values.push_back(s.loss.to(DType::f64).to(device));
    values.push_back(s.correct.to(DType::f64).to(device));
    if (s.predicted.defined()) values.push_back(s.predicted.to(DType::f64).to(device));
  }
  const Tensor host = stack(values).to(Device::cpu()).contiguous();
  report_host_read(host, "read_steps");
  const double* v = host.data_ptr<double>();
  std::vector<StepStats> out;
  for (const PendingStepStats& s : steps) {
    StepStats& r = out.emplace_back();
    r.loss = *v++;
    r.correct = static_cast<int64_t>(*v++);
    r.samples = s.samples;
    r.predicted = s.predicted.defined() ? static_cast<int64_t>(*v++) : s.samples;
  }
  return out;
}

StepStats train_step(nn::Module& model, optim::Optimizer& optimizer, const optim::Accumulation& accumulation,
                     const Tensor& input, const Tensor& target, double label_smoothing, const Precision& precision,
                     const DataParallelStep* data_parallel, const Tensor& mask) {
  return read_steps({run_micro_steps(micro_step_function(model, label_smoothing, precision), optimizer, accumulation,
                                     input, target, precision, data_parallel, mask)})
      .front();
}

StepStats train_step_compiled(compiler::CompiledFunction& compiled, optim::Optimizer& optimizer,
                              const optim::Accumulation& accumulation, const Tensor& input, const Tensor& target,
                              const Precision& precision, const DataParallelStep* data_parallel, const Tensor& mask) {
  return read_steps({run_micro_steps([&compiled](const std::vector<Tensor>& args) { return compiled(args); }, optimizer,
                                     accumulation, input, target, precision, data_parallel, mask)})
      .front();
}

}  // namespace kiln::train
