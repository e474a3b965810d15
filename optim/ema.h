// ema.h: an exponential moving average of the weights (train.ema_decay), as timm's ModelEmaV3
// keeps it (timm/utils/model_ema.py, with its train.py's settings: update_after_step 0, min_decay
// 0, warmup_gamma 1, warmup_power 2/3). After the t-th applied optimizer update (t >= 1):
//   decay(t) = 0 when t - 1 <= 0 (the first update copies the weights), else
//              min(decay, 1 - (1 + (t - 1))^(-2/3)) with warmup, decay without;
//   ema = lerp(ema, weights, 1 - decay(t)), every element, in fp32,
// the decay in double as Python computes it, 1 - decay rounded to float as torch hands the
// scalar to its float kernel, and lerp as ATen computes it (ema_lerp). t counts the updates that
// were applied: a step skipped for a non-finite gradient (or an fp16 overflow) changed no weight,
// so it leaves the average as it is and does not count, as it does not for AdamW's bias
// corrections (timm, which counts optimizer.step calls, would lerp towards the unchanged weights:
// the average would then move with how often a run overflows rather than with what it learned).
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "optim/optimizer.h"
#include "src/base/hostdev.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

// The settings of a run (host values, passed by value: a captured step keeps them).
typedef struct {
  double decay;  // train.ema_decay, in (0, 1): a double, as timm's Python float
  bool warmup;   // train.ema_warmup
} EmaSettings;

// ModelEmaV3.get_decay(step = t) with the settings above.
static inline SWIN_HOSTDEV double ema_decay_at(EmaSettings s, int64_t t) {
  int64_t k = t - 1;  // max(0, step - update_after_step - 1)
  if (k <= 0) return 0.0;
  if (!s.warmup) return s.decay;
  double d = 1.0 - pow(1.0 + (double)k / 1.0, -(2.0 / 3.0));
  d = d < s.decay ? d : s.decay;  // max(min(d, decay), min_decay)
  return d > 0.0 ? d : 0.0;
}

// ATen's lerp(self = ema, end = weights, weight = w): self + w (end - self) for |w| < 0.5, else
// end - (end - self)(1 - w), each a fused multiply-add as its vectorized CPU kernel and its CUDA
// kernel compute it (w - 1 = -(1 - w) exactly for w in [0.5, 1]). At w = 1 it gives end exactly.
static inline SWIN_HOSTDEV float ema_lerp(float ema, float weights, float w) {
  float d = weights - ema;
  return fabsf(w) < 0.5f ? fmaf(w, d, ema) : fmaf(w - 1.0f, d, weights);
}

// Whether the optimizer step just taken on state was applied (the update leaves skipped_run at 0;
// a skip counts it up), and if so the lerp weight 1 - decay(t) of its update, t = adam_steps.
static inline SWIN_HOSTDEV bool ema_step_weight(const OptimState *state, EmaSettings s, float *w) {
  if (state->skipped_run != 0) return false;
  *w = (float)(1.0 - ema_decay_at(s, state->adam_steps));
  return true;
}

#ifdef __cplusplus
extern "C" {
#endif

// ema (n) = ema_lerp(ema, weights (n), w), one pass.
void ema_update_cpu(float *ema, const float *weights, int64_t n, float w);
// Exchanges a (n) and b (n): the weights and their average, around an evaluation of the average.
void weights_swap_cpu(float *a, float *b, int64_t n);

#ifdef SWIN_HAVE_CUDA
// The update after an optimizer step on the device: ema_step_weight on *state (device memory,
// written by that step's decide kernel), then ema_update_cpu's arithmetic in one pass, 16 bytes
// at a time; nothing when the step was skipped. Queued on `stream`; a captured step replays with
// each step's decay. ema and weights 16-byte aligned.
void ema_update_cuda(float *ema, const float *weights, int64_t n, EmaSettings s,
                     const OptimState *state, cudaStream_t stream);
void weights_swap_cuda(float *a, float *b, int64_t n, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
