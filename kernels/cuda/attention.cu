// attention.cu: CUDA windowed multi-head self-attention with relative position bias and shift
// mask, forward and backward (kernels/attention.h), for f32, bf16 and f16 q, k, v and outputs;
// kernels/cpu/attention.c is the spec. Two strategies: SIMT kernels that load the tiles into f32
// shared memory (softmax and products in f32), and for bf16 and f16 tensor-core kernels that keep
// the tiles in their element type (mma.sync products with f32 accumulation, softmax in f32).
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
#include "kernels/gemm.h"
#include "src/base/cuda_util.h"

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

// dtable[t][h] += sum of ds_sum[h][i][j] over the (i, j) with index[i][j] == t. Block (chunk,
// h) stages index and head h's N * N sums in shared memory (2 x N * N words), then its warp w
// takes t = chunk * kTableRowsPerBlock + w < rows_bound: lane l sums the entries l, l + 32, ...
// of its row in order, then a fixed butterfly adds the lanes. (A warp per (t, h) reading
// global memory spent ~13 us per call on these 169 x 2401 compares.) A warp whose t appears
// nowhere in index writes nothing, so only rows max(index) + 1 of dtable are touched.
constexpr int kTableRowsPerBlock = 8;

__global__ void __launch_bounds__(kTableRowsPerBlock * 32)
    attention_dtable_kernel(float *__restrict__ dtable, const float *__restrict__ ds_sum,
                            const int *__restrict__ index, int N, int heads, int rows_bound) {
  extern __shared__ int table_smem[];
  const int NN = N * N, h = blockIdx.y;
  int *idx = table_smem;
  float *ds_h = reinterpret_cast<float *>(table_smem + NN);
  for (int e = threadIdx.x; e < NN; e += blockDim.x) {
    idx[e] = index[e];
    ds_h[e] = ds_sum[(int64_t)h * NN + e];
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int t = blockIdx.x * kTableRowsPerBlock + threadIdx.x / 32;
  if (t >= rows_bound) return;  // whole warps, after the block's only barrier
  double s = 0.0;
  int hits = 0;
  for (int e = lane; e < NN; e += 32)
    if (idx[e] == t) {
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
// are mma.sync.m16n8k16 with f32 accumulation (fragment layouts: kernels/cuda/common.cuh).
// Every tile lives in shared memory row-major (token, channel) as it lies in global memory, and
// the operands come from ldmatrix: plain where the product runs over channels (q k^T, dO v^T),
// .trans where it runs over tokens (P v, dS k, dS^T q, P^T dO). Rows are padded by 8 elements
// (16 bytes), so the 8 row addresses of an 8x8 matrix fall in distinct banks.
//
// Scores carry a factor log2(e): s2 = (q . k) * scale * log2(e) + (bias + mask) * log2(e), so the
// softmax is exp2 (one MUFU.EX2, ex2.approx, relative error ~2^-22) and the saved row statistic is
// the base-2 log-sum-exp. The key dimension is KT n-tiles of 8: 7 (56 keys) when N <= 56, as
// Swin's 49-token windows, where the eighth n-tile of a 64-key tile would be padding only; else 8.
// The head's bias (+ the block's mask) is kept in shared memory in fragment order, pre-multiplied
// by log2(e), with -inf in the padded key columns and 0 in the padded query rows, so each thread
// fetches its 28 bias values for a window as 7 16-byte loads and no index arithmetic or bounds test
// remains in the per-element work.
//
// Forward (flash-style): S in registers, softmax in registers (the exponentials unnormalized; the
// output row is scaled by 1 / sum at the end), the row's log-sum-exp saved (N floats per window
// and head instead of N x N probabilities), O = P v with P rounded to the element type as the A
// operand. Backward recomputes P from q, k and the saved log-sum-exp; dP = dO v^T;
// dS = P (dP - rowsum(P dP)); dq = dS k * scale from registers; dk = dS^T q * scale and
// dv = P^T dO through row-major tiles of dS and P in shared memory. The bias-table gradient needs
// dS summed over windows: each block takes a fixed, strided set of windows of one head and sums
// their dS in registers (each (i, j) has one owner thread), then the block totals are reduced in
// a fixed order as in the SIMT path.
//
// Both kernels run one wave of blocks: block (group, h) serves head h of windows group, group +
// groups, ..., so the head's bias and, when groups is a multiple of nW, the block's one mask are
// built once per block. The next window's q, k, v (and dO) are copied into a second set of tiles
// with cp.async while the block computes the current one.
constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = 64;          // padded tokens of a window (query rows, key rows)
constexpr int kTcLdP = kTcRows + 8;  // row length of the P and dS tiles (token, token)
constexpr float kLog2e = 1.4426950408889634f;
// Blocks per launch, one full wave of the device (396 and 660 on the H200's 132 SMs): the
// backward's 72 KB of shared memory (HD 32) per 128-thread block leave 3 resident per SM, the
// forward's 44 KB 5; the register bounds below keep registers from lowering that. Fixed per
// device, so that the partition, and with it dtable's summation order, depend on the shapes and
// the SM count only; the backward's at most WINDOW_ATTENTION_CUDA_MAX_BLOCKS (its scratch bound).
constexpr int kTcBackwardBlocksPerSm = 3, kTcForwardBlocksPerSm = 5;
int tc_backward_blocks() {
  int blocks = device_sm_count() * kTcBackwardBlocksPerSm;
  return blocks < WINDOW_ATTENTION_CUDA_MAX_BLOCKS ? blocks : WINDOW_ATTENTION_CUDA_MAX_BLOCKS;
}
int tc_forward_blocks() {
  return device_sm_count() * kTcForwardBlocksPerSm;
}
static_assert(kTcWarps * 3 * WINDOW_ATTENTION_CUDA_MAX_HEAD_DIM * sizeof(float) <=
                  kTcRows * kTcLdP * sizeof(uint16_t),
              "the backward's per-warp qkv bias sums fit in its P tile");

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The A operand of k-step q (keys 16q..16q+15) from a 16 x 8KT accumulator tile (KT n-tiles),
// rounded to T: the C layout of two n-tiles is the A layout of one k-step; keys 8KT.. are zero.
template <typename T, int KT>
__device__ __forceinline__ void a_from_acc(uint32_t (&a)[4], const float (&acc)[KT][4], int q) {
  a[0] = pack2<T>(acc[2 * q][0], acc[2 * q][1]);
  a[1] = pack2<T>(acc[2 * q][2], acc[2 * q][3]);
  if (2 * q + 1 < KT) {
    a[2] = pack2<T>(acc[2 * q + 1][0], acc[2 * q + 1][1]);
    a[3] = pack2<T>(acc[2 * q + 1][2], acc[2 * q + 1][3]);
  } else {
    a[2] = a[3] = 0u;
  }
}

// S2 (16 rows of this warp x 8KT keys) = q k^T * scale * log2(e) + the bias fragments (bias +
// mask, times log2(e); -inf in padded keys). mask_w (a per-window mask when the block's windows
// have several types, else NULL) is added in its own pass.
template <typename T, int HD, int KT>
__device__ __forceinline__ void tc_scores(float (&S)[KT][4], const T *Qs, const T *Ks,
                                          const float4 *bias_frag, int r0, int lane, int N,
                                          const float *__restrict__ mask_w, float scale2) {
  constexpr int LD = HD + 8;
#pragma unroll
  for (int nt = 0; nt < KT; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) S[nt][c] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD; kk += 16) {
    uint32_t a[4];
    a_rows<LD>(a, Qs, r0, kk, lane);
#pragma unroll
    for (int np = 0; np < (KT + 1) / 2; np++) {  // pairs of n-tiles
      uint32_t b[4];
      b_rows<LD>(b, Ks, np * 16, kk, lane);
      mma16816<T>(S[2 * np], a, b[0], b[1]);
      if (2 * np + 1 < KT) mma16816<T>(S[2 * np + 1], a, b[2], b[3]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < KT; nt++) {
    const float4 bias = bias_frag[nt * 32 + lane];
    S[nt][0] = fmaf(S[nt][0], scale2, bias.x);
    S[nt][1] = fmaf(S[nt][1], scale2, bias.y);
    S[nt][2] = fmaf(S[nt][2], scale2, bias.z);
    S[nt][3] = fmaf(S[nt][3], scale2, bias.w);
  }
  if (mask_w) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < KT; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        int i = r0 + g + (c >= 2 ? 8 : 0), j = nt * 8 + 2 * t + (c & 1);
        if (i < N && j < N) S[nt][c] += mask_w[i * N + j] * kLog2e;
      }
  }
}

// The bias fragments of head h, (kTcWarps, KT, 32) float4 in the order tc_scores reads
// them: (table[index[i][j]][h] + mask[i][j]) * log2(e) at the (i, j) of each fragment element,
// -inf for keys j >= N, 0 for query rows i >= N (never stored). mask is the block's one mask or
// NULL. The caller's barrier publishes it.
template <int KT>
__device__ __forceinline__ void tc_bias_fragments(float4 *frag, const float *__restrict__ table,
                                                  const int *__restrict__ index,
                                                  const float *__restrict__ mask, int N, int heads,
                                                  int h) {
  for (int e = threadIdx.x; e < kTcWarps * KT * 32; e += blockDim.x) {
    const int lane = e % 32, nt = e / 32 % KT, w = e / (32 * KT);
    const int g = lane / 4, t = lane % 4;
    float v[4];
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int i = w * 16 + g + (c >= 2 ? 8 : 0), j = nt * 8 + 2 * t + (c & 1);
      if (j >= N)
        v[c] = -INFINITY;
      else if (i >= N)
        v[c] = 0.0f;
      else
        v[c] = (table[index[i * N + j] * heads + h] + (mask ? mask[i * N + j] : 0.0f)) * kLog2e;
    }
    frag[e] = make_float4(v[0], v[1], v[2], v[3]);
  }
}

// Starts the copies of window b's q, k, v (and dO) rows of head h into the tiles (rows < N; the
// padded rows keep the zeros written at the block's start). 16 bytes per copy: C and HD are
// multiples of 8 elements and the tensors 16-byte aligned (checked by the launcher).
template <typename T, int HD>
__device__ __forceinline__ void tc_prefetch(const T *__restrict__ qkv, const T *__restrict__ dout,
                                            int64_t b, int h, int N, int C, T *Qs, T *Ks, T *Vs,
                                            T *dOs) {
  constexpr int LD = HD + 8, V = 8, kChunks = HD / V;
  const int parts = dout ? 4 : 3;
  for (int e = threadIdx.x; e < N * kChunks * parts; e += blockDim.x) {
    const int part = e / (N * kChunks), r = e % (N * kChunks), i = r / kChunks, d = r % kChunks * V;
    const int64_t row = b * N + i;
    if (part < 3) {
      T *tile = part == 0 ? Qs : part == 1 ? Ks : Vs;
      cp_async16(tile + i * LD + d, qkv + row * 3 * C + part * C + h * HD + d);
    } else {
      cp_async16(dOs + i * LD + d, dout + row * C + h * HD + d);
    }
  }
  cp_async_commit();
}

// Zeros n elements of shared memory (a multiple of 8), 16 bytes per store.
template <typename T>
__device__ __forceinline__ void tc_zero(T *p, int n) {
  for (int e = threadIdx.x * 8; e < n; e += blockDim.x * 8)
    *reinterpret_cast<int4 *>(p + e) = make_int4(0, 0, 0, 0);
}

// Block (group, h) serves head h of windows group, group + groups, ... (tc_groups).
template <typename T, int HD, int KT>
__global__ void __launch_bounds__(kTcThreads, kTcForwardBlocksPerSm)
    window_attention_forward_tc_kernel(T *__restrict__ out, float *__restrict__ lse,
                                       const T *__restrict__ qkv, const float *__restrict__ table,
                                       const int *__restrict__ index,
                                       const float *__restrict__ mask, int BW, int nW, int N, int C,
                                       int heads, int groups, float scale) {
  constexpr int LD = HD + 8, kTile = kTcRows * LD;
  extern __shared__ float4 attention_smem[];
  float4 *bias_frag = attention_smem;                                // (kTcWarps, KT, 32)
  T *tiles = reinterpret_cast<T *>(bias_frag + kTcWarps * KT * 32);  // 2 x (q, k, v)
  const int h = blockIdx.x % heads, group = blockIdx.x / heads;
  if (group >= BW) return;
  const bool fixed_mask = mask && groups % nW == 0;
  tc_bias_fragments<KT>(bias_frag, table, index,
                        fixed_mask ? mask + (int64_t)(group % nW) * N * N : nullptr, N, heads, h);
  tc_zero(tiles, 6 * kTile);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16;
  const float4 *my_bias = bias_frag + warp * KT * 32;
  const float scale2 = scale * kLog2e;

  tc_prefetch<T, HD>(qkv, nullptr, group, h, N, C, tiles, tiles + kTile, tiles + 2 * kTile,
                     nullptr);
  int buf = 0;
  for (int64_t b = group; b < BW; b += groups, buf ^= 1) {
    T *Qs = tiles + buf * 3 * kTile, *Ks = Qs + kTile, *Vs = Ks + kTile;
    if (b + groups < BW) {
      T *next = tiles + (buf ^ 1) * 3 * kTile;
      tc_prefetch<T, HD>(qkv, nullptr, b + groups, h, N, C, next, next + kTile, next + 2 * kTile,
                         nullptr);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // window b's tiles are complete
    const int64_t p = b * heads + h;
    const float *mask_w = mask && !fixed_mask ? mask + (b % nW) * N * N : nullptr;
    float S[KT][4];
    tc_scores<T, HD, KT>(S, Qs, Ks, my_bias, r0, lane, N, mask_w, scale2);

    // Softmax over each row (base 2): a row's 56 values sit in the 4 threads of a quad.
    float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < KT; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) mx[c >> 1] = fmaxf(mx[c >> 1], S[nt][c]);
#pragma unroll
    for (int r = 0; r < 2; r++)
      for (int o = 1; o < 4; o <<= 1) mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], o));
#pragma unroll
    for (int nt = 0; nt < KT; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        S[nt][c] = fast_exp2(S[nt][c] - mx[c >> 1]);  // exp2(-inf) = 0 for padded keys
        sum[c >> 1] += S[nt][c];
      }
#pragma unroll
    for (int r = 0; r < 2; r++)
      for (int o = 1; o < 4; o <<= 1) sum[r] += __shfl_xor_sync(kFullMask, sum[r], o);
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < 2; r++) {
        int i = r0 + g + 8 * r;
        if (i < N) lse[p * N + i] = mx[r] + __log2f(sum[r]);
      }
    }

    // O = P v: 4 k-steps over the keys, HD / 8 n-tiles of channels; then O / sum.
    float O[HD / 8][4];
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
      for (int c = 0; c < 4; c++) O[nd][c] = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
      uint32_t a[4];
      a_from_acc<T, KT>(a, S, q);
#pragma unroll
      for (int np = 0; np < HD / 16; np++) {
        uint32_t bv[4];
        b_cols<LD>(bv, Vs, np * 16, q * 16, lane);
        mma16816<T>(O[2 * np], a, bv[0], bv[1]);
        mma16816<T>(O[2 * np + 1], a, bv[2], bv[3]);
      }
    }
    const float inv[2] = {1.0f / sum[0], 1.0f / sum[1]};
#pragma unroll
    for (int r = 0; r < 2; r++) {
      int i = r0 + g + 8 * r;
      if (i >= N) continue;
      T *orow = out + (b * N + i) * C + h * HD + 2 * t;
#pragma unroll
      for (int nd = 0; nd < HD / 8; nd++)
        *reinterpret_cast<uint32_t *>(orow + nd * 8) =
            pack2<T>(O[nd][2 * r] * inv[r], O[nd][2 * r + 1] * inv[r]);
    }
    __syncthreads();  // every warp is done with these tiles before the next prefetch refills them
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

// Column sums of a warp's 16-row accumulator tile (acc[nd][c] at row g, + 8 for c >= 2, and
// channel nd * 8 + 2t + (c & 1)): over the lane's two rows first, then over the 8 lanes of each
// t (lane bits 4, 3, 2) by halving exchanges: at each bit a lane keeps half of its values and
// sends its partner the other half, so HD / 4 values need 7 shuffles (HD 32) instead of 3 per
// value. Afterwards out[i] is the sum of value index tc_sum_first<HD>(lane) + i of the lane's t
// (value index k: channel (k / 2) * 8 + 2t + k % 2); with HD 16 the lanes differing in bit 2
// end with the same sums.
template <int HD>
constexpr int kTcSumOut = HD / 4 >= 8 ? HD / 32 : 1;

template <int HD>
__device__ __forceinline__ int tc_sum_first(int lane) {
  constexpr int V = HD / 4;
  return ((lane >> 2) & 7) * V / 8;  // bit 4 keeps the upper half of V, bit 3 of the rest, ...
}

template <int N>
__device__ __forceinline__ void tc_halve(float *v, int lane, int bit) {
  const bool upper = lane & bit;
#pragma unroll
  for (int i = 0; i < N / 2; i++) {
    const float send = upper ? v[i] : v[i + N / 2], keep = upper ? v[i + N / 2] : v[i];
    v[i] = keep + __shfl_xor_sync(kFullMask, send, bit);
  }
}

template <int HD>
__device__ __forceinline__ void tc_column_sums(float (&out)[kTcSumOut<HD>],
                                               const float (&acc)[HD / 8][4], int lane) {
  constexpr int V = HD / 4;
  float v[V];
#pragma unroll
  for (int nd = 0; nd < HD / 8; nd++) {
    v[2 * nd] = acc[nd][0] + acc[nd][2];
    v[2 * nd + 1] = acc[nd][1] + acc[nd][3];
  }
  tc_halve<V>(v, lane, 16);
  if constexpr (V / 2 > 1)
    tc_halve<V / 2>(v, lane, 8);
  else
    v[0] += __shfl_xor_sync(kFullMask, v[0], 8);
  if constexpr (V / 4 > 1)
    tc_halve<V / 4>(v, lane, 4);
  else
    v[0] += __shfl_xor_sync(kFullMask, v[0], 4);
#pragma unroll
  for (int i = 0; i < kTcSumOut<HD>; i++) out[i] = v[i];
}

template <typename T, int HD, int KT>
__global__ void __launch_bounds__(kTcThreads, kTcBackwardBlocksPerSm)
    window_attention_backward_tc_kernel(T *__restrict__ dqkv, float *__restrict__ ds_partial,
                                        float *__restrict__ bias_partial,
                                        const T *__restrict__ dout, const T *__restrict__ qkv,
                                        const float *__restrict__ lse,
                                        const float *__restrict__ table,
                                        const int *__restrict__ index,
                                        const float *__restrict__ mask, int BW, int nW, int N,
                                        int C, int heads, int groups, float scale) {
  constexpr int LD = HD + 8, kTile = kTcRows * LD;
  extern __shared__ float4 attention_smem[];
  float4 *bias_frag = attention_smem;                             // (4, KT, 32)
  T *Ps = reinterpret_cast<T *>(bias_frag + kTcWarps * KT * 32);  // (64, kTcLdP)
  T *dSs = Ps + kTcRows * kTcLdP;                                 // (64, kTcLdP)
  T *tiles = dSs + kTcRows * kTcLdP;  // 2 x (q, k, v, dO), each (64, LD)
  const int h = blockIdx.x % heads, group = blockIdx.x / heads;
  if (group >= BW) return;
  const bool fixed_mask = mask && groups % nW == 0;
  tc_bias_fragments<KT>(bias_frag, table, index,
                        fixed_mask ? mask + (int64_t)(group % nW) * N * N : nullptr, N, heads, h);
  tc_zero(Ps, 2 * kTcRows * kTcLdP + 8 * kTile);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16;
  const float4 *my_bias = bias_frag + warp * KT * 32;
  const float scale2 = scale * kLog2e;

  float dT[KT][4];  // sum over this block's windows of dS at this thread's (i, j)
#pragma unroll
  for (int nt = 0; nt < KT; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) dT[nt][c] = 0.0f;
  // Sums over this block's windows of the q, k, v gradients' columns (before the scale of dq
  // and dk), for the qkv bias gradient: the lane's share after tc_column_sums.
  float bsum[3][kTcSumOut<HD>];
#pragma unroll
  for (int part = 0; part < 3; part++)
#pragma unroll
    for (int i = 0; i < kTcSumOut<HD>; i++) bsum[part][i] = 0.0f;
  auto add_sums = [&](int part, const float(&acc)[HD / 8][4]) {
    if (!bias_partial) return;
    float s[kTcSumOut<HD>];
    tc_column_sums<HD>(s, acc, lane);
#pragma unroll
    for (int i = 0; i < kTcSumOut<HD>; i++) bsum[part][i] += s[i];
  };

  tc_prefetch<T, HD>(qkv, dout, group, h, N, C, tiles, tiles + kTile, tiles + 2 * kTile,
                     tiles + 3 * kTile);
  int buf = 0;
  for (int64_t b = group; b < BW; b += groups, buf ^= 1) {
    T *Qs = tiles + buf * 4 * kTile, *Ks = Qs + kTile, *Vs = Ks + kTile, *dOs = Vs + kTile;
    const int64_t p = b * heads + h;
    float row_lse[2];  // +inf for padded rows: their P is 0
#pragma unroll
    for (int r = 0; r < 2; r++) {
      int i = r0 + g + 8 * r;
      row_lse[r] = i < N ? lse[p * N + i] : INFINITY;
    }
    if (b + groups < BW) {
      T *next = tiles + (buf ^ 1) * 4 * kTile;
      tc_prefetch<T, HD>(qkv, dout, b + groups, h, N, C, next, next + kTile, next + 2 * kTile,
                         next + 3 * kTile);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // window b's tiles are complete
    const float *mask_w = mask && !fixed_mask ? mask + (b % nW) * N * N : nullptr;

    // P from the recomputed scores and the saved log-sum-exp (0 outside the N x N window).
    float P[KT][4];
    tc_scores<T, HD, KT>(P, Qs, Ks, my_bias, r0, lane, N, mask_w, scale2);
#pragma unroll
    for (int nt = 0; nt < KT; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) P[nt][c] = fast_exp2(P[nt][c] - row_lse[c >> 1]);

    // dP = dO v^T.
    float dS[KT][4];
#pragma unroll
    for (int nt = 0; nt < KT; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) dS[nt][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD; kk += 16) {
      uint32_t a[4];
      a_rows<LD>(a, dOs, r0, kk, lane);
#pragma unroll
      for (int np = 0; np < (KT + 1) / 2; np++) {
        uint32_t bv[4];
        b_rows<LD>(bv, Vs, np * 16, kk, lane);
        mma16816<T>(dS[2 * np], a, bv[0], bv[1]);
        if (2 * np + 1 < KT) mma16816<T>(dS[2 * np + 1], a, bv[2], bv[3]);
      }
    }
    // dS = P (dP - rowsum(P dP)); P and dS rounded into their row-major tiles.
    float dot[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < KT; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) dot[c >> 1] += P[nt][c] * dS[nt][c];
#pragma unroll
    for (int r = 0; r < 2; r++)
      for (int o = 1; o < 4; o <<= 1) dot[r] += __shfl_xor_sync(kFullMask, dot[r], o);
#pragma unroll
    for (int nt = 0; nt < KT; nt++) {
#pragma unroll
      for (int c = 0; c < 4; c++) {
        dS[nt][c] = P[nt][c] * (dS[nt][c] - dot[c >> 1]);
        dT[nt][c] += dS[nt][c];
      }
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int off = (r0 + g + 8 * r) * kTcLdP + nt * 8 + 2 * t;
        *reinterpret_cast<uint32_t *>(Ps + off) = pack2<T>(P[nt][2 * r], P[nt][2 * r + 1]);
        *reinterpret_cast<uint32_t *>(dSs + off) = pack2<T>(dS[nt][2 * r], dS[nt][2 * r + 1]);
      }
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
        a_from_acc<T, KT>(a, dS, q);
#pragma unroll
        for (int np = 0; np < HD / 16; np++) {
          uint32_t bk[4];
          b_cols<LD>(bk, Ks, np * 16, q * 16, lane);
          mma16816<T>(acc[2 * np], a, bk[0], bk[1]);
          mma16816<T>(acc[2 * np + 1], a, bk[2], bk[3]);
        }
      }
      tc_store_rows<T, HD>(dqkv, acc, b, h, N, C, 0, r0, g, t, scale);
      add_sums(0, acc);
    }
    __syncthreads();  // the P and dS tiles are complete

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
        a_cols<kTcLdP>(as, dSs, r0, kk, lane);
        a_cols<kTcLdP>(ap, Ps, r0, kk, lane);
#pragma unroll
        for (int np = 0; np < HD / 16; np++) {
          uint32_t bq[4], bo[4];
          b_cols<LD>(bq, Qs, np * 16, kk, lane);
          b_cols<LD>(bo, dOs, np * 16, kk, lane);
          mma16816<T>(dk[2 * np], as, bq[0], bq[1]);
          mma16816<T>(dk[2 * np + 1], as, bq[2], bq[3]);
          mma16816<T>(dv[2 * np], ap, bo[0], bo[1]);
          mma16816<T>(dv[2 * np + 1], ap, bo[2], bo[3]);
        }
      }
      tc_store_rows<T, HD>(dqkv, dk, b, h, N, C, 1, r0, g, t, scale);
      tc_store_rows<T, HD>(dqkv, dv, b, h, N, C, 2, r0, g, t, 1.0f);
      add_sums(1, dk);
      add_sums(2, dv);
    }
    __syncthreads();  // every warp is done with these tiles before the next window reuses them
  }

  // This block's column sums of dq, dk, dv at (group, part * C + h * HD + d) of bias_partial
  // (groups, 3C): the warps' shares meet in the P tile, free after the loop's last barrier, and
  // are added in warp order. Padded rows (queries and keys >= N) hold zeros in every product.
  if (bias_partial) {
    float *red = reinterpret_cast<float *>(Ps);  // (kTcWarps, 3, HD): 4 * 3 * 64 floats fit
    const bool owner = HD / 4 >= 8 || !(lane & 4);
    if (owner) {
      const int first = tc_sum_first<HD>(lane);
#pragma unroll
      for (int part = 0; part < 3; part++)
#pragma unroll
        for (int i = 0; i < kTcSumOut<HD>; i++) {
          const int k = first + i, d = (k / 2) * 8 + 2 * t + k % 2;
          red[(warp * 3 + part) * HD + d] = bsum[part][i] * (part < 2 ? scale : 1.0f);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < 3 * HD; e += blockDim.x) {
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < kTcWarps; w++) total += red[w * 3 * HD + e];
      const int part = e / HD, d = e % HD;
      bias_partial[(int64_t)group * 3 * C + part * C + h * HD + d] = total;
    }
  }

  // This block's window sum of dS, at (group, h, i, j) of ds_partial (groups, heads, N, N).
  float *part = ds_partial + ((int64_t)group * heads + h) * N * N;
#pragma unroll
  for (int nt = 0; nt < KT; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int i = r0 + g + (c >= 2 ? 8 : 0), j = nt * 8 + 2 * t + (c & 1);
      if (i < N && j < N) part[i * N + j] = dT[nt][c];
    }
}

size_t tc_forward_smem(int hd, int kt) {
  return sizeof(float4) * kTcWarps * kt * 32 + sizeof(uint16_t) * (size_t)6 * kTcRows * (hd + 8);
}
size_t tc_backward_smem(int hd, int kt) {
  return sizeof(float4) * kTcWarps * kt * 32 +
         sizeof(uint16_t) * ((size_t)2 * kTcRows * kTcLdP + (size_t)8 * kTcRows * (hd + 8));
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

// Runs F<HD, KT> for the head widths the tensor-core kernels are built for and the key tiles
// a window of N tokens needs (7 up to 56 tokens, else 8).
template <typename F>
void with_head_dim(int hd, int N, F f) {
  auto keys = [&](auto HD) {
    if (N <= 56)
      f(HD, std::integral_constant<int, 7>{});
    else
      f(HD, std::integral_constant<int, 8>{});
  };
  switch (hd) {
    case 16:
      keys(std::integral_constant<int, 16>{});
      break;
    case 32:
      keys(std::integral_constant<int, 32>{});
      break;
    case 64:
      keys(std::integral_constant<int, 64>{});
      break;
    default:
      fprintf(stderr, "window attention: no tensor-core kernel for head_dim %d\n", hd);
      abort();
  }
}

int key_tiles(int N) {
  return N <= 56 ? 7 : 8;
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
    size_t smem = tc_forward_smem(hd, key_tiles(N));
    int groups = tc_groups(tc_forward_blocks(), BW, heads, mask ? nW : 1);
    SWIN_DISPATCH(dt, T, {
      if constexpr (sizeof(T) == 2) {
        with_head_dim(hd, N, [&](auto HD, auto KT) {
          auto kernel =
              window_attention_forward_tc_kernel<T, decltype(HD)::value, decltype(KT)::value>;
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
  if (use_tensor_cores(dt, N, hd)) {
    // nW = 1: the most groups any nW gives; the dS sums, then the qkv bias sums
    int64_t groups = tc_groups(tc_backward_blocks(), BW, heads, 1);
    return groups * heads * N * N + groups * 3 * C;
  }
  return column_sums_cuda_scratch((int64_t)BW * N, 3 * C);
}

void window_attention_backward_cuda(DType dt, void *dqkv, float *dqkv_bias, float *dtable,
                                    const void *dout, const void *qkv, float *att,
                                    const float *table, const int *index, const float *mask, int BW,
                                    int nW, int N, int C, int heads, float *scratch,
                                    cudaStream_t stream) {
  check_limits("window_attention_backward_cuda", BW, N, C, heads);
  if (BW == 0) return;
  int hd = C / heads;
  bool tc = use_tensor_cores(dt, N, hd);
  // Partial window sums of dS, (rows, E) with E = heads * N * N: the tensor-core path's per
  // block in scratch, the SIMT path's per window over the probabilities in att.
  float *ds = tc ? scratch : att;
  int64_t rows = BW;
  if (tc) {
    check_tc_alignment("window_attention_backward_cuda", qkv, dout);
    check_tc_alignment("window_attention_backward_cuda", dqkv, nullptr);
    int groups = tc_groups(tc_backward_blocks(), BW, heads, mask ? nW : 1);
    rows = groups;
    float *bias_partial = dqkv_bias ? ds + (int64_t)groups * heads * N * N : nullptr;
    size_t smem = tc_backward_smem(hd, key_tiles(N));
    SWIN_DISPATCH(dt, T, {
      if constexpr (sizeof(T) == 2) {
        with_head_dim(hd, N, [&](auto HD, auto KT) {
          auto kernel =
              window_attention_backward_tc_kernel<T, decltype(HD)::value, decltype(KT)::value>;
          allow_smem(kernel, smem);
          kernel<<<(unsigned)(groups * heads), kTcThreads, smem, stream>>>(
              static_cast<T *>(dqkv), ds, bias_partial, static_cast<const T *>(dout),
              static_cast<const T *>(qkv), att, table, index, mask, BW, nW, N, C, heads, groups,
              attention_scale(hd));
        });
      }
    });
    CUDA_CHECK_LAUNCH();
    if (dqkv_bias) column_partials_reduce_cuda(dqkv_bias, bias_partial, groups, 3 * C, stream);
  } else {
    size_t smem = backward_smem_bytes(N, hd);
    SWIN_DISPATCH(dt, T, {
      auto kernel = window_attention_backward_kernel<T>;
      allow_smem(kernel, smem);
      kernel<<<(unsigned)((int64_t)BW * heads), kThreads, smem, stream>>>(
          static_cast<T *>(dqkv), ds, static_cast<const T *>(dout), static_cast<const T *>(qkv),
          att, N, C, heads, attention_scale(hd));
    });
    CUDA_CHECK_LAUNCH();
    if (dqkv_bias) column_sums_cuda(dt, dqkv_bias, dqkv, (int64_t)BW * N, 3 * C, scratch, stream);
  }

  // Sums of dS over the rows (windows, or the tensor-core path's window groups) per (h, i, j):
  // 32 elements per block.
  int64_t E = (int64_t)heads * N * N;
  unsigned sum_blocks = (unsigned)((E + 31) / 32);
  attention_ds_window_sum_kernel<<<sum_blocks, dim3(32, kSumRows), 0, stream>>>(ds, rows, E);
  CUDA_CHECK_LAUNCH();

  // One warp per (table row, head) up to the row bound, kTableRowsPerBlock rows per block.
  int rows_bound = table_rows_bound(N);
  dim3 table_grid((unsigned)((rows_bound + kTableRowsPerBlock - 1) / kTableRowsPerBlock),
                  (unsigned)heads);
  attention_dtable_kernel<<<table_grid, kTableRowsPerBlock * 32, 2 * sizeof(int) * (size_t)N * N,
                            stream>>>(dtable, ds, index, N, heads, rows_bound);
  CUDA_CHECK_LAUNCH();
}
