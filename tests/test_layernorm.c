// test_layernorm.c: kernels/cpu/layernorm.c against a double-precision LayerNorm written here,
// against finite differences of its own forward, and for thread-count-independent gradients;
// the res-post-norm residual (postnorm_residual_*) against its composition of LayerNorm, window
// partition / reverse and residual adds, against finite differences, and with aliased arrays.
#include <omp.h>
#include <stdbool.h>

#include "kernels/layernorm.h"
#include "kernels/residual.h"
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

// ---- the res-post-norm residual --------------------------------------------------------------
// One use of the op: the map (B, H, W, C) with square windows, which tensors are in which window
// order (shifted or not), and which optional arrays are given.
typedef enum { MAP_NONE, MAP_PLAIN, MAP_SHIFTED } MapKind;

typedef struct {
  const char *name;
  int B, H, W, C, window, shift;
  bool x_in, scale, xw_out;
  MapKind bmap, omap;  // the branch's order; xw_out's (and, in the backward, dx's)
  bool dres_in;        // the backward's dres_in (dx is given exactly when xw_out is)
} PostCase;

static const PostCase post_cases[] = {
    {"attention unit: branch from shifted windows, x_in, drop path", 2, 8, 12, 48, 4, 2, true, true,
     false, MAP_SHIFTED, MAP_NONE, true},
    {"MLP unit: xw_out into shifted windows, drop path", 2, 8, 12, 48, 4, 2, true, true, true,
     MAP_NONE, MAP_SHIFTED, true},
    {"stage input: no x_in, no scale, xw_out into windows", 3, 8, 8, 37, 4, 2, false, false, true,
     MAP_NONE, MAP_PLAIN, false},
    {"everything mapped: branch and xw_out shifted", 2, 8, 8, 16, 4, 2, true, true, true,
     MAP_SHIFTED, MAP_SHIFTED, true},
};

static float *copy_floats(const float *src, int64_t n) {
  float *x = test_alloc_floats(n);
  memcpy(x, src, sizeof(float) * (size_t)n);
  return x;
}

static WindowMap post_map(const PostCase *k, MapKind m) {
  int s = m == MAP_SHIFTED ? k->shift : 0;
  return (WindowMap){k->H, k->W, k->window, k->window, s, s};
}
static const WindowMap *map_or_null(const WindowMap *m, MapKind k) {
  return k == MAP_NONE ? NULL : m;
}
// tokens (B, H, W, C) <- rows in m's window order (a copy without a map)
static void to_tokens(float *tokens, const float *rows, const PostCase *k, const WindowMap *m) {
  if (m)
    window_reverse_cpu(tokens, rows, k->B, k->H, k->W, k->C, m->wh, m->ww, m->sh, m->sw);
  else
    memcpy(tokens, rows, sizeof(float) * (size_t)k->B * k->H * k->W * k->C);
}
static void to_rows(float *rows, const float *tokens, const PostCase *k, const WindowMap *m) {
  if (m)
    window_partition_cpu(rows, tokens, k->B, k->H, k->W, k->C, m->wh, m->ww, m->sh, m->sw);
  else
    memcpy(rows, tokens, sizeof(float) * (size_t)k->B * k->H * k->W * k->C);
}

// Inputs and outputs of one case, and the finite-difference objective's weights.
typedef struct {
  const PostCase *k;
  int64_t L, rows, n;
  WindowMap bm, om;
  float *x_in, *branch, *scale, *weight, *bias;  // (B,L,C), (B*L,C) in bmap's order, (B), (C)
  float *x_out, *xw_out, *mean, *rstd;
  float *R, *Q;  // dL/dx_out (token order), dL/dxw_out (omap's order)
} Post;

static Post post_make(TestRng *rng, const PostCase *k) {
  Post p = {.k = k, .L = (int64_t)k->H * k->W};
  p.rows = k->B * p.L;
  p.n = p.rows * k->C;
  p.bm = post_map(k, k->bmap);
  p.om = post_map(k, k->omap);
  p.x_in = test_alloc_floats(p.n);
  p.branch = test_alloc_floats(p.n);
  p.R = test_alloc_floats(p.n);
  p.Q = test_alloc_floats(p.n);
  p.x_out = test_alloc_floats(p.n);
  p.xw_out = test_alloc_floats(p.n);
  p.mean = test_alloc_floats(p.rows);
  p.rstd = test_alloc_floats(p.rows);
  p.weight = test_alloc_floats(k->C);
  p.bias = test_alloc_floats(k->C);
  p.scale = test_alloc_floats(k->B);
  test_fill_uniform(rng, p.x_in, p.n, -1.0f, 1.0f);
  // Each branch row around its own offset, so that the mean subtraction matters.
  for (int64_t i = 0; i < p.rows; i++) {
    float offset = test_rng_uniform(rng, -3.0f, 3.0f);
    test_fill_uniform(rng, p.branch + i * k->C, k->C, offset - 1.0f, offset + 1.0f);
  }
  test_fill_uniform(rng, p.weight, k->C, 0.5f, 1.5f);
  test_fill_uniform(rng, p.bias, k->C, -0.5f, 0.5f);
  // Drop path: odd samples dropped (0), even ones kept (1 / keep, keep 0.8).
  for (int b = 0; b < k->B; b++) p.scale[b] = b % 2 ? 0.0f : 1.0f / 0.8f;
  test_fill_uniform(rng, p.R, p.n, -1.0f, 1.0f);
  test_fill_uniform(rng, p.Q, p.n, -1.0f, 1.0f);
  return p;
}

static void post_free(Post *p) {
  float *bufs[] = {p->x_in, p->branch, p->R,      p->Q,    p->x_out, p->xw_out,
                   p->mean, p->rstd,   p->weight, p->bias, p->scale};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static void post_forward(Post *p) {
  const PostCase *k = p->k;
  postnorm_residual_forward_cpu(p->x_out, k->xw_out ? p->xw_out : NULL, p->mean, p->rstd,
                                k->x_in ? p->x_in : NULL, p->branch, map_or_null(&p->bm, k->bmap),
                                k->scale ? p->scale : NULL, p->weight, p->bias,
                                map_or_null(&p->om, k->omap), k->B, p->L, k->C);
}

// L = sum(x_out * R) (+ sum(xw_out * Q) with xw_out), in double: its gradient is the backward
// with dres_in = R and dx = Q in xw_out's order.
static double post_objective(void *ctx) {
  Post *p = ctx;
  post_forward(p);
  double L = 0.0;
  for (int64_t i = 0; i < p->n; i++) L += (double)p->x_out[i] * p->R[i];
  if (p->k->xw_out)
    for (int64_t i = 0; i < p->n; i++) L += (double)p->xw_out[i] * p->Q[i];
  return L;
}

// The backward of case k with dres_in = R (when the case has one) and dx = Q (with xw_out).
// dres_out (n) or NULL, dbranch (n), dweight, dbias (C) accumulated.
static void post_backward(const Post *p, float *dres_out, float *dbranch, float *dweight,
                          float *dbias) {
  const PostCase *k = p->k;
  postnorm_residual_backward_cpu(dres_out, dbranch, dweight, dbias, k->dres_in ? p->R : NULL,
                                 k->xw_out ? p->Q : NULL, map_or_null(&p->om, k->omap), p->branch,
                                 p->weight, p->mean, p->rstd, map_or_null(&p->bm, k->bmap),
                                 k->scale ? p->scale : NULL, k->B, p->L, k->C);
}

// Forward and backward against their composition of the reference pieces: the same row
// functions in the same order, so the results agree to the last bits (1e-6: room for the
// vectorized reductions' order, should a compiler vectorize the two call sites differently).
static void check_postnorm_composition(TestRng *rng, const PostCase *k) {
  Post p = post_make(rng, k);
  const int64_t n = p.n, rows = p.rows;
  const int C = k->C;
  const WindowMap *bm = map_or_null(&p.bm, k->bmap), *om = map_or_null(&p.om, k->omap);
  char what[256];
  test_poison(p.x_out, n);
  test_poison(p.xw_out, n);
  post_forward(&p);

  // Forward: reverse the branch, LayerNorm, residual add (0 + s n without x_in), partition.
  float *branch_tok = test_alloc_floats(n), *ln = test_alloc_floats(n);
  float *x_ref = test_alloc_floats(n), *xw_ref = test_alloc_floats(n);
  float *mean_ref = test_alloc_floats(rows), *rstd_ref = test_alloc_floats(rows);
  to_tokens(branch_tok, p.branch, k, bm);
  layernorm_forward_cpu(ln, mean_ref, rstd_ref, branch_tok, p.weight, p.bias, rows, C);
  const float *scale = k->scale ? p.scale : NULL;
  if (k->x_in)
    residual_forward_cpu(x_ref, p.x_in, ln, scale, k->B, p.L * C);
  else
    residual_backward_cpu(x_ref, ln, scale, k->B, p.L * C);  // s * n
  to_rows(xw_ref, x_ref, k, om);
  snprintf(what, sizeof what, "postnorm forward x_out [%s]", k->name);
  test_close(what, p.x_out, x_ref, n, 1e-6);
  if (k->xw_out) {
    snprintf(what, sizeof what, "postnorm forward xw_out [%s]", k->name);
    test_close(what, p.xw_out, xw_ref, n, 1e-6);
  }
  snprintf(what, sizeof what, "postnorm forward mean, rstd [%s]", k->name);
  test_check(
      test_rel_err(p.mean, mean_ref, rows) <= 1e-6 && test_rel_err(p.rstd, rstd_ref, rows) <= 1e-6,
      "%-48s rel_err %.3e, %.3e (tol 1.0e-06)", what, test_rel_err(p.mean, mean_ref, rows),
      test_rel_err(p.rstd, rstd_ref, rows));

  // Backward: g = dres_in + reverse(dx), u = s g, LayerNorm backward, partition of dbranch.
  float *dres_out = test_alloc_floats(n), *dbranch = test_alloc_floats(n);
  float *dw = test_alloc_floats(C), *db = test_alloc_floats(C);
  float *dw0 = test_alloc_floats(C), *db0 = test_alloc_floats(C);
  test_fill_uniform(rng, dw0, C, -1.0f, 1.0f);
  test_fill_uniform(rng, db0, C, -1.0f, 1.0f);
  memcpy(dw, dw0, sizeof(float) * (size_t)C);
  memcpy(db, db0, sizeof(float) * (size_t)C);
  test_poison(dres_out, n);
  test_poison(dbranch, n);
  post_backward(&p, dres_out, dbranch, dw, db);

  float *g = test_alloc_floats(n), *u = test_alloc_floats(n), *dx_tok = test_alloc_floats(n);
  float *dbr_tok = test_alloc_floats(n), *dbranch_ref = test_alloc_floats(n);
  float *dw_ref = copy_floats(dw0, C), *db_ref = copy_floats(db0, C);
  if (k->xw_out) {
    to_tokens(dx_tok, p.Q, k, om);
    if (k->dres_in)
      residual_forward_cpu(g, p.R, dx_tok, NULL, 1, n);
    else
      memcpy(g, dx_tok, sizeof(float) * (size_t)n);
  } else {
    memcpy(g, p.R, sizeof(float) * (size_t)n);  // every case has dres_in or dx
  }
  residual_backward_cpu(u, g, scale, k->B, p.L * C);
  layernorm_backward_cpu(dbr_tok, dw_ref, db_ref, u, branch_tok, p.weight, p.mean, p.rstd, rows, C);
  to_rows(dbranch_ref, dbr_tok, k, bm);
  snprintf(what, sizeof what, "postnorm backward dres_out [%s]", k->name);
  test_close(what, dres_out, g, n, 1e-6);
  snprintf(what, sizeof what, "postnorm backward dbranch [%s]", k->name);
  test_close(what, dbranch, dbranch_ref, n, 1e-6);
  for (int c = 0; c < C; c++) {  // the increments
    dw[c] -= dw0[c], db[c] -= db0[c];
    dw_ref[c] -= dw0[c], db_ref[c] -= db0[c];
  }
  snprintf(what, sizeof what, "postnorm backward dweight [%s]", k->name);
  test_close(what, dw, dw_ref, C, 1e-6);
  snprintf(what, sizeof what, "postnorm backward dbias [%s]", k->name);
  test_close(what, db, db_ref, C, 1e-6);

  // Aliasing: x_out == x_in and dres_out == dres_in give the same bits as separate arrays.
  if (k->x_in) {
    float *x_sep = copy_floats(p.x_out, n), *x_in0 = copy_floats(p.x_in, n);
    postnorm_residual_forward_cpu(p.x_in, k->xw_out ? p.xw_out : NULL, p.mean, p.rstd, p.x_in,
                                  p.branch, bm, scale, p.weight, p.bias, om, k->B, p.L, C);
    snprintf(what, sizeof what, "postnorm x_out == x_in, bitwise [%s]", k->name);
    test_check(memcmp(p.x_in, x_sep, sizeof(float) * (size_t)n) == 0, "%-48s", what);
    memcpy(p.x_in, x_in0, sizeof(float) * (size_t)n);
    free(x_sep);
    free(x_in0);
  }
  if (k->dres_in) {
    float *alias = copy_floats(p.R, n), *R0 = p.R;
    float *dbr_alias = test_alloc_floats(n), *dw_a = copy_floats(dw0, C);
    float *db_a = copy_floats(db0, C);
    p.R = alias;  // dres_in, overwritten with dres_out
    post_backward(&p, alias, dbr_alias, dw_a, db_a);
    p.R = R0;
    snprintf(what, sizeof what, "postnorm dres_out == dres_in, bitwise [%s]", k->name);
    test_check(memcmp(alias, dres_out, sizeof(float) * (size_t)n) == 0 &&
                   memcmp(dbr_alias, dbranch, sizeof(float) * (size_t)n) == 0,
               "%-48s", what);
    free(alias);
    free(dbr_alias);
    free(dw_a);
    free(db_a);
  }

  float *bufs[] = {branch_tok, ln,      x_ref,       xw_ref, mean_ref, rstd_ref, dres_out,
                   dbranch,    dw,      db,          dw0,    db0,      g,        u,
                   dx_tok,     dbr_tok, dbranch_ref, dw_ref, db_ref};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  post_free(&p);
}

// The backward against finite differences of the forward: L = sum(x_out R) + sum(xw_out Q) has
// the gradients of the backward with dres_in = R and dx = Q (in xw_out's order), so this also
// checks that the backward's x_map undoes the forward's out_map.
static void check_postnorm_finite_differences(TestRng *rng, const PostCase *k) {
  Post p = post_make(rng, k);
  const int64_t n = p.n;
  const int C = k->C;
  post_objective(&p);
  float *dres_out = test_alloc_floats(n), *dbranch = test_alloc_floats(n);
  float *dw = calloc(C, sizeof(float)), *db = calloc(C, sizeof(float));
  test_poison(dres_out, n);
  test_poison(dbranch, n);
  PostCase full = *k;
  full.dres_in = true;  // L always has the R term
  Post q = p;
  q.k = &full;
  post_backward(&q, dres_out, dbranch, dw, db);
  // As check_finite_differences: h = 1e-2 on O(1) inputs, truncation and fp32 rounding of L
  // both near 1e-5 relative; 1e-3 is an order of magnitude above them.
  const float h = 1e-2f;
  char what[256];
  double e = test_fd_directional(post_objective, &p, p.branch, dbranch, n, h, rng);
  snprintf(what, sizeof what, "postnorm finite diff <dbranch, V> [%s]", k->name);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", what, e);
  e = test_fd_directional(post_objective, &p, p.weight, dw, C, h, rng);
  snprintf(what, sizeof what, "postnorm finite diff <dweight, V> [%s]", k->name);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", what, e);
  e = test_fd_directional(post_objective, &p, p.bias, db, C, h, rng);
  snprintf(what, sizeof what, "postnorm finite diff <dbias, V> [%s]", k->name);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", what, e);
  e = test_fd_elements(post_objective, &p, p.branch, dbranch, n, h, 8, rng);
  snprintf(what, sizeof what, "postnorm finite diff dbranch, 8 elements [%s]", k->name);
  test_check(e <= 1e-3, "%-48s max_err %.3e (tol 1.0e-03)", what, e);
  if (k->x_in) {  // dL/dx_in is g, the dres_out
    e = test_fd_directional(post_objective, &p, p.x_in, dres_out, n, h, rng);
    snprintf(what, sizeof what, "postnorm finite diff <dx_in = dres_out, V> [%s]", k->name);
    test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", what, e);
  }
  free(dres_out);
  free(dbranch);
  free(dw);
  free(db);
  post_free(&p);
}

// The parameter gradients are bitwise the same with 1 and 2 threads.
static void check_postnorm_threads(TestRng *rng) {
  const PostCase k = {"threads", 3,    20,   20,          96,          4,   2,
                      true,      true, true, MAP_SHIFTED, MAP_SHIFTED, true};
  Post p = post_make(rng, &k);
  post_forward(&p);
  float *dbr[2], *dw[2], *db[2];
  for (int t = 0; t < 2; t++) {
    omp_set_num_threads(t + 1);
    dbr[t] = test_alloc_floats(p.n);
    dw[t] = calloc(k.C, sizeof(float));
    db[t] = calloc(k.C, sizeof(float));
    post_backward(&p, NULL, dbr[t], dw[t], db[t]);
  }
  test_check(memcmp(dw[0], dw[1], sizeof(float) * k.C) == 0 &&
                 memcmp(db[0], db[1], sizeof(float) * k.C) == 0 &&
                 memcmp(dbr[0], dbr[1], sizeof(float) * (size_t)p.n) == 0,
             "postnorm dweight, dbias, dbranch bitwise equal with 1 and 2 threads (%lld rows)",
             (long long)p.rows);
  for (int t = 0; t < 2; t++) {
    free(dbr[t]);
    free(dw[t]);
    free(db[t]);
  }
  post_free(&p);
}

int main(void) {
  TestRng rng = {.state = 0x1a7e5u};
  check_against_double(&rng, 50, 96);
  check_against_double(&rng, 13, 37);  // C not a multiple of the vector width
  check_against_double(&rng, 200, 768);
  check_finite_differences(&rng, 12, 48);
  check_thread_independence(&rng);
  for (size_t i = 0; i < sizeof post_cases / sizeof post_cases[0]; i++) {
    check_postnorm_composition(&rng, &post_cases[i]);
    check_postnorm_finite_differences(&rng, &post_cases[i]);
  }
  check_postnorm_threads(&rng);
  return test_finish();
}
