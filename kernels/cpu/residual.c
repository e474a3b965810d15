// residual.c: CPU reference of the residual add with drop path and of the head's mean pool over
// tokens (kernels/residual.h).
#include "kernels/residual.h"

#include <stdlib.h>

#include "src/base/util.h"

void residual_forward_cpu(float *out, const float *x, const float *branch, const float *scale,
                          int B, int64_t L) {
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B; b++) {
    const float *xb = x + (int64_t)b * L, *fb = branch + (int64_t)b * L;
    float *ob = out + (int64_t)b * L;
    if (scale) {
      float s = scale[b];
      for (int64_t i = 0; i < L; i++) ob[i] = xb[i] + s * fb[i];
    } else {
      for (int64_t i = 0; i < L; i++) ob[i] = xb[i] + fb[i];
    }
  }
}

void residual_backward_cpu(float *dbranch, const float *dout, const float *scale, int B,
                           int64_t L) {
  // With no drop path the branch gradient is dout itself; aliased, there is nothing to do.
  if (!scale && dbranch == dout) return;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B; b++) {
    const float *g = dout + (int64_t)b * L;
    float *db = dbranch + (int64_t)b * L;
    float s = scale ? scale[b] : 1.0f;
    for (int64_t i = 0; i < L; i++) db[i] = s * g[i];
  }
}

// Sums over tokens in double (L is 49 at stage 4 of Swin-T, cheap), rounded once.
void mean_pool_forward_cpu(float *out, const float *inp, int B, int L, int C) {
  double *acc = malloc_check((size_t)B * (size_t)C * sizeof(double));
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B; b++) {
    double *a = acc + (int64_t)b * C;
    for (int c = 0; c < C; c++) a[c] = 0.0;
    for (int l = 0; l < L; l++) {
      const float *row = inp + ((int64_t)b * L + l) * C;
      for (int c = 0; c < C; c++) a[c] += row[c];
    }
    for (int c = 0; c < C; c++) out[(int64_t)b * C + c] = (float)(a[c] / L);
  }
  free(acc);
}

void mean_pool_backward_cpu(float *dinp, const float *dout, int B, int L, int C) {
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B; b++) {
    const float *g = dout + (int64_t)b * C;
    for (int l = 0; l < L; l++) {
      float *row = dinp + ((int64_t)b * L + l) * C;
      for (int c = 0; c < C; c++) row[c] = g[c] / (float)L;
    }
  }
}
