// gelu.h: exact GELU, y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (not the tanh approximation).
#pragma once
#include <stdint.h>

void gelu_forward_cpu(float *out, const float *inp, int64_t n);
// dinp = dout * (Phi(x) + x phi(x)); dinp overwritten. dinp may alias dout.
void gelu_backward_cpu(float *dinp, const float *inp, const float *dout, int64_t n);
