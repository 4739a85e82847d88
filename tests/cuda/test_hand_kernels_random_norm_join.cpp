// The ops that left the CUDA host fallback for kernels of their own in kernels/cuda/random.cpp,
// layer_norm.cpp, join.cpp and indexing.cpp: on a GPU each equals the CPU, forward and
// backward. (That every kernel compiles to sm_90 without a GPU is test_hand_kernels_loss_reduce_indexing.cpp's
// [nvrtc] test.) Tolerances:
// - dropout, uniform, randint: exact (the same Philox words and float arithmetic);
// - normal: CUDA's logf/cosf (log/cos) may differ from the C library's in the last bits, so
//   f32 agrees to 1e-6 relative (a few ulp) and f64 to 1e-14, 16-bit to testing::tol;
// - layer_norm: output, mean, rstd and grad_input exact (the CPU's lane order of its f64
//   row sums); grad_weight/grad_bias to 1e-12 (f64) and 1e-6 (f32) relative, testing::tol
//   for 16-bit, since the CPU adds per-thread partial sums when its threads split the rows;
// - cat, stack, pad, index_select, embedding (+ backward), one_hot, flip, tril, triu: exact.
#include <algorithm>

#include "compiler/compiler_testing.h"
#include "core/ops/dropout.h"
#include "cuda/cuda_testing.h"

using namespace kiln;
using kiln::testing::gpu;
using kiln::testing::host;
using kiln::testing::on_host_fallback;
using kiln::testing::values_in;

namespace {

// Relative tolerance of a normal sample computed in `dt` (see the file comment).
double normal_tol(DType dt) { return dt == DType::f64 ? 1e-14 : dt == DType::f32 ? 1e-6 : testing::tol(dt); }

// The parameter gradients' tolerance (see the file comment).
double param_grad_tol(DType dt) { return dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-6 : testing::tol(dt); }

}  // namespace

TEST_CASE("dropout on the GPU draws the CPU's mask and output bit for bit", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kFloatDTypes) {
    for (double p : {0.0, 0.3, 0.5, 1.0}) {
      INFO(fmt::format("{} p {}", dt, p));
      const Tensor x = values_in({5, 37}, -2, 2, dt, 1);
      Generator gc(77), gg(77);
      // Two calls each: the second starts at a nonzero offset.
      for (int call = 0; call < 2; ++call) {
        const auto [cpu_out, cpu_mask] = dropout_with_mask(x, p, true, &gc);
        const auto [gpu_out, gpu_mask] = dropout_with_mask(gpu(x), p, true, &gg);
        REQUIRE(gpu_out.device() == Device::cuda(0));
        KILN_CHECK_EQUAL(host(gpu_mask), cpu_mask);
        KILN_CHECK_EQUAL(host(gpu_out), cpu_out);
        const Tensor g = values_in({5, 37}, -1, 1, dt, 2);
        KILN_CHECK_EQUAL(host(dropout_backward(gpu(g), gpu_mask, p)), dropout_backward(g, cpu_mask, p));
      }
    }
  }
  // A transposed input: element i is the i-th in row-major order of the logical shape.
  const Tensor x = values_in({37, 6}, -2, 2, DType::f32, 3);
  Generator gc(5), gg(5);
  const auto [cpu_out, cpu_mask] = dropout_with_mask(x.t(), 0.4, true, &gc);
  const auto [gpu_out, gpu_mask] = dropout_with_mask(gpu(x).t(), 0.4, true, &gg);
  KILN_CHECK_EQUAL(host(gpu_mask), cpu_mask);
  KILN_CHECK_EQUAL(host(gpu_out), cpu_out);
  // A dropped inf stays visible as NaN on both devices, as x * 0.
  const Tensor inf = full({64}, std::numeric_limits<float>::infinity());
  Generator gi(9), gj(9);
  const Tensor cpu_inf = dropout(inf, 0.5, true, &gi), gpu_inf = host(dropout(gpu(inf), 0.5, true, &gj));
  CHECK(sum(ne(cpu_inf, cpu_inf)).item<int64_t>() > 0);  // NaN != NaN
  KILN_CHECK_EQUAL(ne(gpu_inf, gpu_inf), ne(cpu_inf, cpu_inf));
  CHECK_FALSE(on_host_fallback("dropout"));
}

TEST_CASE("rand randn and randint on the GPU follow the CPU's Philox stream", "[cuda]") {
  KILN_NEEDS_GPU();
  const Device cuda = Device::cuda();
  for (DType dt : testing::kFloatDTypes) {
    INFO(name(dt));
    Generator gc(123), gg(123);
    for (int call = 0; call < 2; ++call) {
      KILN_CHECK_EQUAL(host(rand({7, 33}, {.dtype = dt, .device = cuda}, &gg)), rand({7, 33}, {.dtype = dt}, &gc));
      const Tensor expected = randn({7, 33}, {.dtype = dt}, &gc);
      const Tensor actual = host(randn({7, 33}, {.dtype = dt, .device = cuda}, &gg));
      KILN_CHECK_CLOSE(actual, expected, normal_tol(dt), normal_tol(dt));
      INFO(fmt::format("normal samples equal bit for bit: {} of {}",
                       sum(eq(actual, expected)).item<int64_t>(), expected.numel()));
      Tensor u = empty({4, 9}, {.dtype = dt, .device = cuda}), uc = empty({4, 9}, {.dtype = dt});
      KILN_CHECK_EQUAL(host(uniform_(u, -3, 5, &gg)), uniform_(uc, -3, 5, &gc));
      Tensor n = empty({4, 9}, {.dtype = dt, .device = cuda}), nc = empty({4, 9}, {.dtype = dt});
      KILN_CHECK_CLOSE(host(normal_(n, 2, 0.5, &gg)), normal_(nc, 2, 0.5, &gc), normal_tol(dt), normal_tol(dt));
    }
  }
  for (DType dt : testing::kAllDTypes) {
    INFO(name(dt));
    const int64_t low = dt == DType::boolean ? 0 : dt == DType::u8 ? 3 : -40;
    const int64_t high = dt == DType::boolean ? 2 : 100;
    Generator gc(8), gg(8);
    for (int call = 0; call < 2; ++call)
      KILN_CHECK_EQUAL(host(randint(low, high, {6, 50}, {.dtype = dt, .device = cuda}, &gg)),
                       randint(low, high, {6, 50}, {.dtype = dt}, &gc));
  }
  // A large range: all 64 bits of the Philox words count.
  Generator gc(1), gg(1);
  KILN_CHECK_EQUAL(host(randint(-(int64_t{1} << 62), int64_t{1} << 62, {300}, {.dtype = DType::i64, .device = cuda}, &gg)),
                   randint(-(int64_t{1} << 62), int64_t{1} << 62, {300}, {.dtype = DType::i64}, &gc));
}

TEST_CASE("layer_norm on the GPU equals the CPU with its backward op", "[cuda]") {
  KILN_NEEDS_GPU();
  struct Case {
    Shape shape;
    std::vector<int64_t> normalized;
  };
  // Row lengths below 8 (only the tail), with a tail, multiples of 8, and a long row.
  const std::vector<Case> cases = {{{4, 3}, {3}}, {{5, 10}, {10}}, {{3, 5, 7}, {5, 7}}, {{6, 64}, {64}},
                                   {{2, 3, 1000}, {1000}}, {{33, 16}, {16}}};
  for (DType dt : testing::kFloatDTypes) {
    for (const Case& c : cases) {
      for (int params = 0; params < 4; ++params) {
        const bool with_weight = params & 1, with_bias = params & 2;
        INFO(fmt::format("{} {} normalized {} weight {} bias {}", dt, shape_str(c.shape), shape_str(c.normalized),
                         with_weight, with_bias));
        const Tensor x = values_in(c.shape, -2, 3, dt, 4);
        const Tensor w = with_weight ? values_in(c.normalized, 0.5, 1.5, dt, 5) : Tensor();
        const Tensor b = with_bias ? values_in(c.normalized, -1, 1, dt, 6) : Tensor();
        const LayerNormResult e = layer_norm_with_stats(x, c.normalized, w, b);
        const LayerNormResult a = layer_norm_with_stats(gpu(x), c.normalized, w.defined() ? gpu(w) : w,
                                                        b.defined() ? gpu(b) : b);
        REQUIRE(a.output.device() == Device::cuda(0));
        KILN_CHECK_EQUAL(host(a.output), e.output);
        KILN_CHECK_EQUAL(host(a.mean), e.mean);
        KILN_CHECK_EQUAL(host(a.rstd), e.rstd);
        const Tensor g = values_in(c.shape, -1, 1, dt, 7);
        const NormGrads eg = layer_norm_backward(g, x, c.normalized, e.mean, e.rstd, w);
        const NormGrads ag =
            layer_norm_backward(gpu(g), gpu(x), c.normalized, a.mean, a.rstd, w.defined() ? gpu(w) : w);
        KILN_CHECK_EQUAL(host(ag.grad_input), eg.grad_input);
        const double t = param_grad_tol(eg.grad_weight.dtype());
        KILN_CHECK_CLOSE(host(ag.grad_weight), eg.grad_weight, t, t);
        KILN_CHECK_CLOSE(host(ag.grad_bias), eg.grad_bias, t, t);
      }
    }
  }
  // A transposed input, f32 parameters of a bf16 input, and autograd through the op.
  const Tensor xt = values_in({12, 5}, -2, 2, DType::f32, 8).t();
  KILN_CHECK_EQUAL(host(layer_norm(gpu(values_in({12, 5}, -2, 2, DType::f32, 8)).t(), {12})), layer_norm(xt, {12}));
  const Tensor xb = values_in({3, 24}, -2, 2, DType::bf16, 9), wf = values_in({24}, 0.5, 1.5, DType::f32, 10);
  KILN_CHECK_EQUAL(host(layer_norm(gpu(xb), {24}, gpu(wf))), layer_norm(xb, {24}, wf));
  auto run = [&](Device d) {
    Tensor x = values_in({6, 20}, -2, 2, DType::f32, 11).to(d).requires_grad_();
    Tensor w = values_in({20}, 0.5, 1.5, DType::f32, 12).to(d).requires_grad_();
    Tensor b = values_in({20}, -1, 1, DType::f32, 13).to(d).requires_grad_();
    sum(layer_norm(x, {20}, w, b) * values_in({6, 20}, -1, 1, DType::f32, 14).to(d)).backward();
    return std::vector<Tensor>{host(x.grad()), host(w.grad()), host(b.grad())};
  };
  const std::vector<Tensor> cpu = run(Device::cpu()), cuda = run(Device::cuda());
  KILN_CHECK_EQUAL(cuda[0], cpu[0]);
  KILN_CHECK_CLOSE(cuda[1], cpu[1], 1e-6, 1e-6);
  KILN_CHECK_CLOSE(cuda[2], cpu[2], 1e-6, 1e-6);
  CHECK_FALSE(on_host_fallback("layer_norm"));
  CHECK_FALSE(on_host_fallback("layer_norm_backward"));
}

TEST_CASE("cat stack and pad on the GPU equal the CPU", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kAllDTypes) {
    INFO(name(dt));
    const Tensor a = testing::small_integers({3, 4, 5}, dt, 1), b = testing::small_integers({3, 2, 5}, dt, 2);
    const Tensor c = testing::small_integers({5, 1, 3}, dt, 3).transpose(0, 2);  // [3, 1, 5], strided
    KILN_CHECK_EQUAL(host(cat({gpu(a), gpu(b), gpu(c)}, 1)), cat({a, b, c}, 1));
    KILN_CHECK_EQUAL(host(cat({gpu(a), gpu(a)}, -1)), cat({a, a}, -1));
    KILN_CHECK_EQUAL(host(cat({gpu(a), flip(gpu(a), {0})}, 0)), cat({a, flip(a, {0})}, 0));
    for (int64_t dim : {0, 1, 3, -1})
      KILN_CHECK_EQUAL(host(stack({gpu(a), flip(gpu(a), {2}), gpu(b.narrow(1, 0, 1)).expand({3, 4, 5})}, dim)),
                       stack({a, flip(a, {2}), b.narrow(1, 0, 1).expand({3, 4, 5})}, dim));
    const std::vector<std::vector<int64_t>> pads = {{1, 2}, {0, 0, 2, 1}, {-1, 2, 1, -2}, {1, 1, 1, 1, 1, 1}};
    for (const auto& p : pads) {
      INFO(fmt::format("pads {}", fmt::join(p, " ")));
      KILN_CHECK_EQUAL(host(pad(gpu(a), p, 1)), pad(a, p, 1));
      KILN_CHECK_EQUAL(host(pad(gpu(a).transpose(0, 2), p)), pad(a.transpose(0, 2), p));
    }
  }
  // Mixed dtypes promote as on the CPU.
  const Tensor i = testing::small_integers({2, 3}, DType::i32), f = values_in({2, 3}, -1, 1, DType::f16);
  KILN_CHECK_EQUAL(host(cat({gpu(i), gpu(f)}, 0)), cat({i, f}, 0));
  for (const char* op : {"cat", "stack", "pad"}) CHECK_FALSE(on_host_fallback(op));
}

TEST_CASE("index_select embedding and its backward on the GPU equal the CPU", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kAllDTypes) {
    INFO(name(dt));
    const Tensor x = testing::small_integers({4, 6, 5}, dt, 2);
    for (int64_t dim : {0, 1, 2}) {
      std::vector<int64_t> picks = {3, 0, 0, 2, 1, 3, 2};
      for (int64_t& k : picks) k %= x.size(dim);
      const Tensor idx = from_vector<int64_t>(picks);
      INFO("dim " << dim);
      KILN_CHECK_EQUAL(host(index_select(gpu(x), dim, gpu(idx))), index_select(x, dim, idx));
      KILN_CHECK_EQUAL(host(index_select(gpu(x).transpose(0, 2), dim, gpu(idx).to(DType::i32))),
                       index_select(x.transpose(0, 2), dim, idx.to(DType::i32)));
    }
    KILN_CHECK_EQUAL(host(index_select(gpu(x), 1, gpu(from_vector<int64_t>({4}).reshape({})))),
                     index_select(x, 1, from_vector<int64_t>({4}).reshape({})));
  }
  const Tensor ids = from_vector<int64_t>({1, 4, 4, 0, 9, 1, 4, 7, 2, 4, 4, 3}).reshape({3, 4});
  for (DType dt : testing::kFloatDTypes) {
    INFO(name(dt));
    const Tensor weight = values_in({10, 6}, -1, 1, dt, 3);
    KILN_CHECK_EQUAL(host(embedding(gpu(weight), gpu(ids))), embedding(weight, ids));
    KILN_CHECK_EQUAL(host(embedding(gpu(values_in({6, 10}, -1, 1, dt, 3)).t(), gpu(ids))),
                     embedding(values_in({6, 10}, -1, 1, dt, 3).t(), ids));
    // Repeated indices sum in index order on both devices: exact.
    const Tensor g = values_in({3, 4, 6}, -1, 1, dt, 4);
    KILN_CHECK_EQUAL(host(embedding_backward(gpu(g), gpu(ids), 10)), embedding_backward(g, ids, 10));
    KILN_CHECK_EQUAL(host(embedding_backward(gpu(g), gpu(ids), 10, 4)), embedding_backward(g, ids, 10, 4));
    KILN_CHECK_EQUAL(host(embedding_backward(gpu(g), gpu(ids), 12, -2)), embedding_backward(g, ids, 12, -2));
  }
  // Many rows onto few weights, a wide row: several groups per column, long sums.
  std::vector<int64_t> rows(4000);
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<int64_t>((r * 3) % 7);
  const Tensor many = from_vector<int64_t>(rows);
  const Tensor gm = values_in({4000, 300}, -1, 1, DType::f32, 5);
  KILN_CHECK_EQUAL(host(embedding_backward(gpu(gm), gpu(many), 7)), embedding_backward(gm, many, 7));
  for (const char* op : {"index_select", "embedding", "embedding_backward"}) CHECK_FALSE(on_host_fallback(op));
}

TEST_CASE("one_hot flip tril and triu on the GPU equal the CPU", "[cuda]") {
  KILN_NEEDS_GPU();
  const Tensor classes = from_vector<int64_t>({2, 0, 4, 4, 1, 3}).reshape({2, 3});
  KILN_CHECK_EQUAL(host(one_hot(gpu(classes), 6)), one_hot(classes, 6));
  KILN_CHECK_EQUAL(host(one_hot(gpu(classes).t(), 5)), one_hot(classes.t(), 5));
  for (DType dt : testing::kAllDTypes) {
    INFO(name(dt));
    const Tensor x = testing::small_integers({3, 4, 5}, dt, 6);
    for (const std::vector<int64_t>& dims :
         std::vector<std::vector<int64_t>>{{0}, {2}, {-1, 0}, {0, 1, 2}, {}}) {
      INFO(fmt::format("dims {}", fmt::join(dims, " ")));
      KILN_CHECK_EQUAL(host(flip(gpu(x), dims)), flip(x, dims));
      KILN_CHECK_EQUAL(host(flip(gpu(x).transpose(0, 2), dims)), flip(x.transpose(0, 2), dims));
    }
    for (int64_t diagonal : {-2, -1, 0, 1, 3, 9}) {
      INFO("diagonal " << diagonal);
      KILN_CHECK_EQUAL(host(tril(gpu(x), diagonal)), tril(x, diagonal));
      KILN_CHECK_EQUAL(host(triu(gpu(x), diagonal)), triu(x, diagonal));
      KILN_CHECK_EQUAL(host(tril(gpu(x).transpose(1, 2), diagonal)), tril(x.transpose(1, 2), diagonal));
      KILN_CHECK_EQUAL(host(triu(gpu(x).transpose(1, 2), diagonal)), triu(x.transpose(1, 2), diagonal));
    }
  }
  for (const char* op : {"one_hot", "flip", "tril", "triu"}) CHECK_FALSE(on_host_fallback(op));
}
