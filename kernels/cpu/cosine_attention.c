// cosine_attention.c: CPU reference of Swin V2's scaled-cosine q, k and continuous position bias
// (kernels/cosine_attention.h). Norms, dot products and the MLP's sums run in double, rounded
// once to f32. Rows are independent, so they run in parallel; every sum over rows (the bias,
// logit-scale and MLP weight gradients) runs in row order in one thread, so the bits depend on
// nothing but the values.
#include "kernels/cosine_attention.h"

#include <math.h>
#include <stdlib.h>

#include "src/base/util.h"

// exp(min(l, ln 100)) as timm computes it on an f32 tensor (rounded once).
static float logit_multiplier(float logit_scale) {
  return (float)exp((double)fminf(logit_scale, COSINE_LOGIT_MAX));
}

// x (n) <- x / max(|x|, eps) * mul; returns |x| (before the clamp).
static float normalize_scaled(float *x, int n, float mul) {
  double ss = 0.0;
  for (int d = 0; d < n; d++) ss += (double)x[d] * x[d];
  float norm = (float)sqrt(ss);
  float den = norm > COSINE_NORM_EPS ? norm : COSINE_NORM_EPS;
  for (int d = 0; d < n; d++) x[d] = x[d] / den * mul;
  return norm;
}

void cosine_qk_forward_cpu(float *qkv, float *norms, const float *q_bias, const float *v_bias,
                           const float *logit_scale, int64_t rows, int C, int heads) {
  int hd = C / heads;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    float *q = qkv + r * 3 * C, *k = q + C, *v = k + C;
    if (q_bias)
      for (int c = 0; c < C; c++) {
        q[c] += q_bias[c];
        v[c] += v_bias[c];
      }
    for (int h = 0; h < heads; h++) {
      norms[(r * 2 + 0) * heads + h] =
          normalize_scaled(q + h * hd, hd, logit_multiplier(logit_scale[h]));
      norms[(r * 2 + 1) * heads + h] = normalize_scaled(k + h * hd, hd, 1.0f);
    }
  }
}

// dy (n) <- the gradient of x from that of y = x / max(|x|, eps) * mul, y as saved, norm = |x|.
static void normalize_scaled_backward(float *dy, const float *y, int n, float norm, float mul) {
  // With u = y / mul (the unit vector) and du = dy * mul: u . du = y . dy.
  double dot = 0.0;
  for (int d = 0; d < n; d++) dot += (double)y[d] * dy[d];
  if (norm > COSINE_NORM_EPS) {
    for (int d = 0; d < n; d++)
      dy[d] = (float)(((double)dy[d] * mul - (double)y[d] / mul * dot) / norm);
  } else {
    for (int d = 0; d < n; d++) dy[d] = (float)((double)dy[d] * mul / COSINE_NORM_EPS);
  }
}

void cosine_qk_backward_cpu(float *dqkv, float *dq_bias, float *dv_bias, float *dlogit_scale,
                            const float *qkv, const float *norms, const float *logit_scale,
                            int64_t rows, int C, int heads) {
  int hd = C / heads;
  // d(loss)/d(logit_scale[h]) = sum of q' . dq' (q' = u exp(l)), where the clamp passes it.
  if (dlogit_scale)
    for (int h = 0; h < heads; h++) {
      if (!(logit_scale[h] <= COSINE_LOGIT_MAX)) continue;
      double sum = 0.0;
      for (int64_t r = 0; r < rows; r++) {
        const float *q = qkv + r * 3 * C + h * hd, *dq = dqkv + r * 3 * C + h * hd;
        for (int d = 0; d < hd; d++) sum += (double)q[d] * dq[d];
      }
      dlogit_scale[h] += (float)sum;
    }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    float *dq = dqkv + r * 3 * C, *dk = dq + C;
    const float *q = qkv + r * 3 * C, *k = q + C;
    for (int h = 0; h < heads; h++) {
      normalize_scaled_backward(dq + h * hd, q + h * hd, hd, norms[(r * 2 + 0) * heads + h],
                                logit_multiplier(logit_scale[h]));
      normalize_scaled_backward(dk + h * hd, k + h * hd, hd, norms[(r * 2 + 1) * heads + h], 1.0f);
    }
  }
  // The bias gradients: the column sums of the q and v parts, rows in order.
  if (!dq_bias && !dv_bias) return;
  double *sums = calloc_check(2 * (size_t)C, sizeof(double));
  for (int64_t r = 0; r < rows; r++) {
    const float *dq = dqkv + r * 3 * C, *dv = dq + 2 * C;
    for (int c = 0; c < C; c++) {
      sums[c] += dq[c];
      sums[C + c] += dv[c];
    }
  }
  for (int c = 0; c < C; c++) {
    if (dq_bias) dq_bias[c] += (float)sums[c];
    if (dv_bias) dv_bias[c] += (float)sums[C + c];
  }
  free(sums);
}

// timm, in float32: t = offset / divisor * 8; sign(t) * log2(|t| + 1) / log2(8).
static float cpb_coordinate(int offset, int divisor) {
  float t = (float)offset / (float)divisor * 8.0f;
  float l = (float)log2((double)(fabsf(t) + 1.0f)) / 3.0f;
  return t > 0 ? l : t < 0 ? -l : 0.0f;
}

int cpb_coords_build(float *coords, int wh, int ww, int pwh, int pww) {
  int dh_div = pwh > 0 ? pwh - 1 : wh - 1, dw_div = pww > 0 ? pww - 1 : ww - 1;
  if (wh < 1 || ww < 1 || dh_div == 0 || dw_div == 0) return -1;
  int cols = 2 * ww - 1;
  for (int dh = -(wh - 1); dh <= wh - 1; dh++)
    for (int dw = -(ww - 1); dw <= ww - 1; dw++) {
      float *c = coords + 2 * ((int64_t)(dh + wh - 1) * cols + (dw + ww - 1));
      c[0] = cpb_coordinate(dh, dh_div);
      c[1] = cpb_coordinate(dw, dw_div);
    }
  return 0;
}

void cpb_forward_cpu(float *table, float *hidden, const float *coords, const float *w1,
                     const float *b1, const float *w2, int T, int heads) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    float *hid = hidden + (int64_t)t * CPB_HIDDEN;
    double c0 = coords[2 * t], c1 = coords[2 * t + 1];
    for (int j = 0; j < CPB_HIDDEN; j++) {
      double a = c0 * w1[2 * j] + c1 * w1[2 * j + 1] + b1[j];
      hid[j] = a > 0 ? (float)a : 0.0f;
    }
    for (int h = 0; h < heads; h++) {
      const float *w = w2 + (int64_t)h * CPB_HIDDEN;
      double out = 0.0;
      for (int j = 0; j < CPB_HIDDEN; j++) out += (double)hid[j] * w[j];
      table[(int64_t)t * heads + h] = (float)(16.0 / (1.0 + exp(-out)));
    }
  }
}

void cpb_backward_cpu(float *dw1, float *db1, float *dw2, const float *dtable, const float *table,
                      const float *hidden, const float *coords, const float *w2, int T, int heads) {
  // dout (T, heads): the sigmoid's gradient, 16 s (1 - s) = table (1 - table / 16).
  double *dout = malloc_check(sizeof(double) * (size_t)T * heads);
  for (int64_t e = 0; e < (int64_t)T * heads; e++)
    dout[e] = (double)dtable[e] * table[e] * (1.0 - table[e] / 16.0);
    // One hidden unit j per iteration: its sums over t run in order.
#pragma omp parallel
  {
    double *dw2_j = malloc_check(sizeof(double) * (size_t)heads);
#pragma omp for schedule(static)
    for (int j = 0; j < CPB_HIDDEN; j++) {
      double dw1_0 = 0.0, dw1_1 = 0.0, db = 0.0;
      for (int h = 0; h < heads; h++) dw2_j[h] = 0.0;
      for (int t = 0; t < T; t++) {
        double hid = hidden[(int64_t)t * CPB_HIDDEN + j];
        const double *g = dout + (int64_t)t * heads;
        for (int h = 0; h < heads; h++) dw2_j[h] += g[h] * hid;
        if (hid > 0) {
          double dh = 0.0;
          for (int h = 0; h < heads; h++) dh += g[h] * w2[(int64_t)h * CPB_HIDDEN + j];
          dw1_0 += dh * coords[2 * t];
          dw1_1 += dh * coords[2 * t + 1];
          db += dh;
        }
      }
      for (int h = 0; h < heads; h++) dw2[(int64_t)h * CPB_HIDDEN + j] += (float)dw2_j[h];
      dw1[2 * j] += (float)dw1_0;
      dw1[2 * j + 1] += (float)dw1_1;
      db1[j] += (float)db;
    }
    free(dw2_j);
  }
  free(dout);
}
