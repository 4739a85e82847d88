// Autocast's state is part of a compiled function's guards: the casts it adds are ops of
// the traced graph, so a call under another autocast state traces again. The casts fuse
// (fusion.h): into the pointwise kernels that produce or read them, and a GEMM's or
// convolution's result cast into the library call that makes it.
#include <memory>
#include <string>
#include <utility>

#include "compiler/codegen/cuda.h"
#include "compiler/compile.h"
#include "compiler/compiler_testing.h"
#include "compiler/fusion.h"
#include "compiler/program.h"
#include "core/autocast.h"
#include "kernels/cuda/nvrtc.h"
#include "testing.h"

using namespace kiln;
using Catch::Matchers::Contains;
using Args = std::vector<Tensor>;

TEST_CASE("compile guards on autocast and matches eager autocast", "[compile][autocast]") {
  manual_seed(3);
  const Tensor x = randn({4, 8}), w = randn({8, 5});
  auto fn = [](const Args& a) -> Args { return {relu(mm(a[0], a[1]))}; };
  CompiledFunction f = compile(fn, {.fullgraph = true});
  CHECK(f({x, w})[0].dtype() == DType::f32);
  Tensor compiled, eager;
  {
    autocast amp;
    compiled = f({x, w})[0];
    eager = fn({x, w})[0];
  }
  CHECK(f.recompiles() == 1);
  CHECK_THAT(f.last_recompile_reason(), Contains("autocast changed from off to bf16 on cpu"));
  REQUIRE(compiled.dtype() == DType::bf16);
  // The same casts, the same bf16 product (f32 accumulation either way), the same relu.
  KILN_CHECK_EQUAL(compiled.to(DType::f32), eager.to(DType::f32));
  int casts = 0;
  for (const compiler::Node& n : f.traces().at(1)->graph.nodes()) casts += n.op == "cast";
  CHECK(casts == 2);
  // Back outside the scope: the first graph again, no third trace.
  CHECK(f({x, w})[0].dtype() == DType::f32);
  CHECK(f.recompiles() == 1);
}

namespace {

// One training step of `model` with the forward and the loss under autocast (bf16 on the
// CPU) and backward outside it, as PyTorch's recipe and `kiln-ir --amp bf16` have it.
Args amp_step(nn::Module& model, const Args& a) {
  Tensor loss;
  {
    autocast amp;
    loss = cross_entropy(model(a[0]), a[1]);
  }
  loss.backward();
  return {loss.detach()};
}

std::shared_ptr<models::ResNet> small_resnet() {
  return std::make_shared<models::ResNet>(models::resnet18({.num_classes = 10, .zero_init_residual = true}));
}

}  // namespace

TEST_CASE("a GEMM's result cast is the GEMM's own step: the library call writes the converted result",
          "[compile][autocast][fusion]") {
  kiln::testing::TempCache cache;
  const compiler::Graph g = compiler::parse(R"(
%0 = input "a" : bf16[4,3]
%1 = input "b" : bf16[3,5]
%2 = mm(%0, %1) : bf16[4,5]
%3 = cast(%2) {dtype=f32} : f32[4,5]
return %3
)");
  const std::vector<compiler::ScheduleStep> steps = compiler::fuse(g);
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].converts_result());
  CHECK(steps[0].nodes == std::vector<int32_t>{2, 3});
  CHECK(compiler::stand_alone_casts(g, steps).total() == 0);
  manual_seed(5);
  const Tensor a = randn({4, 3}).to(DType::bf16), b = randn({3, 5}).to(DType::bf16);
  const compiler::Program program(g);
  CHECK_THAT(program.describe(), Contains("(as f32)"));
  const Tensor got = program.run({a, b}).at(0);
  REQUIRE(got.dtype() == DType::f32);
  // The f32 sum of the bf16 operands, not rounded to bf16 on the way (eager code's cast of
  // the bf16 product is that sum rounded).
  KILN_CHECK_EQUAL(got, mm(a.to(DType::f32), b.to(DType::f32)));
  KILN_CHECK_CLOSE(got, mm(a, b).to(DType::f32), 1.0 / 128, 0.0);

  // A pointwise reader of the cast takes it into its kernel instead (reading the narrower
  // dtype), so the GEMM's step stays the GEMM alone.
  const compiler::Graph h = compiler::parse(R"(
%0 = input "a" : bf16[4,3]
%1 = input "b" : bf16[3,5]
%2 = input "c" : f32[5]
%3 = mm(%0, %1) : bf16[4,5]
%4 = cast(%3) {dtype=f32} : f32[4,5]
%5 = add(%4, %2) : f32[4,5]
return %5
)");
  const std::vector<compiler::ScheduleStep> h_steps = compiler::fuse(h);
  REQUIRE(h_steps.size() == 2);
  CHECK_FALSE(h_steps[0].converts_result());
  CHECK(h_steps[1].nodes == std::vector<int32_t>{4, 5});
  CHECK(compiler::stand_alone_casts(h, h_steps).total() == 0);
}

// The mixed-precision issue's count (kiln-ir --amp bf16 reports it): a compiled ResNet
// step under autocast keeps stand-alone cast kernels only for values nothing computes (the
// parameters of its convolutions and classifier, the image) and for the classifier's
// 10-element bias gradient. The weight gradients' casts are their convolutions' and GEMMs'
// own steps, and so is the classifier's output (its addmm, bias included, runs in bf16 and
// writes f32 logits for cross entropy); the f32 gradient of the logits cast to bf16 for the
// classifier's GEMMs is stored by the bias gradient's sum, which reads it. That sum is in
// bf16, as PyTorch's addmm backward gives it, and widened to the f32 parameter's dtype by
// the one small cast.
TEST_CASE("a compiled ResNet step under autocast has no stand-alone casts but of parameters and the input",
          "[compile][autocast][fusion]") {
  manual_seed(0);
  std::shared_ptr<models::ResNet> model = small_resnet();
  model->train(true);
  const Tensor x = randn({2, 3, 16, 16}), y = randint(0, 10, {2});
  const compiler::Trace t =
      compiler::trace([&](const Args& a) { return amp_step(*model, a); }, {x, y}, compiler::module_names(*model));
  const compiler::Graph g = compiler::run_pipeline(t.graph, compiler::default_compile_passes());
  const std::vector<compiler::ScheduleStep> steps = compiler::fuse(g);
  const compiler::CastSteps casts = compiler::stand_alone_casts(g, steps);
  int64_t matrices = 0, converting = 0;  // convolution and classifier weights; steps that convert
  for (const auto& [name, p] : model->named_parameters()) matrices += p.dim() >= 2;
  for (const compiler::ScheduleStep& s : steps) converting += s.converts_result();
  CHECK(casts.of_inputs.size() == static_cast<size_t>(matrices + 2));  // the classifier's bias and the image
  // Every weight gradient comes out of its convolution or GEMM in f32 (before: a cast
  // kernel each, 21 here), and the logits out of the classifier's addmm.
  CHECK(converting == matrices + 1);
  REQUIRE(casts.of_computed.size() == 1);
  const compiler::Node& bias_cast = g.nodes()[static_cast<size_t>(steps[casts.of_computed[0]].nodes.at(0))];
  CHECK(bias_cast.outputs[0].shape == Shape{10});
  int64_t reductions_storing_casts = 0;
  for (const compiler::ScheduleStep& s : steps)
    reductions_storing_casts += s.kind == compiler::ScheduleStep::reduction && s.kernel.num_outputs() > 1;
  CHECK(reductions_storing_casts == 1);

  // The CUDA stage: the same schedule's kernels, rendered for NVRTC.
  std::vector<std::pair<std::string, std::string>> sources;
  for (const compiler::ScheduleStep& s : steps)
    if (s.is_kernel()) sources.push_back({compiler::codegen::render_cuda(s.kernel), compiler::codegen::cuda_symbol(s.kernel)});
  REQUIRE(sources.size() > 20);
  kiln::testing::TempCache cache;
  std::vector<cuda::CudaBinary> binaries;
  try {
    binaries = cuda::compile_cuda_batch(sources, {}, 2);
  } catch (const Error& e) {
    // A build without the CUDA toolkit renders CUDA but cannot compile it.
    if (std::string(e.what()).find("no CUDA backend") == std::string::npos) throw;
    WARN("NVRTC is not in this build: the CUDA renderings were not compiled");
  }
  for (const cuda::CudaBinary& b : binaries) CHECK(b.cubin.compare(0, 4, "\x7f" "ELF") == 0);
}

// Compiled equals eager under autocast, forward and backward, over two micro-steps (the
// second adds into .grad). Both sides get channels-last batches (the same NHWC kernels).
// Everything but the convolution and classifier weight gradients is bit for bit eager's;
// those come out of their library call in f32 instead of bf16 and then f32 (their step
// converts, fusion.h), so eager's differ from them by one bf16 rounding: 2^-8 relative,
// checked against the tensor's largest element (the second micro-step adds to it).
TEST_CASE("compiled equals eager under autocast for a ResNet training step, forward and backward",
          "[compile][autocast][equiv]") {
  manual_seed(1);
  std::shared_ptr<models::ResNet> model = small_resnet(), reference = small_resnet();
  kiln::testing::copy_parameters(*reference, *model);
  model->train(true);
  reference->train(true);
  CompiledFunction f = compile([&](const Args& a) { return amp_step(*model, a); },
                               {.fullgraph = true, .trace = compiler::module_names(*model)});
  for (int micro = 0; micro < 2; ++micro) {
    INFO("micro-step " << micro);
    const Args batch = {randn({2, 3, 16, 16}).contiguous(MemoryFormat::channels_last), randint(0, 10, {2})};
    const Tensor got = f(batch).at(0), want = amp_step(*reference, batch).at(0);
    if (micro == 0) KILN_CHECK_EQUAL(got, want);
    const auto params = model->named_parameters(), ref_params = reference->named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO(params[i].first);
      const Tensor a = params[i].second.grad(), e = ref_params[i].second.grad();
      REQUIRE(a.dtype() == DType::f32);
      if (params[i].second.dim() < 2 && micro == 0) {
        KILN_CHECK_EQUAL(a, e);
        continue;
      }
      const double scale = amax(abs(e)).item<double>();
      CHECK(amax(abs(a - e)).item<double>() <= scale / 256);
    }
  }
  CHECK(f.graph_breaks() == 0);
}

// A reduction kernel stores a conversion of the value it reduces as it walks it (a side
// output), bit for bit what a cast kernel stores, in the C++ kernel and in the CUDA one's
// rendering; the sum is unchanged.
TEST_CASE("a cast of a reduction's input rides along in the reduction's kernel", "[compile][autocast][fusion]") {
  kiln::testing::TempCache cache;
  const compiler::Graph g = compiler::parse(R"(
%0 = input "g" : f32[6,10]
%1 = input "w" : bf16[10,4]
%2 = sum(%0) {dims=[0], keepdim=true} : f32[1,10]
%3 = cast(%0) {dtype=bf16} : bf16[6,10]
%4 = mm(%3, %1) : bf16[6,4]
return %2, %4
)");
  const std::vector<compiler::ScheduleStep> steps = compiler::fuse(g);
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].kind == compiler::ScheduleStep::reduction);
  CHECK(steps[0].nodes == std::vector<int32_t>{2, 3});
  CHECK(compiler::stand_alone_casts(g, steps).total() == 0);
  CHECK_THAT(compiler::codegen::print(steps[0].kernel), Contains("out1["));
  CHECK_THAT(compiler::codegen::render_cuda(steps[0].kernel), Contains("out1["));
  manual_seed(6);
  for (bool transposed : {false, true}) {
    INFO("transposed input " << transposed);
    const Tensor x = transposed ? randn({10, 6}).t() : randn({6, 10}), w = randn({10, 4}).to(DType::bf16);
    const Args got = compiler::Program(g).run({x, w});
    KILN_CHECK_EQUAL(got.at(0), sum(x, {0}, true));
    KILN_CHECK_EQUAL(got.at(1), mm(x.to(DType::bf16), w));
  }
  // Not when the cast reads the sum's result, or when it is more than a conversion.
  const compiler::Graph h = compiler::parse(R"(
%0 = input "g" : f32[6,10]
%1 = sum(%0) {dims=[0], keepdim=true} : f32[1,10]
%2 = neg(%0) : f32[6,10]
return %1, %2
)");
  CHECK(compiler::fuse(h).size() == 2);
}
