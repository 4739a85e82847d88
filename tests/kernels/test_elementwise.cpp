// Every unary and binary elementwise op against a double-precision std:: reference, for
// every dtype it supports, on contiguous, strided, transposed and broadcast inputs, with
// tensor and number operands. Tolerances: testing::tol of the result dtype, relative and
// absolute (f32 1e-5, f16 2e-3, bf16 1.6e-2; integer and bool results exact).
#include <cmath>

#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// Where a unary op's inputs must lie.
enum class Domain { any, positive, above_minus_one, nonzero };

// 15 values of `dtype` in `domain`, shaped [3,5]: varied signs and magnitudes; integers
// for integer dtypes, {0,1} for bool.
Tensor unary_input(Domain domain, DType dtype) {
  std::vector<double> v;
  for (int k = 0; k < 15; ++k) {
    double x = -2.9 + 0.41 * k;  // [-2.9, 2.84]
    if (domain == Domain::positive) x = 0.15 + 0.29 * k;
    if (domain == Domain::above_minus_one) x = -0.85 + 0.27 * k;
    if (domain == Domain::nonzero) x = (k % 2 ? -1 : 1) * (0.3 + 0.37 * k);
    if (is_integral(dtype)) {
      x = std::round(x);
      if (domain == Domain::positive || domain == Domain::nonzero) x = x == 0 ? 1 : x;
      if (domain == Domain::positive || domain == Domain::above_minus_one) x = std::fabs(x);
      if (dtype == DType::u8) x = std::fabs(x);
    }
    if (dtype == DType::boolean)
      x = domain == Domain::positive || domain == Domain::nonzero ? 1 : k % 3 == 0;
    v.push_back(x);
  }
  return tensor_of(v, {3, 5}, dtype);
}

// Maps an index of `out` to the index of a tensor broadcast against it.
std::vector<int64_t> broadcast_index(const std::vector<int64_t>& out_idx, const Tensor& t) {
  std::vector<int64_t> idx(static_cast<size_t>(t.dim()));
  const size_t lead = out_idx.size() - idx.size();
  for (size_t d = 0; d < idx.size(); ++d) idx[d] = t.shape()[d] == 1 ? 0 : out_idx[lead + d];
  return idx;
}

// The f64 tensor f(inputs...) computed element by element in double, with broadcasting.
template <class F>
Tensor reference(const std::vector<Tensor>& ins, F f) {
  std::vector<Shape> shapes;
  for (const Tensor& t : ins) shapes.push_back(t.shape());
  const Shape out = broadcast_shapes(shapes, "reference");
  std::vector<double> v;
  for_each_index(out, [&](const std::vector<int64_t>& i) {
    std::vector<double> x;
    for (const Tensor& t : ins) x.push_back(at(t, broadcast_index(i, t)));
    v.push_back(f(x));
  });
  return tensor_of(v, out, DType::f64);
}

void check_result(const Tensor& actual, const Tensor& expected, DType dtype) {
  CHECK(actual.dtype() == dtype);
  const double t = tol(dtype);
  KILN_CHECK_CLOSE(actual, expected, t, t);
}

enum class Result { floating, same, boolean };

DType result_dtype(Result r, DType promoted) {
  if (r == Result::boolean) return DType::boolean;
  if (r == Result::floating && !is_floating(promoted)) return kDefaultFloat;
  return promoted;
}

struct UnaryCase {
  std::string name;
  Tensor (*op)(const Tensor&);
  double (*ref)(double);
  Domain domain;
  Result result;
  std::vector<DType> dtypes;
};

double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

const std::vector<DType> kNumeric = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                     DType::i64, DType::i32, DType::u8};

std::vector<UnaryCase> unary_cases() {
  using D = Domain;
  using R = Result;
  const auto all = kAllDTypes;
  return {
      {"neg",
       [](const Tensor& x) { return neg(x); },
       [](double x) { return -x; },
       D::any,
       R::same,
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32}},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); }, D::any,
       R::same, kNumeric},
      {"sign", [](const Tensor& x) { return sign(x); },
       [](double x) { return double((x > 0) - (x < 0)); }, D::any, R::same, all},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x < 0 ? 0.0 : x; },
       D::any, R::same, kNumeric},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, D::any,
       R::floating, all},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); },
       D::positive, R::floating, all},
      {"log1p", [](const Tensor& x) { return log1p(x); }, [](double x) { return std::log1p(x); },
       D::above_minus_one, R::floating, all},
      {"expm1", [](const Tensor& x) { return expm1(x); }, [](double x) { return std::expm1(x); },
       D::any, R::floating, all},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); },
       D::positive, R::floating, all},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); },
       D::positive, R::floating, all},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, [](double x) { return 1 / x; },
       D::nonzero, R::floating, all},
      {"sin", [](const Tensor& x) { return sin(x); }, [](double x) { return std::sin(x); }, D::any,
       R::floating, all},
      {"cos", [](const Tensor& x) { return cos(x); }, [](double x) { return std::cos(x); }, D::any,
       R::floating, all},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); },
       D::any, R::floating, all},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); },
       [](double x) { return 1 / (1 + std::exp(-x)); }, D::any, R::floating, all},
      {"silu", [](const Tensor& x) { return silu(x); },
       [](double x) { return x / (1 + std::exp(-x)); }, D::any, R::floating, all},
      {"gelu", [](const Tensor& x) { return gelu(x); }, gelu_ref, D::any, R::floating, all},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, gelu_tanh_ref, D::any,
       R::floating, all},
      {"softplus", [](const Tensor& x) { return softplus(x); },
       [](double x) { return std::log1p(std::exp(x)); }, D::any, R::floating, all},
      {"logical_not", [](const Tensor& x) { return logical_not(x); },
       [](double x) { return double(x == 0); }, D::any, R::boolean, all},
  };
}

}  // namespace

TEST_CASE("unary ops match the std:: reference on every layout and dtype", "[elementwise]") {
  for (const UnaryCase& c : unary_cases()) {
    for (DType dtype : c.dtypes) {
      INFO(c.name << " on " << name(dtype));
      const Tensor x = unary_input(c.domain, dtype);
      const DType out = result_dtype(c.result, dtype);
      auto check = [&](const Tensor& input) {
        check_result(c.op(input), reference({input}, [&](const auto& v) { return c.ref(v[0]); }),
                     out);
      };
      check(x);
      check(strided_copy(x));
      check(transposed_copy(x));
      check(x.t());
      check(x.slice(0, 1, 2).expand({4, 5}));  // a broadcast (stride 0) input
      check(x.select(0, 2).select(0, 1));      // 0-d
      CHECK(c.op(x.slice(1, 0, 0)).numel() == 0);
    }
  }
}

TEST_CASE("unary ops reject bool where PyTorch does", "[elementwise]") {
  const Tensor b = from_vector<bool>({true, false});
  CHECK_THROWS_WITH(neg(b), Catch::Contains("neg") && Catch::Contains("bool"));
  CHECK_THROWS_WITH(relu(b), Catch::Contains("relu") && Catch::Contains("bool"));
  CHECK(values(sign(b)) == std::vector<double>{1, 0});
}

namespace {

struct BinaryCase {
  std::string name;
  Tensor (*op)(const Tensor&, const Tensor&);
  double (*ref)(double, double);
  Result result;
  bool bool_ok;  // accepts two bool tensors
};

std::vector<BinaryCase> binary_cases() {
  using R = Result;
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; },
       [](double a, double b) { return a + b; }, R::same, true},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; },
       [](double a, double b) { return a - b; }, R::same, false},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; },
       [](double a, double b) { return a * b; }, R::same, true},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; },
       [](double a, double b) { return a / b; }, R::floating, true},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
       [](double a, double b) { return std::pow(a, b); }, R::same, false},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }, R::same, true},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }, R::same, true},
      {"eq", [](const Tensor& a, const Tensor& b) { return a == b; },
       [](double a, double b) { return double(a == b); }, R::boolean, true},
      {"ne", [](const Tensor& a, const Tensor& b) { return a != b; },
       [](double a, double b) { return double(a != b); }, R::boolean, true},
      {"lt", [](const Tensor& a, const Tensor& b) { return a < b; },
       [](double a, double b) { return double(a < b); }, R::boolean, true},
      {"le", [](const Tensor& a, const Tensor& b) { return a <= b; },
       [](double a, double b) { return double(a <= b); }, R::boolean, true},
      {"gt", [](const Tensor& a, const Tensor& b) { return a > b; },
       [](double a, double b) { return double(a > b); }, R::boolean, true},
      {"ge", [](const Tensor& a, const Tensor& b) { return a >= b; },
       [](double a, double b) { return double(a >= b); }, R::boolean, true},
      {"logical_and", [](const Tensor& a, const Tensor& b) { return a && b; },
       [](double a, double b) { return double(a != 0 && b != 0); }, R::boolean, true},
      {"logical_or", [](const Tensor& a, const Tensor& b) { return a || b; },
       [](double a, double b) { return double(a != 0 || b != 0); }, R::boolean, true},
  };
}

// Operand values of `dtype` in `shape`, the k-th from `pattern(k)`; halves for floats so
// that comparisons see ties, and small values so that no integer type overflows.
Tensor binary_input(const std::string& op, bool first, DType dtype, Shape shape) {
  std::vector<double> v;
  const int64_t n = numel_of(shape);
  for (int64_t k = 0; k < n; ++k) {
    double x = static_cast<double>(first ? (k * 7) % 9 : (k * 5 + 2) % 9) - 4;  // [-4, 4]
    if (is_floating(dtype)) x *= 0.5;
    if (op == "pow")
      x = first ? std::fabs(x) + (is_floating(dtype) ? 0.5 : 0) : std::fmod(std::fabs(x), 4);
    if (op == "div" && !first && x == 0) x = 1;
    if (dtype == DType::u8 && op != "pow")
      x = first ? std::fabs(x) + 8 : std::fabs(x);  // a - b >= 0
    if (dtype == DType::boolean) x = (k % 3 == 0) != first;
    v.push_back(x);
  }
  return tensor_of(v, std::move(shape), dtype);
}

using Pair = std::pair<DType, DType>;
const std::vector<Pair> kPairs = {
    {DType::f32, DType::f32},    {DType::f64, DType::f64},         {DType::f16, DType::f16},
    {DType::bf16, DType::bf16},  {DType::i64, DType::i64},         {DType::i32, DType::i32},
    {DType::u8, DType::u8},      {DType::boolean, DType::boolean}, {DType::i32, DType::f32},
    {DType::f16, DType::bf16},   {DType::u8, DType::i64},          {DType::boolean, DType::f16},
    {DType::i64, DType::f64},    {DType::u8, DType::i32},          {DType::f32, DType::f16},
    {DType::i32, DType::boolean}};

}  // namespace

TEST_CASE("binary ops match the std:: reference on every layout and dtype pair", "[elementwise]") {
  for (const BinaryCase& c : binary_cases()) {
    for (auto [da, db] : kPairs) {
      if (da == DType::boolean && db == DType::boolean && !c.bool_ok) continue;
      if (c.name == "pow" && (da == DType::boolean || db == DType::boolean)) continue;
      INFO(c.name << " on " << name(da) << ", " << name(db));
      auto check = [&](const Tensor& a, const Tensor& b) {
        // promote_types(da, db), except that a 0-d operand of a's category gives way.
        const std::vector<TensorMeta> metas = {TensorMeta::of(a), TensorMeta::of(b)};
        const DType out = result_dtype(c.result, result_type(metas));
        Tensor expected = reference({a, b}, [&](const auto& v) { return c.ref(v[0], v[1]); });
        if (out == DType::boolean) expected = expected != 0;
        check_result(c.op(a, b), expected, out);
      };
      const Tensor a = binary_input(c.name, true, da, {3, 4});
      const Tensor b = binary_input(c.name, false, db, {3, 4});
      check(a, b);
      check(strided_copy(a), b);
      check(a, transposed_copy(b));
      check(strided_copy(a), strided_copy(b));
      check(a.t(), b.t());
      check(a, binary_input(c.name, false, db, {4}));     // row broadcast
      check(a, binary_input(c.name, false, db, {3, 1}));  // column broadcast
      check(binary_input(c.name, true, da, {1, 4}),
            binary_input(c.name, false, db, {3, 1}));       // outer
      check(binary_input(c.name, true, da, {2, 1, 4}), b);  // rank broadcast
      check(a, b.select(0, 1).select(0, 2));                // 0-d of the same category
    }
  }
}

TEST_CASE("bool arithmetic and subtraction follow PyTorch", "[elementwise]") {
  const Tensor t = from_vector<bool>({true, true, false}),
               u = from_vector<bool>({true, false, false});
  CHECK((t + u).dtype() == DType::boolean);
  CHECK(values(t + u) == std::vector<double>{1, 1, 0});
  CHECK(values(t * u) == std::vector<double>{1, 0, 0});
  CHECK(values(t / u).at(1) == INFINITY);  // true division: 1 / 0
  CHECK_THROWS_WITH(t - u, Catch::Contains("sub") && Catch::Contains("bool"));
}

TEST_CASE("integer division is true division into f32", "[elementwise]") {
  const Tensor a = from_vector<int64_t>({7, -7, 1, 0}), b = from_vector<int64_t>({2, 2, 0, 0});
  const Tensor q = a / b;
  CHECK(q.dtype() == DType::f32);
  const std::vector<double> v = values(q);
  CHECK(v[0] == 3.5);
  CHECK(v[1] == -3.5);
  CHECK(v[2] == INFINITY);
  CHECK(std::isnan(v[3]));
  CHECK(values(pow(from_vector<int32_t>({2, 3, -2}), from_vector<int32_t>({10, 3, 3}))) ==
        std::vector<double>{1024, 27, -8});
}

namespace {

struct ScalarCase {
  std::string name;
  Tensor actual;
  DType dtype;
  std::vector<double> expected;
};

}  // namespace

TEST_CASE("number operands on either side promote as PyTorch does", "[elementwise]") {
  const Tensor i = from_vector<int32_t>({1, 2, -3});
  const Tensor h = from_vector<float>({1, 2, -3}).to(DType::f16);
  const Tensor u = from_vector<uint8_t>({1, 2, 3});
  const Tensor b = from_vector<bool>({true, false, true});
  const Tensor d = from_vector<double>({1, 2, -3});
  const std::vector<ScalarCase> cases = {
      {"i32 + 2.5", i + 2.5, DType::f32, {3.5, 4.5, -0.5}},
      {"2.5 + i32", 2.5 + i, DType::f32, {3.5, 4.5, -0.5}},
      {"i32 + 2", i + 2, DType::i32, {3, 4, -1}},
      {"i32 - 1", i - 1, DType::i32, {0, 1, -4}},
      {"10 - i32", 10 - i, DType::i32, {9, 8, 13}},
      {"0.5 - i32", 0.5 - i, DType::f32, {-0.5, -1.5, 3.5}},
      {"i32 * 3", i * 3, DType::i32, {3, 6, -9}},
      {"3 * i32", 3 * i, DType::i32, {3, 6, -9}},
      {"i32 / 2", i / 2, DType::f32, {0.5, 1, -1.5}},
      {"6 / i32", 6 / i, DType::f32, {6, 3, -2}},
      {"f16 * 2.5", h * 2.5, DType::f16, {2.5, 5, -7.5}},
      {"f16 + 1", h + 1, DType::f16, {2, 3, -2}},
      {"1.5 / f16", 1.5 / h, DType::f16, {1.5, 0.75, -0.5}},
      {"f64 + 0.1", d + 0.1, DType::f64, {1.1, 2.1, -2.9}},
      {"u8 + 1", u + 1, DType::u8, {2, 3, 4}},
      {"u8 * 2", u * 2, DType::u8, {2, 4, 6}},
      {"u8 + 1.5", u + 1.5, DType::f32, {2.5, 3.5, 4.5}},
      {"bool + 1", b + 1, DType::i64, {2, 1, 2}},
      {"bool * 2.5", b * 2.5, DType::f32, {2.5, 0, 2.5}},
      {"bool + true", b + true, DType::boolean, {1, 1, 1}},
      {"pow(i32, 2)", pow(i, 2), DType::i32, {1, 4, 9}},
      {"pow(i32, 0.5)", pow(abs(i), 0.5), DType::f32, {1, std::sqrt(2.0), std::sqrt(3.0)}},
      {"pow(2, i32)", pow(2, abs(i)), DType::i32, {2, 4, 8}},
      {"pow(2.0, i32)", pow(2.0, i), DType::f32, {2, 4, 0.125}},
      {"pow(f16, 2)", pow(h, 2), DType::f16, {1, 4, 9}},
      {"i32 == 2", i == 2, DType::boolean, {0, 1, 0}},
      {"i32 != 2", i != 2, DType::boolean, {1, 0, 1}},
      {"i32 < 1.5", i < 1.5, DType::boolean, {1, 0, 1}},
      {"i32 <= 1", i <= 1, DType::boolean, {1, 0, 1}},
      {"f16 > -3", h > -3, DType::boolean, {1, 1, 0}},
      {"u8 >= 2", u >= 2, DType::boolean, {0, 1, 1}},
      {"!i32", !i, DType::boolean, {0, 0, 0}},
      {"-i32", -i, DType::i32, {-1, -2, 3}},
  };
  for (const ScalarCase& c : cases) {
    INFO(c.name);
    check_result(c.actual, tensor_of(c.expected, {3}, DType::f64), c.dtype);
  }
  // A scalar operand also works on strided and broadcast tensors.
  const Tensor m = arange(6, {.dtype = DType::f32}).view({2, 3});
  KILN_CHECK_EQUAL(strided_copy(m) * 2, m + m);
  KILN_CHECK_EQUAL(3 - m.t(), (3 - m).t());
  KILN_CHECK_EQUAL(m.slice(0, 0, 1).expand({4, 3}) + 1, ones({4, 3}) + m.slice(0, 0, 1));
}
