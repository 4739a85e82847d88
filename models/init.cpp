// torch.nn.init's initializers over kiln's random fills.
#include "models/init.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/factory.h"

namespace kiln::nn::init {

namespace {

void check_floating(const Tensor& t, const char* op) {
  KILN_CHECK(t.defined(), "{}: the tensor is undefined", op);
  KILN_CHECK(is_floating(t.dtype()), "{}: needs a floating tensor, got {}", op, t.meta_str());
}

int64_t chosen_fan(const Tensor& t, FanMode mode) {
  const Fans fans = calculate_fans(t);
  return mode == FanMode::fan_in ? fans.fan_in : fans.fan_out;
}

// The standard normal distribution function.
double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

}  // namespace

Fans calculate_fans(const Tensor& t) {
  KILN_CHECK(t.defined() && t.dim() >= 2,
             "calculate_fans: fan in and fan out need a tensor of at least 2 dims, got {}",
             t.defined() ? t.meta_str() : std::string("undefined"));
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive_field *= t.size(d);
  return {t.size(1) * receptive_field, t.size(0) * receptive_field};
}

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::linear:
    case Nonlinearity::conv2d:
    case Nonlinearity::sigmoid: return 1.0;
    case Nonlinearity::tanh: return 5.0 / 3.0;
    case Nonlinearity::relu: return std::sqrt(2.0);
    case Nonlinearity::leaky_relu: {
      const double slope = param < 0 ? 0.01 : param;
      return std::sqrt(2.0 / (1.0 + slope * slope));
    }
    case Nonlinearity::selu: return 0.75;
  }
  fail("calculate_gain: unknown nonlinearity {}", static_cast<int>(nonlinearity));
}

Tensor uniform_(const Tensor& t, double low, double high, Generator* generator) {
  check_floating(t, "uniform_");
  NoGradGuard no_grad;
  Tensor target = t;
  kiln::uniform_(target, low, high, generator);
  return t;
}

Tensor normal_(const Tensor& t, double mean, double std, Generator* generator) {
  check_floating(t, "normal_");
  KILN_CHECK(std >= 0, "normal_: std must be non-negative, got {}", std);
  NoGradGuard no_grad;
  Tensor target = t;
  kiln::normal_(target, mean, std, generator);
  return t;
}

Tensor kaiming_uniform_(const Tensor& t, const KaimingOptions& o, Generator* generator) {
  check_floating(t, "kaiming_uniform_");
  const int64_t fan = chosen_fan(t, o.mode);
  if (fan == 0) return t;  // an empty tensor: nothing to fill (PyTorch warns)
  const double bound = calculate_gain(o.nonlinearity, o.a) * std::sqrt(3.0 / fan);
  return uniform_(t, -bound, bound, generator);
}

Tensor kaiming_normal_(const Tensor& t, const KaimingOptions& o, Generator* generator) {
  check_floating(t, "kaiming_normal_");
  const int64_t fan = chosen_fan(t, o.mode);
  if (fan == 0) return t;
  return normal_(t, 0.0, calculate_gain(o.nonlinearity, o.a) / std::sqrt(fan), generator);
}

Tensor xavier_uniform_(const Tensor& t, double gain, Generator* generator) {
  check_floating(t, "xavier_uniform_");
  const Fans f = calculate_fans(t);
  if (f.fan_in + f.fan_out == 0) return t;
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(f.fan_in + f.fan_out));
  return uniform_(t, -bound, bound, generator);
}

Tensor xavier_normal_(const Tensor& t, double gain, Generator* generator) {
  check_floating(t, "xavier_normal_");
  const Fans f = calculate_fans(t);
  if (f.fan_in + f.fan_out == 0) return t;
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(f.fan_in + f.fan_out)),
                 generator);
}

Tensor trunc_normal_(const Tensor& t, double mean, double std, double a, double b,
                     Generator* generator) {
  check_floating(t, "trunc_normal_");
  KILN_CHECK(std > 0 && a < b, "trunc_normal_: needs std > 0 and a < b, got std={} a={} b={}",
             std, a, b);
  // Rejection sampling: expected draws are numel / mass, so demand a usable mass.
  const double mass = normal_cdf((b - mean) / std) - normal_cdf((a - mean) / std);
  KILN_CHECK(mass > 1e-6,
             "trunc_normal_: [{}, {}] holds too little of N({}, {}^2) (mass {}) to sample from", a,
             b, mean, std, mass);
  NoGradGuard no_grad;
  const int64_t n = t.numel();
  std::vector<double> values(static_cast<size_t>(n));
  std::vector<size_t> pending(values.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  while (!pending.empty()) {
    Tensor draws = randn({static_cast<int64_t>(pending.size())}, {.dtype = DType::f64}, generator);
    const double* z = draws.data_ptr<double>();
    std::vector<size_t> rejected;
    for (size_t k = 0; k < pending.size(); ++k) {
      const double x = mean + std * z[k];
      if (x >= a && x <= b) {
        values[pending[k]] = x;
      } else {
        rejected.push_back(pending[k]);
      }
    }
    pending = std::move(rejected);
  }
  Tensor target = t;
  target.copy_(from_vector(values, t.shape()));
  return t;
}

Tensor zeros_(const Tensor& t) { return constant_(t, 0.0); }
Tensor ones_(const Tensor& t) { return constant_(t, 1.0); }

Tensor constant_(const Tensor& t, double value) {
  KILN_CHECK(t.defined(), "constant_: the tensor is undefined");
  NoGradGuard no_grad;
  Tensor target = t;
  target.fill_(value);
  return t;
}

}  // namespace kiln::nn::init
