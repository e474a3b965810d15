// gelu.cu: CUDA exact (erf) GELU and its derivative (kernels/gelu.h), fp32, elementwise.
//
// GELU(x) = x Phi(x), GELU'(x) = Phi(x) + x phi(x), with Phi from CUDA's normcdff (accurate in
// the far left tail, where 1 + erf would cancel) and phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
// Non-finite inputs follow the formula as on the CPU: GELU(+inf) = +inf, GELU(-inf) = NaN,
// GELU'(+-inf) = NaN (+-inf * 0 + Phi), NaN gives NaN.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/gelu.h"
#include "src/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;
constexpr float kInvSqrt2Pi = 0x1.988454p-2f;  // 1 / sqrt(2 pi)

__device__ __forceinline__ float gelu_value(float x) {
  return x * normcdff(x);
}

// x^2 is carried as hi + lo (lo from an fma, exact): fp32 x * x alone is off by up to half an
// ulp of x^2, which exp(-x^2 / 2) turns into a relative error of x^2 * 3e-8 (3e-6 at x = 10).
// exp(-(hi + lo) / 2) = exp(-hi / 2) (1 - lo / 2) to far below fp32 precision, as |lo| <= 6e-8 hi.
// |x| is clamped to 16, where exp(-x^2 / 2) has long underflowed to 0, so that x^2 stays finite
// for huge x (inf - inf would give NaN); x = +-inf still gives inf * 0 = NaN in the final fma.
__device__ __forceinline__ float gelu_grad(float x) {
  float a = fminf(fabsf(x), 16.0f);  // NaN becomes 16, but x itself keeps the result NaN
  float hi = a * a;
  float lo = fmaf(a, a, -hi);
  float pdf = expf(-0.5f * hi) * fmaf(-0.5f, lo, 1.0f) * kInvSqrt2Pi;
  return fmaf(x, pdf, normcdff(x));
}

// One thread per VEC consecutive elements; the last thread finishes a ragged tail one float at
// a time. VEC is 4 only when every pointer is 16-byte aligned.
template <int VEC>
__global__ void __launch_bounds__(kThreadsPerBlock)
    gelu_forward_kernel(float *__restrict__ out, const float *__restrict__ inp, int64_t n) {
  int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (VEC == 4 && i + 4 <= n) {
    float4 x = *reinterpret_cast<const float4 *>(inp + i);
    *reinterpret_cast<float4 *>(out + i) =
        make_float4(gelu_value(x.x), gelu_value(x.y), gelu_value(x.z), gelu_value(x.w));
  } else {
    for (int64_t end = i + VEC < n ? i + VEC : n; i < end; i++) out[i] = gelu_value(inp[i]);
  }
}

// dinp and dout may alias (no __restrict__ on them): each element is read before it is written,
// by the same thread.
template <int VEC>
__global__ void __launch_bounds__(kThreadsPerBlock)
    gelu_backward_kernel(float *dinp, const float *__restrict__ inp, const float *dout, int64_t n) {
  int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (VEC == 4 && i + 4 <= n) {
    float4 x = *reinterpret_cast<const float4 *>(inp + i);
    float4 g = *reinterpret_cast<const float4 *>(dout + i);
    *reinterpret_cast<float4 *>(dinp + i) = make_float4(g.x * gelu_grad(x.x), g.y * gelu_grad(x.y),
                                                        g.z * gelu_grad(x.z), g.w * gelu_grad(x.w));
  } else {
    for (int64_t end = i + VEC < n ? i + VEC : n; i < end; i++)
      dinp[i] = dout[i] * gelu_grad(inp[i]);
  }
}

unsigned blocks_for(int64_t n, int vec) {
  int64_t per_block = (int64_t)kThreadsPerBlock * vec;
  return (unsigned)((n + per_block - 1) / per_block);
}

}  // namespace

void gelu_forward_cuda(float *out, const float *inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (aligned16(out) && aligned16(inp)) {
    gelu_forward_kernel<4><<<blocks_for(n, 4), kThreadsPerBlock, 0, stream>>>(out, inp, n);
  } else {
    gelu_forward_kernel<1><<<blocks_for(n, 1), kThreadsPerBlock, 0, stream>>>(out, inp, n);
  }
  CUDA_CHECK_LAUNCH();
}

void gelu_backward_cuda(float *dinp, const float *inp, const float *dout, int64_t n,
                        cudaStream_t stream) {
  if (n <= 0) return;
  if (aligned16(dinp) && aligned16(inp) && aligned16(dout)) {
    gelu_backward_kernel<4><<<blocks_for(n, 4), kThreadsPerBlock, 0, stream>>>(dinp, inp, dout, n);
  } else {
    gelu_backward_kernel<1><<<blocks_for(n, 1), kThreadsPerBlock, 0, stream>>>(dinp, inp, dout, n);
  }
  CUDA_CHECK_LAUNCH();
}
