// adamw.h: AdamW with decoupled weight decay (Loshchilov & Hutter), fp32 master weights and
// moments, as torch.optim.AdamW computes it:
//   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with g = grad * grad_scale (grad_scale carries the clip coefficient and, under fp16, the
// inverse loss scale) and t the 1-based step. One call updates one contiguous range, so the
// no-decay set (1-D params, biases, bias tables) is a range with weight_decay 0.
#pragma once
#include <stdint.h>
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
} AdamWHyper;

void adamw_update_cpu(float *param, const float *grad, float *m, float *v, int64_t n,
                      AdamWHyper hyper, int64_t step, float grad_scale);

// On the GPU the update runs fused over the whole flat buffer (optim/optimizer.h,
// optim/adamw.cu), with the same element arithmetic.

#ifdef __cplusplus
}
#endif
