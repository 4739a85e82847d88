// The layers of layers.h: construction with PyTorch's default initialization, forward
// through core/ops, and extra_repr as PyTorch prints it.
#include "models/layers.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/ops/factory.h"
#include "models/functional.h"
#include "models/init.h"

namespace kiln::nn {

namespace {

const char* py_bool(bool b) { return b ? "True" : "False"; }
std::string tuple2(const Int2& v) { return fmt::format("({}, {})", v.h, v.w); }
// Pooling layers print a size as given: one number when both dims agree.
std::string int_or_tuple(const Int2& v) { return v.h == v.w ? std::to_string(v.h) : tuple2(v); }

// PyTorch's default for the weight and bias of Linear and Conv2d.
void init_weight_and_bias(const Tensor& weight, const Tensor& bias) {
  init::kaiming_uniform_(weight, {.a = std::sqrt(5.0)});
  if (bias.defined()) {
    const int64_t fan_in = init::calculate_fans(weight).fan_in;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}

void check_positive(int64_t v, const char* what, const char* layer) {
  KILN_CHECK(v > 0, "{}: {} must be positive, got {}", layer, what, v);
}

}  // namespace

// ---- Linear ----

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : in_features_(in_features), out_features_(out_features) {
  KILN_CHECK(in_features >= 0 && out_features >= 0,
             "Linear: sizes must be non-negative, got in_features={} out_features={}",
             in_features, out_features);
  add_parameter("weight", empty({out_features, in_features}));
  if (options.bias) add_parameter("bias", empty({out_features}));
  reset_parameters();
}

void Linear::reset_parameters() { init_weight_and_bias(weight(), bias()); }

Tensor Linear::forward(const Tensor& x) { return functional::linear(x, weight(), bias()); }

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features_, out_features_,
                     py_bool(bias().defined()));
}

// ---- Conv2d ----

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size, Conv2dOptions options)
    : in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_size_(kernel_size),
      options_(options) {
  check_positive(options.groups, "groups", "Conv2d");
  KILN_CHECK(in_channels > 0 && out_channels > 0 && in_channels % options.groups == 0 &&
                 out_channels % options.groups == 0,
             "Conv2d: in_channels={} and out_channels={} must be positive multiples of groups={}",
             in_channels, out_channels, options.groups);
  check_positive(kernel_size.h, "kernel height", "Conv2d");
  check_positive(kernel_size.w, "kernel width", "Conv2d");
  add_parameter("weight",
                empty({out_channels, in_channels / options.groups, kernel_size.h, kernel_size.w}));
  if (options.bias) add_parameter("bias", empty({out_channels}));
  reset_parameters();
}

void Conv2d::reset_parameters() { init_weight_and_bias(weight(), bias()); }

Tensor Conv2d::forward(const Tensor& x) {
  const Conv2dOptions& o = options_;
  return kiln::conv2d(x, weight(), bias(),
                      {.stride = {o.stride.h, o.stride.w},
                       .padding = {o.padding.h, o.padding.w},
                       .dilation = {o.dilation.h, o.dilation.w},
                       .groups = o.groups});
}

std::string Conv2d::extra_repr() const {
  const Conv2dOptions& o = options_;
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", in_channels_, out_channels_,
                              tuple2(kernel_size_), tuple2(o.stride));
  if (o.padding != Int2(0)) s += ", padding=" + tuple2(o.padding);
  if (o.dilation != Int2(1)) s += ", dilation=" + tuple2(o.dilation);
  if (o.groups != 1) s += fmt::format(", groups={}", o.groups);
  if (!o.bias) s += ", bias=False";
  return s;
}

// ---- Embedding ----

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options)
    : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  KILN_CHECK(num_embeddings >= 0 && embedding_dim >= 0,
             "Embedding: sizes must be non-negative, got {} and {}", num_embeddings, embedding_dim);
  if (options.padding_idx) {
    const int64_t p = *options.padding_idx;
    KILN_CHECK(p >= -num_embeddings && p < num_embeddings,
               "Embedding: padding_idx {} must be within [-{}, {})", p, num_embeddings,
               num_embeddings);
    padding_idx_ = p < 0 ? p + num_embeddings : p;
  }
  add_parameter("weight", empty({num_embeddings, embedding_dim}));
  reset_parameters();
}

void Embedding::reset_parameters() {
  init::normal_(weight());
  if (padding_idx_) init::zeros_(weight().select(0, *padding_idx_));
}

Tensor Embedding::forward(const Tensor& indices) {
  return kiln::embedding(weight(), indices, padding_idx_);
}

std::string Embedding::extra_repr() const {
  std::string s = fmt::format("{}, {}", num_embeddings_, embedding_dim_);
  if (padding_idx_) s += fmt::format(", padding_idx={}", *padding_idx_);
  return s;
}

// ---- activations and dropout ----

Tensor ReLU::forward(const Tensor& x) { return kiln::relu(x); }
Tensor SiLU::forward(const Tensor& x) { return kiln::silu(x); }
Tensor Sigmoid::forward(const Tensor& x) { return kiln::sigmoid(x); }
Tensor Tanh::forward(const Tensor& x) { return kiln::tanh(x); }

GELU::GELU(std::string approximate) : approximate_(std::move(approximate)) {
  KILN_CHECK(approximate_ == "none" || approximate_ == "tanh",
             "GELU: approximate must be 'none' or 'tanh', got '{}'", approximate_);
}
Tensor GELU::forward(const Tensor& x) { return kiln::gelu(x, approximate_); }
std::string GELU::extra_repr() const { return "approximate='" + approximate_ + "'"; }

Dropout::Dropout(double p) : p_(p) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, "Dropout: p must be within [0, 1], got {}", p);
}
Tensor Dropout::forward(const Tensor& x) { return kiln::dropout(x, p_, is_training()); }
std::string Dropout::extra_repr() const { return fmt::format("p={}, inplace=False", p_); }

// ---- pooling ----

MaxPool2d::MaxPool2d(Int2 kernel_size, MaxPool2dOptions options)
    : kernel_size_(kernel_size), stride_(options.stride.value_or(kernel_size)), options_(options) {}

Tensor MaxPool2d::forward(const Tensor& x) {
  return kiln::max_pool2d(x, kernel_size_.vec(), stride_.vec(), options_.padding.vec(),
                          options_.dilation.vec(), options_.ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}, dilation={}, ceil_mode={}",
                     int_or_tuple(kernel_size_), int_or_tuple(stride_),
                     int_or_tuple(options_.padding), int_or_tuple(options_.dilation),
                     py_bool(options_.ceil_mode));
}

AvgPool2d::AvgPool2d(Int2 kernel_size, AvgPool2dOptions options)
    : kernel_size_(kernel_size), stride_(options.stride.value_or(kernel_size)), options_(options) {}

Tensor AvgPool2d::forward(const Tensor& x) {
  return kiln::avg_pool2d(x, kernel_size_.vec(), stride_.vec(), options_.padding.vec(),
                          options_.ceil_mode, options_.count_include_pad,
                          options_.divisor_override);
}

std::string AvgPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", int_or_tuple(kernel_size_),
                     int_or_tuple(stride_), int_or_tuple(options_.padding));
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Int2 output_size) : output_size_(output_size) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return kiln::adaptive_avg_pool2d(x, output_size_.vec());
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  return "output_size=" + int_or_tuple(output_size_);
}

// ---- shape ----

Flatten::Flatten(int64_t start_dim, int64_t end_dim) : start_dim_(start_dim), end_dim_(end_dim) {}
Tensor Flatten::forward(const Tensor& x) { return x.flatten(start_dim_, end_dim_); }
std::string Flatten::extra_repr() const {
  return fmt::format("start_dim={}, end_dim={}", start_dim_, end_dim_);
}

}  // namespace kiln::nn
