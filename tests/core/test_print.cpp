// Tensor::str follows PyTorch's repr rules (torch/_tensor_str.py): four decimals, "1." for
// whole floats, scientific notation when the nonzero finite magnitudes span more than
// 1000x or pass 1e8 (or go below 1e-4 for non-whole values), widths from the nonzero
// finite values only, "..." beyond 1000 elements, vectors wrapped at 80 columns. kiln
// spells dtypes and sizes its own way: ", dtype=f64", ", size=[0,3]".
#include <sstream>

#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("print floats: whole / fixed / aligned", "[print]") {
  CHECK(f32s({1, 2, 3}).str() == "tensor([1., 2., 3.])");
  CHECK(f32s({0.5, -1.25, 3, 4}, {2, 2}).str() ==
        "tensor([[ 0.5000, -1.2500],\n"
        "        [ 3.0000,  4.0000]])");
  CHECK(f32s({-1, 10}).str() == "tensor([-1., 10.])");
  CHECK(f32s({0.001f, 0.5f}).str() == "tensor([0.0010, 0.5000])");
  CHECK(f32s({0, 0}).str() == "tensor([0., 0.])");
  CHECK(f32s({1.23456f}, {1}).str() == "tensor([1.2346])");
  CHECK(f32s({0, 1, 2, 3, 4, 5, 6, 7}, {2, 2, 2}).str() ==
        "tensor([[[0., 1.],\n"
        "         [2., 3.]],\n"
        "\n"
        "        [[4., 5.],\n"
        "         [6., 7.]]])");
  // A transposed view prints in logical order.
  CHECK(f32s({1, 2, 3, 4}, {2, 2}).t().str() ==
        "tensor([[1., 3.],\n"
        "        [2., 4.]])");
  std::ostringstream os;
  os << f32s({1.5}, {1});
  CHECK(os.str() == "tensor([1.5000])");
}

TEST_CASE("print 0-d tensors", "[print]") {
  CHECK(scalar_tensor(3.5, DType::f32).str() == "tensor(3.5000)");
  CHECK(scalar_tensor(2, DType::f32).str() == "tensor(2.)");
  CHECK(scalar_tensor(-7, DType::i64).str() == "tensor(-7)");
  CHECK(scalar_tensor(true, DType::boolean).str() == "tensor(True)");
  CHECK(scalar_tensor(1.5, DType::f64).str() == "tensor(1.5000, dtype=f64)");
  CHECK(scalar_tensor(1e-6, DType::f32).str() == "tensor(1.0000e-06)");
}

TEST_CASE("print ints / bools and dtype suffixes", "[print]") {
  CHECK(from_vector<int64_t>({1, -20, 300}).str() == "tensor([  1, -20, 300])");
  CHECK(from_vector<bool>({true, false, true}).str() == "tensor([ True, False,  True])");
  CHECK(from_vector<double>({1.5, 2}).str() == "tensor([1.5000, 2.0000], dtype=f64)");
  CHECK(from_vector<int32_t>({1, 2}).str() == "tensor([1, 2], dtype=i32)");
  CHECK(from_vector<uint8_t>({255, 0}).str() == "tensor([255,   0], dtype=u8)");
  CHECK(f32s({0.5, 1.25}).to(DType::f16).str() == "tensor([0.5000, 1.2500], dtype=f16)");
  CHECK(f32s({3, 4}).to(DType::bf16).str() == "tensor([3., 4.], dtype=bf16)");
}

TEST_CASE("print switches to scientific notation for wide ranges", "[print]") {
  CHECK(f32s({1e-5f, 1}).str() == "tensor([1.0000e-05, 1.0000e+00])");
  CHECK(f32s({0.1f, 200}).str() == "tensor([1.0000e-01, 2.0000e+02])");  // ratio > 1000
  CHECK(f32s({1, 10000}).str() == "tensor([1.0000e+00, 1.0000e+04])");   // whole, ratio > 1000
  CHECK(f32s({1, 1000}).str() == "tensor([   1., 1000.])");              // ratio 1000 exactly
  CHECK(from_vector<double>({-1e9, 1}).str() == "tensor([-1.0000e+09,  1.0000e+00], dtype=f64)");
  CHECK(from_vector<double>({2e8, 3e8}).str() == "tensor([2.0000e+08, 3.0000e+08], dtype=f64)");
  CHECK(f32s({0, 1e-5f}).str() == "tensor([0.0000e+00, 1.0000e-05])");  // zero ignored for the mode
}

TEST_CASE("print NaN and infinities without widening the columns", "[print]") {
  CHECK(f32s({1, INFINITY}).str() == "tensor([1., inf])");
  CHECK(f32s({-INFINITY, 1}).str() == "tensor([-inf, 1.])");
  CHECK(f32s({NAN, 1.5f}).str() == "tensor([   nan, 1.5000])");
  CHECK(f32s({0, NAN}).str() == "tensor([0., nan])");
  CHECK(f32s({NAN, NAN}).str() == "tensor([nan, nan])");
}

TEST_CASE("print empty tensors", "[print]") {
  CHECK(zeros({0}).str() == "tensor([])");
  CHECK(zeros({0, 3}).str() == "tensor([], size=[0,3])");
  CHECK(zeros({0}, {.dtype = DType::i64}).str() == "tensor([], dtype=i64)");
  CHECK(zeros({0}, {.dtype = DType::boolean}).str() == "tensor([], dtype=bool)");
  CHECK(Tensor().str() == "tensor(undefined)");
}

TEST_CASE("print wraps long rows at 80 columns", "[print]") {
  CHECK(arange(20, {.dtype = DType::f32}).str() ==
        "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
        "        14., 15., 16., 17., 18., 19.])");
  CHECK(arange(40, {.dtype = DType::f32}).view({2, 20}).str() ==
        "tensor([[ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
        "         14., 15., 16., 17., 18., 19.],\n"
        "        [20., 21., 22., 23., 24., 25., 26., 27., 28., 29., 30., 31., 32., 33.,\n"
        "         34., 35., 36., 37., 38., 39.]])");
  // Every line stays within 80 columns.
  const std::string s = randn({300}).str();
  size_t start = 0;
  while (start < s.size()) {
    const size_t end = std::min(s.find('\n', start), s.size());
    CHECK(end - start <= 80);
    start = end + 1;
  }
}

TEST_CASE("print summarizes more than 1000 elements", "[print]") {
  CHECK(arange(2000).str() == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  CHECK(arange(2000).view({40, 50}).str() ==
        "tensor([[   0,    1,    2,  ...,   47,   48,   49],\n"
        "        [  50,   51,   52,  ...,   97,   98,   99],\n"
        "        [ 100,  101,  102,  ...,  147,  148,  149],\n"
        "        ...,\n"
        "        [1850, 1851, 1852,  ..., 1897, 1898, 1899],\n"
        "        [1900, 1901, 1902,  ..., 1947, 1948, 1949],\n"
        "        [1950, 1951, 1952,  ..., 1997, 1998, 1999]])");
  // Only the printed edges choose the format: the hidden middle does not widen it.
  Tensor z = zeros({1001});
  z.narrow(0, 500, 1).fill_(123456.5);
  CHECK(z.str() == "tensor([0., 0., 0.,  ..., 0., 0., 0.])");
  // 1000 elements are printed in full.
  CHECK(arange(1000).str().find("...") == std::string::npos);
  CHECK(arange(1001).str().find("...") != std::string::npos);
  // Dims of 6 or fewer are never cut.
  CHECK(arange(1200).view({2, 600}).slice(1, 0, 6).contiguous().str() ==
        "tensor([[  0,   1,   2,   3,   4,   5],\n"
        "        [600, 601, 602, 603, 604, 605]])");
}

TEST_CASE("print shows every digit of large i64 values and reads strided views", "[print]") {
  const int64_t big = (int64_t{1} << 53) + 1;
  CHECK(from_vector<int64_t>({big, -big}).str() ==
        "tensor([ 9007199254740993, -9007199254740993])");
  Tensor m = arange(6).reshape({2, 3});
  CHECK(m.t().str() == "tensor([[0, 3],\n        [1, 4],\n        [2, 5]])");
  CHECK(m.slice(1, 0, 3, 2).str() == "tensor([[0, 2],\n        [3, 5]])");
}
