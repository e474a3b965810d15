// test_layernorm.c: kernels/cpu/layernorm.c against a double-precision LayerNorm written here,
// against finite differences of its own forward, and for thread-count-independent gradients.
#include <omp.h>

#include "kernels/layernorm.h"
#include "tests/util/test_util.h"

// ---- the case under test ------------------------------------------------------------------
typedef struct {
  int64_t N;
  int C;
  float *inp, *weight, *bias, *R;  // (N, C), (C), (C), (N, C)
  float *out, *mean, *rstd;        // (N, C), (N), (N)
} LnCase;

static LnCase ln_case_make(TestRng *rng, int64_t N, int C) {
  LnCase c = {.N = N, .C = C};
  c.inp = malloc(N * C * sizeof(float));
  c.R = malloc(N * C * sizeof(float));
  c.out = malloc(N * C * sizeof(float));
  c.weight = malloc(C * sizeof(float));
  c.bias = malloc(C * sizeof(float));
  c.mean = malloc(N * sizeof(float));
  c.rstd = malloc(N * sizeof(float));
  // Each row gets its own offset so that the mean subtraction matters.
  for (int64_t n = 0; n < N; n++) {
    float offset = test_rng_uniform(rng, -3.0f, 3.0f);
    test_fill_uniform(rng, c.inp + n * C, C, offset - 1.0f, offset + 1.0f);
  }
  test_fill_uniform(rng, c.weight, C, 0.5f, 1.5f);
  test_fill_uniform(rng, c.bias, C, -0.5f, 0.5f);
  test_fill_uniform(rng, c.R, N * C, -1.0f, 1.0f);
  return c;
}

static void ln_case_free(LnCase *c) {
  free(c->inp);
  free(c->R);
  free(c->out);
  free(c->weight);
  free(c->bias);
  free(c->mean);
  free(c->rstd);
}

// The finite-difference objective: L = sum(out * R) in double for a fixed random R, so
// dL/dout = R.
static double ln_objective(void *ctx) {
  LnCase *c = ctx;
  layernorm_forward_cpu(c->out, c->mean, c->rstd, c->inp, c->weight, c->bias, c->N, c->C);
  double L = 0.0;
  for (int64_t i = 0; i < c->N * c->C; i++) L += (double)c->out[i] * c->R[i];
  return L;
}

// ---- checks -------------------------------------------------------------------------------
// Forward and backward against the textbook formulas in double.
static void check_against_double(TestRng *rng, int64_t N, int C) {
  LnCase c = ln_case_make(rng, N, C);
  float *want = malloc(N * C * sizeof(float)), *want_mean = malloc(N * sizeof(float));
  float *want_rstd = malloc(N * sizeof(float)), *want_dinp = malloc(N * C * sizeof(float));
  float *dinp = malloc(N * C * sizeof(float));
  float *dweight = calloc(C, sizeof(float)), *dbias = calloc(C, sizeof(float));
  double *dw_ref = calloc(C, sizeof(double)), *db_ref = calloc(C, sizeof(double));
  float *want_dw = malloc(C * sizeof(float)), *want_db = malloc(C * sizeof(float));
  const float *dout = c.R;

  for (int64_t n = 0; n < N; n++) {
    const float *x = c.inp + n * C;
    double m = 0.0, v = 0.0;
    for (int k = 0; k < C; k++) m += x[k];
    m /= C;
    for (int k = 0; k < C; k++) v += (x[k] - m) * (x[k] - m);
    v /= C;
    double r = 1.0 / sqrt(v + 1e-5);
    want_mean[n] = (float)m;
    want_rstd[n] = (float)r;
    double sg = 0.0, sgx = 0.0;
    for (int k = 0; k < C; k++) {
      double xhat = (x[k] - m) * r;
      want[n * C + k] = (float)(xhat * c.weight[k] + c.bias[k]);
      double g = (double)dout[n * C + k] * c.weight[k];
      sg += g;
      sgx += g * xhat;
      dw_ref[k] += (double)dout[n * C + k] * xhat;
      db_ref[k] += dout[n * C + k];
    }
    for (int k = 0; k < C; k++) {
      double xhat = (x[k] - m) * r;
      double g = (double)dout[n * C + k] * c.weight[k];
      want_dinp[n * C + k] = (float)(r * (g - sg / C - xhat * sgx / C));
    }
  }
  for (int k = 0; k < C; k++) {
    want_dw[k] = (float)dw_ref[k];
    want_db[k] = (float)db_ref[k];
  }

  test_poison(c.out, N * C);
  test_poison(c.mean, N);
  test_poison(c.rstd, N);
  layernorm_forward_cpu(c.out, c.mean, c.rstd, c.inp, c.weight, c.bias, N, C);
  // fp32 evaluation of a few operations per element after an exact-in-double reduction:
  // a few ulps (~1e-7 each), so 1e-6 leaves room but catches any formula mistake.
  char name[96];
  snprintf(name, sizeof name, "forward out (N=%lld, C=%d)", (long long)N, C);
  test_close(name, c.out, want, N * C, 1e-6);
  test_close("forward mean", c.mean, want_mean, N, 1e-6);
  test_close("forward rstd", c.rstd, want_rstd, N, 1e-6);

  test_poison(dinp, N * C);
  layernorm_backward_cpu(dinp, dweight, dbias, dout, c.inp, c.weight, c.mean, c.rstd, N, C);
  // The kernel works from fp32 mean/rstd and fp32 xhat; the reference from exact ones. The
  // subtraction g - mean(g) - xhat mean(g xhat) loses a little, so allow 5e-6.
  snprintf(name, sizeof name, "backward dinp (N=%lld, C=%d)", (long long)N, C);
  test_close(name, dinp, want_dinp, N * C, 5e-6);
  test_close("backward dweight", dweight, want_dw, C, 5e-6);
  test_close("backward dbias", dbias, want_db, C, 5e-6);

  // dweight and dbias accumulate: a second call on top of known values adds the same sums.
  float *acc_w = malloc(C * sizeof(float)), *acc_b = malloc(C * sizeof(float));
  float *want_acc_w = malloc(C * sizeof(float)), *want_acc_b = malloc(C * sizeof(float));
  test_fill_uniform(rng, acc_w, C, -1.0f, 1.0f);
  test_fill_uniform(rng, acc_b, C, -1.0f, 1.0f);
  for (int k = 0; k < C; k++) {
    want_acc_w[k] = acc_w[k] + dweight[k];
    want_acc_b[k] = acc_b[k] + dbias[k];
  }
  layernorm_backward_cpu(dinp, acc_w, acc_b, dout, c.inp, c.weight, c.mean, c.rstd, N, C);
  // Same float additions in the same order: exact up to the last bit.
  test_close("backward dweight accumulates (+=)", acc_w, want_acc_w, C, 1e-7);
  test_close("backward dbias accumulates (+=)", acc_b, want_acc_b, C, 1e-7);

  free(acc_w);
  free(acc_b);
  free(want_acc_w);
  free(want_acc_b);
  free(want);
  free(want_mean);
  free(want_rstd);
  free(want_dinp);
  free(dinp);
  free(dweight);
  free(dbias);
  free(dw_ref);
  free(db_ref);
  free(want_dw);
  free(want_db);
  ln_case_free(&c);
}

// Gradients against finite differences of the forward, for the input and both parameters.
static void check_finite_differences(TestRng *rng, int64_t N, int C) {
  LnCase c = ln_case_make(rng, N, C);
  float *dinp = malloc(N * C * sizeof(float));
  float *dweight = calloc(C, sizeof(float)), *dbias = calloc(C, sizeof(float));
  ln_objective(&c);
  test_poison(dinp, N * C);
  layernorm_backward_cpu(dinp, dweight, dbias, c.R, c.inp, c.weight, c.mean, c.rstd, N, C);

  // Inputs are O(1) after centering, so h = 1e-2 keeps the O(h^2) truncation near 1e-5
  // relative, while fp32 rounding of L (~1e-7 |L| per output, partly cancelling) divided by
  // 2h stays below ~1e-5 relative: 1e-3 is an order of magnitude above both.
  const float h = 1e-2f;
  double e;
  e = test_fd_directional(ln_objective, &c, c.inp, dinp, N * C, h, rng);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", "finite diff <dinp, V>", e);
  e = test_fd_directional(ln_objective, &c, c.weight, dweight, C, h, rng);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", "finite diff <dweight, V>", e);
  e = test_fd_directional(ln_objective, &c, c.bias, dbias, C, h, rng);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", "finite diff <dbias, V>", e);
  // Single elements: only one row changes, so rounding is ~1e-7 * sqrt(C) / 2h ~ 1e-5 of the
  // gradient's RMS, truncation as above: 1e-3 relative (to max(|g_i|, rms g)).
  e = test_fd_elements(ln_objective, &c, c.inp, dinp, N * C, h, 8, rng);
  test_check(e <= 1e-3, "%-48s max_err %.3e (tol 1.0e-03)", "finite diff dinp, 8 elements", e);
  e = test_fd_elements(ln_objective, &c, c.weight, dweight, C, h, 4, rng);
  test_check(e <= 1e-3, "%-48s max_err %.3e (tol 1.0e-03)", "finite diff dweight, 4 elements", e);
  e = test_fd_elements(ln_objective, &c, c.bias, dbias, C, h, 4, rng);
  test_check(e <= 1e-3, "%-48s max_err %.3e (tol 1.0e-03)", "finite diff dbias, 4 elements", e);

  free(dinp);
  free(dweight);
  free(dbias);
  ln_case_free(&c);
}

// Parameter gradients are sums over rows: they must be bitwise equal for 1 and 2 threads.
static void check_thread_independence(TestRng *rng) {
  const int64_t N = 3001;
  const int C = 96;
  LnCase c = ln_case_make(rng, N, C);
  float *dinp[2], *dw[2], *db[2];
  ln_objective(&c);
  for (int t = 0; t < 2; t++) {
    omp_set_num_threads(t + 1);
    dinp[t] = malloc(N * C * sizeof(float));
    dw[t] = calloc(C, sizeof(float));
    db[t] = calloc(C, sizeof(float));
    layernorm_backward_cpu(dinp[t], dw[t], db[t], c.R, c.inp, c.weight, c.mean, c.rstd, N, C);
  }
  test_check(memcmp(dw[0], dw[1], C * sizeof(float)) == 0,
             "dweight bitwise equal with 1 and 2 threads (N=%lld)", (long long)N);
  test_check(memcmp(db[0], db[1], C * sizeof(float)) == 0,
             "dbias bitwise equal with 1 and 2 threads (N=%lld)", (long long)N);
  test_check(memcmp(dinp[0], dinp[1], N * C * sizeof(float)) == 0,
             "dinp bitwise equal with 1 and 2 threads (N=%lld)", (long long)N);
  for (int t = 0; t < 2; t++) {
    free(dinp[t]);
    free(dw[t]);
    free(db[t]);
  }
  ln_case_free(&c);
}

int main(void) {
  TestRng rng = {.state = 0x1a7e5u};
  check_against_double(&rng, 50, 96);
  check_against_double(&rng, 13, 37);  // C not a multiple of the vector width
  check_against_double(&rng, 200, 768);
  check_finite_differences(&rng, 12, 48);
  check_thread_independence(&rng);
  return test_finish();
}
