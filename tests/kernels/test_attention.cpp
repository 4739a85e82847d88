// scaled_dot_product_attention and its backward op against the math path (matmul, mask,
// softmax, dropout, matmul) computed in f64 from the same inputs.
#include <cmath>
#include <limits>

#include "core/ops/attention.h"
#include "tolerance.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

constexpr double kF64Roundoff = 0x1p-53;

struct Case {
  Shape batch;
  int64_t L, S, E, Ev;
  bool causal;
  int mask;  // 0 none, 1 bool [L, S], 2 float [L, S], 3 bool key padding [B, 1, 1, S]
};

// L, S and E are not multiples of the 64-row tiles; L > S with is_causal leaves the first
// rows' keys all there (top-left alignment), L < S cuts keys off.
const std::vector<Case> kCases = {
    {{2, 3}, 70, 131, 24, 40, false, 0}, {{2, 3}, 70, 131, 24, 40, true, 0},
    {{2}, 129, 65, 16, 8, true, 1},      {{3}, 5, 200, 7, 9, false, 2},
    {{2, 2}, 33, 77, 12, 12, true, 3},   {{1}, 1, 1, 3, 2, false, 0},
    {{2, 2}, 100, 100, 8, 8, true, 2},
};

Tensor mask_for(const Case& c, DType dtype, uint64_t seed) {
  Generator gen(seed);
  const Shape ls{c.L, c.S};
  switch (c.mask) {
    case 1:
      return lt(rand(ls, {}, &gen), 0.8);
    case 2:
      return mul(randn(ls, {.dtype = dtype}, &gen), 2.0);
    case 3: {
      Shape s = c.batch;
      s.push_back(1);
      s.push_back(c.S);
      s[1] = 1;
      return lt(rand(s, {}, &gen), 0.7);
    }
    default:
      return {};
  }
}

Shape with(Shape batch, int64_t a, int64_t b) {
  batch.push_back(a);
  batch.push_back(b);
  return batch;
}

// The largest score magnitude scale * sum_e |q_e k_e| over all (l, s).
double score_magnitude(const Tensor& q, const Tensor& k, double scale) {
  return amax(mul(matmul(abs(q.to(DType::f64)), abs(k.to(DType::f64)).transpose(-2, -1)), scale))
      .item<double>();
}

// A bound on |out - exact| of attention computed in unit roundoff u: each score is a sum of
// E products (gamma(E) times smag) plus the mask's addition and scale's product (a few u of
// smag); a perturbation d of the scores changes each probability by a relative 2d; the
// output sums S weighted values (gamma(S)) and the online softmax rescales each row once
// per key tile (S / 64 + 1 roundings). Twice that for two implementations.
double output_bound(double smag, double vmax, int64_t E, int64_t S, double u) {
  const double score = summation_bound(E + 3, u) * (smag + 1);
  return vmax * (2 * score + summation_bound(S + S / 64 + 4, u));
}

}  // namespace

TEST_CASE("attention: forward and backward agree with the math path", "[attention]") {
  const Case c = GENERATE(from_range(kCases));
  const DType dtype = GENERATE(DType::f32, DType::f64);
  CAPTURE(c.batch, c.L, c.S, c.E, c.Ev, c.causal, c.mask, dtype);
  Generator gen(3);
  const Tensor q = randn(with(c.batch, c.L, c.E), {.dtype = dtype}, &gen);
  const Tensor k = randn(with(c.batch, c.S, c.E), {.dtype = dtype}, &gen);
  const Tensor v = randn(with(c.batch, c.S, c.Ev), {.dtype = dtype}, &gen);
  const Tensor g = randn(with(c.batch, c.L, c.Ev), {.dtype = dtype}, &gen);
  const Tensor mask = mask_for(c, dtype, 9);
  const AttentionOptions opts{.attn_mask = mask, .is_causal = c.causal};

  const AttentionResult r = scaled_dot_product_attention_with_stats(q, k, v, opts);
  CHECK(r.out.dtype() == dtype);
  CHECK(r.out.shape() == with(c.batch, c.L, c.Ev));
  Shape lse = c.batch;
  lse.push_back(c.L);
  CHECK(r.logsumexp.shape() == lse);

  // The reference in f64 from the same values, its gradients by autograd.
  Tensor q64 = q.to(DType::f64).detach(), k64 = k.to(DType::f64).detach(),
         v64 = v.to(DType::f64).detach();
  q64.requires_grad_();
  k64.requires_grad_();
  v64.requires_grad_();
  AttentionOptions ref_opts = opts;
  if (mask.defined() && mask.dtype() != DType::boolean) ref_opts.attn_mask = mask.to(DType::f64);
  const Tensor want = scaled_dot_product_attention_math(q64, k64, v64, ref_opts);
  want.backward(g.to(DType::f64));

  const double u = dtype == DType::f64 ? kF64Roundoff : kF32Roundoff;
  const double scale = attention_scale(q, opts);
  const double smag = score_magnitude(q, k, scale) + (c.mask == 2 ? 10.0 : 0.0);
  const double vmax = amax(abs(v.to(DType::f64))).item<double>();
  const double bound = output_bound(smag, vmax, c.E, c.S, u);
  INFO("forward bound " << bound);
  KILN_CHECK_CLOSE(r.out, want.detach(), 0.0, bound);

  const AttentionGrads grads = scaled_dot_product_attention_backward(
      g, q, k, v, mask, r.out, r.logsumexp, r.rng_state, c.causal, 0.0, scale);
  // Gradient bounds from the magnitudes of their terms: each probability P carries the
  // forward's relative error 2 * score, and every sum its gamma(n). grad_v = P^T g sums L
  // terms of at most gmax; dS = P (dP - D) with dP = g v^T and D = rowsum(g out) each at
  // most Ev gmax vmax; grad_q = scale dS k sums over keys, where sum_s P = 1, and grad_k =
  // scale dS^T q over L queries, where each P <= 1.
  const double score = summation_bound(c.E + 3, u) * (smag + 1);
  const double gmax = amax(abs(g.to(DType::f64))).item<double>();
  const double qmax = amax(abs(q.to(DType::f64))).item<double>();
  const double kmax = amax(abs(k.to(DType::f64))).item<double>();
  // |dP - D| <= 2 * Ev * gmax * vmax; sum_s P = 1 bounds the sums over keys, L bounds the
  // sums over queries (each P <= 1).
  const double dp = 2 * static_cast<double>(c.Ev) * gmax * vmax;
  const double rel = 2 * score + summation_bound(c.S + c.L + c.Ev + 8, u);
  const double bound_dv = rel * static_cast<double>(c.L) * gmax;
  const double bound_dq = rel * scale * dp * kmax * 2;
  const double bound_dk = rel * scale * dp * qmax * 2 * static_cast<double>(c.L);
  INFO("bounds dq " << bound_dq << " dk " << bound_dk << " dv " << bound_dv);
  KILN_CHECK_CLOSE(grads.grad_q, q64.grad(), 0.0, bound_dq);
  KILN_CHECK_CLOSE(grads.grad_k, k64.grad(), 0.0, bound_dk);
  KILN_CHECK_CLOSE(grads.grad_v, v64.grad(), 0.0, bound_dv);
}

TEST_CASE("attention: 16-bit inputs are computed in f32 and rounded once", "[attention]") {
  const DType dtype = GENERATE(DType::f16, DType::bf16);
  CAPTURE(dtype);
  Generator gen(5);
  const Tensor q = randn({2, 2, 37, 16}, {.dtype = dtype}, &gen);
  const Tensor k = randn({2, 2, 70, 16}, {.dtype = dtype}, &gen);
  const Tensor v = randn({2, 2, 70, 8}, {.dtype = dtype}, &gen);
  const AttentionOptions opts{.is_causal = true};
  const Tensor out = scaled_dot_product_attention(q, k, v, opts);
  CHECK(out.dtype() == dtype);
  const Tensor want =
      scaled_dot_product_attention_math(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), opts);
  // One rounding to the 16-bit type (relative u16) after the f32 bound.
  const double u16 = dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
  const double vmax = amax(abs(v.to(DType::f64))).item<double>();
  const double f32 = output_bound(score_magnitude(q, k, 0.25), vmax, 16, 70, kF32Roundoff);
  KILN_CHECK_CLOSE(out, want, u16, f32);
}

TEST_CASE("attention: strided and transposed inputs give the contiguous result", "[attention]") {
  Generator gen(6);
  // [B, L, H, E] permuted to [B, H, L, E], as multi-head attention makes them.
  const Tensor q = randn({2, 45, 3, 8}, {}, &gen).permute({0, 2, 1, 3});
  const Tensor k = randn({2, 50, 3, 8}, {}, &gen).permute({0, 2, 1, 3});
  const Tensor v = strided_copy(randn({2, 3, 50, 8}, {}, &gen));
  const Tensor mask = transposed_copy(lt(rand({50, 45}, {}, &gen), 0.9)).t();
  const AttentionOptions opts{.attn_mask = mask};
  KILN_CHECK_EQUAL(scaled_dot_product_attention(q, k, v, opts),
                   scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                                {.attn_mask = mask.contiguous()}));
}

TEST_CASE("attention: a row with every key masked gives zeros and zero gradients", "[attention]") {
  Generator gen(8);
  const Tensor q = randn({1, 4, 8}, {.dtype = DType::f64}, &gen);
  const Tensor k = randn({1, 6, 8}, {.dtype = DType::f64}, &gen);
  const Tensor v = randn({1, 6, 5}, {.dtype = DType::f64}, &gen);
  std::vector<double> keep(24, 1.0);
  for (int s = 0; s < 6; ++s) keep[static_cast<size_t>(2 * 6 + s)] = 0;  // row 2: nothing
  const Tensor mask = tensor_of(keep, {4, 6}, DType::boolean);
  const AttentionResult r = scaled_dot_product_attention_with_stats(q, k, v, {.attn_mask = mask});
  KILN_CHECK_EQUAL(r.out.select(1, 2), zeros({1, 5}));
  CHECK(std::isinf(r.logsumexp[0][2].item<double>()));
  KILN_CHECK_CLOSE(r.out, scaled_dot_product_attention_math(q, k, v, {.attn_mask = mask}), 0,
                   1e-14);
  const AttentionGrads g =
      scaled_dot_product_attention_backward(ones_like(r.out), q, k, v, mask, r.out, r.logsumexp,
                                            r.rng_state, false, 0.0, 1 / std::sqrt(8.0));
  KILN_CHECK_EQUAL(g.grad_q.select(1, 2), zeros({1, 8}));
}

TEST_CASE("attention: dropout draws dropout's mask of the probabilities, forward and backward",
          "[attention][dropout]") {
  const bool causal = GENERATE(false, true);
  CAPTURE(causal);
  Generator gen(10);
  const Tensor q = randn({2, 2, 67, 8}, {.dtype = DType::f64}, &gen);
  const Tensor k = randn({2, 2, 90, 8}, {.dtype = DType::f64}, &gen);
  const Tensor v = randn({2, 2, 90, 6}, {.dtype = DType::f64}, &gen);
  const Tensor g = randn({2, 2, 67, 6}, {.dtype = DType::f64}, &gen);
  Generator a(77), b(77);
  a.set_offset(5);
  b.set_offset(5);
  const AttentionResult r = scaled_dot_product_attention_with_stats(
      q, k, v, {.is_causal = causal, .dropout_p = 0.3, .generator = &a});
  CHECK(a.offset() == 5 + 2 * 2 * 67 * 90);  // one counter per probability
  KILN_CHECK_EQUAL(r.rng_state, from_vector<int64_t>({77, 5}));

  Tensor q64 = q.clone(), k64 = k.clone(), v64 = v.clone();
  q64.requires_grad_();
  k64.requires_grad_();
  v64.requires_grad_();
  const Tensor want = scaled_dot_product_attention_math(
      q64, k64, v64, {.is_causal = causal, .dropout_p = 0.3, .generator = &b});
  CHECK(b.offset() == a.offset());
  KILN_CHECK_CLOSE(r.out, want.detach(), 0, 1e-12);
  want.backward(g);
  const AttentionGrads grads = scaled_dot_product_attention_backward(
      g, q, k, v, {}, r.out, r.logsumexp, r.rng_state, causal, 0.3, attention_scale(q, {}));
  KILN_CHECK_CLOSE(grads.grad_q, q64.grad(), 0, 1e-11);
  KILN_CHECK_CLOSE(grads.grad_k, k64.grad(), 0, 1e-11);
  KILN_CHECK_CLOSE(grads.grad_v, v64.grad(), 0, 1e-11);

  // The same seed, the same output; the next draw another.
  Generator c(77);
  c.set_offset(5);
  KILN_CHECK_EQUAL(scaled_dot_product_attention(
                       q, k, v, {.is_causal = causal, .dropout_p = 0.3, .generator = &c}),
                   r.out);
  CHECK_FALSE(allclose(scaled_dot_product_attention(
                           q, k, v, {.is_causal = causal, .dropout_p = 0.3, .generator = &c}),
                       r.out, 0, 0));
}

TEST_CASE("attention: bad inputs are errors naming the op and the inputs", "[attention][errors]") {
  using Catch::Matchers::Contains;
  const Tensor q = randn({2, 5, 8}), k = randn({2, 7, 8}), v = randn({2, 7, 4});
  CHECK_THROWS_WITH(
      scaled_dot_product_attention(q, randn({2, 7, 6}), v),
      Contains("scaled_dot_product_attention") && Contains("f32[2,7,6]") && Contains("embedding"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, randn({2, 6, 4})),
                    Contains("number of keys S") && Contains("f32[2,6,4]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v.to(DType::f64)),
                    Contains("one dtype") && Contains("f64[2,7,4]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, randn({3, 7, 8}), v),
                    Contains("leading (batch) dims") && Contains("f32[3,7,8]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(randn({5}), randn({5}), randn({5})),
                    Contains("at least 2"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v, {.attn_mask = ones({5, 6})}),
                    Contains("attn_mask [5,6] does not broadcast to the scores' shape [2,5,7]"));
  CHECK_THROWS_WITH(
      scaled_dot_product_attention(q, k, v, {.attn_mask = ones({5, 7}, {.dtype = DType::i64})}),
      Contains("bool or floating") && Contains("i64[5,7]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v, {.dropout_p = 1.5}),
                    Contains("dropout_p must be in [0, 1], got 1.5"));
  CHECK_THROWS_WITH(
      scaled_dot_product_attention(q.to(DType::i64), k.to(DType::i64), v.to(DType::i64)),
      Contains("floating"));
}

TEST_CASE("attention: autocast runs it in bf16 and gradients reach the f32 leaves",
          "[attention][autocast]") {
  Generator gen(11);
  Tensor q = randn({2, 9, 8}, {}, &gen), k = randn({2, 13, 8}, {}, &gen),
         v = randn({2, 13, 4}, {}, &gen);
  for (Tensor* t : {&q, &k, &v}) t->requires_grad_();
  Tensor out;
  {
    autocast guard({.dtype = DType::bf16});
    out = scaled_dot_product_attention(q, k, v, {.is_causal = true});
  }
  CHECK(out.dtype() == DType::bf16);
  // The same op on the inputs rounded to bf16, which is what autocast gives it.
  const Tensor want =
      scaled_dot_product_attention(q.detach().to(DType::bf16), k.detach().to(DType::bf16),
                                   v.detach().to(DType::bf16), {.is_causal = true});
  KILN_CHECK_EQUAL(out, want);
  sum(out.to(DType::f32)).backward();
  for (const Tensor* t : {&q, &k, &v}) {
    REQUIRE(t->grad().defined());
    CHECK(t->grad().dtype() == DType::f32);
    CHECK(t->grad().shape() == t->shape());
  }
}

TEST_CASE("attention: inputs on two devices are an error naming them", "[attention][errors]") {
  // The shape rule alone: no second device is needed to build its metas.
  const OpDef& op = find_op("scaled_dot_product_attention");
  const TensorMeta q{{2, 5, 8}, DType::f32, Device::cpu()},
      k{{2, 7, 8}, DType::f32, Device::cuda(0)}, v{{2, 7, 4}, DType::f32, Device::cpu()},
      none{.defined = false};
  const TensorMeta in[] = {q, k, v, none};
  const Attrs attrs{{"is_causal", false},
                    {"dropout_p", 0.0},
                    {"scale", 1.0},
                    {"seed", int64_t{0}},
                    {"offset", int64_t{0}}};
  CHECK_THROWS_WITH(op.infer(std::span<const TensorMeta>(in), attrs),
                    Catch::Matchers::Contains("scaled_dot_product_attention") &&
                        Catch::Matchers::Contains("cuda:0") && Catch::Matchers::Contains("cpu"));
}

TEST_CASE("attention: empty sequences", "[attention]") {
  // No queries: an empty output. No keys: every row is empty of keys, so zeros, and zero
  // gradients.
  Tensor q = randn({2, 0, 4}), k = randn({2, 3, 4}), v = randn({2, 3, 5});
  CHECK(scaled_dot_product_attention(q, k, v).shape() == Shape{2, 0, 5});
  q = randn({2, 3, 4});
  k = randn({2, 0, 4});
  v = randn({2, 0, 5});
  const AttentionResult r = scaled_dot_product_attention_with_stats(q, k, v);
  KILN_CHECK_EQUAL(r.out, zeros({2, 3, 5}));
  const AttentionGrads g = scaled_dot_product_attention_backward(
      ones({2, 3, 5}), q, k, v, {}, r.out, r.logsumexp, r.rng_state, false, 0.0, 0.5);
  KILN_CHECK_EQUAL(g.grad_q, zeros({2, 3, 4}));
  CHECK(g.grad_k.shape() == Shape{2, 0, 4});
}
