// test_optim.c: AdamW against a double-precision reference of torch.optim.AdamW's math, the
// warmup + cosine learning-rate schedule at its landmarks, global-norm clipping and the
// thread-count independence of the gradient norm.
#include <omp.h>

#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "tests/util/test_util.h"

// One AdamW step in double, written from the formula in optim/adamw.h.
static void adamw_reference(double *p, const float *grad, double *m, double *v, int64_t n,
                            AdamWHyper h, int64_t step, float grad_scale) {
  double bias1 = 1.0 - pow(h.beta1, (double)step), bias2 = 1.0 - pow(h.beta2, (double)step);
  for (int64_t i = 0; i < n; i++) {
    double g = (double)grad[i] * (double)grad_scale;
    p[i] -= (double)h.lr * (double)h.weight_decay * p[i];
    m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g;
    v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
    p[i] -= ((double)h.lr / bias1) * m[i] / (sqrt(v[i]) / sqrt(bias2) + (double)h.eps);
  }
}

static double rel_err_fd(const float *got, const double *want, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) return INFINITY;
    double d = (double)got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

// Five steps with a fresh gradient each step; params, moments and the total displacement of
// the params are compared with the double reference.
static void test_adamw_steps(const char *label, AdamWHyper h, float grad_scale, TestRng *rng) {
  enum { N = 10007, STEPS = 5 };
  float *p = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
  float *m = malloc(N * sizeof(float)), *v = malloc(N * sizeof(float));
  float *p0 = malloc(N * sizeof(float));
  double *rp = malloc(N * sizeof(double)), *rm = calloc(N, sizeof(double));
  double *rv = calloc(N, sizeof(double)), *rdelta = malloc(N * sizeof(double));
  float *delta = malloc(N * sizeof(float));
  test_fill_uniform(rng, p, N, -2.0f, 2.0f);
  memcpy(p0, p, N * sizeof(float));
  for (int i = 0; i < N; i++) rp[i] = p[i], m[i] = 0, v[i] = 0;  // AdamW state starts at zero
  for (int64_t step = 1; step <= STEPS; step++) {
    test_fill_uniform(rng, g, N, -1.0f, 1.0f);
    adamw_update_cpu(p, g, m, v, N, h, step, grad_scale);
    adamw_reference(rp, g, rm, rv, N, h, step, grad_scale);
  }
  for (int i = 0; i < N; i++) delta[i] = p[i] - p0[i], rdelta[i] = rp[i] - (double)p0[i];
  // float's unit roundoff is 6e-8; each step chains ~10 roundings per element and the error of
  // one step carries into the next, so 5 steps stay well under 1e-6.
  double e = rel_err_fd(p, rp, N);
  test_check(e <= 1e-6, "adamw %-28s param after %d steps rel_err %.3e (tol 1e-6)", label, STEPS,
             e);
  e = rel_err_fd(m, rm, N);
  test_check(e <= 1e-6, "adamw %-28s m after %d steps     rel_err %.3e (tol 1e-6)", label, STEPS,
             e);
  e = rel_err_fd(v, rv, N);
  test_check(e <= 1e-6, "adamw %-28s v after %d steps     rel_err %.3e (tol 1e-6)", label, STEPS,
             e);
  // The displacement (~5 lr) is small next to |p| (~1), so the check on p alone would barely see
  // a wrong update; the displacement itself carries the cancellation of p - p0, one ulp of |p|
  // (1.2e-7) per step against a displacement of ~5e-2: tolerance 1e-4.
  e = rel_err_fd(delta, rdelta, N);
  test_check(e <= 1e-4, "adamw %-28s displacement        rel_err %.3e (tol 1e-4)", label, e);
  free(p), free(g), free(m), free(v), free(p0), free(rp), free(rm), free(rv), free(rdelta);
  free(delta);
}

// Step 1 of Adam: m_hat = g and v_hat = g^2, so the step is lr * g / (|g| + eps), i.e.
// lr * sign(g) to within lr * eps / |g|, after the decay p * (1 - lr * wd).
static void test_adamw_first_step(TestRng *rng) {
  enum { N = 4099 };
  float p[N], g[N], m[N], v[N], want[N];
  AdamWHyper h = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f};
  test_fill_uniform(rng, p, N, -2.0f, 2.0f);
  for (int i = 0; i < N; i++) {
    float mag = test_rng_uniform(rng, 0.1f, 1.0f);  // |g| >= 0.1: eps is negligible
    g[i] = (test_rng_u64(rng) & 1) ? mag : -mag;
    m[i] = 0, v[i] = 0;
    want[i] = p[i] * (1.0f - h.lr * h.weight_decay) - (g[i] > 0 ? h.lr : -h.lr);
  }
  adamw_update_cpu(p, g, m, v, N, h, 1, 1.0f);
  double worst = 0;
  for (int i = 0; i < N; i++) {
    double d = isfinite(p[i]) ? fabs((double)p[i] - (double)want[i]) : INFINITY;
    if (d > worst) worst = d;
  }
  // |p| <= 2: a few ulps (2.4e-7 each) of rounding, far below the step size 1e-2.
  test_check(worst <= 1e-6,
             "adamw first step = p(1 - lr wd) - lr sign(g)   max abs err %.3e (tol 1e-6)", worst);
}

// A late step with nonzero state: checks the bias corrections at t = 100000, where
// beta1^t underflows and beta2^t = 4.5e-44.
static void test_adamw_late_step(TestRng *rng) {
  enum { N = 1000 };
  float p[N], g[N], m[N], v[N];
  double rp[N], rm[N], rv[N];
  AdamWHyper h = {.lr = 5e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f};
  test_fill_uniform(rng, p, N, -1.0f, 1.0f);
  test_fill_uniform(rng, g, N, -1.0f, 1.0f);
  test_fill_uniform(rng, m, N, -0.1f, 0.1f);
  test_fill_uniform(rng, v, N, 1e-3f, 1e-2f);
  for (int i = 0; i < N; i++) rp[i] = p[i], rm[i] = m[i], rv[i] = v[i];
  float p_before[N];
  memcpy(p_before, p, sizeof p);
  adamw_update_cpu(p, g, m, v, N, h, 100000, 1.0f);
  adamw_reference(rp, g, rm, rv, N, h, 100000, 1.0f);
  double num = 0, den = 0;
  for (int i = 0; i < N; i++) {
    double d = ((double)p[i] - p_before[i]) - (rp[i] - p_before[i]);
    num += d * d;
    den += (rp[i] - p_before[i]) * (rp[i] - p_before[i]);
  }
  double e = isfinite(num) ? sqrt(num / den) : INFINITY;
  // Displacement ~5e-4 against one ulp of |p| <= 1 (6e-8): 1e-3 covers the cancellation.
  test_check(e <= 1e-3, "adamw step 100000 displacement                    rel_err %.3e (tol 1e-3)",
             e);
}

static void test_schedule(void) {
  LrSchedule s = {
      .peak = 1e-3, .warmup_lr = 1e-6, .min_lr = 1e-5, .warmup_steps = 100, .total_steps = 1000};
  // The schedule is a few double operations: 1e-12 relative is rounding, anything else a bug.
  struct {
    const char *what;
    int64_t step;
    double want;
  } cases[] = {
      {"step 0 = warmup_lr", 0, 1e-6},
      {"mid-warmup (50) = (warmup_lr + peak) / 2", 50, (1e-6 + 1e-3) / 2},
      {"end of warmup (100) = peak", 100, 1e-3},
      {"middle of cosine (550) = (peak + min) / 2", 550, (1e-3 + 1e-5) / 2},
      {"last step (999)", 999,
       1e-5 + (1e-3 - 1e-5) * (1 + cos(3.14159265358979323846 * 899 / 900)) / 2},
      {"end (1000) = min_lr", 1000, 1e-5},
      {"past the end (5000) = min_lr", 5000, 1e-5},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double got = lr_at_step(&s, cases[i].step);
    double e = fabs(got - cases[i].want) / cases[i].want;
    test_check(e <= 1e-12, "schedule %-42s got %.9e want %.9e", cases[i].what, got, cases[i].want);
  }
  double last = lr_at_step(&s, 999);
  test_check(last > 1e-5 && last < 1e-5 + 1e-4 * (1e-3 - 1e-5),
             "schedule last step is just above min_lr (%.9e)", last);
  int monotone = 1;
  for (int64_t t = 101; t < 1000; t++) monotone &= lr_at_step(&s, t) <= lr_at_step(&s, t - 1);
  test_check(monotone, "schedule decreases from the end of warmup to the end");
  LrSchedule none = {
      .peak = 2e-3, .warmup_lr = 1e-6, .min_lr = 0, .warmup_steps = 0, .total_steps = 10};
  double got = lr_at_step(&none, 0);
  test_check(fabs(got - 2e-3) <= 1e-12 * 2e-3, "schedule warmup_steps 0: step 0 = peak (%.9e)",
             got);
  got = lr_at_step(&none, 5);
  test_check(fabs(got - 1e-3) <= 1e-12 * 1e-3,
             "schedule warmup_steps 0: step 5 of 10 = peak / 2 (%.9e)", got);
}

static void test_clip(TestRng *rng) {
  float g34[2] = {3.0f, 4.0f};
  double norm = sqrt(grad_sum_squares_cpu(g34, 2));
  test_check(norm == 5.0, "clip norm of (3, 4) = 5 (got %.17g)", norm);
  float zero_len = 1.0f;
  test_check(grad_sum_squares_cpu(&zero_len, 0) == 0.0, "clip sum of squares of 0 elements = 0");

  enum { N = 100003 };
  float *g = malloc(N * sizeof(float));
  test_fill_uniform(rng, g, N, -1.0f, 1.0f);
  double want = 0;
  for (int i = 0; i < N; i++) want += (double)g[i] * (double)g[i];
  double got = grad_sum_squares_cpu(g, N);
  // Both sums are in double over 1e5 terms of one sign: the orders differ, so ~1e5 * 1.1e-16.
  double e = fabs(got - want) / want;
  test_check(e <= 1e-10,
             "clip sum of squares vs sequential double sum      rel_err %.3e (tol 1e-10)", e);
  free(g);

  float c = clip_coefficient(10.0, 5.0f);
  float c_want = (float)(5.0 / (10.0 + 1e-6));
  test_check(c == c_want, "clip coefficient norm 10, max 5 = 5 / (10 + 1e-6) (got %.9g)", c);
  c = clip_coefficient(1.0, 5.0f);
  test_check(c == 1.0f, "clip coefficient norm 1, max 5 = 1 (got %.9g)", c);
  c = clip_coefficient(5.0, 5.0f);
  c_want = (float)(5.0 / (5.0 + 1e-6));  // just below 1, as torch scales too
  test_check(c == c_want, "clip coefficient norm = max = 5 / (5 + 1e-6) (got %.9g)", c);
  c = clip_coefficient(1e6, 0.0f);
  test_check(c == 1.0f, "clip coefficient max_norm 0 (off) = 1 (got %.9g)", c);
  c = clip_coefficient(NAN, 5.0f);
  test_check(isnan(c), "clip coefficient of a NaN norm is NaN (got %.9g)", c);
}

// The gradient norm decides the clip coefficient of every step: it must not depend on how many
// threads computed it, or runs with different thread counts diverge.
static void test_sum_squares_determinism(TestRng *rng) {
  const int64_t n = ((int64_t)1 << 20) + 17;
  float *g = malloc((size_t)n * sizeof(float));
  test_fill_uniform(rng, g, n, -3.0f, 3.0f);
  int saved = omp_get_max_threads();
  double sums[3];
  for (int t = 1; t <= 3; t++) {
    omp_set_num_threads(t);
    sums[t - 1] = grad_sum_squares_cpu(g, n);
  }
  omp_set_num_threads(saved);
  test_check(memcmp(&sums[0], &sums[1], sizeof(double)) == 0,
             "clip sum of squares 1 vs 2 threads bitwise equal (%.17g vs %.17g)", sums[0], sums[1]);
  test_check(memcmp(&sums[0], &sums[2], sizeof(double)) == 0,
             "clip sum of squares 1 vs 3 threads bitwise equal (%.17g vs %.17g)", sums[0], sums[2]);
  free(g);
}

int main(void) {
  TestRng rng = {.state = 20240611};
  AdamWHyper base = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0};
  test_adamw_steps("wd 0", base, 1.0f, &rng);
  base.weight_decay = 0.05f;
  test_adamw_steps("wd 0.05", base, 1.0f, &rng);
  // Adam is invariant to the gradient's scale except through eps; a large eps makes a wrong
  // grad_scale visible in the params, not only in m and v.
  AdamWHyper big_eps = base;
  big_eps.eps = 1e-2f;
  test_adamw_steps("wd 0.05 grad_scale 0.25 eps 1e-2", big_eps, 0.25f, &rng);
  test_adamw_steps("wd 0.05 grad_scale 2^-16", base, 1.0f / 65536.0f, &rng);
  test_adamw_first_step(&rng);
  test_adamw_late_step(&rng);
  test_schedule();
  test_clip(&rng);
  test_sum_squares_determinism(&rng);
  return test_finish();
}
