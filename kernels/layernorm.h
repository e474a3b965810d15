// layernorm.h: LayerNorm over the last dimension, eps 1e-5, statistics in fp32.
//   y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps), var biased (1/C).
// Forward saves mean and rstd (N each) for the backward.
#pragma once
#include <stdint.h>

#define LAYERNORM_EPS 1e-5f

// out, inp (N, C); weight, bias (C); mean, rstd (N) written.
void layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int64_t N, int C);
// dinp (N, C) overwritten; dweight, dbias (C) accumulated (+=).
void layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int64_t N, int C);
