// CUDA kernels of cat, stack and pad: kernels/join.h's copies into views of the output,
// which stay on the GPU (one generated strided copy per input).
#include "kernels/join.h"

namespace kiln::cuda {
namespace {

struct Registrar {
  Registrar() {
    register_kernel("cat", DeviceType::cuda, join::cat);
    register_kernel("stack", DeviceType::cuda, join::stack);
    register_kernel("pad", DeviceType::cuda, join::pad);
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
