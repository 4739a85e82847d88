// CUDA kernels of the copies between devices: to_device with a CUDA destination. (A copy to
// the CPU is the CPU kernel's, through the copy_bytes this backend installs.)
#include "core/registry.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

// The source's bytes, made contiguous on its own device first, into the new tensor.
void to_device_cuda(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs&) {
  const Tensor src = in[0].contiguous();
  copy_bytes(out[0].data_ptr(), out[0].device(), src.data_ptr(), src.device(),
             static_cast<size_t>(src.numel()) * src.itemsize());
}

struct Registrar {
  Registrar() { register_kernel("to_device", DeviceType::cuda, to_device_cuda); }
} registrar;

}  // namespace
}  // namespace kiln::cuda
