// attention.cu: CUDA windowed multi-head self-attention with relative position bias and shift
// mask, forward and backward (kernels/attention.h), for f32, bf16 and f16 q, k, v and outputs
// (loaded into f32 shared memory; softmax and products in f32); kernels/cpu/attention.c is the
// spec.
//
// The SIMT kernels (f32, and what the tensor-core kernels below do not serve) run one thread
// block per (window, head) pair p = b * heads + h on a 1-D grid (gridDim.y/z stop
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

#include <type_traits>

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

// ---- tensor-core path (bf16 / f16) --------------------------------------------------------------
// One (window, head) is at most 64 tokens: 4 warps each own 16 query rows of the 64-row padded
// tile (the padding lives in shared memory and registers only, never in global memory). Products
// are mma.sync.m16n8k16 with f32 accumulation. Fragment layouts (PTX ISA, m16n8k16, 16-bit A/B),
// with g = lane / 4 and t = lane % 4:
//   A 16x16: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8 (k x n): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C 16x8: c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
// Each 32-bit operand register holds two consecutive k, so every operand is read from a
// shared-memory row in which k runs contiguously: Q, K, V, dO row-major (token, channel), and
// transposed copies (channel, token) where a product runs over tokens. Rows are padded by 8
// elements (16 bytes), which spreads the 8 row groups g of a warp over distinct banks.
//
// Forward (flash-style): S = q k^T * scale + bias + mask in registers, softmax in registers, the
// row's log-sum-exp saved (N floats per window and head instead of N x N probabilities), then
// O = P v with P rounded to the element type as the A operand. Backward recomputes S and P from q,
// k and the saved log-sum-exp; dP = dO v^T; dS = P (dP - rowsum(P dP)); dq = dS k * scale from
// registers; dk = dS^T q * scale and dv = P^T dO through transposed tiles of dS and P in shared
// memory. The bias-table gradient needs dS summed over windows: each block takes a fixed,
// strided set of windows of one head and sums their dS in registers (each (i, j) has one owner
// thread), then the block totals are reduced in a fixed order as in the SIMT path.
//
// Both kernels run one wave of blocks: block (group, h) serves head h of windows group, group +
// groups, ..., so the head's bias matrix, gathered through the index once, and, when groups is a
// multiple of nW, the block's one mask, sit in shared memory for all its windows.
constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = 64;          // padded tokens of a window
constexpr int kTcLdT = kTcRows + 8;  // row length of the transposed (channel, token) tiles
// About this many (head, window group) blocks in the backward: one full wave on the H200 (132
// SMs x 3 resident blocks, limited by 130 registers per thread and ~62 KB of shared memory);
// 1024 blocks ran 2.6 waves, the last a third full (Nsight Compute). A constant, so that the
// partition, and with it dtable's summation order, depends on the shapes only.
constexpr int kTcBackwardBlocks = 396;
// The forward's: 7 resident per SM (66 registers per thread, ~26 KB of shared memory), one wave.
constexpr int kTcForwardBlocks = 924;

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two consecutive 16-bit elements of a shared-memory row (even index: 4-byte aligned).
template <typename T>
__device__ __forceinline__ uint32_t ld2(const T *p) {
  return *reinterpret_cast<const uint32_t *>(p);
}

// The A operand of rows r0.. of a row-major tile with row length ld, k from kk.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T *tile, int ld, int r0, int kk,
                                       int g, int t) {
  a[0] = ld2(tile + (r0 + g) * ld + kk + 2 * t);
  a[1] = ld2(tile + (r0 + g + 8) * ld + kk + 2 * t);
  a[2] = ld2(tile + (r0 + g) * ld + kk + 2 * t + 8);
  a[3] = ld2(tile + (r0 + g + 8) * ld + kk + 2 * t + 8);
}

// The A operand from a 16 x 64 f32 accumulator tile held as 8 n-tiles (k-step q covers n-tiles
// 2q and 2q + 1), rounded to T: the C layout of two n-tiles is the A layout of one k-step.
template <typename T>
__device__ __forceinline__ void a_from_acc(uint32_t (&a)[4], const float (&acc)[8][4], int q) {
  a[0] = pack2<T>(acc[2 * q][0], acc[2 * q][1]);
  a[1] = pack2<T>(acc[2 * q][2], acc[2 * q][3]);
  a[2] = pack2<T>(acc[2 * q + 1][0], acc[2 * q + 1][1]);
  a[3] = pack2<T>(acc[2 * q + 1][2], acc[2 * q + 1][3]);
}

// S (16 rows of this warp x 64 keys) = q k^T * scale + bias + mask for valid (i, j); -inf for
// padded keys, 0 for padded rows (never stored). The bias is head h's (N, N) matrix bias_s when
// given (shared memory), else gathered from table through index.
template <typename T, int HD>
__device__ __forceinline__ void tc_scores(float (&S)[8][4], const T *Qs, const T *Ks, int ld,
                                          int r0, int g, int t, int N, int heads, int h,
                                          const float *bias_s, const float *__restrict__ table,
                                          const int *__restrict__ index,
                                          const float *__restrict__ mask_w, float scale) {
#pragma unroll
  for (int nt = 0; nt < 8; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) S[nt][c] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD; kk += 16) {
    uint32_t a[4];
    load_a(a, Qs, ld, r0, kk, g, t);
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
      const T *krow = Ks + (nt * 8 + g) * ld + kk + 2 * t;
      mma16816<T>(S[nt], a, ld2(krow), ld2(krow + 8));
    }
  }
#pragma unroll
  for (int nt = 0; nt < 8; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int i = r0 + g + (c >= 2 ? 8 : 0), j = nt * 8 + 2 * t + (c & 1);
      float s;
      if (j >= N)
        s = -INFINITY;
      else if (i >= N)
        s = 0.0f;
      else {
        float bias = bias_s ? bias_s[i * N + j] : table[index[i * N + j] * heads + h];
        s = S[nt][c] * scale + bias;
        if (mask_w) s += mask_w[i * N + j];
      }
      S[nt][c] = s;
    }
}

// Loads the (window b, head h) slices of q, k, v (and dO) into the padded tiles, 16 bytes (8
// elements) per access; rows >= N are zero. Transposed copies where asked (non-null). The
// slices start at 16-byte boundaries: C and HD are multiples of 16 elements and the tensors
// 16-byte aligned (checked by the launcher).
template <typename T, int HD>
__device__ __forceinline__ void tc_load(const T *__restrict__ qkv, const T *__restrict__ dout,
                                        int64_t b, int h, int N, int C, T *Qs, T *Ks, T *Vs, T *dOs,
                                        T *Qt, T *Kt, T *Vt, T *dOt, int ld) {
  constexpr int V = 8, kChunks = HD / V;
  for (int e = threadIdx.x; e < kTcRows * kChunks; e += blockDim.x) {
    int i = e / kChunks, d = (e % kChunks) * V;
    int4 q = make_int4(0, 0, 0, 0), k = q, v = q, o = q;
    if (i < N) {
      const T *row = qkv + (b * N + i) * 3 * C + h * HD + d;
      q = *reinterpret_cast<const int4 *>(row);
      k = *reinterpret_cast<const int4 *>(row + C);
      v = *reinterpret_cast<const int4 *>(row + 2 * C);
      if (dout) o = *reinterpret_cast<const int4 *>(dout + (b * N + i) * C + h * HD + d);
    }
    *reinterpret_cast<int4 *>(Qs + i * ld + d) = q;
    *reinterpret_cast<int4 *>(Ks + i * ld + d) = k;
    if (Vs) *reinterpret_cast<int4 *>(Vs + i * ld + d) = v;
    if (dOs) *reinterpret_cast<int4 *>(dOs + i * ld + d) = o;
    const T *qe = reinterpret_cast<const T *>(&q), *ke = reinterpret_cast<const T *>(&k);
    const T *ve = reinterpret_cast<const T *>(&v), *oe = reinterpret_cast<const T *>(&o);
#pragma unroll
    for (int u = 0; u < V; u++) {
      if (Qt) Qt[(d + u) * kTcLdT + i] = qe[u];
      if (Kt) Kt[(d + u) * kTcLdT + i] = ke[u];
      if (Vt) Vt[(d + u) * kTcLdT + i] = ve[u];
      if (dOt) dOt[(d + u) * kTcLdT + i] = oe[u];
    }
  }
}

// The bias matrix of head h (N, N) into bias_s, plus the mask of window type group % nW when
// every window a block meets has that type (groups a multiple of nW): built once per block
// instead of gathered per window (the mask's gathers alone cost a third of the time of a shifted
// backward). bias + mask is then added to the scores as one term: s * scale + (bias + mask)
// differs from (s * scale + bias) + mask only in the masked entries, whose probabilities are
// below 1e-40 either way. Returns whether the mask is in bias_s. The caller's barrier publishes
// bias_s.
__device__ __forceinline__ bool tc_block_bias(float *bias_s, const float *__restrict__ table,
                                              const int *__restrict__ index,
                                              const float *__restrict__ mask, int N, int nW,
                                              int heads, int h, int group, int groups) {
  const bool fixed_mask = mask && groups % nW == 0;
  const float *block_mask = fixed_mask ? mask + (int64_t)(group % nW) * N * N : nullptr;
  for (int e = threadIdx.x; e < N * N; e += blockDim.x)
    bias_s[e] = table[index[e] * heads + h] + (block_mask ? block_mask[e] : 0.0f);
  return fixed_mask;
}

// Block (group, h) serves head h of windows group, group + groups, ... (tc_groups).
template <typename T, int HD>
__global__ void __launch_bounds__(kTcThreads)
    window_attention_forward_tc_kernel(T *__restrict__ out, float *__restrict__ lse,
                                       const T *__restrict__ qkv, const float *__restrict__ table,
                                       const int *__restrict__ index,
                                       const float *__restrict__ mask, int BW, int nW, int N, int C,
                                       int heads, int groups, float scale) {
  constexpr int ld = HD + 8;
  extern __shared__ float4 attention_smem[];
  T *Qs = reinterpret_cast<T *>(attention_smem);
  T *Ks = Qs + kTcRows * ld;
  T *Vt = Ks + kTcRows * ld;                                    // (HD, kTcLdT)
  float *bias_s = reinterpret_cast<float *>(Vt + HD * kTcLdT);  // (N, N)
  const int h = blockIdx.x % heads, group = blockIdx.x / heads;
  const bool fixed_mask = tc_block_bias(bias_s, table, index, mask, N, nW, heads, h, group, groups);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16;

  for (int64_t b = group; b < BW; b += groups) {
    __syncthreads();  // the previous window's tiles are no longer read
    tc_load<T, HD>(qkv, nullptr, b, h, N, C, Qs, Ks, nullptr, nullptr, nullptr, nullptr, Vt,
                   nullptr, ld);
    __syncthreads();
    const int64_t p = b * heads + h;
    const float *mask_w = mask && !fixed_mask ? mask + (b % nW) * N * N : nullptr;
    float S[8][4];
    tc_scores<T, HD>(S, Qs, Ks, ld, r0, g, t, N, heads, h, bias_s, table, index, mask_w, scale);

    // Softmax over each row: a row's 64 values sit in the 4 threads of a quad.
    float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) mx[c >> 1] = fmaxf(mx[c >> 1], S[nt][c]);
#pragma unroll
    for (int r = 0; r < 2; r++)
      for (int o = 1; o < 4; o <<= 1) mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], o));
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        S[nt][c] = expf(S[nt][c] - mx[c >> 1]);  // exp(-inf) = 0 for padded keys
        sum[c >> 1] += S[nt][c];
      }
#pragma unroll
    for (int r = 0; r < 2; r++)
      for (int o = 1; o < 4; o <<= 1) sum[r] += __shfl_xor_sync(kFullMask, sum[r], o);
    const float inv[2] = {1.0f / sum[0], 1.0f / sum[1]};
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) S[nt][c] *= inv[c >> 1];
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < 2; r++) {
        int i = r0 + g + 8 * r;
        if (i < N) lse[p * N + i] = mx[r] + logf(sum[r]);
      }
    }

    // O = P v: 4 k-steps over the 64 keys, HD / 8 n-tiles of channels.
    float O[HD / 8][4];
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
      for (int c = 0; c < 4; c++) O[nd][c] = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
      uint32_t a[4];
      a_from_acc<T>(a, S, q);
#pragma unroll
      for (int nd = 0; nd < HD / 8; nd++) {
        const T *vrow = Vt + (nd * 8 + g) * kTcLdT + q * 16 + 2 * t;
        mma16816<T>(O[nd], a, ld2(vrow), ld2(vrow + 8));
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      int i = r0 + g + 8 * r;
      if (i >= N) continue;
      T *orow = out + (b * N + i) * C + h * HD + 2 * t;
#pragma unroll
      for (int nd = 0; nd < HD / 8; nd++)
        *reinterpret_cast<uint32_t *>(orow + nd * 8) = pack2<T>(O[nd][2 * r], O[nd][2 * r + 1]);
    }
  }
}

// Stores a 16-row accumulator tile (rows r0.. of this warp, HD channels) times `mul` into part
// `part` (0 q, 1 k, 2 v) of dqkv, rows < N.
template <typename T, int HD>
__device__ __forceinline__ void tc_store_rows(T *__restrict__ dqkv, const float (&acc)[HD / 8][4],
                                              int64_t b, int h, int N, int C, int part, int r0,
                                              int g, int t, float mul) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    int i = r0 + g + 8 * r;
    if (i >= N) continue;
    T *row = dqkv + (b * N + i) * 3 * C + part * C + h * HD + 2 * t;
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
      *reinterpret_cast<uint32_t *>(row + nd * 8) =
          pack2<T>(acc[nd][2 * r] * mul, acc[nd][2 * r + 1] * mul);
  }
}

template <typename T, int HD>
__global__ void __launch_bounds__(kTcThreads)
    window_attention_backward_tc_kernel(T *__restrict__ dqkv, float *__restrict__ ds_partial,
                                        const T *__restrict__ dout, const T *__restrict__ qkv,
                                        const float *__restrict__ lse,
                                        const float *__restrict__ table,
                                        const int *__restrict__ index,
                                        const float *__restrict__ mask, int BW, int nW, int N,
                                        int C, int heads, int groups, float scale) {
  constexpr int ld = HD + 8;
  extern __shared__ float4 attention_smem[];
  T *Qs = reinterpret_cast<T *>(attention_smem);
  T *Ks = Qs + kTcRows * ld;
  T *Vs = Ks + kTcRows * ld;
  T *dOs = Vs + kTcRows * ld;
  T *Qt = dOs + kTcRows * ld;  // (HD, kTcLdT) each
  T *Kt = Qt + HD * kTcLdT;
  T *dOt = Kt + HD * kTcLdT;
  T *Pt = dOt + HD * kTcLdT;  // (64, kTcLdT) each: P^T and dS^T
  T *dSt = Pt + kTcRows * kTcLdT;
  float *bias_s = reinterpret_cast<float *>(dSt + kTcRows * kTcLdT);  // (N, N)
  const int h = blockIdx.x % heads, group = blockIdx.x / heads;
  const bool fixed_mask = tc_block_bias(bias_s, table, index, mask, N, nW, heads, h, group, groups);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16;

  float dT[8][4];  // sum over this block's windows of dS at this thread's (i, j)
#pragma unroll
  for (int nt = 0; nt < 8; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) dT[nt][c] = 0.0f;

  for (int64_t b = group; b < BW; b += groups) {
    __syncthreads();  // the previous window's tiles are no longer read
    tc_load<T, HD>(qkv, dout, b, h, N, C, Qs, Ks, Vs, dOs, Qt, Kt, nullptr, dOt, ld);
    __syncthreads();
    const int64_t p = b * heads + h;
    const float *mask_w = mask && !fixed_mask ? mask + (b % nW) * N * N : nullptr;

    // P from the recomputed scores and the saved log-sum-exp (0 outside the N x N window).
    float P[8][4];
    tc_scores<T, HD>(P, Qs, Ks, ld, r0, g, t, N, heads, h, bias_s, table, index, mask_w, scale);
    float row_lse[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      int i = r0 + g + 8 * r;
      row_lse[r] = i < N ? lse[p * N + i] : 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        int i = r0 + g + (c >= 2 ? 8 : 0), j = nt * 8 + 2 * t + (c & 1);
        P[nt][c] = i < N && j < N ? expf(P[nt][c] - row_lse[c >> 1]) : 0.0f;
      }

    // dP = dO v^T.
    float dS[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) dS[nt][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD; kk += 16) {
      uint32_t a[4];
      load_a(a, dOs, ld, r0, kk, g, t);
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const T *vrow = Vs + (nt * 8 + g) * ld + kk + 2 * t;
        mma16816<T>(dS[nt], a, ld2(vrow), ld2(vrow + 8));
      }
    }
    // dS = P (dP - rowsum(P dP)).
    float dot[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) dot[c >> 1] += P[nt][c] * dS[nt][c];
#pragma unroll
    for (int r = 0; r < 2; r++)
      for (int o = 1; o < 4; o <<= 1) dot[r] += __shfl_xor_sync(kFullMask, dot[r], o);
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        dS[nt][c] = P[nt][c] * (dS[nt][c] - dot[c >> 1]);
        dT[nt][c] += dS[nt][c];
        int i = r0 + g + (c >= 2 ? 8 : 0), j = nt * 8 + 2 * t + (c & 1);
        Pt[j * kTcLdT + i] = from_float<T>(P[nt][c]);
        dSt[j * kTcLdT + i] = from_float<T>(dS[nt][c]);
      }

    // dq = dS k * scale, from registers.
    {
      float acc[HD / 8][4];
#pragma unroll
      for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[nd][c] = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; q++) {
        uint32_t a[4];
        a_from_acc<T>(a, dS, q);
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++) {
          const T *krow = Kt + (nd * 8 + g) * kTcLdT + q * 16 + 2 * t;
          mma16816<T>(acc[nd], a, ld2(krow), ld2(krow + 8));
        }
      }
      tc_store_rows<T, HD>(dqkv, acc, b, h, N, C, 0, r0, g, t, scale);
    }
    __syncthreads();  // P^T and dS^T complete

    // dk = dS^T q * scale and dv = P^T dO, for the 16 keys r0.. of this warp.
    {
      float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
      for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
        for (int c = 0; c < 4; c++) dk[nd][c] = dv[nd][c] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kTcRows; kk += 16) {
        uint32_t as[4], ap[4];
        load_a(as, dSt, kTcLdT, r0, kk, g, t);
        load_a(ap, Pt, kTcLdT, r0, kk, g, t);
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++) {
          const T *qrow = Qt + (nd * 8 + g) * kTcLdT + kk + 2 * t;
          const T *orow = dOt + (nd * 8 + g) * kTcLdT + kk + 2 * t;
          mma16816<T>(dk[nd], as, ld2(qrow), ld2(qrow + 8));
          mma16816<T>(dv[nd], ap, ld2(orow), ld2(orow + 8));
        }
      }
      tc_store_rows<T, HD>(dqkv, dk, b, h, N, C, 1, r0, g, t, scale);
      tc_store_rows<T, HD>(dqkv, dv, b, h, N, C, 2, r0, g, t, 1.0f);
    }
  }

  // This block's window sum of dS, at (group, h, i, j) of ds_partial (groups, heads, N, N).
  float *part = ds_partial + ((int64_t)group * heads + h) * N * N;
#pragma unroll
  for (int nt = 0; nt < 8; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int i = r0 + g + (c >= 2 ? 8 : 0), j = nt * 8 + 2 * t + (c & 1);
      if (i < N && j < N) part[i * N + j] = dT[nt][c];
    }
}

size_t tc_forward_smem(int hd, int N) {
  return sizeof(uint16_t) * ((size_t)2 * kTcRows * (hd + 8) + (size_t)hd * kTcLdT) +
         sizeof(float) * (size_t)N * N;
}
size_t tc_backward_smem(int hd, int N) {
  return sizeof(uint16_t) * ((size_t)4 * kTcRows * (hd + 8) + (size_t)3 * hd * kTcLdT +
                             (size_t)2 * kTcRows * kTcLdT) +
         sizeof(float) * (size_t)N * N;
}

// The (head, window group) split of a kernel that runs about `blocks` blocks: a function of the
// shapes only. A multiple of nW where it can be (BW = B nW is one), so that each block meets
// one window type (one mask).
int tc_groups(int blocks, int BW, int heads, int nW) {
  int groups = blocks / heads;
  if (groups < 1) groups = 1;
  if (nW > 1 && groups >= nW) groups -= groups % nW;
  return groups < BW ? groups : BW;
}

// Runs F<HD> for the head widths the tensor-core kernels are built for.
template <typename F>
void with_head_dim(int hd, F f) {
  switch (hd) {
    case 16:
      f(std::integral_constant<int, 16>{});
      break;
    case 32:
      f(std::integral_constant<int, 32>{});
      break;
    case 64:
      f(std::integral_constant<int, 64>{});
      break;
    default:
      fprintf(stderr, "window attention: no tensor-core kernel for head_dim %d\n", hd);
      abort();
  }
}

}  // namespace

// The tensor-core kernels read and write q, k, v and the outputs 16 bytes at a time.
static void check_tc_alignment(const char *fn, const void *a, const void *b) {
  if (aligned16(a) && (!b || aligned16(b))) return;
  fprintf(stderr, "%s: tensors must be 16-byte aligned for the tensor-core path (%p, %p)\n", fn, a,
          b);
  abort();
}

// The tensor-core kernels serve bf16 and f16 with head_dim 16, 32 or 64 and windows of at most
// 64 tokens (Swin: 49 tokens, head_dim 32); everything else takes the SIMT kernels.
static bool use_tensor_cores(DType dt, int N, int hd) {
  return dt != DTYPE_F32 && N <= kTcRows && (hd == 16 || hd == 32 || hd == 64);
}

int64_t window_attention_saved_floats(DType dt, int BW, int N, int C, int heads) {
  int hd = heads > 0 ? C / heads : 0;
  if (use_tensor_cores(dt, N, hd)) return (int64_t)BW * heads * N;  // log-sum-exp per row
  return (int64_t)BW * heads * N * N;                               // the probabilities
}

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
  if (use_tensor_cores(dt, N, hd)) {
    check_tc_alignment("window_attention_forward_cuda", qkv, out);
    size_t smem = tc_forward_smem(hd, N);
    int groups = tc_groups(kTcForwardBlocks, BW, heads, mask ? nW : 1);
    SWIN_DISPATCH(dt, T, {
      if constexpr (sizeof(T) == 2) {
        with_head_dim(hd, [&](auto HD) {
          auto kernel = window_attention_forward_tc_kernel<T, decltype(HD)::value>;
          allow_smem(kernel, smem);
          kernel<<<(unsigned)(groups * heads), kTcThreads, smem, stream>>>(
              static_cast<T *>(out), att, static_cast<const T *>(qkv), table, index, mask, BW, nW,
              N, C, heads, groups, attention_scale(hd));
        });
      }
    });
    CUDA_CHECK_LAUNCH();
    return;
  }
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

int64_t window_attention_backward_cuda_scratch(DType dt, int BW, int N, int C, int heads) {
  int hd = heads > 0 ? C / heads : 0;
  // nW = 1: the most groups any nW gives
  if (use_tensor_cores(dt, N, hd))
    return (int64_t)tc_groups(kTcBackwardBlocks, BW, heads, 1) * heads * N * N;
  return (int64_t)BW * heads * N * N;
}

void window_attention_backward_cuda(DType dt, void *dqkv, float *dtable, const void *dout,
                                    const void *qkv, float *att, const float *table,
                                    const int *index, const float *mask, int BW, int nW, int N,
                                    int C, int heads, float *scratch, cudaStream_t stream) {
  check_limits("window_attention_backward_cuda", BW, N, C, heads);
  if (BW == 0) return;
  int hd = C / heads;
  bool tc = use_tensor_cores(dt, N, hd);
  if (!scratch) scratch = att;  // the SIMT path may overwrite the probabilities
  // Partial window sums of dS: (rows, E) with E = heads * N * N.
  int64_t rows = BW;
  if (tc) {
    check_tc_alignment("window_attention_backward_cuda", qkv, dout);
    check_tc_alignment("window_attention_backward_cuda", dqkv, nullptr);
    int groups = tc_groups(kTcBackwardBlocks, BW, heads, mask ? nW : 1);
    rows = groups;
    size_t smem = tc_backward_smem(hd, N);
    SWIN_DISPATCH(dt, T, {
      if constexpr (sizeof(T) == 2) {
        with_head_dim(hd, [&](auto HD) {
          auto kernel = window_attention_backward_tc_kernel<T, decltype(HD)::value>;
          allow_smem(kernel, smem);
          kernel<<<(unsigned)(groups * heads), kTcThreads, smem, stream>>>(
              static_cast<T *>(dqkv), scratch, static_cast<const T *>(dout),
              static_cast<const T *>(qkv), att, table, index, mask, BW, nW, N, C, heads, groups,
              attention_scale(hd));
        });
      }
    });
  } else {
    size_t smem = backward_smem_bytes(N, hd);
    SWIN_DISPATCH(dt, T, {
      auto kernel = window_attention_backward_kernel<T>;
      allow_smem(kernel, smem);
      kernel<<<(unsigned)((int64_t)BW * heads), kThreads, smem, stream>>>(
          static_cast<T *>(dqkv), scratch, static_cast<const T *>(dout),
          static_cast<const T *>(qkv), att, N, C, heads, attention_scale(hd));
    });
  }
  CUDA_CHECK_LAUNCH();

  // Sums of dS over the rows (windows, or the tensor-core path's window groups) per (h, i, j):
  // 32 elements per block.
  int64_t E = (int64_t)heads * N * N;
  unsigned sum_blocks = (unsigned)((E + 31) / 32);
  attention_ds_window_sum_kernel<<<sum_blocks, dim3(32, kSumRows), 0, stream>>>(scratch, rows, E);
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
