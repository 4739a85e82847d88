// Ops with no CUDA kernel yet run on the host: the inputs are copied to the CPU, the CPU
// kernel runs, the results are copied back. Correct (the CPU's numbers exactly, including
// the random ops, which read their Philox stream from their attributes) and slow (a device
// synchronization and two copies per call), so that a model using such an op still runs on
// the GPU. cuda::host_fallback_ops() lists the ops that have run this way, and
// kiln-bench prints it, so a slow step says why. Each op leaves this list when it gets a
// real CUDA kernel.
#include <mutex>
#include <set>

#include "core/ops/factory.h"
#include "core/registry.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

using Span = std::span<const Tensor>;

constexpr const char* kOnHost[] = {"topk", "sort"};

std::mutex g_mutex;
std::set<std::string>& used() {
  static auto* s = new std::set<std::string>;
  return *s;
}

template <size_t I>
void on_host(Span in, Span out, const Attrs& attrs) {
  static const OpDef& op = find_op(kOnHost[I]);
  const KernelFn cpu = op.kernels[static_cast<int>(DeviceType::cpu)];
  KILN_CHECK(cpu, "{}: no CUDA kernel, and no CPU kernel to fall back on", op.name);
  std::vector<Tensor> host_in, host_out;
  for (const Tensor& t : in) host_in.push_back(t.defined() ? t.to(Device::cpu()) : t);
  for (const Tensor& t : out) host_out.push_back(empty(t.shape(), {.dtype = t.dtype()}));
  cpu(host_in, host_out, attrs);
  for (size_t i = 0; i < out.size(); ++i) Tensor(out[i]).copy_(host_out[i]);
  std::lock_guard lock(g_mutex);
  used().insert(op.name);
}

template <size_t... I>
void register_all(std::index_sequence<I...>) {
  (register_kernel(kOnHost[I], DeviceType::cuda, on_host<I>), ...);
}

struct Registrar {
  Registrar() { register_all(std::make_index_sequence<std::size(kOnHost)>()); }
} registrar;

}  // namespace

std::vector<std::string> host_fallback_ops() {
  std::lock_guard lock(g_mutex);
  return {used().begin(), used().end()};
}

}  // namespace kiln::cuda
