// attention_flash_tc.cu: the tensor-core window-attention kernels for windows of more than 64
// tokens (Swin-B/L 384: 12x12 = 144, Swin V2: 16x16 = 256, 24x24 = 576), bf16 and f16, head_dim
// 16, 32 or 64: flash-style, keys in tiles of kFlashKeys, no N x N matrix in global memory, the
// relative-position bias (and shift mask) gathered per score from table[index] in the kernel;
// with their launchers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

#include "kernels/cuda/attention.cuh"

// Three kernels, 4 warps each, every product an mma.sync.m16n8k16 with f32 accumulation from
// tiles in shared memory, row-major (token, channel) as in global memory, rows padded by 8
// elements (the ldmatrix operands of attention_tc.cu: a_rows / b_rows where the product runs
// over channels, a_cols / b_cols (.trans) where it runs over tokens). A tile is 64 tokens of
// one head; rows past the window's last token are zero-filled by the copy (cp.async with
// source size 0), so they add nothing to any product, and their scores are set to -inf (keys)
// or never stored (queries).
//
// Scores carry log2(e) as on the tensor-core path: s2 = (q . k) scale log2(e) + (table[index[i][j]]
// + mask[i][j]) log2(e), softmax by exp2, the saved statistic the base-2 log-sum-exp.
//
// forward, a block per (window, head, 64-query tile): warp w owns query rows 16w..16w+15; for
// each key tile S = q k^T in registers, the online softmax (running row max m and sum l, the
// output rescaled by exp2(m_old - m_new)), O += P v with P rounded to the element type. K and V
// tiles are double-buffered: the next tile's copy runs under the current tile's products.
//
// dq, same grid: delta = rowsum(dO * O) of the block's rows (stored for the dk/dv kernel), then
// per key tile P = exp2(s2 - lse), dP = dO v^T, dS = P (dP - delta), dq += dS k.
//
// dk/dv, a block per (window group, head, 64-key tile), serving windows group, group + groups,
// ...: per (window, query tile) each warp recomputes P and dS for its 16 query rows x the
// block's 64 keys, adds dS to the block's running window sum (shared memory, in fragment order:
// each element has one owner thread, so the sum runs in window order without atomics), and
// stores P and dS as row-major tiles; then warp w takes keys 16w..16w+15: dv += P^T dO,
// dk += dS^T q, over the window's query tiles. The block finally writes its window sums of dS
// (its 64 columns of the (N, N) matrix) for window_attention_dtable_backward.

namespace swin_cuda::attention {
namespace {

constexpr int kFlWarps = 4;
constexpr int kFlThreads = kFlWarps * 32;
constexpr int kFlRows = 16 * kFlWarps;       // query rows of a tile
constexpr int kFlLdP = kFlashKeys + 8;       // row length of the dk/dv kernel's P and dS tiles
constexpr int kFlKeyTiles = kFlashKeys / 8;  // n-tiles of 8 keys in a key tile
static_assert(kFlRows == kFlashKeys, "a tile is 64 tokens, as queries and as keys");

// Starts the copy of tokens r0..r0+63 of one head's channels (src: token 0's first channel of
// the head; stride: elements between tokens) into a (64, HD + 8) tile; tokens >= N are zeros.
template <typename T, int HD>
__device__ __forceinline__ void fl_load(T *tile, const T *__restrict__ src, int64_t stride, int r0,
                                        int N) {
  constexpr int LD = HD + 8, kChunks = HD / 8;
  for (int e = threadIdx.x; e < kFlRows * kChunks; e += blockDim.x) {
    const int r = e / kChunks, d = e % kChunks * 8, i = r0 + r;
    const bool valid = i < N;
    cp_async16_zfill(tile + r * LD + d, src + (valid ? i : 0) * stride + d, valid);
  }
}

// acc (16 rows of this warp x 64 keys) = A B^T over HD channels: A rows r0.. of tile A, B the 64
// rows of tile B (q k^T, dO v^T).
template <typename T, int HD>
__device__ __forceinline__ void fl_products(float (&acc)[kFlKeyTiles][4], const T *A, const T *B,
                                            int r0, int lane) {
  constexpr int LD = HD + 8;
#pragma unroll
  for (int nt = 0; nt < kFlKeyTiles; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) acc[nt][c] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD; kk += 16) {
    uint32_t a[4];
    a_rows<LD>(a, A, r0, kk, lane);
#pragma unroll
    for (int np = 0; np < kFlKeyTiles / 2; np++) {
      uint32_t b[4];
      b_rows<LD>(b, B, np * 16, kk, lane);
      mma16816<T>(acc[2 * np], a, b[0], b[1]);
      mma16816<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// S2 = S scale2 + (table[index[i][j]][h] + mask_w[i][j]) log2(e) for this thread's elements:
// query rows i0 and i0 + 8, keys j0 + 8 nt + (0, 1); -inf for keys >= N. Query rows >= N (whose
// results are never stored) take row N - 1's bias, so every read stays in bounds.
__device__ __forceinline__ void fl_bias(float (&S)[kFlKeyTiles][4], float scale2,
                                        const float *__restrict__ table,
                                        const int *__restrict__ index,
                                        const float *__restrict__ mask_w, int i0, int j0, int N,
                                        int heads, int h) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = min(i0 + 8 * r, N - 1);
    const int *idx = index + (int64_t)i * N;
    const float *m = mask_w ? mask_w + (int64_t)i * N : nullptr;
#pragma unroll
    for (int nt = 0; nt < kFlKeyTiles; nt++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int j = j0 + nt * 8 + c;
        float &s = S[nt][2 * r + c];
        if (j < N) {
          const float bias = table[idx[j] * heads + h] + (m ? m[j] : 0.0f);
          s = fmaf(s, scale2, bias * kLog2e);
        } else {
          s = -INFINITY;
        }
      }
  }
}

// The A operand of k-step q (keys 16q..16q+15) from a 16 x 64 accumulator tile, rounded to T.
template <typename T>
__device__ __forceinline__ void fl_a_from_acc(uint32_t (&a)[4], const float (&acc)[kFlKeyTiles][4],
                                              int q) {
  a[0] = pack2<T>(acc[2 * q][0], acc[2 * q][1]);
  a[1] = pack2<T>(acc[2 * q][2], acc[2 * q][3]);
  a[2] = pack2<T>(acc[2 * q + 1][0], acc[2 * q + 1][1]);
  a[3] = pack2<T>(acc[2 * q + 1][2], acc[2 * q + 1][3]);
}

// out (16 rows x HD) += P (16 x 64 keys, rounded to T) times the key tile V (64, HD + 8): the
// products over keys (P v, dS k).
template <typename T, int HD>
__device__ __forceinline__ void fl_times_keys(float (&out)[HD / 8][4],
                                              const float (&P)[kFlKeyTiles][4], const T *V,
                                              int lane) {
  constexpr int LD = HD + 8;
#pragma unroll
  for (int q = 0; q < kFlashKeys / 16; q++) {
    uint32_t a[4];
    fl_a_from_acc<T>(a, P, q);
#pragma unroll
    for (int np = 0; np < HD / 16; np++) {
      uint32_t b[4];
      b_cols<LD>(b, V, np * 16, q * 16, lane);
      mma16816<T>(out[2 * np], a, b[0], b[1]);
      mma16816<T>(out[2 * np + 1], a, b[2], b[3]);
    }
  }
}

template <int HD>
__device__ __forceinline__ void fl_zero(float (&acc)[HD / 8][4]) {
#pragma unroll
  for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
    for (int c = 0; c < 4; c++) acc[nd][c] = 0.0f;
}

// Stores a 16-row accumulator tile times mul: rows i0 and i0 + 8 (tokens of window b, those
// < N) of dst (token 0's first channel of the head; stride: elements between tokens).
template <typename T, int HD>
__device__ __forceinline__ void fl_store(T *__restrict__ dst, int64_t stride,
                                         const float (&acc)[HD / 8][4], int i0, int N, int t,
                                         const float (&mul)[2]) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = i0 + 8 * r;
    if (i >= N) continue;
    T *row = dst + i * stride + 2 * t;
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
      *reinterpret_cast<uint32_t *>(row + nd * 8) =
          pack2<T>(acc[nd][2 * r] * mul[r], acc[nd][2 * r + 1] * mul[r]);
  }
}

// The key-tile step of the forward and dq kernels, whose K and V tiles are double-buffered in
// kv (2 x (K, V)): starts the copy of key tile kt + 1 (if any) and waits for tile kt's.
template <typename T, int HD>
__device__ __forceinline__ void fl_next_key_tile(T *kv, const T *head, int C, int64_t stride,
                                                 int kt, int ktiles, int N) {
  constexpr int kTile = kFlRows * (HD + 8);
  if (kt + 1 < ktiles) {
    T *next = kv + ((kt + 1) & 1) * 2 * kTile;
    fl_load<T, HD>(next, head + C, stride, (kt + 1) * kFlashKeys, N);
    fl_load<T, HD>(next + kTile, head + 2 * C, stride, (kt + 1) * kFlashKeys, N);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// Block (window b, head h, query tile qt) with blockIdx.x = (b * heads + h) * qtiles + qt.
template <typename T, int HD>
__global__ void __launch_bounds__(kFlThreads)
    flash_forward_kernel(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ qkv,
                         const float *__restrict__ table, const int *__restrict__ index,
                         const float *__restrict__ mask, int nW, int N, int C, int heads,
                         int qtiles, float scale) {
  constexpr int kTile = kFlRows * (HD + 8);
  extern __shared__ float4 attention_smem[];
  T *Qs = reinterpret_cast<T *>(attention_smem);
  T *kv = Qs + kTile;  // 2 x (K, V)
  const int qt = (int)(blockIdx.x % qtiles);
  const int64_t p = blockIdx.x / qtiles, b = p / heads;
  const int h = (int)(p % heads), q0 = qt * kFlRows, ktiles = flash_key_tiles(N);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16, i0 = q0 + r0 + g;
  const int64_t stride = 3 * (int64_t)C;
  const T *head = qkv + b * N * stride + h * HD;  // q of token 0; k at + C, v at + 2C
  const float *mask_w = mask ? mask + (b % nW) * N * N : nullptr;
  const float scale2 = scale * kLog2e;

  fl_load<T, HD>(Qs, head, stride, q0, N);
  fl_load<T, HD>(kv, head + C, stride, 0, N);
  fl_load<T, HD>(kv + kTile, head + 2 * C, stride, 0, N);
  cp_async_commit();

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this thread's share
  float O[HD / 8][4];
  fl_zero<HD>(O);
  for (int kt = 0; kt < ktiles; kt++) {
    const T *Ks = kv + (kt & 1) * 2 * kTile, *Vs = Ks + kTile;
    fl_next_key_tile<T, HD>(kv, head, C, stride, kt, ktiles, N);
    __syncthreads();  // this key tile (and at kt = 0 the query tile) is complete

    float S[kFlKeyTiles][4];
    fl_products<T, HD>(S, Qs, Ks, r0, lane);
    fl_bias(S, scale2, table, index, mask_w, i0, kt * kFlashKeys + 2 * t, N, heads, h);
    // Key 0 of every tile is a token (< N), so the new maximum is finite.
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < kFlKeyTiles; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) mx[c >> 1] = fmaxf(mx[c >> 1], S[nt][c]);
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      for (int o = 1; o < 4; o <<= 1) mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], o));
      alpha[r] = fast_exp2(m[r] - mx[r]);  // 0 at the first tile (m = -inf)
      m[r] = mx[r];
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < kFlKeyTiles; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        S[nt][c] = fast_exp2(S[nt][c] - m[c >> 1]);  // exp2(-inf) = 0 for padded keys
        l[c >> 1] += S[nt][c];
      }
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
      for (int c = 0; c < 4; c++) O[nd][c] *= alpha[c >> 1];
    fl_times_keys<T, HD>(O, S, Vs, lane);
    __syncthreads();  // every warp is done with this key tile before the next copy refills it
  }

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    for (int o = 1; o < 4; o <<= 1) l[r] += __shfl_xor_sync(kFullMask, l[r], o);
    inv[r] = 1.0f / l[r];
    const int i = i0 + 8 * r;
    if (t == 0 && i < N) lse[p * N + i] = m[r] + __log2f(l[r]);
  }
  fl_store<T, HD>(out + b * N * C + h * HD, C, O, i0, N, t, inv);
}

// Block (window b, head h, query tile qt) as in the forward.
template <typename T, int HD>
__global__ void __launch_bounds__(kFlThreads)
    flash_dq_kernel(T *__restrict__ dqkv, float *__restrict__ delta, const T *__restrict__ dout,
                    const T *__restrict__ qkv, const T *__restrict__ out,
                    const float *__restrict__ lse, const float *__restrict__ table,
                    const int *__restrict__ index, const float *__restrict__ mask, int nW, int N,
                    int C, int heads, int qtiles, float scale) {
  constexpr int kTile = kFlRows * (HD + 8);
  extern __shared__ float4 attention_smem[];
  T *Qs = reinterpret_cast<T *>(attention_smem);
  T *dOs = Qs + kTile;
  T *kv = dOs + kTile;  // 2 x (K, V)
  const int qt = (int)(blockIdx.x % qtiles);
  const int64_t p = blockIdx.x / qtiles, b = p / heads;
  const int h = (int)(p % heads), q0 = qt * kFlRows, ktiles = flash_key_tiles(N);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16, i0 = q0 + r0 + g;
  const int64_t stride = 3 * (int64_t)C;
  const T *head = qkv + b * N * stride + h * HD;
  const float *mask_w = mask ? mask + (b % nW) * N * N : nullptr;
  const float scale2 = scale * kLog2e;

  fl_load<T, HD>(Qs, head, stride, q0, N);
  fl_load<T, HD>(dOs, dout + b * N * C + h * HD, C, q0, N);
  fl_load<T, HD>(kv, head + C, stride, 0, N);
  fl_load<T, HD>(kv + kTile, head + 2 * C, stride, 0, N);
  cp_async_commit();

  // delta of the warp's 16 rows: lanes 2r and 2r + 1 take halves of row r0 + r's channels.
  float row_delta[2], row_lse[2];
  {
    constexpr int kHalf = HD / 2, V = kVec16<T>;
    const int r = lane / 2, i = q0 + r0 + r;
    float d = 0.0f;
    if (i < N) {
      const int64_t off = (b * N + i) * C + h * HD + (lane % 2) * kHalf;
#pragma unroll
      for (int c = 0; c < kHalf; c += V) {
        float o[V], go[V];
        load_vec<T, V>(o, out + off + c);
        load_vec<T, V>(go, dout + off + c);
#pragma unroll
        for (int e = 0; e < V; e++) d = fmaf(o[e], go[e], d);
      }
    }
    d += __shfl_xor_sync(kFullMask, d, 1);
    if (lane % 2 == 0 && i < N) delta[p * N + i] = d;
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
      row_delta[rr] = __shfl_sync(kFullMask, d, 2 * (g + 8 * rr));
      const int ii = i0 + 8 * rr;
      row_lse[rr] = ii < N ? lse[p * N + ii] : INFINITY;  // P = 0 in rows past the window
    }
  }

  float dq[HD / 8][4];
  fl_zero<HD>(dq);
  for (int kt = 0; kt < ktiles; kt++) {
    const T *Ks = kv + (kt & 1) * 2 * kTile, *Vs = Ks + kTile;
    fl_next_key_tile<T, HD>(kv, head, C, stride, kt, ktiles, N);
    __syncthreads();

    float P[kFlKeyTiles][4], dS[kFlKeyTiles][4];
    fl_products<T, HD>(P, Qs, Ks, r0, lane);
    fl_bias(P, scale2, table, index, mask_w, i0, kt * kFlashKeys + 2 * t, N, heads, h);
    fl_products<T, HD>(dS, dOs, Vs, r0, lane);  // dP
#pragma unroll
    for (int nt = 0; nt < kFlKeyTiles; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const float pr = fast_exp2(P[nt][c] - row_lse[c >> 1]);
        dS[nt][c] = pr * (dS[nt][c] - row_delta[c >> 1]);
      }
    fl_times_keys<T, HD>(dq, dS, Ks, lane);
    __syncthreads();
  }
  const float mul[2] = {scale, scale};
  fl_store<T, HD>(dqkv + b * N * stride + h * HD, stride, dq, i0, N, t, mul);
}

// Block (window group, head h, key tile kt) with blockIdx.x = (group * heads + h) * ktiles + kt.
// Shared memory: the window sums of dS (qtiles x kFlWarps x kFlKeyTiles x 32 float4, fragment
// order), K and V of the key tile, 2 x (q, dO) of a query tile, P and dS (64, kFlLdP).
template <typename T, int HD>
__global__ void __launch_bounds__(kFlThreads)
    flash_dkv_kernel(T *__restrict__ dqkv, float *__restrict__ ds_partial,
                     const T *__restrict__ dout, const T *__restrict__ qkv,
                     const float *__restrict__ lse, const float *__restrict__ delta,
                     const float *__restrict__ table, const int *__restrict__ index,
                     const float *__restrict__ mask, int BW, int nW, int N, int C, int heads,
                     int groups, float scale) {
  constexpr int kTile = kFlRows * (HD + 8), kFrag = kFlWarps * kFlKeyTiles * 32;
  const int ktiles = flash_key_tiles(N), qtiles = ktiles;
  extern __shared__ float4 attention_smem[];
  float4 *dsum = attention_smem;  // (qtiles, kFrag)
  T *Ks = reinterpret_cast<T *>(dsum + qtiles * kFrag), *Vs = Ks + kTile;
  T *qd = Vs + kTile;  // 2 x (q, dO)
  T *Ps = qd + 4 * kTile, *dSs = Ps + kFlRows * kFlLdP;
  const int kt = (int)(blockIdx.x % ktiles), k0 = kt * kFlashKeys;
  const int h = (int)(blockIdx.x / ktiles % heads), group = (int)(blockIdx.x / ktiles / heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16;
  const int64_t stride = 3 * (int64_t)C;
  const float scale2 = scale * kLog2e;
  float4 *my_sum = dsum + warp * kFlKeyTiles * 32 + lane;  // + qt * kFrag + nt * 32
  for (int e = threadIdx.x; e < qtiles * kFrag; e += blockDim.x)
    dsum[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  // Iteration it serves query tile it % qtiles of window group + (it / qtiles) groups.
  const int64_t windows = (BW - group + groups - 1) / groups, iters = windows * qtiles;
  auto load_queries = [&](int64_t it, T *dst) {
    const int64_t b = group + it / qtiles * groups;
    const int q0 = (int)(it % qtiles) * kFlRows;
    fl_load<T, HD>(dst, qkv + b * N * stride + h * HD, stride, q0, N);
    fl_load<T, HD>(dst + kTile, dout + b * N * C + h * HD, C, q0, N);
    cp_async_commit();
  };
  load_queries(0, qd);

  float dk[HD / 8][4], dv[HD / 8][4];
  fl_zero<HD>(dk);
  fl_zero<HD>(dv);
  for (int64_t it = 0; it < iters; it++) {
    const int64_t b = group + it / qtiles * groups, p = b * heads + h;
    const int qt = (int)(it % qtiles), q0 = qt * kFlRows, i0 = q0 + r0 + g;
    const T *head = qkv + b * N * stride + h * HD;
    const T *Qs = qd + (it & 1) * 2 * kTile, *dOs = Qs + kTile;
    if (qt == 0) {  // the window's keys (the previous window's last barrier freed the tiles)
      fl_load<T, HD>(Ks, head + C, stride, k0, N);
      fl_load<T, HD>(Vs, head + 2 * C, stride, k0, N);
      cp_async_commit();
    }
    if (it + 1 < iters) {
      load_queries(it + 1, qd + ((it + 1) & 1) * 2 * kTile);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this iteration's q, dO (and keys) are complete

    float row_lse[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int i = i0 + 8 * r;
      row_lse[r] = i < N ? lse[p * N + i] : INFINITY;
      row_delta[r] = i < N ? delta[p * N + i] : 0.0f;
    }
    const float *mask_w = mask ? mask + (b % nW) * N * N : nullptr;
    float P[kFlKeyTiles][4], dS[kFlKeyTiles][4];
    fl_products<T, HD>(P, Qs, Ks, r0, lane);
    fl_bias(P, scale2, table, index, mask_w, i0, k0 + 2 * t, N, heads, h);
    fl_products<T, HD>(dS, dOs, Vs, r0, lane);  // dP
#pragma unroll
    for (int nt = 0; nt < kFlKeyTiles; nt++) {
      float4 *sum = my_sum + qt * kFrag + nt * 32;
      float s[4];
#pragma unroll
      for (int c = 0; c < 4; c++) {
        P[nt][c] = fast_exp2(P[nt][c] - row_lse[c >> 1]);
        dS[nt][c] = P[nt][c] * (dS[nt][c] - row_delta[c >> 1]);
      }
      const float4 old = *sum;
      s[0] = old.x + dS[nt][0];
      s[1] = old.y + dS[nt][1];
      s[2] = old.z + dS[nt][2];
      s[3] = old.w + dS[nt][3];
      *sum = make_float4(s[0], s[1], s[2], s[3]);
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int off = (r0 + g + 8 * r) * kFlLdP + nt * 8 + 2 * t;
        *reinterpret_cast<uint32_t *>(Ps + off) = pack2<T>(P[nt][2 * r], P[nt][2 * r + 1]);
        *reinterpret_cast<uint32_t *>(dSs + off) = pack2<T>(dS[nt][2 * r], dS[nt][2 * r + 1]);
      }
    }
    __syncthreads();  // the P and dS tiles are complete

    // dv += P^T dO and dk += dS^T q for the keys k0 + 16 warp ..
    dkdv_products<T, HD, kFlRows, kFlLdP>(dk, dv, dSs, Ps, Qs, dOs, r0, lane);
    if (qt == qtiles - 1) {  // the window's last query tile: its dk, dv are complete
      T *dst = dqkv + b * N * stride + h * HD;
      const float mul_k[2] = {scale, scale}, mul_v[2] = {1.0f, 1.0f};
      fl_store<T, HD>(dst + C, stride, dk, k0 + r0 + g, N, t, mul_k);
      fl_store<T, HD>(dst + 2 * C, stride, dv, k0 + r0 + g, N, t, mul_v);
      fl_zero<HD>(dk);
      fl_zero<HD>(dv);
    }
    __syncthreads();  // every warp is done with the tiles before the next iteration's copies
  }

  // The block's window sums of dS: rows i < N, its keys j < N of (group, h) in ds_partial.
  float *part = ds_partial + ((int64_t)group * heads + h) * N * N;
  for (int qt = 0; qt < qtiles; qt++)
#pragma unroll
    for (int nt = 0; nt < kFlKeyTiles; nt++) {
      const float4 s4 = my_sum[qt * kFrag + nt * 32];
      const float s[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int i = qt * kFlRows + r0 + g + (c >= 2 ? 8 : 0);
        const int j = k0 + nt * 8 + 2 * t + (c & 1);
        if (i < N && j < N) part[(int64_t)i * N + j] = s[c];
      }
    }
}

size_t fl_forward_smem(int hd) {
  return sizeof(uint16_t) * 5 * kFlRows * (size_t)(hd + 8);
}
size_t fl_dq_smem(int hd) {
  return sizeof(uint16_t) * 6 * kFlRows * (size_t)(hd + 8);
}
size_t fl_dkv_smem(int N, int hd) {
  return sizeof(float4) * (size_t)flash_key_tiles(N) * kFlWarps * kFlKeyTiles * 32 +
         sizeof(uint16_t) * ((size_t)6 * kFlRows * (hd + 8) + (size_t)2 * kFlRows * kFlLdP);
}

// Blocks of a dk/dv launch: as many as the SMs hold by shared memory (at most 2: the kernel's
// ~200 registers per thread), in one wave; a function of the shapes and the SM count only.
int fl_dkv_blocks(int N, int hd) {
  constexpr size_t kSmPerSm = 228 * 1024, kReservedPerBlock = 1024;
  int per_sm = (int)(kSmPerSm / (fl_dkv_smem(N, hd) + kReservedPerBlock));
  per_sm = per_sm < 1 ? 1 : per_sm > 2 ? 2 : per_sm;
  int blocks = device_sm_count() * per_sm;
  return blocks < WINDOW_ATTENTION_CUDA_MAX_BLOCKS ? blocks : WINDOW_ATTENTION_CUDA_MAX_BLOCKS;
}

template <typename F>
void fl_with_head_dim(int hd, F f) {
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
      fprintf(stderr, "window attention: no flash tensor-core kernel for head_dim %d\n", hd);
      abort();
  }
}

// The grid of the forward and dq kernels: a block per (window, head, query tile).
unsigned fl_query_grid(const char *fn, int BW, int N, int heads) {
  int64_t blocks = (int64_t)BW * heads * flash_key_tiles(N);
  if (blocks > 0x7fffffff) {
    fprintf(stderr, "%s: %lld blocks (BW=%d heads=%d N=%d) exceed the grid\n", fn,
            (long long)blocks, BW, heads, N);
    abort();
  }
  return (unsigned)blocks;
}

void fl_check_alignment(const char *fn, const void *a, const void *b, const void *c) {
  if (aligned16(a) && aligned16(b) && (!c || aligned16(c))) return;
  fprintf(stderr, "%s: tensors must be 16-byte aligned for the flash tensor-core path\n", fn);
  abort();
}

}  // namespace

bool flash_tensor_cores(DType dt, int hd) {
  return dt != DTYPE_F32 && (hd == 16 || hd == 32 || hd == 64);
}

void window_attention_forward_flash_tc(DType dt, void *out, float *lse, const void *qkv,
                                       const float *table, const int *index, const float *mask,
                                       int BW, int nW, int N, int C, int heads,
                                       cudaStream_t stream) {
  const int hd = C / heads;
  fl_check_alignment("window_attention_forward_cuda", out, qkv, nullptr);
  const unsigned grid = fl_query_grid("window_attention_forward_cuda", BW, N, heads);
  const size_t smem = fl_forward_smem(hd);
  SWIN_DISPATCH(dt, T, {
    if constexpr (sizeof(T) == 2) {
      fl_with_head_dim(hd, [&](auto HD) {
        auto kernel = flash_forward_kernel<T, decltype(HD)::value>;
        allow_smem(kernel, smem);
        kernel<<<grid, kFlThreads, smem, stream>>>(
            static_cast<T *>(out), lse, static_cast<const T *>(qkv), table, index, mask,
            mask ? nW : 1, N, C, heads, flash_key_tiles(N), attention_scale(hd));
      });
    }
  });
  CUDA_CHECK_LAUNCH();
}

int window_attention_backward_flash_tc_groups(int BW, int N, int C, int heads) {
  return flash_groups(fl_dkv_blocks(N, C / heads), BW, N, heads);
}

int window_attention_backward_flash_tc(DType dt, void *dqkv, const void *dout, const void *qkv,
                                       const void *out, const float *lse, float *delta,
                                       const float *table, const int *index, const float *mask,
                                       int BW, int nW, int N, int C, int heads, float *ds_partial,
                                       cudaStream_t stream) {
  const int hd = C / heads, tiles = flash_key_tiles(N);
  fl_check_alignment("window_attention_backward_cuda", dqkv, dout, qkv);
  fl_check_alignment("window_attention_backward_cuda", out, out, nullptr);
  const unsigned grid = fl_query_grid("window_attention_backward_cuda", BW, N, heads);
  const int groups = window_attention_backward_flash_tc_groups(BW, N, C, heads);
  const size_t dq_smem = fl_dq_smem(hd), dkv_smem = fl_dkv_smem(N, hd);
  const int mask_nW = mask ? nW : 1;
  SWIN_DISPATCH(dt, T, {
    if constexpr (sizeof(T) == 2) {
      fl_with_head_dim(hd, [&](auto HD) {
        auto dq_kernel = flash_dq_kernel<T, decltype(HD)::value>;
        allow_smem(dq_kernel, dq_smem);
        dq_kernel<<<grid, kFlThreads, dq_smem, stream>>>(
            static_cast<T *>(dqkv), delta, static_cast<const T *>(dout),
            static_cast<const T *>(qkv), static_cast<const T *>(out), lse, table, index, mask,
            mask_nW, N, C, heads, tiles, attention_scale(hd));
        CUDA_CHECK_LAUNCH();
        auto dkv_kernel = flash_dkv_kernel<T, decltype(HD)::value>;
        allow_smem(dkv_kernel, dkv_smem);
        dkv_kernel<<<(unsigned)(groups * heads * tiles), kFlThreads, dkv_smem, stream>>>(
            static_cast<T *>(dqkv), ds_partial, static_cast<const T *>(dout),
            static_cast<const T *>(qkv), lse, delta, table, index, mask, BW, mask_nW, N, C, heads,
            groups, attention_scale(hd));
      });
    }
  });
  CUDA_CHECK_LAUNCH();
  return groups;
}

}  // namespace swin_cuda::attention
