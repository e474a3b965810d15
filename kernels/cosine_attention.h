// cosine_attention.h: Swin V2's attention pieces around window attention (kernels/attention.h,
// called with scale 1): scaled-cosine q and k, and the continuous position bias (timm
// swin_transformer_v2.py WindowAttention).
//
// Scaled cosine q, k, in place on qkv (rows, 3C), the qkv linear's output (no bias), channel
// s*C + h*hd + d as in kernels/attention.h, hd = C / heads. Per row and head:
//   q = qkv_q + q_bias, k = qkv_k, v = qkv_v + v_bias     (q_bias, v_bias: both or neither)
//   qkv_q <- q / max(|q|, eps) * exp(min(logit_scale[h], COSINE_LOGIT_MAX))
//   qkv_k <- k / max(|k|, eps),  qkv_v <- v
// so that (q' k'^T) is timm's normalize(q) normalize(k)^T times the clamped logit scale, and
// attention's scale is 1. norms (rows, 2, heads) keeps |q| and |k| (before the clamp) for the
// backward, which reads the forward's output as saved.
//
// Continuous position bias: the coordinates (T, 2) of the T = (2wh-1)(2ww-1) relative positions,
// row (dh + wh - 1) (2ww - 1) + (dw + ww - 1) for dh in -(wh-1)..wh-1 and dw likewise, go through
// hidden (T, CPB_HIDDEN) = relu(coords w1^T + b1), out (T, heads) = hidden w2^T and become the
// bias table (T, heads) = 16 sigmoid(out), indexed by relative_position_index as V1's table.
#pragma once
#include <stdint.h>
#include "src/base/tensor.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define COSINE_LOGIT_MAX 4.605170185988091f  // ln(1 / 0.01), timm's clamp of logit_scale
#define COSINE_NORM_EPS 1e-12f               // F.normalize's eps
#define CPB_HIDDEN 512                       // the width of cpb_mlp's hidden layer

// qkv (rows, 3C) in place; norms (rows, 2, heads) written; q_bias, v_bias (C) or NULL;
// logit_scale (heads).
void cosine_qk_forward_cpu(float *qkv, float *norms, const float *q_bias, const float *v_bias,
                           const float *logit_scale, int64_t rows, int C, int heads);
// In place on dqkv (rows, 3C): in, the gradient of the forward's output; out, that of the qkv
// linear's output. qkv (rows, 3C) is the forward's output, norms its norms. F.normalize's
// gradient, y = x / max(|x|, eps): dx = (dy - y (y . dy)) / |x| when |x| > eps, else dy / eps;
// q' = y exp(min(l, max)). Accumulated (+=): dq_bias, dv_bias (C, or NULL) the column sums of the
// result's q and v parts; dlogit_scale (heads) the sum over rows and the head's channels of
// q' . dq' where logit_scale[h] <= COSINE_LOGIT_MAX (torch.clamp passes the gradient there), else
// nothing.
void cosine_qk_backward_cpu(float *dqkv, float *dq_bias, float *dv_bias, float *dlogit_scale,
                            const float *qkv, const float *norms, const float *logit_scale,
                            int64_t rows, int C, int heads);

// coords (T, 2) as timm's relative_coords_table in float32: c = d / (p > 0 ? p - 1 : w - 1) * 8
// per side (d the offset, w the window's side, p the pretrained window's, 0 when none), then
// sign(c) log2(|c| + 1) / log2(8). Returns -1 (nothing written) when a divisor is 0 (a side of 1
// without a pretrained side above 1, or a pretrained side of 1: timm divides by zero) or a side
// is below 1, else 0.
int cpb_coords_build(float *coords, int wh, int ww, int pwh, int pww);

// table (T, heads) = 16 sigmoid(relu(coords w1^T + b1) w2^T); hidden (T, CPB_HIDDEN) the ReLU's
// output, saved; coords (T, 2), w1 (CPB_HIDDEN, 2), b1 (CPB_HIDDEN), w2 (heads, CPB_HIDDEN).
void cpb_forward_cpu(float *table, float *hidden, const float *coords, const float *w1,
                     const float *b1, const float *w2, int T, int heads);
// From dtable (T, heads), the gradient of table: dout = dtable table (1 - table / 16);
// dw2 (heads, CPB_HIDDEN) += dout^T hidden; dhidden = (dout w2) (hidden > 0);
// dw1 (CPB_HIDDEN, 2) += dhidden^T coords; db1 (CPB_HIDDEN) += the column sums of dhidden.
void cpb_backward_cpu(float *dw1, float *db1, float *dw2, const float *dtable, const float *table,
                      const float *hidden, const float *coords, const float *w2, int T, int heads);

#ifdef SWIN_HAVE_CUDA
// CUDA forms: device pointers, qkv and dqkv in the element type dt (F32, BF16, F16), the math in
// f32, everything else f32, queued on the stream. Deterministic: every sum runs in an order fixed
// by the shapes (no float atomics). Limits, checked at entry (a violation prints the shapes and
// aborts, as kernels/attention.h's): C % heads == 0, C / heads <= COSINE_CUDA_MAX_HEAD_DIM.
#define COSINE_CUDA_MAX_HEAD_DIM 256
void cosine_qk_forward_cuda(DType dt, void *qkv, float *norms, const float *q_bias,
                            const float *v_bias, const float *logit_scale, int64_t rows, int C,
                            int heads, cudaStream_t s);
// Floats of scratch the backward needs: per block of (row, head) pairs, its sums of q' . dq' per
// head; dqkv's column sums and their partials (the bias sums are those of dqkv as stored in dt).
// Monotonic in each argument, so a call with the largest rows, C and heads of a model bounds
// every call.
int64_t cosine_qk_backward_cuda_scratch(int64_t rows, int C, int heads);
void cosine_qk_backward_cuda(DType dt, void *dqkv, float *dq_bias, float *dv_bias,
                             float *dlogit_scale, const void *qkv, const float *norms,
                             const float *logit_scale, int64_t rows, int C, int heads,
                             float *scratch, cudaStream_t s);

// The MLP is tiny (T = 2209 rows at window 24): plain kernels in double, a thread per output
// element or a block per hidden unit whose threads take fixed rows and add up in a fixed tree;
// no scratch.
void cpb_forward_cuda(float *table, float *hidden, const float *coords, const float *w1,
                      const float *b1, const float *w2, int T, int heads, cudaStream_t s);
void cpb_backward_cuda(float *dw1, float *db1, float *dw2, const float *dtable, const float *table,
                       const float *hidden, const float *coords, const float *w2, int T, int heads,
                       cudaStream_t s);
#endif

#ifdef __cplusplus
}
#endif
