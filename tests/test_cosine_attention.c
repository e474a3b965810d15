// test_cosine_attention.c: kernels/cpu/cosine_attention.c, Swin V2's scaled-cosine q, k and
// continuous position bias, against timm's formulas written out in double
// (swin_transformer_v2.py WindowAttention.forward and _make_pair_wise_relative_positions):
//   - the forward's q', k', v' and norms against the double transcription, with and without the
//     q/v bias, one head's logit scale above ln 100 (clamped), and (q' . k') against timm's
//     normalize(q) . normalize(k) times the clamped logit scale;
//   - the backward of a random linear functional L = sum(R * output) against central differences
//     of the double transcription, element by element, for qkv, q_bias, v_bias, logit_scale; the
//     clamped head gets exactly no logit-scale gradient; a zero q (|q| < eps) takes
//     F.normalize's dy / eps; the gradients accumulate;
//   - the coordinates of a 2x3 window, of it with a pretrained window of 3x5, of a side of 1
//     with a pretrained side, against values worked out by hand, and the refused divisors of 0;
//   - the CPB's table and hidden layer against the double MLP, and dw1, db1, dw2 through the
//     table against central differences of it;
//   - the same bits with 1 and 2 threads.
#include <omp.h>

#include "kernels/cosine_attention.h"
#include "tests/util/test_util.h"

// ---- double helpers -----------------------------------------------------------------------------

static double *to_double(const float *x, int64_t n) {
  double *d = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

static float *copy_of(const float *x, int64_t n) {
  float *c = test_alloc_floats(n);
  memcpy(c, x, sizeof(float) * (size_t)n);
  return c;
}

// Normwise ||got - want|| / ||want|| of an f32 result against a double one; with init, got's
// increment over init.
static int check_grad(const char *what, const float *got, const float *init, const double *want,
                      int64_t n, double tol) {
  double *g = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) g[i] = (double)got[i] - (init ? (double)init[i] : 0.0);
  double e = test_rel_err_d(g, want, n);
  free(g);
  return test_check(e <= tol, "%-56s rel_err %.3e (tol %.1e)", what, e, tol);
}

// Central differences of L over every element of x (n): grad[i] = (L(x + h e_i) - L(x - h e_i))
// / 2h, x restored.
typedef double (*Objective)(void *ctx);
static void central_differences(Objective L, void *ctx, double *x, int64_t n, double h,
                                double *grad) {
  for (int64_t i = 0; i < n; i++) {
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = L(ctx);
    x[i] = x0 - h;
    double lm = L(ctx);
    x[i] = x0;
    grad[i] = (lp - lm) / (2 * h);
  }
}

// ---- scaled cosine q, k: timm in double -------------------------------------------------------

typedef struct {
  int64_t rows;
  int C, heads;
  bool bias;
  // f32 inputs of the kernel
  float *qkv_in, *q_bias, *v_bias, *logit_scale;  // (rows, 3C), (C), (C), (heads)
  float *R;                                       // (rows, 3C): L = sum R * output
  // the same values in double, perturbed by the finite differences
  double *dqkv_in, *dq_bias, *dv_bias, *dlogit;
} CosineCase;

// timm: q = x_q + q_bias, k = x_k, v = x_v + v_bias; F.normalize(t) = t / max(|t|, eps); q'
// carries exp(clamp(logit_scale, max = ln 100)). out (rows, 3C), norms (rows, 2, heads) or NULL.
static void cosine_reference(const CosineCase *c, double *out, double *norms) {
  int C = c->C, hd = C / c->heads;
  for (int64_t r = 0; r < c->rows; r++) {
    const double *x = c->dqkv_in + r * 3 * C;
    double *o = out + r * 3 * C;
    for (int ch = 0; ch < C; ch++) {
      o[ch] = x[ch] + (c->bias ? c->dq_bias[ch] : 0.0);
      o[C + ch] = x[C + ch];
      o[2 * C + ch] = x[2 * C + ch] + (c->bias ? c->dv_bias[ch] : 0.0);
    }
    for (int h = 0; h < c->heads; h++)
      for (int s = 0; s < 2; s++) {
        double *t = o + s * C + h * hd, n = 0.0;
        for (int d = 0; d < hd; d++) n += t[d] * t[d];
        n = sqrt(n);
        double mul = s == 0 ? exp(fmin(c->dlogit[h], (double)COSINE_LOGIT_MAX)) : 1.0;
        for (int d = 0; d < hd; d++) t[d] = t[d] / fmax(n, (double)COSINE_NORM_EPS) * mul;
        if (norms) norms[(r * 2 + s) * c->heads + h] = n;
      }
  }
}

static double cosine_objective(void *ctx) {
  CosineCase *c = ctx;
  int64_t n = c->rows * 3 * c->C;
  double *out = malloc(sizeof(double) * (size_t)n), L = 0.0;
  cosine_reference(c, out, NULL);
  for (int64_t i = 0; i < n; i++) L += out[i] * c->R[i];
  free(out);
  return L;
}

static CosineCase cosine_case_make(TestRng *rng, int64_t rows, int C, int heads, bool bias) {
  CosineCase c = {.rows = rows, .C = C, .heads = heads, .bias = bias};
  int64_t n = rows * 3 * C;
  c.qkv_in = test_alloc_floats(n);
  c.R = test_alloc_floats(n);
  c.q_bias = test_alloc_floats(C);
  c.v_bias = test_alloc_floats(C);
  c.logit_scale = test_alloc_floats(heads);
  test_fill_uniform(rng, c.qkv_in, n, -1.0f, 1.0f);
  test_fill_uniform(rng, c.R, n, -1.0f, 1.0f);
  test_fill_uniform(rng, c.q_bias, C, -0.5f, 0.5f);
  test_fill_uniform(rng, c.v_bias, C, -0.5f, 0.5f);
  // Around timm's init ln 10, and the last head above the clamp at ln 100: exp(5) would be 148.
  test_fill_uniform(rng, c.logit_scale, heads, 1.5f, 3.5f);
  c.logit_scale[heads - 1] = 5.0f;
  c.dqkv_in = to_double(c.qkv_in, n);
  c.dq_bias = to_double(c.q_bias, C);
  c.dv_bias = to_double(c.v_bias, C);
  c.dlogit = to_double(c.logit_scale, heads);
  return c;
}

static void cosine_case_free(CosineCase *c) {
  void *p[] = {c->qkv_in,  c->R,       c->q_bias,  c->v_bias, c->logit_scale,
               c->dqkv_in, c->dq_bias, c->dv_bias, c->dlogit};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

// The kernel's forward on a copy of the case's qkv: qkv (rows, 3C), norms (rows, 2, heads).
static void cosine_forward(const CosineCase *c, float *qkv, float *norms) {
  memcpy(qkv, c->qkv_in, sizeof(float) * (size_t)(c->rows * 3 * c->C));
  cosine_qk_forward_cpu(qkv, norms, c->bias ? c->q_bias : NULL, c->bias ? c->v_bias : NULL,
                        c->logit_scale, c->rows, c->C, c->heads);
}

static void check_cosine(TestRng *rng, int64_t rows, int C, int heads, bool bias) {
  printf(
      "-- scaled cosine q, k: rows=%lld C=%d heads=%d (head_dim %d), %s; head %d's logit scale "
      "5 > ln 100\n",
      (long long)rows, C, heads, C / heads, bias ? "q/v bias" : "no bias", heads - 1);
  CosineCase c = cosine_case_make(rng, rows, C, heads, bias);
  int64_t n = rows * 3 * C, nn = rows * 2 * heads;
  int hd = C / heads;
  float *qkv = test_alloc_floats(n), *norms = test_alloc_floats(nn);
  double *want = malloc(sizeof(double) * (size_t)n), *want_norms = malloc(sizeof(double) * nn);
  cosine_reference(&c, want, want_norms);
  test_poison(norms, nn);
  cosine_forward(&c, qkv, norms);
  // f32 adds, a norm and a division per element against double: a few 1e-8.
  check_grad("forward q', k', v' vs timm in double", qkv, NULL, want, n, 1e-6);
  check_grad("forward norms |q|, |k| vs double", norms, NULL, want_norms, nn, 1e-6);

  // q' . k' is timm's normalize(q) . normalize(k) * exp(min(logit_scale, ln 100)): the scores.
  double worst = 0.0;
  for (int64_t r = 0; r < rows; r++)
    for (int h = 0; h < heads; h++) {
      const float *q = qkv + r * 3 * C + h * hd, *k = qkv + ((r + 1) % rows) * 3 * C + C + h * hd;
      const double *x = c.dqkv_in + r * 3 * C + h * hd;
      const double *y = c.dqkv_in + ((r + 1) % rows) * 3 * C + C + h * hd;
      double got = 0, nq = 0, nk = 0, qk = 0;
      for (int d = 0; d < hd; d++) {
        double qd = x[d] + (bias ? c.dq_bias[h * hd + d] : 0.0);
        got += (double)q[d] * k[d];
        nq += qd * qd;
        nk += y[d] * y[d];
        qk += qd * y[d];
      }
      double want_s = qk / (sqrt(nq) * sqrt(nk)) * exp(fmin(c.dlogit[h], log(1.0 / 0.01)));
      worst = fmax(worst, fabs(got - want_s) / 100.0);
    }
  test_check(worst <= 1e-6, "%-56s err %.3e of 100 (tol 1.0e-06)",
             "q' . k' = cos(q, k) * min(exp(logit_scale), 100)", worst);

  // Backward from R: its increments onto random starting values, against central differences
  // of the double transcription (h = 1e-5: truncation ~1e-10 at inputs of O(1), rounding 1e-11).
  float *dqkv = copy_of(c.R, n);
  float *gq0 = test_alloc_floats(C), *gv0 = test_alloc_floats(C), *gl0 = test_alloc_floats(heads);
  test_fill_uniform(rng, gq0, C, -1.0f, 1.0f);
  test_fill_uniform(rng, gv0, C, -1.0f, 1.0f);
  test_fill_uniform(rng, gl0, heads, -1.0f, 1.0f);
  float *gq = copy_of(gq0, C), *gv = copy_of(gv0, C);
  float *gl = copy_of(gl0, heads);
  cosine_qk_backward_cpu(dqkv, bias ? gq : NULL, bias ? gv : NULL, gl, qkv, norms, c.logit_scale,
                         rows, C, heads);
  double *fd = malloc(sizeof(double) * (size_t)n);
  const double h = 1e-5;
  // f32 products of O(1) values recovered from the f32 output: measured ~5e-8.
  central_differences(cosine_objective, &c, c.dqkv_in, n, h, fd);
  check_grad("backward dqkv vs central differences", dqkv, NULL, fd, n, 1e-6);
  if (bias) {
    central_differences(cosine_objective, &c, c.dq_bias, C, h, fd);
    check_grad("backward dq_bias (+=) vs central differences", gq, gq0, fd, C, 1e-6);
    central_differences(cosine_objective, &c, c.dv_bias, C, h, fd);
    check_grad("backward dv_bias (+=) vs central differences", gv, gv0, fd, C, 1e-6);
  }
  central_differences(cosine_objective, &c, c.dlogit, heads, h, fd);
  check_grad("backward dlogit_scale (+=) vs central differences", gl, gl0, fd, heads, 1e-6);
  test_check(fd[heads - 1] == 0.0 && gl[heads - 1] == gl0[heads - 1],
             "%-56s fd %.3e, increment %.3e (want exactly 0)",
             "clamped head: no logit-scale gradient", fd[heads - 1],
             (double)gl[heads - 1] - gl0[heads - 1]);

  // Bits independent of the thread count, forward and backward.
  float *qkv1 = test_alloc_floats(n), *norms1 = test_alloc_floats(nn);
  float *gl1 = copy_of(gl0, heads), *gq1 = copy_of(gq0, C);
  float *gv1 = copy_of(gv0, C), *dqkv1 = copy_of(c.R, n);
  omp_set_num_threads(1);
  cosine_forward(&c, qkv1, norms1);
  cosine_qk_backward_cpu(dqkv1, bias ? gq1 : NULL, bias ? gv1 : NULL, gl1, qkv1, norms1,
                         c.logit_scale, rows, C, heads);
  omp_set_num_threads(2);
  test_check(!memcmp(qkv1, qkv, sizeof(float) * n) && !memcmp(norms1, norms, sizeof(float) * nn) &&
                 !memcmp(dqkv1, dqkv, sizeof(float) * n) &&
                 !memcmp(gl1, gl, sizeof(float) * heads) && !memcmp(gq1, gq, sizeof(float) * C) &&
                 !memcmp(gv1, gv, sizeof(float) * C),
             "forward and backward bitwise equal with 1 and 2 threads");

  void *p[] = {qkv, norms, want, want_norms, dqkv,   gq0, gv0, gl0, gq,
               gv,  gl,    fd,   qkv1,       norms1, gl1, gq1, gv1, dqkv1};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
  cosine_case_free(&c);
}

// A head whose q is 0 (below eps): q' = 0, and F.normalize's gradient there is dy / eps.
static void check_zero_norm(TestRng *rng) {
  const int rows = 2, C = 8, heads = 2, hd = C / heads;
  float qkv[2 * 3 * 8], norms[2 * 2 * 2], dqkv[2 * 3 * 8], ls[2] = {2.0f, 2.5f}, gl[2] = {0, 0};
  test_fill_uniform(rng, qkv, rows * 3 * C, -1.0f, 1.0f);
  for (int d = 0; d < hd; d++) qkv[hd + d] = 0.0f;  // row 0, head 1's q
  cosine_qk_forward_cpu(qkv, norms, NULL, NULL, ls, rows, C, heads);
  bool zero = norms[1] == 0.0f;
  for (int d = 0; d < hd; d++) zero = zero && qkv[hd + d] == 0.0f;
  test_check(zero, "zero q: norm 0 and q' = 0 (no NaN)");
  test_fill_uniform(rng, dqkv, rows * 3 * C, -1.0f, 1.0f);
  float want[4];
  double mul = exp(2.5);
  for (int d = 0; d < hd; d++)
    want[d] = (float)((double)dqkv[hd + d] * (float)mul / (double)COSINE_NORM_EPS);
  cosine_qk_backward_cpu(dqkv, NULL, NULL, gl, qkv, norms, ls, rows, C, heads);
  test_close("zero q: dq = dq' exp(l) / eps", dqkv + hd, want, hd, 1e-6);
}

// ---- coordinates ----------------------------------------------------------------------------

// By hand: timm's t = d / divisor * 8, then sign(t) log2(|t| + 1) / 3.
#define L9 1.0566416671474375  // log2(9) / 3: |t| = 8
#define L5 0.7739760316291208  // log2(5) / 3: |t| = 4
#define L3 0.5283208335737187  // log2(3) / 3: |t| = 2

static void check_coords_case(const char *what, int wh, int ww, int pwh, int pww,
                              const double *per_dh, const double *per_dw) {
  int T = (2 * wh - 1) * (2 * ww - 1);
  float *coords = test_alloc_floats(2 * T), *want = test_alloc_floats(2 * T);
  for (int i = 0; i < 2 * wh - 1; i++)
    for (int j = 0; j < 2 * ww - 1; j++) {
      want[2 * (i * (2 * ww - 1) + j)] = (float)per_dh[i];
      want[2 * (i * (2 * ww - 1) + j) + 1] = (float)per_dw[j];
    }
  int rc = cpb_coords_build(coords, wh, ww, pwh, pww);
  // The f32 log2 and division against the double values rounded: an ulp.
  test_check(rc == 0, "%s: cpb_coords_build returns 0 (got %d)", what, rc);
  if (rc == 0) test_close(what, coords, want, 2 * T, 2e-7);
  free(coords);
  free(want);
}

static void check_coords(void) {
  printf("-- continuous position bias coordinates\n");
  // 2x3: dh / 1 * 8 = -8, 0, 8; dw / 2 * 8 = -8, -4, 0, 4, 8.
  check_coords_case("coords 2x3 window (T=15) vs hand values", 2, 3, 0, 0,
                    (const double[]){-L9, 0, L9}, (const double[]){-L9, -L5, 0, L5, L9});
  // 2x3 with pretrained 3x5: dh / 2 * 8 = -4, 0, 4; dw / 4 * 8 = -4, -2, 0, 2, 4.
  check_coords_case("coords 2x3, pretrained 3x5 vs hand values", 2, 3, 3, 5,
                    (const double[]){-L5, 0, L5}, (const double[]){-L5, -L3, 0, L3, L5});
  // 3x2 with pretrained 5x3: the sides swapped, so the rows run over dh first.
  check_coords_case("coords 3x2, pretrained 5x3 vs hand values", 3, 2, 5, 3,
                    (const double[]){-L5, -L3, 0, L3, L5}, (const double[]){-L5, 0, L5});
  // A side of 1 with a pretrained side: dh = 0 only.
  check_coords_case("coords 1x3, pretrained 2x3 vs hand values", 1, 3, 2, 3, (const double[]){0},
                    (const double[]){-L9, -L5, 0, L5, L9});
  float coords[2 * 3 * 5];
  test_check(cpb_coords_build(coords, 1, 3, 0, 0) == -1,
             "a 1x3 window without a pretrained window is refused (timm divides by 0)");
  test_check(cpb_coords_build(coords, 3, 1, 3, 0) == -1, "a 3x1 window, pretrained 3x0: refused");
  test_check(cpb_coords_build(coords, 2, 3, 1, 5) == -1, "a pretrained side of 1: refused");
}

// ---- the CPB MLP ------------------------------------------------------------------------------

typedef struct {
  int T, heads;
  float *coords, *w1, *b1, *w2, *R;  // (T, 2), (512, 2), (512), (heads, 512), (T, heads)
  double *dw1, *db1, *dw2;           // the weights in double, perturbed by the differences
} CpbCase;

// timm's cpb_mlp in double, then 16 sigmoid: table (T, heads), hidden (T, 512) or NULL.
static void cpb_reference(const CpbCase *c, double *table, double *hidden) {
  double hid[CPB_HIDDEN];
  for (int t = 0; t < c->T; t++) {
    for (int j = 0; j < CPB_HIDDEN; j++) {
      double a =
          c->coords[2 * t] * c->dw1[2 * j] + c->coords[2 * t + 1] * c->dw1[2 * j + 1] + c->db1[j];
      hid[j] = a > 0 ? a : 0;
      if (hidden) hidden[(int64_t)t * CPB_HIDDEN + j] = hid[j];
    }
    for (int h = 0; h < c->heads; h++) {
      double o = 0;
      for (int j = 0; j < CPB_HIDDEN; j++) o += hid[j] * c->dw2[h * CPB_HIDDEN + j];
      table[t * c->heads + h] = 16.0 / (1.0 + exp(-o));
    }
  }
}

static double cpb_objective(void *ctx) {
  CpbCase *c = ctx;
  double *table = malloc(sizeof(double) * (size_t)c->T * c->heads), L = 0;
  cpb_reference(c, table, NULL);
  for (int e = 0; e < c->T * c->heads; e++) L += table[e] * c->R[e];
  free(table);
  return L;
}

static void check_cpb(TestRng *rng, int wh, int ww, int heads) {
  CpbCase c = {.T = (2 * wh - 1) * (2 * ww - 1), .heads = heads};
  int T = c.T, nh = T * CPB_HIDDEN, nt = T * heads, nw2 = heads * CPB_HIDDEN;
  printf("-- CPB MLP: window %dx%d (T=%d), heads %d\n", wh, ww, T, heads);
  c.coords = test_alloc_floats(2 * T);
  if (cpb_coords_build(c.coords, wh, ww, 0, 0) != 0) {
    test_check(0, "setup: coordinates of a %dx%d window", wh, ww);
    return;
  }
  c.w1 = test_alloc_floats(2 * CPB_HIDDEN);
  c.b1 = test_alloc_floats(CPB_HIDDEN);
  c.w2 = test_alloc_floats(nw2);
  c.R = test_alloc_floats(nt);
  // Hidden units of O(1), half of them off; out = hidden w2 of spread ~0.7 over 512 units: the
  // sigmoid neither flat nor saturated.
  test_fill_uniform(rng, c.w1, 2 * CPB_HIDDEN, -1.0f, 1.0f);
  test_fill_uniform(rng, c.b1, CPB_HIDDEN, -0.5f, 0.5f);
  test_fill_uniform(rng, c.w2, nw2, -0.1f, 0.1f);
  test_fill_uniform(rng, c.R, nt, -1.0f, 1.0f);
  c.dw1 = to_double(c.w1, 2 * CPB_HIDDEN);
  c.db1 = to_double(c.b1, CPB_HIDDEN);
  c.dw2 = to_double(c.w2, nw2);

  double *want_table = malloc(sizeof(double) * nt), *want_hidden = malloc(sizeof(double) * nh);
  cpb_reference(&c, want_table, want_hidden);
  float *table = test_alloc_floats(nt), *hidden = test_alloc_floats(nh);
  test_poison(table, nt);
  test_poison(hidden, nh);
  cpb_forward_cpu(table, hidden, c.coords, c.w1, c.b1, c.w2, T, heads);
  // hidden rounded once to f32, then sums of 512 products: a few 1e-8.
  check_grad("forward hidden vs double MLP", hidden, NULL, want_hidden, nh, 1e-6);
  check_grad("forward table = 16 sigmoid(out) vs double MLP", table, NULL, want_table, nt, 1e-6);

  float *g1_0 = test_alloc_floats(2 * CPB_HIDDEN), *gb_0 = test_alloc_floats(CPB_HIDDEN);
  float *g2_0 = test_alloc_floats(nw2);
  test_fill_uniform(rng, g1_0, 2 * CPB_HIDDEN, -1.0f, 1.0f);
  test_fill_uniform(rng, gb_0, CPB_HIDDEN, -1.0f, 1.0f);
  test_fill_uniform(rng, g2_0, nw2, -1.0f, 1.0f);
  float *g1 = copy_of(g1_0, 2 * CPB_HIDDEN), *gb = copy_of(gb_0, CPB_HIDDEN);
  float *g2 = copy_of(g2_0, nw2);
  cpb_backward_cpu(g1, gb, g2, c.R, table, hidden, c.coords, c.w2, T, heads);
  // h = 1e-6: the objective is piecewise smooth (ReLU), and a pre-activation within h of its
  // kink is unlikely (~1e-6 each); truncation ~1e-12, rounding ~1e-10 relative.
  const double h = 1e-6;
  double *fd = malloc(sizeof(double) * (size_t)nw2);
  // From the f32 table and hidden layer: measured ~5e-8.
  central_differences(cpb_objective, &c, c.dw2, nw2, h, fd);
  check_grad("backward dw2 (+=) vs central differences", g2, g2_0, fd, nw2, 1e-6);
  central_differences(cpb_objective, &c, c.dw1, 2 * CPB_HIDDEN, h, fd);
  check_grad("backward dw1 (+=) vs central differences", g1, g1_0, fd, 2 * CPB_HIDDEN, 1e-6);
  central_differences(cpb_objective, &c, c.db1, CPB_HIDDEN, h, fd);
  check_grad("backward db1 (+=) vs central differences", gb, gb_0, fd, CPB_HIDDEN, 1e-6);

  float *t1 = test_alloc_floats(nt), *hid1 = test_alloc_floats(nh);
  float *g1b = copy_of(g1_0, 2 * CPB_HIDDEN), *gbb = copy_of(gb_0, CPB_HIDDEN);
  float *g2b = copy_of(g2_0, nw2);
  omp_set_num_threads(1);
  cpb_forward_cpu(t1, hid1, c.coords, c.w1, c.b1, c.w2, T, heads);
  cpb_backward_cpu(g1b, gbb, g2b, c.R, t1, hid1, c.coords, c.w2, T, heads);
  omp_set_num_threads(2);
  test_check(!memcmp(t1, table, sizeof(float) * nt) && !memcmp(hid1, hidden, sizeof(float) * nh) &&
                 !memcmp(g1b, g1, sizeof(float) * 2 * CPB_HIDDEN) &&
                 !memcmp(gbb, gb, sizeof(float) * CPB_HIDDEN) &&
                 !memcmp(g2b, g2, sizeof(float) * nw2),
             "CPB forward and backward bitwise equal with 1 and 2 threads");

  void *p[] = {c.coords,   c.w1,        c.b1,  c.w2,   c.R,  c.dw1, c.db1, c.dw2,
               want_table, want_hidden, table, hidden, g1_0, gb_0,  g2_0,  g1,
               gb,         g2,          fd,    t1,     hid1, g1b,   gbb,   g2b};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

// Fine-tuning across windows: a window-16 model normalized by its pretrained window 8 gives every
// relative offset the window-8 model has (|dh|, |dw| <= 7) the same coordinates, bit for bit, so
// the same position-bias MLP gives it the same bias; the offsets beyond extrapolate the MLP.
static void check_window_8_to_16(void) {
  float c8[15 * 15 * 2], c16[31 * 31 * 2];
  int rc = cpb_coords_build(c8, 8, 8, 0, 0) | cpb_coords_build(c16, 16, 16, 8, 8);
  int differ = 0, beyond = 0;
  for (int dh = -15; dh <= 15; dh++)
    for (int dw = -15; dw <= 15; dw++) {
      const float *b = c16 + 2 * ((dh + 15) * 31 + (dw + 15));
      if (dh < -7 || dh > 7 || dw < -7 || dw > 7) {
        beyond += fabsf(b[0]) > 1.0f || fabsf(b[1]) > 1.0f;  // past the source's |c| <= 1
        continue;
      }
      const float *a = c8 + 2 * ((dh + 7) * 15 + (dw + 7));
      differ += memcmp(a, b, 2 * sizeof(float)) != 0;
    }
  test_check(rc == 0 && differ == 0 && beyond == 31 * 31 - 15 * 15,
             "window 16 pretrained at 8: the 225 offsets of window 8 have its coordinates bit for "
             "bit (%d differ), the %d others lie beyond them (%d)",
             differ, 31 * 31 - 15 * 15, beyond);
}

int main(void) {
  TestRng rng = {.state = 0xc05e2u};
  omp_set_num_threads(2);
  check_cosine(&rng, 12, 12, 3, true);
  check_cosine(&rng, 9, 16, 2, false);
  check_zero_norm(&rng);
  check_coords();
  check_window_8_to_16();
  check_cpb(&rng, 2, 3, 2);
  check_cpb(&rng, 3, 3, 3);
  return test_finish();
}
