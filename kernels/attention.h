// attention.h: windowed multi-head self-attention with relative position bias and shift mask.
//
// Input is the qkv linear's output per window: qkv (BW, N, 3C), N = wh*ww tokens, channel
// s*C + h*hd + d for s in (q, k, v), head h, d < hd = C / heads. For each window b, head h:
//   S = (q * hd^-0.5) k^T + table[index[i][j]][h] + mask[b % nW][i][j]   (N, N)
//   P = softmax over j of S (fp32; saved in att for the backward)
//   out[b][i][h*hd + d] = sum_j P[i][j] v[j][d]                           out (BW, N, C)
// mask is (nW, N, N) or NULL (unshifted blocks); nW is the windows per image, so the window
// b of the stacked batch uses mask b % nW. table ((2wh-1)*(2ww-1), heads); index (N, N) from
// relative_position_index.
#pragma once
#include <stdint.h>
#include "src/tensor.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

// att (BW, heads, N, N) written with the softmax probabilities.
void window_attention_forward_cpu(float *out, float *att, const float *qkv, const float *table,
                                  const int *index, const float *mask, int BW, int nW, int N, int C,
                                  int heads);
// dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dP * P)); dQ = dS K * scale;
// dK = dS^T Q * scale; dtable[index[i][j]][h] += sum over windows of dS[i][j].
// dqkv (BW, N, 3C) overwritten; dtable accumulated (+=).
void window_attention_backward_cpu(float *dqkv, float *dtable, const float *dout, const float *qkv,
                                   const float *att, const int *index, int BW, int N, int C,
                                   int heads);

#ifdef SWIN_HAVE_CUDA
// CUDA forms: same parameters as the CPU ones, as device pointers (index and mask uploaded once
// by the caller), with q, k, v, out, dout and dqkv in the element type dt (F32, BF16 or F16;
// arithmetic in f32, att in f32), launched on `stream` with no synchronization. A thread block
// keeps one (window, head)'s q, k, v (and in the backward dO, P, dS) in shared memory: the SIMT
// kernels one block per pair, the tensor-core kernels one wave of blocks, each serving one head
// of a strided set of windows (kernels/cuda/attention.cu).
//
// Limits, checked at entry (a violation prints the shapes and aborts, like a CUDA error: the
// model's geometry is fixed when it is built, so check it there against these):
//   1 <= N <= WINDOW_ATTENTION_CUDA_MAX_N, C % heads == 0, C / heads <= ..._MAX_HEAD_DIM
//   (Swin: N = 49, head_dim = 32), BW * heads < 2^31, nW >= 1 when mask is given.
// The table must have max(index) + 1 rows (as the CPU reference infers), and index entries must
// be below the largest (2wh-1)(2ww-1) over the window shapes wh * ww = N, which
// relative_position_index guarantees: the backward visits only those rows of dtable.
#define WINDOW_ATTENTION_CUDA_MAX_N 64
#define WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM 64

// What the forward saves for the backward, in floats: with bf16/f16 and head_dim 16/32/64,
// N <= 64, the tensor-core kernels keep each query row's log-sum-exp (base 2: of the scores
// times log2(e)) (BW, heads, N) and recompute the probabilities in the backward; otherwise the
// SIMT kernels keep them all (BW, heads, N, N).
int64_t window_attention_saved_floats(DType dt, int BW, int N, int C, int heads);

// out (BW, N, C), att (window_attention_saved_floats), qkv (BW, N, 3C), table (rows, heads),
// index (N, N), mask (nW, N, N) or NULL. Softmax with expf on the SIMT path and ex2.approx of
// log2(e)-scaled scores on the tensor-core path (the CPU uses its own fast_expf): results agree
// to rounding, not bitwise. The tensor-core path rounds P to the element type before P v (as
// flash attention does).
void window_attention_forward_cuda(DType dt, void *out, float *att, const void *qkv,
                                   const float *table, const int *index, const float *mask, int BW,
                                   int nW, int N, int C, int heads, cudaStream_t stream);

// Floats of scratch the backward needs: the SIMT path's dS of every (window, head)
// (BW * heads * N * N, which may be att itself); the tensor-core path's per-block window sums of
// dS (about 1024 * N * N).
int64_t window_attention_backward_cuda_scratch(DType dt, int BW, int N, int C, int heads);

// dqkv (BW, N, 3C) overwritten; dtable (rows, heads) accumulated (+=); dout (BW, N, C),
// qkv (BW, N, 3C), att from the forward, table, index and mask as in the forward (the
// tensor-core path recomputes the scores). scratch: window_attention_backward_cuda_scratch
// floats, overwritten; NULL lets the SIMT path use att (which it then destroys). Otherwise
// scratch must not overlap att, dqkv, dtable, dout, qkv or index.
//
// dtable is deterministic without atomics: the window sums of dS go to scratch (SIMT: every
// window's dS; tensor cores: each block sums a fixed, strided set of windows of one head), a
// second kernel sums the rows of scratch per (h, i, j) in a fixed order (double accumulators,
// stored in fp32 over row 0), and a third adds, per (table row, h), the sums of all (i, j) with
// that index in a fixed order. Differences from the CPU: the per-(h, i, j) sums are rounded to
// fp32 before the per-row sum (CPU: double throughout).
void window_attention_backward_cuda(DType dt, void *dqkv, float *dtable, const void *dout,
                                    const void *qkv, float *att, const float *table,
                                    const int *index, const float *mask, int BW, int nW, int N,
                                    int C, int heads, float *scratch, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
