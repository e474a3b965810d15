// test_fastmath.c: kernels/cpu/fastmath.h against double-precision libm. fast_expf over its
// whole normal range and at its edges (flush to 0 below ln FLT_MIN, +inf above ln FLT_MAX, NaN);
// fast_normal_cdf and fast_normal_pdf over the range where they are normal floats, including
// the far left tail, Phi(x) = 1 - Phi(-x), and their limits at +-inf and NaN. Loops over arrays
// run through gcc's vectorized code and single calls through the scalar code: both are checked.
#include <float.h>

#include "kernels/cpu/fastmath.h"
#include "tests/util/test_util.h"

static const double SQRT_2PI = 2.5066282746310002;

static double ref_cdf(double x) {
  return 0.5 * erfc(-x / sqrt(2.0));
}
static double ref_pdf(double x) {
  return exp(-0.5 * x * x) / SQRT_2PI;
}

typedef enum { FN_EXP, FN_CDF, FN_PDF } Fn;

// Largest |got - want| / |want| over x (n), and where; NaN in got counts as an infinite error.
// Each loop over the array is the vectorized code.
static double max_rel_err(const float *x, int64_t n, Fn fn, float *worst_x) {
  float *got = malloc(n * sizeof(float));
  test_poison(got, n);
  if (fn == FN_EXP)
    for (int64_t i = 0; i < n; i++) got[i] = fast_expf(x[i]);
  else if (fn == FN_CDF)
    for (int64_t i = 0; i < n; i++) got[i] = fast_normal_cdf(x[i]);
  else
    for (int64_t i = 0; i < n; i++) got[i] = fast_normal_pdf(x[i]);
  double worst = 0.0;
  *worst_x = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    double want = fn == FN_EXP ? exp(x[i]) : fn == FN_CDF ? ref_cdf(x[i]) : ref_pdf(x[i]);
    double e = fabs(got[i] - want) / fabs(want);
    if (!(e <= worst)) {
      worst = isnan(e) ? INFINITY : e;
      *worst_x = x[i];
    }
  }
  free(got);
  return worst;
}

static void check_exp_range(TestRng *rng) {
  // Random points over the whole range with a normal result, and |x| from 1e-8 to 1 where a
  // badly placed 1 + r would show.
  const int64_t n = 1000000;
  float *x = malloc(n * sizeof(float));
  test_fill_uniform(rng, x, n, -87.33f, 88.72f);
  for (int64_t i = 0; i < 2000; i++) x[i] = (i % 2 ? 1.0f : -1.0f) * powf(10.0f, -8.0f + 4e-3f * i);
  float at;
  // Degree-6 polynomial with fit error 1.2e-8 on an exactly reduced argument; what is left is
  // the rounding of the last two fmas (~1e-7): 2e-7 is the accuracy the header promises.
  double e = max_rel_err(x, n, FN_EXP, &at);
  test_check(e <= 2e-7, "%-48s max rel_err %.3e at x = %g (tol 2.0e-07)",
             "fast_expf, 1e6 points in [-87.33, 88.72]", e, at);
  free(x);
}

// One call per value (the scalar code) and the same values in an array (the vector code).
static int exp_is(float x, float want) {
  float arr[19];
  for (int i = 0; i < 19; i++) arr[i] = x;
  float got[19];
  for (int i = 0; i < 19; i++) got[i] = fast_expf(arr[i]);
  int ok = 1;
  for (int i = 0; i < 19; i++)
    ok &= isnan(want) ? isnan(got[i]) : (got[i] == want && got[i] == fast_expf(x));
  return ok;
}

static void check_exp_edges(void) {
  const float LN_MIN = -0x1.5d589ep+6f;  // the smallest float with exp(x) >= FLT_MIN
  const float LN_MAX = 0x1.62e42ep+6f;   // the largest float with exp(x) <= FLT_MAX
  test_check(exp_is(0.0f, 1.0f) && exp_is(-0.0f, 1.0f), "fast_expf(+-0) == 1 exactly");
  float lo = fast_expf(LN_MIN), hi = fast_expf(LN_MAX);
  double elo = fabs(lo / exp((double)LN_MIN) - 1), ehi = fabs(hi / exp((double)LN_MAX) - 1);
  test_check(lo >= FLT_MIN && elo <= 2e-7 && ehi <= 2e-7 && isfinite(hi),
             "%-48s rel_err %.1e, %.1e (tol 2.0e-07)", "fast_expf at ln FLT_MIN, ln FLT_MAX", elo,
             ehi);
  test_check(exp_is(nextafterf(LN_MIN, -INFINITY), 0.0f) && exp_is(-100.0f, 0.0f) &&
                 exp_is(-1e30f, 0.0f) && exp_is(-INFINITY, 0.0f),
             "fast_expf below ln FLT_MIN, -100, -1e30, -inf == 0");
  test_check(exp_is(nextafterf(LN_MAX, INFINITY), INFINITY) && exp_is(100.0f, INFINITY) &&
                 exp_is(1e30f, INFINITY) && exp_is(INFINITY, INFINITY),
             "fast_expf above ln FLT_MAX, 100, 1e30, inf == +inf");
  test_check(exp_is(NAN, NAN) && exp_is(-NAN, NAN), "fast_expf(NaN) is NaN");
}

static void check_normal(TestRng *rng) {
  const int64_t n = 1000000;
  float *x = malloc(n * sizeof(float));
  float at;
  // Phi(-12.9) = 2.3e-38 is still a normal float, so the relative error is measured down there.
  test_fill_uniform(rng, x, n, -12.9f, 12.9f);
  // Tail fit error 4e-9; fp32 t = 1 / (1 + 0.3 |x|) rounds twice and the tail's slope in t
  // amplifies that up to 2.7x; the Horner sum and the exp add ~1e-7 each: ~4e-7 at worst.
  double e = max_rel_err(x, n, FN_CDF, &at);
  test_check(e <= 5e-7, "%-48s max rel_err %.3e at x = %g (tol 5.0e-07)",
             "fast_normal_cdf, 1e6 points in [-12.9, 12.9]", e, at);
  // The far left tail alone, where 1 - Phi(|x|) would have lost every digit.
  test_fill_uniform(rng, x, n, -12.9f, -5.0f);
  e = max_rel_err(x, n, FN_CDF, &at);
  test_check(e <= 5e-7, "%-48s max rel_err %.3e at x = %g (tol 5.0e-07)",
             "fast_normal_cdf, 1e6 points in [-12.9, -5]", e, at);
  // exp(-x^2 / 2) with x^2 formed exactly: the exp's ~1e-7 and one rounding of the product.
  test_fill_uniform(rng, x, n, -13.0f, 13.0f);
  e = max_rel_err(x, n, FN_PDF, &at);
  test_check(e <= 3e-7, "%-48s max rel_err %.3e at x = %g (tol 3.0e-07)",
             "fast_normal_pdf, 1e6 points in [-13, 13]", e, at);

  // Named points: Phi(-10) = 7.6e-24, Phi(-5) = 2.9e-7, Phi(-1); same budget as above.
  const float named[3] = {-10.0f, -5.0f, -1.0f};
  double worst = 0.0;
  for (int i = 0; i < 3; i++) {
    double r = fabs(fast_normal_cdf(named[i]) / ref_cdf(named[i]) - 1);
    worst = r > worst ? r : worst;
  }
  test_check(worst <= 5e-7, "%-48s max rel_err %.3e (tol 5.0e-07)",
             "fast_normal_cdf at x = -10, -5, -1", worst);

  // Phi(x) for x > 0 is 1 - Phi(-x) by construction: bitwise, in the vector code.
  test_fill_uniform(rng, x, n, 0.0f, 13.0f);
  float *pos = malloc(n * sizeof(float)), *neg = malloc(n * sizeof(float));
  for (int64_t i = 0; i < n; i++) pos[i] = fast_normal_cdf(x[i]);
  for (int64_t i = 0; i < n; i++) neg[i] = 1.0f - fast_normal_cdf(-x[i]);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += x[i] > 0.0f && pos[i] != neg[i];
  test_check(differ == 0, "%-48s %lld of 1e6 differ", "Phi(x) == 1 - Phi(-x) for x > 0",
             (long long)differ);
  free(pos);
  free(neg);
  free(x);
}

static void check_normal_edges(void) {
  // Past |x| = 13.5 the density is below FLT_MIN: Phi saturates at 0 and 1, phi at 0.
  float v[8] = {INFINITY, -INFINITY, 20.0f, -20.0f, 100.0f, -100.0f, NAN, 0.0f};
  float cdf[8], pdf[8];
  for (int i = 0; i < 8; i++) cdf[i] = fast_normal_cdf(v[i]);
  for (int i = 0; i < 8; i++) pdf[i] = fast_normal_pdf(v[i]);
  test_check(cdf[0] == 1.0f && cdf[1] == 0.0f && cdf[2] == 1.0f && cdf[3] == 0.0f &&
                 cdf[4] == 1.0f && cdf[5] == 0.0f,
             "Phi(inf, 20, 100) == 1, Phi(-inf, -20, -100) == 0");
  test_check(pdf[0] == 0.0f && pdf[1] == 0.0f && pdf[2] == 0.0f && pdf[5] == 0.0f,
             "phi(+-inf, 20, -100) == 0");
  test_check(isnan(cdf[6]) && isnan(pdf[6]), "Phi(NaN), phi(NaN) are NaN");
  double e0 = fmax(fabs(cdf[7] - 0.5) / 0.5, fabs(pdf[7] * SQRT_2PI - 1.0));
  test_check(e0 <= 3e-7, "%-48s rel_err %.3e (tol 3.0e-07)", "Phi(0) = 1/2, phi(0) = 1/sqrt(2 pi)",
             e0);
}

int main(void) {
  TestRng rng = {.state = 0xfa57u};
  check_exp_range(&rng);
  check_exp_edges();
  check_normal(&rng);
  check_normal_edges();
  return test_finish();
}
