#include <iostream>

#include <kiln.h>

int main() {
  kiln::Tensor a = kiln::ones({2, 3});
  kiln::Tensor b = a * 2 + 1;
  std::cout << b << "\n";
  return b[1][2].item<float>() == 3.0f ? 0 : 1;
}
