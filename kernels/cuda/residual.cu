// residual.cu: CUDA residual add with per-sample drop path and the head's mean pool over tokens
// (kernels/residual.h), fp32.
//
// The residual kernels are elementwise over (B, L), one thread per 4 elements when L % 4 == 0
// and the pointers are 16-byte aligned (the 4 then belong to one sample), else one per element.
// The mean pool gives one thread to each (b, c) and walks the L tokens in order, summing in
// double like the CPU, so the result is the CPU's to the bit and never depends on timing.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/residual.h"
#include "src/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;

unsigned blocks_for(int64_t n, int vec) {
  int64_t per_block = (int64_t)kThreadsPerBlock * vec;
  return (unsigned)((n + per_block - 1) / per_block);
}

// out = x + s_b * branch over (B, L) flattened to n elements, s_b = scale[b] or 1 without scale.
// out and x may alias (no __restrict__ on them): each element is read, then written, by one
// thread. With s_b = 1 the fma is exactly x + branch; with s_b = 0 it is exactly x.
template <int VEC>
__global__ void __launch_bounds__(kThreadsPerBlock)
    residual_forward_kernel(float *out, const float *x, const float *__restrict__ branch,
                            const float *__restrict__ scale, int64_t L, int64_t n) {
  int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (VEC == 4 && i + 4 <= n) {
    float s = scale ? scale[i / L] : 1.0f;  // L % 4 == 0: the 4 elements share a sample
    float4 xv = *reinterpret_cast<const float4 *>(x + i);
    float4 fv = *reinterpret_cast<const float4 *>(branch + i);
    *reinterpret_cast<float4 *>(out + i) = make_float4(fmaf(s, fv.x, xv.x), fmaf(s, fv.y, xv.y),
                                                       fmaf(s, fv.z, xv.z), fmaf(s, fv.w, xv.w));
  } else {
    for (int64_t end = i + VEC < n ? i + VEC : n; i < end; i++) {
      float s = scale ? scale[i / L] : 1.0f;
      out[i] = fmaf(s, branch[i], x[i]);
    }
  }
}

// dbranch = scale[b] * dout; dbranch and dout may alias.
template <int VEC>
__global__ void __launch_bounds__(kThreadsPerBlock)
    residual_backward_kernel(float *dbranch, const float *dout, const float *__restrict__ scale,
                             int64_t L, int64_t n) {
  int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (VEC == 4 && i + 4 <= n) {
    float s = scale[i / L];
    float4 g = *reinterpret_cast<const float4 *>(dout + i);
    *reinterpret_cast<float4 *>(dbranch + i) = make_float4(s * g.x, s * g.y, s * g.z, s * g.w);
  } else {
    for (int64_t end = i + VEC < n ? i + VEC : n; i < end; i++) dbranch[i] = scale[i / L] * dout[i];
  }
}

// out[b][c] = (sum over l of inp[b][l][c]) / L, one thread per (b, c): neighbouring threads
// read neighbouring channels of the same token, so each token row is one coalesced read.
__global__ void __launch_bounds__(kThreadsPerBlock)
    mean_pool_forward_kernel(float *__restrict__ out, const float *__restrict__ inp, int B, int L,
                             int C) {
  int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (int64_t)B * C) return;
  int64_t b = t / C, c = t - b * C;
  const float *col = inp + b * L * C + c;
  double acc = 0.0;
  for (int l = 0; l < L; l++) acc += col[(int64_t)l * C];
  out[t] = (float)(acc / L);
}

// dinp[b][l][c] = dout[b][c] / L over the n = B*L*C elements; VEC is 4 only when C % 4 == 0 and
// both pointers are 16-byte aligned, so the 4 elements share (b, l) and map to 4 aligned dout.
template <int VEC>
__global__ void __launch_bounds__(kThreadsPerBlock)
    mean_pool_backward_kernel(float *__restrict__ dinp, const float *__restrict__ dout, int L,
                              int C, int64_t n) {
  int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  const float count = (float)L;  // divided by, as on the CPU (a reciprocal would round twice)
  if (VEC == 4 && i + 4 <= n) {
    int64_t row = i / C, b = row / L, c = i - row * C;
    float4 g = *reinterpret_cast<const float4 *>(dout + b * C + c);
    *reinterpret_cast<float4 *>(dinp + i) =
        make_float4(g.x / count, g.y / count, g.z / count, g.w / count);
  } else {
    for (int64_t end = i + VEC < n ? i + VEC : n; i < end; i++) {
      int64_t row = i / C, b = row / L, c = i - row * C;
      dinp[i] = dout[b * C + c] / count;
    }
  }
}

}  // namespace

void residual_forward_cuda(float *out, const float *x, const float *branch, const float *scale,
                           int B, int64_t L, cudaStream_t stream) {
  const int64_t n = (int64_t)B * L;
  if (n <= 0) return;
  if (L % 4 == 0 && aligned16(out) && aligned16(x) && aligned16(branch)) {
    residual_forward_kernel<4>
        <<<blocks_for(n, 4), kThreadsPerBlock, 0, stream>>>(out, x, branch, scale, L, n);
  } else {
    residual_forward_kernel<1>
        <<<blocks_for(n, 1), kThreadsPerBlock, 0, stream>>>(out, x, branch, scale, L, n);
  }
  CUDA_CHECK_LAUNCH();
}

void residual_backward_cuda(float *dbranch, const float *dout, const float *scale, int B, int64_t L,
                            cudaStream_t stream) {
  const int64_t n = (int64_t)B * L;
  if (n <= 0) return;
  if (!scale) {
    // No drop path: the branch gradient is dout itself (nothing to do when they alias).
    if (dbranch != dout) {
      CUDA_CHECK(cudaMemcpyAsync(dbranch, dout, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                                 stream));
    }
    return;
  }
  if (L % 4 == 0 && aligned16(dbranch) && aligned16(dout)) {
    residual_backward_kernel<4>
        <<<blocks_for(n, 4), kThreadsPerBlock, 0, stream>>>(dbranch, dout, scale, L, n);
  } else {
    residual_backward_kernel<1>
        <<<blocks_for(n, 1), kThreadsPerBlock, 0, stream>>>(dbranch, dout, scale, L, n);
  }
  CUDA_CHECK_LAUNCH();
}

void mean_pool_forward_cuda(float *out, const float *inp, int B, int L, int C,
                            cudaStream_t stream) {
  const int64_t n = (int64_t)B * C;
  if (n <= 0 || L <= 0) return;
  mean_pool_forward_kernel<<<blocks_for(n, 1), kThreadsPerBlock, 0, stream>>>(out, inp, B, L, C);
  CUDA_CHECK_LAUNCH();
}

void mean_pool_backward_cuda(float *dinp, const float *dout, int B, int L, int C,
                             cudaStream_t stream) {
  const int64_t n = (int64_t)B * L * C;
  if (n <= 0) return;
  if (C % 4 == 0 && aligned16(dinp) && aligned16(dout)) {
    mean_pool_backward_kernel<4>
        <<<blocks_for(n, 4), kThreadsPerBlock, 0, stream>>>(dinp, dout, L, C, n);
  } else {
    mean_pool_backward_kernel<1>
        <<<blocks_for(n, 1), kThreadsPerBlock, 0, stream>>>(dinp, dout, L, C, n);
  }
  CUDA_CHECK_LAUNCH();
}
