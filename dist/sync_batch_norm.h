#pragma once
// Batch normalization with statistics over every rank's batch (PyTorch's SyncBatchNorm),
// for data-parallel training whose per-rank batches are too small for good statistics.
//
//   dist::init_process_group({.backend = "gloo"});
//   models::ResNet model = models::resnet50({.num_classes = 10});
//   dist::convert_sync_batchnorm(model);             // every BatchNorm layer, in place
//   dist::DistributedDataParallel ddp(model);
//
// In training mode each layer sums its shard's per-channel statistics, all-reduces them
// (one all-reduce of 2C + 1 numbers per layer and forward), normalizes with the global mean
// and variance, and updates its running statistics with them, so every rank holds the
// same running statistics as one process with the whole batch. Its backward all-reduces
// the gradients of those sums (one more all-reduce per layer), so the input gradients are
// the whole batch's; the weight and bias gradients stay this rank's, and
// DistributedDataParallel averages them as it does every parameter's. Ranks may hold
// batches of different sizes (a short last batch), not an empty one. In eval mode, and in
// a job of one rank, the layer is an ordinary BatchNorm.
//
// The statistics are sums of x - running_mean (a shift every rank shares, which keeps the
// one-pass variance from cancelling), in f32 for 16-bit inputs. The layer is composed of
// ordinary ops around the all-reduce, so it costs more memory traffic than the fused
// batch_norm kernels.
//
// CPU tensors take their all-reduces through Gloo, CUDA tensors through NCCL (backend
// "nccl" or "auto"): the statistics are summed on the device, and a CUDA step reads nothing
// back to the host unless some rank's shard has a single value per channel.
//
// Not (yet): under kiln::compile (the all-reduces would not be part of the compiled
// program; the layer raises a kiln::Error while traced).
#include <memory>
#include <string>

#include "core/tensor.h"
#include "dist/process_group.h"
#include "models/module.h"
#include "models/norm_layers.h"

namespace kiln::dist {

// A BatchNorm over any [N, C, ...] input whose training statistics span the group's ranks
// (the default group's, found at each forward, when group is null).
class SyncBatchNorm : public nn::BatchNormBase {
 public:
  explicit SyncBatchNorm(int64_t num_features, nn::BatchNormOptions options = {},
                         ProcessGroup* group = nullptr);
};

// Training-mode batch norm of x ([N, C, ...]) with its statistics over the group's ranks,
// updating running_mean and running_var (when defined) with them; the layer's arithmetic,
// which in a group of one rank still runs its all-reduces (a test of the collectives' path).
// Every rank must call it, and run its backward, in the same order.
Tensor sync_batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, double momentum,
                       double eps, ProcessGroup& group);

// Makes every BatchNorm1d, BatchNorm2d and SyncBatchNorm layer of `module` (itself
// included) take its training statistics over the group's ranks, in place: the layers
// keep their parameters, buffers, names and type. Returns how many layers it converted.
int64_t convert_sync_batchnorm(nn::Module& module, ProcessGroup* group = nullptr);

// The sum of t over the ranks (an all-reduce that waits), differentiable: the gradient of
// every rank's result flows back, summed over the ranks, to every rank's t. Each rank must
// call it, and run the backward through it, in the same order.
Tensor all_reduce_sum_differentiable(const Tensor& t, ProcessGroup& group);

}  // namespace kiln::dist
