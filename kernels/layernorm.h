// layernorm.h: LayerNorm over the last dimension, eps 1e-5, statistics in fp32.
//   y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps), var biased (1/C).
// Forward saves mean and rstd (N each) for the backward.
#pragma once
#include <stdint.h>

#include "kernels/window.h"
#include "src/base/tensor.h"
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

// Residual add + LayerNorm: the op between two GEMM groups of a Swin block, fused on the GPU
// with the window partition / reverse on either side. Over the B*L tokens t = (b, y, x) of a
// (B, H, W, C) map (L = H*W):
//   x_out[t] = x_in[t] + scale[b] * branch[bmap(t)]     (branch given; scale NULL = 1)
//   ln_out[lmap(t)] = LN(x_out[t]); mean, rstd (B*L) saved (ln_out given)
// bmap(t), lmap(t) = window_row(map, t) when branch_map / ln_map is given, else t. Without a
// branch, x_out is x_in (x_out NULL or == x_in: nothing written). Without ln_out it is a plain
// residual add. Uses in the model: LN1 (+ the previous block's MLP residual) to the windows of
// the attention; the attention residual (from the windows) + LN2; the last residual + the final
// LN; the patch-embedding LN.
// scratch: 2*B*L*C floats (the CPU composes reverse, residual, LayerNorm and partition).
void residual_layernorm_forward_cpu(float *x_out, float *ln_out, float *mean, float *rstd,
                                    const float *x_in, const float *branch,
                                    const WindowMap *branch_map, const float *scale,
                                    const float *weight, const float *bias, const WindowMap *ln_map,
                                    int B, int64_t L, int C, float *scratch);
// The backward, with x the LayerNorm input (the forward's x_out):
//   g[t] = dres_in[t] (or 0 when NULL) + LN_backward(dln[lmap(t)]) (dln given)
//   dres_out[t] = g[t] (dres_out given; may alias dres_in); dbranch[bmap(t)] = scale[b] g[t]
//   dweight, dbias accumulated (+=) when dln is given.
// (The CUDA form also sums dbranch's columns, the bias gradient of the layer whose output the
// branch is; on the CPU the backend adds column_sums_cpu of dbranch, kernels/gemm.h.)
void residual_layernorm_backward_cpu(float *dres_out, float *dbranch, float *dweight, float *dbias,
                                     const float *dres_in, const float *dln, const float *x,
                                     const float *weight, const float *mean, const float *rstd,
                                     const WindowMap *branch_map, const float *scale,
                                     const WindowMap *ln_map, int B, int64_t L, int C,
                                     float *scratch);

// Res-post-norm residual (Swin V2): the branch is normalized before it is added, and the sum is
// what the next block reads. Over the B*L tokens t = (b, y, x) of a (B, H, W, C) map, with
// bmap/omap/xmap(t) = window_row(map, t) when branch_map / out_map / x_map is given, else t:
//   n[t] = LN(branch[bmap(t)]); mean, rstd (B*L) saved in token order
//   x_out[t] = x_in[t] (0 when x_in is NULL) + scale[b] (1 when NULL) * n[t]   (x_out may be x_in)
//   xw_out[omap(t)] = x_out[t]   (xw_out given: the next attention's windows)
// Uses in the model: the attention unit (branch = proj out in window order), the MLP unit (fc2
// out; xw_out the next block's windows), a stage's input (the patch embedding or the merge's
// reduction: no x_in, no scale).
void postnorm_residual_forward_cpu(float *x_out, float *xw_out, float *mean, float *rstd,
                                   const float *x_in, const float *branch,
                                   const WindowMap *branch_map, const float *scale,
                                   const float *weight, const float *bias, const WindowMap *out_map,
                                   int B, int64_t L, int C);
// The backward:
//   g[t] = dres_in[t] (0 when NULL) + dx[xmap(t)] (0 when NULL); dres_out[t] = g[t] (dres_out
//   given; may alias dres_in); u = scale[b] (1 when NULL) * g[t], the gradient of n[t];
//   dbranch[bmap(t)] = LayerNorm backward of u (written; with mean[t], rstd[t], weight);
//   dweight += sum_t u * xhat, dbias += sum_t u (each when given; fixed row chunks, the sums
//   bitwise the same whatever the thread count).
// (The CUDA form also sums dbranch's columns; on the CPU the backend adds column_sums_cpu.)
void postnorm_residual_backward_cpu(float *dres_out, float *dbranch, float *dweight, float *dbias,
                                    const float *dres_in, const float *dx, const WindowMap *x_map,
                                    const float *branch, const float *weight, const float *mean,
                                    const float *rstd, const WindowMap *branch_map,
                                    const float *scale, int B, int64_t L, int C);

#ifdef SWIN_HAVE_CUDA
// CUDA forms of the fused op: device pointers, the act tensors (x_out, ln_out, x_in, branch,
// dbranch, dln, x) of element type dt (F32, BF16 or F16), statistics, scales, parameters and
// dres in f32, launched on `stream` (no synchronization). The maps are read at the call (host
// structs). The forward stores x_out in dt and normalizes the stored value, so the backward sees
// what the forward saw. Statistics are reduced in fp32 (warp shuffles over one row) rather than
// double, so results may differ from the CPU in the last bits. With a branch, x_out must be
// given (it may be x_in). The backward's dbranch_bias (C, f32, or NULL) += the column sums of
// dbranch as stored (in dt, scaled; the order of its rows does not matter to a sum), with or
// without dln. Its parameter gradients (dweight, dbias with dln; dbranch_bias) go through scratch
// (residual_layernorm_backward_cuda_scratch(B*L, C) floats; NULL when neither is asked for) in a
// fixed order: bitwise the same run after run.
void residual_layernorm_forward_cuda(DType dt, void *x_out, void *ln_out, float *mean, float *rstd,
                                     const void *x_in, const void *branch,
                                     const WindowMap *branch_map, const float *scale,
                                     const float *weight, const float *bias,
                                     const WindowMap *ln_map, int B, int64_t L, int C,
                                     cudaStream_t stream);
int64_t residual_layernorm_backward_cuda_scratch(int64_t rows, int C);
void residual_layernorm_backward_cuda(DType dt, float *dres_out, void *dbranch, float *dbranch_bias,
                                      float *dweight, float *dbias, const float *dres_in,
                                      const void *dln, const void *x, const float *weight,
                                      const float *mean, const float *rstd,
                                      const WindowMap *branch_map, const float *scale,
                                      const WindowMap *ln_map, int B, int64_t L, int C,
                                      float *scratch, cudaStream_t stream);
// The res-post-norm residual on CUDA (kernels/cuda/layernorm_postnorm.cu): x_out, xw_out, x_in,
// branch, dx and dbranch of element type dt; statistics, scale, parameters and dres in f32.
// x_out is stored in dt and xw_out gets the stored value. The backward's dbranch_bias (C, f32,
// or NULL) += the column sums of dbranch as stored (in dt). Its parameter gradients go through
// scratch (postnorm_residual_backward_cuda_scratch(B * L, C) floats; NULL when dweight, dbias
// and dbranch_bias are all NULL) in a fixed order: bitwise the same run after run.
void postnorm_residual_forward_cuda(DType dt, void *x_out, void *xw_out, float *mean, float *rstd,
                                    const void *x_in, const void *branch,
                                    const WindowMap *branch_map, const float *scale,
                                    const float *weight, const float *bias,
                                    const WindowMap *out_map, int B, int64_t L, int C,
                                    cudaStream_t stream);
int64_t postnorm_residual_backward_cuda_scratch(int64_t rows, int C);
void postnorm_residual_backward_cuda(DType dt, float *dres_out, void *dbranch, float *dbranch_bias,
                                     float *dweight, float *dbias, const float *dres_in,
                                     const void *dx, const WindowMap *x_map, const void *branch,
                                     const float *weight, const float *mean, const float *rstd,
                                     const WindowMap *branch_map, const float *scale, int B,
                                     int64_t L, int C, float *scratch, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
