// adamw.c: the CPU AdamW update of optim/adamw.h, one fused pass over the parameters: each
// element's gradient, moments and weight are read and written once, so the update costs what
// the memory traffic costs (5 streams of n floats).
#include "optim/adamw.h"

#include <math.h>

void adamw_update_cpu(float *param,       // (n) fp32 master weights, updated in place
                      const float *grad,  // (n) gradients, before grad_scale
                      float *m,           // (n) first moment, updated in place
                      float *v,           // (n) second moment, updated in place
                      int64_t n, AdamWHyper hyper, int64_t step, float grad_scale) {
  // Bias corrections once per call and in double: at step 1e5, beta2^t is within a few ulps
  // of 0 in float, and 1 - beta2^t for small t loses digits in float.
  double bias1 = 1.0 - pow((double)hyper.beta1, (double)step);
  double bias2 = 1.0 - pow((double)hyper.beta2, (double)step);
  const float step_size = (float)((double)hyper.lr / bias1);
  const float bias2_sqrt = (float)sqrt(bias2);
  // Decoupled decay as torch applies it: p *= 1 - lr * wd before the Adam step.
  const float decay = 1.0f - hyper.lr * hyper.weight_decay;
  const float beta1 = hyper.beta1, beta2 = hyper.beta2, eps = hyper.eps;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    float g = grad[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step_size * mi / (sqrtf(vi) / bias2_sqrt + eps);
  }
}
