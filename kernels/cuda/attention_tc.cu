// attention_tc.cu: the tensor-core window-attention kernels, forward and backward, for bf16 and
// f16: tiles in their element type, mma.sync products with f32 accumulation, softmax in f32,
// the backward recomputing P from the forward's log-sum-exp; with their launchers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

#include "kernels/cuda/attention.cuh"
#include "kernels/gemm.h"

namespace swin_cuda::attention {
namespace {

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
// a fixed order as in the SIMT path (attention_dtable.cu).
//
// Both kernels run one wave of blocks: block (group, h) serves head h of windows group, group +
// groups, ..., so the head's bias and, when groups is a multiple of nW, the block's one mask are
// built once per block. The next window's q, k, v (and dO) are copied into a second set of tiles
// with cp.async while the block computes the current one.
constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = 64;          // padded tokens of a window (query rows, key rows)
constexpr int kTcLdP = kTcRows + 8;  // row length of the P and dS tiles (token, token)
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
      dkdv_products<T, HD, kTcRows, kTcLdP>(dk, dv, dSs, Ps, Qs, dOs, r0, lane);
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

// The tensor-core kernels read and write q, k, v and the outputs 16 bytes at a time.
void check_tc_alignment(const char *fn, const void *a, const void *b) {
  if (aligned16(a) && (!b || aligned16(b))) return;
  fprintf(stderr, "%s: tensors must be 16-byte aligned for the tensor-core path (%p, %p)\n", fn, a,
          b);
  abort();
}

}  // namespace

// The tensor-core kernels serve bf16 and f16 with head_dim 16, 32 or 64 and windows of at most
// 64 tokens (Swin: 49 tokens, head_dim 32); everything else takes the SIMT kernels.
bool use_tensor_cores(DType dt, int N, int hd) {
  return dt != DTYPE_F32 && N <= kTcRows && (hd == 16 || hd == 32 || hd == 64);
}

void window_attention_forward_tc(DType dt, void *out, float *lse, const void *qkv,
                                 const float *table, const int *index, const float *mask, int BW,
                                 int nW, int N, int C, int heads, float scale,
                                 cudaStream_t stream) {
  int hd = C / heads;
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
            static_cast<T *>(out), lse, static_cast<const T *>(qkv), table, index, mask, BW, nW, N,
            C, heads, groups, scale);
      });
    }
  });
  CUDA_CHECK_LAUNCH();
}

int64_t window_attention_backward_tc_scratch(int BW, int N, int C, int heads) {
  // nW = 1: the most groups any nW gives; the dS sums, then the qkv bias sums
  int64_t groups = tc_groups(tc_backward_blocks(), BW, heads, 1);
  return groups * heads * N * N + groups * 3 * C;
}

int window_attention_backward_tc(DType dt, void *dqkv, float *dqkv_bias, const void *dout,
                                 const void *qkv, const float *lse, const float *table,
                                 const int *index, const float *mask, int BW, int nW, int N, int C,
                                 int heads, float scale, float *scratch, cudaStream_t stream) {
  int hd = C / heads;
  check_tc_alignment("window_attention_backward_cuda", qkv, dout);
  check_tc_alignment("window_attention_backward_cuda", dqkv, nullptr);
  int groups = tc_groups(tc_backward_blocks(), BW, heads, mask ? nW : 1);
  float *bias_partial = dqkv_bias ? scratch + (int64_t)groups * heads * N * N : nullptr;
  size_t smem = tc_backward_smem(hd, key_tiles(N));
  SWIN_DISPATCH(dt, T, {
    if constexpr (sizeof(T) == 2) {
      with_head_dim(hd, N, [&](auto HD, auto KT) {
        auto kernel =
            window_attention_backward_tc_kernel<T, decltype(HD)::value, decltype(KT)::value>;
        allow_smem(kernel, smem);
        kernel<<<(unsigned)(groups * heads), kTcThreads, smem, stream>>>(
            static_cast<T *>(dqkv), scratch, bias_partial, static_cast<const T *>(dout),
            static_cast<const T *>(qkv), lse, table, index, mask, BW, nW, N, C, heads, groups,
            scale);
      });
    }
  });
  CUDA_CHECK_LAUNCH();
  if (dqkv_bias) column_partials_reduce_cuda(dqkv_bias, bias_partial, groups, 3 * C, stream);
  return groups;
}

}  // namespace swin_cuda::attention
