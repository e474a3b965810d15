// residual.h: x + drop_path(branch), the residual add of every Swin block, and the head's mean
// pool over tokens.
//
// Drop path (stochastic depth) drops a whole sample's branch: scale[b] is 0 for a dropped
// sample and 1 / keep_prob for a kept one (timm's scale_by_keep); scale NULL means 1 for all
// (eval, or drop_path_rate 0). Which samples drop is decided by the caller from the
// counter-based RNG, so results never depend on threads.
#pragma once
#include <stdint.h>
#include "src/base/tensor.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef SWIN_HAVE_CUDA
// CUDA forms (device pointers, launched on `stream`, no synchronization). The residual add is
// fused into the LayerNorm kernels on the GPU (kernels/layernorm.h), so only these remain:
// Drop-path scales (units, B): scale of unit u, sample b is 0 or 1 / keep with keep = 1 -
// rates[u / 2], drawn from rng_u32_at(seed, RNG_STREAM_DROP_PATH, *step, u, *first_sample + b)
// as the CPU model draws them (the same bits); *first_sample is the global index of sample 0.
// The step index and the first sample are read from device memory when the kernel runs (a
// captured step replays with each step's and micro-batch's own).
void drop_path_scales_cuda(float *scales, const float *rates, int units, int B, uint64_t seed,
                           const int64_t *step, const int64_t *first_sample, cudaStream_t stream);
// Mean pool with inp (B, L, C) and dinp of element type dt, out and dout f32; the forward sums
// its L tokens in double in order, as the CPU.
void mean_pool_forward_cuda(DType dt, float *out, const void *inp, int B, int L, int C,
                            cudaStream_t stream);
void mean_pool_backward_cuda(DType dt, void *dinp, const float *dout, int B, int L, int C,
                             cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
