#pragma once
// nn::functional: the functional forms of the layers, as in torch.nn.functional. They are
// kiln's ops themselves (core/ops/*.h), re-exposed here so that model code can say
// `nn::functional::cross_entropy(model(x), y)`; argument orders are kiln's (batch_norm takes
// weight and bias before the running statistics). `linear` and
// `matmul_bias` are the new compositions.
#include "core/ops/conv.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/indexing.h"
#include "core/ops/linalg.h"
#include "core/ops/loss.h"
#include "core/ops/norm.h"
#include "core/ops/pool.h"
#include "core/ops/softmax.h"

namespace kiln::nn::functional {

// x @ weight^T + bias for x [..., in], weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
// x @ weight + bias for x [..., in], weight [in, out] (GPT-2's Conv1D), bias [out] or
// undefined. Under autocast both are one addmm over x's rows, so that the bias joins the
// product before its one rounding and the result has autocast's dtype, as PyTorch's
// linear and addmm give (a product rounded to bf16 plus an f32 bias would promote to
// f32); outside it, matmul then add.
Tensor matmul_bias(const Tensor& x, const Tensor& weight, const Tensor& bias);

// Activations
using kiln::gelu;
using kiln::relu;
using kiln::sigmoid;
using kiln::silu;
using kiln::softplus;
using kiln::tanh;
using kiln::log_softmax;
using kiln::softmax;
using kiln::dropout;

// Layers' computations
using kiln::conv2d;
using kiln::Conv2dOptions;
using kiln::batch_norm;
using kiln::layer_norm;
using kiln::max_pool2d;
using kiln::avg_pool2d;
using kiln::adaptive_avg_pool2d;
using kiln::embedding;
using kiln::one_hot;

// Losses
using kiln::cross_entropy;
using kiln::CrossEntropyOptions;
using kiln::mse_loss;
using kiln::nll_loss;
using kiln::NllLossOptions;

}  // namespace kiln::nn::functional
