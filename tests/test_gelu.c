// test_gelu.c: kernels/cpu/gelu.c against the exact GELU written with erfc in double, known
// values that the tanh approximation misses, and finite differences of its own forward.
#include "kernels/gelu.h"
#include "tests/test_util.h"

// ---- finite differences -------------------------------------------------------------------
// The objective is L = sum(out * R) in double for a fixed random R, so dL/dout = R.
typedef double (*Objective)(void *ctx);

// Error of <grad, xp - xm> against L(xp) - L(xm), with xp, xm = x +- h V for a random
// direction V. The analytic side uses the perturbation actually stored in fp32, so the
// rounding of x + hV does not count as error. The error is relative to the larger of
// |<grad, dx>| and ||grad * dx||_2, the typical size of a random-sign sum of those terms: the
// inner product alone can cancel by chance, and a wrong gradient still shows up in full
// (a gradient error e gives ~||e * dx||). x is restored.
static double fd_directional(Objective f, void *ctx, float *x, const float *grad, int64_t n,
                             float h, TestRng *rng) {
  float *x0 = malloc(n * sizeof(float)), *xp = malloc(n * sizeof(float));
  float *xm = malloc(n * sizeof(float));
  memcpy(x0, x, n * sizeof(float));
  for (int64_t i = 0; i < n; i++) {
    float v = test_rng_uniform(rng, -1.0f, 1.0f);
    xp[i] = x0[i] + h * v;
    xm[i] = x0[i] - h * v;
  }
  memcpy(x, xp, n * sizeof(float));
  double lp = f(ctx);
  memcpy(x, xm, n * sizeof(float));
  double lm = f(ctx);
  memcpy(x, x0, n * sizeof(float));
  double analytic = 0.0, spread = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double term = (double)grad[i] * ((double)xp[i] - (double)xm[i]);
    analytic += term;
    spread += term * term;
  }
  free(x0);
  free(xp);
  free(xm);
  return fabs((lp - lm) - analytic) / fmax(fmax(fabs(analytic), sqrt(spread)), 1e-30);
}

// Largest error over `count` random single elements, each measured against the gradient's RMS
// (a single element may be near zero, where a relative error means nothing).
static double fd_elements(Objective f, void *ctx, float *x, const float *grad, int64_t n, float h,
                          int count, TestRng *rng) {
  double rms = 0.0;
  for (int64_t i = 0; i < n; i++) rms += (double)grad[i] * grad[i];
  rms = sqrt(rms / n);
  double worst = 0.0;
  for (int t = 0; t < count; t++) {
    int64_t i = (int64_t)(test_rng_u64(rng) % (uint64_t)n);
    float x0 = x[i];
    x[i] = x0 + h;
    float xp = x[i];
    double lp = f(ctx);
    x[i] = x0 - h;
    float xm = x[i];
    double lm = f(ctx);
    x[i] = x0;
    double numeric = (lp - lm) / ((double)xp - (double)xm);
    double err = fabs(numeric - grad[i]) / fmax(fabs(grad[i]), rms);
    if (!(err <= worst)) worst = err;  // keeps NaN
  }
  return worst;
}

// ---- the case under test ------------------------------------------------------------------
typedef struct {
  int64_t n;
  float *inp, *R, *out;  // (n) each
} GeluCase;

static double gelu_objective(void *ctx) {
  GeluCase *c = ctx;
  gelu_forward_cpu(c->out, c->inp, c->n);
  double L = 0.0;
  for (int64_t i = 0; i < c->n; i++) L += (double)c->out[i] * c->R[i];
  return L;
}

// x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2: a different route than the kernel's erf, and
// accurate in the left tail where 1 + erf cancels.
static double gelu_ref(double x) {
  return x * 0.5 * erfc(-x / sqrt(2.0));
}
static double gelu_grad_ref(double x) {
  return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2.0 * acos(-1.0));
}

// ---- checks -------------------------------------------------------------------------------
static void check_known_values(void) {
  // GELU(x) for x = -3, -1, 0.5, 1, 2 (x Phi(x) from the normal CDF); the tanh approximation
  // is off by ~1e-4 relative at x = 1, far outside the tolerance.
  float x[5] = {-3.0f, -1.0f, 0.5f, 1.0f, 2.0f};
  double want[5] = {-0.0040496940948903, -0.15865525393145707, 0.34573123063700656,
                    0.8413447460685429, 1.9544997361036416};
  float out[5];
  test_poison(out, 5);
  gelu_forward_cpu(out, x, 5);
  // Element by element (the small value at x = -3 would vanish in a norm): an fp32 result
  // is within half an ulp, 6e-8 relative, of the exact value; allow 2e-7.
  double worst = 0.0;
  for (int i = 0; i < 5; i++) {
    double e = fabs(out[i] - want[i]) / fabs(want[i]);
    if (!(e <= worst)) worst = e;
  }
  test_check(worst <= 2e-7, "%-48s max rel_err %.3e (tol 2.0e-07)",
             "forward known values (x = -3, -1, 0.5, 1, 2)", worst);
}

static void check_against_double(TestRng *rng, int64_t n) {
  float *x = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
  float *want = malloc(n * sizeof(float)), *dout = malloc(n * sizeof(float));
  float *dinp = malloc(n * sizeof(float)), *want_dinp = malloc(n * sizeof(float));
  test_fill_uniform(rng, x, n, -6.0f, 6.0f);
  test_fill_uniform(rng, dout, n, -1.0f, 1.0f);
  for (int64_t i = 0; i < n; i++) {
    want[i] = (float)gelu_ref(x[i]);
    want_dinp[i] = (float)((double)dout[i] * gelu_grad_ref(x[i]));
  }
  test_poison(out, n);
  gelu_forward_cpu(out, x, n);
  // Both sides round one double result to fp32; erf vs erfc differ by a few double ulps.
  test_close("forward out vs double x Phi(x)", out, want, n, 1e-7);
  test_poison(dinp, n);
  gelu_backward_cpu(dinp, x, dout, n);
  test_close("backward dinp vs double Phi(x) + x phi(x)", dinp, want_dinp, n, 1e-7);
  // dinp may alias dout: the gradient overwrites its own input.
  gelu_backward_cpu(dout, x, dout, n);
  test_close("backward dinp in place (dinp == dout)", dout, want_dinp, n, 1e-7);
  free(x);
  free(out);
  free(want);
  free(dout);
  free(dinp);
  free(want_dinp);
}

static void check_finite_differences(TestRng *rng, int64_t n) {
  GeluCase c = {.n = n};
  c.inp = malloc(n * sizeof(float));
  c.R = malloc(n * sizeof(float));
  c.out = malloc(n * sizeof(float));
  float *dinp = malloc(n * sizeof(float));
  test_fill_uniform(rng, c.inp, n, -4.0f, 4.0f);
  test_fill_uniform(rng, c.R, n, -1.0f, 1.0f);
  test_poison(dinp, n);
  gelu_backward_cpu(dinp, c.inp, c.R, n);
  // GELU's third derivative is O(1), so with h = 1e-2 the central difference is off by
  // ~h^2 / 6 ~ 2e-5 relative; fp32 rounding of L (~1e-7 |out| per element) over 2h adds
  // ~1e-5: 1e-3 is safely above both and far below any real mistake.
  const float h = 1e-2f;
  double e = fd_directional(gelu_objective, &c, c.inp, dinp, n, h, rng);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", "finite diff <dinp, V>", e);
  e = fd_elements(gelu_objective, &c, c.inp, dinp, n, h, 16, rng);
  test_check(e <= 1e-3, "%-48s max_err %.3e (tol 1.0e-03)", "finite diff dinp, 16 elements", e);
  free(c.inp);
  free(c.R);
  free(c.out);
  free(dinp);
}

int main(void) {
  TestRng rng = {.state = 0x6e1u};
  check_known_values();
  check_against_double(&rng, 100003);
  check_finite_differences(&rng, 1000);
  return test_finish();
}
