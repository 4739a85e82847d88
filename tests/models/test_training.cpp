// Small models learn: an MLP fits XOR, and the small CNN's loss falls on a fixed batch.
// Plain SGD is written out here (an optimizer library comes later).
#include <vector>

#include "models/small_models.h"
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
