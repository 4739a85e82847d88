// Kernels of cat, stack and pad (kernels/join.h): each input is copied into a view of the
// output with copy_, whose kernel converts dtypes, follows any strides and runs in parallel
// on the CPU (a generated strided copy on CUDA).
#include "kernels/join.h"

#include <algorithm>

namespace kiln::join {

void cat(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& a) {
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  const int64_t dim = wrap_dim(a.i("dim"), o.dim(), "cat");
  int64_t start = 0;
  for (const Tensor& t : in) {
    if (t.dim() == 1 && t.size(0) == 0) continue;  // skipped, as the rule says
    const int64_t n = t.size(dim);
    if (n > 0) o.narrow(dim, start, n).copy_(t);
    start += n;
  }
}

void stack(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& a) {
  const Tensor& o = out[0];
  if (o.numel() == 0) return;
  const int64_t dim = wrap_dim(a.i("dim"), o.dim(), "stack");
  for (size_t i = 0; i < in.size(); ++i) o.select(dim, static_cast<int64_t>(i)).copy_(in[i]);
}

void pad(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& a) {
  const std::vector<int64_t>& pads = a.ints("pads");
  Tensor src = in[0], dst = out[0];
  if (dst.numel() == 0) return;
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p > 0; }))
    dst.fill_(a.scalar("value"));
  // Narrow both sides to the region they share: negative pads crop the input, positive
  // ones shift where it lands in the output.
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const int64_t d = src.dim() - 1 - static_cast<int64_t>(i);
    const int64_t before = pads[2 * i], after = pads[2 * i + 1];
    const int64_t length =
        src.size(d) - std::max<int64_t>(0, -before) - std::max<int64_t>(0, -after);
    if (length <= 0) return;
    src = src.narrow(d, std::max<int64_t>(0, -before), length);
    dst = dst.narrow(d, std::max<int64_t>(0, before), length);
  }
  dst.copy_(src);
}

namespace {
struct Registrar {
  Registrar() {
    register_kernel("cat", DeviceType::cpu, cat);
    register_kernel("stack", DeviceType::cpu, stack);
    register_kernel("pad", DeviceType::cpu, pad);
  }
} registrar;
}  // namespace

}  // namespace kiln::join
