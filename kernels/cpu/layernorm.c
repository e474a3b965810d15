// layernorm.c: CPU reference of LayerNorm over the last dimension (kernels/layernorm.h).
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

void layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int64_t N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; n++) {
    const float *x = inp + n * C;
    float *y = out + n * C;
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
    float mf = (float)m;
    float r = (float)(1.0 / sqrt(sq / C + (double)LAYERNORM_EPS));
    for (int c = 0; c < C; c++) y[c] = (x[c] - mf) * r * weight[c] + bias[c];
    mean[n] = mf;
    rstd[n] = r;
  }
}

// dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight, per row;
// dweight += sum over rows of dout * xhat, dbias += sum over rows of dout.
void layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int64_t N, int C) {
  int64_t chunks = N < LAYERNORM_GRAD_CHUNKS ? N : LAYERNORM_GRAD_CHUNKS;
  if (chunks == 0) return;
  int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  // Per chunk: dweight partial (C) then dbias partial (C).
  double *partial = malloc_check((size_t)chunks * 2 * (size_t)C * sizeof(double));

#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; k++) {
    double *dw = partial + k * 2 * C, *db = dw + C;
    for (int c = 0; c < C; c++) dw[c] = db[c] = 0.0;
    int64_t n_end = (k + 1) * rows_per_chunk < N ? (k + 1) * rows_per_chunk : N;
    for (int64_t n = k * rows_per_chunk; n < n_end; n++) {
      const float *x = inp + n * C, *dy = dout + n * C;
      float *dx = dinp + n * C;
      float m = mean[n], r = rstd[n];
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
  }

  // Chunk order is fixed, so the sum is the same for any thread count.
  for (int c = 0; c < C; c++) {
    double sw = 0.0, sb = 0.0;
    for (int64_t k = 0; k < chunks; k++) {
      sw += partial[k * 2 * C + c];
      sb += partial[k * 2 * C + C + c];
    }
    dweight[c] += (float)sw;
    dbias[c] += (float)sb;
  }
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
