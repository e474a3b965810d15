// gelu.h: exact GELU, y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (not the tanh approximation).
#pragma once
#include <stdint.h>
#include "src/base/tensor.h"
#ifdef SWIN_HAVE_CUDA
#include <cuda_runtime.h>  // outside the extern "C" block: it declares C++ templates
#endif

#ifdef __cplusplus
extern "C" {
#endif

// CPU, in vectorized fp32 without libm: Phi and phi are kernels/cpu/fastmath.h's approximations
// (relative error <= 4e-7 and 3e-7), and GELU' near its root x0 = -0.7518 a fitted polynomial
// (kernels/cpu/gelu.c), so GELU and GELU' are within 1e-6 relative of the double formula
// wherever the value is not tiny (tests/test_gelu.c).
void gelu_forward_cpu(float *out, const float *inp, int64_t n);
// dinp = dout * (Phi(x) + x phi(x)); dinp overwritten. dinp may alias dout.
void gelu_backward_cpu(float *dinp, const float *inp, const float *dout, int64_t n);

#ifdef SWIN_HAVE_CUDA
// CUDA forms on tensors of the element type dt (F32, BF16 or F16, arithmetic in f32), device
// pointers, launched on `stream` (no synchronization); dinp may alias dout here too. In f32 Phi
// is CUDA's normcdff (at most 5 ulp) and phi an expf of -x^2 / 2 with x^2 carried exactly, so
// both are within ~1e-6 relative of the exact values; in bf16 and f16 Phi comes from the
// rational erfc approximation of Abramowitz & Stegun 7.1.26 and phi from its exponential
// (absolute error in Phi <= 2.5e-7, far below their rounding; kernels/cuda/gelu.cuh says why).
// Unlike the CPU, GELU'(x) is not refitted next to its root x0 = -0.7518: there its two terms
// (~0.23 each) cancel, and the derivative keeps an absolute error of up to ~2e-7 (relative error
// unbounded as GELU' goes to 0), which the gradient dout * GELU' does not notice. 16-byte
// accesses when the pointers are 16-byte aligned.
void gelu_forward_cuda(DType dt, void *out, const void *inp, int64_t n, cudaStream_t stream);
// The MLP backward's pair in one pass over (rows, cols) tensors: out = GELU(inp) (the forward
// recomputed) and dinp = dout * GELU'(inp); with dinp_sums (cols, f32), also dinp_sums += the
// column sums of dinp as stored (the bias gradient of the linear layer before the GELU), left by
// the same pass as per-chunk partials in scratch (column_sums_cuda_scratch(rows, cols) floats,
// kernels/gemm.h) and added in a fixed order: bitwise the same run after run. dinp_sums and
// scratch may be NULL.
void gelu_recompute_backward_cuda(DType dt, void *out, void *dinp, const void *inp,
                                  const void *dout, int64_t rows, int cols, float *dinp_sums,
                                  float *scratch, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
