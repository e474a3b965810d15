// optimizer.h: what one training update decides, shared by the CPU and the CUDA backends so both
// take the same decisions with the same arithmetic (SWIN_HOSTDEV functions run in a one-thread
// kernel on the GPU): skip a step whose gradient is not finite, the dynamic loss scale of fp16,
// the clip coefficient, and AdamW's bias corrections. The state lives beside the parameters
// (device memory on the GPU), so the step never waits for the host.
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "optim/clip.h"
#include "src/base/hostdev.h"
#include "src/base/tensor.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

typedef struct {
  double grad_norm;     // last step's global gradient norm (unscaled, before clipping)
  double loss_sum;      // sum of the finite losses (each a batch's or micro-batch's mean) since
                        // the host last cleared it
  int64_t loss_steps;   // losses summed into loss_sum (steps x train.accum_steps)
  int64_t bad_losses;   // losses that were not finite, since the host last cleared it
  int64_t adam_steps;   // updates applied: AdamW's bias-correction step t
  int64_t skipped;      // steps skipped because the gradient was not finite, all time
  int64_t skipped_run;  // steps skipped in a row up to the last one
  float loss_scale;     // dynamic loss scale (fp16); 1 otherwise
  int32_t good_steps;   // clean steps since the scale last changed
} OptimState;

// The update's settings, the same at every step of a run (host values, passed by value: a step
// captured into a CUDA graph keeps them). The learning rate, which changes every step, is not
// here: the update reads it from device memory (src/model/backend.h's StepParams).
typedef struct {
  float beta1, beta2, eps;
  float clip_grad;       // largest global norm, 0 = off
  bool dynamic_scale;    // fp16: halve the scale on overflow, double it after scale_window
  int32_t scale_window;  // clean steps before the scale doubles
} OptimizerStep;

// One contiguous piece of the flat parameter buffer with its weight decay and learning-rate
// scale: the fused update runs over a table of these (a few thousand elements each), so one
// launch covers every tensor. A chunk lies inside one tensor, so per-tensor settings are exact
// per chunk. The chunk's learning rate is the step's times lr_scale (float product, on both
// backends): train.layer_decay's factor (src/model/model.h), 1 without it. Like torch's
// per-group lr, it scales the decoupled weight decay too.
typedef struct {
  int64_t offset;
  int32_t count;
  float weight_decay;
  float lr_scale;
} AdamWChunk;

// The factors one update applies to every element.
typedef struct {
  bool skip;         // gradient not finite: leave parameters and moments as they are
  float grad_scale;  // clip coefficient / loss scale
  int64_t t;         // AdamW step (1-based)
} StepDecision;

// Decides the step from the sum of squares of the (loss-scaled) gradients and updates state.
static inline SWIN_HOSTDEV StepDecision optimizer_decide(OptimState *st, double scaled_sum_squares,
                                                         OptimizerStep h) {
  StepDecision d;
  double scale = (double)st->loss_scale;
  double norm = sqrt(scaled_sum_squares) / scale;
  st->grad_norm = norm;
  d.skip = !isfinite(norm);
  if (d.skip) {
    st->skipped++;
    st->skipped_run++;
    if (h.dynamic_scale) {
      st->loss_scale *= 0.5f;
      st->good_steps = 0;
    }
    d.grad_scale = 0.0f;
    d.t = st->adam_steps;
    return d;
  }
  d.grad_scale = (float)((double)clip_coefficient(norm, h.clip_grad) / scale);
  d.t = ++st->adam_steps;
  st->skipped_run = 0;
  if (h.dynamic_scale && ++st->good_steps >= h.scale_window) {
    st->loss_scale *= 2.0f;
    st->good_steps = 0;
  }
  return d;
}

#ifdef SWIN_HAVE_CUDA
#ifdef __cplusplus
extern "C" {
#endif
// The CUDA update (the CPU backend does the same on the host, per chunk with adamw_update_cpu):
// the sum of squares of grads (n) into scratch, optimizer_decide in a one-thread kernel on
// *state (device memory), then one launch of AdamW over the chunk table (device memory), which
// returns at once when the step is skipped and writes compute (n, compute_dtype) when it is not
// NULL. The learning rate is *lr (device memory), read by the decide kernel. Everything on
// `stream`, nothing waits. scratch: optimizer_step_cuda_scratch(n) floats.
int64_t optimizer_step_cuda_scratch(int64_t n);
void optimizer_step_cuda(DType compute_dtype, float *params, void *compute, const float *grads,
                         float *m, float *v, int64_t n, const AdamWChunk *chunks, int num_chunks,
                         OptimizerStep hyper, const float *lr, OptimState *state, float *scratch,
                         cudaStream_t stream);
// dst (n, dt) = src (n, f32): the compute copy of the weights after a load.
void to_compute_cuda(DType dt, void *dst, const float *src, int64_t n, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
#endif
