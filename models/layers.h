#pragma once
// The layers: Linear, Conv2d, Embedding, activations, Dropout, pooling, Flatten, Identity,
// with PyTorch's constructors, default initialization and printed form. Each is an
// nn::Module (a handle: copies share parameters) whose forward calls the op in core/ops.
// This header also brings in the normalization layers and the containers.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/containers.h"
#include "models/module.h"
#include "models/norm_layers.h"

namespace kiln::nn {

// A size given for both spatial dims: `3` means {3, 3}; `{1, 2}` is {h = 1, w = 2}.
struct Int2 {
  int64_t h = 0, w = 0;
  Int2(int64_t both) : h(both), w(both) {}  // implicit on purpose: `.padding = 1`
  Int2(int64_t h, int64_t w) : h(h), w(w) {}
  std::vector<int64_t> vec() const { return {h, w}; }
  bool operator==(const Int2&) const = default;
};

struct LinearOptions {
  bool bias = true;
};

// y = x W^T + b with W [out_features, in_features] and b [out_features].
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  // PyTorch's default: kaiming_uniform_(a = sqrt(5)) for W, U(-1/sqrt(in), 1/sqrt(in)) for b.
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }  // undefined without a bias
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_, out_features_;
};

struct Conv2dOptions {
  Int2 stride = 1;
  Int2 padding = 0;
  Int2 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

// 2-d convolution over [N, C, H, W]: weight [out, in / groups, kh, kw], bias [out].
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Int2 kernel_size, Conv2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  // PyTorch's default, as Linear's with fan_in = in / groups * kh * kw.
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }
  const Conv2dOptions& options() const { return options_; }

 private:
  int64_t in_channels_, out_channels_;
  Int2 kernel_size_;
  Conv2dOptions options_;
};

struct EmbeddingOptions {
  std::optional<int64_t> padding_idx = std::nullopt;  // negative counts from the end
};

// A lookup table of num_embeddings rows of size embedding_dim, initialized N(0, 1) (the
// padding_idx row zero; it gets no gradient).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {});
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  std::optional<int64_t> padding_idx() const { return padding_idx_; }  // non-negative

 private:
  int64_t num_embeddings_, embedding_dim_;
  std::optional<int64_t> padding_idx_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");  // "none" or "tanh"
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  std::string approximate_;
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// Zeroes elements with probability p in training mode (scaling the rest by 1 / (1 - p));
// the identity in eval mode.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p() const { return p_; }

 private:
  double p_;
};

struct MaxPool2dOptions {
  std::optional<Int2> stride = std::nullopt;  // the kernel size when unset
  Int2 padding = 0;
  Int2 dilation = 1;
  bool ceil_mode = false;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Int2 kernel_size, MaxPool2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  Int2 kernel_size_, stride_;
  MaxPool2dOptions options_;
};

struct AvgPool2dOptions {
  std::optional<Int2> stride = std::nullopt;  // the kernel size when unset
  Int2 padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override = std::nullopt;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Int2 kernel_size, AvgPool2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  Int2 kernel_size_, stride_;
  AvgPool2dOptions options_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Int2 output_size);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  Int2 output_size_;
};

// Flattens dims start_dim..end_dim into one.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  int64_t start_dim_, end_dim_;
};

// Returns its input.
class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
};

}  // namespace kiln::nn
