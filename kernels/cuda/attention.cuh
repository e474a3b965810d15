// attention.cuh: what the CUDA window-attention files (kernels/cuda/attention*.cu) share: the
// launch helpers, and the launchers of the SIMT, tensor-core and dtable kernels between which the
// entry points in attention.cu choose. Private to those files.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/attention.h"
#include "kernels/cuda/common.cuh"
#include "src/base/cuda_util.h"

namespace swin_cuda::attention {

// Shared memory a block may use without opting in.
constexpr size_t kDefaultSmemBytes = 48 * 1024;

// Opts a kernel in to more than the default 48 KiB of dynamic shared memory when it needs it.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > kDefaultSmemBytes)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// Scores carry a factor log2(e) on the tensor-core and flash paths, so the softmax is exp2.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// dk += dS^T q and dv += P^T dO for the 16 keys r0.. of this warp, over the ROWS query rows of
// the (ROWS, LDP) dS and P tiles and the (ROWS, HD + 8) q and dO tiles in shared memory: the
// dk/dv products of the tensor-core backward (attention_tc.cu).
template <typename T, int HD, int ROWS, int LDP>
__device__ __forceinline__ void dkdv_products(float (&dk)[HD / 8][4], float (&dv)[HD / 8][4],
                                              const T *dSs, const T *Ps, const T *Qs, const T *dOs,
                                              int r0, int lane) {
  constexpr int LD = HD + 8;
#pragma unroll
  for (int kk = 0; kk < ROWS; kk += 16) {
    uint32_t as[4], ap[4];
    a_cols<LDP>(as, dSs, r0, kk, lane);
    a_cols<LDP>(ap, Ps, r0, kk, lane);
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
}

// ---- SIMT kernels (attention_simt.cu): any element type, one block per (window, head) -------
// The forward saves the probabilities in att (BW, heads, N, N). The backward overwrites att
// with dS, the window sums window_attention_dtable_backward reduces (BW rows), and with
// dqkv_bias given sums dqkv's columns through scratch (window_attention_backward_simt_scratch
// floats).
void window_attention_forward_simt(DType dt, void *out, float *att, const void *qkv,
                                   const float *table, const int *index, const float *mask, int BW,
                                   int nW, int N, int C, int heads, float scale,
                                   cudaStream_t stream);
int64_t window_attention_backward_simt_scratch(int BW, int N, int C);
void window_attention_backward_simt(DType dt, void *dqkv, float *dqkv_bias, const void *dout,
                                    const void *qkv, float *att, int BW, int N, int C, int heads,
                                    float scale, float *scratch, cudaStream_t stream);

// ---- tensor-core kernels (attention_tc.cu): bf16 / f16, one wave of blocks ------------------
// Whether they serve these shapes (else the SIMT kernels do).
bool use_tensor_cores(DType dt, int N, int hd);
// The forward saves each query row's base-2 log-sum-exp in lse (BW, heads, N).
void window_attention_forward_tc(DType dt, void *out, float *lse, const void *qkv,
                                 const float *table, const int *index, const float *mask, int BW,
                                 int nW, int N, int C, int heads, float scale, cudaStream_t stream);
int64_t window_attention_backward_tc_scratch(int BW, int N, int C, int heads);
// Leaves each block's window sums of dS at the start of scratch and returns their rows (the
// window groups) for window_attention_dtable_backward; with dqkv_bias given, adds the qkv bias
// gradient from the blocks' column sums, which follow them in scratch.
int window_attention_backward_tc(DType dt, void *dqkv, float *dqkv_bias, const void *dout,
                                 const void *qkv, const float *lse, const float *table,
                                 const int *index, const float *mask, int BW, int nW, int N, int C,
                                 int heads, float scale, float *scratch, cudaStream_t stream);

// ---- flash kernels (attention_flash_tc.cu, attention_flash_simt.cu): windows of more than 64
// tokens, keys in tiles, no N x N matrix in global memory ----------------------------------------
// The forward keeps each query row's base-2 log-sum-exp (of the scores times log2(e)) in lse
// (BW, heads, N), as the tensor-core kernels above. The backward runs a dq kernel per (window,
// head, query tile), which also stores delta = rowsum(dO * O) (BW, heads, N) for the second, a
// dk/dv kernel per (window group, head, key tile) that serves a fixed, strided set of windows
// and sums their dS in shared memory; it leaves the groups' sums (groups, heads, N, N) at
// ds_partial and returns groups for window_attention_dtable_backward. dqkv is written whole.
// The tensor-core forward also writes the dense bias (heads, N, N), table[index] times log2(e),
// and its transpose, which its backward reads (flash_tc_saved_floats: lse, delta, then those).
// Upper bound of the bias-table rows of an N-token window: the largest (2wh-1)(2ww-1) over
// wh * ww = N; relative_position_index of any such window stays below it.
inline int table_rows_bound(int N) {
  int rows = 0;
  for (int wh = 1; wh <= N; wh++)
    if (N % wh == 0) {
      int r = (2 * wh - 1) * (2 * (N / wh) - 1);
      rows = r > rows ? r : rows;
    }
  return rows;
}
constexpr int kFlashKeys = 64;  // keys per tile of the SIMT flash kernels; the largest TC tile
__host__ __device__ inline int flash_key_tiles(int N) {
  return (N + kFlashKeys - 1) / kFlashKeys;
}
// The window groups of a dk/dv launch of about `blocks` (<= WINDOW_ATTENTION_CUDA_MAX_BLOCKS)
// blocks over key_tiles tiles: a function of the shapes and the block count only, so the
// summation order of dtable is too. groups * heads <= max(WINDOW_ATTENTION_CUDA_MAX_BLOCKS /
// key_tiles, heads); key_tiles >= flash_key_tiles(N) (tiles of at most kFlashKeys), the bound
// window_attention_backward_cuda_scratch_bound uses.
inline int flash_groups(int blocks, int BW, int key_tiles, int heads) {
  int groups = blocks / (heads * key_tiles);
  if (groups < 1) groups = 1;
  return groups < BW ? groups : BW;
}
// Whether the flash tensor-core kernels serve these shapes (else the flash SIMT ones do).
bool flash_tensor_cores(DType dt, int hd);
// Their tile: 48 tokens where that pads an N-token window less than 64 does (84, 144), else 64.
int flash_tc_tile(int N);
inline int64_t flash_tc_saved_floats(int BW, int N, int heads) {
  return 2 * (int64_t)BW * heads * N + 2 * (int64_t)heads * N * N;
}
void window_attention_forward_flash_tc(DType dt, void *out, float *lse, float *bias,
                                       const void *qkv, const float *table, const int *index,
                                       const float *mask, int BW, int nW, int N, int C, int heads,
                                       float scale, cudaStream_t stream);
void window_attention_forward_flash_simt(DType dt, void *out, float *lse, const void *qkv,
                                         const float *table, const int *index, const float *mask,
                                         int BW, int nW, int N, int C, int heads, float scale,
                                         cudaStream_t stream);
// The groups the backward will use (ds_partial holds groups * heads * N * N floats).
int window_attention_backward_flash_tc_groups(int BW, int N, int C, int heads);
int window_attention_backward_flash_simt_groups(int BW, int N, int C, int heads);
int window_attention_backward_flash_tc(DType dt, void *dqkv, const void *dout, const void *qkv,
                                       const void *out, const float *lse, float *delta,
                                       const float *bias, const float *mask, int BW, int nW, int N,
                                       int C, int heads, float scale, float *ds_partial,
                                       cudaStream_t stream);
int window_attention_backward_flash_simt(DType dt, void *dqkv, const void *dout, const void *qkv,
                                         const void *out, const float *lse, float *delta,
                                         const float *table, const int *index, const float *mask,
                                         int BW, int nW, int N, int C, int heads, float scale,
                                         float *ds_partial, cudaStream_t stream);

// ---- dtable (attention_dtable.cu) ------------------------------------------------------------
// dtable (table rows, heads) += the sums of ds (rows, heads, N, N) over its rows, per (table
// row, head) over the (i, j) with that index, in a fixed order; ds's row 0 is overwritten.
void window_attention_dtable_backward(float *dtable, float *ds, int64_t rows, const int *index,
                                      int N, int heads, cudaStream_t stream);

}  // namespace swin_cuda::attention
