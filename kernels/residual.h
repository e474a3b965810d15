// residual.h: x + drop_path(branch), the residual add of every Swin block, and the head's mean
// pool over tokens.
//
// Drop path (stochastic depth) drops a whole sample's branch: scale[b] is 0 for a dropped
// sample and 1 / keep_prob for a kept one (timm's scale_by_keep); scale NULL means 1 for all
// (eval, or drop_path_rate 0). Which samples drop is decided by the caller from the
// counter-based RNG, so results never depend on threads.
#pragma once
#include <stdint.h>

// out = x + scale[b] * branch, all (B, L) with L elements per sample. out may alias x.
void residual_forward_cpu(float *out, const float *x, const float *branch, const float *scale,
                          int B, int64_t L);
// dbranch = scale[b] * dout (overwritten); the gradient to x is dout itself. dbranch may
// alias dout.
void residual_backward_cpu(float *dbranch, const float *dout, const float *scale, int B, int64_t L);

// out (B, C) = mean over L tokens of inp (B, L, C).
void mean_pool_forward_cpu(float *out, const float *inp, int B, int L, int C);
// dinp (B, L, C) = dout[b][c] / L, overwritten.
void mean_pool_backward_cpu(float *dinp, const float *dout, int B, int L, int C);
