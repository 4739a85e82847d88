// Backward formulas of the elementwise ops: gradcheck (f64, central differences, the
// default tolerances atol 1e-5 and rtol 1e-3) on contiguous, strided, broadcast and 0-d
// inputs and with number operands on either side; the conventions at non-differentiable
// points (ties, bounds, 0); dtypes of the gradients; f32 against f64.
#include <cmath>
#include <numbers>

#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

using Fn1 = std::function<Tensor(const Tensor&)>;
using Fn2 = std::function<Tensor(const Tensor&, const Tensor&)>;

// Twelve values on the real line, none near 0, +-0.5 or +-1 (where abs, relu, clamp and
// the tests' clamp bounds are not differentiable), and a second set never near the first
// (maximum and minimum have no ties, even broadcast).
const std::vector<double> kMixed = {-1.3, -0.7, 0.4, 1.1, -0.25, 0.9, 1.6, -1.9, 0.6, -0.45, 1.35, 0.8};
const std::vector<double> kPositive = {1.3, 0.7, 0.4, 1.1, 0.25, 0.9, 1.6, 1.9, 0.6, 0.45, 1.35, 0.8};
const std::vector<double> kOther = {0.35, -1.05, 1.5, -0.1, 0.75, -0.6, 0.05, 1.2, -1.45, 0.2, -0.85, 1.7};

// An f64 leaf that requires grad: `shape` from the first values (0-d: the first one),
// stored with gaps when `strided`.
Tensor leaf(const std::vector<double>& values, Shape shape, bool strided = false) {
  std::vector<double> v(values.begin(), values.begin() + numel_of(shape));
  Tensor t = tensor_of(v, shape, DType::f64);
  if (strided) t = strided_copy(t);
  t.requires_grad_();
  return t;
}

bool check1(const Fn1& fn, const Tensor& x) {
  return gradcheck([&](const std::vector<Tensor>& in) { return fn(in[0]); }, {x});
}
bool check2(const Fn2& fn, const Tensor& a, const Tensor& b) {
  return gradcheck([&](const std::vector<Tensor>& in) { return fn(in[0], in[1]); }, {a, b});
}

// The gradient of sum(fn(x) * cotangent) with respect to x.
Tensor grad_of(const Fn1& fn, const Tensor& x, const Tensor& cotangent) {
  x.set_grad({});
  fn(x).backward(cotangent);
  return x.grad();
}

struct UnaryCase {
  const char* name;
  Fn1 fn;
  const std::vector<double>* values;
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& x) { return -x; }, &kMixed},
      {"abs", [](const Tensor& x) { return abs(x); }, &kMixed},
      {"sign", [](const Tensor& x) { return sign(x) * x; }, &kMixed},
      {"exp", [](const Tensor& x) { return exp(x); }, &kMixed},
      {"log", [](const Tensor& x) { return log(x); }, &kPositive},
      {"log1p", [](const Tensor& x) { return log1p(x); }, &kPositive},
      {"expm1", [](const Tensor& x) { return expm1(x); }, &kMixed},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, &kPositive},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, &kPositive},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, &kMixed},
      {"sin", [](const Tensor& x) { return sin(x); }, &kMixed},
      {"cos", [](const Tensor& x) { return cos(x); }, &kMixed},
      {"tanh", [](const Tensor& x) { return tanh(x); }, &kMixed},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, &kMixed},
      {"relu", [](const Tensor& x) { return relu(x); }, &kMixed},
      {"gelu", [](const Tensor& x) { return gelu(x); }, &kMixed},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, &kMixed},
      {"silu", [](const Tensor& x) { return silu(x); }, &kMixed},
      {"softplus", [](const Tensor& x) { return softplus(x); }, &kMixed},
      // beta x crosses the threshold 1.5 at x = 0.75: both branches are exercised.
      {"softplus beta 2 threshold 1.5", [](const Tensor& x) { return softplus(x, 2.0, 1.5); }, &kMixed},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 1.0); }, &kMixed},
      {"clamp_min", [](const Tensor& x) { return clamp_min(x, 0.5); }, &kMixed},
      {"clamp_max", [](const Tensor& x) { return clamp_max(x, -0.5); }, &kMixed},
      {"clamp integer bound", [](const Tensor& x) { return clamp(x, -1, 1); }, &kMixed},
      {"cast", [](const Tensor& x) { return call_op1(find_op("cast"), {x}, {{"dtype", DType::f64}}); }, &kMixed},
      {"clone", [](const Tensor& x) { return x.clone() * x; }, &kMixed},
  };
  return cases;
}

struct BinaryCase {
  const char* name;
  Fn2 fn;
  const std::vector<double>* a;
  const std::vector<double>* b;
};

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, &kMixed, &kOther},
      {"add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, 2.5); }, &kMixed, &kOther},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, &kMixed, &kOther},
      {"sub alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, -3); }, &kMixed, &kOther},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, &kMixed, &kOther},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, &kMixed, &kPositive},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, &kPositive, &kOther},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, &kMixed, &kOther},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, &kMixed, &kOther},
      {"where", [](const Tensor& a, const Tensor& b) { return where(a * b > 0, a, b); }, &kMixed, &kOther},
      // gelu's second derivative, both forms.
      {"gelu_backward", [](const Tensor& g, const Tensor& x) { return gelu_backward(g, x); }, &kOther, &kMixed},
      {"gelu_backward tanh", [](const Tensor& g, const Tensor& x) { return gelu_backward(g, x, "tanh"); },
       &kOther, &kMixed},
  };
  return cases;
}

}  // namespace

TEST_CASE("unary formulas pass gradcheck on contiguous strided and 0-d inputs", "[formulas-elementwise]") {
  for (const UnaryCase& c : unary_cases()) {
    INFO(c.name);
    CHECK(check1(c.fn, leaf(*c.values, {3, 4})));
    CHECK(check1(c.fn, leaf(*c.values, {3, 4}, /*strided=*/true)));
    CHECK(check1(c.fn, leaf(*c.values, Shape{})));
  }
}

TEST_CASE("binary formulas pass gradcheck on broadcast strided and 0-d inputs", "[formulas-elementwise]") {
  for (const BinaryCase& c : binary_cases()) {
    INFO(c.name);
    CHECK(check2(c.fn, leaf(*c.a, {3, 4}), leaf(*c.b, {3, 4})));
    CHECK(check2(c.fn, leaf(*c.a, {3, 4}), leaf(*c.b, {4})));
    CHECK(check2(c.fn, leaf(*c.a, {4}), leaf(*c.b, {3, 4})));
    CHECK(check2(c.fn, leaf(*c.a, {3, 1}), leaf(*c.b, {1, 4})));
    CHECK(check2(c.fn, leaf(*c.a, {3, 4}), leaf(*c.b, Shape{})));
    CHECK(check2(c.fn, leaf(*c.a, Shape{}), leaf(*c.b, {3, 4})));
    CHECK(check2(c.fn, leaf(*c.a, {3, 4}, true), leaf(*c.b, {3, 4}, true)));
    // Only one input requires grad: the other gets no gradient.
    Tensor a = leaf(*c.a, {3, 4});
    Tensor b = tensor_of(std::vector<double>(c.b->begin(), c.b->begin() + 4), {4}, DType::f64);
    CHECK(check2(c.fn, a, b));
    CHECK_FALSE(b.grad().defined());
  }
}

TEST_CASE("number operands on either side get no gradient and the tensor side passes gradcheck", "[formulas-elementwise]") {
  const std::vector<std::pair<const char*, Fn1>> cases = {
      {"x + 2", [](const Tensor& x) { return x + 2; }},
      {"2 + x", [](const Tensor& x) { return 2 + x; }},
      {"x - 1.5", [](const Tensor& x) { return x - 1.5; }},
      {"1.5 - x", [](const Tensor& x) { return 1.5 - x; }},
      {"x * 2.5", [](const Tensor& x) { return x * 2.5; }},
      {"3 / x", [](const Tensor& x) { return 3 / x; }},
      {"x / 4", [](const Tensor& x) { return x / 4; }},
      {"x ** 2", [](const Tensor& x) { return pow(x, 2); }},
      {"x ** 3", [](const Tensor& x) { return pow(x, 3); }},
      {"x ** 2.5", [](const Tensor& x) { return pow(x, 2.5); }},
      {"x ** -1.5", [](const Tensor& x) { return pow(x, -1.5); }},
      {"x ** 0", [](const Tensor& x) { return pow(x, 0) * x; }},
      {"2.5 ** x", [](const Tensor& x) { return pow(2.5, x); }},
      {"3 ** x", [](const Tensor& x) { return pow(3, x); }},
      {"where x 0.5", [](const Tensor& x) { return where(x > 1.0, x, 0.5); }},
      {"where 0.5 x", [](const Tensor& x) { return where(x > 1.0, 0.5, x); }},
  };
  for (const auto& [name, fn] : cases) {
    INFO(name);
    CHECK(check1(fn, leaf(kPositive, {3, 4})));
    CHECK(check1(fn, leaf(kPositive, {3, 4}, true)));
    CHECK(check1(fn, leaf(kPositive, Shape{})));
  }
}

TEST_CASE("maximum and minimum split the gradient evenly at ties", "[formulas-elementwise]") {
  for (bool is_max : {true, false}) {
    INFO((is_max ? "maximum" : "minimum"));
    Tensor a = leaf({1, 2, 3}, {3}), b = leaf({1, 5, 0}, {3});
    Tensor y = is_max ? maximum(a, b) : minimum(a, b);
    y.backward(tensor_of({2, 4, 8}, {3}, DType::f64));
    KILN_CHECK_EQUAL(a.grad(), tensor_of({1, is_max ? 0. : 4., is_max ? 8. : 0.}, {3}));
    KILN_CHECK_EQUAL(b.grad(), tensor_of({1, is_max ? 4. : 0., is_max ? 0. : 8.}, {3}));
  }
  // A tie against a broadcast operand: each element of a splits with the one b.
  Tensor a = leaf({2, 2, 1}, {3}), b = leaf({2}, Shape{});
  maximum(a, b).backward(ones({3}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({0.5, 0.5, 0}, {3}));
  KILN_CHECK_EQUAL(b.grad(), tensor_of({2}, Shape{}));
}

TEST_CASE("clamp passes the gradient at its bounds and abs relu sign give 0 at 0", "[formulas-elementwise]") {
  Tensor x = leaf({-2, -1, 0, 1, 2}, {5});
  Tensor ones5 = ones({5}, {.dtype = DType::f64});
  KILN_CHECK_EQUAL(grad_of([](const Tensor& t) { return clamp(t, -1, 1); }, x, ones5),
                   tensor_of({0, 1, 1, 1, 0}, {5}));
  KILN_CHECK_EQUAL(grad_of([](const Tensor& t) { return clamp_min(t, 0); }, x, ones5),
                   tensor_of({0, 0, 1, 1, 1}, {5}));
  KILN_CHECK_EQUAL(grad_of([](const Tensor& t) { return clamp_max(t, 0); }, x, ones5),
                   tensor_of({1, 1, 1, 0, 0}, {5}));
  // min > max: every element is max, and no gradient passes (PyTorch's mask).
  KILN_CHECK_EQUAL(grad_of([](const Tensor& t) { return clamp(t, 1, -1); }, x, ones5),
                   tensor_of({0, 0, 0, 0, 0}, {5}));
  KILN_CHECK_EQUAL(grad_of([](const Tensor& t) { return abs(t); }, x, ones5),
                   tensor_of({-1, -1, 0, 1, 1}, {5}));
  KILN_CHECK_EQUAL(grad_of([](const Tensor& t) { return relu(t); }, x, ones5),
                   tensor_of({0, 0, 0, 1, 1}, {5}));
  KILN_CHECK_EQUAL(grad_of([](const Tensor& t) { return sign(t); }, x, ones5),
                   tensor_of({0, 0, 0, 0, 0}, {5}));
}

TEST_CASE("pow gradients at a zero base and a zero exponent follow PyTorch", "[formulas-elementwise]") {
  Tensor a = leaf({0, 0, 2}, {3}), b = leaf({2, 0, 3}, {3});
  pow(a, b).backward(ones({3}, {.dtype = DType::f64}));
  // d/da: 2 * 0^1 = 0, exponent 0 gives 0 (not 0 * 0^-1), 3 * 2^2 = 12.
  KILN_CHECK_EQUAL(a.grad(), tensor_of({0, 0, 12}, {3}));
  // d/db: a == 0 with b >= 0 gives 0 (not 0 * log 0), 8 log 2.
  KILN_CHECK_CLOSE(b.grad(), tensor_of({0, 0, 8 * std::log(2.0)}, {3}, DType::f64), 1e-12, 0);
  // A negative exponent at a zero base is a true pole: d/da = -1 * 0^-2 = -inf.
  Tensor z = leaf({0}, {1}), e = leaf({-1}, {1});
  pow(z, e).backward(ones({1}, {.dtype = DType::f64}));
  CHECK(std::isinf(values(z.grad())[0]));
  // Number exponents: x ** 2 at 0 has slope 0, x ** 0 has slope 0 everywhere.
  Tensor x = leaf({0, 3}, {2});
  KILN_CHECK_EQUAL(grad_of([](const Tensor& t) { return pow(t, 2); }, x, ones({2}, {.dtype = DType::f64})),
                   tensor_of({0, 6}, {2}));
  KILN_CHECK_EQUAL(grad_of([](const Tensor& t) { return pow(t, 0); }, x, ones({2}, {.dtype = DType::f64})),
                   tensor_of({0, 0}, {2}));
}

TEST_CASE("gelu gradient matches the erf formula near and away from 0", "[formulas-elementwise]") {
  // Near 0, where the old formula's gelu(x) / x lost precision, and beyond.
  const std::vector<double> v = {0, 1e-12, -3e-5, 9.99e-4, 1.001e-3, -2e-3, 0.5, -3, 8, -40};
  std::vector<double> expected;
  for (double x : v) {
    const double cdf = 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
    const double pdf = std::exp(-x * x / 2) / std::sqrt(2 * std::numbers::pi);
    expected.push_back(cdf + x * pdf);
  }
  Tensor x = leaf(v, {static_cast<int64_t>(v.size())});
  Tensor g = grad_of([](const Tensor& t) { return gelu(t); }, x, ones_like(x));
  KILN_CHECK_CLOSE(g, tensor_of(expected, {}, DType::f64), 1e-13, 1e-15);
  // f32 and f16 stay close to it, including below the switch (tolerances: a few ulps).
  for (DType dt : {DType::f32, DType::f16}) {
    INFO(name(dt));
    Tensor xl = tensor_of(v, {}, dt).requires_grad_();
    Tensor gl = grad_of([](const Tensor& t) { return gelu(t); }, xl, ones_like(xl));
    CHECK(gl.dtype() == dt);
    KILN_CHECK_CLOSE(gl, tensor_of(expected, {}, DType::f64), dt == DType::f32 ? 1e-5 : 4e-3, 1e-6);
  }
}

TEST_CASE("float32 backward matches the float64 one", "[formulas-elementwise]") {
  // Tolerance: rtol 1e-5 (a few f32 ulps through a short chain), atol 1e-6.
  const std::vector<std::pair<const char*, Fn2>> cases = {
      {"sigmoid tanh", [](const Tensor& a, const Tensor& b) { return sigmoid(a) * tanh(b); }},
      {"div pow", [](const Tensor& a, const Tensor& b) { return pow(abs(a) + 0.5, b) / (b * b + 1); }},
      {"gelu tanh silu", [](const Tensor& a, const Tensor& b) { return gelu(a, "tanh") + silu(b); }},
      {"softplus maximum", [](const Tensor& a, const Tensor& b) { return softplus(maximum(a, b), 2.0, 1.5); }},
  };
  for (const auto& [name, fn] : cases) {
    INFO(name);
    Tensor grads[2][2];
    for (int k = 0; k < 2; ++k) {
      const DType dt = k == 0 ? DType::f64 : DType::f32;
      Tensor a = tensor_of(kMixed, {3, 4}, dt).requires_grad_();
      Tensor b = tensor_of(std::vector<double>(kOther.begin(), kOther.begin() + 4), {4}, dt).requires_grad_();
      fn(a, b).backward(tensor_of(kPositive, {3, 4}, dt));
      CHECK(a.grad().dtype() == dt);
      CHECK(b.grad().dtype() == dt);
      grads[k][0] = a.grad();
      grads[k][1] = b.grad();
    }
    KILN_CHECK_CLOSE(grads[1][0], grads[0][0], 1e-5, 1e-6);
    KILN_CHECK_CLOSE(grads[1][1], grads[0][1], 1e-5, 1e-6);
  }
}

TEST_CASE("gradients reach each input in its own dtype", "[formulas-elementwise]") {
  // An f32 input of an f64 result: the node that made it receives an f32 gradient.
  Tensor x = tensor_of({0.5, 1.5}, {2}, DType::f32).requires_grad_();
  Tensor w = tensor_of({2, 3}, {2}, DType::f64).requires_grad_();
  Tensor e = exp(x);
  DType seen = DType::boolean;
  e.register_hook([&](const Tensor& g) {
    seen = g.dtype();
    return Tensor();
  });
  Tensor y = e * w;
  CHECK(y.dtype() == DType::f64);
  y.backward(ones({2}, {.dtype = DType::f64}));
  CHECK(seen == DType::f32);
  CHECK(x.grad().dtype() == DType::f32);
  KILN_CHECK_CLOSE(x.grad(), tensor_of({2 * std::exp(0.5), 3 * std::exp(1.5)}, {2}, DType::f64), 1e-6, 0);
  // cast sends the gradient back in the source dtype.
  Tensor c = tensor_of({1, 2}, {2}, DType::f32).requires_grad_();
  Tensor seen_grad;
  Tensor c1 = c * 1;
  c1.register_hook([&](const Tensor& g) {
    seen_grad = g;
    return Tensor();
  });
  c1.to(DType::f64).backward(tensor_of({0.25, 4}, {2}, DType::f64));
  REQUIRE(seen_grad.defined());
  CHECK(seen_grad.dtype() == DType::f32);
  KILN_CHECK_EQUAL(c.grad(), tensor_of({0.25, 4}, {2}));
}

TEST_CASE("formulas are differentiable with create_graph", "[formulas-elementwise]") {
  // Formulas that read inputs: the second derivative flows through the backward ops.
  Tensor x = leaf({0.7, -1.2}, {2});
  sin(x).backward(ones({2}, {.dtype = DType::f64}), false, /*create_graph=*/true);
  Tensor g = x.grad();  // cos x
  REQUIRE(g.requires_grad());
  x.set_grad({});
  g.backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_CLOSE(x.grad(), tensor_of({-std::sin(0.7), -std::sin(-1.2)}, {2}, DType::f64), 1e-12, 0);

  // gelu's formula is one op, gelu_backward, whose own formula gives gelu'': in the exact
  // form phi(x) (2 - x^2).
  Tensor z = leaf({0.3, -1.7}, {2});
  gelu(z).backward(ones({2}, {.dtype = DType::f64}), false, true);
  Tensor gz = z.grad();
  REQUIRE(gz.requires_grad());
  z.set_grad({});
  gz.backward(ones({2}, {.dtype = DType::f64}));
  std::vector<double> second;
  for (double v : {0.3, -1.7}) second.push_back(std::exp(-v * v / 2) / std::sqrt(2 * std::numbers::pi) * (2 - v * v));
  KILN_CHECK_CLOSE(z.grad(), tensor_of(second, {2}, DType::f64), 1e-12, 0);

  Tensor y = leaf({2, -1}, {2});
  (pow(y, 3) / 3).backward(ones({2}, {.dtype = DType::f64}), false, true);
  Tensor gy = y.grad();  // y^2
  y.set_grad({});
  gy.backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_CLOSE(y.grad(), tensor_of({4, -2}, {2}, DType::f64), 1e-12, 0);
}

TEST_CASE("an op without a formula records a node whose backward names the op", "[formulas-elementwise]") {
  // mse_loss_backward (a backward op, so a formula would be a double backward) has none.
  const OpDef& op = find_op("mse_loss_backward");
  if (op.backward) {
    WARN("mse_loss_backward has a backward formula now; nothing left to test here");
    return;
  }
  Tensor input = leaf(kMixed, {3, 4}), target = tensor_of(kOther, {3, 4}, DType::f64);
  Tensor grad_out = tensor_of({1}, Shape{}, DType::f64);
  Tensor y = mse_loss_backward(grad_out, input, target, "mean");
  REQUIRE(y.grad_fn());
  CHECK(y.grad_fn()->name() == "mse_loss_backward_backward");
  CHECK_THROWS_AS(y.backward(ones_like(y)), kiln::Error);
  CHECK_THROWS_WITH(y.backward(ones_like(y)), Catch::Contains("mse_loss_backward") &&
                                                  Catch::Contains("backward is not implemented"));
}

TEST_CASE("fill_ on a non-leaf cuts the gradient to its old value", "[formulas-elementwise]") {
  Tensor a = tensor_of({1, 2}, {2}, DType::f64).requires_grad_();
  Tensor b = a * 3;
  b.fill_(5);
  (b * a).backward(ones({2}, {.dtype = DType::f64}));
  KILN_CHECK_EQUAL(a.grad(), tensor_of({5, 5}, {2}));  // only through the second factor
}
