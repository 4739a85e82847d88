// kiln-demo: tensors, broadcasting and a matmul, printed.
#include <iostream>

#include <kiln.h>

#include "tools/report_errors.h"

using namespace kiln;

int main() {
  return tools::report_errors("kiln-demo", 1, [] {
    manual_seed(0);
    Tensor a = arange(6, {.dtype = DType::f32}).reshape({2, 3});
    std::cout << "a = arange(6).reshape(2, 3):\n" << a << "\n\n";
    Tensor b = from_vector<float>({10, 20, 30});
    std::cout << "b:\n" << b << "\n\n";
    std::cout << "a + b (b broadcast over rows):\n" << a + b << "\n\n";
    std::cout << "a * 0.5 - 1:\n" << a * 0.5 - 1 << "\n\n";
    Tensor w = randn({3, 2});
    std::cout << "w = randn(3, 2):\n" << w << "\n\n";
    std::cout << "matmul(a, w), [2, 3] @ [3, 2]:\n" << matmul(a, w) << "\n\n";
    std::cout << "softmax(a, dim=1):\n" << softmax(a, 1) << "\n\n";
    std::cout << "a.sum(dim=0): " << sum(a, {0}) << "\n";
    return 0;
  });
}
