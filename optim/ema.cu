// ema.cu: the weights' moving average on CUDA (optim/ema.h): one pass over the flat buffer after
// the optimizer's update, 16 bytes at a time, with the decision (applied or skipped) and the
// decay read from the optimizer state the update left in device memory, so the host never
// waits and a captured step replays with each step's decay.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "optim/ema.h"
#include "src/base/cuda_util.h"

namespace {

using namespace swin_cuda;

constexpr int kThreadsPerBlock = 256;
// One pass: a thread per 4 elements, at most this many blocks (a grid stride beyond).
constexpr unsigned kMaxBlocks = 4096;

unsigned vector_blocks(int64_t n) {
  unsigned blocks = blocks_for((n + 3) / 4, kThreadsPerBlock);
  return blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks;
}

// Every thread takes the step's decision itself (the same two fields of *state, one double pow
// with warmup): no second kernel, no scratch. The ragged tail (n % 4) goes to the first threads.
__global__ void __launch_bounds__(kThreadsPerBlock)
    ema_update_kernel(float *__restrict__ ema, const float *__restrict__ weights, int64_t n,
                      EmaSettings s, const OptimState *__restrict__ state) {
  float w;
  if (!ema_step_weight(state, s, &w)) return;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t vectors = n / 4;
  for (int64_t v = first; v < vectors; v += stride) {
    float4 e = reinterpret_cast<float4 *>(ema)[v];
    const float4 x = reinterpret_cast<const float4 *>(weights)[v];
    e.x = ema_lerp(e.x, x.x, w);
    e.y = ema_lerp(e.y, x.y, w);
    e.z = ema_lerp(e.z, x.z, w);
    e.w = ema_lerp(e.w, x.w, w);
    reinterpret_cast<float4 *>(ema)[v] = e;
  }
  for (int64_t i = vectors * 4 + first; i < n; i += stride)
    ema[i] = ema_lerp(ema[i], weights[i], w);
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    weights_swap_kernel(float *__restrict__ a, float *__restrict__ b, int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t vectors = n / 4;
  for (int64_t v = first; v < vectors; v += stride) {
    const float4 x = reinterpret_cast<float4 *>(a)[v];
    reinterpret_cast<float4 *>(a)[v] = reinterpret_cast<float4 *>(b)[v];
    reinterpret_cast<float4 *>(b)[v] = x;
  }
  for (int64_t i = vectors * 4 + first; i < n; i += stride) {
    const float x = a[i];
    a[i] = b[i];
    b[i] = x;
  }
}

}  // namespace

void ema_update_cuda(float *ema, const float *weights, int64_t n, EmaSettings s,
                     const OptimState *state, cudaStream_t stream) {
  if (n <= 0) return;
  ema_update_kernel<<<vector_blocks(n), kThreadsPerBlock, 0, stream>>>(ema, weights, n, s, state);
  CUDA_CHECK_LAUNCH();
}

void weights_swap_cuda(float *a, float *b, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  weights_swap_kernel<<<vector_blocks(n), kThreadsPerBlock, 0, stream>>>(a, b, n);
  CUDA_CHECK_LAUNCH();
}
