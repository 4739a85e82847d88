// kiln-demo: tensors, broadcasting and a matmul, printed.
#include <iostream>

#include <kiln.h>

using namespace kiln;

int main() {
  manual_seed(0);
  Tensor a = arange(6, {.dtype = DType::f32}).reshape({2, 3});
  std::cout << "a = arange(6).reshape(2, 3):\n" << a << "\n\n";
  Tensor b = from_vector<float>({10, 20, 30});
  std::cout << "b:\n" << b << "\n\n";
  std::cout << "a + b (b broadcast over rows):\n" << a + b << "\n\n";
  std::cout << "a * 0.5 - 1:\n" << a * 0.5 - 1 << "\n\n";
  std::cout << "randn(2, 2):\n" << randn({2, 2}) << "\n";
  return 0;
}
