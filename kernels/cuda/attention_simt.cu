// attention_simt.cu: the SIMT window-attention kernels, forward and backward, for f32, bf16 and
// f16: tiles in f32 shared memory, softmax and products in f32 (everything the tensor-core
// kernels of attention_tc.cu do not serve), with their launchers.
#include <math.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/gemm.h"

// One thread block per (window, head) pair p = b * heads + h on a 1-D grid (gridDim.y/z stop
// at 65535, which BW * heads passes in Swin-T's first stage from batch 342 on). The block
// stages that head's q, k, v (backward: also dO, P, dS) in shared memory (N <= 64,
// head_dim <= 64), then:
//   - row phases give each warp whole rows i of the (N, N) score matrix, lane l holding columns
//     l and l + 32, so the softmax and rowsum(dP * P) are warp reductions (shuffles);
//   - the (N, hd) products (out = P v, dQ, dK, dV) give each thread elements (r, d) with d
//     fastest, so global reads and writes are coalesced over the head's channels.
// k (forward) and v (backward) are read with lanes running over rows j, so their shared rows
// are padded to hd + 1 floats: lanes then hit distinct banks.

namespace swin_cuda::attention {
namespace {

constexpr int kThreads = 256;  // 8 warps per (window, head) block
constexpr int kWarps = kThreads / 32;
// Columns per lane in the row phases and head channels per lane in the forward's P v.
constexpr int kSlots = 2;
// Windows of more than kFlashKeys tokens go to the flash kernels (attention_flash_*.cu).
static_assert(kFlashKeys <= 32 * kSlots, "a warp holds one row of N scores");
static_assert(WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM <= 32 * kSlots, "a warp holds one output row");

// Shared floats of the forward: q (N, hd), v (N, hd), k (N, hd + 1).
size_t forward_smem_bytes(int N, int hd) {
  return sizeof(float) * ((size_t)2 * N * hd + (size_t)N * (hd + 1));
}
// Shared floats of the backward: q, k, dO (N, hd), v (N, hd + 1), P and dS (N, N).
size_t backward_smem_bytes(int N, int hd) {
  return sizeof(float) * ((size_t)3 * N * hd + (size_t)N * (hd + 1) + (size_t)2 * N * N);
}

// Grid of one block per pair p = b * heads + h. Row phase: S = q_scaled k^T + bias + mask,
// P = softmax(S) to att and registers; then out[i] = sum_j P[i][j] v[j], P[i][j] broadcast
// from lane j % 32 by shuffle.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    window_attention_forward_kernel(T *__restrict__ out, float *__restrict__ att,
                                    const T *__restrict__ qkv, const float *__restrict__ table,
                                    const int *__restrict__ index, const float *__restrict__ mask,
                                    int nW, int N, int C, int heads, float scale) {
  extern __shared__ float4 attention_smem[];  // float4: 16-byte alignment for any layout
  const int hd = C / heads, ldk = hd + 1;
  float *q = reinterpret_cast<float *>(attention_smem);  // (N, hd), scaled
  float *v = q + N * hd;                                 // (N, hd)
  float *k = v + N * hd;                                 // (N, hd + 1)
  const int64_t p = blockIdx.x;
  const int b = (int)(p / heads), h = (int)(p % heads);

  const T *qkv_win = qkv + (int64_t)b * N * 3 * C + h * hd;  // token 0, q of head h
  for (int e = threadIdx.x; e < N * hd; e += blockDim.x) {
    int i = e / hd, d = e % hd;
    const T *row = qkv_win + (int64_t)i * 3 * C;
    q[e] = to_float<T>(row[d]) * scale;
    k[i * ldk + d] = to_float<T>(row[C + d]);
    v[e] = to_float<T>(row[2 * C + d]);
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float *m = mask ? mask + (int64_t)(b % nW) * N * N : nullptr;
  float *P = att + p * N * N;
  for (int i = warp; i < N; i += kWarps) {  // warp-uniform: all lanes take part in shuffles
    const float *qi = q + i * hd;
    float s[kSlots];
#pragma unroll
    for (int t = 0; t < kSlots; t++) {
      int j = lane + 32 * t;
      s[t] = -INFINITY;
      if (j < N) {
        const float *kj = k + j * ldk;
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc += qi[d] * kj[d];
        acc += table[index[i * N + j] * heads + h];
        if (m) acc += m[i * N + j];
        s[t] = acc;
      }
    }
    float mx = warp_max(fmaxf(s[0], s[1]));  // column 0 is always present: mx is finite
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < kSlots; t++) {
      s[t] = lane + 32 * t < N ? expf(s[t] - mx) : 0.0f;
      sum += s[t];
    }
    float inv = 1.0f / warp_sum(sum);
#pragma unroll
    for (int t = 0; t < kSlots; t++) {
      int j = lane + 32 * t;
      s[t] *= inv;
      if (j < N) P[i * N + j] = s[t];
    }

    float o[kSlots] = {0.0f, 0.0f};
    for (int j = 0; j < N; j++) {
      // j is warp-uniform, so every lane offers the same slot and all read lane j % 32.
      float pij = __shfl_sync(kFullMask, j < 32 ? s[0] : s[1], j & 31);
      const float *vj = v + j * hd;
#pragma unroll
      for (int t = 0; t < kSlots; t++)
        if (lane + 32 * t < hd) o[t] += pij * vj[lane + 32 * t];
    }
    T *out_row = out + ((int64_t)b * N + i) * C + h * hd;
#pragma unroll
    for (int t = 0; t < kSlots; t++)
      if (lane + 32 * t < hd) out_row[lane + 32 * t] = from_float<T>(o[t]);
  }
}

// Grid of one block per pair p. Row phase: dP[i][j] = dO[i] . v[j],
// dS = P (dP - sum_j P dP) (the row sum in double, as the CPU) to shared memory and to
// ds_out[p]. Element phase: dQ = dS K * scale, dK = dS^T Q_scaled, dV = P^T dO.
// att and ds_out may be the same array: each block reads its whole P (phase 1) before it writes
// any dS (phase 2), and no other block touches pair p. Hence no __restrict__ on either.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    window_attention_backward_kernel(T *__restrict__ dqkv, float *ds_out,
                                     const T *__restrict__ dout, const T *__restrict__ qkv,
                                     const float *att, int N, int C, int heads, float scale) {
  extern __shared__ float4 attention_smem[];
  const int hd = C / heads, ldv = hd + 1;
  float *q = reinterpret_cast<float *>(attention_smem);  // (N, hd), scaled
  float *k = q + N * hd;                                 // (N, hd)
  float *dO = k + N * hd;                                // (N, hd)
  float *v = dO + N * hd;                                // (N, hd + 1)
  float *P = v + N * ldv;                                // (N, N)
  float *dS = P + N * N;                                 // (N, N)
  const int64_t p = blockIdx.x;
  const int b = (int)(p / heads), h = (int)(p % heads);

  const T *qkv_win = qkv + (int64_t)b * N * 3 * C + h * hd;
  const T *dout_win = dout + (int64_t)b * N * C + h * hd;
  for (int e = threadIdx.x; e < N * hd; e += blockDim.x) {
    int i = e / hd, d = e % hd;
    const T *row = qkv_win + (int64_t)i * 3 * C;
    q[e] = to_float<T>(row[d]) * scale;
    k[e] = to_float<T>(row[C + d]);
    v[i * ldv + d] = to_float<T>(row[2 * C + d]);
    dO[e] = to_float<T>(dout_win[(int64_t)i * C + d]);
  }
  const float *P_global = att + p * N * N;
  for (int e = threadIdx.x; e < N * N; e += blockDim.x) P[e] = P_global[e];
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float *ds_pair = ds_out + p * N * N;
  for (int i = warp; i < N; i += kWarps) {  // warp-uniform: all lanes take part in shuffles
    const float *dOi = dO + i * hd;
    float dp[kSlots];
    double rowsum = 0.0;
#pragma unroll
    for (int t = 0; t < kSlots; t++) {
      int j = lane + 32 * t;
      dp[t] = 0.0f;
      if (j < N) {
        const float *vj = v + j * ldv;
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc += dOi[d] * vj[d];
        dp[t] = acc;
        rowsum += (double)P[i * N + j] * acc;
      }
    }
    float rs = (float)warp_sum(rowsum);
#pragma unroll
    for (int t = 0; t < kSlots; t++) {
      int j = lane + 32 * t;
      if (j < N) {
        float ds = P[i * N + j] * (dp[t] - rs);
        dS[i * N + j] = ds;
        ds_pair[i * N + j] = ds;
      }
    }
  }
  __syncthreads();

  T *dqkv_win = dqkv + (int64_t)b * N * 3 * C + h * hd;
  for (int e = threadIdx.x; e < N * hd; e += blockDim.x) {
    int r = e / hd, d = e % hd;
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (int j = 0; j < N; j++) dq += dS[r * N + j] * k[j * hd + d];
    for (int i = 0; i < N; i++) {
      dk += dS[i * N + r] * q[i * hd + d];
      dv += P[i * N + r] * dO[i * hd + d];
    }
    T *row = dqkv_win + (int64_t)r * 3 * C;
    row[d] = from_float<T>(dq * scale);
    row[C + d] = from_float<T>(dk);
    row[2 * C + d] = from_float<T>(dv);
  }
}

}  // namespace

void window_attention_forward_simt(DType dt, void *out, float *att, const void *qkv,
                                   const float *table, const int *index, const float *mask, int BW,
                                   int nW, int N, int C, int heads, float scale,
                                   cudaStream_t stream) {
  int hd = C / heads;
  size_t smem = forward_smem_bytes(N, hd);
  SWIN_DISPATCH(dt, T, {
    auto kernel = window_attention_forward_kernel<T>;
    allow_smem(kernel, smem);
    kernel<<<(unsigned)((int64_t)BW * heads), kThreads, smem, stream>>>(
        static_cast<T *>(out), att, static_cast<const T *>(qkv), table, index, mask, nW, N, C,
        heads, scale);
  });
  CUDA_CHECK_LAUNCH();
}

int64_t window_attention_backward_simt_scratch(int BW, int N, int C) {
  return column_sums_cuda_scratch((int64_t)BW * N, 3 * C);
}

// att holds P and is overwritten with dS (ds_out = att: see the kernel).
void window_attention_backward_simt(DType dt, void *dqkv, float *dqkv_bias, const void *dout,
                                    const void *qkv, float *att, int BW, int N, int C, int heads,
                                    float scale, float *scratch, cudaStream_t stream) {
  int hd = C / heads;
  size_t smem = backward_smem_bytes(N, hd);
  SWIN_DISPATCH(dt, T, {
    auto kernel = window_attention_backward_kernel<T>;
    allow_smem(kernel, smem);
    kernel<<<(unsigned)((int64_t)BW * heads), kThreads, smem, stream>>>(
        static_cast<T *>(dqkv), att, static_cast<const T *>(dout), static_cast<const T *>(qkv), att,
        N, C, heads, scale);
  });
  CUDA_CHECK_LAUNCH();
  if (dqkv_bias) column_sums_cuda(dt, dqkv_bias, dqkv, (int64_t)BW * N, 3 * C, scratch, stream);
}

}  // namespace swin_cuda::attention
