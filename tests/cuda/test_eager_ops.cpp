// Eager ops on the GPU against the CPU: elementwise ops and reductions (kernels generated
// from the kernel IR through NVRTC), matrix products (cuBLAS), in-place forms and a small
// autograd graph. Tolerances: testing::tol(dtype) (f32 1e-5, f64 1e-12, f16 2e-3, bf16
// 1.6e-2, relative and absolute) for elementwise ops; the CUDA math library may differ from
// the host's by an ulp or two, which tol covers. Products: 1e-5 relative in f32 and 1e-12
// in f64 scaled by the inner size, 1e-2 with TF32 or 16-bit operands.
#include <algorithm>

#include "cuda/cuda_testing.h"
#include "core/ops/linear_cross_entropy.h"
#include "kernels/cuda/matmul.h"

using namespace kiln;
using kiln::testing::gpu;
using kiln::testing::host;
using kiln::testing::values_in;
using testing::tol;

namespace {


// The same op on the CPU and on the GPU: equal within tol of the result's dtype.
void check_same(const std::string& what, const std::function<Tensor(const std::vector<Tensor>&)>& op,
                const std::vector<Tensor>& inputs) {
  INFO(what);
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : inputs) on_gpu.push_back(gpu(t));
  const Tensor expected = op(inputs);
  const Tensor actual = op(on_gpu);
  REQUIRE(actual.device() == Device::cuda(0));
  CHECK(actual.dtype() == expected.dtype());
  const double t = tol(expected.dtype());
  KILN_CHECK_CLOSE(host(actual), expected, t, t);
}

}  // namespace

TEST_CASE("elementwise unary ops on the GPU equal the CPU in every floating dtype", "[cuda]") {
  KILN_NEEDS_GPU();
  using Fn = Tensor (*)(const Tensor&);
  const std::vector<std::pair<const char*, Fn>> positive = {
      {"log", kiln::log}, {"sqrt", kiln::sqrt}, {"rsqrt", kiln::rsqrt}, {"reciprocal", kiln::reciprocal}};
  const std::vector<std::pair<const char*, Fn>> any = {
      {"neg", kiln::neg},     {"abs", kiln::abs},   {"sign", kiln::sign},       {"exp", kiln::exp},
      {"log1p", kiln::log1p}, {"expm1", kiln::expm1}, {"sin", kiln::sin},        {"cos", kiln::cos},
      {"tanh", kiln::tanh},   {"sigmoid", kiln::sigmoid}, {"relu", kiln::relu}, {"silu", kiln::silu}};
  for (DType dt : testing::kFloatDTypes) {
    const Tensor x = values_in({3, 5, 7}, -3, 3, dt), p = values_in({3, 5, 7}, 0.1, 4, dt);
    for (const auto& [name, f] : any) check_same(fmt::format("{} {}", name, dt), [f](auto& in) { return f(in[0]); }, {x});
    for (const auto& [name, f] : positive)
      check_same(fmt::format("{} {}", name, dt), [f](auto& in) { return f(in[0]); }, {p});
    check_same(fmt::format("gelu {}", dt), [](auto& in) { return gelu(in[0]); }, {x});
    check_same(fmt::format("gelu tanh {}", dt), [](auto& in) { return gelu(in[0], "tanh"); }, {x});
    check_same(fmt::format("softplus {}", dt), [](auto& in) { return softplus(in[0], 2.0, 5.0); }, {x});
    check_same(fmt::format("gelu_backward {}", dt), [](auto& in) { return gelu_backward(kiln::cos(in[0]), in[0]); }, {x});
    check_same(fmt::format("gelu_backward tanh {}", dt),
               [](auto& in) { return gelu_backward(kiln::cos(in[0]), in[0], "tanh"); }, {x});
    check_same(fmt::format("clamp {}", dt), [](auto& in) { return clamp(in[0], -1.0, 0.5); }, {x});
    // A transposed (non-contiguous) input.
    check_same(fmt::format("exp of a transpose {}", dt), [](auto& in) { return kiln::exp(in[0].transpose(0, 2)); }, {x});
  }
}

TEST_CASE("elementwise binary ops on the GPU broadcast and promote as on the CPU", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kAllDTypes) {
    if (dt == DType::boolean) continue;
    const Tensor a = testing::small_integers({3, 1, 7}, dt), b = testing::small_integers({5, 1}, dt, 4);
    check_same(fmt::format("add {}", dt), [](auto& in) { return in[0] + in[1]; }, {a, b});
    check_same(fmt::format("sub alpha {}", dt), [](auto& in) { return sub(in[0], in[1], 2); }, {a, b});
    check_same(fmt::format("mul {}", dt), [](auto& in) { return in[0] * in[1]; }, {a, b});
    check_same(fmt::format("div {}", dt), [](auto& in) { return in[0] / (in[1] + 1); }, {a, b});
    check_same(fmt::format("maximum {}", dt), [](auto& in) { return maximum(in[0], in[1]); }, {a, b});
    check_same(fmt::format("minimum {}", dt), [](auto& in) { return minimum(in[0], in[1]); }, {a, b});
    check_same(fmt::format("lt {}", dt), [](auto& in) { return lt(in[0], in[1]); }, {a, b});
    check_same(fmt::format("eq {}", dt), [](auto& in) { return eq(in[0], in[1]); }, {a, b});
    check_same(fmt::format("times a number {}", dt), [](auto& in) { return in[0] * 3; }, {a});
  }
  const Tensor x = values_in({4, 6}, 0.5, 2, DType::f32), y = values_in({6}, -2, 2, DType::f32, 9);
  check_same("pow", [](auto& in) { return pow(in[0], in[1]); }, {x, y});
  check_same("f32 with f64 0-d", [](auto& in) { return in[0] * in[1]; }, {x, full({}, 0.25, {.dtype = DType::f64})});
  check_same("f16 with f32 promotes", [](auto& in) { return in[0] + in[1]; }, {x.to(DType::f16), y});
  check_same("where", [](auto& in) { return where(in[0] > 1, in[0], in[1]); }, {x, y});
  check_same("logical", [](auto& in) { return logical_and(in[0] > 1, logical_not(in[1] > 0)); }, {x, y});
  // A 0-d CPU tensor next to GPU tensors is moved to the GPU.
  const Tensor g = gpu(x) * full({}, 2.0, {.dtype = DType::f32});
  KILN_CHECK_CLOSE(host(g), x * 2, 0, 0);
}

TEST_CASE("casts fills and copies on the GPU", "[cuda]") {
  KILN_NEEDS_GPU();
  const Tensor x = values_in({4, 5}, -300, 300, DType::f64);
  for (DType from : testing::kAllDTypes)
    for (DType to : testing::kAllDTypes)
      check_same(fmt::format("cast {} to {}", from, to), [to](auto& in) { return in[0].to(to); }, {x.to(from)});
  const Tensor z = zeros({3, 4}, {.device = Device::cuda()}), o = ones({3, 4}, {.device = Device::cuda()});
  CHECK(sum(host(z)).item<float>() == 0.0f);
  CHECK(sum(host(o)).item<float>() == 12.0f);
  CHECK(host(full({2}, 7, {.dtype = DType::i64, .device = Device::cuda()}))[1].item<int64_t>() == 7);
  // In place: add_, mul_, zero_, copy_ into a strided view of a GPU tensor.
  Tensor a = gpu(x.to(DType::f32));
  a.add_(gpu(ones({5}))).mul_(2);
  KILN_CHECK_CLOSE(host(a), (x.to(DType::f32) + 1) * 2, 1e-6, 1e-6);
  Tensor cols = a.slice(1, 0, 5, 2);  // every other column: strided
  cols.copy_(gpu(full({4, 3}, -1.0)));
  CHECK(host(a)[2][2].item<float>() == -1.0f);
  CHECK(host(a)[2][1].item<float>() != -1.0f);
  a.zero_();
  CHECK(sum(kiln::abs(host(a))).item<float>() == 0.0f);
  // A non-contiguous GPU tensor goes to the CPU through a GPU copy.
  KILN_CHECK_CLOSE(host(gpu(x).transpose(0, 1)), x.transpose(0, 1), 0, 0);
}

TEST_CASE("reductions on the GPU equal the CPU", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kFloatDTypes) {
    const Tensor x = values_in({6, 33, 5}, -2, 2, dt);
    const double t = dt == DType::f32 ? 1e-5 : tol(dt);
    for (const DimList& dims : {DimList{}, DimList{1}, DimList{0, 2}, DimList{-1}}) {
      INFO(fmt::format("{} dims [{}]", dt, fmt::join(dims, ",")));
      KILN_CHECK_CLOSE(host(sum(gpu(x), dims)), sum(x, dims), t, t);
      KILN_CHECK_CLOSE(host(mean(gpu(x), dims, true)), mean(x, dims, true), t, t);
      KILN_CHECK_CLOSE(host(amax(gpu(x), dims)), amax(x, dims), 0, 0);
      KILN_CHECK_CLOSE(host(amin(gpu(x), dims)), amin(x, dims), 0, 0);
    }
  }
  const Tensor i = testing::small_integers({7, 9}, DType::i32);
  KILN_CHECK_EQUAL(host(sum(gpu(i), {0})), sum(i, {0}));
  const Tensor b = testing::small_integers({7, 9}, DType::boolean);
  KILN_CHECK_EQUAL(host(sum(gpu(b))), sum(b));
  // A large reduction: many blocks, many threads each.
  const Tensor big = values_in({3, 100000}, 0, 1, DType::f32);
  KILN_CHECK_CLOSE(host(sum(gpu(big), {1})), sum(big, {1}), 1e-5, 1e-3);
}

TEST_CASE("matrix products on the GPU through cuBLAS equal the CPU", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kFloatDTypes) {
    INFO(name(dt));
    const double t = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : 1e-2;
    const Tensor a = values_in({17, 33}, -1, 1, dt), b = values_in({33, 9}, -1, 1, dt, 5);
    KILN_CHECK_CLOSE(host(mm(gpu(a), gpu(b))), mm(a, b), t, t * 33);
    // Transposed operands go to cuBLAS as they are.
    KILN_CHECK_CLOSE(host(mm(gpu(b).t(), gpu(a).t())), mm(b.t(), a.t()), t, t * 33);
    const Tensor bias = values_in({9}, -1, 1, dt, 7);
    KILN_CHECK_CLOSE(host(addmm(gpu(bias), gpu(a), gpu(b), 0.5, 2)), addmm(bias, a, b, 0.5, 2), t, t * 66);
  }
  // A Linear: addmm(bias [n] or [1, n], x, w.t()) with beta 1 adds the bias in cuBLASLt's
  // epilogue (f64 keeps cuBLAS); operands as views at offsets and transposed.
  for (DType dt : testing::kFloatDTypes) {
    INFO("linear " << name(dt));
    const double t = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : 1e-2;
    const Tensor x = values_in({17, 32}, -1, 1, dt, 21), w = values_in({16, 32}, -1, 1, dt, 22);
    const Tensor bias = values_in({16}, -1, 1, dt, 23);
    // Each aligned case takes the epilogue (f64: none does).
    const int64_t lt = dt == DType::f64 ? 0 : 1;
    int64_t before = cuda::cublaslt_bias_epilogues();
    KILN_CHECK_CLOSE(host(addmm(gpu(bias), gpu(x), gpu(w).t())), addmm(bias, x, w.t()), t, t * 33);
    CHECK(cuda::cublaslt_bias_epilogues() == before + lt);
    before = cuda::cublaslt_bias_epilogues();
    KILN_CHECK_CLOSE(host(addmm(gpu(bias).unsqueeze(0), gpu(x), gpu(w).t(), 1, 0.5)),
                     addmm(bias.unsqueeze(0), x, w.t(), 1, 0.5), t, t * 33);
    CHECK(cuda::cublaslt_bias_epilogues() == before + lt);
    // x stored transposed (its columns contiguous), and a single row.
    const Tensor xt = values_in({32, 17}, -1, 1, dt, 25);
    before = cuda::cublaslt_bias_epilogues();
    KILN_CHECK_CLOSE(host(addmm(gpu(bias), gpu(xt).t(), gpu(w).t())), addmm(bias, xt.t(), w.t()), t, t * 33);
    CHECK(cuda::cublaslt_bias_epilogues() == before + lt);
    KILN_CHECK_CLOSE(host(addmm(gpu(bias), gpu(x).slice(0, 0, 1), gpu(w).t())), addmm(bias, x.slice(0, 0, 1), w.t()),
                     t, t * 33);
    // Misaligned: x rows of stride 40 from an odd offset, a bias one element into its buffer
    // (copied to an aligned vector first); the result is right whichever path runs.
    const Tensor wide = values_in({18, 40}, -1, 1, dt, 24);
    const Tensor xv = wide.slice(0, 1, 18).slice(1, 3, 35);
    KILN_CHECK_CLOSE(host(addmm(gpu(bias), gpu(wide).slice(0, 1, 18).slice(1, 3, 35), gpu(w).t())),
                     addmm(bias, xv, w.t()), t, t * 33);
    const Tensor long_bias = values_in({17}, -1, 1, dt, 26);
    KILN_CHECK_CLOSE(host(addmm(gpu(long_bias).slice(0, 1, 17), gpu(x), gpu(w).t())),
                     addmm(long_bias.slice(0, 1, 17), x, w.t()), t, t * 33);
  }
  // Batched with broadcasting, vectors, bmm, beta = 0 ignoring NaNs.
  const Tensor a = values_in({2, 1, 4, 3}, -1, 1, DType::f32), b = values_in({5, 3, 6}, -1, 1, DType::f32, 2);
  KILN_CHECK_CLOSE(host(matmul(gpu(a), gpu(b))), matmul(a, b), 1e-5, 1e-5);
  const Tensor v = values_in({3}, -1, 1, DType::f32, 4);
  KILN_CHECK_CLOSE(host(matmul(gpu(a), gpu(v))), matmul(a, v), 1e-5, 1e-5);
  KILN_CHECK_CLOSE(host(matmul(gpu(v), gpu(v))), matmul(v, v), 1e-5, 1e-5);
  const Tensor s = values_in({4, 3, 5}, -1, 1, DType::f64), r = values_in({4, 5, 2}, -1, 1, DType::f64, 6);
  KILN_CHECK_CLOSE(host(bmm(gpu(s), gpu(r))), bmm(s, r), 1e-12, 1e-12);
  const Tensor nan_bias = full({6}, std::nan(""));
  const Tensor m = values_in({4, 3}, -1, 1, DType::f32), n = values_in({3, 6}, -1, 1, DType::f32, 8);
  KILN_CHECK_CLOSE(host(addmm(gpu(nan_bias), gpu(m), gpu(n), 0, 1)), mm(m, n), 1e-5, 1e-5);
  // TF32: about 10 bits of mantissa in the products.
  cuda::set_allow_tf32(true);
  const Tensor big_a = values_in({128, 256}, -1, 1, DType::f32), big_b = values_in({256, 64}, -1, 1, DType::f32, 3);
  KILN_CHECK_CLOSE(host(mm(gpu(big_a), gpu(big_b))), mm(big_a, big_b), 1e-2, 5e-2);
  cuda::set_allow_tf32(false);
  CHECK_THROWS_WITH(mm(gpu(ones({2, 2}, {.dtype = DType::i64})), gpu(ones({2, 2}, {.dtype = DType::i64}))),
                    Catch::Contains("mm") && Catch::Contains("not supported on CUDA"));
}

// The compiler's activation epilogues (core/ops/linalg.h): cuBLASLt's RELU_BIAS,
// GELU_AUX_BIAS and DGELU_BGRAD against the CPU's chains of ops. cuBLASLt computes its tanh
// GELU with its own arithmetic (the hardware tanh approximation has a relative error up to
// 2^-11), so GELU results and derivatives get 2e-3 absolute and relative for values of
// magnitude up to about 3 here, on top of the products' tolerance; ReLU and the pre-activation
// are the products'.
TEST_CASE("addmm_activation and mm_gelu_backward on the GPU run in cuBLASLt's epilogues and equal the CPU",
          "[cuda][gemm_activations]") {
  KILN_NEEDS_GPU();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    INFO(name(dt));
    const double t = dt == DType::f32 ? 1e-5 : 1e-2, g = dt == DType::f32 ? 2e-3 : 2e-2;
    // n = 16 columns: a multiple of 8, as the auxiliary matrix's leading dimension must be.
    const Tensor x = values_in({17, 32}, -1, 1, dt, 31), w = values_in({16, 32}, -1, 1, dt, 32);
    const Tensor bias = values_in({16}, -1, 1, dt, 33);
    int64_t before = cuda::cublaslt_activation_epilogues();
    const AddmmActivation cpu_gelu = addmm_activation(bias, x, w.t(), "gelu_tanh");
    const AddmmActivation gpu_gelu = addmm_activation(gpu(bias), gpu(x), gpu(w).t(), "gelu_tanh");
    KILN_CHECK_CLOSE(host(gpu_gelu.pre), cpu_gelu.pre, t, t * 33);
    KILN_CHECK_CLOSE(host(gpu_gelu.out), cpu_gelu.out, g, g + t * 33);
    const AddmmActivation gpu_relu = addmm_activation(gpu(bias), gpu(x), gpu(w).t(), "relu");
    KILN_CHECK_CLOSE(host(gpu_relu.out), addmm_activation(bias, x, w.t(), "relu").out, t, t * 33);
    const Tensor grad = values_in({17, 24}, -1, 1, dt, 34), v = values_in({24, 16}, -1, 1, dt, 35);
    const MmGeluBackward cpu_back = mm_gelu_backward(grad, v, cpu_gelu.pre);
    const MmGeluBackward gpu_back = mm_gelu_backward(gpu(grad), gpu(v), gpu_gelu.pre);
    KILN_CHECK_CLOSE(host(gpu_back.grad_pre), cpu_back.grad_pre, g, g + t * 24);
    KILN_CHECK_CLOSE(host(gpu_back.grad_bias), cpu_back.grad_bias, g, 17 * (g + t * 24));
    // All three took the epilogues; 12 columns (no multiple of 8) take the chain of ops.
    CHECK(cuda::cublaslt_activation_epilogues() == before + 3);
    before = cuda::cublaslt_activation_epilogues();
    const Tensor w12 = values_in({12, 32}, -1, 1, dt, 36), b12 = values_in({12}, -1, 1, dt, 37);
    KILN_CHECK_CLOSE(host(addmm_activation(gpu(b12), gpu(x), gpu(w12).t(), "gelu_tanh").out),
                     addmm_activation(b12, x, w12.t(), "gelu_tanh").out, g, g + t * 33);
    CHECK(cuda::cublaslt_activation_epilogues() == before);
  }
}

// A language model's head and loss as one op: on CUDA the composed form (the rows found on
// the host, the products over them through cuBLAS). Against the CPU's kernels in f64 (1e-10:
// both sum the same terms in another order) and f32 (1e-4: the CUDA form's log-sum-exp is
// logsumexp in f32 over 300 classes, (V + 4) 2^-24 = 1.8e-5 relative, a few times over).
TEST_CASE("linear_cross_entropy on the GPU equals the CPU", "[cuda][linear_cross_entropy]") {
  KILN_NEEDS_GPU();
  for (DType dt : {DType::f64, DType::f32}) {
    INFO(name(dt));
    const double t = dt == DType::f64 ? 1e-10 : 1e-4;
    const Tensor x = values_in({37, 24}, -1, 1, dt, 41), w = values_in({300, 24}, -1, 1, dt, 42);
    const Tensor b = values_in({300}, -1, 1, dt, 43);
    std::vector<int64_t> targets(37);
    for (int64_t i = 0; i < 37; ++i) targets[static_cast<size_t>(i)] = i % 3 == 0 ? -100 : (i * 7 + 3) % 300;
    const Tensor target = from_vector(targets, {37});
    const LinearCrossEntropyResult cpu = linear_cross_entropy_with_stats(x, w, b, target);
    const LinearCrossEntropyResult cuda = linear_cross_entropy_with_stats(gpu(x), gpu(w), gpu(b), gpu(target));
    KILN_CHECK_CLOSE(host(cuda.loss), cpu.loss, t, t);
    CHECK(host(cuda.correct).item<int64_t>() == cpu.correct.item<int64_t>());
    KILN_CHECK_CLOSE(host(cuda.log_sum_exp), cpu.log_sum_exp, t, t);
    const Tensor g = full({}, 0.75, {.dtype = dt});
    const LinearCrossEntropyGrads want = linear_cross_entropy_backward(g, x, w, b, target, cpu.log_sum_exp, cpu.logits);
    const LinearCrossEntropyGrads got = linear_cross_entropy_backward(gpu(g), gpu(x), gpu(w), gpu(b), gpu(target),
                                                                      cuda.log_sum_exp, cuda.logits);
    KILN_CHECK_CLOSE(host(got.grad_input), want.grad_input, t, t);
    KILN_CHECK_CLOSE(host(got.grad_weight), want.grad_weight, t, t);
    KILN_CHECK_CLOSE(host(got.grad_bias), want.grad_bias, t, t);
  }
}

TEST_CASE("autograd through GPU ops gives the CPU's gradients", "[cuda]") {
  KILN_NEEDS_GPU();
  const Tensor x = values_in({8, 5}, -1, 1, DType::f64), w0 = values_in({5, 3}, -1, 1, DType::f64, 11),
               b0 = values_in({3}, -1, 1, DType::f64, 12);
  auto grads = [&](Device d) {
    Tensor w = w0.to(d).detach().requires_grad_(), b = b0.to(d).detach().requires_grad_();
    const Tensor loss = sum(kiln::tanh(addmm(b, x.to(d), w)) * 0.5);
    loss.backward();
    return std::vector<Tensor>{host(loss), host(w.grad()), host(b.grad())};
  };
  const std::vector<Tensor> cpu = grads(Device::cpu()), cuda = grads(Device::cuda());
  for (size_t i = 0; i < cpu.size(); ++i) KILN_CHECK_CLOSE(cuda[i], cpu[i], 1e-12, 1e-12);
}

TEST_CASE("factory ops on the GPU give the CPU's values", "[cuda]") {
  KILN_NEEDS_GPU();
  const Device d = Device::cuda();
  CHECK(empty({5}, {.device = d}).device() == d);
  KILN_CHECK_EQUAL(host(full({2, 3}, 1.5, {.device = d})), full({2, 3}, 1.5));
  KILN_CHECK_EQUAL(host(arange(0, 10, 1, {.device = d})), arange(0, 10));
  KILN_CHECK_EQUAL(host(eye(3, std::nullopt, {.device = d})), eye(3));
  // Every dtype, the arithmetic of the CPU kernels (generated on the GPU: no copy from the
  // host, which a CUDA graph could not hold).
  for (DType dt : testing::kAllDTypes) {
    INFO(name(dt));
    if (dt != DType::boolean) {
      KILN_CHECK_EQUAL(host(arange(-3, 40, 3, {.dtype = dt, .device = d})), arange(-3, 40, 3, {.dtype = dt}));
      if (is_floating(dt))
        KILN_CHECK_EQUAL(host(arange(0.1, 7.3, 0.7, {.dtype = dt, .device = d})), arange(0.1, 7.3, 0.7, {.dtype = dt}));
    }
    KILN_CHECK_EQUAL(host(linspace(-1.5, 2.25, 17, {.dtype = dt, .device = d})), linspace(-1.5, 2.25, 17, {.dtype = dt}));
    KILN_CHECK_EQUAL(host(eye(4, 6, {.dtype = dt, .device = d})), eye(4, 6, {.dtype = dt}));
  }
  KILN_CHECK_EQUAL(host(linspace(2, 3, 1, {.device = d})), linspace(2, 3, 1));
  CHECK_THROWS_WITH(arange(0, 3, 1, {.dtype = DType::boolean, .device = d}), Catch::Contains("bool"));
  Generator g1(5), g2(5);
  KILN_CHECK_EQUAL(host(randn({100}, {.device = d}, &g1)), randn({100}, {}, &g2));
  KILN_CHECK_EQUAL(host(rand({7}, {.device = d}, &g1)), rand({7}, {}, &g2));
}

TEST_CASE("softmax and cross entropy on the GPU equal the CPU with gradients", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(name(dt));
    const Tensor x = values_in({6, 10}, -4, 4, dt);
    check_same("softmax", [](auto& in) { return softmax(in[0], 1); }, {x});
    check_same("log_softmax", [](auto& in) { return log_softmax(in[0], -1); }, {x});
    check_same("softmax over dim 0", [](auto& in) { return softmax(in[0], 0); }, {x});
    const Tensor y = values_in({6, 10}, 0, 1, dt, 4), g = values_in({6, 10}, -1, 1, dt, 5);
    check_same("softmax_backward", [](auto& in) { return softmax_backward(in[0], in[1], 1); }, {g, softmax(y, 1)});
    check_same("log_softmax_backward", [](auto& in) { return log_softmax_backward(in[0], in[1], 1); },
               {g, log_softmax(y, 1)});
  }
  // Cross entropy (log_softmax, then nll_loss: CUDA kernels, no host fallback), forward and backward.
  const Tensor logits0 = values_in({8, 5}, -2, 2, DType::f64);
  const Tensor target = from_vector<int64_t>({0, 4, 2, 2, 1, 3, 0, 4});
  auto run = [&](Device d) {
    Tensor logits = logits0.to(d).detach().requires_grad_();
    const Tensor loss = cross_entropy(logits, target.to(d));
    loss.backward();
    return std::pair{host(loss), host(logits.grad())};
  };
  const auto [cpu_loss, cpu_grad] = run(Device::cpu());
  const auto [gpu_loss, gpu_grad] = run(Device::cuda());
  KILN_CHECK_CLOSE(gpu_loss, cpu_loss, 1e-12, 1e-12);
  KILN_CHECK_CLOSE(gpu_grad, cpu_grad, 1e-12, 1e-12);
  const std::vector<std::string> fallback = cuda::host_fallback_ops();
  INFO(fmt::format("host fallback: {}", fmt::join(fallback, ", ")));
  for (const char* op : {"nll_loss", "nll_loss_backward", "log_softmax", "log_softmax_backward"})
    CHECK(std::find(fallback.begin(), fallback.end(), op) == fallback.end());
}

TEST_CASE("SGD and AdamW steps on the GPU equal the CPU's", "[cuda]") {
  KILN_NEEDS_GPU();
  // Three steps of each optimizer on the same parameters and gradients, on both devices; f32
  // elementwise arithmetic in the same order (no FMA on the GPU: NVRTC gets --fmad=false).
  auto run = [](Device d, bool adamw) {
    Tensor w = values_in({7, 9}, -1, 1, DType::f32, 21).to(d).detach().requires_grad_();
    Tensor b = values_in({9}, -1, 1, DType::f32, 22).to(d).detach().requires_grad_();
    std::unique_ptr<optim::Optimizer> opt;
    if (adamw) opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{w, b}, optim::AdamWOptions{.lr = 0.01, .amsgrad = true});
    else opt = std::make_unique<optim::SGD>(std::vector<Tensor>{w, b},
                                            optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
    for (int step = 0; step < 3; ++step) {
      opt->zero_grad();
      const Tensor x = values_in({4, 7}, -1, 1, DType::f32, 30 + static_cast<uint64_t>(step)).to(d);
      sum(kiln::tanh(addmm(b, x, w))).backward();
      opt->step();
    }
    return std::pair{host(w), host(b)};
  };
  for (bool adamw : {false, true}) {
    INFO((adamw ? "AdamW" : "SGD"));
    const auto [cw, cb] = run(Device::cpu(), adamw);
    const auto [gw, gb] = run(Device::cuda(), adamw);
    KILN_CHECK_CLOSE(gw, cw, 1e-5, 1e-6);
    KILN_CHECK_CLOSE(gb, cb, 1e-5, 1e-6);
  }
}

TEST_CASE("reductions of many elements to few outputs run in two passes on the GPU", "[cuda]") {
  KILN_NEEDS_GPU();
  const Tensor x = values_in({3, 1 << 17}, -1, 1, DType::f32);
  KILN_CHECK_CLOSE(host(sum(gpu(x))), sum(x), 1e-6, 1e-3);
  KILN_CHECK_CLOSE(host(sum(gpu(x), {1}, true)), sum(x, {1}, true), 1e-6, 1e-3);
  KILN_CHECK_CLOSE(host(mean(gpu(x).t(), {0})), mean(x.t(), {0}), 1e-6, 1e-6);
  KILN_CHECK_EQUAL(host(amax(gpu(x))), amax(x));
  KILN_CHECK_EQUAL(host(amin(gpu(x), {1})), amin(x, {1}));
  const Tensor i = testing::small_integers({1 << 18}, DType::i32);
  KILN_CHECK_EQUAL(host(sum(gpu(i))), sum(i));
}
