// clip.h: global-norm gradient clipping, as torch.nn.utils.clip_grad_norm_ does it:
//   norm = sqrt(sum of squares of every gradient element),
//   coefficient = min(1, max_norm / (norm + 1e-6)), gradients scaled by it.
#pragma once
#include <stdint.h>

// Sum of squares of grad (n) accumulated in double.
double grad_sum_squares_cpu(const float *grad, int64_t n);
// The factor to multiply gradients by; 1 when max_norm <= 0 (clipping off) or the norm is small.
float clip_coefficient(double norm, float max_norm);
