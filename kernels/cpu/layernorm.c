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

#include "src/util.h"

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
