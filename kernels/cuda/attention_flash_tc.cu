// attention_flash_tc.cu: the tensor-core window-attention kernels for windows of more than 64
// tokens (Swin-B/L 384: 12x12 = 144, Swin V2: 16x16 = 256, 24x24 = 576), bf16 and f16, head_dim
// 16, 32 or 64: flash-style, keys in tiles of 48 or 64, no N x N matrix in global memory, the
// relative-position bias written densely once per forward from table[index] (and the shift mask)
// read per score in the kernels; with their launchers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <type_traits>

#include "kernels/cuda/attention.cuh"

// Three kernels, every product an mma.sync.m16n8k16 with f32 accumulation from tiles in shared
// memory, row-major (token, channel) as in global memory, rows padded by 8 elements (the
// ldmatrix operands of attention_tc.cu: a_rows / b_rows where the product runs over channels,
// a_cols / b_cols (.trans) where it runs over tokens). A tile is TILE tokens of one head, 48 or
// 64 (flash_tc_tile: 48 where it pads the window less, e.g. 144 = 3 x 48 instead of 3 x 64), a
// block TILE / 16 warps; rows past the window's last token are zero-filled by the copy (cp.async
// with source size 0), so they add nothing to any product, and their scores are set to -inf
// (keys) or never stored (queries).
//
// Scores carry log2(e) as on the tensor-core path: s2 = (q . k) scale log2(e) + bias2[h][i][j] +
// mask[i][j] log2(e), softmax by exp2, the saved statistic the base-2 log-sum-exp. bias2 =
// table[index[i][j]][h] log2(e) is written densely (heads, N, N), with its transpose for the
// dk/dv kernel, by the forward's first kernel into the saved floats, so a score's bias is one
// load from a row the thread reads in pairs, not an index load followed by a dependent table
// load.
//
// forward, a block per (window, head, query tile): warp w owns query rows 16w..16w+15; for
// each key tile S = q k^T in registers, the online softmax (running row max m and sum l, the
// output rescaled by exp2(m_old - m_new)), O += P v with P rounded to the element type. K and V
// tiles are double-buffered: the next tile's copy runs under the current tile's products.
//
// dq, same grid: delta = rowsum(dO * O) of the block's rows (stored for the dk/dv kernel), then
// per key tile P = exp2(s2 - lse), dP = dO v^T, dS = P (dP - delta), dq += dS k.
//
// dk/dv, a block per (window group, head, key tile), serving windows group, group + groups,
// ...: per (window, query tile) warp w recomputes P^T and dS^T for its keys 16w..16w+15 x the
// tile's queries (from k q^T and v dO^T, with the transposed bias), adds dS to the block's
// running window sum (shared memory, in fragment order: each element has one owner thread, so
// the sum runs in window order without atomics), and accumulates dv += P^T dO, dk += dS^T q
// from its registers, over the window's query tiles. The block finally writes its window sums of dS
// (its TILE columns of the (N, N) matrix) for window_attention_dtable_backward.

namespace swin_cuda::attention {
namespace {

// The geometry of TILE-token tiles: TILE / 16 warps, each 16 query rows (or keys) of a tile.
template <int TILE>
struct Fl {
  static_assert(TILE == 48 || TILE == 64, "tiles of 48 or 64 tokens");
  static constexpr int kWarps = TILE / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeyTiles = TILE / 8;  // n-tiles of 8 tokens in a tile
};

// Starts the copy of tokens r0..r0+TILE-1 of one head's channels (src: token 0's first channel of
// the head; stride: elements between tokens) into a (TILE, HD + 8) tile; tokens >= N are zeros.
template <typename T, int HD, int TILE>
__device__ __forceinline__ void fl_load(T *tile, const T *__restrict__ src, int64_t stride, int r0,
                                        int N) {
  constexpr int LD = HD + 8, kChunks = HD / 8;
  for (int e = threadIdx.x; e < TILE * kChunks; e += blockDim.x) {
    const int r = e / kChunks, d = e % kChunks * 8, i = r0 + r;
    const bool valid = i < N;
    cp_async16_zfill(tile + r * LD + d, src + (valid ? i : 0) * stride + d, valid);
  }
}

// acc (16 rows of this warp x TILE keys) = A B^T over HD channels: A rows r0.. of tile A, B the
// TILE rows of tile B (q k^T, dO v^T).
template <typename T, int HD, int KT>
__device__ __forceinline__ void fl_products(float (&acc)[KT][4], const T *A, const T *B, int r0,
                                            int lane) {
  constexpr int LD = HD + 8;
#pragma unroll
  for (int nt = 0; nt < KT; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) acc[nt][c] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD; kk += 16) {
    uint32_t a[4];
    a_rows<LD>(a, A, r0, kk, lane);
#pragma unroll
    for (int np = 0; np < KT / 2; np++) {
      uint32_t b[4];
      b_rows<LD>(b, B, np * 16, kk, lane);
      mma16816<T>(acc[2 * np], a, b[0], b[1]);
      mma16816<T>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// S2 = S scale2 + bias2[i][j] + mask_w[i][j] log2(e) for this thread's elements: query rows
// i0 and i0 + 8, keys j0 + 8 nt + (0, 1) (j0 even); -inf for keys >= N. bias2: head h's (N, N)
// dense bias, already times log2(e). Query rows >= N (whose results are never stored) take row
// N - 1's bias, so every read stays in bounds. With N even a key pair is one 8-byte load.
// MASK_T: S is transposed (rows are keys, columns queries; bias2 then the transposed bias), and
// the mask, which is not transposed, is read at mask_w[j][i] one element at a time.
template <int KT, bool MASK_T = false>
__device__ __forceinline__ void fl_bias(float (&S)[KT][4], float scale2,
                                        const float *__restrict__ bias2,
                                        const float *__restrict__ mask_w, int i0, int j0, int N) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = min(i0 + 8 * r, N - 1);
    const int64_t row = (int64_t)i * N;
#pragma unroll
    for (int nt = 0; nt < KT; nt++) {
      const int j = j0 + nt * 8;
      float b[2] = {0.0f, 0.0f}, m[2] = {0.0f, 0.0f};
      if ((N & 1) == 0) {
        if (j < N) {
          const float2 b2 = __ldg(reinterpret_cast<const float2 *>(bias2 + row + j));
          b[0] = b2.x;
          b[1] = b2.y;
          if (MASK_T && mask_w) {
            m[0] = __ldg(mask_w + (int64_t)j * N + i);
            m[1] = __ldg(mask_w + (int64_t)(j + 1) * N + i);
          } else if (mask_w) {
            const float2 m2 = __ldg(reinterpret_cast<const float2 *>(mask_w + row + j));
            m[0] = m2.x;
            m[1] = m2.y;
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < 2; c++)
          if (j + c < N) {
            b[c] = __ldg(bias2 + row + j + c);
            if (mask_w) m[c] = __ldg(mask_w + (MASK_T ? (int64_t)(j + c) * N + i : row + j + c));
          }
      }
#pragma unroll
      for (int c = 0; c < 2; c++) {
        float &s = S[nt][2 * r + c];
        s = j + c < N ? fmaf(m[c], kLog2e, fmaf(s, scale2, b[c])) : -INFINITY;
      }
    }
  }
}

// The A operand of k-step q (keys 16q..16q+15) from a 16 x TILE accumulator tile, rounded to T.
template <typename T, int KT>
__device__ __forceinline__ void fl_a_from_acc(uint32_t (&a)[4], const float (&acc)[KT][4], int q) {
  a[0] = pack2<T>(acc[2 * q][0], acc[2 * q][1]);
  a[1] = pack2<T>(acc[2 * q][2], acc[2 * q][3]);
  a[2] = pack2<T>(acc[2 * q + 1][0], acc[2 * q + 1][1]);
  a[3] = pack2<T>(acc[2 * q + 1][2], acc[2 * q + 1][3]);
}

// out (16 rows x HD) += P (16 x TILE keys, rounded to T) times the key tile V (TILE, HD + 8):
// the products over keys (P v, dS k).
template <typename T, int HD, int KT>
__device__ __forceinline__ void fl_times_keys(float (&out)[HD / 8][4], const float (&P)[KT][4],
                                              const T *V, int lane) {
  constexpr int LD = HD + 8;
#pragma unroll
  for (int q = 0; q < KT / 2; q++) {
    uint32_t a[4];
    fl_a_from_acc<T, KT>(a, P, q);
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
template <typename T, int HD, int TILE>
__device__ __forceinline__ void fl_next_key_tile(T *kv, const T *head, int C, int64_t stride,
                                                 int kt, int ktiles, int N) {
  constexpr int kTile = TILE * (HD + 8);
  if (kt + 1 < ktiles) {
    T *next = kv + ((kt + 1) & 1) * 2 * kTile;
    fl_load<T, HD, TILE>(next, head + C, stride, (kt + 1) * TILE, N);
    fl_load<T, HD, TILE>(next + kTile, head + 2 * C, stride, (kt + 1) * TILE, N);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// bias2 (heads, N, N) = table[index[i][j]][h] log2(e), the dense bias the forward and dq kernels
// read, and at bias2 + heads N N its transpose (heads, j, i), the dk/dv kernel's.
__global__ void fl_dense_bias_kernel(float *__restrict__ bias2, const float *__restrict__ table,
                                     const int *__restrict__ index, int N, int heads) {
  const int64_t NN = (int64_t)N * N, e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= heads * NN) return;
  const int h = (int)(e / NN), i = (int)(e % NN / N), j = (int)(e % N);
  const float v = table[index[e % NN] * heads + h] * kLog2e;
  bias2[e] = v;
  bias2[heads * NN + h * NN + (int64_t)j * N + i] = v;
}

// Block (window b, head h, query tile qt) with blockIdx.x = (b * heads + h) * qtiles + qt.
template <typename T, int HD, int TILE>
__global__ void __launch_bounds__(Fl<TILE>::kThreads)
    flash_forward_kernel(T *__restrict__ out, float *__restrict__ lse, const T *__restrict__ qkv,
                         const float *__restrict__ bias, const float *__restrict__ mask, int nW,
                         int N, int C, int heads, int qtiles, float scale) {
  constexpr int kTile = TILE * (HD + 8), KT = Fl<TILE>::kKeyTiles;
  extern __shared__ float4 attention_smem[];
  T *Qs = reinterpret_cast<T *>(attention_smem);
  T *kv = Qs + kTile;  // 2 x (K, V)
  const int qt = (int)(blockIdx.x % qtiles);
  const int64_t p = blockIdx.x / qtiles, b = p / heads;
  const int h = (int)(p % heads), q0 = qt * TILE, ktiles = qtiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16, i0 = q0 + r0 + g;
  const int64_t stride = 3 * (int64_t)C;
  const T *head = qkv + b * N * stride + h * HD;  // q of token 0; k at + C, v at + 2C
  const float *bias2 = bias + (int64_t)h * N * N;
  const float *mask_w = mask ? mask + (b % nW) * N * N : nullptr;
  const float scale2 = scale * kLog2e;

  fl_load<T, HD, TILE>(Qs, head, stride, q0, N);
  fl_load<T, HD, TILE>(kv, head + C, stride, 0, N);
  fl_load<T, HD, TILE>(kv + kTile, head + 2 * C, stride, 0, N);
  cp_async_commit();

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this thread's share
  float O[HD / 8][4];
  fl_zero<HD>(O);
  for (int kt = 0; kt < ktiles; kt++) {
    const T *Ks = kv + (kt & 1) * 2 * kTile, *Vs = Ks + kTile;
    fl_next_key_tile<T, HD, TILE>(kv, head, C, stride, kt, ktiles, N);
    __syncthreads();  // this key tile (and at kt = 0 the query tile) is complete

    float S[KT][4];
    fl_products<T, HD, KT>(S, Qs, Ks, r0, lane);
    fl_bias<KT>(S, scale2, bias2, mask_w, i0, kt * TILE + 2 * t, N);
    // Key 0 of every tile is a token (< N), so the new maximum is finite.
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < KT; nt++)
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
    for (int nt = 0; nt < KT; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        S[nt][c] = fast_exp2(S[nt][c] - m[c >> 1]);  // exp2(-inf) = 0 for padded keys
        l[c >> 1] += S[nt][c];
      }
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
      for (int c = 0; c < 4; c++) O[nd][c] *= alpha[c >> 1];
    fl_times_keys<T, HD, KT>(O, S, Vs, lane);
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
template <typename T, int HD, int TILE>
__global__ void __launch_bounds__(Fl<TILE>::kThreads)
    flash_dq_kernel(T *__restrict__ dqkv, float *__restrict__ delta, const T *__restrict__ dout,
                    const T *__restrict__ qkv, const T *__restrict__ out,
                    const float *__restrict__ lse, const float *__restrict__ bias,
                    const float *__restrict__ mask, int nW, int N, int C, int heads, int qtiles,
                    float scale) {
  constexpr int kTile = TILE * (HD + 8), KT = Fl<TILE>::kKeyTiles;
  extern __shared__ float4 attention_smem[];
  T *Qs = reinterpret_cast<T *>(attention_smem);
  T *dOs = Qs + kTile;
  T *kv = dOs + kTile;  // 2 x (K, V)
  const int qt = (int)(blockIdx.x % qtiles);
  const int64_t p = blockIdx.x / qtiles, b = p / heads;
  const int h = (int)(p % heads), q0 = qt * TILE, ktiles = qtiles;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16, i0 = q0 + r0 + g;
  const int64_t stride = 3 * (int64_t)C;
  const T *head = qkv + b * N * stride + h * HD;
  const float *bias2 = bias + (int64_t)h * N * N;
  const float *mask_w = mask ? mask + (b % nW) * N * N : nullptr;
  const float scale2 = scale * kLog2e;

  fl_load<T, HD, TILE>(Qs, head, stride, q0, N);
  fl_load<T, HD, TILE>(dOs, dout + b * N * C + h * HD, C, q0, N);
  fl_load<T, HD, TILE>(kv, head + C, stride, 0, N);
  fl_load<T, HD, TILE>(kv + kTile, head + 2 * C, stride, 0, N);
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
    fl_next_key_tile<T, HD, TILE>(kv, head, C, stride, kt, ktiles, N);
    __syncthreads();

    float P[KT][4], dS[KT][4];
    fl_products<T, HD, KT>(P, Qs, Ks, r0, lane);
    fl_bias<KT>(P, scale2, bias2, mask_w, i0, kt * TILE + 2 * t, N);
    fl_products<T, HD, KT>(dS, dOs, Vs, r0, lane);  // dP
#pragma unroll
    for (int nt = 0; nt < KT; nt++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const float pr = fast_exp2(P[nt][c] - row_lse[c >> 1]);
        dS[nt][c] = pr * (dS[nt][c] - row_delta[c >> 1]);
      }
    fl_times_keys<T, HD, KT>(dq, dS, Ks, lane);
    __syncthreads();
  }
  const float mul[2] = {scale, scale};
  fl_store<T, HD>(dqkv + b * N * stride + h * HD, stride, dq, i0, N, t, mul);
}

// Block (window group, head h, key tile kt) with blockIdx.x = (group * heads + h) * ktiles + kt.
// Warp w owns keys k0 + 16w .. k0 + 16w + 15 and computes the transposed tiles S^T = k q^T and
// dP^T = v dO^T for them against a query tile, so that P^T and dS^T sit in its registers as the
// A operands of dv += P^T dO and dk += dS^T q: no warp needs another's results, and a query
// tile takes one barrier. Shared memory: the window sums of dS (qtiles x warps x query n-tiles x
// 32 float4, fragment order), K and V of the key tile, 2 x (q, dO, lse, delta) of a query tile.
template <typename T, int HD, int TILE>
__global__ void __launch_bounds__(Fl<TILE>::kThreads)
    flash_dkv_kernel(T *__restrict__ dqkv, float *__restrict__ ds_partial,
                     const T *__restrict__ dout, const T *__restrict__ qkv,
                     const float *__restrict__ lse, const float *__restrict__ delta,
                     const float *__restrict__ bias_t, const float *__restrict__ mask, int BW,
                     int nW, int N, int C, int heads, int ktiles, int groups, float scale) {
  using G = Fl<TILE>;
  constexpr int KT = G::kKeyTiles;
  constexpr int kTile = TILE * (HD + 8), kFrag = G::kWarps * KT * 32;
  // One query tile's buffers: q, dO (T), then lse, delta (f32).
  constexpr int kQueryBytes = 2 * kTile * (int)sizeof(T) + 2 * TILE * (int)sizeof(float);
  static_assert(kQueryBytes % 16 == 0, "query buffers stay 16-byte aligned");
  const int qtiles = ktiles;
  extern __shared__ float4 attention_smem[];
  float4 *dsum = attention_smem;  // (qtiles, kFrag)
  T *Ks = reinterpret_cast<T *>(dsum + qtiles * kFrag), *Vs = Ks + kTile;
  unsigned char *qbuf = reinterpret_cast<unsigned char *>(Vs + kTile);  // 2 x kQueryBytes
  const int kt = (int)(blockIdx.x % ktiles), k0 = kt * TILE;
  const int h = (int)(blockIdx.x / ktiles % heads), group = (int)(blockIdx.x / ktiles / heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = warp * 16, j0 = k0 + r0 + g;  // this thread's keys j0 and j0 + 8
  const int64_t stride = 3 * (int64_t)C;
  const float *biasT = bias_t + (int64_t)h * N * N;
  const float scale2 = scale * kLog2e;
  float4 *my_sum = dsum + warp * KT * 32 + lane;  // + qt * kFrag + nt * 32
  for (int e = threadIdx.x; e < qtiles * kFrag; e += blockDim.x)
    dsum[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  // Iteration it serves query tile it % qtiles of window group + (it / qtiles) groups. Query
  // columns past the window get q = dO = 0 and lse = delta = 0, and their scores -inf: P = 0.
  const int64_t windows = (BW - group + groups - 1) / groups, iters = windows * qtiles;
  auto load_queries = [&](int64_t it, unsigned char *dst) {
    const int64_t b = group + it / qtiles * groups, p = b * heads + h;
    const int q0 = (int)(it % qtiles) * TILE;
    T *q = reinterpret_cast<T *>(dst);
    float *stats = reinterpret_cast<float *>(q + 2 * kTile);
    fl_load<T, HD, TILE>(q, qkv + b * N * stride + h * HD, stride, q0, N);
    fl_load<T, HD, TILE>(q + kTile, dout + b * N * C + h * HD, C, q0, N);
    for (int e = threadIdx.x; e < 2 * TILE; e += blockDim.x) {
      const int i = q0 + e % TILE;
      const float *src = (e < TILE ? lse : delta) + p * N + (i < N ? i : 0);
      cp_async4_zfill(stats + e, src, i < N);
    }
    cp_async_commit();
  };
  load_queries(0, qbuf);

  float dk[HD / 8][4], dv[HD / 8][4];
  fl_zero<HD>(dk);
  fl_zero<HD>(dv);
  for (int64_t it = 0; it < iters; it++) {
    const int64_t b = group + it / qtiles * groups;
    const int qt = (int)(it % qtiles), q0 = qt * TILE;
    const T *head = qkv + b * N * stride + h * HD;
    const T *Qs = reinterpret_cast<const T *>(qbuf + (it & 1) * kQueryBytes), *dOs = Qs + kTile;
    const float *lse_s = reinterpret_cast<const float *>(dOs + kTile), *delta_s = lse_s + TILE;
    if (qt == 0) {  // the window's keys (the previous window's last barrier freed the tiles)
      fl_load<T, HD, TILE>(Ks, head + C, stride, k0, N);
      fl_load<T, HD, TILE>(Vs, head + 2 * C, stride, k0, N);
      cp_async_commit();
    }
    if (it + 1 < iters) {
      load_queries(it + 1, qbuf + ((it + 1) & 1) * kQueryBytes);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this iteration's q, dO, lse, delta (and keys) are complete

    const float *mask_w = mask ? mask + (b % nW) * N * N : nullptr;
    float P[KT][4], dS[KT][4];  // transposed: this warp's 16 keys x the tile's queries
    fl_products<T, HD, KT>(P, Ks, Qs, r0, lane);
    fl_bias<KT, true>(P, scale2, biasT, mask_w, j0, q0 + 2 * t, N);
    fl_products<T, HD, KT>(dS, Vs, dOs, r0, lane);  // dP^T
#pragma unroll
    for (int nt = 0; nt < KT; nt++) {
      const float2 l2 = *reinterpret_cast<const float2 *>(lse_s + nt * 8 + 2 * t);
      const float2 d2 = *reinterpret_cast<const float2 *>(delta_s + nt * 8 + 2 * t);
      const float row_lse[2] = {l2.x, l2.y}, row_delta[2] = {d2.x, d2.y};
#pragma unroll
      for (int c = 0; c < 4; c++) {
        P[nt][c] = fast_exp2(P[nt][c] - row_lse[c & 1]);
        dS[nt][c] = P[nt][c] * (dS[nt][c] - row_delta[c & 1]);
      }
      float4 *sum = my_sum + qt * kFrag + nt * 32;
      const float4 old = *sum;
      *sum =
          make_float4(old.x + dS[nt][0], old.y + dS[nt][1], old.z + dS[nt][2], old.w + dS[nt][3]);
    }
    fl_times_keys<T, HD, KT>(dv, P, dOs, lane);  // dv += P^T dO
    fl_times_keys<T, HD, KT>(dk, dS, Qs, lane);  // dk += dS^T q
    if (qt == qtiles - 1) {  // the window's last query tile: its dk, dv are complete
      T *dst = dqkv + b * N * stride + h * HD;
      const float mul_k[2] = {scale, scale}, mul_v[2] = {1.0f, 1.0f};
      fl_store<T, HD>(dst + C, stride, dk, j0, N, t, mul_k);
      fl_store<T, HD>(dst + 2 * C, stride, dv, j0, N, t, mul_v);
      fl_zero<HD>(dk);
      fl_zero<HD>(dv);
    }
    __syncthreads();  // every warp is done with the tiles before the next iteration's copies
  }

  // The block's window sums of dS: element (key j, query i) of the fragments to row i < N,
  // column j < N of (group, h) in ds_partial.
  float *part = ds_partial + ((int64_t)group * heads + h) * N * N;
  for (int qt = 0; qt < qtiles; qt++)
#pragma unroll
    for (int nt = 0; nt < KT; nt++) {
      const float4 s4 = my_sum[qt * kFrag + nt * 32];
      const float s[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int j = j0 + (c >= 2 ? 8 : 0);
        const int i = qt * TILE + nt * 8 + 2 * t + (c & 1);
        if (i < N && j < N) part[(int64_t)i * N + j] = s[c];
      }
    }
}

size_t fl_forward_smem(int tile, int hd) {
  return sizeof(uint16_t) * 5 * tile * (size_t)(hd + 8);
}
size_t fl_dq_smem(int tile, int hd) {
  return sizeof(uint16_t) * 6 * tile * (size_t)(hd + 8);
}
size_t fl_dkv_smem(int N, int tile, int hd) {
  const size_t tiles = (size_t)((N + tile - 1) / tile);
  return sizeof(float) * tiles * tile * tile +  // the dS window sums of tiles x TILE rows
         sizeof(uint16_t) * (size_t)6 * tile * (hd + 8) + sizeof(float) * 4 * tile;
}

// Blocks of a dk/dv launch: as many as the SMs hold by shared memory and by a register budget of
// 160 per thread (ptxas: 136-147 for head_dim 16 and 32; the head_dim 64 kernels use up to 186,
// and their shared memory already holds them to blocks that fit), in one wave; a function of the
// shapes and the SM count only.
int fl_dkv_blocks(int N, int hd) {
  constexpr size_t kSmPerSm = 228 * 1024, kReservedPerBlock = 1024;
  constexpr int kRegsPerSm = 65536, kRegsPerThread = 160;
  const int tile = flash_tc_tile(N), threads = tile / 16 * 32;
  int by_smem = (int)(kSmPerSm / (fl_dkv_smem(N, tile, hd) + kReservedPerBlock));
  int by_regs = kRegsPerSm / (kRegsPerThread * threads);
  int per_sm = by_smem < by_regs ? by_smem : by_regs;
  if (per_sm < 1) per_sm = 1;
  int blocks = device_sm_count() * per_sm;
  return blocks < WINDOW_ATTENTION_CUDA_MAX_BLOCKS ? blocks : WINDOW_ATTENTION_CUDA_MAX_BLOCKS;
}

// Calls f(HD, TILE) with both as integral constants.
template <typename F>
void fl_with_shape(int hd, int tile, F f) {
  auto with_tile = [&](auto HD) {
    if (tile == 48)
      f(HD, std::integral_constant<int, 48>{});
    else
      f(HD, std::integral_constant<int, 64>{});
  };
  switch (hd) {
    case 16:
      with_tile(std::integral_constant<int, 16>{});
      break;
    case 32:
      with_tile(std::integral_constant<int, 32>{});
      break;
    case 64:
      with_tile(std::integral_constant<int, 64>{});
      break;
    default:
      fprintf(stderr, "window attention: no flash tensor-core kernel for head_dim %d\n", hd);
      abort();
  }
}

// The grid of the forward and dq kernels: a block per (window, head, query tile).
unsigned fl_query_grid(const char *fn, int BW, int tiles, int heads) {
  int64_t blocks = (int64_t)BW * heads * tiles;
  if (blocks > 0x7fffffff) {
    fprintf(stderr, "%s: %lld blocks (BW=%d heads=%d tiles=%d) exceed the grid\n", fn,
            (long long)blocks, BW, heads, tiles);
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

int flash_tc_tile(int N) {
  return (N + 47) / 48 * 48 < (N + 63) / 64 * 64 ? 48 : 64;
}

void window_attention_forward_flash_tc(DType dt, void *out, float *lse, float *bias,
                                       const void *qkv, const float *table, const int *index,
                                       const float *mask, int BW, int nW, int N, int C, int heads,
                                       float scale, cudaStream_t stream) {
  const int hd = C / heads, tile = flash_tc_tile(N), tiles = (N + tile - 1) / tile;
  fl_check_alignment("window_attention_forward_cuda", out, qkv, nullptr);
  const unsigned grid = fl_query_grid("window_attention_forward_cuda", BW, tiles, heads);
  const size_t smem = fl_forward_smem(tile, hd);
  const int64_t bias_n = (int64_t)heads * N * N;
  fl_dense_bias_kernel<<<(unsigned)((bias_n + 255) / 256), 256, 0, stream>>>(bias, table, index, N,
                                                                             heads);
  CUDA_CHECK_LAUNCH();
  SWIN_DISPATCH(dt, T, {
    if constexpr (sizeof(T) == 2) {
      fl_with_shape(hd, tile, [&](auto HD, auto TILE) {
        constexpr int kTileN = decltype(TILE)::value;
        auto kernel = flash_forward_kernel<T, decltype(HD)::value, kTileN>;
        allow_smem(kernel, smem);
        kernel<<<grid, Fl<kTileN>::kThreads, smem, stream>>>(
            static_cast<T *>(out), lse, static_cast<const T *>(qkv), bias, mask, mask ? nW : 1, N,
            C, heads, tiles, scale);
      });
    }
  });
  CUDA_CHECK_LAUNCH();
}

int window_attention_backward_flash_tc_groups(int BW, int N, int C, int heads) {
  const int tile = flash_tc_tile(N);
  return flash_groups(fl_dkv_blocks(N, C / heads), BW, (N + tile - 1) / tile, heads);
}

int window_attention_backward_flash_tc(DType dt, void *dqkv, const void *dout, const void *qkv,
                                       const void *out, const float *lse, float *delta,
                                       const float *bias, const float *mask, int BW, int nW, int N,
                                       int C, int heads, float scale, float *ds_partial,
                                       cudaStream_t stream) {
  const int hd = C / heads, tile = flash_tc_tile(N), tiles = (N + tile - 1) / tile;
  fl_check_alignment("window_attention_backward_cuda", dqkv, dout, qkv);
  fl_check_alignment("window_attention_backward_cuda", out, out, nullptr);
  const unsigned grid = fl_query_grid("window_attention_backward_cuda", BW, tiles, heads);
  const int groups = window_attention_backward_flash_tc_groups(BW, N, C, heads);
  const size_t dq_smem = fl_dq_smem(tile, hd), dkv_smem = fl_dkv_smem(N, tile, hd);
  const int mask_nW = mask ? nW : 1;
  SWIN_DISPATCH(dt, T, {
    if constexpr (sizeof(T) == 2) {
      fl_with_shape(hd, tile, [&](auto HD, auto TILE) {
        constexpr int kHd = decltype(HD)::value, kTileN = decltype(TILE)::value;
        constexpr int kThreads = Fl<kTileN>::kThreads;
        auto dq_kernel = flash_dq_kernel<T, kHd, kTileN>;
        allow_smem(dq_kernel, dq_smem);
        dq_kernel<<<grid, kThreads, dq_smem, stream>>>(
            static_cast<T *>(dqkv), delta, static_cast<const T *>(dout),
            static_cast<const T *>(qkv), static_cast<const T *>(out), lse, bias, mask, mask_nW, N,
            C, heads, tiles, scale);
        CUDA_CHECK_LAUNCH();
        auto dkv_kernel = flash_dkv_kernel<T, kHd, kTileN>;
        allow_smem(dkv_kernel, dkv_smem);
        dkv_kernel<<<(unsigned)(groups * heads * tiles), kThreads, dkv_smem, stream>>>(
            static_cast<T *>(dqkv), ds_partial, static_cast<const T *>(dout),
            static_cast<const T *>(qkv), lse, delta, bias + (int64_t)heads * N * N, mask, BW,
            mask_nW, N, C, heads, tiles, groups, scale);
      });
    }
  });
  CUDA_CHECK_LAUNCH();
  return groups;
}

}  // namespace swin_cuda::attention
