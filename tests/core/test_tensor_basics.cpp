#include "testing.h"

using namespace kiln;
using namespace kiln::testing;

TEST_CASE("arange, reshape and broadcasting add", "[core]") {
  Tensor a = arange(6, {.dtype = DType::f32}).reshape({2, 3});
  Tensor b = from_vector<float>({10, 20, 30});
  KILN_CHECK_EQUAL(a + b, tensor_of({10, 21, 32, 13, 24, 35}, {2, 3}));
  CHECK((a + b).dtype() == DType::f32);
}

TEST_CASE("strided and transposed inputs give the same result", "[core]") {
  Tensor a = randn({4, 5});
  Tensor b = randn({4, 5});
  Tensor expected = a * b;
  KILN_CHECK_EQUAL(strided_copy(a) * b, expected);
  KILN_CHECK_EQUAL(transposed_copy(a) * transposed_copy(b), expected);
}
