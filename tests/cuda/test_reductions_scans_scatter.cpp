// The reductions and the scan that left the CUDA host fallback: var, std, logsumexp, all,
// any and norm (kernels/cuda/reduce_composed.cpp, composed of eager CUDA ops), prod and
// cumsum (kernels/cuda/prod_cumsum.cpp, hand-written); and scatter_add
// and sort/topk (kernels/cuda/indexing.cpp) and cross_entropy_prob_loss with its backward
// (kernels/cuda/loss.cpp), hand-written in the CPU's order: exact. On a GPU each equals the CPU for
// several shapes, dtypes, dims and strided inputs. (That the kernels compile to sm_90
// without a GPU is test_hand_kernels_loss_reduce_indexing.cpp's [nvrtc] test.) Tolerances, relative:
// - var, std, logsumexp, the finite norms, prod: the GPU's f64 sums and products group
//   differently from the CPU's loops and exp/log/sqrt/pow come from libdevice, so f32 agrees
//   to 1e-6 (a few ulp of the rounded result), f64 to 1e-12, the 16-bit floats to
//   testing::tol (one step of the dtype when a rounding flips);
// - all, any, the infinite norms, integer prod, cumsum: exact (no rounding, or the CPU's order).
#include <algorithm>
#include <cmath>

#include "core/ops/elementwise.h"
#include "core/ops/indexing.h"
#include "core/ops/loss.h"
#include "core/ops/reduce.h"
#include "cuda/cuda_testing.h"

using namespace kiln;
using kiln::testing::gpu;
using kiln::testing::host;
using kiln::testing::on_host_fallback;
using kiln::testing::values_in;

namespace {

// See the file comment.
double rounding_tol(DType dt) { return dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-6 : testing::tol(dt); }

// A CPU tensor and the same values on the GPU, contiguous or as a strided view there.
struct Pair {
  Tensor cpu, cuda;
  std::string what;
};

// x itself, x transposed (dims 0 and last) and every other element of its last dim, each
// on both devices; the GPU's views are views of GPU memory.
std::vector<Pair> layouts(const Tensor& x) {
  std::vector<Pair> pairs = {{x, gpu(x), "contiguous"}};
  if (x.dim() >= 2) pairs.push_back({x.transpose(0, -1), gpu(x).transpose(0, -1), "transposed"});
  if (x.dim() >= 1 && x.size(-1) > 1) {
    const int64_t n = x.size(-1);
    pairs.push_back({x.slice(-1, 0, n, 2), gpu(x).slice(-1, 0, n, 2), "every other"});
  }
  return pairs;
}

const std::vector<Shape> kShapes = {{6, 37}, {4, 5, 33}, {300}, {}, {3, 0, 4}};

std::vector<DimList> dim_lists(int64_t ndim) {
  if (ndim == 0) return {{}, {0}};
  if (ndim == 1) return {{}, {0}, {-1}};
  return {{}, {0}, {-1}, {0, ndim - 1}};
}

}  // namespace

TEST_CASE("var and std on the GPU equal the CPU for every correction and dim list", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kFloatDTypes) {
    for (const Shape& shape : kShapes) {
      for (const Pair& p : layouts(values_in(shape, -3, 3, dt, 5))) {
        for (const DimList& dims : dim_lists(p.cpu.dim())) {
          for (double correction : {0.0, 1.0, 2.5}) {
            for (bool keepdim : {false, true}) {
              INFO(fmt::format("{} {} {} dims {} correction {} keepdim {}", dt, p.cpu.meta_str(), p.what,
                               fmt::join(dims, ","), correction, keepdim));
              KILN_CHECK_CLOSE(host(var(p.cuda, dims, correction, keepdim)),
                               var(p.cpu, dims, correction, keepdim), rounding_tol(dt), 0);
              KILN_CHECK_CLOSE(host(kiln::std(p.cuda, dims, correction, keepdim)),
                               kiln::std(p.cpu, dims, correction, keepdim), rounding_tol(dt), 0);
            }
          }
        }
      }
    }
  }
  // One long row: the generated sums' two-pass path.
  const Tensor x = values_in({2, 300001}, -1, 5, DType::f32, 7);
  KILN_CHECK_CLOSE(host(var(gpu(x), {1})), var(x, {1}), 1e-6, 0);
  KILN_CHECK_CLOSE(host(kiln::std(gpu(x))), kiln::std(x), 1e-6, 0);
  CHECK_FALSE(on_host_fallback("var"));
  CHECK_FALSE(on_host_fallback("std"));
}

TEST_CASE("logsumexp on the GPU equals the CPU with infinities and integer inputs", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kFloatDTypes) {
    for (const Shape& shape : kShapes) {
      for (const Pair& p : layouts(values_in(shape, -20, 20, dt, 6))) {
        for (const DimList& dims : dim_lists(p.cpu.dim())) {
          for (bool keepdim : {false, true}) {
            INFO(fmt::format("{} {} {} dims {} keepdim {}", dt, p.cpu.meta_str(), p.what, fmt::join(dims, ","),
                             keepdim));
            KILN_CHECK_CLOSE(host(logsumexp(p.cuda, dims, keepdim)), logsumexp(p.cpu, dims, keepdim),
                             rounding_tol(dt), 0);
          }
        }
      }
    }
  }
  // A row of -inf gives -inf, a row with +inf gives +inf, a NaN gives NaN.
  Tensor x = values_in({4, 9}, -3, 3, DType::f32, 8);
  x[0].fill_(-INFINITY);
  x[1][3].fill_(INFINITY);
  x[2][5].fill_(std::nan(""));
  KILN_CHECK_CLOSE(host(logsumexp(gpu(x), {1})), logsumexp(x, {1}), 1e-6, 0);
  CHECK(std::isinf(host(logsumexp(gpu(x), {1}))[0].item<float>()));
  const Tensor ints = testing::small_integers({5, 7}, DType::i32);
  KILN_CHECK_CLOSE(host(logsumexp(gpu(ints), {1}, true)), logsumexp(ints, {1}, true), 1e-6, 0);
  CHECK_FALSE(on_host_fallback("logsumexp"));
}

TEST_CASE("all and any on the GPU equal the CPU in every dtype", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kAllDTypes) {
    for (const Shape& shape : kShapes) {
      // Zeros where the pattern gives 0 (one in 13), and whole rows of zeros and ones.
      Tensor x = testing::small_integers(shape, dt);
      if (x.dim() == 2) {
        x[0].fill_(0);
        x[1].fill_(1);
      }
      if (is_floating(dt) && x.numel() > 3) x.flatten()[3].fill_(std::nan(""));  // NaN is nonzero
      for (const Pair& p : layouts(x)) {
        for (const DimList& dims : dim_lists(p.cpu.dim())) {
          for (bool keepdim : {false, true}) {
            INFO(fmt::format("{} {} {} dims {} keepdim {}", dt, p.cpu.meta_str(), p.what, fmt::join(dims, ","),
                             keepdim));
            const Tensor all_gpu = host(all(p.cuda, dims, keepdim)), any_gpu = host(any(p.cuda, dims, keepdim));
            CHECK(all_gpu.dtype() == all(p.cpu, dims, keepdim).dtype());
            KILN_CHECK_EQUAL(all_gpu, all(p.cpu, dims, keepdim));
            KILN_CHECK_EQUAL(any_gpu, any(p.cpu, dims, keepdim));
          }
        }
      }
    }
  }
  CHECK_FALSE(on_host_fallback("all"));
  CHECK_FALSE(on_host_fallback("any"));
}

TEST_CASE("norm on the GPU equals the CPU for every p", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kFloatDTypes) {
    for (const Shape& shape : kShapes) {
      Tensor x = values_in(shape, -3, 3, dt, 9);
      x = where(lt(abs(x), 0.5), 0.0, x);  // zeros for p = 0 and the negative p
      for (const Pair& p : layouts(x)) {
        for (const DimList& dims : dim_lists(p.cpu.dim())) {
          for (double order : {0.0, 1.0, 2.0, 3.0, 0.5, -1.5, double(INFINITY), -double(INFINITY)}) {
            if (p.cpu.numel() == 0 && (order < 0 || std::isinf(order))) continue;  // rejected
            for (bool keepdim : {false, true}) {
              INFO(fmt::format("{} {} {} dims {} p {} keepdim {}", dt, p.cpu.meta_str(), p.what,
                               fmt::join(dims, ","), order, keepdim));
              const double t = std::isinf(order) ? 0 : rounding_tol(dt);
              KILN_CHECK_CLOSE(host(norm(p.cuda, order, dims, keepdim)), norm(p.cpu, order, dims, keepdim), t, 0);
            }
          }
        }
      }
    }
  }
  CHECK_FALSE(on_host_fallback("norm"));
}

TEST_CASE("prod on the GPU equals the CPU in every dtype", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kAllDTypes) {
    for (const Shape& shape : kShapes) {
      // Floats near 1 keep long products finite; integer products wrap as on the CPU.
      const Tensor x = is_floating(dt) ? values_in(shape, 0.6, 1.4, dt, 10) : testing::small_integers(shape, dt);
      for (const Pair& p : layouts(x)) {
        for (const DimList& dims : dim_lists(p.cpu.dim())) {
          for (bool keepdim : {false, true}) {
            INFO(fmt::format("{} {} {} dims {} keepdim {}", dt, p.cpu.meta_str(), p.what, fmt::join(dims, ","),
                             keepdim));
            const Tensor expected = prod(p.cpu, dims, keepdim);
            const Tensor actual = host(prod(p.cuda, dims, keepdim));
            CHECK(actual.dtype() == expected.dtype());
            KILN_CHECK_CLOSE(actual, expected, rounding_tol(dt), 0);
          }
        }
      }
    }
  }
  // The output dtype's instantiations: i32 (wrapping) and f16 products of other inputs.
  const Tensor ints = testing::small_integers({7, 40}, DType::i64);
  KILN_CHECK_EQUAL(host(prod(gpu(ints), {1}, false, DType::i32)), prod(ints, {1}, false, DType::i32));
  const Tensor near_one = values_in({7, 40}, 0.9, 1.1, DType::f32, 11);
  KILN_CHECK_CLOSE(host(prod(gpu(near_one), {0}, false, DType::f16)), prod(near_one, {0}, false, DType::f16),
                   testing::tol(DType::f16), 0);
  // A long row: one block's 256 threads and their combining steps.
  const Tensor long_row = values_in({100003}, 0.9999, 1.0001, DType::f64, 12);
  KILN_CHECK_CLOSE(host(prod(gpu(long_row))), prod(long_row), 1e-12, 0);
  CHECK_FALSE(on_host_fallback("prod"));
}

TEST_CASE("cumsum on the GPU equals the CPU exactly in every dtype and dim", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : testing::kAllDTypes) {
    for (const Shape& shape : kShapes) {
      const Tensor x = is_floating(dt) ? values_in(shape, -3, 3, dt, 13) : testing::small_integers(shape, dt);
      for (const Pair& p : layouts(x)) {
        for (int64_t dim = -std::max<int64_t>(1, p.cpu.dim()); dim < std::max<int64_t>(1, p.cpu.dim()); ++dim) {
          INFO(fmt::format("{} {} {} dim {}", dt, p.cpu.meta_str(), p.what, dim));
          const Tensor expected = cumsum(p.cpu, dim), actual = host(cumsum(p.cuda, dim));
          CHECK(actual.dtype() == expected.dtype());
          KILN_CHECK_EQUAL(actual, expected);
        }
      }
    }
  }
  const Tensor x = values_in({5, 70}, -3, 3, DType::f32, 14);
  KILN_CHECK_EQUAL(host(cumsum(gpu(x), 1, DType::f64)), cumsum(x, 1, DType::f64));
  KILN_CHECK_EQUAL(host(cumsum(gpu(x).t(), 0, DType::bf16)), cumsum(x.t(), 0, DType::bf16));
  CHECK_FALSE(on_host_fallback("cumsum"));
}

TEST_CASE("scatter_add on the GPU equals the CPU exactly in every dtype", "[cuda]") {
  KILN_NEEDS_GPU();
  // Repeated indices (sums in the index's order), an index smaller than src and the input,
  // strided inputs, both dims, a 0-d input.
  const Tensor index0 = from_vector<int64_t>({0, 4, 4, 1, 2, 0, 0, 3, 4, 4, 1, 1}, {3, 4});
  const Tensor index1 = from_vector<int64_t>({6, 6, 0, 2, 1, 1, 6, 3, 5, 5, 5, 0}, {3, 4});
  for (DType dt : testing::kAllDTypes) {
    const Tensor x = is_floating(dt) ? values_in({5, 7}, -3, 3, dt, 15) : testing::small_integers({5, 7}, dt);
    const Tensor src = is_floating(dt) ? values_in({4, 6}, -3, 3, dt, 16) : testing::small_integers({4, 6}, dt, 1);
    for (int64_t dim : {0, 1}) {
      const Tensor& index = dim == 0 ? index0 : index1;
      INFO(fmt::format("{} dim {}", dt, dim));
      KILN_CHECK_EQUAL(host(scatter_add(gpu(x), dim, gpu(index), gpu(src))), scatter_add(x, dim, index, src));
      // Strided: the input transposed back, src every other row and column of a larger one.
      const Tensor xt = gpu(x.t().contiguous()).t();
      const Tensor big = is_floating(dt) ? values_in({8, 12}, -3, 3, dt, 17) : testing::small_integers({8, 12}, dt, 2);
      const Tensor strided = big.slice(0, 0, 8, 2).slice(1, 0, 12, 2);
      const Tensor strided_gpu = gpu(big).slice(0, 0, 8, 2).slice(1, 0, 12, 2);
      KILN_CHECK_EQUAL(host(scatter_add(xt, dim, gpu(index), strided_gpu)), scatter_add(x, dim, index, strided));
    }
  }
  const Tensor scalar = full({}, 2.5), one = full({}, 1.5);
  KILN_CHECK_EQUAL(host(scatter_add(gpu(scalar), 0, gpu(zeros({}, {.dtype = DType::i64})), gpu(one))),
                   scatter_add(scalar, 0, zeros({}, {.dtype = DType::i64}), one));
  CHECK_FALSE(on_host_fallback("scatter_add"));
}

TEST_CASE("cross_entropy_prob_loss and its backward on the GPU equal the CPU exactly", "[cuda]") {
  KILN_NEEDS_GPU();
  // Every element's loss in f64 in class order and the reduced sum in the CPU's chunks: the
  // same numbers. [3000, 5] has more elements than one 2048-element chunk.
  for (DType dt : {DType::f32, DType::f64, DType::f16}) {
    for (const Shape& shape : {Shape{6, 5}, Shape{2, 5, 3}, Shape{5}, Shape{3000, 5}}) {
      const Tensor lp = values_in(shape, -4, 0, dt, 18);
      const Tensor target = values_in(shape, 0, 1, DType::f32, 19);  // converted to lp's dtype by the op
      for (bool weighted : {false, true}) {
        for (double smoothing : {0.0, 0.1}) {
          for (const char* reduction : {"none", "mean", "sum"}) {
            INFO(fmt::format("{} {} weighted {} smoothing {} {}", dt, shape_str(shape), weighted, smoothing, reduction));
            const Tensor w = values_in({5}, 0.5, 2, dt, 20);
            auto options = [&](Device d) {
              return CrossEntropyOptions{.weight = weighted ? w.to(d) : Tensor(), .reduction = reduction,
                                         .label_smoothing = smoothing};
            };
            const Tensor want = cross_entropy_prob_loss(lp, target, options(Device::cpu()));
            const Tensor got = cross_entropy_prob_loss(gpu(lp), gpu(target), options(Device::cuda()));
            KILN_CHECK_EQUAL(host(got), want);
            const Tensor g = values_in(want.shape(), -1, 1, dt, 21);
            KILN_CHECK_EQUAL(host(cross_entropy_prob_loss_backward(gpu(g), gpu(lp), gpu(target), options(Device::cuda()))),
                             cross_entropy_prob_loss_backward(g, lp, target, options(Device::cpu())));
          }
        }
      }
    }
  }
  // A strided target (a transposed copy's transpose).
  const Tensor lp = values_in({4, 6}, -3, 0, DType::f64, 22), target = values_in({4, 6}, 0, 1, DType::f64, 23);
  KILN_CHECK_EQUAL(host(cross_entropy_prob_loss(gpu(lp), gpu(target.t().contiguous()).t())),
                   cross_entropy_prob_loss(lp, target));
  for (const char* op : {"cross_entropy_prob_loss", "cross_entropy_prob_loss_backward"}) CHECK_FALSE(on_host_fallback(op));
}

TEST_CASE("sort and topk on the GPU give the CPU's values and positions exactly", "[cuda]") {
  KILN_NEEDS_GPU();
  // Small integers repeat (ties keep their positions' order), NaN sorts as the largest, both
  // directions, every dim, a strided input, k from 1 to the whole line. (The fallback list
  // is the process's: an earlier test's long sort may be on it already.)
  const bool sort_on_host_before = on_host_fallback("sort"), topk_on_host_before = on_host_fallback("topk");
  for (DType dt : testing::kAllDTypes) {
    for (const Shape& shape : {Shape{6, 37}, Shape{4, 5, 33}, Shape{300}, Shape{}}) {
      Tensor x = testing::small_integers(shape, dt);
      if (is_floating(dt) && x.numel() > 3) x.flatten().slice(0, 0, x.numel(), 7).fill_(std::nan(""));
      for (const Pair& p : layouts(x)) {
        for (int64_t dim = -std::max<int64_t>(1, p.cpu.dim()); dim < std::max<int64_t>(1, p.cpu.dim()); ++dim) {
          for (bool descending : {false, true}) {
            INFO(fmt::format("{} {} {} dim {} descending {}", dt, p.cpu.meta_str(), p.what, dim, descending));
            const auto [v, i] = sort(p.cpu, dim, descending);
            const auto [gv, gi] = sort(p.cuda, dim, descending);
            KILN_CHECK_EQUAL(host(gi), i);
            KILN_CHECK_EQUAL(host(gv), v);  // NaN equals NaN here
            const int64_t size = p.cpu.dim() == 0 ? 1 : p.cpu.size(dim);
            for (int64_t k : {int64_t{1}, size / 2, size}) {
              if (k == 0) continue;
              const auto [tv, ti] = topk(p.cpu, k, dim, descending);
              const auto [gtv, gti] = topk(p.cuda, k, dim, descending);
              KILN_CHECK_EQUAL(host(gti), ti);
              KILN_CHECK_EQUAL(host(gtv), tv);
            }
          }
        }
      }
    }
  }
  CHECK(on_host_fallback("sort") == sort_on_host_before);
  CHECK(on_host_fallback("topk") == topk_on_host_before);
  // A line longer than one block sorts: the host fallback, the same answer.
  const Tensor long_line = values_in({5000}, -1, 1, DType::f32, 24);
  KILN_CHECK_EQUAL(host(sort(gpu(long_line)).second), sort(long_line).second);
  CHECK(on_host_fallback("sort"));
}
