#pragma once
// Scaled dot-product attention, as one op with its backward op (PyTorch's
// torch.nn.functional.scaled_dot_product_attention):
//
//   out = dropout(softmax(q k^T * scale + mask)) v
//
// for q [..., L, E], k [..., S, E], v [..., S, Ev] with the same leading (batch) dims, out
// [..., L, Ev]. attn_mask is bool (true: the key takes part) or floating (added to the
// scores), broadcastable to [..., L, S]; is_causal masks key s > query l (top left
// aligned, as PyTorch); scale defaults to 1 / sqrt(E). A row whose every key is masked
// gives zeros (and gets zero gradients), as PyTorch's math path since 2.5.
//
// The op "scaled_dot_product_attention" (inputs q, k, v, attn_mask?; attributes is_causal,
// dropout_p, scale, seed, offset) returns (out, logsumexp, rng_state): the row
// log-sum-exp of the masked scores [..., L] (f64 for f64 inputs, f32 otherwise), which the
// backward reads to recompute the probabilities, and the i64 [2] tensor {seed, offset} the
// dropout mask came from, which the backward op reads as an input (so a compiled program,
// which gives the forward a fresh seed and offset at every call, regenerates the same mask
// in the backward). Its dropout rule is dropout's (core/ops/dropout.h) applied to the
// probabilities [..., L, S] row-major: probability (b, l, s) at row-major position i is kept
// when philox::dropout_keep(seed, offset, i, p), and then scaled by dropout_scale(p). So
// softmax followed by dropout from a generator in the same state draws the same mask
// (scaled_dot_product_attention_math does that).
//
// The kernels never hold an [L, S] matrix: the CPU kernel (kernels/cpu/attention.cpp) is
// FlashAttention's tiled algorithm with an online softmax; extra memory is O(L) per head.
#include <optional>

#include "core/generator.h"
#include "core/tensor.h"

namespace kiln {

struct AttentionOptions {
  Tensor attn_mask = {};             // bool or floating, broadcastable to [..., L, S]
  bool is_causal = false;            // key s takes part in query l only when s <= l
  double dropout_p = 0.0;            // on the probabilities, in [0, 1]
  std::optional<double> scale = {};  // 1 / sqrt(E) when not given
  Generator* generator = nullptr;    // for dropout: the default one when null
};

// The scale the scores are multiplied by: options.scale, or 1 / sqrt(E) for q [..., L, E].
double attention_scale(const Tensor& q, const AttentionOptions& options);

// Attention's output [..., L, Ev]. Draws numel([..., L, S]) counters from the generator
// when dropout_p > 0.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

// The op's three outputs (see above).
struct AttentionResult {
  Tensor out, logsumexp, rng_state;
};
AttentionResult scaled_dot_product_attention_with_stats(const Tensor& q, const Tensor& k,
                                                        const Tensor& v,
                                                        const AttentionOptions& options = {});

// The gradients of q, k and v from the forward's inputs and outputs (the mask is a
// constant: it gets no gradient), in q's dtype. `scale` is the resolved one.
struct AttentionGrads {
  Tensor grad_q, grad_k, grad_v;
};
AttentionGrads scaled_dot_product_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                     const Tensor& k, const Tensor& v,
                                                     const Tensor& attn_mask, const Tensor& out,
                                                     const Tensor& logsumexp,
                                                     const Tensor& rng_state, bool is_causal,
                                                     double dropout_p, double scale);

// The reference: the same function composed of ordinary ops (matmul, where, softmax,
// dropout, matmul), holding the [..., L, S] scores. With the generator in the same state it
// draws the same dropout mask as the op.
Tensor scaled_dot_product_attention_math(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const AttentionOptions& options = {});

}  // namespace kiln
