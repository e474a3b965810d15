// gelu.c: CPU reference of the exact (erf) GELU and its derivative (kernels/gelu.h).
//
// Each element is evaluated in double and rounded once, so the result is the correctly
// rounded fp32 value up to libm's last-bit error; the cost is small next to the GEMMs that
// surround the MLP.
#include "kernels/gelu.h"

#include <math.h>

#define GELU_INV_SQRT2 0.70710678118654752440
#define GELU_INV_SQRT_2PI 0.39894228040143267794

void gelu_forward_cpu(float *out, const float *inp, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    double x = inp[i];
    out[i] = (float)(0.5 * x * (1.0 + erf(x * GELU_INV_SQRT2)));
  }
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
// Element i of dout is read before element i of dinp is written, so the two may alias.
void gelu_backward_cpu(float *dinp, const float *inp, const float *dout, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    double x = inp[i];
    double cdf = 0.5 * (1.0 + erf(x * GELU_INV_SQRT2));
    double pdf = exp(-0.5 * x * x) * GELU_INV_SQRT_2PI;
    dinp[i] = (float)((double)dout[i] * (cdf + x * pdf));
  }
}
