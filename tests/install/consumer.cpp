// A user's program: `using namespace kiln` as in the README, built with -Wall -Wextra -Werror.
#include <cmath>
#include <iostream>

#include <kiln.h>

using namespace kiln;

int main() {
  Tensor a = ones({2, 3}, {.dtype = DType::f32});
  Tensor b = a * 2 + 1;
  std::cout << b << "\n";
  bool ok = b[1][2].item<float>() == 3.0f;

  // A bare std(x) would be ambiguous with namespace std here; std_dev is the same op.
  Tensor x = from_vector<float>({1, 2, 3, 4, 6, 8}, {2, 3});
  Tensor s = std_dev(x, {1});  // [1, 2]
  std::cout << "std_dev " << s << "\n";
  ok = ok && s[0].item<float>() == 1.0f && s[1].item<float>() == 2.0f;
  ok = ok && kiln::std(x, {1})[1].item<float>() == 2.0f;

  // Designated initializers naming some fields only: every option field has a default.
  Tensor logits = zeros({2, 3}), target = from_vector<int64_t>({0, 1});
  const double loss =
      cross_entropy(logits, target, {.reduction = "sum", .label_smoothing = 0.1}).item<double>();
  std::cout << "cross_entropy " << loss << "\n";
  ok = ok && std::abs(loss - 2 * std::log(3.0)) < 1e-5;
  const double nll = nll_loss(log_softmax(logits, 1), target, {.ignore_index = 1}).item<double>();
  ok = ok && std::abs(nll - std::log(3.0)) < 1e-5;
  nn::Embedding embedding(4, 2, {});
  nn::MaxPool2d pool(2, {.padding = 0});
  const CompileOptions compile_options{.fullgraph = true, .trace = {.allow_break = false}};
  ok = ok && compile_options.cache_limit > 0;
  return ok ? 0 : 1;
}
