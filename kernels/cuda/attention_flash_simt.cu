// attention_flash_simt.cu: the flash SIMT window-attention kernels, forward and backward, for
// windows of more than 64 tokens: f32 always, bf16 and f16 for the head dims the flash
// tensor-core kernels (attention_flash_tc.cu) do not take. Keys (and in the dk/dv kernel
// queries) stream through f32 shared memory in tiles of kFlashKeys, all arithmetic is in f32, and
// the forward keeps each query row's base-2 log-sum-exp instead of P; with their launchers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/attention.cuh"

// A thread serves one row (a query or a key) of a tile, or, with head_dim > 32, one half of it:
// the head dim is padded to HDP = 32 or 64 (zeros beyond hd, so fully unrolled loops are exact),
// a row has HDP / 32 adjacent threads, and each holds 32 of its head dims in registers, the
// float4 groups part, part + split, ... (part < split = HDP / 32). A dot product over the head
// dim is then one partial sum per thread plus one shuffle, and the threads of a row read
// adjacent 16-byte words of a shared row.
//
// Tiles of q, k, v and dO are (kRows, ld) floats, row-major (token, channel) as in global memory,
// staged with the channel fastest so that global reads and writes are coalesced over the head's
// channels. The inner loops read them as broadcasts (all threads one row); ld = HDP + 4 * split
// spreads the rows over the banks where each thread moves its own row between a tile and its
// registers. The scores' bias and mask go through a (kRows, kFlashKeys + 1) tile: the odd row
// length keeps both a row per thread (forward, dq) and a column per thread (dk/dv) free of bank
// conflicts.
//
// Scores carry a factor log2(e), as in the tensor-core kernels: s2 = (q . k) * scale * log2(e)
// + (table + mask) * log2(e), so P = exp2(s2 - lse) with lse the row's base-2 log-sum-exp. All
// three kernels form s2 with the same operations in the same order, so the backward's scores
// are the forward's bit for bit.

namespace swin_cuda::attention {
namespace {

constexpr int kDims = 32;          // head dims a thread holds of its row
constexpr int kRows = kFlashKeys;  // query rows of a forward / dq block and of a streamed tile
constexpr int kBiasLd = kFlashKeys + 1;
// The dk/dv kernel's threads form two groups that take the even and the odd query rows of a
// tile, so that a block has 4 warps at least (at N = 576 one block fills an SM's shared memory).
constexpr int kQueryGroups = 2;
// Shared memory of an H100 / H200 SM and the part the runtime keeps per block: the dk/dv grid
// is sized from them, so that its partition (and dtable's summation order) is a function of
// the shapes and the SM count only.
constexpr size_t kSmemPerSm = 228 * 1024, kSmemReservedPerBlock = 1024;

constexpr int head_dim_padded(int hd) {
  return hd <= 32 ? 32 : 64;
}
__host__ __device__ constexpr int split(int hdp) {
  return hdp / kDims;
}
__host__ __device__ constexpr int tile_ld(int hdp) {
  return hdp + 4 * split(hdp);
}
// Shared bytes of the forward and dq kernels: two (kRows, ld) tiles and the bias tile.
constexpr size_t row_smem_bytes(int hdp) {
  return sizeof(float) * ((size_t)2 * kRows * tile_ld(hdp) + (size_t)kRows * kBiasLd);
}
// Of the dk/dv kernel: the q and dO tiles, the bias tile, lse and delta of the tile's rows and
// dsum (N, kFlashKeys).
constexpr size_t dkdv_smem_bytes(int N, int hdp) {
  return sizeof(float) * ((size_t)2 * kRows * tile_ld(hdp) + (size_t)kRows * kBiasLd +
                          (size_t)2 * kRows + (size_t)N * kFlashKeys);
}
int query_tiles(int N) {
  return (N + kRows - 1) / kRows;
}

// ---- per-thread row pieces --------------------------------------------------------------------
// The thread's 32 head dims of a tile row (float4 groups part, part + SPLIT, ...).
template <int SPLIT>
__device__ __forceinline__ void load_part(float (&x)[kDims], const float *row, int part) {
  const float4 *r4 = reinterpret_cast<const float4 *>(row);
#pragma unroll
  for (int t = 0; t < kDims / 4; t++) {
    float4 y = r4[t * SPLIT + part];
    x[4 * t] = y.x, x[4 * t + 1] = y.y, x[4 * t + 2] = y.z, x[4 * t + 3] = y.w;
  }
}
template <int SPLIT>
__device__ __forceinline__ void store_part(float *row, const float (&x)[kDims], int part) {
  float4 *r4 = reinterpret_cast<float4 *>(row);
#pragma unroll
  for (int t = 0; t < kDims / 4; t++)
    r4[t * SPLIT + part] = make_float4(x[4 * t], x[4 * t + 1], x[4 * t + 2], x[4 * t + 3]);
}

// x . row over the whole head dim: the thread's part in four chains, plus the row partner's part
// (a + b on one thread, b + a on the other: the same bits).
template <int SPLIT>
__device__ __forceinline__ float row_dot(const float (&x)[kDims], const float *row, int part) {
  static_assert(SPLIT == 1 || SPLIT == 2, "a row has one or two threads");
  const float4 *r4 = reinterpret_cast<const float4 *>(row);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int t = 0; t < kDims / 4; t++) {
    float4 y = r4[t * SPLIT + part];
    acc.x = fmaf(x[4 * t], y.x, acc.x);
    acc.y = fmaf(x[4 * t + 1], y.y, acc.y);
    acc.z = fmaf(x[4 * t + 2], y.z, acc.z);
    acc.w = fmaf(x[4 * t + 3], y.w, acc.w);
  }
  float s = (acc.x + acc.y) + (acc.z + acc.w);
  if constexpr (SPLIT == 2) s += __shfl_xor_sync(kFullMask, s, 1);
  return s;
}

// acc += a * row on the thread's head dims.
template <int SPLIT>
__device__ __forceinline__ void axpy_part(float (&acc)[kDims], float a, const float *row,
                                          int part) {
  const float4 *r4 = reinterpret_cast<const float4 *>(row);
#pragma unroll
  for (int t = 0; t < kDims / 4; t++) {
    float4 y = r4[t * SPLIT + part];
    acc[4 * t] = fmaf(a, y.x, acc[4 * t]);
    acc[4 * t + 1] = fmaf(a, y.y, acc[4 * t + 1]);
    acc[4 * t + 2] = fmaf(a, y.z, acc[4 * t + 2]);
    acc[4 * t + 3] = fmaf(a, y.w, acc[4 * t + 3]);
  }
}

// The base-2 score of x and a row: (x . row) * qk_scale + bias2, qk_scale = scale * log2(e).
template <int SPLIT>
__device__ __forceinline__ float score2(const float (&x)[kDims], const float *row, int part,
                                        float qk_scale, float bias2) {
  return fmaf(row_dot<SPLIT>(x, row, part), qk_scale, bias2);
}

// ---- block-wide staging ---------------------------------------------------------------------
// Rows r < rows of a (rows, hd) slice of T (row r at src + r * src_ld) into tile (kRows, ld) as
// float; zeros in the other rows and in channels hd..HDP-1.
template <typename T, int HDP>
__device__ void stage_rows(float *tile, const T *__restrict__ src, int64_t src_ld, int rows,
                           int hd) {
  for (int e = threadIdx.x; e < kRows * HDP; e += blockDim.x) {
    int r = e / HDP, d = e % HDP;
    tile[r * tile_ld(HDP) + d] = r < rows && d < hd ? to_float<T>(src[r * src_ld + d]) : 0.0f;
  }
}
// The inverse for rows r < rows and channels d < hd: tile to dst (row r at dst + r * dst_ld) as T.
template <typename T, int HDP>
__device__ void store_rows(T *__restrict__ dst, int64_t dst_ld, const float *tile, int rows,
                           int hd) {
  for (int e = threadIdx.x; e < kRows * HDP; e += blockDim.x) {
    int r = e / HDP, d = e % HDP;
    if (r < rows && d < hd) dst[r * dst_ld + d] = from_float<T>(tile[r * tile_ld(HDP) + d]);
  }
}
// The additive part of the base-2 scores of queries q0 + r (r < rows) and keys k0 + c (c < keys)
// of head h, (table[index[i][j]][h] + mask[i][j]) * log2(e), into bias (kRows, kBiasLd); zeros
// elsewhere. mask_win: the window's (N, N) mask or NULL.
__device__ void stage_bias(float *bias, const float *__restrict__ table,
                           const int *__restrict__ index, const float *__restrict__ mask_win, int N,
                           int heads, int h, int q0, int rows, int k0, int keys) {
  for (int e = threadIdx.x; e < kRows * kFlashKeys; e += blockDim.x) {
    int r = e / kFlashKeys, c = e % kFlashKeys;
    float v = 0.0f;
    if (r < rows && c < keys) {
      int ij = (q0 + r) * N + k0 + c;
      v = table[index[ij] * heads + h];
      if (mask_win) v += mask_win[ij];
      v *= kLog2e;
    }
    bias[r * kBiasLd + c] = v;
  }
}

// ---- kernels ----------------------------------------------------------------------------------
// Forward. A 1-D grid of one block per (window b, head h, query tile), the tile fastest; a query
// row per split threads (thread = row * split + part). Shared: k and v of the current key tile
// (kRows, ld) each, and its bias tile; q comes in and out goes back through the k tile. Online
// softmax per key in registers: a new row max rescales the row's sum and accumulator.
template <typename T, int HDP>
__global__ void __launch_bounds__(kRows *split(HDP))
    window_attention_forward_flash_kernel(T *__restrict__ out, float *__restrict__ lse,
                                          const T *__restrict__ qkv,
                                          const float *__restrict__ table,
                                          const int *__restrict__ index,
                                          const float *__restrict__ mask, int nW, int N, int C,
                                          int heads, int tiles, float qk_scale) {
  constexpr int kSplit = split(HDP), kLd = tile_ld(HDP);
  extern __shared__ float4 flash_smem[];              // float4: 16-byte aligned rows
  float *kt = reinterpret_cast<float *>(flash_smem);  // (kRows, kLd)
  float *vt = kt + kRows * kLd;                       // (kRows, kLd)
  float *bias = vt + kRows * kLd;                     // (kRows, kBiasLd)
  const int hd = C / heads;
  const int64_t p = blockIdx.x / tiles;
  const int b = (int)(p / heads), h = (int)(p % heads);
  const int q0 = (int)(blockIdx.x % tiles) * kRows, rows = min(kRows, N - q0);
  const int r = threadIdx.x / kSplit, part = threadIdx.x % kSplit;
  const T *qkv_win = qkv + (int64_t)b * N * 3 * C + h * hd;  // token 0, q of head h
  const float *mask_win = mask ? mask + (int64_t)(b % nW) * N * N : nullptr;

  float q[kDims], o[kDims];
  stage_rows<T, HDP>(kt, qkv_win + (int64_t)q0 * 3 * C, 3 * C, rows, hd);
  __syncthreads();
  load_part<kSplit>(q, kt + r * kLd, part);
#pragma unroll
  for (int d = 0; d < kDims; d++) o[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // the row's running max and sum of exp2(s2 - m)
  for (int k0 = 0; k0 < N; k0 += kFlashKeys) {
    const int keys = min(kFlashKeys, N - k0);
    __syncthreads();  // the previous tile (or q) has been read
    stage_rows<T, HDP>(kt, qkv_win + (int64_t)k0 * 3 * C + C, 3 * C, keys, hd);
    stage_rows<T, HDP>(vt, qkv_win + (int64_t)k0 * 3 * C + 2 * C, 3 * C, keys, hd);
    stage_bias(bias, table, index, mask_win, N, heads, h, q0, rows, k0, keys);
    __syncthreads();
    for (int c = 0; c < keys; c++) {
      float s = score2<kSplit>(q, kt + c * kLd, part, qk_scale, bias[r * kBiasLd + c]);
      if (s > m) {  // the first key, or a new max: exp2(-inf) = 0 clears the empty state
        float alpha = exp2f(m - s);
        l *= alpha;
#pragma unroll
        for (int d = 0; d < kDims; d++) o[d] *= alpha;
        m = s;
      }
      float e = exp2f(s - m);
      l += e;
      axpy_part<kSplit>(o, e, vt + c * kLd, part);
    }
  }
  const int i = q0 + r;
  if (part == 0 && i < N) lse[p * N + i] = m + log2f(l);
  const float inv = 1.0f / l;
#pragma unroll
  for (int d = 0; d < kDims; d++) o[d] *= inv;
  __syncthreads();
  store_part<kSplit>(kt + r * kLd, o, part);
  __syncthreads();
  store_rows<T, HDP>(out + ((int64_t)b * N + q0) * C + h * hd, C, kt, rows, hd);
}

// Backward, dq. The forward's grid and thread mapping. delta = dO . O per query row (O as the
// forward stored it) goes to delta for the dk/dv kernel; then per key of each tile
// p = exp2(s2 - lse), dp = dO . v, ds = p (dp - delta), dq += ds k; dq * scale is stored. Shared
// as the forward: k and v tiles (q, dO, O in, dq out through them) and the bias tile.
template <typename T, int HDP>
__global__ void __launch_bounds__(kRows *split(HDP)) window_attention_backward_flash_dq_kernel(
    T *__restrict__ dqkv, float *__restrict__ delta, const T *__restrict__ dout,
    const T *__restrict__ qkv, const T *__restrict__ out, const float *__restrict__ lse,
    const float *__restrict__ table, const int *__restrict__ index, const float *__restrict__ mask,
    int nW, int N, int C, int heads, int tiles, float qk_scale, float scale) {
  constexpr int kSplit = split(HDP), kLd = tile_ld(HDP);
  extern __shared__ float4 flash_smem[];
  float *kt = reinterpret_cast<float *>(flash_smem);  // (kRows, kLd)
  float *vt = kt + kRows * kLd;                       // (kRows, kLd)
  float *bias = vt + kRows * kLd;                     // (kRows, kBiasLd)
  const int hd = C / heads;
  const int64_t p = blockIdx.x / tiles;
  const int b = (int)(p / heads), h = (int)(p % heads);
  const int q0 = (int)(blockIdx.x % tiles) * kRows, rows = min(kRows, N - q0);
  const int r = threadIdx.x / kSplit, part = threadIdx.x % kSplit;
  const int i = q0 + r;
  const T *qkv_win = qkv + (int64_t)b * N * 3 * C + h * hd;
  const int64_t rows_off = ((int64_t)b * N + q0) * C + h * hd;  // row q0 of out and dout
  const float *mask_win = mask ? mask + (int64_t)(b % nW) * N * N : nullptr;

  float q[kDims], dO[kDims], dq[kDims];
  stage_rows<T, HDP>(kt, qkv_win + (int64_t)q0 * 3 * C, 3 * C, rows, hd);
  stage_rows<T, HDP>(vt, dout + rows_off, C, rows, hd);
  __syncthreads();
  load_part<kSplit>(q, kt + r * kLd, part);
  load_part<kSplit>(dO, vt + r * kLd, part);
  __syncthreads();
  stage_rows<T, HDP>(kt, out + rows_off, C, rows, hd);
  __syncthreads();
  const float delta_i = row_dot<kSplit>(dO, kt + r * kLd, part);
  if (part == 0 && i < N) delta[p * N + i] = delta_i;
  const float lse_i = i < N ? lse[p * N + i] : 0.0f;  // rows past N: q = dO = 0, so ds = 0

#pragma unroll
  for (int d = 0; d < kDims; d++) dq[d] = 0.0f;
  for (int k0 = 0; k0 < N; k0 += kFlashKeys) {
    const int keys = min(kFlashKeys, N - k0);
    __syncthreads();  // the previous tile (or O) has been read
    stage_rows<T, HDP>(kt, qkv_win + (int64_t)k0 * 3 * C + C, 3 * C, keys, hd);
    stage_rows<T, HDP>(vt, qkv_win + (int64_t)k0 * 3 * C + 2 * C, 3 * C, keys, hd);
    stage_bias(bias, table, index, mask_win, N, heads, h, q0, rows, k0, keys);
    __syncthreads();
    for (int c = 0; c < keys; c++) {
      const float *kc = kt + c * kLd;
      float pij = exp2f(score2<kSplit>(q, kc, part, qk_scale, bias[r * kBiasLd + c]) - lse_i);
      float ds = pij * (row_dot<kSplit>(dO, vt + c * kLd, part) - delta_i);
      axpy_part<kSplit>(dq, ds, kc, part);
    }
  }
#pragma unroll
  for (int d = 0; d < kDims; d++) dq[d] *= scale;
  __syncthreads();
  store_part<kSplit>(kt + r * kLd, dq, part);
  __syncthreads();
  store_rows<T, HDP>(dqkv + ((int64_t)b * N + q0) * 3 * C + h * hd, 3 * C, kt, rows, hd);
}

// Backward, dk and dv, and the window sums of dS. A 1-D grid of groups * heads * key tiles
// blocks, block (group, h, tile) with the tile fastest: the block owns keys k0 = tile *
// kFlashKeys .. min(N, k0 + kFlashKeys) of head h and serves windows b = group, group + groups,
// ... in increasing order. Thread = (query group g, key c, part), g slowest: each holds its key's
// k and v (from the tiles) and dk, dv sums in registers, and takes the tile rows r = g, g + 2, ...
// of each streamed query tile (q and dO (kRows, ld), the bias tile, lse and delta of its rows).
// Group 1 hands its dk, dv sums to group 0 through the q and dO tiles at the end of each window,
// and those carry dk * scale and dv out.
// dsum (N, kFlashKeys), key fastest (consecutive keys in consecutive banks), sums dS[i][j] over
// the block's windows; element (i, c) belongs to thread (i % 2, c, part 0) alone, which zeroes
// it, adds each window's dS in window order and stores it to the group's row of ds_partial.
template <typename T, int HDP>
__global__ void __launch_bounds__(kQueryGroups *kFlashKeys *split(HDP))
    window_attention_backward_flash_dkdv_kernel(
        T *__restrict__ dqkv, float *__restrict__ ds_partial, const T *__restrict__ dout,
        const T *__restrict__ qkv, const float *__restrict__ lse, const float *__restrict__ delta,
        const float *__restrict__ table, const int *__restrict__ index,
        const float *__restrict__ mask, int BW, int nW, int N, int C, int heads, int groups,
        int key_tiles, float qk_scale, float scale) {
  static_assert(kQueryGroups == 2, "group 1 hands its sums to group 0 through two tiles");
  constexpr int kSplit = split(HDP), kLd = tile_ld(HDP);
  extern __shared__ float4 flash_smem[];
  float *qt = reinterpret_cast<float *>(flash_smem);  // (kRows, kLd): q tile; k in, dk out
  float *dOt = qt + kRows * kLd;                      // (kRows, kLd): dO tile; v in, dv out
  float *bias = dOt + kRows * kLd;                    // (kRows, kBiasLd)
  float *lse_t = bias + kRows * kBiasLd;              // (kRows)
  float *delta_t = lse_t + kRows;                     // (kRows)
  float *dsum = delta_t + kRows;                      // (N, kFlashKeys)
  const int hd = C / heads;
  const int pair = (int)blockIdx.x / key_tiles;  // group * heads + h
  const int h = pair % heads, group = pair / heads;
  const int k0 = (int)blockIdx.x % key_tiles * kFlashKeys, keys = min(kFlashKeys, N - k0);
  const int g = threadIdx.x / (kFlashKeys * kSplit);
  const int c = threadIdx.x / kSplit % kFlashKeys, part = threadIdx.x % kSplit;
  const bool owner = part == 0, key_in = c < keys;

  if (owner)
    for (int i = g; i < N; i += kQueryGroups) dsum[i * kFlashKeys + c] = 0.0f;
  float k[kDims], v[kDims], dk[kDims], dv[kDims];
  for (int b = group; b < BW; b += groups) {
    const int64_t p = (int64_t)b * heads + h;
    const T *qkv_win = qkv + (int64_t)b * N * 3 * C + h * hd;
    const T *dout_win = dout + (int64_t)b * N * C + h * hd;
    const float *mask_win = mask ? mask + (int64_t)(b % nW) * N * N : nullptr;
    __syncthreads();  // the previous window's dk and dv have been stored
    stage_rows<T, HDP>(qt, qkv_win + (int64_t)k0 * 3 * C + C, 3 * C, keys, hd);
    stage_rows<T, HDP>(dOt, qkv_win + (int64_t)k0 * 3 * C + 2 * C, 3 * C, keys, hd);
    __syncthreads();
    load_part<kSplit>(k, qt + c * kLd, part);
    load_part<kSplit>(v, dOt + c * kLd, part);
#pragma unroll
    for (int d = 0; d < kDims; d++) dk[d] = dv[d] = 0.0f;

    for (int q0 = 0; q0 < N; q0 += kRows) {
      const int rows = min(kRows, N - q0);
      __syncthreads();  // the previous tile (or k and v) has been read
      stage_rows<T, HDP>(qt, qkv_win + (int64_t)q0 * 3 * C, 3 * C, rows, hd);
      stage_rows<T, HDP>(dOt, dout_win + (int64_t)q0 * C, C, rows, hd);
      for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        lse_t[r] = lse[p * N + q0 + r];
        delta_t[r] = delta[p * N + q0 + r];
      }
      stage_bias(bias, table, index, mask_win, N, heads, h, q0, rows, k0, keys);
      __syncthreads();
      for (int r = g; r < rows; r += kQueryGroups) {
        const float *qr = qt + r * kLd, *dOr = dOt + r * kLd;
        float s = score2<kSplit>(k, qr, part, qk_scale, bias[r * kBiasLd + c]);
        float pij = key_in ? exp2f(s - lse_t[r]) : 0.0f;  // keys past N contribute nothing
        float ds = pij * (row_dot<kSplit>(v, dOr, part) - delta_t[r]);
        axpy_part<kSplit>(dv, pij, dOr, part);
        axpy_part<kSplit>(dk, ds, qr, part);
        if (owner) dsum[(q0 + r) * kFlashKeys + c] += ds;
      }
    }

    __syncthreads();  // the last query tile has been read
    if (g == 1) {
      store_part<kSplit>(qt + c * kLd, dk, part);
      store_part<kSplit>(dOt + c * kLd, dv, part);
    }
    __syncthreads();
    if (g == 0) {  // group 0's sums + group 1's, in that order
      float other[kDims];
      load_part<kSplit>(other, qt + c * kLd, part);
#pragma unroll
      for (int d = 0; d < kDims; d++) dk[d] = (dk[d] + other[d]) * scale;
      store_part<kSplit>(qt + c * kLd, dk, part);
      load_part<kSplit>(other, dOt + c * kLd, part);
#pragma unroll
      for (int d = 0; d < kDims; d++) dv[d] += other[d];
      store_part<kSplit>(dOt + c * kLd, dv, part);
    }
    __syncthreads();
    T *dqkv_keys = dqkv + ((int64_t)b * N + k0) * 3 * C + h * hd;
    store_rows<T, HDP>(dqkv_keys + C, 3 * C, qt, keys, hd);
    store_rows<T, HDP>(dqkv_keys + 2 * C, 3 * C, dOt, keys, hd);
  }

  if (owner && key_in) {
    float *ds_out = ds_partial + (int64_t)pair * N * N + k0 + c;
    for (int i = g; i < N; i += kQueryGroups) ds_out[(int64_t)i * N] = dsum[i * kFlashKeys + c];
  }
}

// ---- launchers --------------------------------------------------------------------------------
// The forward and dq grid: BW * heads * query tiles blocks, which a 1-D grid holds below 2^31.
unsigned query_tile_grid(const char *fn, int BW, int N, int heads) {
  int64_t blocks = (int64_t)BW * heads * query_tiles(N);
  if (blocks >= 0x7fffffff) {
    fprintf(stderr,
            "%s (%s:%d): BW=%d x heads=%d x %d query tiles of N=%d = %lld thread blocks, more "
            "than a CUDA grid holds (2^31 - 1)\n"
            "HINT: use a smaller batch\n",
            fn, __FILE__, __LINE__, BW, heads, query_tiles(N), N, (long long)blocks);
    abort();
  }
  return (unsigned)blocks;
}

// The dk/dv kernel's window groups: about as many blocks as fit the device at once by shared
// memory (a function of the shapes and the SM count, never of occupancy queries).
int dkdv_groups(int BW, int N, int hd, int heads) {
  int per_sm =
      (int)(kSmemPerSm / (dkdv_smem_bytes(N, head_dim_padded(hd)) + kSmemReservedPerBlock));
  if (per_sm < 1) per_sm = 1;
  int blocks = device_sm_count() * per_sm;
  if (blocks > WINDOW_ATTENTION_CUDA_MAX_BLOCKS) blocks = WINDOW_ATTENTION_CUDA_MAX_BLOCKS;
  return flash_groups(blocks, BW, flash_key_tiles(N), heads);
}

template <typename T, int HDP>
void forward_flash(T *out, float *lse, const T *qkv, const float *table, const int *index,
                   const float *mask, int BW, int nW, int N, int C, int heads, float scale,
                   cudaStream_t stream) {
  auto kernel = window_attention_forward_flash_kernel<T, HDP>;
  constexpr size_t smem = row_smem_bytes(HDP);
  allow_smem(kernel, smem);
  unsigned grid = query_tile_grid("window_attention_forward_flash_simt", BW, N, heads);
  kernel<<<grid, kRows * split(HDP), smem, stream>>>(out, lse, qkv, table, index, mask, nW, N, C,
                                                     heads, query_tiles(N), scale * kLog2e);
  CUDA_CHECK_LAUNCH();
}

template <typename T, int HDP>
void backward_flash(T *dqkv, const T *dout, const T *qkv, const T *out, const float *lse,
                    float *delta, const float *table, const int *index, const float *mask, int BW,
                    int nW, int N, int C, int heads, float scale, float *ds_partial, int groups,
                    cudaStream_t stream) {
  const float qk_scale = scale * kLog2e;
  auto dq_kernel = window_attention_backward_flash_dq_kernel<T, HDP>;
  constexpr size_t dq_smem = row_smem_bytes(HDP);
  allow_smem(dq_kernel, dq_smem);
  unsigned dq_grid = query_tile_grid("window_attention_backward_flash_simt", BW, N, heads);
  dq_kernel<<<dq_grid, kRows * split(HDP), dq_smem, stream>>>(dqkv, delta, dout, qkv, out, lse,
                                                              table, index, mask, nW, N, C, heads,
                                                              query_tiles(N), qk_scale, scale);
  CUDA_CHECK_LAUNCH();

  auto dkdv_kernel = window_attention_backward_flash_dkdv_kernel<T, HDP>;
  size_t dkdv_smem = dkdv_smem_bytes(N, HDP);
  allow_smem(dkdv_kernel, dkdv_smem);
  const int key_tiles = flash_key_tiles(N);
  unsigned dkdv_grid = (unsigned)(groups * heads * key_tiles);
  dkdv_kernel<<<dkdv_grid, kQueryGroups * kFlashKeys * split(HDP), dkdv_smem, stream>>>(
      dqkv, ds_partial, dout, qkv, lse, delta, table, index, mask, BW, nW, N, C, heads, groups,
      key_tiles, qk_scale, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void window_attention_forward_flash_simt(DType dt, void *out, float *lse, const void *qkv,
                                         const float *table, const int *index, const float *mask,
                                         int BW, int nW, int N, int C, int heads, float scale,
                                         cudaStream_t stream) {
  if (BW == 0) return;
  SWIN_DISPATCH(dt, T, {
    auto launch = head_dim_padded(C / heads) == 32 ? forward_flash<T, 32> : forward_flash<T, 64>;
    launch(static_cast<T *>(out), lse, static_cast<const T *>(qkv), table, index, mask, BW, nW, N,
           C, heads, scale, stream);
  });
}

int window_attention_backward_flash_simt_groups(int BW, int N, int C, int heads) {
  return dkdv_groups(BW, N, C / heads, heads);
}

int window_attention_backward_flash_simt(DType dt, void *dqkv, const void *dout, const void *qkv,
                                         const void *out, const float *lse, float *delta,
                                         const float *table, const int *index, const float *mask,
                                         int BW, int nW, int N, int C, int heads, float scale,
                                         float *ds_partial, cudaStream_t stream) {
  if (BW == 0) return 0;
  int groups = dkdv_groups(BW, N, C / heads, heads);
  SWIN_DISPATCH(dt, T, {
    auto launch = head_dim_padded(C / heads) == 32 ? backward_flash<T, 32> : backward_flash<T, 64>;
    launch(static_cast<T *>(dqkv), static_cast<const T *>(dout), static_cast<const T *>(qkv),
           static_cast<const T *>(out), lse, delta, table, index, mask, BW, nW, N, C, heads, scale,
           ds_partial, groups, stream);
  });
  return groups;
}

}  // namespace swin_cuda::attention
