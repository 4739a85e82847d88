// CUDA kernels of linear_cross_entropy and its backward op: the composed forms
// (kernels/linear_cross_entropy_composed.h), whose products run through cuBLAS over the
// counted rows alone.
#include "kernels/linear_cross_entropy_composed.h"

namespace kiln::cuda {
namespace {

struct Registrar {
  Registrar() {
    register_kernel("linear_cross_entropy", DeviceType::cuda, linear_cross_entropy_composed);
    register_kernel("linear_cross_entropy_backward", DeviceType::cuda, linear_cross_entropy_backward_composed);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
