#pragma once
// Parameter initializers with torch.nn.init's formulas. Each fills its tensor in place
// without recording a graph (so parameters that require grad can be filled), draws from
// `generator` (the default one when null, so manual_seed makes them reproducible) and
// returns the tensor.
#include <cstdint>

#include "core/generator.h"
#include "core/tensor.h"

namespace kiln::nn::init {

enum class FanMode { fan_in, fan_out };
enum class Nonlinearity { linear, conv2d, sigmoid, tanh, relu, leaky_relu, selu };

struct Fans {
  int64_t fan_in, fan_out;
};
// torch.nn.init._calculate_fan_in_and_fan_out: for a [out, in, k...] weight,
// fan_in = in * prod(k) and fan_out = out * prod(k). Needs at least 2 dims.
Fans calculate_fans(const Tensor& t);
// The recommended gain of a nonlinearity (torch.nn.init.calculate_gain); `param` is
// leaky_relu's negative slope (0.01 when negative).
double calculate_gain(Nonlinearity nonlinearity, double param = -1);

struct KaimingOptions {
  double a = 0;  // leaky_relu's negative slope
  FanMode mode = FanMode::fan_in;
  Nonlinearity nonlinearity = Nonlinearity::leaky_relu;
};
// U(-b, b) with b = gain * sqrt(3 / fan).
Tensor kaiming_uniform_(const Tensor& t, const KaimingOptions& options = {},
                        Generator* generator = nullptr);
// N(0, std^2) with std = gain / sqrt(fan).
Tensor kaiming_normal_(const Tensor& t, const KaimingOptions& options = {},
                       Generator* generator = nullptr);
// U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(const Tensor& t, double gain = 1.0, Generator* generator = nullptr);
// N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal_(const Tensor& t, double gain = 1.0, Generator* generator = nullptr);

Tensor uniform_(const Tensor& t, double low = 0.0, double high = 1.0, Generator* generator = nullptr);
Tensor normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* generator = nullptr);
// N(mean, std^2) restricted to [a, b] (redrawing values outside it).
Tensor trunc_normal_(const Tensor& t, double mean = 0.0, double std = 1.0, double a = -2.0,
                     double b = 2.0, Generator* generator = nullptr);
Tensor zeros_(const Tensor& t);
Tensor ones_(const Tensor& t);
Tensor constant_(const Tensor& t, double value);

}  // namespace kiln::nn::init
