// gelu.cuh: the exact (erf) GELU's device functions, GELU(x), Phi(x) and phi(x) in f32
// arithmetic for results of type T, shared by the GELU kernels (kernels/cuda/gelu.cu) and the
// small-K GEMM whose epilogue applies GELU (kernels/cuda/gemm_small_k.cu): one definition, so
// that both give the same bits from the same input.
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
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace swin_cuda {

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

}  // namespace swin_cuda
