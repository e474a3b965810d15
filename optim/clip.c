// clip.c: global-norm gradient clipping on the CPU (optim/clip.h). The sum of squares is
// accumulated in double over a fixed partition of the range, so the norm, and with it the whole
// training run, is bitwise the same whatever the number of threads.
#include "optim/clip.h"

#include <math.h>

// The range is cut into this many equal chunks whatever the thread count; each chunk's partial
// sum lives on the stack and the partials are added in chunk order.
#define SUM_SQUARES_CHUNKS 256
// Inside a chunk, this many independent accumulators (a fixed association, so still
// deterministic) let the compiler keep several additions in flight.
#define SUM_SQUARES_LANES 8

static double chunk_sum_squares(const float *x, int64_t n) {  // x: (n)
  double acc[SUM_SQUARES_LANES] = {0};
  int64_t i = 0;
  for (; i + SUM_SQUARES_LANES <= n; i += SUM_SQUARES_LANES)
    for (int k = 0; k < SUM_SQUARES_LANES; k++) acc[k] += (double)x[i + k] * (double)x[i + k];
  for (; i < n; i++) acc[0] += (double)x[i] * (double)x[i];
  double sum = 0;
  for (int k = 0; k < SUM_SQUARES_LANES; k++) sum += acc[k];
  return sum;
}

double grad_sum_squares_cpu(const float *grad, int64_t n) {  // grad: (n)
  double partial[SUM_SQUARES_CHUNKS];
  const int64_t chunk = (n + SUM_SQUARES_CHUNKS - 1) / SUM_SQUARES_CHUNKS;
  // Threads only pay off once a chunk is worth more than the fork/join.
#pragma omp parallel for schedule(static) if (n >= (int64_t)1 << 16)
  for (int c = 0; c < SUM_SQUARES_CHUNKS; c++) {
    int64_t begin = c * chunk, end = begin + chunk;
    if (begin > n) begin = n;
    if (end > n) end = n;
    partial[c] = chunk_sum_squares(grad + begin, end - begin);
  }
  double sum = 0;
  for (int c = 0; c < SUM_SQUARES_CHUNKS; c++) sum += partial[c];
  return sum;
}
