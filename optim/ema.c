// ema.c: the CPU update of the weights' moving average (optim/ema.h): one pass, each element of
// the average read and written once and the weights read once.
#include "optim/ema.h"

void ema_update_cpu(float *ema,            // (n) the average, updated in place
                    const float *weights,  // (n) the weights after the step
                    int64_t n, float w) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) ema[i] = ema_lerp(ema[i], weights[i], w);
}

void weights_swap_cpu(float *a, float *b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    float t = a[i];
    a[i] = b[i];
    b[i] = t;
  }
}
