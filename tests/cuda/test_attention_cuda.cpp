// The CUDA kernels of scaled_dot_product_attention (kernels/cuda/attention.cpp): every
// instantiation compiles with NVRTC to sm_90 machine code without spills, and, run on CPU
// tensors in the emulator (tests/cuda/cuda_emulator.h: a block's 256 threads as real
// threads, __syncthreads as a barrier), the forward and both backward kernels give the CPU
// kernels' results: the same dropout mask, and sums within the bound of two summation
// orders of the same terms (tests/kernels/test_attention.cpp derives it). On a GPU, the op
// on device tensors against the CPU.
#include <cmath>
#include <map>

#include "compiler/compiler_testing.h"
#include "core/ops/attention.h"
#include "cuda/cuda_emulator.h"
#include "cuda/cuda_testing.h"
#include "kernels/cuda/hand_kernels.h"
#include "kernels/cuda/nvrtc.h"
#include "tolerance.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// |a - b| <= bound * magnitude, where magnitude bounds every term of the sums: the scores'
// (scale * sum |q||k| plus the mask), and the outputs' and gradients' (as in
// tests/kernels/test_attention.cpp: vmax for out; L gmax for grad_v; scale * 2 Ev gmax
// vmax * (L) kmax or qmax for grad_q and grad_k).
struct Bounds {
  double out, dq, dk, dv;
};
Bounds bounds(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, double scale,
              double mask_max, double u) {
  auto amax_abs = [](const Tensor& t) { return amax(abs(t.to(DType::f64))).item<double>(); };
  const int64_t L = q.size(-2), S = k.size(-2), E = q.size(-1), Ev = v.size(-1);
  const double smag =
      amax(mul(matmul(abs(q.to(DType::f64)), abs(k.to(DType::f64)).transpose(-2, -1)), scale))
          .item<double>() +
      mask_max;
  const double score = summation_bound(E + 3, u) * (smag + 1);
  const double rel = 2 * score + summation_bound(S + L + Ev + S / 16 + 8, u);
  const double vmax = amax_abs(v), gmax = amax_abs(g),
               dp = 2 * static_cast<double>(Ev) * gmax * vmax;
  return {rel * vmax, rel * scale * dp * amax_abs(k) * 2,
          rel * scale * dp * amax_abs(q) * 2 * static_cast<double>(L),
          rel * static_cast<double>(L) * gmax};
}

}  // namespace

TEST_CASE("attention's CUDA kernels compile for sm_90 without spills", "[nvrtc][attention]") {
  TempCache cache;
  std::vector<std::pair<std::string, std::string>> sources;
  for (const cuda::KernelSource& k : cuda::hand_written_kernels())
    if (k.name.find("attention") != std::string::npos) sources.push_back({k.source, k.name});
  REQUIRE(sources.size() == 3 * 4);  // forward, grad_q, grad_k and grad_v; f32, f64, f16, bf16
  std::vector<cuda::CudaBinary> binaries;
  try {
    binaries = cuda::compile_cuda_batch(sources);
  } catch (const Error& e) {
    FAIL(e.what());
  }
  for (size_t i = 0; i < binaries.size(); ++i) {
    INFO(sources[i].second << "\n" << binaries[i].log);
    CHECK(binaries[i].cubin.compare(0, 4,
                                    "\x7f"
                                    "ELF") == 0);
    CHECK(binaries[i].registers > 0);
    CHECK(binaries[i].spill_store_bytes == 0);
    CHECK(binaries[i].spill_load_bytes == 0);
  }
}

TEST_CASE("attention's CUDA kernels give the CPU's results in the emulator",
          "[cuda_emulated][attention]") {
  TempCache cache;
  struct Case {
    DType dtype;
    bool causal;
    int mask;  // 0 none, 1 bool [L, S], 2 float [B, 1, 1, S]
    double p;
  };
  const Case c = GENERATE(Case{DType::f32, true, 1, 0.0}, Case{DType::f64, false, 2, 0.0},
                          Case{DType::f64, true, 0, 0.3}, Case{DType::bf16, false, 1, 0.0});
  CAPTURE(c.dtype, c.causal, c.mask, c.p);
  Generator gen(2);
  const int64_t B = 2, L = 21, S = 35, E = 12, Ev = 20;
  const Tensor q = randn({B, L, E}, {.dtype = c.dtype}, &gen),
               k = randn({B, S, E}, {.dtype = c.dtype}, &gen);
  const Tensor v = randn({B, S, Ev}, {.dtype = c.dtype}, &gen),
               g = randn({B, L, Ev}, {.dtype = c.dtype}, &gen);
  Tensor mask;
  if (c.mask == 1) mask = lt(rand({L, S}, {}, &gen), 0.85);
  if (c.mask == 2) mask = randn({B, 1, S}, {.dtype = c.dtype}, &gen);
  Generator drop(5);
  const AttentionOptions opts{
      .attn_mask = mask, .is_causal = c.causal, .dropout_p = c.p, .generator = &drop};
  const double scale = attention_scale(q, opts);
  const AttentionResult r = scaled_dot_product_attention_with_stats(q, k, v, opts);
  const AttentionGrads want = scaled_dot_product_attention_backward(
      g, q, k, v, mask, r.out, r.logsumexp, r.rng_state, c.causal, c.p, scale);

  const OpDef& forward = find_op("scaled_dot_product_attention");
  const OpDef& backward = find_op("scaled_dot_product_attention_backward");
  Attrs attrs{{"is_causal", c.causal}, {"dropout_p", c.p}, {"scale", scale}};
  attrs.set("seed", r.rng_state[0].item<int64_t>());
  attrs.set("offset", r.rng_state[1].item<int64_t>());
  auto like = [](const Tensor& t) {
    return full(t.shape(), 7.0, {.dtype = t.dtype()});
  };  // unwritten shows
  const std::vector<Tensor> out = {like(r.out), like(r.logsumexp), like(r.rng_state)};
  const std::vector<Tensor> grads = {like(q), like(k), like(v)};
  const int64_t before = EmulatedHandKernels::launches();
  {
    EmulatedHandKernels emulated;
    forward.kernels[static_cast<size_t>(DeviceType::cuda)](std::vector<Tensor>{q, k, v, mask}, out,
                                                           attrs);
    backward.kernels[static_cast<size_t>(DeviceType::cuda)](
        std::vector<Tensor>{g, q, k, v, mask, r.out, r.logsumexp, r.rng_state}, grads,
        {{"is_causal", c.causal}, {"dropout_p", c.p}, {"scale", scale}});
  }
  CHECK(EmulatedHandKernels::launches() == before + 3);
  const double u = c.dtype == DType::f64 ? 0x1p-53 : kF32Roundoff;
  const double u16 = c.dtype == DType::bf16 ? 0x1p-8 : 0;  // one rounding of each result
  const double mask_max = c.mask == 2 ? amax(abs(mask.to(DType::f64))).item<double>() : 0;
  const Bounds b = bounds(q, k, v, g, scale, mask_max, u);
  KILN_CHECK_CLOSE(out[0], r.out, 2 * u16, b.out);
  KILN_CHECK_CLOSE(out[1], r.logsumexp, 0,
                   summation_bound(E + 3, u) * 4 * (1 + std::fabs(values(r.logsumexp)[0])) + b.out);
  KILN_CHECK_EQUAL(out[2], r.rng_state);
  KILN_CHECK_CLOSE(grads[0], want.grad_q, 2 * u16, b.dq);
  KILN_CHECK_CLOSE(grads[1], want.grad_k, 2 * u16, b.dk);
  KILN_CHECK_CLOSE(grads[2], want.grad_v, 2 * u16, b.dv);
}

TEST_CASE("attention on a GPU equals the CPU", "[cuda][attention]") {
  KILN_NEEDS_GPU();
  Generator gen(3);
  const Tensor q = randn({2, 3, 130, 64}, {}, &gen), k = randn({2, 3, 77, 64}, {}, &gen);
  const Tensor v = randn({2, 3, 77, 32}, {}, &gen), g = randn({2, 3, 130, 32}, {}, &gen);
  const Tensor mask = lt(rand({130, 77}, {}, &gen), 0.9);
  Generator a(9), d(9);
  const AttentionResult want = scaled_dot_product_attention_with_stats(
      q, k, v, {.attn_mask = mask, .is_causal = true, .dropout_p = 0.1, .generator = &a});
  const AttentionResult got = scaled_dot_product_attention_with_stats(
      gpu(q), gpu(k), gpu(v),
      {.attn_mask = gpu(mask), .is_causal = true, .dropout_p = 0.1, .generator = &d});
  const Bounds b = bounds(q, k, v, g, 0.125, 0, kF32Roundoff);
  KILN_CHECK_CLOSE(host(got.out), want.out, 0, b.out);
  const double scale = 0.125;
  const AttentionGrads gw = scaled_dot_product_attention_backward(
      g, q, k, v, mask, want.out, want.logsumexp, want.rng_state, true, 0.1, scale);
  const AttentionGrads gg =
      scaled_dot_product_attention_backward(gpu(g), gpu(q), gpu(k), gpu(v), gpu(mask), got.out,
                                            got.logsumexp, got.rng_state, true, 0.1, scale);
  KILN_CHECK_CLOSE(host(gg.grad_q), gw.grad_q, 0, b.dq);
  KILN_CHECK_CLOSE(host(gg.grad_k), gw.grad_k, 0, b.dk);
  KILN_CHECK_CLOSE(host(gg.grad_v), gw.grad_v, 0, b.dv);
}
