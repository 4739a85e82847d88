// BatchNorm and LayerNorm layers over core/ops/norm.h.
#include "models/norm_layers.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/factory.h"
#include "core/ops/norm.h"

namespace kiln::nn {

namespace {
const char* py_bool(bool b) { return b ? "True" : "False"; }
}  // namespace

BatchNormBase::BatchNormBase(const char* layer, int64_t num_features, BatchNormOptions options,
                             std::vector<int64_t> input_dims)
    : num_features_(num_features), options_(options), input_dims_(std::move(input_dims)) {
  KILN_CHECK(num_features > 0, "{}: num_features must be positive, got {}", layer,
             num_features);
  if (options.affine) {
    add_parameter("weight", ones({num_features}));
    add_parameter("bias", zeros({num_features}));
  }
  if (options.track_running_stats) {
    add_buffer("running_mean", zeros({num_features}));
    add_buffer("running_var", ones({num_features}));
    add_buffer("num_batches_tracked", zeros({}, {.dtype = DType::i64}));
  }
}

void BatchNormBase::reset_running_stats() {
  if (!options_.track_running_stats) return;
  NoGradGuard no_grad;
  running_mean().zero_();
  running_var().fill_(1);
  num_batches_tracked().zero_();
}

Tensor BatchNormBase::forward(const Tensor& x) {
  KILN_CHECK(x.defined(), "{}: the input is undefined", type_name());
  KILN_CHECK(std::count(input_dims_.begin(), input_dims_.end(), x.dim()) > 0,
             "{}: expected a {}-d input, got {}", type_name(),
             fmt::join(input_dims_, "-d or "), x.meta_str());
  KILN_CHECK(x.size(1) == num_features_, "{}: expected {} channels in dim 1, got {}", type_name(),
             num_features_, x.meta_str());
  double factor = options_.momentum.value_or(0.0);
  if (is_training() && options_.track_running_stats) {
    NoGradGuard no_grad;
    Tensor count = num_batches_tracked();
    count.add_(1);
    if (!options_.momentum) factor = 1.0 / static_cast<double>(count.item<int64_t>());
  }
  // Batch statistics in training, and in eval when no running statistics exist.
  const bool use_batch_stats = is_training() || !options_.track_running_stats;
  // Running statistics are passed when they are to be used or updated.
  const bool pass_running = options_.track_running_stats;
  if (is_training() && *statistics_)
    return (*statistics_)->batch_norm(x, weight(), bias(), pass_running ? running_mean() : Tensor(),
                                      pass_running ? running_var() : Tensor(), factor, options_.eps);
  return kiln::batch_norm(x, weight(), bias(), pass_running ? running_mean() : Tensor(),
                          pass_running ? running_var() : Tensor(), use_batch_stats, factor,
                          options_.eps);
}

void BatchNormBase::set_batch_statistics(std::shared_ptr<const BatchStatistics> statistics) {
  *statistics_ = std::move(statistics);
}

std::string BatchNormBase::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}{}", num_features_,
                     options_.eps,
                     options_.momentum ? fmt::format("{}", *options_.momentum) : "None",
                     py_bool(options_.affine), py_bool(options_.track_running_stats),
                     *statistics_ ? ", " + (*statistics_)->describe() : "");
}

BatchNorm1d::BatchNorm1d(int64_t num_features, BatchNormOptions options)
    : BatchNormBase("BatchNorm1d", num_features, options, {2, 3}) {}

BatchNorm2d::BatchNorm2d(int64_t num_features, BatchNormOptions options)
    : BatchNormBase("BatchNorm2d", num_features, options, {4}) {}

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, LayerNormOptions options)
    : normalized_shape_(std::move(normalized_shape)), options_(options) {
  KILN_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must not be empty");
  for (int64_t s : normalized_shape_)
    KILN_CHECK(s > 0, "LayerNorm: normalized_shape {} must be positive",
               shape_str(normalized_shape_));
  if (options.elementwise_affine) {
    add_parameter("weight", ones(normalized_shape_));
    if (options.bias) add_parameter("bias", zeros(normalized_shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  return kiln::layer_norm(x, normalized_shape_, weight(), bias(), options_.eps);
}

std::string LayerNorm::extra_repr() const {
  std::string shape = normalized_shape_.size() == 1
                          ? fmt::format("({},)", normalized_shape_[0])
                          : fmt::format("({})", fmt::join(normalized_shape_, ", "));
  return fmt::format("{}, eps={}, elementwise_affine={}", shape, options_.eps,
                     py_bool(options_.elementwise_affine));
}

}  // namespace kiln::nn
