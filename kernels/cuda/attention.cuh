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

// The scale the CPU uses: timm's head_dim ** -0.5 as an fp32 scalar.
inline float attention_scale(int hd) {
  return (float)(1.0 / sqrt((double)hd));
}

// ---- SIMT kernels (attention_simt.cu): any element type, one block per (window, head) -------
// The forward saves the probabilities in att (BW, heads, N, N). The backward overwrites att
// with dS, the window sums window_attention_dtable_backward reduces (BW rows), and with
// dqkv_bias given sums dqkv's columns through scratch (window_attention_backward_simt_scratch
// floats).
void window_attention_forward_simt(DType dt, void *out, float *att, const void *qkv,
                                   const float *table, const int *index, const float *mask, int BW,
                                   int nW, int N, int C, int heads, cudaStream_t stream);
int64_t window_attention_backward_simt_scratch(int BW, int N, int C);
void window_attention_backward_simt(DType dt, void *dqkv, float *dqkv_bias, const void *dout,
                                    const void *qkv, float *att, int BW, int N, int C, int heads,
                                    float *scratch, cudaStream_t stream);

// ---- tensor-core kernels (attention_tc.cu): bf16 / f16, one wave of blocks ------------------
// Whether they serve these shapes (else the SIMT kernels do).
bool use_tensor_cores(DType dt, int N, int hd);
// The forward saves each query row's base-2 log-sum-exp in lse (BW, heads, N).
void window_attention_forward_tc(DType dt, void *out, float *lse, const void *qkv,
                                 const float *table, const int *index, const float *mask, int BW,
                                 int nW, int N, int C, int heads, cudaStream_t stream);
int64_t window_attention_backward_tc_scratch(int BW, int N, int C, int heads);
// Leaves each block's window sums of dS at the start of scratch and returns their rows (the
// window groups) for window_attention_dtable_backward; with dqkv_bias given, adds the qkv bias
// gradient from the blocks' column sums, which follow them in scratch.
int window_attention_backward_tc(DType dt, void *dqkv, float *dqkv_bias, const void *dout,
                                 const void *qkv, const float *lse, const float *table,
                                 const int *index, const float *mask, int BW, int nW, int N, int C,
                                 int heads, float *scratch, cudaStream_t stream);

// ---- dtable (attention_dtable.cu) ------------------------------------------------------------
// dtable (table rows, heads) += the sums of ds (rows, heads, N, N) over its rows, per (table
// row, head) over the (i, j) with that index, in a fixed order; ds's row 0 is overwritten.
void window_attention_dtable_backward(float *dtable, float *ds, int64_t rows, const int *index,
                                      int N, int heads, cudaStream_t stream);

}  // namespace swin_cuda::attention
