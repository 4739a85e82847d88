// ResNet: torchvision's architecture, names and initialization.
#include "models/resnet.h"

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "models/init.h"

namespace kiln::models {

namespace {

nn::Conv2d conv3x3(int64_t in_planes, int64_t out_planes, int64_t stride) {
  return nn::Conv2d(in_planes, out_planes, 3, {.stride = stride, .padding = 1, .bias = false});
}

nn::Conv2d conv1x1(int64_t in_planes, int64_t out_planes, int64_t stride) {
  return nn::Conv2d(in_planes, out_planes, 1, {.stride = stride, .bias = false});
}

// The shortcut that matches a block's output shape: 1x1 conv (strided) then BatchNorm, as
// children "0" and "1" (torchvision's "downsample.0.weight", "downsample.1.running_mean").
std::optional<nn::Sequential> make_downsample(bool wanted, int64_t in_planes, int64_t out_planes,
                                              int64_t stride) {
  if (!wanted) return std::nullopt;
  return nn::Sequential(conv1x1(in_planes, out_planes, stride), nn::BatchNorm2d(out_planes));
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride, bool downsample)
    : conv1_(add("conv1", conv3x3(in_planes, planes, stride))),
      bn1_(add("bn1", nn::BatchNorm2d(planes))),
      relu_(add("relu", nn::ReLU())),
      conv2_(add("conv2", conv3x3(planes, planes, 1))),
      bn2_(add("bn2", nn::BatchNorm2d(planes))),
      downsample_(make_downsample(downsample, in_planes, planes * expansion, stride)) {
  if (downsample_) add("downsample", *downsample_);
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = relu_(bn1_(conv1_(x)));
  out = bn2_(conv2_(out));
  const Tensor identity = downsample_ ? (*downsample_)(x) : x;
  return relu_(out + identity);
}

Bottleneck::Bottleneck(int64_t in_planes, int64_t planes, int64_t stride, bool downsample)
    : conv1_(add("conv1", conv1x1(in_planes, planes, 1))),
      bn1_(add("bn1", nn::BatchNorm2d(planes))),
      conv2_(add("conv2", conv3x3(planes, planes, stride))),
      bn2_(add("bn2", nn::BatchNorm2d(planes))),
      conv3_(add("conv3", conv1x1(planes, planes * expansion, 1))),
      bn3_(add("bn3", nn::BatchNorm2d(planes * expansion))),
      relu_(add("relu", nn::ReLU())),
      downsample_(make_downsample(downsample, in_planes, planes * expansion, stride)) {
  if (downsample_) add("downsample", *downsample_);
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = relu_(bn1_(conv1_(x)));
  out = relu_(bn2_(conv2_(out)));
  out = bn3_(conv3_(out));
  const Tensor identity = downsample_ ? (*downsample_)(x) : x;
  return relu_(out + identity);
}

ResNet::ResNet(ResNetBlock block, std::array<int64_t, 4> blocks_per_stage, ResNetOptions options)
    : conv1_(add("conv1", nn::Conv2d(options.in_channels, 64, 7,
                                     {.stride = 2, .padding = 3, .bias = false}))),
      bn1_(add("bn1", nn::BatchNorm2d(64))),
      relu_(add("relu", nn::ReLU())),
      maxpool_(add("maxpool", nn::MaxPool2d(3, {.stride = 2, .padding = 1}))),
      // Braced initializers run in order, so the stages register as layer1..layer4.
      layers_{add("layer1", make_stage(block, 64, blocks_per_stage[0], 1)),
              add("layer2", make_stage(block, 128, blocks_per_stage[1], 2)),
              add("layer3", make_stage(block, 256, blocks_per_stage[2], 2)),
              add("layer4", make_stage(block, 512, blocks_per_stage[3], 2))},
      avgpool_(add("avgpool", nn::AdaptiveAvgPool2d(1))),
      fc_(add("fc", nn::Linear(in_planes_, options.num_classes))) {
  initialize(options.zero_init_residual);
}

nn::Sequential ResNet::make_stage(ResNetBlock block, int64_t planes, int64_t blocks,
                                  int64_t stride) {
  KILN_CHECK(blocks >= 1, "ResNet: every stage needs at least one block, got {}", blocks);
  const int64_t expansion =
      block == ResNetBlock::basic ? BasicBlock::expansion : Bottleneck::expansion;
  nn::Sequential stage;
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t block_stride = i == 0 ? stride : 1;
    const bool downsample = i == 0 && (stride != 1 || in_planes_ != planes * expansion);
    if (block == ResNetBlock::basic) {
      stage.push_back(BasicBlock(in_planes_, planes, block_stride, downsample));
    } else {
      stage.push_back(Bottleneck(in_planes_, planes, block_stride, downsample));
    }
    in_planes_ = planes * expansion;
  }
  return stage;
}

// As torchvision: kaiming_normal_(fan_out, relu) for every conv, BatchNorm weight 1 and
// bias 0, and with zero_init_residual the last BatchNorm weight of each block 0. Linear
// keeps its default initialization.
void ResNet::initialize(bool zero_init_residual) {
  for (nn::Module* m : modules()) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(m)) {
      nn::init::kaiming_normal_(conv->weight(), {.mode = nn::init::FanMode::fan_out,
                                                 .nonlinearity = nn::init::Nonlinearity::relu});
    } else if (auto* bn = dynamic_cast<nn::BatchNormBase*>(m)) {
      nn::init::ones_(bn->weight());
      nn::init::zeros_(bn->bias());
    }
  }
  if (!zero_init_residual) return;
  for (nn::Module* m : modules()) {
    if (auto* basic = dynamic_cast<BasicBlock*>(m)) nn::init::zeros_(basic->last_bn().weight());
    if (auto* bottleneck = dynamic_cast<Bottleneck*>(m)) {
      nn::init::zeros_(bottleneck->last_bn().weight());
    }
  }
}

Tensor ResNet::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 4, "ResNet: expected a 4-d input [N, C, H, W], got {} {}",
             shape_str(x.shape()), x.dtype());
  Tensor out = maxpool_(relu_(bn1_(conv1_(x))));
  for (nn::Sequential& stage : layers_) out = stage(out);
  return fc_(avgpool_(out).flatten(1));
}

nn::Sequential ResNet::layer(int64_t stage) const {
  KILN_CHECK(stage >= 1 && stage <= 4, "ResNet::layer: stage must be 1..4, got {}", stage);
  return layers_[static_cast<size_t>(stage - 1)];
}

ResNet resnet18(ResNetOptions options) { return ResNet(ResNetBlock::basic, {2, 2, 2, 2}, options); }
ResNet resnet34(ResNetOptions options) { return ResNet(ResNetBlock::basic, {3, 4, 6, 3}, options); }
ResNet resnet50(ResNetOptions options) {
  return ResNet(ResNetBlock::bottleneck, {3, 4, 6, 3}, options);
}
ResNet resnet101(ResNetOptions options) {
  return ResNet(ResNetBlock::bottleneck, {3, 4, 23, 3}, options);
}
ResNet resnet152(ResNetOptions options) {
  return ResNet(ResNetBlock::bottleneck, {3, 8, 36, 3}, options);
}

}  // namespace kiln::models
