// The bf16 and f16 GEMMs (kernels/cpu/gemm_reduced.cpp) against a plain loop in doubles
// over the same 16-bit values: odd sizes, every transpose, padded leading dimensions,
// alpha and beta, on every bf16 path this machine has (oneDNN's matmul where it has a JIT
// kernel, AVX-512 BF16 dot products where the CPU has them, conversion to f32 everywhere).
#include <cmath>
#include <algorithm>
#include <random>
#include <thread>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_dnnl.h"
#include "testing.h"

using namespace kiln;
using kiln::cpu::Bf16GemmPath;

namespace {

struct PathScope {
  Bf16GemmPath previous = cpu::bf16_gemm_path();
  explicit PathScope(Bf16GemmPath p) { cpu::set_bf16_gemm_path(p); }
  ~PathScope() { cpu::set_bf16_gemm_path(previous); }
};

// A stored rows x cols matrix with rows ld elements apart; the padding holds NaN-free
// garbage that a correct GEMM never reads into C (it is large, so reading it shows).
template <class T>
std::vector<T> random_matrix(int64_t rows, int64_t cols, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<T> v(static_cast<size_t>(rows * ld), T(1e4f));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) v[r * ld + c] = T(normal(rng));
  return v;
}

template <class T>
void check_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, float beta) {
  INFO("m=" << m << " n=" << n << " k=" << k << " trans_a=" << ta << " trans_b=" << tb
            << " alpha=" << alpha << " beta=" << beta);
  std::mt19937 rng(static_cast<uint32_t>(m * 131 + n * 17 + k + ta * 7 + tb * 3));
  const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  const int64_t lda = ac + 3, ldb = bc + 5, ldc = n + 2;
  const std::vector<T> a = random_matrix<T>(ar, ac, lda, rng);
  const std::vector<T> b = random_matrix<T>(br, bc, ldb, rng);
  std::vector<float> c0(static_cast<size_t>(m * ldc));
  std::normal_distribution<float> normal;
  for (float& v : c0) v = normal(rng);
  std::vector<float> c = c0;
  cpu::gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  auto av = [&](int64_t i, int64_t p) { return double(float(ta ? a[p * lda + i] : a[i * lda + p])); };
  auto bv = [&](int64_t p, int64_t j) { return double(float(tb ? b[j * ldb + p] : b[p * ldb + j])); };
  int64_t bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        sum += av(i, p) * bv(p, j);
        mag += std::fabs(av(i, p) * bv(p, j));
      }
      const double ref = alpha * sum + (beta == 0 ? 0.0 : beta * double(c0[i * ldc + j]));
      // Every product of 16-bit values is exact in f32; each of the k additions (and alpha,
      // beta) rounds to f32 once, 2^-24 relative, on partial sums bounded by the sum of
      // magnitudes, in whatever order a path adds them (AMX adds pairs of products, oneDNN
      // sums blocks of k apart): (k + 3) 2^-24 of |alpha| mag + |beta c0| bounds the error.
      const double bound = (k + 3) * std::ldexp(1.0, -24) *
                               (std::fabs(alpha) * mag + std::fabs(beta * c0[i * ldc + j])) +
                           1e-30;
      if (!(std::fabs(c[i * ldc + j] - ref) <= bound) && bad++ < 5)
        FAIL_CHECK("C(" << i << "," << j << ") = " << c[i * ldc + j] << ", expected " << ref
                        << " within " << bound);
    }
  CHECK(bad == 0);
  // The padding of C is never written.
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = n; j < ldc; ++j) REQUIRE(c[i * ldc + j] == c0[i * ldc + j]);
}

struct Size {
  int64_t m, n, k;
};

// Odd sizes; sizes at and past the blocks of the dot path (8 x 32 tiles, 96 rows, 384 k,
// 1024 columns); and one large enough to use the threads.
const std::vector<Size> kSizes = {{1, 1, 1},    {1, 7, 3},     {5, 1, 2},    {7, 33, 5},
                                  {8, 32, 2},   {13, 31, 17},  {97, 65, 391}, {9, 1030, 385},
                                  {130, 70, 769}};

}  // namespace

TEST_CASE("gemm: bf16 against a loop in doubles, on each path", "[linalg][gemm]") {
  const Bf16GemmPath path = GENERATE(from_range(cpu::bf16_gemm_paths()));
  PathScope scope(path);
  INFO("path " << cpu::bf16_gemm_path_name(path));
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const Size& s : kSizes) check_gemm<BFloat16>(ta, tb, s.m, s.n, s.k, 1.0f, 0.0f);
  check_gemm<BFloat16>(false, false, 13, 31, 17, 0.5f, 1.0f);
  check_gemm<BFloat16>(true, false, 97, 65, 391, -2.0f, 0.25f);
  check_gemm<BFloat16>(false, true, 9, 1030, 385, 1.0f, 1.0f);
}

TEST_CASE("gemm: f16 against a loop in doubles", "[linalg][gemm]") {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const Size& s : {Size{7, 33, 5}, Size{97, 65, 391}})
        check_gemm<Half>(ta, tb, s.m, s.n, s.k, 1.0f, 0.0f);
  check_gemm<Half>(false, true, 13, 31, 17, 0.5f, 1.0f);
}

TEST_CASE("gemm: 16-bit empty products and bad leading dimensions", "[linalg][gemm]") {
  const Bf16GemmPath path = GENERATE(from_range(cpu::bf16_gemm_paths()));
  PathScope scope(path);
  std::vector<float> c = {1, 2, 3, 4};
  const BFloat16 one(1.0f);
  // k == 0: C = beta C, and beta == 0 writes zeros without reading C.
  cpu::gemm(false, false, 2, 2, 0, 1.0f, &one, 1, &one, 2, 0.5f, c.data(), 2);
  CHECK(c == std::vector<float>{0.5f, 1, 1.5f, 2});
  c[0] = std::nanf("");
  cpu::gemm(false, false, 2, 2, 0, 1.0f, &one, 1, &one, 2, 0.0f, c.data(), 2);
  CHECK(c == std::vector<float>{0, 0, 0, 0});
  CHECK_THROWS_WITH(cpu::gemm(false, false, 2, 2, 3, 1.0f, &one, 2, &one, 2, 0.0f, c.data(), 2),
                    Catch::Contains("leading dimensions") && Catch::Contains("m=2 n=2 k=3"));
}

TEST_CASE("gemm: the default bf16 path, and paths the machine lacks are refused", "[linalg][gemm]") {
  const std::vector<Bf16GemmPath> paths = cpu::bf16_gemm_paths();
  auto has = [&](Bf16GemmPath p) { return std::find(paths.begin(), paths.end(), p) != paths.end(); };
  CHECK(has(Bf16GemmPath::convert));
  CHECK(has(Bf16GemmPath::dot) == cpu::cpu_has_avx512_bf16());
  // oneDNN by default only where it multiplies on AMX; else the dot products, else convert.
  const Bf16GemmPath expected =
      cpu::dnnl_bf16_gemm_implementation().find("amx") != std::string::npos ? Bf16GemmPath::dnnl
      : cpu::cpu_has_avx512_bf16()                                           ? Bf16GemmPath::dot
                                                                             : Bf16GemmPath::convert;
  CHECK(cpu::bf16_gemm_path() == expected);
  if (!has(Bf16GemmPath::dot))
    CHECK_THROWS_WITH(cpu::set_bf16_gemm_path(Bf16GemmPath::dot), Catch::Contains("avx512_bf16"));
  if (!has(Bf16GemmPath::dnnl))
    CHECK_THROWS_WITH(cpu::set_bf16_gemm_path(Bf16GemmPath::dnnl), Catch::Contains("oneDNN"));
}

TEST_CASE("gemm: bf16 through oneDNN from two threads at once", "[linalg][gemm]") {
  if (!std::ranges::count(cpu::bf16_gemm_paths(), Bf16GemmPath::dnnl)) {
    WARN("no oneDNN bf16 matmul here");
    return;
  }
  PathScope scope(Bf16GemmPath::dnnl);
  // Two threads multiply the same shapes (so the same kept primitive) at once, as two
  // trainers in one process would; each call brings its own scratch memory.
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([] {
      for (int rep = 0; rep < 3; ++rep) check_gemm<BFloat16>(false, true, 97, 65, 391, 1.0f, 0.0f);
    });
  for (std::thread& t : threads) t.join();
}
