// test_gelu.c: kernels/cpu/gelu.c (fp32 through kernels/cpu/fastmath.h) against the exact GELU
// written with erfc in double: element by element on 1e6 random points, in the far left tail,
// next to the root of GELU', at known values that the tanh approximation misses, at edge and
// non-finite inputs, as norms, in place, and against finite differences of its own forward.
#include "kernels/gelu.h"
#include "tests/util/test_util.h"

// ---- the case under test ------------------------------------------------------------------
typedef struct {
  int64_t n;
  float *inp, *R, *out;  // (n) each
} GeluCase;

// The finite-difference objective: L = sum(out * R) in double for a fixed random R, so
// dL/dout = R.
static double gelu_objective(void *ctx) {
  GeluCase *c = ctx;
  gelu_forward_cpu(c->out, c->inp, c->n);
  double L = 0.0;
  for (int64_t i = 0; i < c->n; i++) L += (double)c->out[i] * c->R[i];
  return L;
}

// x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 in double: accurate in the left tail, where
// 1 + erf cancels. Non-finite inputs give what the formula gives (GELU(-inf) = -inf * 0 = NaN).
static double gelu_ref(double x) {
  return x * 0.5 * erfc(-x / sqrt(2.0));
}
static double gelu_grad_ref(double x) {
  return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2.0 * acos(-1.0));
}

// The accuracy contract: relative error <= 1e-6 where |want| >= 1e-6 and absolute error
// <= 1e-12 where |want| is smaller, as one number: |got - want| / max(|want|, 1e-6) <= 1e-6.
// NaN counts as an infinite error.
static double contract_err(float got, double want) {
  double e = fabs(got - want) / fmax(fabs(want), 1e-6);
  return isnan(e) ? INFINITY : e;
}

// Largest contract error of forward (out) and derivative (dinp with dout = 1) over x (n), and
// where each occurs. relative: measure plain relative error instead (for ranges where the
// values are small but normal floats, which the contract would pass trivially).
typedef struct {
  double fwd, bwd;
  float fwd_at, bwd_at;
} GeluErr;

static GeluErr gelu_errors(const float *x, int64_t n, int relative) {
  float *out = malloc(n * sizeof(float)), *dinp = malloc(n * sizeof(float));
  float *ones = malloc(n * sizeof(float));
  for (int64_t i = 0; i < n; i++) ones[i] = 1.0f;
  test_poison(out, n);
  test_poison(dinp, n);
  gelu_forward_cpu(out, x, n);
  gelu_backward_cpu(dinp, x, ones, n);
  GeluErr r = {0};
  for (int64_t i = 0; i < n; i++) {
    double want = gelu_ref(x[i]), want_d = gelu_grad_ref(x[i]);
    double ef = relative ? fabs(out[i] / want - 1) : contract_err(out[i], want);
    double eb = relative ? fabs(dinp[i] / want_d - 1) : contract_err(dinp[i], want_d);
    if (!(ef <= r.fwd)) r.fwd = ef, r.fwd_at = x[i];
    if (!(eb <= r.bwd)) r.bwd = eb, r.bwd_at = x[i];
  }
  free(out);
  free(dinp);
  free(ones);
  return r;
}

static void report(const char *what, GeluErr e, double tol) {
  char name[64];
  snprintf(name, sizeof name, "%s forward", what);
  test_check(e.fwd <= tol, "%-48s max err %.3e at x = %.9g (tol %.1e)", name, e.fwd, e.fwd_at, tol);
  snprintf(name, sizeof name, "%s GELU'", what);
  test_check(e.bwd <= tol, "%-48s max err %.3e at x = %.9g (tol %.1e)", name, e.bwd, e.bwd_at, tol);
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
  // Element by element (the small value at x = -3 would vanish in a norm): the fp32 kernel is
  // within ~4e-7 relative of the exact value (kernels/cpu/fastmath.h); allow 1e-6.
  double worst = 0.0;
  for (int i = 0; i < 5; i++) {
    double e = fabs(out[i] - want[i]) / fabs(want[i]);
    if (!(e <= worst)) worst = e;
  }
  test_check(worst <= 1e-6, "%-48s max rel_err %.3e (tol 1.0e-06)",
             "forward known values (x = -3, -1, 0.5, 1, 2)", worst);
}

// Phi's fp32 error is <= ~4e-7 relative and the kernel adds one or two roundings; near the
// root of GELU' it switches to a polynomial in x - x0 that keeps the relative error there.
static void check_elementwise(TestRng *rng) {
  const int64_t n = 1000000;
  float *x = malloc(n * sizeof(float));
  // Half over [-10, 10], half over [-1.5, 1.5] where GELU' crosses zero and Phi is near 1/2.
  for (int64_t i = 0; i < n; i++)
    x[i] = i % 2 ? test_rng_uniform(rng, -10.0f, 10.0f) : test_rng_uniform(rng, -1.5f, 1.5f);
  report("1e6 points", gelu_errors(x, n, 0), 1e-6);
  // The left tail, where the values are tiny but normal floats: relative error, which the
  // contract would not look at. Below -12.5 Phi(x) itself is no longer a normal float.
  test_fill_uniform(rng, x, n, -12.5f, -5.0f);
  report("tail [-12.5, -5] (relative)", gelu_errors(x, n, 1), 1e-6);
  // The 4000 floats closest to GELU''s root x0 = -0.7517915: |GELU'| goes down to 5e-9, and
  // x - x0 is formed exactly there, so even the relative error stays small.
  float r = -0.7517915f;
  for (int i = 0; i < 2000; i++) r = nextafterf(r, -1.0f);
  for (int i = 0; i < 4000; i++, r = nextafterf(r, 0.0f)) x[i] = r;
  report("GELU' root +-2000 floats, relative", gelu_errors(x, 4000, 1), 1e-6);
  free(x);
}

// Edge inputs, each at several positions of a 37-element array so that both the vector loop and
// its scalar remainder see it. Finite ones meet the contract; non-finite ones give what the
// double formula gives: GELU(+inf) = +inf, NaN otherwise.
static void check_edges(void) {
  const float edge[] = {0.0f,  -0.0f,  1e-8f,  -1e-8f,  5.0f,     -5.0f,     10.0f, -10.0f,
                        20.0f, -20.0f, 100.0f, -100.0f, INFINITY, -INFINITY, NAN};
  const int ne = sizeof edge / sizeof edge[0], n = 37;
  float x[37];
  for (int i = 0; i < n; i++) x[i] = edge[i % ne];
  float out[37], dinp[37], ones[37];
  for (int i = 0; i < n; i++) ones[i] = 1.0f;
  test_poison(out, n);
  test_poison(dinp, n);
  gelu_forward_cpu(out, x, n);
  gelu_backward_cpu(dinp, x, ones, n);
  double worst = 0.0;
  int bad_nonfinite = 0;
  for (int i = 0; i < n; i++) {
    double want = gelu_ref(x[i]), want_d = gelu_grad_ref(x[i]);
    if (isfinite(x[i])) {
      worst = fmax(worst, fmax(contract_err(out[i], want), contract_err(dinp[i], want_d)));
    } else {
      bad_nonfinite += !(isnan(want) ? isnan(out[i]) : out[i] == want);
      bad_nonfinite += !(isnan(want_d) ? isnan(dinp[i]) : dinp[i] == want_d);
    }
  }
  test_check(worst <= 1e-6, "%-48s max err %.3e (tol 1.0e-06)",
             "edges 0, +-1e-8, +-5, +-10, +-20, +-100", worst);
  test_check(bad_nonfinite == 0, "%-48s %d wrong", "inf, -inf, NaN as in the double formula",
             bad_nonfinite);
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
  // Element errors are <= ~4e-7 (checked above) and mostly far smaller; as a norm, 2e-7.
  test_close("forward out vs double x Phi(x)", out, want, n, 2e-7);
  test_poison(dinp, n);
  gelu_backward_cpu(dinp, x, dout, n);
  test_close("backward dinp vs double Phi(x) + x phi(x)", dinp, want_dinp, n, 2e-7);
  // dinp may alias dout: the gradient overwrites its own input.
  gelu_backward_cpu(dout, x, dout, n);
  test_close("backward dinp in place (dinp == dout)", dout, want_dinp, n, 2e-7);
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
  double e = test_fd_directional(gelu_objective, &c, c.inp, dinp, n, h, rng);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", "finite diff <dinp, V>", e);
  e = test_fd_elements(gelu_objective, &c, c.inp, dinp, n, h, 16, rng);
  test_check(e <= 1e-3, "%-48s max_err %.3e (tol 1.0e-03)", "finite diff dinp, 16 elements", e);
  free(c.inp);
  free(c.R);
  free(c.out);
  free(dinp);
}

int main(void) {
  TestRng rng = {.state = 0x6e1u};
  check_known_values();
  check_elementwise(&rng);
  check_edges();
  check_against_double(&rng, 100003);
  check_finite_differences(&rng, 1000);
  return test_finish();
}
