// gelu.c: CPU exact (erf) GELU and its derivative (kernels/gelu.h) in vectorized fp32.
//
// GELU(x) = x Phi(x) and GELU'(x) = Phi(x) + x phi(x), with Phi and phi from
// kernels/cpu/fastmath.h, whose plain-arithmetic fp32 loops gcc turns into 8-wide AVX2 code
// (libm's erf/exp in double ran one element at a time and made GELU the trainer's slowest
// elementwise op). Relative error against the double formula is <= 1e-6 wherever the value is
// not tiny, including the far left tail (tests/test_gelu.c). Non-finite inputs follow the
// formula: NaN gives NaN, GELU(+inf) = +inf, GELU(-inf) = -inf * 0 = NaN, GELU'(+-inf) = NaN,
// so an overflow upstream is never turned into a finite number here.
#include "kernels/gelu.h"

#include "kernels/cpu/fastmath.h"

void gelu_forward_cpu(float *out, const float *inp, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = x * fast_normal_cdf(x);
  }
}

// GELU'(x) has a root at x0 = -0.75179: there Phi(x) and x phi(x) (each ~0.23) cancel, and
// their fp32 rounding errors (~1e-7 absolute) would become a large relative error. Within
// |x - x0| < 0.6 the derivative is instead d S(d), d = x - x0 (x - X0_HI is exact near the root;
// X0_LO carries the rest of x0), S of degree 8 fitted to GELU'(x0 + d) / d (near-minimax in
// relative error, 2.1e-8 with fp32 coefficients). Outside the window the sum is at least half
// its larger term, so the terms' rounding errors stay below 1e-6 relative.
static inline float gelu_grad(float x) {
  const float X0_HI = -7.517915368e-01f;
  const float X0_LO = 1.211444989e-08f;
  float d = (x - X0_HI) - X0_LO;
  float s = fastmath_fma(-6.895295810e-04f, d, -2.099755686e-03f);
  s = fastmath_fma(s, d, 4.528102931e-03f);
  s = fastmath_fma(s, d, 1.938686706e-02f);
  s = fastmath_fma(s, d, -1.477063075e-02f);
  s = fastmath_fma(s, d, -1.140051782e-01f);
  s = fastmath_fma(s, d, -1.819976047e-02f);
  s = fastmath_fma(s, d, 3.882849216e-01f);
  s = fastmath_fma(s, d, 4.314939976e-01f);
  float near_root = d * s;
  float direct = fastmath_fma(x, fast_normal_pdf(x), fast_normal_cdf(x));
  return fastmath_select(fabsf(d) < 0.6f, near_root, direct);
}

// Element i of dout is read before element i of dinp is written, so the two may alias.
void gelu_backward_cpu(float *dinp, const float *inp, const float *dout, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) dinp[i] = dout[i] * gelu_grad(inp[i]);
}
