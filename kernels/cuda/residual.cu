// residual.cu: the drop-path scales and the head's mean pool over tokens on CUDA
// (kernels/residual.h). The residual add itself is fused into the LayerNorm kernels
// (kernels/cuda/layernorm_register.cu and layernorm_multipass.cu).
//
// Drop-path scales are drawn from the same counter-based stream as on the CPU (src/base/rng.h), one
// thread per (unit, sample), so they are the CPU's bits. The mean pool gives one thread to each
// (b, c) and walks the L tokens in order, summing in double like the CPU, so it never depends on
// timing.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/residual.h"
#include "src/base/cuda_util.h"
#include "src/base/rng.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;

__global__ void drop_path_scales_kernel(float *__restrict__ scales, const float *__restrict__ rates,
                                        int units, int B, uint64_t seed,
                                        const int64_t *__restrict__ step,
                                        const int64_t *__restrict__ first_sample) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (int64_t)units * B) return;
  int u = (int)(i / B), b = (int)(i % B);
  float keep = 1.0f - rates[u / 2];
  float r = rng_u32_to_uniform(rng_u32_at(seed, RNG_STREAM_DROP_PATH, (uint64_t)*step, (uint64_t)u,
                                          (uint32_t)(*first_sample + b)));
  scales[i] = r < keep ? 1.0f / keep : 0.0f;
}

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    mean_pool_forward_kernel(float *__restrict__ out, const T *__restrict__ inp, int B, int L,
                             int C) {
  int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (int64_t)B * C) return;
  int64_t b = t / C, c = t - b * C;
  const T *col = inp + b * L * C + c;
  double acc = 0.0;
  for (int l = 0; l < L; l++) acc += to_float<T>(col[(int64_t)l * C]);
  out[t] = (float)(acc / L);
}

// dinp[b][l][c] = dout[b][c] / L, one element per thread (divided by L, as on the CPU).
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    mean_pool_backward_kernel(T *__restrict__ dinp, const float *__restrict__ dout, int L, int C,
                              int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t row = i / C, b = row / L, c = i - row * C;
  dinp[i] = from_float<T>(dout[b * C + c] / (float)L);
}

}  // namespace

void drop_path_scales_cuda(float *scales, const float *rates, int units, int B, uint64_t seed,
                           const int64_t *step, const int64_t *first_sample, cudaStream_t stream) {
  int64_t n = (int64_t)units * B;
  if (n <= 0) return;
  drop_path_scales_kernel<<<blocks_for(n, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(
      scales, rates, units, B, seed, step, first_sample);
  CUDA_CHECK_LAUNCH();
}

void mean_pool_forward_cuda(DType dt, float *out, const void *inp, int B, int L, int C,
                            cudaStream_t stream) {
  const int64_t n = (int64_t)B * C;
  if (n <= 0 || L <= 0) return;
  SWIN_DISPATCH(dt, T,
                mean_pool_forward_kernel<T>
                <<<blocks_for(n, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(
                    out, static_cast<const T *>(inp), B, L, C));
  CUDA_CHECK_LAUNCH();
}

void mean_pool_backward_cuda(DType dt, void *dinp, const float *dout, int B, int L, int C,
                             cudaStream_t stream) {
  const int64_t n = (int64_t)B * L * C;
  if (n <= 0) return;
  SWIN_DISPATCH(dt, T,
                mean_pool_backward_kernel<T>
                <<<blocks_for(n, kThreadsPerBlock), kThreadsPerBlock, 0, stream>>>(
                    static_cast<T *>(dinp), dout, L, C, n));
  CUDA_CHECK_LAUNCH();
}
