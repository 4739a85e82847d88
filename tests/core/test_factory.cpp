// Factories: empty/zeros/ones/full, arange, linspace, eye, the random ones (range and
// moments), the _like forms and the options they store.
#include <algorithm>
#include <numeric>

#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("empty / zeros / ones and full", "[factory]") {
  Tensor e = empty({2, 3}, {.dtype = DType::i32});
  CHECK(e.shape() == Shape{2, 3});
  CHECK(e.dtype() == DType::i32);
  CHECK(e.is_contiguous());
  CHECK(empty({0, 4}).numel() == 0);
  CHECK(zeros({2, 2}).dtype() == DType::f32);
  CHECK(values(zeros({2, 2})) == std::vector<double>(4, 0.0));
  CHECK(values(ones({3}, {.dtype = DType::u8})) == std::vector<double>(3, 1.0));
  CHECK(ones({3}, {.dtype = DType::u8}).dtype() == DType::u8);
  CHECK(zeros({}).dim() == 0);
  // full infers the dtype from the value: float -> f32, int -> i64, bool -> bool.
  CHECK(full({2}, 2.5).dtype() == DType::f32);
  CHECK(values(full({2}, 2.5)) == std::vector<double>{2.5, 2.5});
  CHECK(full({2}, 7).dtype() == DType::i64);
  CHECK(values(full({2}, 7)) == std::vector<double>{7, 7});
  CHECK(full({2}, true).dtype() == DType::boolean);
  CHECK(full({2}, 7, {.dtype = DType::f16}).dtype() == DType::f16);
  CHECK(values(full({2}, -1.5, {.dtype = DType::bf16})) == std::vector<double>{-1.5, -1.5});
  CHECK(values(full({2}, 2.9, {.dtype = DType::i32})) == std::vector<double>{2, 2});
  CHECK_THROWS_WITH(zeros({2, -3}), Catch::Contains("negative size in [2,-3]"));
}

TEST_CASE("arange: ints / floats / negative steps and errors", "[factory]") {
  Tensor a = arange(5);
  CHECK(a.dtype() == DType::i64);
  CHECK(values(a) == std::vector<double>{0, 1, 2, 3, 4});
  CHECK(values(arange(2, 11, 3)) == std::vector<double>{2, 5, 8});
  CHECK(values(arange(5, 0, -1)) == std::vector<double>{5, 4, 3, 2, 1});
  CHECK(values(arange(5, -1, -2)) == std::vector<double>{5, 3, 1});
  Tensor f = arange(0, 1, 0.25);
  CHECK(f.dtype() == DType::f32);
  CHECK(values(f) == std::vector<double>{0, 0.25, 0.5, 0.75});
  CHECK(arange(2.5).dtype() == DType::f32);
  CHECK(values(arange(2.5)) == std::vector<double>{0, 1, 2});
  CHECK(arange(0, 1, 0.1).numel() == 10);  // ceil((end - start) / step)
  CHECK(values(arange(1, -1, -0.5)) == std::vector<double>{1, 0.5, 0, -0.5});
  CHECK(arange(3, 3).numel() == 0);
  CHECK(arange(4, {.dtype = DType::f64}).dtype() == DType::f64);
  CHECK(values(arange(3, {.dtype = DType::u8})) == std::vector<double>{0, 1, 2});
  CHECK_THROWS_WITH(arange(0, 5, 0), Catch::Contains("arange: step must be nonzero"));
  CHECK_THROWS_WITH(arange(5, 0, 1), Catch::Contains("arange") && Catch::Contains("inconsistent"));
  CHECK_THROWS_WITH(arange(0, 5, -1), Catch::Contains("inconsistent"));
}

TEST_CASE("linspace hits both ends exactly", "[factory]") {
  CHECK(values(linspace(0, 1, 5)) == std::vector<double>{0, 0.25, 0.5, 0.75, 1});
  for (int64_t steps : {2, 3, 7, 100, 101}) {
    Tensor l = linspace(-1.3, 2.7, steps);
    CHECK(l.numel() == steps);
    CHECK(l.data_ptr<float>()[0] == -1.3f);
    CHECK(l.data_ptr<float>()[steps - 1] == 2.7f);
    Tensor d = linspace(-1.3, 2.7, steps, {.dtype = DType::f64});
    CHECK(d.data_ptr<double>()[0] == -1.3);
    CHECK(d.data_ptr<double>()[steps - 1] == 2.7);
    // Evenly spaced within rounding.
    const double step = 4.0 / static_cast<double>(steps - 1);
    for (int64_t i = 0; i < steps; ++i)
      CHECK(d.data_ptr<double>()[i] == Approx(-1.3 + step * static_cast<double>(i)).margin(1e-12));
  }
  CHECK(values(linspace(3, 5, 1)) == std::vector<double>{3});
  CHECK(linspace(3, 5, 0).numel() == 0);
  // Integer dtypes convert through i64 (truncating; a negative value wraps into u8), bool
  // is v != 0.
  CHECK(values(linspace(-2.5, 1, 3, {.dtype = DType::i32})) == std::vector<double>{-2, 0, 1});
  CHECK(values(linspace(-2.5, 1, 3, {.dtype = DType::u8})) == std::vector<double>{254, 0, 1});
  CHECK(values(linspace(0, 1, 3, {.dtype = DType::boolean})) == std::vector<double>{0, 1, 1});
  CHECK(values(linspace(1, -1, 3)) == std::vector<double>{1, 0, -1});
  CHECK(values(linspace(0, 10, 5, {.dtype = DType::i64})) ==
        std::vector<double>{0, 2, 5, 7, 10});  // truncated
  CHECK_THROWS_WITH(linspace(0, 1, -1), Catch::Contains("linspace"));
}

TEST_CASE("eye / square and rectangular", "[factory]") {
  CHECK(values(eye(3)) == std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  Tensor r = eye(2, 4);
  CHECK(r.shape() == Shape{2, 4});
  CHECK(values(r) == std::vector<double>{1, 0, 0, 0, 0, 1, 0, 0});
  CHECK(values(eye(3, 2, {.dtype = DType::i32})) == std::vector<double>{1, 0, 0, 1, 0, 0});
  CHECK(eye(3, 2, {.dtype = DType::i32}).dtype() == DType::i32);
  CHECK(values(eye(2, std::nullopt, {.dtype = DType::boolean})) == std::vector<double>{1, 0, 0, 1});
  CHECK(eye(0).numel() == 0);
  CHECK_THROWS_WITH(eye(-1), Catch::Contains("eye"));
  CHECK_THROWS_WITH(eye(2, -1), Catch::Contains("eye"));
}

TEST_CASE("rand is in (0 / 1) with mean 1/2", "[factory]") {
  manual_seed(1234);
  for (DType dtype : kFloatDTypes) {
    INFO(name(dtype));
    Tensor r = rand({100000}, {.dtype = dtype});
    CHECK(r.dtype() == dtype);
    const std::vector<double> v = values(r);
    CHECK(*std::min_element(v.begin(), v.end()) >= 0.0);
    CHECK(*std::max_element(v.begin(), v.end()) < 1.0);
    // The standard error of the mean is sqrt(1/12 / 1e5) ~ 9e-4: 0.01 is > 10 sigma.
    CHECK(mean_of(v) == Approx(0.5).margin(0.01));
    CHECK(std_of(v) == Approx(std::sqrt(1.0 / 12)).margin(0.01));
  }
  Tensor u = empty({10000}, {.dtype = DType::f64});
  uniform_(u, -2, 3);
  const std::vector<double> v = values(u);
  CHECK(*std::min_element(v.begin(), v.end()) >= -2.0);
  CHECK(*std::max_element(v.begin(), v.end()) < 3.0);
  CHECK(mean_of(v) == Approx(0.5).margin(0.1));
  CHECK_THROWS_WITH(rand({2}, {.dtype = DType::i32}),
                    Catch::Contains("rand: dtype must be floating"));
}

TEST_CASE("randn has mean 0 and std 1", "[factory]") {
  manual_seed(99);
  for (DType dtype : {DType::f32, DType::f64}) {
    INFO(name(dtype));
    const std::vector<double> v = values(randn({100000}, {.dtype = dtype}));
    // Standard errors: mean 1/sqrt(1e5) ~ 3.2e-3, std 1/sqrt(2e5) ~ 2.2e-3. Tolerance 0.02.
    CHECK(mean_of(v) == Approx(0.0).margin(0.02));
    CHECK(std_of(v) == Approx(1.0).margin(0.02));
    CHECK(std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); }));
    // About 68.3% within one sigma (standard error ~1.5e-3).
    const double within = static_cast<double>(std::count_if(
                              v.begin(), v.end(), [](double x) { return std::fabs(x) < 1; })) /
                          static_cast<double>(v.size());
    CHECK(within == Approx(0.6827).margin(0.01));
  }
  Tensor n = zeros({20000});
  normal_(n, 5, 2);
  const std::vector<double> v = values(n);
  CHECK(mean_of(v) == Approx(5.0).margin(0.1));
  CHECK(std_of(v) == Approx(2.0).margin(0.1));
  CHECK(randn({3}, {.dtype = DType::f16}).dtype() == DType::f16);
  CHECK_THROWS_WITH(randn({2}, {.dtype = DType::i64}),
                    Catch::Contains("randn: dtype must be floating"));
}

TEST_CASE("randint stays in (low / high) and covers it", "[factory]") {
  manual_seed(7);
  Tensor r = randint(-3, 4, {5000});
  CHECK(r.dtype() == DType::i64);
  const std::vector<double> v = values(r);
  for (int k = -3; k < 4; ++k) CHECK(std::count(v.begin(), v.end(), k) > 500);  // ~714 each
  CHECK(std::count_if(v.begin(), v.end(), [](double x) { return x < -3 || x >= 4; }) == 0);
  Tensor u = randint(0, 256, {1000}, {.dtype = DType::u8});
  CHECK(u.dtype() == DType::u8);
  Tensor f = randint(10, 12, {100}, {.dtype = DType::f32});
  const std::vector<double> fv = values(f);
  CHECK(std::all_of(fv.begin(), fv.end(), [](double x) { return x == 10 || x == 11; }));
  CHECK_THROWS_WITH(randint(5, 5, {2}), Catch::Contains("randint: low 5 must be less than high 5"));
}

TEST_CASE("_like forms keep shape / dtype and device / options override", "[factory]") {
  Tensor x = arange(6, {.dtype = DType::i32}).view({2, 3}).t();
  Tensor z = zeros_like(x);
  CHECK(z.shape() == Shape{3, 2});
  CHECK(z.dtype() == DType::i32);
  CHECK(z.is_contiguous());
  CHECK(values(z) == std::vector<double>(6, 0.0));
  CHECK(values(ones_like(x)) == std::vector<double>(6, 1.0));
  CHECK(values(full_like(x, 2.5)) == std::vector<double>(6, 2.0));  // keeps i32: 2.5 -> 2
  CHECK(full_like(x, 2.5, {.dtype = DType::f32}).dtype() == DType::f32);
  CHECK(empty_like(x).dtype() == DType::i32);
  CHECK(ones_like(x, {.dtype = DType::f16}).dtype() == DType::f16);
  Tensor d = zeros({4}, {.dtype = DType::f64});
  CHECK(rand_like(d).dtype() == DType::f64);
  CHECK(randn_like(d).shape() == Shape{4});
  CHECK_THROWS_WITH(rand_like(x), Catch::Contains("rand: dtype must be floating"));
}

TEST_CASE("requires_grad is stored by every factory", "[factory]") {
  const TensorOptions g{.requires_grad = true};
  CHECK(zeros({2}, g).requires_grad());
  CHECK(ones({2}, g).requires_grad());
  CHECK(full({2}, 1.5, g).requires_grad());
  CHECK(empty({2}, g).requires_grad());
  CHECK(arange(3, g).requires_grad());
  CHECK(linspace(0, 1, 3, g).requires_grad());
  CHECK(eye(2, std::nullopt, g).requires_grad());
  CHECK(rand({2}, g).requires_grad());
  CHECK(randn({2}, g).requires_grad());
  CHECK(zeros_like(zeros({2}), g).requires_grad());
  CHECK_FALSE(zeros({2}).requires_grad());
  CHECK_FALSE(zeros_like(zeros({2}, g)).requires_grad());  // not inherited, as in PyTorch
}
