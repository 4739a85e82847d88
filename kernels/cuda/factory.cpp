// CUDA kernels of the factory ops. empty allocates only; full fills on the GPU (the fill
// kernel is generated, compiler/eager_cuda.cpp); the random ones (uniform, normal, randint)
// are Philox kernels of their own (kernels/cuda/random.cpp). arange, linspace and eye run
// their CPU kernel into a host tensor and copy it over: the CPU's values exactly, at the
// price of a host-to-device copy.
#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

void empty_cuda(Span, Span, const Attrs&) {}

void full_cuda(Span, Span out, const Attrs& attrs) { Tensor(out[0]).fill_(attrs.scalar("value")); }

constexpr const char* kOnHost[] = {"arange", "linspace", "eye"};

template <size_t I>
void on_host_then_copy(Span in, Span out, const Attrs& attrs) {
  static const OpDef& op = find_op(kOnHost[I]);
  const KernelFn cpu = op.kernels[static_cast<int>(DeviceType::cpu)];
  KILN_CHECK(cpu, "{}: no CPU kernel to compute the values from", op.name);
  const Tensor host = empty(out[0].shape(), {.dtype = out[0].dtype()});
  const Tensor host_out[] = {host};
  cpu(in, std::span<const Tensor>(host_out), attrs);
  Tensor(out[0]).copy_(host);
}

template <size_t... I>
void register_on_host(std::index_sequence<I...>) {
  (register_kernel(kOnHost[I], DeviceType::cuda, on_host_then_copy<I>), ...);
}

struct Registrar {
  Registrar() {
    register_kernel("empty", DeviceType::cuda, empty_cuda);
    register_kernel("full", DeviceType::cuda, full_cuda);
    register_on_host(std::make_index_sequence<std::size(kOnHost)>());
  }
} registrar;

}  // namespace
}  // namespace kiln::cuda
