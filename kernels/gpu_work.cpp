// What the library ops' CUDA implementations (kernels/cuda/) do beyond reading each input
// and writing each output once: the facts the GPU cost model (compiler/cost.h) plans with.
// Here, not in kernels/cuda/, so that a build without the CUDA toolkit plans the same.
#include <algorithm>

#include "core/registry.h"

namespace kiln {
namespace {

using Metas = std::span<const TensorMeta>;

int64_t bytes_of(const TensorMeta& t) { return t.defined ? numel_of(t.shape) * static_cast<int64_t>(itemsize(t.dtype)) : 0; }

bool uses_tensor_cores(DType t, bool tf32) { return is_reduced_float(t) || (t == DType::f32 && tf32); }

// conv2d (x, w, b) -> y; conv2d_backward_input (dy, w) -> dx; conv2d_backward_weight (dy, x) -> dw.
// `y` and `w` are the output-shaped and weight-shaped tensors of the call; `activation` the
// input it reads as [N, C, H, W]; `image` the activation-shaped tensor it writes or reads
// besides (the output, or dy for the weight gradient).
GpuWork convolution(const TensorMeta& y, const TensorMeta& w, const TensorMeta& activation, const TensorMeta& image,
                    bool tf32) {
  GpuWork work;
  // A multiply-add per element of y and per element of a filter.
  work.flops = 2.0 * static_cast<double>(numel_of(y.shape)) * static_cast<double>(numel_of(w.shape)) /
               static_cast<double>(std::max<int64_t>(1, w.shape.at(0)));
  work.math = y.dtype;
  work.tensor_cores = uses_tensor_cores(y.dtype, tf32);
  if (work.tensor_cores && activation.memory_format != MemoryFormat::channels_last && activation.shape.size() == 4) {
    // cuDNN's tensor-core kernels are NHWC: an NCHW call transposes its activation in and
    // its activation-shaped result (or gradient) out.
    const int64_t moved = bytes_of(activation) + bytes_of(image);
    work.extra_read = moved;
    work.extra_written = moved;
    work.launches = 3;
    work.note = "nchw: transposes in and out";
  }
  return work;
}

GpuWork conv2d_work(Metas in, Metas out, const Attrs&, bool tf32) { return convolution(out[0], in[1], in[0], out[0], tf32); }
GpuWork conv2d_backward_input_work(Metas in, Metas out, const Attrs&, bool tf32) {
  return convolution(in[0], in[1], in[0], out[0], tf32);
}
GpuWork conv2d_backward_weight_work(Metas in, Metas out, const Attrs&, bool tf32) {
  return convolution(in[0], out[0], in[1], in[0], tf32);
}

// A product's multiply-adds: its output times the inner size of the operand `a`.
GpuWork product(const TensorMeta& a, const TensorMeta& out, bool tf32) {
  GpuWork work;
  work.flops = 2.0 * static_cast<double>(numel_of(out.shape)) * static_cast<double>(a.shape.empty() ? 1 : a.shape.back());
  work.math = out.dtype;
  work.tensor_cores = uses_tensor_cores(out.dtype, tf32);
  return work;
}
GpuWork first_operand_product(Metas in, Metas out, const Attrs&, bool tf32) { return product(in[0], out[0], tf32); }
GpuWork second_operand_product(Metas in, Metas out, const Attrs&, bool tf32) { return product(in[1], out[0], tf32); }

// cuDNN's batch norm reads x once for the statistics and once to normalize. 16-bit x is
// converted to an f32 copy first (which cuDNN reads twice) and y back from f32 (the cuDNN API
// kiln uses computes in f32). The running statistics are updated on copies: two
// cudaMemcpyAsync, which launch no kernel, for batch_norm_update; for `rerun`
// (batch_norm_stats_update, which reruns the forward and throws y away) two copy kernels.
GpuWork batch_norm_forward(const TensorMeta& x, bool writes_y, bool rerun) {
  GpuWork work;
  const int64_t elements = numel_of(x.shape), f32 = elements * 4;
  work.flops = 8.0 * static_cast<double>(elements);
  if (is_reduced_float(x.dtype)) {
    work.extra_written = f32 + (writes_y ? f32 : 0);
    work.extra_read = 2 * f32 + (writes_y ? f32 : 0);
    work.launches += writes_y ? 2 : 1;
    work.note = "16-bit: converted to f32 and back";
  } else {
    work.extra_read = bytes_of(x);
  }
  if (rerun) {
    work.extra_written += is_reduced_float(x.dtype) ? f32 : bytes_of(x);
    work.note += work.note.empty() ? "reruns the forward" : "; reruns the forward";
  }
  if (rerun) work.launches += 2;
  return work;
}
GpuWork batch_norm_work(Metas in, Metas, const Attrs&, bool) { return batch_norm_forward(in[0], true, false); }
GpuWork batch_norm_update_work(Metas in, Metas, const Attrs&, bool) { return batch_norm_forward(in[0], true, false); }
GpuWork batch_norm_stats_update_work(Metas in, Metas, const Attrs&, bool) {
  return batch_norm_forward(in[0], false, true);
}

// (dy, x, ...): two passes over x and dy, the reductions then dx; 16-bit x and dy are
// converted to f32 copies (each read twice) and dx converted back.
GpuWork batch_norm_backward_work(Metas in, Metas, const Attrs&, bool) {
  GpuWork work;
  const int64_t elements = numel_of(in[1].shape), f32 = elements * 4;
  work.flops = 10.0 * static_cast<double>(elements);
  if (is_reduced_float(in[1].dtype)) {
    work.extra_written = 3 * f32;
    work.extra_read = 5 * f32;
    work.launches = 4;
    work.note = "16-bit: converted to f32 and back";
  } else {
    work.extra_read = bytes_of(in[0]) + bytes_of(in[1]);
  }
  return work;
}

// batch norm's statistics ops (compiler/passes/batch_norm_split.cpp; kernels/cuda/
// norm_split.cpp): one launch reading each input once, 16-bit ones as they are, plus the f64
// partial sums of each chunk of rows, written and read once (kernels/cuda/norm_split.cpp's
// geometry: about 1024 blocks of 32 channels, chunks of at least 64 rows).
GpuWork channel_sums(const TensorMeta& x, double flops_per_element, std::string note) {
  GpuWork work;
  const int64_t channels = x.shape.at(1), rows = channels ? numel_of(x.shape) / channels : 0;
  const int64_t tiles = (channels + 31) / 32;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(std::max<int64_t>(1, 1024 / tiles), (rows + 63) / 64));
  work.flops = flops_per_element * static_cast<double>(numel_of(x.shape));
  work.extra_read = work.extra_written = chunks * 2 * channels * 8;
  work.note = std::move(note);
  return work;
}
GpuWork batch_norm_train_stats_work(Metas in, Metas, const Attrs&, bool) {
  return channel_sums(in[0], 4.0, "one pass, f64 sums");
}
GpuWork batch_norm_grad_stats_work(Metas in, Metas, const Attrs&, bool) {
  return channel_sums(in[1], 5.0, in[5].defined ? "one pass, ReLU's mask from its output" : "one pass, f64 sums");
}

// The multi-tensor updates launch once per table of parameters (kernels/cuda/optim.h: 24
// for SGD, 16 for AdamW), four FLOPs or so per element.
template <int64_t kGroup>
GpuWork multi_tensor_update(Metas, Metas out, const Attrs& attrs, bool) {
  GpuWork work;
  const int64_t count = attrs.has("count") ? attrs.i("count") : 1;
  work.launches = std::max<int64_t>(1, (count + kGroup - 1) / kGroup);
  work.flops = 0;
  for (const TensorMeta& t : out) work.flops += 4.0 * static_cast<double>(numel_of(t.shape));
  return work;
}

// scaled_dot_product_attention (q, k, v, mask?) and its backward (grad_out, q, k, v, ...):
// kernels/cuda/attention.cpp's scalar loops (no tensor cores). Per pair of query and key
// the forward takes a score (2E FLOPs) and a weighted value (2Ev); the backward's two
// kernels each recompute the score and dP (2E + 2Ev) and take grad_q, or grad_k and grad_v
// (2E, or 2E + 2Ev). Causal calls skip about half the pairs. Each 16-query tile reads k
// and v again (each 16-key tile q and grad_out), beyond the once the model counts.
template <bool kBackward>
GpuWork attention_work(Metas in, Metas, const Attrs& attrs, bool) {
  const TensorMeta &q = in[kBackward ? 1 : 0], &k = in[kBackward ? 2 : 1], &v = in[kBackward ? 3 : 2];
  const size_t r = q.shape.size();
  const double L = static_cast<double>(q.shape.at(r - 2)), S = static_cast<double>(k.shape.at(r - 2));
  const double E = static_cast<double>(q.shape.at(r - 1)), Ev = static_cast<double>(v.shape.at(r - 1));
  const double pairs = static_cast<double>(numel_of(q.shape)) / E * S * (attrs.b("is_causal") ? 0.5 : 1.0);
  GpuWork work;
  work.flops = pairs * (kBackward ? 8 * E + 6 * Ev : 2 * E + 2 * Ev);
  work.math = DType::f32;
  const int64_t query_tiles = (static_cast<int64_t>(L) + 15) / 16, key_tiles = (static_cast<int64_t>(S) + 15) / 16;
  work.extra_read = (query_tiles - 1) * (bytes_of(k) + bytes_of(v));
  if (kBackward) {
    work.extra_read += (key_tiles - 1) * (bytes_of(q) + bytes_of(in[0]));
    work.launches = 2;
  }
  work.note = "tiles re-read k and v (the backward's also q and grad_out)";
  return work;
}

struct Registrar {
  Registrar() {
    set_gpu_work("scaled_dot_product_attention", attention_work<false>);
    set_gpu_work("scaled_dot_product_attention_backward", attention_work<true>);
    set_gpu_work("conv2d", conv2d_work);
    set_gpu_work("conv2d_backward_input", conv2d_backward_input_work);
    set_gpu_work("conv2d_backward_weight", conv2d_backward_weight_work);
    for (const char* op : {"mm", "matmul", "bmm"}) set_gpu_work(op, first_operand_product);
    set_gpu_work("addmm", second_operand_product);
    set_gpu_work("addmm_activation", second_operand_product);  // cuBLASLt's epilogue: one launch
    set_gpu_work("mm_gelu_backward", first_operand_product);
    set_gpu_work("batch_norm", batch_norm_work);
    set_gpu_work("batch_norm_update", batch_norm_update_work);
    set_gpu_work("batch_norm_stats_update", batch_norm_stats_update_work);
    set_gpu_work("batch_norm_backward", batch_norm_backward_work);
    set_gpu_work("batch_norm_train_stats", batch_norm_train_stats_work);
    set_gpu_work("batch_norm_grad_stats", batch_norm_grad_stats_work);
    set_gpu_work("sgd_update_multi", multi_tensor_update<24>);
    set_gpu_work("adamw_update_multi", multi_tensor_update<16>);
  }
} registrar;

}  // namespace
}  // namespace kiln
