// attention.cu: CUDA windowed multi-head self-attention with relative position bias and shift
// mask, forward and backward (kernels/attention.h), for f32, bf16 and f16 q, k, v and outputs
// (loaded into f32 shared memory; softmax and products in f32); kernels/cpu/attention.c is the
// spec.
//
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
//
// dtable needs a sum over all windows; no floating-point atomics (results must be bitwise
// reproducible), so the backward writes every pair's dS to scratch and two more kernels reduce
// it in a fixed order: over windows per (h, i, j), then over the (i, j) of each table row.
#include "kernels/attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/common.cuh"
#include "src/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreads = 256;  // 8 warps per (window, head) block
constexpr int kWarps = kThreads / 32;
// Columns per lane in the row phases and head channels per lane in the forward's P v.
constexpr int kSlots = 2;
static_assert(WINDOW_ATTENTION_CUDA_MAX_N <= 32 * kSlots, "a warp holds one row of N scores");
static_assert(WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM <= 32 * kSlots, "a warp holds one output row");
// Window-sum kernel: a block covers 32 consecutive (h, i, j) and splits the windows between
// kSumRows thread rows. Fixed, so the summation order never depends on the device.
constexpr int kSumRows = 16;
// Shared memory a block may use without opting in.
constexpr size_t kDefaultSmemBytes = 48 * 1024;

// Shared floats of the forward: q (N, hd), v (N, hd), k (N, hd + 1).
size_t forward_smem_bytes(int N, int hd) {
  return sizeof(float) * ((size_t)2 * N * hd + (size_t)N * (hd + 1));
}
// Shared floats of the backward: q, k, dO (N, hd), v (N, hd + 1), P and dS (N, N).
size_t backward_smem_bytes(int N, int hd) {
  return sizeof(float) * ((size_t)3 * N * hd + (size_t)N * (hd + 1) + (size_t)2 * N * N);
}

// The geometry a launch can serve; a violation is a bug in the model's setup, not a runtime
// condition, so it is reported like a CUDA error: message and abort.
void check_limits(const char *fn, int BW, int N, int C, int heads) {
  int hd = heads > 0 ? C / heads : 0;
  if (BW >= 0 && N >= 1 && N <= WINDOW_ATTENTION_CUDA_MAX_N && heads >= 1 && C % heads == 0 &&
      hd >= 1 && hd <= WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM &&
      (int64_t)BW * heads <= (int64_t)0x7fffffff)
    return;
  fprintf(stderr,
          "%s (%s:%d): unsupported shape BW=%d N=%d C=%d heads=%d (need 1 <= N <= %d, C %% heads "
          "== 0, 1 <= C/heads <= %d, BW*heads < 2^31)\n"
          "HINT: use a window of at most %d tokens and at most %d channels per head\n",
          fn, __FILE__, __LINE__, BW, N, C, heads, WINDOW_ATTENTION_CUDA_MAX_N,
          WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM, WINDOW_ATTENTION_CUDA_MAX_N,
          WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM);
  abort();
}

// The scale the CPU uses: timm's head_dim ** -0.5 as an fp32 scalar.
float attention_scale(int hd) {
  return (float)(1.0 / sqrt((double)hd));
}

// Upper bound of the bias-table rows of an N-token window: the largest (2wh-1)(2ww-1) over
// wh * ww = N; relative_position_index of any such window stays below it.
int table_rows_bound(int N) {
  int rows = 0;
  for (int wh = 1; wh <= N; wh++)
    if (N % wh == 0) {
      int r = (2 * wh - 1) * (2 * (N / wh) - 1);
      rows = r > rows ? r : rows;
    }
  return rows;
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

// ds (BW, E), E = heads * N * N: sums ds over windows per element e in a fixed order and
// stores the sum in ds[e] (window 0's slot). Block (32, kSumRows): x picks e, thread row y
// sums windows y, y + kSumRows, ... in double; then the rows are added in order y = 0, 1, ...
// Every read of ds[e] (by this block only) happens before the barrier, the write after it.
__global__ void __launch_bounds__(32 * kSumRows)
    attention_ds_window_sum_kernel(float *ds, int64_t BW, int64_t E) {
  __shared__ double partial[kSumRows][32];
  const int64_t e = (int64_t)blockIdx.x * 32 + threadIdx.x;
  double s = 0.0;
  if (e < E)
    for (int64_t b = threadIdx.y; b < BW; b += kSumRows) s += ds[b * E + e];
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && e < E) {
    double total = 0.0;
    for (int y = 0; y < kSumRows; y++) total += partial[y][threadIdx.x];
    ds[e] = (float)total;
  }
}

// dtable[t][h] += sum of ds_sum[h][i][j] over the (i, j) with index[i][j] == t. One warp per
// (t, h), t < rows_bound: lane l sums the entries l, l + 32, ... of its row in order, then a
// fixed butterfly adds the lanes. A warp whose t appears nowhere in index writes nothing, so
// only rows max(index) + 1 of dtable are touched.
__global__ void attention_dtable_kernel(float *__restrict__ dtable,
                                        const float *__restrict__ ds_sum,
                                        const int *__restrict__ index, int N, int heads,
                                        int rows_bound) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= (int64_t)rows_bound * heads) return;  // whole warps: blockDim.x is a multiple of 32
  const int t = (int)(w / heads), h = (int)(w % heads);
  const float *ds_h = ds_sum + (int64_t)h * N * N;
  double s = 0.0;
  int hits = 0;
  for (int e = lane; e < N * N; e += 32)
    if (index[e] == t) {
      s += ds_h[e];
      hits++;
    }
  s = warp_sum(s);
  for (int o = 16; o > 0; o >>= 1) hits += __shfl_xor_sync(kFullMask, hits, o);
  if (lane == 0 && hits > 0) dtable[(int64_t)t * heads + h] += (float)s;
}

// Opts a kernel in to more than the default 48 KiB of dynamic shared memory when it needs it.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > kDefaultSmemBytes)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

}  // namespace

void window_attention_forward_cuda(DType dt, void *out, float *att, const void *qkv,
                                   const float *table, const int *index, const float *mask, int BW,
                                   int nW, int N, int C, int heads, cudaStream_t stream) {
  check_limits("window_attention_forward_cuda", BW, N, C, heads);
  if (mask && nW < 1) {
    fprintf(stderr, "window_attention_forward_cuda (%s:%d): mask given with nW=%d\n", __FILE__,
            __LINE__, nW);
    abort();
  }
  if (BW == 0) return;
  int hd = C / heads;
  size_t smem = forward_smem_bytes(N, hd);
  SWIN_DISPATCH(dt, T, {
    auto kernel = window_attention_forward_kernel<T>;
    allow_smem(kernel, smem);
    kernel<<<(unsigned)((int64_t)BW * heads), kThreads, smem, stream>>>(
        static_cast<T *>(out), att, static_cast<const T *>(qkv), table, index, mask, nW, N, C,
        heads, attention_scale(hd));
  });
  CUDA_CHECK_LAUNCH();
}

int64_t window_attention_backward_cuda_scratch(int BW, int N, int heads) {
  return (int64_t)BW * heads * N * N;
}

void window_attention_backward_cuda(DType dt, void *dqkv, float *dtable, const void *dout,
                                    const void *qkv, const float *att, const int *index, int BW,
                                    int N, int C, int heads, float *scratch, cudaStream_t stream) {
  check_limits("window_attention_backward_cuda", BW, N, C, heads);
  if (BW == 0) return;
  int hd = C / heads;
  size_t smem = backward_smem_bytes(N, hd);
  SWIN_DISPATCH(dt, T, {
    auto kernel = window_attention_backward_kernel<T>;
    allow_smem(kernel, smem);
    kernel<<<(unsigned)((int64_t)BW * heads), kThreads, smem, stream>>>(
        static_cast<T *>(dqkv), scratch, static_cast<const T *>(dout), static_cast<const T *>(qkv),
        att, N, C, heads, attention_scale(hd));
  });
  CUDA_CHECK_LAUNCH();

  // Window sums of dS per (h, i, j): 32 elements per block.
  int64_t E = (int64_t)heads * N * N;
  unsigned sum_blocks = (unsigned)((E + 31) / 32);
  attention_ds_window_sum_kernel<<<sum_blocks, dim3(32, kSumRows), 0, stream>>>(scratch, BW, E);
  CUDA_CHECK_LAUNCH();

  // One warp per (table row, head) up to the row bound.
  int rows_bound = table_rows_bound(N);
  const int table_block = 256;
  unsigned table_blocks =
      (unsigned)(((int64_t)rows_bound * heads * 32 + table_block - 1) / table_block);
  attention_dtable_kernel<<<table_blocks, table_block, 0, stream>>>(dtable, scratch, index, N,
                                                                    heads, rows_bound);
  CUDA_CHECK_LAUNCH();
}
