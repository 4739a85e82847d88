#pragma once
// ResNet-18/34/50/101/152 as torchvision builds them (ResNet v1.5: a Bottleneck strides on
// its 3x3 conv), with torchvision's module names, so that state dicts exchange keys with
// torchvision's one for one ("layer1.0.downsample.1.running_var").
#include <array>
#include <cstdint>
#include <optional>

#include "models/layers.h"

namespace kiln::models {

struct ResNetOptions {
  int64_t num_classes = 1000;
  // Zero the last BatchNorm weight of every block, so that each block starts as the
  // identity (torchvision's option of the same name).
  bool zero_init_residual = false;
  int64_t in_channels = 3;
};

// Two 3x3 convs plus the shortcut (ResNet-18 and -34).
class BasicBlock : public nn::Module {
 public:
  static constexpr int64_t expansion = 1;
  // `stride` applies to conv1; `downsample` adds the 1x1 conv + BatchNorm shortcut.
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, bool downsample);
  Tensor forward(const Tensor& x) override;
  // The BatchNorm whose output meets the shortcut (bn2).
  nn::BatchNorm2d last_bn() const { return bn2_; }

 private:
  nn::Conv2d conv1_;
  nn::BatchNorm2d bn1_;
  nn::ReLU relu_;
  nn::Conv2d conv2_;
  nn::BatchNorm2d bn2_;
  std::optional<nn::Sequential> downsample_;
};

// 1x1 reduce, 3x3 (strided), 1x1 expand by 4, plus the shortcut (ResNet-50 and deeper).
class Bottleneck : public nn::Module {
 public:
  static constexpr int64_t expansion = 4;
  // `stride` applies to conv2; `downsample` adds the 1x1 conv + BatchNorm shortcut.
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride, bool downsample);
  Tensor forward(const Tensor& x) override;
  // The BatchNorm whose output meets the shortcut (bn3).
  nn::BatchNorm2d last_bn() const { return bn3_; }

 private:
  nn::Conv2d conv1_;
  nn::BatchNorm2d bn1_;
  nn::Conv2d conv2_;
  nn::BatchNorm2d bn2_;
  nn::Conv2d conv3_;
  nn::BatchNorm2d bn3_;
  nn::ReLU relu_;
  std::optional<nn::Sequential> downsample_;
};

enum class ResNetBlock { basic, bottleneck };

// The stem (7x7 conv, BatchNorm, ReLU, 3x3 max pool), four stages of blocks, global average
// pooling and a linear classifier. forward maps [N, in_channels, H, W] to logits
// [N, num_classes].
class ResNet : public nn::Module {
 public:
  // `blocks_per_stage` counts the blocks of layer1..layer4.
  ResNet(ResNetBlock block, std::array<int64_t, 4> blocks_per_stage, ResNetOptions options = {});
  Tensor forward(const Tensor& x) override;

  nn::Conv2d conv1() const { return conv1_; }
  nn::BatchNorm2d bn1() const { return bn1_; }
  // layer(1) .. layer(4).
  nn::Sequential layer(int64_t stage) const;
  nn::Linear fc() const { return fc_; }

 private:
  // One stage of `blocks` blocks; the first strides by `stride` and takes the shortcut
  // conv when the shape changes. Advances in_planes_.
  nn::Sequential make_stage(ResNetBlock block, int64_t planes, int64_t blocks, int64_t stride);
  // torchvision's initialization (see resnet.cpp).
  void initialize(bool zero_init_residual);

  int64_t in_planes_ = 64;
  nn::Conv2d conv1_;
  nn::BatchNorm2d bn1_;
  nn::ReLU relu_;
  nn::MaxPool2d maxpool_;
  std::array<nn::Sequential, 4> layers_;
  nn::AdaptiveAvgPool2d avgpool_;
  nn::Linear fc_;
};

// torchvision.models.resnet18 .. resnet152 with random (not pretrained) weights.
ResNet resnet18(ResNetOptions options = {});
ResNet resnet34(ResNetOptions options = {});
ResNet resnet50(ResNetOptions options = {});
ResNet resnet101(ResNetOptions options = {});
ResNet resnet152(ResNetOptions options = {});

}  // namespace kiln::models
