// test_attention.c: kernels/cpu/attention.c against window attention written as explicit loops
// in double (forward and backward), against finite differences of its own forward for qkv and
// the bias table, and for forward results and gradients that do not depend on the thread count.
// Covers unshifted windows, shifted windows with a mask of nW > 1 windows used by BW = B * nW
// stacked windows, a rectangular window, a window equal to a 7x7 map, and the scale 1 of Swin
// V2 (whose q carries its own scale) beside V1's head_dim^-0.5.
#include <omp.h>

#include "kernels/attention.h"
#include "kernels/window.h"
#include "tests/util/test_util.h"

// ---- the case under test ------------------------------------------------------------------
typedef struct {
  const char *what;
  int B, H, W, wh, ww, sh, sw, C, heads;
  float scale;  // of q k^T; 0: attention_head_dim_scale(C / heads), Swin V1's
} AttnShape;

typedef struct {
  int BW, nW, N, C, heads, table_rows;
  float scale;
  float *qkv;        // (BW, N, 3C)
  float *table;      // (table_rows, heads)
  float *mask;       // (nW, N, N) or NULL
  float *R;          // (BW, N, C), the objective's weights (dout)
  int *index;        // (N, N)
  float *out, *att;  // (BW, N, C), (BW, heads, N, N)
} AttnCase;

static AttnCase attn_case_make(TestRng *rng, const AttnShape *s) {
  AttnCase c = {.N = s->wh * s->ww, .C = s->C, .heads = s->heads};
  float v1_scale = attention_head_dim_scale(s->C / s->heads);
  c.scale = s->scale > 0 ? s->scale : v1_scale;
  c.nW = (s->H / s->wh) * (s->W / s->ww);
  c.BW = s->B * c.nW;
  c.table_rows = (2 * s->wh - 1) * (2 * s->ww - 1);
  int64_t nqkv = (int64_t)c.BW * c.N * 3 * c.C, nout = (int64_t)c.BW * c.N * c.C;
  c.qkv = malloc(nqkv * sizeof(float));
  c.table = malloc((size_t)c.table_rows * c.heads * sizeof(float));
  c.R = malloc(nout * sizeof(float));
  c.out = malloc(nout * sizeof(float));
  c.att = malloc((size_t)c.BW * c.heads * c.N * c.N * sizeof(float));
  c.index = malloc((size_t)c.N * c.N * sizeof(int));
  // Scores of a few units so that the softmax is neither flat nor one-hot: q and k of 1.5 at
  // V1's scale, smaller by sqrt(v1_scale / scale) at another.
  float amp = 1.5f * sqrtf(v1_scale / c.scale);
  test_fill_uniform(rng, c.qkv, nqkv, -amp, amp);
  test_fill_uniform(rng, c.table, (int64_t)c.table_rows * c.heads, -1.0f, 1.0f);
  test_fill_uniform(rng, c.R, nout, -1.0f, 1.0f);
  relative_position_index(c.index, s->wh, s->ww);
  c.mask = NULL;
  if (s->sh || s->sw) {
    c.mask = malloc((size_t)c.nW * c.N * c.N * sizeof(float));
    attention_mask_build(c.mask, s->H, s->W, s->wh, s->ww, s->sh, s->sw);
  }
  return c;
}

static void attn_case_free(AttnCase *c) {
  free(c->qkv);
  free(c->table);
  free(c->R);
  free(c->out);
  free(c->att);
  free(c->index);
  free(c->mask);
}

static void attn_forward(AttnCase *c) {
  window_attention_forward_cpu(c->out, c->att, c->qkv, c->table, c->index, c->mask, c->BW, c->nW,
                               c->N, c->C, c->heads, c->scale);
}

// The finite-difference objective: L = sum(out * R) in double for a fixed random R, so
// dL/dout = R.
static double attn_objective(void *ctx) {
  AttnCase *c = ctx;
  attn_forward(c);
  double L = 0.0;
  for (int64_t i = 0; i < (int64_t)c->BW * c->N * c->C; i++) L += (double)c->out[i] * c->R[i];
  return L;
}

// ---- double-precision reference -----------------------------------------------------------
// Forward and backward of every (window, head) as plain loops, dout = R. Outputs rounded to
// fp32 at the end: out, att, dqkv, dtable (dtable summed from zero).
static void attn_reference(const AttnCase *c, float *out, float *att, float *dqkv, float *dtable) {
  int N = c->N, C = c->C, heads = c->heads, hd = C / heads;
  double scale = c->scale;
  double *P = malloc((size_t)N * N * sizeof(double)), *dS = malloc((size_t)N * N * sizeof(double));
  double *dt = calloc((size_t)c->table_rows * heads, sizeof(double));
  for (int b = 0; b < c->BW; b++) {
    const float *x = c->qkv + (int64_t)b * N * 3 * C;
    for (int h = 0; h < heads; h++) {
#define Q(i, d) ((double)x[3 * C * (i) + h * hd + (d)])
#define K(i, d) ((double)x[3 * C * (i) + C + h * hd + (d)])
#define V(i, d) ((double)x[3 * C * (i) + 2 * C + h * hd + (d)])
#define DOUT(i, d) ((double)c->R[((int64_t)b * N + (i)) * C + h * hd + (d)])
      for (int i = 0; i < N; i++) {
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < N; j++) {
          double s = 0.0;
          for (int d = 0; d < hd; d++) s += Q(i, d) * scale * K(j, d);
          s += c->table[c->index[i * N + j] * heads + h];
          if (c->mask) s += c->mask[((int64_t)(b % c->nW) * N + i) * N + j];
          P[i * N + j] = s;
          mx = fmax(mx, s);
        }
        for (int j = 0; j < N; j++) sum += exp(P[i * N + j] - mx);
        for (int j = 0; j < N; j++) P[i * N + j] = exp(P[i * N + j] - mx) / sum;
        for (int j = 0; j < N; j++)
          att[(((int64_t)b * heads + h) * N + i) * N + j] = (float)P[i * N + j];
        for (int d = 0; d < hd; d++) {
          double o = 0.0;
          for (int j = 0; j < N; j++) o += P[i * N + j] * V(j, d);
          out[((int64_t)b * N + i) * C + h * hd + d] = (float)o;
        }
      }
      for (int i = 0; i < N; i++) {
        double rowsum = 0.0;
        for (int j = 0; j < N; j++) {
          double dp = 0.0;
          for (int d = 0; d < hd; d++) dp += DOUT(i, d) * V(j, d);
          dS[i * N + j] = dp;
          rowsum += P[i * N + j] * dp;
        }
        for (int j = 0; j < N; j++) {
          dS[i * N + j] = P[i * N + j] * (dS[i * N + j] - rowsum);
          dt[c->index[i * N + j] * heads + h] += dS[i * N + j];
        }
      }
      for (int i = 0; i < N; i++) {
        float *row = dqkv + ((int64_t)b * N + i) * 3 * C + h * hd;
        for (int d = 0; d < hd; d++) {
          double dq = 0.0, dk = 0.0, dv = 0.0;
          for (int j = 0; j < N; j++) {
            dq += dS[i * N + j] * K(j, d) * scale;
            dk += dS[j * N + i] * Q(j, d) * scale;
            dv += P[j * N + i] * DOUT(j, d);
          }
          row[d] = (float)dq;
          row[C + d] = (float)dk;
          row[2 * C + d] = (float)dv;
        }
      }
#undef Q
#undef K
#undef V
#undef DOUT
    }
  }
  for (int64_t t = 0; t < (int64_t)c->table_rows * heads; t++) dtable[t] = (float)dt[t];
  free(P);
  free(dS);
  free(dt);
}

// ---- checks -------------------------------------------------------------------------------
static void check_shape(TestRng *rng, const AttnShape *s) {
  AttnCase c = attn_case_make(rng, s);
  printf(
      "-- %s: B=%d map %dx%d window %dx%d shift (%d, %d) -> BW=%d nW=%d N=%d C=%d heads=%d "
      "scale %g%s\n",
      s->what, s->B, s->H, s->W, s->wh, s->ww, s->sh, s->sw, c.BW, c.nW, c.N, c.C, c.heads, c.scale,
      c.mask ? " masked" : "");
  int64_t nqkv = (int64_t)c.BW * c.N * 3 * c.C, nout = (int64_t)c.BW * c.N * c.C;
  int64_t natt = (int64_t)c.BW * c.heads * c.N * c.N, ntab = (int64_t)c.table_rows * c.heads;
  float *want_out = malloc(nout * sizeof(float)), *want_att = malloc(natt * sizeof(float));
  float *want_dqkv = malloc(nqkv * sizeof(float)), *want_dtable = malloc(ntab * sizeof(float));
  float *dqkv = malloc(nqkv * sizeof(float)), *dtable = calloc(ntab, sizeof(float));
  attn_reference(&c, want_out, want_att, want_dqkv, want_dtable);

  test_poison(c.out, nout);
  test_poison(c.att, natt);
  attn_forward(&c);
  // fp32 scores, exp and sums of N <= 49 terms of size O(1): a few 1e-7 relative.
  test_close("forward out vs double loops", c.out, want_out, nout, 1e-6);
  test_close("forward att (softmax) vs double loops", c.att, want_att, natt, 1e-6);

  test_poison(dqkv, nqkv);
  window_attention_backward_cpu(dqkv, dtable, c.R, c.qkv, c.att, c.index, c.BW, c.N, c.C, c.heads,
                                c.scale);
  // Backward sums of products of fp32 P, dP (both ~1e-7 relative); dS = P (dP - rowsum)
  // cancels a little: 5e-6.
  test_close("backward dqkv vs double loops", dqkv, want_dqkv, nqkv, 5e-6);
  test_close("backward dtable vs double loops", dtable, want_dtable, ntab, 5e-6);

  // dtable accumulates: a second call on top of known values adds the same sums.
  float *acc = malloc(ntab * sizeof(float)), *want_acc = malloc(ntab * sizeof(float));
  test_fill_uniform(rng, acc, ntab, -1.0f, 1.0f);
  for (int64_t t = 0; t < ntab; t++) want_acc[t] = acc[t] + dtable[t];
  window_attention_backward_cpu(dqkv, acc, c.R, c.qkv, c.att, c.index, c.BW, c.N, c.C, c.heads,
                                c.scale);
  test_close("backward dtable accumulates (+=)", acc, want_acc, ntab, 1e-7);

  // Scores are O(1) and the softmax is smooth there, so h = 1e-2 keeps the O(h^2) truncation
  // near 1e-5 relative; fp32 rounding of L over 2h stays below that: 1e-3 is well above both.
  const float h = 1e-2f;
  double e;
  e = test_fd_directional(attn_objective, &c, c.qkv, dqkv, nqkv, h, rng);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", "finite diff <dqkv, V>", e);
  e = test_fd_directional(attn_objective, &c, c.table, dtable, ntab, h, rng);
  test_check(e <= 1e-3, "%-48s rel_err %.3e (tol 1.0e-03)", "finite diff <dtable, V>", e);
  // One element moves one window's output (table: one head of all windows): same budget.
  e = test_fd_elements(attn_objective, &c, c.qkv, dqkv, nqkv, h, 8, rng);
  test_check(e <= 1e-3, "%-48s max_err %.3e (tol 1.0e-03)", "finite diff dqkv, 8 elements", e);
  e = test_fd_elements(attn_objective, &c, c.table, dtable, ntab, h, 4, rng);
  test_check(e <= 1e-3, "%-48s max_err %.3e (tol 1.0e-03)", "finite diff dtable, 4 elements", e);

  free(acc);
  free(want_acc);
  free(want_out);
  free(want_att);
  free(want_dqkv);
  free(want_dtable);
  free(dqkv);
  free(dtable);
  attn_case_free(&c);
}

// The bias-table gradient sums over all windows: it must be bitwise equal for 1 and 2 threads.
// The forward (softmax rows summed in a vectorized order) must be as well.
static void check_thread_independence(TestRng *rng) {
  AttnShape s = {"Swin-T stage 1 windows", 2, 28, 28, 7, 7, 3, 3, 96, 3, 0};
  AttnCase c = attn_case_make(rng, &s);
  int64_t nqkv = (int64_t)c.BW * c.N * 3 * c.C, ntab = (int64_t)c.table_rows * c.heads;
  int64_t nout = (int64_t)c.BW * c.N * c.C, natt = (int64_t)c.BW * c.heads * c.N * c.N;
  float *dqkv[2], *dtable[2];
  float *out1 = malloc(nout * sizeof(float)), *att1 = malloc(natt * sizeof(float));
  omp_set_num_threads(1);
  attn_forward(&c);
  memcpy(out1, c.out, nout * sizeof(float));
  memcpy(att1, c.att, natt * sizeof(float));
  omp_set_num_threads(2);
  test_poison(c.out, nout);
  test_poison(c.att, natt);
  attn_forward(&c);
  test_check(memcmp(out1, c.out, nout * sizeof(float)) == 0 &&
                 memcmp(att1, c.att, natt * sizeof(float)) == 0,
             "forward out, att bitwise equal with 1 and 2 threads (BW=%d)", c.BW);
  free(out1);
  free(att1);
  for (int t = 0; t < 2; t++) {
    omp_set_num_threads(t + 1);
    dqkv[t] = malloc(nqkv * sizeof(float));
    dtable[t] = calloc(ntab, sizeof(float));
    window_attention_backward_cpu(dqkv[t], dtable[t], c.R, c.qkv, c.att, c.index, c.BW, c.N, c.C,
                                  c.heads, c.scale);
  }
  test_check(memcmp(dtable[0], dtable[1], ntab * sizeof(float)) == 0,
             "dtable bitwise equal with 1 and 2 threads (BW=%d)", c.BW);
  test_check(memcmp(dqkv[0], dqkv[1], nqkv * sizeof(float)) == 0,
             "dqkv bitwise equal with 1 and 2 threads (BW=%d)", c.BW);
  for (int t = 0; t < 2; t++) {
    free(dqkv[t]);
    free(dtable[t]);
  }
  attn_case_free(&c);
}

int main(void) {
  TestRng rng = {.state = 0xa77e4u};
  const AttnShape shapes[] = {
      {"unshifted windows", 2, 8, 8, 4, 4, 0, 0, 12, 3, 0},
      {"shifted windows, mask nW=4", 2, 8, 8, 4, 4, 2, 2, 12, 3, 0},
      {"H != W, shifted, mask nW=6", 2, 8, 12, 4, 4, 2, 2, 8, 2, 0},
      {"rectangular window 3x4, shifted", 2, 6, 8, 3, 4, 1, 2, 16, 2, 0},
      {"window = 7x7 map, no shift", 2, 7, 7, 7, 7, 0, 0, 64, 2, 0},
      {"Swin V2's scale 1, shifted, mask nW=4", 2, 8, 8, 4, 4, 2, 2, 16, 2, 1.0f},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&rng, &shapes[i]);
  check_thread_independence(&rng);
  return test_finish();
}
