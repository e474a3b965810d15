// attention.h: windowed multi-head self-attention with relative position bias and shift mask.
//
// Input is the qkv linear's output per window: qkv (BW, N, 3C), N = wh*ww tokens, channel
// s*C + h*hd + d for s in (q, k, v), head h, d < hd = C / heads. For each window b, head h:
//   S = (q * scale) k^T + table[index[i][j]][h] + mask[b % nW][i][j]   (N, N)
//   P = softmax over j of S (fp32; saved in att for the backward)
//   out[b][i][h*hd + d] = sum_j P[i][j] v[j][d]                           out (BW, N, C)
// mask is (nW, N, N) or NULL (unshifted blocks); nW is the windows per image, so the window
// b of the stacked batch uses mask b % nW. table ((2wh-1)*(2ww-1), heads); index (N, N) from
// relative_position_index. scale is the caller's: Swin V1 passes attention_head_dim_scale(hd),
// timm's head_dim ** -0.5; Swin V2 passes 1 (its q and k are normalized and q carries the logit
// scale: kernels/cosine_attention.h).
#pragma once
#include <math.h>
#include <stdint.h>
#include "src/base/tensor.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

// head_dim ** -0.5 as the fp32 scalar timm multiplies q by (Swin V1): the one definition.
static inline float attention_head_dim_scale(int head_dim) {
  return (float)(1.0 / sqrt((double)head_dim));
}

// att (BW, heads, N, N) written with the softmax probabilities.
void window_attention_forward_cpu(float *out, float *att, const float *qkv, const float *table,
                                  const int *index, const float *mask, int BW, int nW, int N, int C,
                                  int heads, float scale);
// dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dP * P)); dQ = dS K * scale;
// dK = dS^T Q * scale; dtable[index[i][j]][h] += sum over windows of dS[i][j].
// dqkv (BW, N, 3C) overwritten; dtable accumulated (+=).
void window_attention_backward_cpu(float *dqkv, float *dtable, const float *dout, const float *qkv,
                                   const float *att, const int *index, int BW, int N, int C,
                                   int heads, float scale);

#ifdef SWIN_HAVE_CUDA
// CUDA forms: same parameters as the CPU ones, as device pointers (index and mask uploaded once
// by the caller), with q, k, v, out, dout and dqkv in the element type dt (F32, BF16 or F16;
// arithmetic in f32, att in f32), launched on `stream` with no synchronization. Windows of at
// most 64 tokens: a thread block keeps one (window, head)'s q, k, v (and in the backward dO, P,
// dS) in shared memory: the SIMT kernels one block per pair (kernels/cuda/attention_simt.cu),
// the tensor-core kernels one wave of blocks, each serving one head of a strided set of windows
// (kernels/cuda/attention_tc.cu). Larger windows: flash kernels, keys in tiles (of 48 or 64
// tokens on tensor cores, 64 on the SIMT path), a block per (window, head, query tile) and in the
// backward's dk/dv kernel per (window group, head, key tile) (kernels/cuda/attention_flash_tc.cu
// for bf16/f16 with head_dim 16, 32 or 64, kernels/cuda/attention_flash_simt.cu otherwise).
// kernels/cuda/attention.cu picks.
//
// Limits, checked at entry (a violation prints the shapes and aborts, like a CUDA error: the
// model's geometry is fixed when it is built, so check it there against these):
//   1 <= N <= WINDOW_ATTENTION_CUDA_MAX_N, C % heads == 0, C / heads <= ..._MAX_HEAD_DIM
//   (Swin: N = 49, 144 at 384 / window 12; head_dim = 32), BW * heads < 2^31, nW >= 1 when mask
//   is given.
// The table must have max(index) + 1 rows (as the CPU reference infers), and index entries must
// be below the largest (2wh-1)(2ww-1) over the window shapes wh * ww = N, which
// relative_position_index guarantees: the backward visits only those rows of dtable.
#define WINDOW_ATTENTION_CUDA_MAX_N 576
#define WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM 64
// The most thread blocks a tensor-core or flash backward launches (a wave: 396 on the H200),
// which bounds its scratch: window_attention_backward_cuda_scratch_bound.
#define WINDOW_ATTENTION_CUDA_MAX_BLOCKS 512

// What the forward saves for the backward, in floats: with bf16/f16 and head_dim 16/32/64,
// N <= 64, the tensor-core kernels keep each query row's log-sum-exp (base 2: of the scores
// times log2(e)) (BW, heads, N) and recompute the probabilities in the backward; the flash
// kernels (N > 64) the same plus room for the backward's delta = rowsum(dO * out) (2 BW heads N),
// and with bf16/f16 the dense bias table[index] (heads, N, N) and its transpose that the forward
// writes; otherwise
// the SIMT kernels keep them all (BW, heads, N, N).
int64_t window_attention_saved_floats(DType dt, int BW, int N, int C, int heads);

// out (BW, N, C), att (window_attention_saved_floats), qkv (BW, N, 3C), table (rows, heads),
// index (N, N), mask (nW, N, N) or NULL. Softmax with expf on the SIMT path and ex2.approx of
// log2(e)-scaled scores on the tensor-core path (the CPU uses its own fast_expf): results agree
// to rounding, not bitwise. The tensor-core path rounds P to the element type before P v (as
// flash attention does).
void window_attention_forward_cuda(DType dt, void *out, float *att, const void *qkv,
                                   const float *table, const int *index, const float *mask, int BW,
                                   int nW, int N, int C, int heads, float scale,
                                   cudaStream_t stream);

// Floats of scratch the backward needs: the tensor-core path's per-block window sums of dS and
// qkv bias sums; the flash path's per-group window sums of dS; the SIMT and flash paths' column
// sums of dqkv (column_sums_cuda_scratch(BW * N, 3C), kernels/gemm.h).
int64_t window_attention_backward_cuda_scratch(DType dt, int BW, int N, int C, int heads);
// A bound of window_attention_backward_cuda_scratch's window sums of dS over every batch for
// windows of at most max_N tokens and at most max_heads heads (the column sums are bounded by
// the caller's own column_sums_cuda_scratch): what a backend reserves.
int64_t window_attention_backward_cuda_scratch_bound(int max_N, int max_heads, int max_width);

// dqkv (BW, N, 3C) overwritten; dqkv_bias (3C: the qkv layer's bias gradient, dqkv's column
// sums) accumulated (+=) unless NULL; dtable (rows, heads) accumulated (+=); dout (BW, N, C),
// qkv (BW, N, 3C), out (BW, N, C) and att from the forward, table, index and mask as in the
// forward (the tensor-core and flash paths recompute the scores; only the flash path reads out).
// scratch: window_attention_backward_cuda_scratch floats, overwritten, not overlapping any
// argument. The SIMT path overwrites att (its dS), the flash path att's second half (delta).
//
// dtable is deterministic without atomics: the window sums of dS go to scratch (tensor cores:
// each block sums a fixed, strided set of windows of one head; flash: each dk/dv block does,
// for its 64 keys) or att (SIMT: every window's dS), a second kernel sums their rows per (h, i, j)
// in a fixed order (double accumulators, stored in fp32 over row 0), and a third adds, per (table
// row, h), the sums of all (i, j) with that index in a fixed order. Differences from the CPU: the
// per-(h, i, j) sums are rounded to fp32 before the per-row sum (CPU: double throughout).
//
// dqkv_bias: the tensor-core kernel sums the columns of dq, dk and dv in f32 as it computes
// them (before their rounding to dt), per block over its windows, and a second pass adds the
// blocks in a fixed order; the SIMT and flash paths sum the stored dqkv (column_sums_cuda).
// Either way deterministic.
void window_attention_backward_cuda(DType dt, void *dqkv, float *dqkv_bias, float *dtable,
                                    const void *dout, const void *qkv, const void *out, float *att,
                                    const float *table, const int *index, const float *mask, int BW,
                                    int nW, int N, int C, int heads, float scale, float *scratch,
                                    cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
