// Small models learn: an MLP fits XOR, and the small CNN's loss falls on a fixed batch.
// Plain SGD is written out here (an optimizer library comes later).
#include <vector>

#include "models/small_models.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
namespace F = kiln::nn::functional;

namespace {

// p -= lr * grad for every parameter, outside the graph; then the gradients are cleared.
void sgd_step(nn::Module& model, double lr) {
  NoGradGuard no_grad;
  for (Tensor& p : model.parameters()) p.sub_(p.grad() * lr);
  model.zero_grad();
}

}  // namespace

TEST_CASE("MLP builds Linear and ReLU layers from its sizes", "[zoo]") {
  models::MLP mlp({2, 8, 4, 1});
  REQUIRE(mlp.size() == 5);
  CHECK(mlp.at<nn::Linear>(0).weight().shape() == Shape{8, 2});
  CHECK(mlp[1].type_name() == "ReLU");
  CHECK(mlp.at<nn::Linear>(2).weight().shape() == Shape{4, 8});
  CHECK(mlp.at<nn::Linear>(4).weight().shape() == Shape{1, 4});
  CHECK(mlp(randn({3, 2})).shape() == Shape{3, 1});
  CHECK_THROWS_WITH(models::MLP({2}), Catch::Contains("MLP") && Catch::Contains("{2}"));
  CHECK_THROWS_WITH(models::MLP({2, 0, 1}), Catch::Contains("MLP") && Catch::Contains("{2, 0, 1}"));
}

TEST_CASE("an MLP learns XOR with plain SGD", "[zoo]") {
  manual_seed(0);
  models::MLP mlp({2, 8, 1});
  const Tensor x = from_vector<float>({0, 0, 0, 1, 1, 0, 1, 1}, {4, 2});
  const Tensor y = from_vector<float>({0, 1, 1, 0}, {4, 1});
  double loss_value = 0;
  for (int step = 0; step < 500; ++step) {
    const Tensor loss = F::mse_loss(mlp(x), y);
    loss_value = loss.item<float>();
    loss.backward();
    sgd_step(mlp, 0.1);
  }
  // Full-batch MSE; a fit that gets XOR right by a wide margin is far below 0.01.
  CHECK(loss_value < 0.01);
  NoGradGuard no_grad;
  const std::vector<double> predictions = kiln::testing::values(mlp(x));
  const std::vector<double> expected = {0, 1, 1, 0};
  for (size_t i = 0; i < 4; ++i) {
    INFO("input " << i << " predicts " << predictions[i]);
    CHECK((predictions[i] > 0.5) == (expected[i] > 0.5));
  }
}

TEST_CASE("the small CNN's loss falls on a fixed batch", "[zoo]") {
  manual_seed(0);
  models::SmallCNN cnn({.in_channels = 1, .num_classes = 4, .image_size = 8});
  cnn.train();
  const Tensor x = randn({8, 1, 8, 8});
  const Tensor y = randint(0, 4, {8});
  REQUIRE(cnn(x).shape() == Shape{8, 4});
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    const Tensor loss = F::cross_entropy(cnn(x), y);
    losses.push_back(loss.item<float>());
    loss.backward();
    sgd_step(cnn, 0.1);
  }
  INFO("first loss " << losses.front() << ", last loss " << losses.back());
  // Memorizing 8 examples: after 20 steps the loss is well under half the first one.
  CHECK(losses.back() < 0.5 * losses.front());
  CHECK_THROWS_WITH(cnn(randn({8, 1, 9, 9})),
                    Catch::Contains("SmallCNN") && Catch::Contains("[8,1,9,9]"));
  CHECK_THROWS_WITH(models::SmallCNN({.image_size = 3}), Catch::Contains("image_size"));
}

TEST_CASE("a CNN converted to channels_last trains as the contiguous one, SGD and AdamW", "[zoo][layout]") {
  // Module::to(MemoryFormat::channels_last) lays out the 4-d weights NHWC; the optimizers
  // keep their state in the parameters' memory order and update them in place. The same
  // arithmetic in another order of memory: the convolutions may sum in another order, so
  // the parameters agree to f32 rounding over a few steps, relative 1e-4.
  for (const bool adamw : {false, true}) {
    INFO((adamw ? "AdamW" : "SGD with momentum"));
    const models::SmallCNNOptions o{.in_channels = 3, .num_classes = 4, .image_size = 8, .channels1 = 4, .channels2 = 8};
    manual_seed(5);
    models::SmallCNN a(o);
    manual_seed(5);
    models::SmallCNN b(o);
    b.to(MemoryFormat::channels_last);
    for (const auto& [name, p] : b.named_parameters())
      if (p.dim() == 4) CHECK(p.is_contiguous(MemoryFormat::channels_last));
    auto make = [&](nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
      if (adamw) return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
      return std::make_unique<optim::SGD>(m.parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    };
    const auto opt_a = make(a), opt_b = make(b);
    for (int step = 0; step < 4; ++step) {
      const Tensor x = randn({6, 3, 8, 8}), y = randint(0, 4, {6});
      for (auto [m, opt] : {std::pair<nn::Module*, optim::Optimizer*>{&a, opt_a.get()}, {&b, opt_b.get()}}) {
        nn::functional::cross_entropy((*m)(x), y).backward();
        opt->step();
        opt->zero_grad();
      }
    }
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].first);
      const Tensor& p = pa[i].second;
      const Tensor& q = pb[i].second;
      KILN_CHECK_CLOSE(q, p, 1e-4, 1e-6);
      if (p.dim() == 4) CHECK(q.is_contiguous(MemoryFormat::channels_last));  // updated in place
    }
  }
}
