// loss.c: CPU reference of softmax cross-entropy with label smoothing or soft targets, fused
// with its gradient, and top-1 / top-5 counting (kernels/loss.h).
//
// Per row: lse = max + log(sum_k exp(x_k - max)) in double, log p_k = x_k - lse, so logits of
// any magnitude (1e3 and beyond) neither overflow nor lose the small probabilities. Row losses
// are kept apart and summed in row order, so the mean does not depend on the thread count.
#include "kernels/loss.h"

#include <math.h>
#include <stdlib.h>

#include "src/base/util.h"

double cross_entropy_forward_backward_cpu(float *dlogits, const float *logits, const int *labels,
                                          const float *soft_targets, float smoothing, int B, int K,
                                          int grad_count) {
  if (B <= 0) return 0.0;
  double *row_loss = malloc_check((size_t)B * sizeof(double));
  double off_target = (double)smoothing / K;  // the smoothed mass every class gets
#pragma omp parallel for schedule(static)
  for (int b = 0; b < B; b++) {
    const float *x = logits + (int64_t)b * K;
    float mx = x[0];
    for (int k = 1; k < K; k++) mx = x[k] > mx ? x[k] : mx;
    double sum = 0.0;
    for (int k = 0; k < K; k++) sum += exp((double)x[k] - mx);
    double lse = mx + log(sum);

    double loss = 0.0;
    int y = labels ? labels[b] : -1;
    if (labels && (y < 0 || y >= K)) {
      // An out-of-range label has no target row: make the step visibly non-finite rather
      // than read outside the row (the loader validates labels, so this is a bug upstream).
      loss = NAN;
      if (dlogits)
        for (int k = 0; k < K; k++) dlogits[(int64_t)b * K + k] = NAN;
      row_loss[b] = loss;
      continue;
    }
    if (labels) {
      // -sum_k t_k log p_k with t = (1 - s) onehot(y) + s / K.
      double sum_logp = 0.0;
      for (int k = 0; k < K; k++) sum_logp += (double)x[k] - lse;
      loss = -(1.0 - smoothing) * ((double)x[y] - lse) - off_target * sum_logp;
    } else {
      const float *t = soft_targets + (int64_t)b * K;
      for (int k = 0; k < K; k++) loss -= (double)t[k] * ((double)x[k] - lse);
    }
    row_loss[b] = loss;

    if (dlogits) {
      float *g = dlogits + (int64_t)b * K;
      for (int k = 0; k < K; k++) {
        double target = labels ? off_target + (k == y ? 1.0 - smoothing : 0.0)
                               : (double)soft_targets[(int64_t)b * K + k];
        g[k] = (float)((exp((double)x[k] - lse) - target) / grad_count);
      }
    }
  }
  double total = 0.0;
  for (int b = 0; b < B; b++) total += row_loss[b];
  free(row_loss);
  return total / B;
}

// The label's rank is the number of classes ahead of it: a larger logit, or an equal logit at
// a smaller class index (ties go to the lower index, as argmax's first occurrence). A NaN label
// logit is never counted correct.
void topk_correct_cpu(const float *logits, const int *labels, int B, int K, int *top1, int *top5) {
  int c1 = 0, c5 = 0;
#pragma omp parallel for schedule(static) reduction(+ : c1, c5)
  for (int b = 0; b < B; b++) {
    const float *x = logits + (int64_t)b * K;
    int y = labels[b];
    if (y < 0 || y >= K || isnan(x[y])) continue;
    float v = x[y];
    int rank = 0;
    for (int k = 0; k < K; k++) rank += x[k] > v || (x[k] == v && k < y);
    c1 += rank < 1;
    c5 += rank < 5;
  }
  *top1 = c1;
  *top5 = c5;
}
