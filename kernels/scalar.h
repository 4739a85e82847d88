#pragma once
// Every elementwise scalar function of kiln, written once. This header compiles as host
// C++ (the CPU kernels and the generated C++ kernels include it) and as CUDA device code
// (nvcc, and NVRTC for generated CUDA kernels), so it includes nothing from the standard
// library on the device side. Floating functions come in float and double; the 16-bit
// types compute in float. Names match the ops of the registry.
#include "core/half.h"  // bits_to_f32
#include "core/hd.h"
#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

namespace kiln::scalar {

// ---- arithmetic ----
template <class T> KILN_HD T add(T a, T b) { return a + b; }
template <class T> KILN_HD T sub(T a, T b) { return a - b; }
template <class T> KILN_HD T mul(T a, T b) { return a * b; }
template <class T> KILN_HD T div(T a, T b) { return a / b; }
KILN_HD bool add(bool a, bool b) { return a || b; }
KILN_HD bool mul(bool a, bool b) { return a && b; }
template <class T> KILN_HD T neg(T a) { return -a; }
template <class T> KILN_HD T abs(T a) { return a < T(0) ? -a : a; }
KILN_HD bool abs(bool a) { return a; }
KILN_HD unsigned char abs(unsigned char a) { return a; }
KILN_HD float abs(float a) { return fabsf(a); }
KILN_HD double abs(double a) { return fabs(a); }
template <class T> KILN_HD T sign(T a) { return static_cast<T>((T(0) < a) - (a < T(0))); }
KILN_HD bool sign(bool a) { return a; }
KILN_HD unsigned char sign(unsigned char a) { return a != 0; }

template <class T> KILN_HD bool is_nan(T) { return false; }
KILN_HD bool is_nan(float a) { return a != a; }
KILN_HD bool is_nan(double a) { return a != a; }

// NaN-propagating max and min, like torch.maximum and torch.minimum.
template <class T> KILN_HD T maximum(T a, T b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  return a > b ? a : b;
}
template <class T> KILN_HD T minimum(T a, T b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  return a < b ? a : b;
}
template <class T> KILN_HD T clamp(T x, T lo, T hi) { return minimum(maximum(x, lo), hi); }
template <class T> KILN_HD T clamp_min(T x, T lo) { return maximum(x, lo); }
template <class T> KILN_HD T clamp_max(T x, T hi) { return minimum(x, hi); }

// Integer powers by squaring; a negative exponent gives 0 except for bases 1 and -1.
template <class T> KILN_HD T pow(T base, T exp) {
  if (exp < T(0)) {
    if (base == T(1)) return T(1);
    if (base == T(-1)) return (exp % T(2)) == T(0) ? T(1) : T(-1);
    return T(0);
  }
  T result = T(1);
  while (exp) {
    if (exp & T(1)) result = result * base;
    base = base * base;
    exp = exp / T(2);
  }
  return result;
}
KILN_HD bool pow(bool base, bool exp) { return base || !exp; }
KILN_HD unsigned char pow(unsigned char base, unsigned char exp) {
  unsigned char result = 1;
  for (; exp; exp = static_cast<unsigned char>(exp >> 1), base = static_cast<unsigned char>(base * base))
    if (exp & 1) result = static_cast<unsigned char>(result * base);
  return result;
}
KILN_HD float pow(float a, float b) { return powf(a, b); }
KILN_HD double pow(double a, double b) { return ::pow(a, b); }

// ---- transcendental (floating only) ----
KILN_HD float exp(float x) { return expf(x); }
KILN_HD double exp(double x) { return ::exp(x); }
KILN_HD float log(float x) { return logf(x); }
KILN_HD double log(double x) { return ::log(x); }
KILN_HD float log1p(float x) { return log1pf(x); }
KILN_HD double log1p(double x) { return ::log1p(x); }
KILN_HD float expm1(float x) { return expm1f(x); }
KILN_HD double expm1(double x) { return ::expm1(x); }
KILN_HD float sqrt(float x) { return sqrtf(x); }
KILN_HD double sqrt(double x) { return ::sqrt(x); }
KILN_HD float rsqrt(float x) { return 1.0f / sqrtf(x); }
KILN_HD double rsqrt(double x) { return 1.0 / ::sqrt(x); }
template <class T> KILN_HD T reciprocal(T x) { return T(1) / x; }
KILN_HD float sin(float x) { return sinf(x); }
KILN_HD double sin(double x) { return ::sin(x); }
KILN_HD float cos(float x) { return cosf(x); }
KILN_HD double cos(double x) { return ::cos(x); }
// erf in float, without branches so that a loop of it vectorizes (libm's erff is a call
// per element: GELU's forward took 4 ms of the MLP block's step). |x| < 1: x + x p(2x^2 - 1);
// 1 <= |x| < 3.92: 1 - q(|x| - 2.46), q fitting erfc; beyond, +-1 (the nearest float).
// p and q are least-squares fits on Chebyshev nodes. Checked over every float against
// double erf: at most 1.17 ulp off (glibc's erff: 0.97); NaN stays NaN, erf(+-inf) = +-1.
// That is without FMA contraction, as kiln builds (no -march; NVRTC with --fmad=false),
// so CPU and GPU agree bit for bit; with FMA the bound is 1.00 ulp. Near 1 it is not
// monotone by one ulp here and there (in 1 - q).
KILN_HD float erf(float x) {
  const float a = fabsf(x), u = x * x * 2.0f - 1.0f, v = a - 2.46f;
  const float p_coef[] = {-3.453126119e-02f, -1.405360972e-01f, 1.985249464e-02f, -2.285419897e-03f,
                          2.175202360e-04f,  -1.766878620e-05f, 1.226134239e-06f};
  const float q_coef[] = {5.033535064e-04f,  -2.656303770e-03f, 6.534519360e-03f,  -9.831278682e-03f,
                          9.914182752e-03f,  -6.805507535e-03f, 2.937170777e-03f,  -4.460110067e-04f,
                          -3.558972422e-04f, 2.843414286e-04f,  -7.582805899e-05f, -1.532516760e-05f,
                          1.733207026e-05f,  -3.028795959e-06f, -1.094436014e-06f, 3.670454920e-07f};
  float p = p_coef[6], q = q_coef[15];
  for (int i = 5; i >= 0; --i) p = p * u + p_coef[i];
  for (int i = 14; i >= 0; --i) q = q * v + q_coef[i];
  const float small = x + x * p;  // x (1 + p), rounded once at the end
  const float magnitude = a >= 3.92f ? 1.0f : 1.0f - q;
  const float large = copysignf(magnitude, x);
  return a >= 1.0f ? large : small;
}
KILN_HD double erf(double x) { return ::erf(x); }
// e^x for x <= 0 in float, without branches or calls so that a loop of it vectorizes
// (libm's expf is a call per element: gelu_backward's loop with it took 3x the time of the
// formula it replaced). x = n ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts, the first
// exact in n ln 2), e^r by its Taylor polynomial of degree 7 (truncated below 0.05 ulp), 2^n
// written into the exponent bits. Checked over every float in [-87.33, 0] against double
// exp: at most 1.22 ulp off. 0 below -87.33, where e^x is subnormal; NaN stays NaN.
KILN_HD float exp_nonpositive(float x) {
  const float c = x > -87.33f ? x : -87.33f;                       // so that n is defined for NaN
  const float n = (c * 1.44269504f + 12582912.0f) - 12582912.0f;  // rounded: 1.5 * 2^23
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  const float coef[] = {1.0f, 1.0f, 0.5f, 1.66666667e-1f, 4.16666667e-2f, 8.33333333e-3f, 1.38888889e-3f, 1.98412698e-4f};
  float p = coef[7];
  for (int i = 6; i >= 0; --i) p = p * r + coef[i];
  const float scale = bits_to_f32(static_cast<unsigned int>(static_cast<int>(n) + 127) << 23);
  return x < -87.33f ? 0.0f : p * scale;
}
KILN_HD double exp_nonpositive(double x) { return ::exp(x); }
// tanh in float, without branches or calls so that a loop of it vectorizes (libm's tanhf is
// a call per element: GPT-2's tanh-form GELU took 9 ns an element, 15% of its compiled
// step). |x| < 0.625: x + x^3 p(x^2), p the Taylor series to x^19 (truncated below 0.01 ulp
// there); beyond, (1 - e) / (1 + e) with e = e^(-2|x|) <= 0.29, so no cancellation; both
// on |x|, then the sign of x. Checked over every float against double tanh: at most 1.75 ulp off (without
// FMA contraction, as kiln builds). +-1 at infinity, NaN stays NaN, -0 stays -0.
KILN_HD float tanh(float x) {
  const float a = fabsf(x), s = x * x;
  const float coef[] = {-3.333333333e-01f, 1.333333333e-01f,  -5.396825397e-02f,
                        2.186948854e-02f,  -8.863235530e-03f, 3.592128037e-03f,
                        -1.455834387e-03f, 5.900274409e-04f,  -2.391291142e-04f};
  float p = coef[8];
  for (int i = 7; i >= 0; --i) p = p * s + coef[i];
  const float small = a + a * (s * p);
  const float e = exp_nonpositive(a * -2.0f);
  const float large = (1.0f - e) / (1.0f + e);
  return copysignf(a < 0.625f ? small : large, x);
}
KILN_HD double tanh(double x) { return ::tanh(x); }

// ---- activations ----
template <class T> KILN_HD T relu(T x) { return x < T(0) ? T(0) : x; }  // keeps NaN
KILN_HD bool relu(bool x) { return x; }
KILN_HD unsigned char relu(unsigned char x) { return x; }
template <class T> KILN_HD T sigmoid(T x) { return T(1) / (T(1) + exp(-x)); }
template <class T> KILN_HD T silu(T x) { return x / (T(1) + exp(-x)); }
// gelu(x) = x * Phi(x); `tanh_approx` selects the tanh form.
template <class T> KILN_HD T gelu(T x, bool tanh_approx) {
  if (tanh_approx) {
    const T k = T(0.7978845608028654);  // sqrt(2 / pi)
    return T(0.5) * x * (T(1) + tanh(k * (x + T(0.044715) * x * x * x)));
  }
  return T(0.5) * x * (T(1) + erf(x * T(0.7071067811865476)));
}
// grad times gelu's slope at x, in one function so that GELU's backward is one loop. Exact:
// Phi(x) + x phi(x), Phi through erf as in gelu (reading Phi back as gelu(x) / x lost
// precision near 0). Tanh form: the derivative of x (1 + tanh(u)) / 2, u = k (x + a x^3)
// as gelu computes it: (1 + t) / 2 + x (1 - t^2) u' / 2 with u' = k (1 + 3 a x^2).
template <class T> KILN_HD T gelu_backward(T grad, T x, bool tanh_approx) {
  if (tanh_approx) {
    const T k = T(0.7978845608028654), a = T(0.044715);
    const T t = tanh(k * (x + a * x * x * x));
    const T du = k * (T(1) + T(3) * a * x * x);
    return grad * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
  const T cdf = T(0.5) * (T(1) + erf(x * T(0.7071067811865476)));
  const T pdf = exp_nonpositive(x * x * T(-0.5)) * T(0.3989422804014327);  // 1 / sqrt(2 pi)
  return grad * (cdf + x * pdf);
}
// softplus(x) = log(1 + exp(beta x)) / beta, linear above the threshold.
template <class T> KILN_HD T softplus(T x, T beta, T threshold) {
  return x * beta > threshold ? x : log1p(exp(x * beta)) / beta;
}

// ---- comparisons and logic ----
template <class T> KILN_HD bool eq(T a, T b) { return a == b; }
template <class T> KILN_HD bool ne(T a, T b) { return a != b; }
template <class T> KILN_HD bool lt(T a, T b) { return a < b; }
template <class T> KILN_HD bool le(T a, T b) { return a <= b; }
template <class T> KILN_HD bool gt(T a, T b) { return a > b; }
template <class T> KILN_HD bool ge(T a, T b) { return a >= b; }
template <class T> KILN_HD bool logical_and(T a, T b) { return a != T(0) && b != T(0); }
template <class T> KILN_HD bool logical_or(T a, T b) { return a != T(0) || b != T(0); }
template <class T> KILN_HD bool logical_not(T a) { return a == T(0); }
template <class T> KILN_HD T where(bool c, T a, T b) { return c ? a : b; }

// ---- optimizer updates ----
// One element of an SGD or AdamW step, as torch's single-tensor optimizers compute it: in
// the parameter's dtype T, with the step's factors rounded to T first. The factors are
// computed once per step, in f64 (kernels/optim_factors.h on the host; AdamW's on the
// device too, through adamw_factors below), as PyTorch computes them in Python. The CPU
// kernels and the CUDA kernels of the updates both run these functions, so they agree bit
// for bit (NVRTC compiles without FMA contraction).

// decay: weight_decay is nonzero in f64 (one that rounds to 0 in T still multiplies).
template <class T> struct SgdFactors {
  T lr, momentum, one_minus_dampening, weight_decay;
  bool decay, nesterov, maximize, first;
};
template <class T, class F> KILN_HD SgdFactors<T> in_dtype(const SgdFactors<F>& f) {
  return {static_cast<T>(f.lr), static_cast<T>(f.momentum), static_cast<T>(f.one_minus_dampening),
          static_cast<T>(f.weight_decay), f.decay, f.nesterov, f.maximize, f.first};
}
// Returns the new parameter. buf: the element of the momentum buffer, updated in place (null
// without a buffer). Momentum 0 (a schedule's, 0 in T) leaves the buffer as it is, as
// PyTorch skips it.
template <class T> KILN_HD T sgd_update(T param, T grad, T* buf, const SgdFactors<T>& f) {
  T d = f.maximize ? -grad : grad;
  if (f.decay) d = d + f.weight_decay * param;
  if (buf && !(f.momentum == T(0))) {
    const T b = f.first ? d : f.momentum * *buf + f.one_minus_dampening * d;
    *buf = b;
    d = f.nesterov ? d + f.momentum * b : b;
  }
  return param - f.lr * d;
}

// decay is 1 - lr * weight_decay; step_size lr / (1 - beta1^step); correction2_sqrt
// sqrt(1 - beta2^step).
template <class T> struct AdamWFactors {
  T decay, one_minus_b1, b2, one_minus_b2, step_size, correction2_sqrt, eps;
  bool maximize;
};
template <class T, class F> KILN_HD AdamWFactors<T> in_dtype(const AdamWFactors<F>& f) {
  return {static_cast<T>(f.decay),     static_cast<T>(f.one_minus_b1),
          static_cast<T>(f.b2),        static_cast<T>(f.one_minus_b2),
          static_cast<T>(f.step_size), static_cast<T>(f.correction2_sqrt),
          static_cast<T>(f.eps),       f.maximize};
}
// The factors of one parameter's AdamW step from its step count (this step included) and
// the f64 hyperparameters, as PyTorch computes them in Python: the host's adamw_factors
// (kernels/optim_factors.h) and the CUDA kernel that computes them on the device when the
// step counts live there (capturable AdamW, kernels/cuda/optim.cpp) both call this.
KILN_HD AdamWFactors<double> adamw_factors(double step, double lr, double beta1, double beta2, double eps,
                                           double weight_decay, bool maximize) {
  return {1.0 - lr * weight_decay,
          1.0 - beta1,
          beta2,
          1.0 - beta2,
          lr / (1.0 - pow(beta1, step)),
          sqrt(1.0 - pow(beta2, step)),
          eps,
          maximize};
}
// Returns the new parameter and updates exp_avg, exp_avg_sq and, with amsgrad (else null),
// max_exp_avg_sq in place. The maximum is std::max's: where exp_avg_sq is NaN, the old
// maximum stays.
template <class T>
KILN_HD T adamw_update(T param, T grad, T& exp_avg, T& exp_avg_sq, T* max_exp_avg_sq, const AdamWFactors<T>& f) {
  if (f.maximize) grad = -grad;
  const T decayed = param * f.decay;
  exp_avg = exp_avg + f.one_minus_b1 * (grad - exp_avg);
  exp_avg_sq = exp_avg_sq * f.b2 + f.one_minus_b2 * grad * grad;
  T second = exp_avg_sq;
  if (max_exp_avg_sq) {
    if (!(*max_exp_avg_sq < second)) second = *max_exp_avg_sq;
    *max_exp_avg_sq = second;
  }
  const T denom = sqrt(second) / f.correction2_sqrt + f.eps;
  return decayed - f.step_size * (exp_avg / denom);
}

// ---- loss scaling (core/ops/amp_ops.h) ----
// The CPU and CUDA kernels of the loss scaler run these, as PyTorch's compute them.

// Whether x is neither infinite nor NaN (inf - inf and NaN - NaN are NaN).
template <class C> KILN_HD bool is_finite(C x) { return x - x == C(0); }

// A gradient element times the inverse scale, in C (float for the 16-bit floats, the
// element's own type otherwise); sets `nonfinite` when the element was infinite or NaN.
template <class C> KILN_HD C amp_unscale(C grad, float inv_scale, bool& nonfinite) {
  if (!is_finite(grad)) nonfinite = true;
  return grad * static_cast<C>(inv_scale);
}

// The scale after an optimizer step, and the tracker of clean steps since the last change:
// backed off (in f64, rounded to f32) after an overflow, grown after growth_interval clean
// steps when the grown scale is finite.
KILN_HD float amp_update_scale(float scale, int& tracker, bool found_inf, double growth_factor,
                               double backoff_factor, long long growth_interval) {
  if (found_inf) {
    tracker = 0;
    return static_cast<float>(scale * backoff_factor);
  }
  if (tracker + 1 < growth_interval) {
    tracker = tracker + 1;
    return scale;
  }
  tracker = 0;
  const float grown = static_cast<float>(scale * growth_factor);
  return is_finite(grown) ? grown : scale;
}

}  // namespace kiln::scalar
