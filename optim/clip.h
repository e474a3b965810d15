// clip.h: global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ does it:
//   norm = sqrt(sum of squares of every gradient element),
//   coefficient = min(1, max_norm / (norm + 1e-6)), gradients scaled by it.
#pragma once
#include <math.h>
#include <stdint.h>

#include "src/base/hostdev.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Sum of squares of grad (n) accumulated in double.
double grad_sum_squares_cpu(const float *grad, int64_t n);
// The factor to multiply gradients by; 1 when max_norm <= 0 (clipping off) or the norm is small.
// A NaN norm gives a NaN coefficient (as torch's clamp does), so a broken step poisons the update
// visibly instead of being applied unclipped.
static inline SWIN_HOSTDEV float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0) return 1.0f;
  double coefficient = (double)max_norm / (norm + 1e-6);
  if (isnan(coefficient)) return NAN;
  return coefficient < 1.0 ? (float)coefficient : 1.0f;
}

#ifdef SWIN_HAVE_CUDA
// CUDA form of grad_sum_squares_cpu: the sum of squares of grad (n, device) in double, written
// to *result_device (one double on the device, overwritten) on `stream`; nothing is copied back,
// the caller reads it when it needs it. Two kernels: fixed blocks (a function of n only) each
// sum a fixed grid-stride subset into a double partial in scratch, then one block adds the
// partials in a fixed order, so the result is bitwise the same run after run (not necessarily
// the CPU's bits: the order of the additions differs). scratch: device floats, at least
// grad_sum_squares_cuda_scratch(n) of them (at most 2049; the partials are doubles, placed at
// the first 8-byte boundary of scratch, so any float alignment will do), overwritten.
void grad_sum_squares_cuda(const float *grad, int64_t n, double *result_device, float *scratch,
                           cudaStream_t stream);
// Floats of scratch that grad_sum_squares_cuda needs for n elements.
int64_t grad_sum_squares_cuda_scratch(int64_t n);
#endif

#ifdef __cplusplus
}
#endif
