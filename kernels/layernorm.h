// layernorm.h: LayerNorm over the last dimension, eps 1e-5, statistics in fp32.
//   y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps), var biased (1/C).
// Forward saves mean and rstd (N each) for the backward.
#pragma once
#include <stdint.h>
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define LAYERNORM_EPS 1e-5f

// out, inp (N, C); weight, bias (C); mean, rstd (N) written.
void layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int64_t N, int C);
// dinp (N, C) overwritten; dweight, dbias (C) accumulated (+=).
void layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int64_t N, int C);

#ifdef SWIN_HAVE_CUDA
// CUDA forms: same parameters, device pointers, launched on `stream` (no synchronization).
// Statistics are reduced in fp32 (warp shuffles over one row, C <= a few thousand) rather than
// double, so mean, rstd and dinp may differ from the CPU in the last bits. 16-byte loads when
// C % 4 == 0 and the row pointers are 16-byte aligned, else one float at a time.
void layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int64_t N, int C,
                            cudaStream_t stream);
// The backward writes per-row-block partial sums of dout * xhat and dout (fp32) to scratch,
// then a second kernel adds them in a fixed order (in double) into dweight and dbias: the
// partition depends only on (N, C), so the result is bitwise the same run after run.
// scratch: device floats, at least layernorm_backward_cuda_scratch(N, C) of them (at most
// 2048 * C), contents ignored and overwritten. Limit: C <= 29056 (one warp's two C-float
// accumulators must fit in a block's 227 KiB of shared memory; past C = 6144 the kernel opts in
// to more than the default 48 KiB).
void layernorm_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int64_t N, int C, float *scratch,
                             cudaStream_t stream);
// Floats of scratch that layernorm_backward_cuda needs for (N, C).
int64_t layernorm_backward_cuda_scratch(int64_t N, int C);
#endif

#ifdef __cplusplus
}
#endif
