// gelu.cu: CUDA exact (erf) GELU and its derivative (kernels/gelu.h), elementwise on f32, bf16
// or f16 tensors with the arithmetic in f32.
//
// GELU(x) = x Phi(x), GELU'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
// In f32, Phi is CUDA's normcdff (accurate in the far left tail, where 1 + erf cancels) and x^2
// is carried exactly into the exponential: the reference-grade path. In bf16 and f16, whose
// results are rounded to 8 or 11 bits, Phi comes from erfc(|x| / sqrt 2) in the rational form
// of Abramowitz & Stegun 7.1.26, t = 1 / (1 + p z), erfc(z) ~ (a1 t + ... + a5 t^5) exp(-z^2)
// (absolute error <= 1.5e-7 for z >= 0): Phi(x) = erfc / 2 for x < 0 and 1 - erfc / 2 else.
// exp(-z^2) = exp(-x^2 / 2) is the same exponential as phi's, so one GELU and its derivative
// cost one reciprocal, one exponential and ~15 other instructions, with no branch or select
// tables. CUDA's erff (7 coefficients picked per element by 9 selects, ~35 instructions) made
// these kernels bound by arithmetic rather than by their bytes (kernels/PERF.md). The error in
// Phi as evaluated in f32, <= 2.5e-7 absolute (7.5e-8 from the approximation, the rest f32
// rounding; checked in double over [-12, 12]), is far below the rounding of bf16 and f16
// results; in the left tail it stays relative to Phi itself (5e-5 at x = -3), where
// (1 + erff) / 2, PyTorch's formula, cancels.
// Non-finite inputs follow the formula as on the CPU: GELU(+inf) = +inf, GELU(-inf) = NaN,
// GELU'(+-inf) = NaN (+-inf * 0 + Phi), NaN gives NaN.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/gelu.h"
#include "kernels/gemm.h"
#include "src/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;
constexpr float kInvSqrt2Pi = 0x1.988454p-2f;  // 1 / sqrt(2 pi)
constexpr float kInvSqrt2 = 0x1.6a09e6p-1f;    // 1 / sqrt(2)

// erfc(|x| / sqrt 2) / 2 ~ poly(t) exp(-x^2 / 2), poly with the halved coefficients of A&S
// 7.1.26, and Phi(x) from it (see the top of the file); e = exp(-x^2 / 2) is returned for phi.
__device__ __forceinline__ float normal_cdf_fast(float x, float *e) {
  constexpr float p = 0.3275911f * kInvSqrt2;  // t = 1 / (1 + p |x| / sqrt 2)
  constexpr float a1 = 0.5f * 0.254829592f, a2 = 0.5f * -0.284496736f, a3 = 0.5f * 1.421413741f,
                  a4 = 0.5f * -1.453152027f, a5 = 0.5f * 1.061405429f;  // halved: erfc / 2
  float t = __fdividef(1.0f, fmaf(p, fabsf(x), 1.0f));
  float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, a5, a4), a3), a2), a1);
  *e = __expf(-0.5f * x * x);
  float half_erfc = poly * *e;
  return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

// Phi(x) for results of type T (see the top of the file).
template <typename T>
__device__ __forceinline__ float normal_cdf(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return normcdff(x);
  } else {
    float e;
    return normal_cdf_fast(x, &e);
  }
}

template <typename T>
__device__ __forceinline__ float gelu_value(float x) {
  return x * normal_cdf<T>(x);
}

// Phi(x) and phi(x) for the derivative. In f32, x^2 is carried as hi + lo (lo from an fma,
// exact): fp32 x * x alone is off by up to half an ulp of x^2, which exp(-x^2 / 2) turns into a
// relative error of x^2 * 3e-8 (3e-6 at x = 10). exp(-(hi + lo) / 2) = exp(-hi / 2) (1 - lo / 2)
// to far below fp32 precision, as |lo| <= 6e-8 hi. |x| is clamped to 16, where exp(-x^2 / 2) has
// long underflowed to 0, so that x^2 stays finite for huge x (inf - inf would give NaN); x = +-inf
// still gives inf * 0 = NaN in the final fma. In bf16 and f16 both come from normal_cdf_fast's
// one exponential (relative error <= x^2 * 3e-8 from x * x, far below their rounding).
template <typename T>
__device__ __forceinline__ void normal_cdf_pdf(float x, float *cdf, float *pdf) {
  if constexpr (std::is_same_v<T, float>) {
    float a = fminf(fabsf(x), 16.0f);  // NaN becomes 16, but x itself keeps the result NaN
    float hi = a * a;
    float lo = fmaf(a, a, -hi);
    *cdf = normcdff(x);
    *pdf = expf(-0.5f * hi) * fmaf(-0.5f, lo, 1.0f) * kInvSqrt2Pi;
  } else {
    float e;
    *cdf = normal_cdf_fast(x, &e);
    *pdf = e * kInvSqrt2Pi;
  }
}

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
