#pragma once
// Shared pieces of the CPU elementwise kernels.
#include <span>

#include "core/registry.h"

namespace kiln::cpu {

// `t` converted to `dtype` (t itself when it already has it).
inline Tensor as_dtype(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// The dtype an elementwise op computes in: the inputs' result type, made floating for ops
// that produce floats.
inline DType compute_dtype(std::span<const Tensor> in, bool floating) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : in) metas.push_back(TensorMeta::of(t));
  const DType t = result_type(metas);
  return floating && !is_floating(t) ? kDefaultFloat : t;
}

// Runs body(dst) with dst of dtype `compute`: `out` itself, or a temporary that is then
// cast into `out` (an in-place target of another dtype).
template <class Body>
void into(const Tensor& out, DType compute, Body&& body) {
  if (out.dtype() == compute) {
    body(out);
    return;
  }
  Tensor tmp = make_tensor(out.shape(), compute, out.device());
  body(tmp);
  Tensor(out).copy_(tmp);
}

// into_contiguous for a layout: body(dst) with dst of dtype `compute`, dense in `format`:
// `out` itself when it is one, else a temporary then copied (and converted) into `out`,
// whatever its strides.
template <class Body>
void into_layout(const Tensor& out, DType compute, MemoryFormat format, Body&& body) {
  if (out.dtype() == compute && out.is_contiguous(format)) {
    body(out);
    return;
  }
  Tensor tmp = make_tensor(out.shape(), compute, out.device(), format);
  body(tmp);
  Tensor(out).copy_(tmp);
}

// Runs body(dst) with dst contiguous of dtype `compute`: `out` itself when it is, else a
// temporary then copied (and converted) into `out`.
template <class Body>
void into_contiguous(const Tensor& out, DType compute, Body&& body) {
  if (out.dtype() == compute && out.is_contiguous()) {
    body(out);
    return;
  }
  Tensor tmp = make_tensor(out.shape(), compute, out.device());
  body(tmp);
  Tensor(out).copy_(tmp);
}

}  // namespace kiln::cpu
