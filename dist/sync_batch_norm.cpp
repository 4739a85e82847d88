// SyncBatchNorm (dist/sync_batch_norm.h): the shard's per-channel sums, one differentiable
// all-reduce, and the normalization by the global statistics written in ordinary ops, so
// that autograd derives the backward (whose only collective is the all-reduce's own).
#include "dist/sync_batch_norm.h"

#include <fmt/format.h>

#include "autograd/meta.h"
#include "autograd/node.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/join.h"
#include "core/ops/norm.h"
#include "core/ops/reduce.h"
#include "core/registry.h"

namespace kiln::dist {

namespace {

// The backward of all_reduce_sum_differentiable: the sum over the ranks of the incoming
// gradients (zeros from a rank where none came, which must still take part).
class AllReduceSumBackward final : public Node {
 public:
  AllReduceSumBackward(ProcessGroup& group, Edge input, TensorMeta meta)
      : group_(group), meta_(std::move(meta)) {
    next_edges_ = {std::move(input)};
  }
  std::vector<Tensor> apply(std::vector<Tensor> grads) override {
    NoGradGuard no_grad;
    Tensor g = grads[0].defined()
                   ? grads[0].contiguous().clone()
                   : zeros(meta_.shape, {.dtype = meta_.dtype, .device = meta_.device});
    group_.all_reduce(g, ReduceOp::sum).wait();
    return {g};
  }
  std::string name() const override { return "AllReduceSumBackward"; }

 private:
  ProcessGroup& group_;
  TensorMeta meta_;
};

ProcessGroup* group_or_default(ProcessGroup* group) {
  if (group) return group;
  return is_initialized() ? &default_group() : nullptr;
}

class GroupStatistics final : public nn::BatchStatistics {
 public:
  explicit GroupStatistics(ProcessGroup* group) : group_(group) {}

  Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& running_mean, const Tensor& running_var, double momentum,
                    double eps) const override {
    ProcessGroup* group = group_or_default(group_);
    if (!group || group->size() == 1)
      return kiln::batch_norm(x, weight, bias, running_mean, running_var, true, momentum, eps);
    return sync_batch_norm(x, weight, bias, running_mean, running_var, momentum, eps, *group);
  }

  std::string describe() const override {
    const ProcessGroup* group = group_or_default(group_);
    return group ? fmt::format("sync over {} ranks", group->size()) : "sync (no process group yet)";
  }

 private:
  ProcessGroup* group_;
};

}  // namespace

Tensor all_reduce_sum_differentiable(const Tensor& t, ProcessGroup& group) {
  Tensor result;
  {
    NoGradGuard no_grad;
    result = t.contiguous().clone();
  }
  group.all_reduce(result, ReduceOp::sum).wait();
  if (GradMode::is_enabled() && t.requires_grad()) {
    auto node = std::make_shared<AllReduceSumBackward>(group, gradient_edge(t), TensorMeta::of(t));
    AutogradMeta& meta = autograd_meta(result);
    meta.grad_fn = node;
    meta.output_nr = 0;
    result.impl()->requires_grad = true;
  }
  return result;
}

Tensor sync_batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, double momentum,
                       double eps, ProcessGroup& group) {
  KILN_CHECK(!op_hook_installed(),
             "SyncBatchNorm: cannot run under kiln::compile yet: its all-reduces of the batch "
             "statistics would not be part of the compiled program (input {}); run the step "
             "eagerly, or use BatchNorm with per-rank statistics",
             x.meta_str());
  KILN_CHECK(x.dim() >= 2 && x.numel() > 0,
             "SyncBatchNorm: expected a non-empty [N, C, ...] input, got {}", x.meta_str());
  const int64_t channels = x.size(1);
  const Device device = x.device();
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"weight", weight},
                                {"bias", bias},
                                {"running_mean", running_mean},
                                {"running_var", running_var}})
    KILN_CHECK(!t.defined() || (t.device() == device && t.dim() == 1 && t.size(0) == channels),
               "SyncBatchNorm: {} {} does not fit input {}: expected [{}] on {}", name,
               t.meta_str(), x.meta_str(), channels, device);
  Shape per_channel(static_cast<size_t>(x.dim()), 1);
  per_channel[1] = channels;
  DimList dims;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != 1) dims.push_back(d);
  // 16-bit inputs are summed and normalized in f32, as batch_norm's kernels do.
  const DType compute = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor xc = x.to(compute);
  const Tensor shift = running_mean.defined()
                           ? running_mean.detach().to(compute).reshape(per_channel)
                           : zeros(per_channel, {.dtype = compute, .device = device});
  const Tensor d = xc - shift;
  const int64_t local_count = x.numel() / channels;
  // The count made on the host and copied: a fill on a GPU would compile a kernel per
  // distinct value (fill's value is inlined).
  const Tensor count_here =
      full({1}, static_cast<double>(local_count), {.dtype = compute}).to(device);
  const Tensor local = cat({sum(d, dims), sum(d * d, dims), count_here});
  // One all-reduce of [sum d, sum d^2, count] on the input's device (NCCL for CUDA tensors).
  const Tensor total = all_reduce_sum_differentiable(local, group);
  // The count stays on the device (a [1] tensor the divisions broadcast), so a CUDA step
  // does not wait for the all-reduce on the host; it is read back only where this rank's
  // shard alone cannot show that it exceeds 1 (every rank holds at least one value).
  const Tensor count = total.narrow(0, 2 * channels, 1).detach();
  const Tensor mean_d = total.narrow(0, 0, channels) / count;
  const Tensor var = clamp_min(total.narrow(0, channels, channels) / count - mean_d * mean_d, 0.0);
  const Tensor invstd = rsqrt(var + eps);
  Tensor y = (d - mean_d.reshape(per_channel)) * invstd.reshape(per_channel);
  if (weight.defined()) y = y * weight.to(compute).reshape(per_channel);
  if (bias.defined()) y = y + bias.to(compute).reshape(per_channel);
  if (running_mean.defined()) {
    NoGradGuard no_grad;
    KILN_CHECK(local_count > 1 || count.item<double>() > 1,
               "SyncBatchNorm: expected more than 1 value per channel over all ranks, got {}",
               x.meta_str());
    const Tensor mean = (shift.reshape({channels}) + mean_d).detach();
    const Tensor unbiased = (var * (count / (count - 1))).detach();
    Tensor rm = running_mean, rv = running_var;  // handles to the layer's buffers
    rm.mul_(1 - momentum).add_((mean * momentum).to(rm.dtype()));
    rv.mul_(1 - momentum).add_((unbiased * momentum).to(rv.dtype()));
  }
  return y.to(x.dtype());
}

SyncBatchNorm::SyncBatchNorm(int64_t num_features, nn::BatchNormOptions options,
                             ProcessGroup* group)
    : nn::BatchNormBase("SyncBatchNorm", num_features, options, {2, 3, 4, 5}) {
  set_batch_statistics(std::make_shared<GroupStatistics>(group));
}

int64_t convert_sync_batchnorm(nn::Module& module, ProcessGroup* group) {
  const auto statistics = std::make_shared<GroupStatistics>(group);
  int64_t converted = 0;
  for (nn::Module* m : module.modules()) {
    if (auto* bn = dynamic_cast<nn::BatchNormBase*>(m)) {
      bn->set_batch_statistics(statistics);
      ++converted;
    }
  }
  return converted;
}

}  // namespace kiln::dist
