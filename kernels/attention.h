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
