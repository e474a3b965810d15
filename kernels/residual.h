// residual.h: x + drop_path(branch), the residual add of every Swin block, and the head's mean
// pool over tokens.
//
// Drop path (stochastic depth) drops a whole sample's branch: scale[b] is 0 for a dropped
// sample and 1 / keep_prob for a kept one (timm's scale_by_keep); scale NULL means 1 for all
// (eval, or drop_path_rate 0). Which samples drop is decided by the caller from the
// counter-based RNG, so results never depend on threads.
#pragma once
#include <stdint.h>
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
// CUDA forms: same parameters, device pointers (scale too: (B) on the device, or NULL),
// launched on `stream` (no synchronization); the same aliasing is allowed (out == x,
// dbranch == dout). The forward's x + s * branch is one fma, so it may differ from the CPU in
// the last bit; the backward and both mean-pool kernels round exactly as the CPU does (the pool
// sums its L tokens in double in the same order), so they give the CPU's bits. 16-byte accesses
// when the layout allows (L % 4 == 0 or C % 4 == 0 and aligned pointers), else one float.
void residual_forward_cuda(float *out, const float *x, const float *branch, const float *scale,
                           int B, int64_t L, cudaStream_t stream);
void residual_backward_cuda(float *dbranch, const float *dout, const float *scale, int B, int64_t L,
                            cudaStream_t stream);
void mean_pool_forward_cuda(float *out, const float *inp, int B, int L, int C, cudaStream_t stream);
void mean_pool_backward_cuda(float *dinp, const float *dout, int B, int L, int C,
                             cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
