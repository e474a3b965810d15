// gelu.cu: CUDA exact (erf) GELU and its derivative (kernels/gelu.h), elementwise on f32, bf16
// or f16 tensors with the arithmetic in f32.
//
// The device functions that compute GELU, Phi and phi, and why they compute as they do, are in
// kernels/cuda/gelu.cuh (shared with the GEMM that applies GELU in its epilogue).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "src/base/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;

// One thread per VEC consecutive elements; the last thread finishes a ragged tail one element at
// a time. VEC is a 16-byte vector only when every pointer is 16-byte aligned.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreadsPerBlock)
    gelu_forward_kernel(T *__restrict__ out, const T *__restrict__ inp, int64_t n) {
  int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (i + VEC <= n) {
    float x[VEC];
    load_vec<T, VEC>(x, inp + i);
#pragma unroll
    for (int k = 0; k < VEC; k++) x[k] = gelu_value<T>(x[k]);
    store_vec<T, VEC>(out + i, x);
  } else {
    for (; i < n; i++) out[i] = from_float<T>(gelu_value<T>(to_float<T>(inp[i])));
  }
}

// The MLP backward's two GELU passes in one: out = GELU(inp) (the forward recomputed) and
// dinp = dout * GELU'(inp), Phi evaluated once for both; with partial, the column sums of dinp
// as stored (the bias gradient of the layer before the GELU) on the column-sum tiling of
// kernels/cuda/common.cuh: thread (tx, ty) of block (x, y) owns vector x * blockDim.x + tx of
// the rows ty, ty + blockDim.y, ... of row chunk y. dinp and dout may alias (each element is
// read before it is written, by the same thread).
template <typename T, int VEC>
__global__ void __launch_bounds__(kColumnThreads)
    gelu_recompute_backward_kernel(T *__restrict__ out, T *dinp, float *__restrict__ partial,
                                   const T *__restrict__ inp, const T *dout, int64_t rows, int cols,
                                   int64_t rows_per_chunk) {
  const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc[VEC] = {};
  if (v * VEC < cols) {
    // Not unrolled: one row at a time keeps 48 registers (64 unrolled twice), so more warps fit
    // an SM, and the arithmetic, not the loads, bounds this loop.
#pragma unroll 1
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const int64_t i = r * cols + v * VEC;
      float x[VEC], g[VEC], y[VEC];
      load_vec<T, VEC>(x, inp + i);
      load_vec<T, VEC>(g, dout + i);
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        float cdf, pdf;
        normal_cdf_pdf<T>(x[k], &cdf, &pdf);
        y[k] = x[k] * cdf;
        g[k] *= fmaf(x[k], pdf, cdf);
        acc[k] += round_to<T>(g[k]);
      }
      store_vec<T, VEC>(out + i, y);
      store_vec<T, VEC>(dinp + i, g);
    }
  }
  if (partial) column_partial_store<VEC>(partial, acc, cols);
}

unsigned gelu_blocks(int64_t n, int vec) {
  int64_t per_block = (int64_t)kThreadsPerBlock * vec;
  return (unsigned)((n + per_block - 1) / per_block);
}

}  // namespace

void gelu_forward_cuda(DType dt, void *out, const void *inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  SWIN_DISPATCH(dt, T, {
    T *o = static_cast<T *>(out);
    const T *x = static_cast<const T *>(inp);
    if (aligned16(out) && aligned16(inp)) {
      constexpr int V = kVec16<T>;
      gelu_forward_kernel<T, V><<<gelu_blocks(n, V), kThreadsPerBlock, 0, stream>>>(o, x, n);
    } else {
      gelu_forward_kernel<T, 1><<<gelu_blocks(n, 1), kThreadsPerBlock, 0, stream>>>(o, x, n);
    }
  });
  CUDA_CHECK_LAUNCH();
}

void gelu_recompute_backward_cuda(DType dt, void *out, void *dinp, const void *inp,
                                  const void *dout, int64_t rows, int cols, float *dinp_sums,
                                  float *scratch, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (dinp_sums && !scratch) {
    fprintf(stderr,
            "gelu_recompute_backward_cuda: dinp_sums needs scratch (%lld floats)\n"
            "HINT: allocate column_sums_cuda_scratch(rows, cols) floats on the device\n",
            (long long)column_sums_cuda_scratch(rows, cols));
    abort();
  }
  float *partial = dinp_sums ? scratch : nullptr;
  SWIN_DISPATCH(dt, T, {
    T *o = static_cast<T *>(out), *d = static_cast<T *>(dinp);
    const T *x = static_cast<const T *>(inp), *g = static_cast<const T *>(dout);
    const bool vec = cols % kVec16<T> == 0 && aligned16(out) && aligned16(dinp) && aligned16(inp) &&
                     aligned16(dout);
    const int V = vec ? kVec16<T> : 1;
    ColumnTiling t = column_tiling(rows, cols / V);
    dim3 grid((unsigned)t.col_groups, (unsigned)t.chunks), block(t.tx, t.ty);
    if (vec)
      gelu_recompute_backward_kernel<T, kVec16<T>>
          <<<grid, block, 0, stream>>>(o, d, partial, x, g, rows, cols, t.rows_per_chunk);
    else
      gelu_recompute_backward_kernel<T, 1>
          <<<grid, block, 0, stream>>>(o, d, partial, x, g, rows, cols, t.rows_per_chunk);
    CUDA_CHECK_LAUNCH();
    if (dinp_sums) column_partials_reduce_cuda(dinp_sums, partial, t.chunks, cols, stream);
  });
}
