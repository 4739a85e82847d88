// The ops that left the CUDA host fallback for kernels of their own (kernels/cuda/loss.cpp,
// reduce.cpp, indexing.cpp, on kernels/cuda/hand_kernels.h): every hand-written kernel
// compiles to sm_90 without a GPU; on a GPU each op equals the CPU forward and backward.
// Tolerances: the losses compute in f64 as the CPU does and sum in its order, so f64 results
// agree to 1e-12 relative and f32 to 1e-6 (one rounding of the same f64 value); 16-bit
// results to testing::tol (an f64 value a hair from a rounding boundary may round the other
// way); mse_loss_backward is f32/f64 elementwise arithmetic in the CPU's order, 1e-6/1e-12.
// argmax, argmin, max/min with a dim and gather are exact.
#include <algorithm>
#include <cmath>
#include <map>

#include "compiler/compiler_testing.h"
#include "cuda/cuda_testing.h"
#include "kernels/cuda/hand_kernels.h"
#include "kernels/cuda/nvrtc.h"

using namespace kiln;
using kiln::testing::gpu;
using kiln::testing::host;
using kiln::testing::values_in;

namespace {

double loss_tol(DType dt) { return dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-6 : testing::tol(dt); }

// log_softmax of fixed logits: what the class-index losses take.
Tensor log_probs(const Shape& shape, DType dt, uint64_t seed = 3) {
  return log_softmax(values_in(shape, -3, 3, DType::f64, seed), 1).to(dt);
}

// Class indices in [0, classes) in a fixed pattern, with `ignored` at every 7th element.
Tensor targets(const Shape& shape, int64_t classes, int64_t ignored = -100) {
  std::vector<int64_t> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = i % 7 == 3 ? ignored : static_cast<int64_t>((i * 5 + 1) % static_cast<size_t>(classes));
  return from_vector<int64_t>(v).reshape(shape);
}

void check_class_index(const std::string& what, const Tensor& x, const Tensor& target,
                       const CrossEntropyOptions& o) {
  const DType dt = x.dtype();
  const double t = loss_tol(dt);
  INFO(fmt::format("{} {} {} reduction {} ignore_index {} smoothing {} weight {}", what, dt, shape_str(x.shape()),
                   o.reduction, o.ignore_index, o.label_smoothing, o.weight.defined()));
  CrossEntropyOptions og = o;
  if (o.weight.defined()) og.weight = gpu(o.weight);
  const NllLossOptions n{.weight = o.weight, .ignore_index = o.ignore_index, .reduction = o.reduction};
  const NllLossOptions ng{.weight = og.weight, .ignore_index = o.ignore_index, .reduction = o.reduction};
  const bool nll = o.label_smoothing == 0.0;
  const Tensor expected = nll ? nll_loss(x, target, n) : cross_entropy_loss(x, target, o);
  const Tensor actual = nll ? nll_loss(gpu(x), gpu(target), ng) : cross_entropy_loss(gpu(x), gpu(target), og);
  REQUIRE(actual.device() == Device::cuda(0));
  CHECK(actual.dtype() == expected.dtype());
  KILN_CHECK_CLOSE(host(actual), expected, t, t);
  const Tensor g = values_in(expected.shape(), 0.5, 2, dt, 9);
  const Tensor expected_grad =
      nll ? nll_loss_backward(g, x, target, n) : cross_entropy_loss_backward(g, x, target, o);
  const Tensor actual_grad = nll ? nll_loss_backward(gpu(g), gpu(x), gpu(target), ng)
                                 : cross_entropy_loss_backward(gpu(g), gpu(x), gpu(target), og);
  KILN_CHECK_CLOSE(host(actual_grad), expected_grad, t, t);
}

}  // namespace

TEST_CASE("hand-written CUDA kernels compile for sm_90 without spills", "[nvrtc]") {
  testing::TempCache cache;
  const std::vector<cuda::KernelSource> kernels = cuda::hand_written_kernels();
  // Every family of loss.cpp, reduce.cpp and indexing.cpp, in each dtype it serves.
  std::map<std::string, int> per_family;
  for (const cuda::KernelSource& k : kernels) per_family[k.name.substr(0, k.name.rfind('_'))]++;
  CHECK(per_family["kiln_class_index_elements"] == 4);
  CHECK(per_family["kiln_class_index_backward"] == 4);
  CHECK(per_family["kiln_ordered_finish"] == 4);
  CHECK(per_family["kiln_mse_chunks"] == 4);
  CHECK(per_family["kiln_chunk_sums"] == 1);
  CHECK(per_family["kiln_arg_reduce"] == 8);
  CHECK(per_family["kiln_gather"] == 4);
  // random.cpp, layer_norm.cpp and the rest of indexing.cpp.
  CHECK(per_family["kiln_dropout"] == 4);
  CHECK(per_family["kiln_uniform"] == 4);
  CHECK(per_family["kiln_normal"] == 4);
  CHECK(per_family["kiln_randint"] == 8);
  CHECK(per_family["kiln_layer_norm"] == 4);
  CHECK(per_family["kiln_layer_norm_backward"] == 4);
  CHECK(per_family["kiln_layer_norm_param_grads"] == 4);
  CHECK(per_family["kiln_select_rows"] == 4);
  CHECK(per_family["kiln_embedding_backward"] == 2);
  CHECK(per_family["kiln_one_hot"] == 1);
  CHECK(per_family["kiln_flip"] == 4);
  CHECK(per_family["kiln_triangle"] == 4);
  // prod_cumsum.cpp.
  CHECK(per_family["kiln_product"] == 8);
  CHECK(per_family["kiln_cumsum"] == 8);
  std::vector<std::pair<std::string, std::string>> sources;
  for (const cuda::KernelSource& k : kernels) sources.push_back({k.source, k.name});
  std::vector<cuda::CudaBinary> binaries;
  try {
    binaries = cuda::compile_cuda_batch(sources, {.arch = "sm_90"}, 2);
  } catch (const Error& e) {
    FAIL(e.what());
  }
  REQUIRE(binaries.size() == kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    INFO(kernels[i].name << "\n" << binaries[i].log);
    CHECK(binaries[i].cubin.compare(0, 4, "\x7f" "ELF") == 0);
    CHECK(binaries[i].registers > 0);
    CHECK(binaries[i].spill_store_bytes == 0);
    CHECK(binaries[i].spill_load_bytes == 0);
  }
}

TEST_CASE("nll_loss and cross_entropy_loss on the GPU equal the CPU with their backward ops", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kFloatDTypes) {
    const Tensor x2 = log_probs({9, 5}, dt), x3 = log_probs({3, 4, 6}, dt, 4);
    const Tensor t2 = targets({9}, 5), t3 = targets({3, 6}, 4);
    const Tensor w5 = values_in({5}, 0.2, 2, DType::f32, 6), w4 = values_in({4}, 0.2, 2, dt, 7);
    for (const char* reduction : {"none", "sum", "mean"}) {
      for (double smoothing : {0.0, 0.1}) {
        const CrossEntropyOptions o{.reduction = reduction, .label_smoothing = smoothing};
        check_class_index("[N C]", x2, t2, o);
        check_class_index("[N C S]", x3, t3, o);
        check_class_index("[N C] weighted", x2, t2, {.weight = w5, .reduction = reduction, .label_smoothing = smoothing});
        check_class_index("[N C S] weighted", x3, t3, {.weight = w4, .reduction = reduction, .label_smoothing = smoothing});
        check_class_index("ignore_index 2", x2, targets({9}, 5, 2), {.ignore_index = 2, .reduction = reduction, .label_smoothing = smoothing});
        check_class_index("a transposed input", log_probs({5, 9}, dt).t(), t2, o);
        check_class_index("a [C] input", log_probs({1, 5}, dt).reshape({5}), from_vector<int64_t>({3}).reshape({}), o);
      }
    }
  }
  // More than one 2048-element chunk: the chunk sums then the finish, as the CPU's ordered sum.
  const Tensor big = log_probs({3, 7, 1000}, DType::f32);
  const Tensor big_target = targets({3, 1000}, 7);
  for (const char* reduction : {"sum", "mean"}) {
    check_class_index("3000 elements", big, big_target, {.reduction = reduction});
    check_class_index("3000 elements smoothed weighted", big, big_target,
                      {.weight = values_in({7}, 0.5, 1.5, DType::f64, 8), .reduction = reduction, .label_smoothing = 0.2});
  }
  // Every target ignored: the mean is 0 / 0 on both devices.
  check_class_index("all ignored", log_probs({2, 3}, DType::f32), from_vector<int64_t>({-100, -100}), {});
}

TEST_CASE("a class index out of range on the GPU gives NaN instead of an error", "[cuda]") {
  KILN_NEEDS_GPU();
  const Tensor x = gpu(log_probs({3, 4}, DType::f32));
  const Tensor target = gpu(from_vector<int64_t>({1, 4, 0}));
  CHECK_THROWS_AS(nll_loss(host(x), host(target)), Error);  // the CPU raises
  CHECK(std::isnan(host(nll_loss(x, target)).item<float>()));
  const Tensor per_element = host(nll_loss(x, target, {.reduction = "none"}));
  CHECK_FALSE(std::isnan(per_element[0].item<float>()));
  CHECK(std::isnan(per_element[1].item<float>()));
  const Tensor grad = host(nll_loss_backward(gpu(full({}, 1.0f)), x, target, {.reduction = "sum"}));
  CHECK(std::isnan(grad[1][0].item<float>()));
  CHECK(grad[0][0].item<float>() == 0.0f);
}

TEST_CASE("mse_loss on the GPU equals the CPU with its backward op", "[cuda]") {
  KILN_NEEDS_GPU();
  struct Case {
    Shape a, b;
    DType da, db;
  };
  const std::vector<Case> cases = {{{4, 5}, {4, 5}, DType::f32, DType::f32},   {{4, 5}, {5}, DType::f32, DType::f32},
                                   {{3, 1}, {1, 6}, DType::f64, DType::f64},   {{4, 5}, {4, 5}, DType::f16, DType::f16},
                                   {{4, 5}, {4, 5}, DType::bf16, DType::bf16}, {{4, 5}, {4, 5}, DType::f32, DType::f64},
                                   {{3, 5000}, {3, 5000}, DType::f32, DType::f32}};
  for (const Case& c : cases) {
    const Tensor a = values_in(c.a, -2, 2, c.da, 1), b = values_in(c.b, -2, 2, c.db, 2);
    for (const char* reduction : {"none", "sum", "mean"}) {
      INFO(fmt::format("{} {} and {} {} reduction {}", shape_str(c.a), c.da, shape_str(c.b), c.db, reduction));
      const Tensor expected = mse_loss(a, b, reduction);
      const Tensor actual = mse_loss(gpu(a), gpu(b), reduction);
      CHECK(actual.dtype() == expected.dtype());
      const double t = loss_tol(expected.dtype());
      KILN_CHECK_CLOSE(host(actual), expected, t, t);
      const Tensor g = values_in(expected.shape(), -1, 1, expected.dtype(), 3);
      KILN_CHECK_CLOSE(host(mse_loss_backward(gpu(g), gpu(a), gpu(b), reduction)), mse_loss_backward(g, a, b, reduction),
                       t, t);
    }
  }
  // A strided operand.
  const Tensor a = values_in({6, 4}, -1, 1, DType::f32, 4), b = values_in({4, 6}, -1, 1, DType::f32, 5);
  KILN_CHECK_CLOSE(host(mse_loss(gpu(a), gpu(b).t(), "mean")), mse_loss(a, b.t(), "mean"), 1e-6, 1e-6);
}

TEST_CASE("argmax argmin and max and min with a dim on the GPU give the CPU's answers", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kAllDTypes) {
    // Small integers: many ties, where the first index must win; NaNs in the floats.
    Tensor x = testing::small_integers({6, 7, 5}, dt);
    if (is_floating(dt)) x = where(eq(x, 4.0), std::nan(""), x);
    for (int64_t dim : {0, 1, 2, -1}) {
      for (bool keepdim : {false, true}) {
        INFO(fmt::format("{} dim {} keepdim {}", dt, dim, keepdim));
        KILN_CHECK_EQUAL(host(argmax(gpu(x), dim, keepdim)), argmax(x, dim, keepdim));
        KILN_CHECK_EQUAL(host(argmin(gpu(x), dim, keepdim)), argmin(x, dim, keepdim));
        const auto [gv, gi] = max(gpu(x), dim, keepdim);
        const auto [cv, ci] = max(x, dim, keepdim);
        KILN_CHECK_EQUAL(host(gv), cv);
        KILN_CHECK_EQUAL(host(gi), ci);
        const auto [gv2, gi2] = min(gpu(x), dim, keepdim);
        const auto [cv2, ci2] = min(x, dim, keepdim);
        KILN_CHECK_EQUAL(host(gv2), cv2);
        KILN_CHECK_EQUAL(host(gi2), ci2);
      }
    }
    INFO(name(dt));
    KILN_CHECK_EQUAL(host(argmax(gpu(x))), argmax(x));
    KILN_CHECK_EQUAL(host(argmin(gpu(x).transpose(0, 2))), argmin(x.transpose(0, 2)));
    KILN_CHECK_EQUAL(host(max(gpu(x))), max(x));
    KILN_CHECK_EQUAL(host(min(gpu(x))), min(x));
  }
  // Long rows with few outputs: split over blocks, then the second pass. Ties and a NaN late.
  Tensor long_rows = testing::small_integers({2, 300001}, DType::f32);
  KILN_CHECK_EQUAL(host(argmax(gpu(long_rows), 1)), argmax(long_rows, 1));
  KILN_CHECK_EQUAL(host(argmin(gpu(long_rows))), argmin(long_rows));
  KILN_CHECK_EQUAL(host(argmax(gpu(long_rows).t(), 0)), argmax(long_rows.t(), 0));
  long_rows[1][250000].fill_(std::nan(""));
  KILN_CHECK_EQUAL(host(argmax(gpu(long_rows), 1)), argmax(long_rows, 1));
  KILN_CHECK_EQUAL(host(argmin(gpu(long_rows))), argmin(long_rows));
}

TEST_CASE("gather on the GPU equals the CPU in every dtype", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kAllDTypes) {
    INFO(name(dt));
    const Tensor x = testing::small_integers({4, 6, 3}, dt, 5);
    // An index smaller than the input outside `dim`, values in range of each dim.
    for (int64_t dim : {0, 1, 2}) {
      Shape shape = {3, 4, 2};
      const int64_t size = x.size(dim);
      std::vector<int64_t> v(static_cast<size_t>(numel_of(shape)));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7 + 2) % static_cast<size_t>(size));
      const Tensor index = from_vector<int64_t>(v).reshape(shape);
      INFO("dim " << dim);
      KILN_CHECK_EQUAL(host(gather(gpu(x), dim, gpu(index))), gather(x, dim, index));
      KILN_CHECK_EQUAL(host(gather(gpu(x).transpose(0, 1), dim == 0 ? 1 : dim == 1 ? 0 : 2, gpu(index).transpose(0, 1))),
                       gather(x.transpose(0, 1), dim == 0 ? 1 : dim == 1 ? 0 : 2, index.transpose(0, 1)));
    }
  }
  // The target class's log-probability: the gather of a hand-written loss.
  const Tensor lp = log_probs({8, 5}, DType::f32);
  const Tensor target = clamp_min(targets({8}, 5), 0).reshape({8, 1});
  KILN_CHECK_EQUAL(host(gather(gpu(lp), 1, gpu(target))), gather(lp, 1, target));
}

TEST_CASE("training losses on the GPU run without the host fallback", "[cuda]") {
  KILN_NEEDS_GPU();
  // cross_entropy forward and backward (log_softmax, nll_loss and its backward), an mse
  // regression step, and the accuracy's argmax: the same numbers as the CPU.
  const Tensor logits0 = values_in({8, 5}, -2, 2, DType::f32), target = targets({8}, 5);
  auto run = [&](Device d) {
    Tensor logits = logits0.to(d).detach().requires_grad_();
    const Tensor loss = cross_entropy(logits, target.to(d), {.label_smoothing = 0.1}) +
                        mse_loss(logits, zeros({8, 5}, {.device = d}));
    loss.backward();
    return std::vector<Tensor>{host(loss), host(logits.grad()), host(argmax(logits, 1))};
  };
  const std::vector<Tensor> cpu = run(Device::cpu()), cuda = run(Device::cuda());
  KILN_CHECK_CLOSE(cuda[0], cpu[0], 1e-5, 1e-6);
  KILN_CHECK_CLOSE(cuda[1], cpu[1], 1e-5, 1e-6);
  KILN_CHECK_EQUAL(cuda[2], cpu[2]);
  const std::vector<std::string> fallback = cuda::host_fallback_ops();
  INFO(fmt::format("host fallback: {}", fmt::join(fallback, ", ")));
  for (const char* op : {"nll_loss", "nll_loss_backward", "cross_entropy_loss", "cross_entropy_loss_backward",
                         "mse_loss", "mse_loss_backward", "argmax", "argmin", "max", "min", "gather"})
    CHECK(std::find(fallback.begin(), fallback.end(), op) == fallback.end());
}
