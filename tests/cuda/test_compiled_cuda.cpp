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
#include "core/cuda.h"
#include "cuda/cuda_testing.h"

using namespace kiln;
using namespace kiln::compiler;
using Catch::Matchers::Contains;

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

// `mode`: compile's; with reduce-overhead and max-autotune the loss weight lives on the GPU
// (a CPU input keeps a program out of CUDA graphs), and the micro-step graphs must have been
// captured (with max-autotune, after their kernels' launches were timed).
void check_step(const std::function<std::shared_ptr<nn::Module>()>& make, Shape input, DType dtype, double rtol,
                bool flatten = false, const std::string& mode = "default") {
  const Device gpu = Device::cuda();
  manual_seed(7);
  std::shared_ptr<nn::Module> model = make();
  manual_seed(7);
  std::shared_ptr<nn::Module> reference = make();
  model->to(dtype).to(gpu);
  reference->to(dtype).to(gpu);
  CompiledFunction compiled = compile(micro_step(model, flatten), {.mode = mode});
  const TracedFunction eager = micro_step(reference, flatten);
  const optim::SGDOptions opts{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-5};
  optim::SGD compiled_sgd(model->parameters(), opts), eager_sgd(reference->parameters(), opts);
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      const std::string at = fmt::format("step {} micro-step {}: ", step, micro);
      const Tensor weight = full({}, micro == 0 ? 1.0 / 3 : 2.0 / 3, {.dtype = DType::f64});
      const Args batch = {randn(input, {.dtype = dtype}).to(gpu), randint(0, 10, {input[0]}).to(gpu),
                          mode != "default" ? weight.to(gpu) : weight};
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
  if (mode == "max-autotune") {
    const std::string report = compiled.autotune_report();
    INFO(report);
    CHECK(report.find("us default") != std::string::npos);  // kernels timed
  }
  if (mode != "default") {
    // Two micro-step graphs (.grad undefined, defined), three calls each: trace, warm-up,
    // capture (whose replay is the call's work).
    const CudaGraphStats g = compiled.cuda_graphs();
    INFO(fmt::format("not captured: {}", fmt::join(g.skipped, "; ")));
    CHECK(g.skipped.empty());
    CHECK(g.captures == 2);
    CHECK(g.replays == 2);
    CHECK(g.pool_bytes > 0);
  }
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

TEST_CASE("a CUDA graph replays captured work on new contents; a capture that reads back fails cleanly", "[cuda]") {
  KILN_NEEDS_GPU();
  const Device gpu = Device::cuda();
  Tensor x = randn({1000}).to(gpu);
  Tensor y = relu(x) + x;  // compiles the kernels before the capture
  cuda::MemPool pool;
  cuda::CudaGraph graph;
  const int64_t mallocs = cuda::allocator_stats().cuda_mallocs;
  graph.capture(pool, [&] { y = relu(x) + x; });
  CHECK(graph.captured());
  CHECK(graph.num_nodes() >= 2);
  CHECK(pool.reserved_bytes() >= 2 * 1000 * 4);  // relu's result and y
  CHECK(cuda::allocator_stats().graph_pools >= pool.reserved_bytes());
  INFO("cudaMalloc calls during the capture: " << cuda::allocator_stats().cuda_mallocs - mallocs);
  graph.replay();
  check_relative("first replay", y, relu(x) + x, 0);
  x.copy_(randn({1000}).to(gpu));
  graph.replay();
  check_relative("replay after new contents", y, relu(x) + x, 0);
  // Blocks freed during the capture stay in the pool: an allocation outside it gets others.
  const Tensor outside = empty({1000}, {.device = gpu});
  graph.replay();
  CHECK(outside.data_ptr() != y.data_ptr());

  cuda::CudaGraph bad;
  CHECK_THROWS_WITH(bad.capture(pool, [&] { (void)sum(x).item<double>(); }), Contains("cuda::CudaGraph::capture"));
  CHECK(!bad.captured());
  check_relative("the device works after a failed capture", relu(x) + x, y, 0);
  // A copy from the host is refused (a replay would read host memory that has changed)...
  cuda::CudaGraph copies;
  const Tensor host_values = randn({1000});
  CHECK_THROWS_WITH(copies.capture(pool, [&] { (void)host_values.to(gpu); }), Contains("inside a CUDA graph capture"));
  // ...but a number in an eager op is a device constant kept from its first use.
  Tensor z = x * 2.5;
  cuda::CudaGraph scaled;
  scaled.capture(pool, [&] { z = x * 2.5; });
  x.copy_(randn({1000}).to(gpu));
  scaled.replay();
  check_relative("a captured multiplication by a number", z, x * 2.5, 0);
}

TEST_CASE("reduce-overhead replays a compiled function as a CUDA graph", "[cuda]") {
  KILN_NEEDS_GPU();
  const Device gpu = Device::cuda();
  const Tensor y = randn({33}).to(gpu);
  CompiledFunction f = compile([](const Args& a) -> Args { return {relu(a[0] * a[1] + 1) - sigmoid(a[0])}; },
                               {.mode = "reduce-overhead"});
  Args results;
  for (int call = 0; call < 5; ++call) {
    const Tensor x = randn({64, 33}).to(gpu);
    results.push_back(f({x, y}).at(0));
    check_relative(fmt::format("call {}", call), results.back(), relu(x * y + 1) - sigmoid(x), 1e-6);
  }
  // Results are the caller's: later replays did not overwrite them.
  for (size_t i = 0; i + 1 < results.size(); ++i) CHECK(results[i].data_ptr() != results[i + 1].data_ptr());
  const CudaGraphStats g = f.cuda_graphs();
  INFO(fmt::format("not captured: {}", fmt::join(g.skipped, "; ")));
  CHECK(g.skipped.empty());
  CHECK(g.captures == 1);
  CHECK(g.replays == 3);  // five calls: trace, warm-up, capture, two replays

  // A CPU input keeps the program out of graphs, and it says so; results stay right.
  CompiledFunction cpu_input = compile([](const Args& a) -> Args { return {a[0] * a[1]}; }, {.mode = "reduce-overhead"});
  const Tensor x = randn({8}).to(gpu), w = full({}, 3.0);
  for (int call = 0; call < 3; ++call) check_relative("CPU scalar", cpu_input({x, w}).at(0), x * 3, 0);
  REQUIRE(cpu_input.cuda_graphs().skipped.size() == 1);
  CHECK_THAT(cpu_input.cuda_graphs().skipped[0], Contains("is on cpu"));
}

TEST_CASE("reduce-overhead: an op a graph cannot hold leaves the program uncaptured, still right", "[cuda]") {
  KILN_NEEDS_GPU();
  // A sort of a line longer than 4096 elements runs through the host fallback on CUDA (a
  // copy to the host, which a capture refuses): the capture fails and the program runs as in
  // the default mode.
  const Device gpu = Device::cuda();
  CompiledFunction f = compile([](const Args& a) -> Args { return {sort(relu(a[0]) * 2).first}; },
                               {.mode = "reduce-overhead"});
  for (int call = 0; call < 4; ++call) {
    const Tensor x = randn({5000}).to(gpu);
    const Tensor want = sort(relu(x.to(Device::cpu())) * 2).first;
    check_relative(fmt::format("call {}", call), f({x}).at(0), want, 0);
  }
  const CudaGraphStats g = f.cuda_graphs();
  if (f.graph_breaks() > 0) return;  // the tracer split it instead: nothing to capture
  REQUIRE(g.skipped.size() == 1);
  CHECK_THAT(g.skipped[0], Contains("capture failed"));
  CHECK(g.replays == 0);
}

TEST_CASE("max-autotune training steps on the GPU equal eager ones", "[cuda]") {
  KILN_NEEDS_GPU();
  check_step([] { return std::make_shared<models::ConvNet>(models::ConvNet({.in_channels = 3, .num_classes = 10})); },
             {4, 3, 16, 16}, DType::f32, 1e-4, false, "max-autotune");
}

TEST_CASE("reduce-overhead training steps with accumulation on the GPU equal eager ones", "[cuda]") {
  KILN_NEEDS_GPU();
  check_step([] { return std::make_shared<models::MLP>(models::MLP({48, 32, 16, 10})); }, {4, 3, 4, 4}, DType::f64,
             1e-10, true, "reduce-overhead");
  check_step([] { return std::make_shared<models::ConvNet>(models::ConvNet({.in_channels = 3, .num_classes = 10})); },
             {4, 3, 16, 16}, DType::f32, 1e-4, false, "reduce-overhead");
}
