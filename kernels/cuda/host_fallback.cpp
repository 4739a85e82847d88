// Calls a CUDA kernel does not cover run on the host (run_on_host, kernels/cuda/runtime.h;
// today sort and topk of lines longer than one block sorts in shared memory): the inputs are
// copied to the CPU, the CPU kernel runs, the results are copied back. Correct (the CPU's
// numbers exactly) and slow (a device synchronization and two copies per call), so that a
// model using such a call still runs on the GPU. cuda::host_fallback_ops() lists the ops
// that have run this way, and kiln-bench prints it, so a slow step says why.
#include <mutex>
#include <set>

#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

std::mutex g_mutex;
std::set<std::string>& used() {
  static auto* s = new std::set<std::string>;
  return *s;
}

}  // namespace

void run_on_host(const OpDef& op, std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& attrs) {
  const KernelFn cpu = op.kernels[static_cast<int>(DeviceType::cpu)];
  KILN_CHECK(cpu, "{}: no CUDA kernel for this call, and no CPU kernel to fall back on", op.name);
  std::vector<Tensor> host_in, host_out;
  for (const Tensor& t : in) host_in.push_back(t.defined() ? t.to(Device::cpu()) : t);
  for (const Tensor& t : out) host_out.push_back(empty(t.shape(), {.dtype = t.dtype()}));
  cpu(host_in, host_out, attrs);
  for (size_t i = 0; i < out.size(); ++i) Tensor(out[i]).copy_(host_out[i]);
  std::lock_guard lock(g_mutex);
  used().insert(op.name);
}

std::vector<std::string> host_fallback_ops() {
  std::lock_guard lock(g_mutex);
  return {used().begin(), used().end()};
}

}  // namespace kiln::cuda
