#pragma once
// Normalization layers: BatchNorm1d, BatchNorm2d and LayerNorm, with PyTorch's parameters,
// buffers (running_mean, running_var, num_batches_tracked as i64) and momentum rule.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/module.h"

namespace kiln::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  // The running statistics' update weight; nullopt averages all batches seen equally
  // (weight 1 / num_batches_tracked), as PyTorch's momentum=None.
  std::optional<double> momentum = 0.1;
  bool affine = true;               // learnable weight (ones) and bias (zeros)
  bool track_running_stats = true;  // keep running_mean (zeros) and running_var (ones)
};

// Training-mode batch normalization whose statistics span more than this process's batch:
// dist::SyncBatchNorm's (dist/sync_batch_norm.h). Given the layer's tensors (weight, bias,
// running statistics: undefined when the layer has none) and the running statistics'
// update weight, it returns the output and updates the running statistics as
// kiln::batch_norm would over the whole batch.
class BatchStatistics {
 public:
  virtual ~BatchStatistics() = default;
  virtual Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var, double momentum,
                            double eps) const = 0;
  // Shown in the layer's repr ("sync over 4 ranks").
  virtual std::string describe() const = 0;
};

// What BatchNorm1d and BatchNorm2d share (PyTorch's _BatchNorm). In training mode the
// batch's statistics normalize and (when tracked) update the running ones; in eval mode
// the running statistics normalize (the batch's when none are tracked).
class BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  // Running statistics back to zeros / ones and num_batches_tracked to 0.
  void reset_running_stats();
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }
  Tensor running_mean() const { return buffer("running_mean"); }
  Tensor running_var() const { return buffer("running_var"); }
  Tensor num_batches_tracked() const { return buffer("num_batches_tracked"); }
  const BatchNormOptions& options() const { return options_; }
  // Where training mode takes its batch statistics from: null (the default) for this
  // process's batch; dist::convert_sync_batchnorm sets it. Shared by every handle to the
  // layer, so a model's members see it as its children() do.
  void set_batch_statistics(std::shared_ptr<const BatchStatistics> statistics);
  std::shared_ptr<const BatchStatistics> batch_statistics() const { return *statistics_; }

 protected:
  // `layer` names the concrete class in errors raised while it is being built.
  BatchNormBase(const char* layer, int64_t num_features, BatchNormOptions options,
                std::vector<int64_t> input_dims);

 private:
  int64_t num_features_;
  BatchNormOptions options_;
  std::vector<int64_t> input_dims_;  // the input ranks the layer accepts
  // One slot per layer, shared by the handles' copies (set_batch_statistics).
  std::shared_ptr<std::shared_ptr<const BatchStatistics>> statistics_ =
      std::make_shared<std::shared_ptr<const BatchStatistics>>();
};

// Batch normalization of [N, C] or [N, C, L].
class BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {});
};

// Batch normalization of [N, C, H, W].
class BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {});
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;  // learnable weight (ones) shaped normalized_shape
  bool bias = true;                // and bias (zeros), when elementwise_affine
};

// Normalizes over the trailing dims `normalized_shape`.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, LayerNormOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }

 private:
  std::vector<int64_t> normalized_shape_;
  LayerNormOptions options_;
};

}  // namespace kiln::nn
