// layernorm.c: CPU reference of LayerNorm over the last dimension, the fused residual +
// LayerNorm composed of its pieces, and the res-post-norm residual (kernels/layernorm.h).
//
// Row statistics are reduced in double and stored as fp32 mean and rstd, so the forward and
// the backward see the same normalized values. The parameter gradients are sums over all rows:
// rows are cut into a fixed number of chunks (independent of the thread count), each chunk sums
// into its own double buffer, and the buffers are added in chunk order, so dweight and dbias are
// bitwise the same whatever OpenMP does.
#include "kernels/layernorm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/residual.h"
#include "src/base/util.h"

// Upper bound on the row chunks of the backward; fixed so that results never depend on threads.
#define LAYERNORM_GRAD_CHUNKS 64

// mean and rstd of one row of C values: reduced in double, stored as fp32.
static void layernorm_row_stats(const float *x, int C, float *mean, float *rstd) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; c++) sum += x[c];
  double m = sum / C;
  // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
  double sq = 0.0;
#pragma omp simd reduction(+ : sq)
  for (int c = 0; c < C; c++) {
    double d = (double)x[c] - m;
    sq += d * d;
  }
  *mean = (float)m;
  *rstd = (float)(1.0 / sqrt(sq / C + (double)LAYERNORM_EPS));
}

void layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int64_t N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const float *x = inp + n * C;
    float *y = out + n * C;
    float mf, r;
    layernorm_row_stats(x, C, &mf, &r);
    for (int c = 0; c < C; c++) y[c] = (x[c] - mf) * r * weight[c] + bias[c];
    mean[n] = mf;
    rstd[n] = r;
  }
}

// One row of the backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight;
// dw += dy * xhat, db += dy (the row's terms of the parameter gradients, in double).
static void layernorm_row_backward(float *dx, double *dw, double *db, const float *dy,
                                   const float *x, const float *weight, float m, float r, int C) {
  double sum_g = 0.0, sum_gx = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int c = 0; c < C; c++) {
    float xhat = (x[c] - m) * r;
    float g = dy[c] * weight[c];
    sum_g += g;
    sum_gx += (double)g * xhat;
    dw[c] += (double)dy[c] * xhat;
    db[c] += dy[c];
  }
  float mean_g = (float)(sum_g / C), mean_gx = (float)(sum_gx / C);
  for (int c = 0; c < C; c++) {
    float xhat = (x[c] - m) * r;
    float g = dy[c] * weight[c];
    dx[c] = r * (g - mean_g - xhat * mean_gx);
  }
}

// The fixed row chunks of a backward's parameter-gradient sums: rows [k * rows_per_chunk, ...)
// of N for chunk k < chunks.
typedef struct {
  int64_t chunks, rows_per_chunk;
} GradChunks;

static GradChunks grad_chunks(int64_t N) {
  GradChunks g = {N < LAYERNORM_GRAD_CHUNKS ? N : LAYERNORM_GRAD_CHUNKS, 0};
  if (g.chunks > 0) g.rows_per_chunk = (N + g.chunks - 1) / g.chunks;
  return g;
}

// dweight, dbias (each when given) += the chunks' partials (dweight terms, then dbias terms: 2C
// doubles per chunk), added in chunk order, so the sums are the same for any thread count.
static void add_chunk_partials(float *dweight, float *dbias, const double *partial, int64_t chunks,
                               int C) {
  for (int c = 0; c < C; c++) {
    double sw = 0.0, sb = 0.0;
    for (int64_t k = 0; k < chunks; k++) {
      sw += partial[k * 2 * C + c];
      sb += partial[k * 2 * C + C + c];
    }
    if (dweight) dweight[c] += (float)sw;
    if (dbias) dbias[c] += (float)sb;
  }
}

// dweight += sum over rows of dout * xhat, dbias += sum over rows of dout.
void layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int64_t N, int C) {
  GradChunks gc = grad_chunks(N);
  if (gc.chunks == 0) return;
  // Per chunk: dweight partial (C) then dbias partial (C).
  double *partial = malloc_check((size_t)gc.chunks * 2 * (size_t)C * sizeof(double));

#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < gc.chunks; k++) {
    double *dw = partial + k * 2 * C, *db = dw + C;
    for (int c = 0; c < C; c++) dw[c] = db[c] = 0.0;
    int64_t n_end = (k + 1) * gc.rows_per_chunk < N ? (k + 1) * gc.rows_per_chunk : N;
    for (int64_t n = k * gc.rows_per_chunk; n < n_end; n++)
      layernorm_row_backward(dinp + n * C, dw, db, dout + n * C, inp + n * C, weight, mean[n],
                             rstd[n], C);
  }
  add_chunk_partials(dweight, dbias, partial, gc.chunks, C);
  free(partial);
}

// ---------------------------------------------------------------------------------------------
// The fused residual + LayerNorm, composed of the reference pieces.

static void window_gather(float *out, const float *windows, const WindowMap *m, int B, int C) {
  window_reverse_cpu(out, windows, B, m->H, m->W, C, m->wh, m->ww, m->sh, m->sw);
}
static void window_scatter(float *windows, const float *tokens, const WindowMap *m, int B, int C) {
  window_partition_cpu(windows, tokens, B, m->H, m->W, C, m->wh, m->ww, m->sh, m->sw);
}

void residual_layernorm_forward_cpu(float *x_out, float *ln_out, float *mean, float *rstd,
                                    const float *x_in, const float *branch,
                                    const WindowMap *branch_map, const float *scale,
                                    const float *weight, const float *bias, const WindowMap *ln_map,
                                    int B, int64_t L, int C, float *scratch) {
  int64_t n = (int64_t)B * L;
  const float *x = x_in;
  if (branch) {
    if (branch_map) {
      window_gather(scratch, branch, branch_map, B, C);
      branch = scratch;
    }
    residual_forward_cpu(x_out, x_in, branch, scale, B, L * C);
    x = x_out;
  }
  if (!ln_out) return;
  float *y = ln_map ? scratch : ln_out;
  layernorm_forward_cpu(y, mean, rstd, x, weight, bias, n, C);
  if (ln_map) window_scatter(ln_out, y, ln_map, B, C);
}

void residual_layernorm_backward_cpu(float *dres_out, float *dbranch, float *dweight, float *dbias,
                                     const float *dres_in, const float *dln, const float *x,
                                     const float *weight, const float *mean, const float *rstd,
                                     const WindowMap *branch_map, const float *scale,
                                     const WindowMap *ln_map, int B, int64_t L, int C,
                                     float *scratch) {
  int64_t n = (int64_t)B * L, count = n * C;
  float *a = scratch, *g = scratch + count;
  // g = dres_in + LN_backward(dln), in token order.
  if (dln) {
    if (ln_map) {
      window_gather(a, dln, ln_map, B, C);
      dln = a;
    }
    layernorm_backward_cpu(g, dweight, dbias, dln, x, weight, mean, rstd, n, C);
    if (dres_in) residual_forward_cpu(g, dres_in, g, NULL, 1, count);
  } else if (dres_in) {
    memcpy(g, dres_in, sizeof(float) * (size_t)count);
  } else {
    memset(g, 0, sizeof(float) * (size_t)count);
  }
  if (dres_out) memcpy(dres_out, g, sizeof(float) * (size_t)count);
  if (!dbranch) return;
  if (branch_map) {
    residual_backward_cpu(a, g, scale, B, L * C);
    window_scatter(dbranch, a, branch_map, B, C);
  } else {
    residual_backward_cpu(dbranch, g, scale, B, L * C);
  }
}

// ---------------------------------------------------------------------------------------------
// The res-post-norm residual, row by row: the same row functions as layernorm_forward_cpu and
// layernorm_backward_cpu (and the same row chunks for the parameter gradients), with the window
// maps applied through window_row on each row's address, so the results are those of the
// composition window reverse -> LayerNorm -> residual add -> window partition.

// Row of token t (L tokens per image) in map m's window order; t itself without a map.
static int64_t token_row(const WindowMap *m, int64_t t, int64_t L) {
  if (!m) return t;
  int64_t b = t / L, yx = t - b * L;
  return window_row(m, b, (int)(yx / m->W), (int)(yx % m->W));
}

void postnorm_residual_forward_cpu(float *x_out, float *xw_out, float *mean, float *rstd,
                                   const float *x_in, const float *branch,
                                   const WindowMap *branch_map, const float *scale,
                                   const float *weight, const float *bias, const WindowMap *out_map,
                                   int B, int64_t L, int C) {
  const int64_t N = (int64_t)B * L;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; t++) {
    const float *x = branch + token_row(branch_map, t, L) * C;
    const float *res = x_in ? x_in + t * C : NULL;
    float *y = x_out + t * C;
    float *yw = xw_out ? xw_out + token_row(out_map, t, L) * C : NULL;
    const float s = scale ? scale[t / L] : 1.0f;
    float m, r;
    layernorm_row_stats(x, C, &m, &r);
    for (int c = 0; c < C; c++) {
      float n = (x[c] - m) * r * weight[c] + bias[c];
      float v = res ? res[c] + s * n : s * n;  // res may be y itself: read before written
      y[c] = v;
      if (yw) yw[c] = v;
    }
    mean[t] = m;
    rstd[t] = r;
  }
}

void postnorm_residual_backward_cpu(float *dres_out, float *dbranch, float *dweight, float *dbias,
                                    const float *dres_in, const float *dx, const WindowMap *x_map,
                                    const float *branch, const float *weight, const float *mean,
                                    const float *rstd, const WindowMap *branch_map,
                                    const float *scale, int B, int64_t L, int C) {
  const int64_t N = (int64_t)B * L;
  GradChunks gc = grad_chunks(N);
  if (gc.chunks == 0) return;
  // Per chunk: dweight and dbias partials (2C doubles), and after all of them one row of u (C
  // floats) per chunk, the LayerNorm's output gradient of the row at hand.
  double *partial =
      malloc_check((size_t)gc.chunks * (2 * sizeof(double) + sizeof(float)) * (size_t)C);
  float *u_rows = (float *)(partial + gc.chunks * 2 * C);

#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < gc.chunks; k++) {
    double *dw = partial + k * 2 * C, *db = dw + C;
    float *u = u_rows + k * C;
    for (int c = 0; c < C; c++) dw[c] = db[c] = 0.0;
    int64_t t_end = (k + 1) * gc.rows_per_chunk < N ? (k + 1) * gc.rows_per_chunk : N;
    for (int64_t t = k * gc.rows_per_chunk; t < t_end; t++) {
      const float *res = dres_in ? dres_in + t * C : NULL;
      const float *d = dx ? dx + token_row(x_map, t, L) * C : NULL;
      float *g_out = dres_out ? dres_out + t * C : NULL;
      const float s = scale ? scale[t / L] : 1.0f;
      for (int c = 0; c < C; c++) {
        float g = res && d ? res[c] + d[c] : res ? res[c] : d ? d[c] : 0.0f;
        if (g_out) g_out[c] = g;  // may be res itself: read before written
        u[c] = s * g;
      }
      const int64_t row = token_row(branch_map, t, L);
      layernorm_row_backward(dbranch + row * C, dw, db, u, branch + row * C, weight, mean[t],
                             rstd[t], C);
    }
  }
  add_chunk_partials(dweight, dbias, partial, gc.chunks, C);
  free(partial);
}
