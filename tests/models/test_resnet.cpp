// ResNet against torchvision: parameter counts, state-dict keys, initialization, a training
// step's shapes and gradients, and a checkpoint round trip through safetensors.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "models/resnet.h"
#include "models/safetensors.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::same_bits;
using kiln::testing::values;

namespace {

int64_t count_parameters(const nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

bool all_equal_to(const Tensor& t, double v) {
  const std::vector<double> vs = values(t);
  return std::all_of(vs.begin(), vs.end(), [v](double x) { return x == v; });
}

bool all_finite(const Tensor& t) {
  const std::vector<double> vs = values(t);
  return std::all_of(vs.begin(), vs.end(), [](double x) { return std::isfinite(x); });
}

double sample_std(const Tensor& t) {
  const std::vector<double> vs = values(t);
  double mean = 0, sq = 0;
  for (double x : vs) mean += x;
  mean /= static_cast<double>(vs.size());
  for (double x : vs) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / static_cast<double>(vs.size() - 1));
}

}  // namespace

TEST_CASE("resnet50 has torchvision's parameter count and state dict keys", "[zoo]") {
  manual_seed(0);
  models::ResNet net = models::resnet50();
  CHECK(count_parameters(net) == 25'557'032);
  const StateDict state = net.state_dict();
  // 161 parameters, and per BatchNorm (53 of them) three buffers.
  CHECK(state.size() == 320);
  CHECK(net.named_buffers().size() == 3 * 53);
  for (const char* key :
       {"conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
        "layer1.0.downsample.0.weight", "layer1.0.downsample.1.running_var", "layer4.2.bn3.bias",
        "fc.weight", "fc.bias"}) {
    INFO(key);
    CHECK(state.count(key) == 1);
  }
  CHECK(state.at("conv1.weight").shape() == Shape{64, 3, 7, 7});
  CHECK(state.at("layer1.0.downsample.0.weight").shape() == Shape{256, 64, 1, 1});
  // v1.5: the stage's stride is on the 3x3 conv2, not on conv1.
  CHECK(net.layer(2).at<models::Bottleneck>(0).child("conv2")->type_name() == "Conv2d");
  CHECK(dynamic_cast<nn::Conv2d&>(*net.layer(2).at<models::Bottleneck>(0).child("conv2"))
            .options()
            .stride == nn::Int2(2));
  CHECK(dynamic_cast<nn::Conv2d&>(*net.layer(2).at<models::Bottleneck>(0).child("conv1"))
            .options()
            .stride == nn::Int2(1));
  CHECK(state.at("layer4.2.bn3.weight").shape() == Shape{2048});
  CHECK(state.at("bn1.num_batches_tracked").dtype() == DType::i64);
  CHECK(state.at("fc.weight").shape() == Shape{1000, 2048});
  CHECK(state.count("layer1.1.downsample.0.weight") == 0);
  CHECK(state.count("layer1.0.relu.weight") == 0);
}

TEST_CASE("resnet18 has torchvision's parameter count", "[zoo]") {
  manual_seed(0);
  CHECK(count_parameters(models::resnet18()) == 11'689'512);
}

TEST_CASE("the deeper resnets add blocks of torchvision's sizes", "[zoo]") {
  // Building resnet34/101/152 initializes 22M to 60M weights (seconds each on a shared CPU),
  // so the default run checks that torchvision's counts are resnet18's or resnet50's plus
  // the extra blocks, counted on single blocks; the hidden test below builds them whole.
  const auto basic = [](int64_t planes) {
    return count_parameters(models::BasicBlock(planes, planes, 1, false));
  };
  const auto bottleneck = [](int64_t planes) {
    return count_parameters(models::Bottleneck(4 * planes, planes, 1, false));
  };
  // resnet34 = resnet18 + {1, 2, 4, 1} basic blocks.
  CHECK(11'689'512 + basic(64) + 2 * basic(128) + 4 * basic(256) + basic(512) == 21'797'672);
  // resnet101 = resnet50 + 17 bottlenecks in layer3; resnet152 = resnet50 + 4 in layer2
  // and 30 in layer3.
  CHECK(25'557'032 + 17 * bottleneck(256) == 44'549'160);
  CHECK(25'557'032 + 4 * bottleneck(128) + 30 * bottleneck(256) == 60'192'808);
}

TEST_CASE("resnet34 resnet101 and resnet152 have torchvision's parameter counts", "[.][zoo]") {
  manual_seed(0);
  CHECK(count_parameters(models::resnet34()) == 21'797'672);
  CHECK(count_parameters(models::resnet101()) == 44'549'160);
  CHECK(count_parameters(models::resnet152()) == 60'192'808);
}

TEST_CASE("resnet18 trains a step at 32x32 with finite gradients everywhere", "[zoo]") {
  manual_seed(0);
  models::ResNet net = models::resnet18({.num_classes = 10});
  net.train();
  const Tensor x = randn({2, 3, 32, 32});
  const Tensor target = from_vector<int64_t>({3, 7}, {2});
  // num_classes changes only the classifier.
  CHECK(count_parameters(net) == 11'689'512 - 512 * 990 - 990);
  const Tensor logits = net(x);
  REQUIRE(logits.shape() == Shape{2, 10});
  CHECK(all_finite(logits));
  const Tensor loss = nn::functional::cross_entropy(logits, target);
  CHECK(std::isfinite(loss.item<float>()));
  loss.backward();
  const auto named = net.named_parameters();
  CHECK(named.size() == 62);
  for (const auto& [name, p] : named) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().shape() == p.shape());
    CHECK(all_finite(p.grad()));
  }
  // Every gradient flows: the classifier's bias gets softmax - one_hot, summing to zero.
  CHECK(std::fabs(kiln::sum(net.fc().bias().grad()).item<float>()) < 1e-6);
  CHECK(net.bn1().num_batches_tracked().item<int64_t>() == 1);
  CHECK_THROWS_WITH(net(randn({3, 32, 32})),
                    Catch::Contains("ResNet") && Catch::Contains("[3,32,32]"));
}

TEST_CASE("resnet initialization follows torchvision", "[zoo]") {
  manual_seed(0);
  // One block per stage keeps this cheap (the blocks are the ones the factories use).
  const auto check_block_norms = [](const StateDict& state, const std::string& last,
                                    bool zero_init) {
    for (int stage = 1; stage <= 4; ++stage) {
      const std::string block = "layer" + std::to_string(stage) + ".0.";
      INFO(block << last << " zero_init_residual=" << zero_init);
      CHECK(all_equal_to(state.at(block + last + ".weight"), zero_init ? 0.0 : 1.0));
      CHECK(all_equal_to(state.at(block + last + ".bias"), 0.0));
      CHECK(all_equal_to(state.at(block + "bn1.weight"), 1.0));
      if (state.count(block + "downsample.1.weight")) {
        CHECK(all_equal_to(state.at(block + "downsample.1.weight"), 1.0));
      }
    }
    CHECK(all_equal_to(state.at("bn1.weight"), 1.0));
    CHECK(all_equal_to(state.at("bn1.bias"), 0.0));
  };
  models::ResNet net(models::ResNetBlock::basic, {1, 1, 1, 1},
                     {.num_classes = 10, .in_channels = 1});
  CHECK(net.conv1().weight().shape() == Shape{64, 1, 7, 7});
  check_block_norms(net.state_dict(), "bn2", false);
  check_block_norms(models::ResNet(models::ResNetBlock::basic, {1, 1, 1, 1},
                                   {.num_classes = 10, .zero_init_residual = true})
                        .state_dict(),
                    "bn2", true);
  const StateDict bottleneck_state = models::ResNet(models::ResNetBlock::bottleneck, {1, 1, 1, 1},
                                                    {.num_classes = 10, .zero_init_residual = true})
                                         .state_dict();
  check_block_norms(bottleneck_state, "bn3", true);
  CHECK(all_equal_to(bottleneck_state.at("layer3.0.bn2.weight"), 1.0));

  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (64 * 7 * 7)) for the stem's 9408
  // weights; the sample std is within 5% (its relative standard error is about 0.7%).
  CHECK(sample_std(net.conv1().weight()) == Approx(std::sqrt(2.0 / (64 * 49))).epsilon(0.05));
  // The 1x1 shortcut conv of layer4: fan_out = 512.
  CHECK(sample_std(net.state_dict().at("layer4.0.downsample.0.weight")) ==
        Approx(std::sqrt(2.0 / 512)).epsilon(0.05));
  // Linear keeps its default: within 1 / sqrt(512).
  const std::vector<double> fc = values(net.fc().weight());
  CHECK(*std::max_element(fc.begin(), fc.end()) <= 1.0 / std::sqrt(512.0));
}

TEST_CASE("resnet18 state dict round trips through safetensors", "[zoo]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("kiln-zoo-{}", ::getpid());
  fs::create_directories(dir);
  const std::string path = (dir / "resnet18.safetensors").string();

  manual_seed(1);
  models::ResNet saved = models::resnet18({.num_classes = 10});
  {
    // One training-mode batch, so the running statistics are not their initial values.
    NoGradGuard no_grad;
    saved.train();
    saved(randn({2, 3, 32, 32}));
  }
  save_safetensors(saved.state_dict(), path);

  manual_seed(2);
  models::ResNet loaded = models::resnet18({.num_classes = 10});
  loaded.load_state_dict(load_safetensors(path));
  fs::remove_all(dir);

  const StateDict a = saved.state_dict(), b = loaded.state_dict();
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    REQUIRE(b.count(name) == 1);
    CHECK(same_bits(t, b.at(name)));
  }
  CHECK(loaded.bn1().num_batches_tracked().item<int64_t>() == 1);

  saved.eval();
  loaded.eval();
  NoGradGuard no_grad;
  const Tensor x = randn({2, 3, 32, 32});
  CHECK(same_bits(saved(x), loaded(x)));
}
