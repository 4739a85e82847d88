// kiln::compile on CUDA tensors: fused groups become generated CUDA kernels (NVRTC), the
// rest runs as eager CUDA ops, and the compiled training step equals the eager one on the
// GPU: losses, gradients after each of two accumulation micro-steps, and parameters and
// batch-norm statistics after SGD steps. Tolerance: 1e-10 relative to each tensor's largest
// element in f64, 1e-5 in f32 for the MLP, 1e-4 for the ConvNet (fused and unfused kernels
// sum in other orders, and cuDNN's backward algorithms are not deterministic), 2e-3 for
// ResNet-18 at batch 2, whose batch norms over 2 samples (1x1 at the last stage) amplify
// those differences step by step: measured on an H200, within 1e-4 through the second
// optimizer step and 5e-4 after the third.
#include "compiler/compile.h"
#include "cuda/cuda_testing.h"

using namespace kiln;
using namespace kiln::compiler;

namespace {

using Args = std::vector<Tensor>;

void check_relative(const std::string& what, const Tensor& actual, const Tensor& expected, double rtol) {
  INFO(what);
  REQUIRE(actual.defined() == expected.defined());
  if (!actual.defined()) return;
  REQUIRE(actual.shape() == expected.shape());
  const Tensor a = actual.to(Device::cpu()).to(DType::f64), e = expected.to(Device::cpu()).to(DType::f64);
  const double diff = amax(abs(a - e)).item<double>();
  const double scale = e.numel() == 0 ? 0.0 : amax(abs(e)).item<double>();
  INFO("max |difference| " << diff << ", max |expected| " << scale);
  CHECK(diff <= (is_floating(expected.dtype()) ? rtol * scale : 0.0));
}

TracedFunction micro_step(std::shared_ptr<nn::Module> model, bool flatten) {
  return [model, flatten](const Args& args) -> Args {
    Tensor logits = (*model)(flatten ? args[0].flatten(1) : args[0]);
    Tensor loss = cross_entropy(logits, args[1]);
    (loss * args[2].to(loss.dtype())).backward();
    return {loss.detach()};
  };
}

void check_step(const std::function<std::shared_ptr<nn::Module>()>& make, Shape input, DType dtype, double rtol,
                bool flatten = false) {
  const Device gpu = Device::cuda();
  manual_seed(7);
  std::shared_ptr<nn::Module> model = make();
  manual_seed(7);
  std::shared_ptr<nn::Module> reference = make();
  model->to(dtype).to(gpu);
  reference->to(dtype).to(gpu);
  CompiledFunction compiled = compile(micro_step(model, flatten));
  const TracedFunction eager = micro_step(reference, flatten);
  const optim::SGDOptions opts{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-5};
  optim::SGD compiled_sgd(model->parameters(), opts), eager_sgd(reference->parameters(), opts);
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      const std::string at = fmt::format("step {} micro-step {}: ", step, micro);
      const Args batch = {randn(input, {.dtype = dtype}).to(gpu), randint(0, 10, {input[0]}).to(gpu),
                          full({}, micro == 0 ? 1.0 / 3 : 2.0 / 3, {.dtype = DType::f64})};
      const Args got = compiled(batch), want = eager(batch);
      check_relative(at + "loss", got.at(0), want.at(0), rtol);
      const auto params = model->named_parameters(), ref = reference->named_parameters();
      for (size_t i = 0; i < params.size(); ++i)
        check_relative(at + params[i].first + ".grad", params[i].second.grad(), ref[i].second.grad(), rtol);
    }
    compiled_sgd.step();
    eager_sgd.step();
    compiled_sgd.zero_grad();
    eager_sgd.zero_grad();
    const auto state = reference->state_dict();
    for (const auto& [name, t] : model->state_dict()) check_relative(fmt::format("step {}: {}", step, name), t, state.at(name), rtol);
  }
  CHECK(compiled.graph_breaks() == 0);
}

}  // namespace

TEST_CASE("a compiled pointwise function on CUDA tensors runs generated CUDA kernels", "[cuda]") {
  KILN_NEEDS_GPU();
  const Tensor x = randn({64, 33}).to(Device::cuda()), y = randn({33}).to(Device::cuda());
  CompiledFunction f =
      compile([](const Args& a) -> Args { return {relu(a[0] * a[1] + 1) - sigmoid(a[0])}; }, {.profile = true});
  f({x, y});
  const Tensor got = f({x, y}).at(0);
  CHECK(got.device() == Device::cuda());
  const Tensor want = relu(x * y + 1) - sigmoid(x);
  check_relative("pointwise", got, want, 1e-6);
  const std::string text = f.profile();
  INFO(text);
  CHECK(text.find("relu") != std::string::npos);  // one fused kernel: mul_add_relu_sigmoid_sub
}

TEST_CASE("compiled MLP training steps on the GPU equal eager ones", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dtype : {DType::f64, DType::f32}) {
    INFO(name(dtype));
    check_step([] { return std::make_shared<models::MLP>(models::MLP({48, 32, 16, 10})); }, {4, 3, 4, 4}, dtype,
               dtype == DType::f64 ? 1e-10 : 1e-5, true);
  }
}

TEST_CASE("compiled ConvNet and ResNet-18 training steps on the GPU equal eager ones", "[cuda]") {
  KILN_NEEDS_GPU();
  check_step([] { return std::make_shared<models::ConvNet>(models::ConvNet({.in_channels = 3, .num_classes = 10})); },
             {4, 3, 16, 16}, DType::f32, 1e-4);
  check_step([] { return std::make_shared<models::ResNet>(models::resnet18({.num_classes = 10, .zero_init_residual = true})); },
             {2, 3, 32, 32}, DType::f32, 2e-3);
}
