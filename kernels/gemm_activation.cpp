// The composed forms of addmm_activation and mm_gelu_backward (kernels/gemm_activation.h),
// registered as their CPU kernels. On the CPU the activation is a pass over the product
// either way: docs/compiler.md ("GEMM epilogues") measured an epilogue inside the GEMM's
// blocking at under 2% there, so the compiler makes these ops only for CUDA values.
#include "kernels/gemm_activation.h"

#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/linalg.h"
#include "core/ops/reduce.h"

namespace kiln {

void addmm_activation_composed(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const Tensor pre = addmm(in[0], in[1], in[2]);
  if (attrs.str("activation") == "relu") {
    Tensor(out[0]).copy_(relu(pre));
    return;
  }
  Tensor(out[0]).copy_(gelu(pre, "tanh"));
  Tensor(out[1]).copy_(pre);
}

void mm_gelu_backward_composed(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs&) {
  NoGradGuard no_grad;
  const Tensor grad_pre = gelu_backward(mm(in[0], in[1]), in[2], "tanh");
  Tensor(out[0]).copy_(grad_pre);
  Tensor(out[1]).copy_(sum(grad_pre, {0}));
}

namespace {
struct Registrar {
  Registrar() {
    register_kernel("addmm_activation", DeviceType::cpu, addmm_activation_composed);
    register_kernel("mm_gelu_backward", DeviceType::cpu, mm_gelu_backward_composed);
  }
} registrar;
}  // namespace

}  // namespace kiln
